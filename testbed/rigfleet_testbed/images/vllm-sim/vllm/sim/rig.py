"""The simulated rig as the engine sees it, and what the engine tells nvidia-smi back.

Read (never written) from the simulated driver's files under ``$NVIDIA_SIM_ROOT`` (the
container sees the host's ``/run/nvidia-sim``, see docs/architecture.md):

- ``hardware.json``: top level ``nvlink`` and ``sim_speedup`` (the testbed's clock: every
  simulated duration is divided by it; default 1.0, real time); per GPU ``power_default_w``
  (default 350), ``power_max_w``, ``pcie_gen_max`` (default 4) and ``pcie_width_max``
  (default 16): the link a card trains up to under load.
- ``state.json``: ``gpus.<index>.power_limit_w``, what ``nvidia-smi -pl`` set (the default
  limit until then).

Written: ``alloc/<name>.activity`` next to this process's allocation file, replaced
atomically, so the stand-in nvidia-smi can show the cards busy or idle::

    {"phase": "decode", "gpus": {"0": {"utilization": 97, "power_demand_w": 220.0}}}

``phase`` is ``idle``, ``prefill`` or ``decode``; the holder's allocation file says whether
the holder is alive, so a sidecar without a live holder means nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm.sim import hardware, perf

DEFAULT_POWER_W = 350.0


@dataclass(frozen=True)
class Rig:
    """The cards one engine runs on, as the driver reports them now."""

    cards: tuple[perf.Card, ...]
    power_max_w: tuple[float, ...]
    nvlink: bool = False
    speedup: float = 1.0


def _num(value: Any, default: float) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if out > 0 else default


def read_rig(indices: Sequence[int], root: Path | None = None) -> Rig:
    """Power limits, links and the clock of the physical GPUs ``indices``."""
    root = root or hardware.sim_root()
    hw = hardware.hardware_data(root) or {}
    by_index: dict[int, dict[str, Any]] = {}
    for pos, g in enumerate(hw.get("gpus") or []):
        if isinstance(g, dict):
            by_index[int(g.get("index", pos))] = g
    try:
        state = json.loads((root / "state.json").read_text(encoding="utf-8")).get("gpus", {})
    except (OSError, ValueError, AttributeError):
        state = {}
    cards, maxes = [], []
    for idx in indices:
        g = by_index.get(idx, {})
        default = _num(g.get("power_default_w"), DEFAULT_POWER_W)
        limit = _num((state.get(str(idx)) or {}).get("power_limit_w"), default)
        cards.append(perf.Card(power_limit_w=limit,
                               pcie_gen=int(_num(g.get("pcie_gen_max"), perf.REF_GEN)),
                               pcie_width=int(_num(g.get("pcie_width_max"), perf.REF_WIDTH))))
        maxes.append(_num(g.get("power_max_w"), default))
    return Rig(cards=tuple(cards), power_max_w=tuple(maxes), nvlink=bool(hw.get("nvlink")),
               speedup=_num(hw.get("sim_speedup"), 1.0))


class Activity:
    """Publishes what the cards are doing for nvidia-smi (utilization, power demand)."""

    def __init__(self, alloc_path: Path | None, indices: Sequence[int]):
        self.path = alloc_path.with_suffix(".activity") if alloc_path is not None else None
        self.indices = list(indices)
        self._last: Any = None

    def publish(self, phase: str, utilization: Mapping[int, int],
                demand_w: Mapping[int, float]) -> None:
        """Replace the sidecar (a no-op when nothing changed or there is no allocation)."""
        if self.path is None:
            return
        body = {"phase": phase, "gpus": {
            str(i): {"utilization": int(utilization.get(i, 0)),
                     "power_demand_w": round(float(demand_w.get(i, 0.0)), 1)}
            for i in self.indices}}
        if body == self._last:
            return
        self._last = body
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".act-")
            with os.fdopen(fd, "w") as fh:
                json.dump(body, fh)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except OSError:
            pass  # the driver's directory went away (module unloaded): nothing to report to

