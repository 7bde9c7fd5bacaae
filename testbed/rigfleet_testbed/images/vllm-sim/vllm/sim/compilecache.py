"""torch.compile and its on-disk cache: a cold compile, or a hit on a cache that survived.

vLLM compiles the model with torch.compile at start-up and keeps the result under
``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<r>_0/<backbone|eagle_head>`` (default
root ``~/.cache/vllm``); the hash covers the vLLM version and the configuration, so a new
image or other serving arguments compile again. Inside a container the directory is in the
writable layer unless a volume is mounted there: it then survives a restart (club-3090 mounts
``cache/torch_compile``; seed 004 did not, "so it rebuilds on restart").

Timings, as logged (real-looking, from the references): cold backbone 53 s (Dynamo 18 s) and
the MTP head ("eagle_head") 12 s (seed 004: "torch.compile: 53s (backbone) + 12s
(eagle_head)"; club-3090 5aa97a25: Dynamo 18 -> 5 s, torch.compile 57 -> 9 s cold -> warm);
a cache hit loads the backbone in ~9 s. The boot really takes that long divided by the
testbed clock (``sim_speedup``)::

    units = plan_compile(key, root, mtp=True, tp=2)
    [u.hit for u in units]        # [False, False] on a first boot
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

# (Dynamo bytecode transform, compile or cache load) seconds.
COLD = {"backbone": (18.3, 35.1), "eagle_head": (3.9, 8.2)}
WARM = {"backbone": (5.1, 3.9), "eagle_head": (1.3, 0.9)}
MARKER = "vllm_compile_cache.py"


def cache_root(environ: dict[str, str] | None = None) -> Path:
    """``$VLLM_CACHE_ROOT/torch_compile_cache`` (default ``~/.cache/vllm``)."""
    env = os.environ if environ is None else environ
    base = env.get("VLLM_CACHE_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "vllm")
    return Path(base) / "torch_compile_cache"


def cache_key(factors: dict[str, object]) -> str:
    """vLLM's cache directory name: a hash of everything the compiled graph depends on."""
    blob = json.dumps(factors, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


@dataclass(frozen=True)
class CompileUnit:
    """One compiled module on one rank and whether its cache is already there."""

    name: str  # backbone | eagle_head
    rank: int
    path: Path
    hit: bool

    @property
    def seconds(self) -> tuple[float, float]:
        return (WARM if self.hit else COLD)[self.name]


def plan_compile(key: str, root: Path, mtp: bool, tp: int) -> list[CompileUnit]:
    """The modules to compile (each rank compiles its own) and which are cache hits."""
    names = ["backbone"] + (["eagle_head"] if mtp else [])
    out = []
    for rank in range(max(tp, 1)):
        for name in names:
            path = root / key / f"rank_{rank}_0" / name
            out.append(CompileUnit(name, rank, path, (path / MARKER).is_file()))
    return out


def store(unit: CompileUnit, key: str) -> None:
    """What a finished compile leaves behind, so the next boot with this cache hits."""
    try:
        unit.path.mkdir(parents=True, exist_ok=True)
        (unit.path / MARKER).write_text(f"# vLLM compile cache ({unit.name}, key {key})\n"
                                        "{}\n", encoding="utf-8")
        (unit.path / "computation_graph.py").write_text(
            f"# compiled graph of the {unit.name} (simulated)\n", encoding="utf-8")
    except OSError:
        pass  # a read-only cache mount: vLLM compiles again next time
