"""What this build of "vLLM" is: version, commit, baked-in regressions, live Genesis patches.

Version-specific behaviour is data, never a decision made from a test: the image build writes
``vllm/_build_info.json`` from its build arguments, and Genesis (which runs before
``vllm serve`` in the container) leaves ``vllm/_genesis_applied.json`` in the package
directory, as its real text patches leave modified files in the container's R/W layer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

# Regressions a build can carry (names used in _build_info.json "regressions").
# post-#41434 nightlies + transformers 5.8: speculator auto-detection treats a local model
# path as a Hub repo id and aborts the boot (club-3090 570fa712).
REGRESSION_SPECULATORS_OSERROR = "speculators-local-path-oserror"
# MTP draft acceptance collapses (mean acceptance length ~1.1) and generations stop early.
REGRESSION_SPEC_ACCEPTANCE_COLLAPSE = "spec-decode-acceptance-collapse"
KNOWN_REGRESSIONS = frozenset({REGRESSION_SPECULATORS_OSERROR, REGRESSION_SPEC_ACCEPTANCE_COLLAPSE})


def package_dir() -> Path:
    """The directory of the ``vllm`` package (where Genesis writes its marker)."""
    import vllm

    return Path(os.path.dirname(os.path.abspath(vllm.__file__)))


@dataclass(frozen=True)
class BuildInfo:
    """Contents of ``vllm/_build_info.json``."""

    version: str
    commit: str
    regressions: frozenset[str] = field(default_factory=frozenset)

    def has(self, regression: str) -> bool:
        return regression in self.regressions


def load_build_info(pkg_dir: Path | None = None) -> BuildInfo:
    """Read the build info; a missing or broken file means an unknown, regression-free build."""
    path = (pkg_dir or package_dir()) / "_build_info.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    regs = data.get("regressions") or []
    if isinstance(regs, str):  # tolerate "a,b" written by hand
        regs = [r for r in regs.split(",")]
    return BuildInfo(
        version=str(data.get("version") or "0.0.0+unknown"),
        commit=str(data.get("commit") or ""),
        regressions=frozenset(str(r).strip() for r in regs if str(r).strip()),
    )


@dataclass(frozen=True)
class GenesisState:
    """Which Genesis patches are live in this container (``_genesis_applied.json``)."""

    applied: frozenset[str]
    genesis_version: str = ""

    def has_patch(self, patch: str) -> bool:
        """True if ``patch`` (e.g. ``P67``) is applied.

        Entries may be bare ids (``P67``) or env-style names (``P67_TQ_MULTI_QUERY_KERNEL``);
        ``P67b`` counts as the P67 family's second kernel and satisfies ``P67`` too.
        """
        want = patch.upper()
        for entry in self.applied:
            head = entry.upper().split("_", 1)[0]
            if head == want or (head.startswith(want) and head[len(want):] in ("B",)):
                return True
        return False


def load_genesis_state(pkg_dir: Path | None = None) -> GenesisState | None:
    """The Genesis marker, or None when Genesis was not applied at all."""
    path = (pkg_dir or package_dir()) / "_genesis_applied.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # A marker exists but is unreadable: Genesis ran, we cannot tell which patches.
        return GenesisState(applied=frozenset())
    if isinstance(data, list):
        data = {"applied": data}
    if not isinstance(data, dict):
        return GenesisState(applied=frozenset())
    applied = data.get("applied") or []
    if isinstance(applied, dict):  # {"P67": true, ...}
        applied = [k for k, v in applied.items() if v]
    return GenesisState(
        applied=frozenset(str(a) for a in applied),
        genesis_version=str(data.get("genesis_version") or data.get("version") or ""),
    )
