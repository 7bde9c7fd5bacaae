"""A Genesis stack's image: the pinned vLLM image plus the pinned packages Genesis imports, baked
in once (no network at container start), named by both: the compose file changes when either does::

    img = RuntimeImage.for_stack(spec, pins.stacks["tq3-mtp-genesis"])
    img.ref               # 'rigfleet/tq3-mtp-genesis-runtime:6a93ae43168d-0f3c9e1a'
    img.dockerfile()      # 'FROM vllm/vllm-openai@sha256:...\nRUN pip install ...'
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass

from rigfleet.catalog import StackSpec
from rigfleet.commands.weights import pip_index
from rigfleet.hostside.layout import BASE_DIGEST_LABEL as BASE_LABEL
from rigfleet.pins import StackPins

PACKAGES_LABEL = "io.rigfleet.runtime-packages"


@dataclass(frozen=True)
class RuntimeImage:
    """The derived image of one stack (``base``: the pinned image's name on the host)."""

    stack: str
    base: str
    digest: str
    packages: tuple[str, ...]

    @classmethod
    def for_stack(cls, spec: StackSpec, pins: StackPins) -> RuntimeImage | None:
        """The derived image ``spec`` runs, or None when it needs no package (``int8``)."""
        if spec.genesis is None or not spec.genesis.runtime_packages:
            return None
        return cls(spec.name, pins.image, pins.digest, spec.genesis.runtime_packages)

    @property
    def ref(self) -> str:
        """``rigfleet/<stack>-runtime:<digest12>-<packages hash>`` (local only, never pulled)."""
        base = self.digest.removeprefix("sha256:")[:12]
        packages = hashlib.sha256("\n".join(self.packages).encode()).hexdigest()[:8]
        return f"rigfleet/{self.stack}-runtime:{base}-{packages}"

    def dockerfile(self, index_url: str | None = None) -> str:
        """The pinned base, the pinned packages from ``index_url``, labels saying both."""
        packages = " ".join(shlex.quote(p) for p in self.packages)
        return (
            "# Built by rigfleet (roles/images.py) on this host; never pushed.\n"
            f"FROM {self.base}\n"
            "RUN pip install --no-cache-dir --disable-pip-version-check --no-input --root-user-"
            f"action=ignore{pip_index(index_url)} {packages}\n"
            f"LABEL {BASE_LABEL}={self.digest} "
            f"{PACKAGES_LABEL}={json.dumps(' '.join(self.packages))}\n"
        )
