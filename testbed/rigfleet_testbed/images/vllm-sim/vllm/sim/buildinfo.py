"""What this build of "vLLM" is: version, features, baked-in regressions, live Genesis patches.

Version-specific behaviour is data, never a decision made from a test: the image build writes
``vllm/_build_info.json`` (``rigfleet_testbed.vllm_builds.build_info``: the version's features
and regressions, each rule citing its source there), and Genesis, which runs before
``vllm serve`` in the container, text-patches vLLM's source files in the container's R/W layer,
leaving ``[Genesis <id>`` markers in them; :func:`load_genesis_state` finds those markers, as
the patched code would be what runs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# Regressions a build can carry (names used in _build_info.json "regressions").
# post-#41434 nightlies + transformers 5.8: speculator auto-detection treats a local model
# path as a Hub repo id and aborts the boot (club-3090 570fa712).
REGRESSION_SPECULATORS_OSERROR = "speculators-local-path-oserror"
# MTP draft acceptance collapses (mean acceptance length ~1.1) and generations stop early.
REGRESSION_SPEC_ACCEPTANCE_COLLAPSE = "spec-decode-acceptance-collapse"
# vllm#50021: with MTP and async scheduling, a GDN spec-decode wild write kills the engine core.
REGRESSION_GDN_SPEC_WILD_WRITE = "vllm-50021-gdn-spec-decode-wild-write"
# vllm#43559: MTP x prefix caching corrupts the GDN state restored from a cached prefix.
REGRESSION_MTP_PREFIX_CACHE_GDN = "vllm-43559-mtp-prefix-cache-gdn-state"
# Decode ~30% slower, nothing else changes (the throughput model, ``perf``).
REGRESSION_DECODE_SLOWDOWN = "decode-throughput-regression"
# Decode speed alternates 1.7x / 0.3x from one request to the next (CV ~70-90% over 5
# runs), nothing else changes (``perf``).
REGRESSION_DECODE_UNSTABLE = "decode-throughput-unstable"
KNOWN_REGRESSIONS = frozenset({REGRESSION_SPECULATORS_OSERROR, REGRESSION_SPEC_ACCEPTANCE_COLLAPSE,
                               REGRESSION_GDN_SPEC_WILD_WRITE, REGRESSION_MTP_PREFIX_CACHE_GDN,
                               REGRESSION_DECODE_SLOWDOWN, REGRESSION_DECODE_UNSTABLE})

# What a build-info file without feature keys means: the dtypes every simulated build knows.
ALL_KV_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
    "int8_per_token_head", "fp8_per_token_head",
)  # fmt: skip
MARLIN_MODES = ("needs-pad", "model-native", "native")
# Code that pads Marlin's sub-tile output dim: Genesis P87's text patch, the vllm#40361 overlay
# (club-3090's vendored marlin.py), or upstream's general tile pad (vllm#45295).
MARLIN_PAD_SIGNS = ("[Genesis P87", "_maybe_pad_n", "marlin_padded_nk")
MARLIN_FILE = "model_executor/kernels/linear/mixed_precision/marlin.py"
_MARKER = re.compile(r"\[Genesis (P[N]?\d+[A-Za-z]?)\b")
_NOT_VLLM_SOURCE = ("sim", "_genesis", "__pycache__")


def package_dir() -> Path:
    """The directory of the ``vllm`` package (where Genesis patches files)."""
    import vllm

    return Path(os.path.dirname(os.path.abspath(vllm.__file__)))


@dataclass(frozen=True)
class BuildInfo:
    """Contents of ``vllm/_build_info.json``."""

    version: str
    commit: str
    regressions: frozenset[str] = field(default_factory=frozenset)
    tag: str = ""
    kv_cache_dtypes: tuple[str, ...] = ALL_KV_CACHE_DTYPES
    turboquant_hybrid: bool = True
    marlin_sub_tile_n: str = "native"

    def has(self, regression: str) -> bool:
        return regression in self.regressions


def load_build_info(pkg_dir: Path | None = None) -> BuildInfo:
    """Read the build info; a missing or broken file means an unknown, regression-free build
    with every feature."""
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
    dtypes = data.get("kv_cache_dtypes")
    marlin = str(data.get("marlin_sub_tile_n") or "native")
    return BuildInfo(
        version=str(data.get("version") or "0.0.0+unknown"),
        commit=str(data.get("commit") or ""),
        regressions=frozenset(str(r).strip() for r in regs if str(r).strip()),
        tag=str(data.get("tag") or ""),
        kv_cache_dtypes=tuple(str(d) for d in dtypes) if isinstance(dtypes, list) and dtypes
        else ALL_KV_CACHE_DTYPES,
        turboquant_hybrid=bool(data.get("turboquant_hybrid", True)),
        marlin_sub_tile_n=marlin if marlin in MARLIN_MODES else "native",
    )


@dataclass(frozen=True)
class GenesisState:
    """Which Genesis patches are live in this container: the ``[Genesis <id>`` markers that
    its text patches left in vLLM's source files."""

    applied: frozenset[str]

    def has_patch(self, patch: str) -> bool:
        """True if ``patch`` (e.g. ``P67``) left its marker; ``P67b`` counts for ``P67``."""
        want = patch.upper()
        return any(a.upper() in (want, want + "B") for a in self.applied)


def load_genesis_state(pkg_dir: Path | None = None) -> GenesisState | None:
    """The Genesis patches found in the vLLM sources, or None when none is there."""
    root = pkg_dir or package_dir()
    found: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if set(path.relative_to(root).parts[:-1]) & set(_NOT_VLLM_SOURCE):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found.update(_MARKER.findall(text))
    return GenesisState(applied=frozenset(found)) if found else None


def marlin_pad_present(pkg_dir: Path | None = None) -> bool:
    """The image's marlin.py pads sub-tile output shards (overlay, Genesis P87 or upstream)."""
    try:
        text = ((pkg_dir or package_dir()) / MARLIN_FILE).read_text(encoding="utf-8",
                                                                     errors="replace")
    except OSError:
        return False
    return any(sign in text for sign in MARLIN_PAD_SIGNS)
