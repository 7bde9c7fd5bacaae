"""A Genesis stack's image: the pinned vLLM image plus the pinned packages Genesis imports.

Genesis' apply step imports packages the vLLM image lacks (xxhash, pandas, scipy). Installing
them at every container start needs the network and may install versions nobody verified, so
the deploy bakes them into a derived local image once, from the pinned digest, and the stack
runs that image with no network at start. The image's name says what it holds (the base
digest and the package set), so the compose file (and its config hash) changes exactly when
either does::

    img = RuntimeImage.for_stack(spec, pins.stacks["tq3-mtp-genesis"])
    img.ref               # 'rigfleet/tq3-mtp-genesis-runtime:6a93ae43168d-0f3c9e1a'
    img.dockerfile()      # 'FROM vllm/vllm-openai@sha256:...\nRUN pip install ...'
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

from rigfleet.catalog import StackSpec
from rigfleet.hostside.layout import BASE_DIGEST_LABEL as BASE_LABEL
from rigfleet.pins import StackPins

REPOSITORY = "rigfleet"
PACKAGES_LABEL = "io.rigfleet.runtime-packages"


@dataclass(frozen=True)
class RuntimeImage:
    """The derived image of one stack.

    + stack: the stack's name; base: the pinned image's name on the host (``<repo>:<tag>``,
      staged and verified by the images role); digest: the pinned digest
    + packages: the pinned requirements baked in (``xxhash==3.5.0``), in stack-file order
    """

    stack: str
    base: str
    digest: str
    packages: tuple[str, ...]

    @classmethod
    def for_stack(cls, spec: StackSpec, pins: StackPins) -> RuntimeImage | None:
        """The derived image ``spec`` runs, or None when it needs no package (``int8``)."""
        if spec.genesis is None or not spec.genesis.runtime_packages:
            return None
        return cls(spec.name, pins.local_image, pins.digest,
                   tuple(spec.genesis.runtime_packages))

    @property
    def tag(self) -> str:
        packages = hashlib.sha256("\n".join(self.packages).encode()).hexdigest()[:8]
        return f"{self.digest.removeprefix('sha256:')[:12]}-{packages}"

    @property
    def ref(self) -> str:
        """``rigfleet/<stack>-runtime:<digest12>-<packages hash>`` (local only, never pulled)."""
        return f"{REPOSITORY}/{self.stack}-runtime:{self.tag}"

    def dockerfile(self, index_url: str | None = None) -> str:
        """The Dockerfile: the pinned base, the pinned packages, labels saying both.

        + index_url: the package index (host data ``runtime_pip_index_url``, else
          ``pip_index_url``, else PyPI); a plain-http index is also marked trusted
        """
        index = ""
        if index_url:
            index = f" --index-url {shlex.quote(index_url)}"
            parts = urlsplit(index_url)
            if parts.scheme == "http" and parts.hostname:
                index += f" --trusted-host {shlex.quote(parts.hostname)}"
        packages = " ".join(shlex.quote(p) for p in self.packages)
        return (
            "# Built by rigfleet (roles/images.py) on this host; never pushed.\n"
            f"FROM {self.base}\n"
            "RUN pip install --no-cache-dir --disable-pip-version-check --no-input --root-user-"
            f"action=ignore{index} {packages}\n"
            f"LABEL {BASE_LABEL}={self.digest} {PACKAGES_LABEL}={json.dumps(' '.join(self.packages))}\n"
        )
