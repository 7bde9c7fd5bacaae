"""How long this host's windows take, measured (``timings.json``, docs/swap.md): what
``Retry-After`` says while one is open. A stack never measured here borrows the newest
measured one's boot and gate; a host that never measured a window says the plan's
``retry_after_s``::

    swap_estimate(read_timings(lay), "int8", busy=True, fallback_s=30)   # Estimate(24, "...")
    record_swap(lay, "int8", boot_s=4.1, gate_s=12.0, window_s=25.0, drain=report)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from .atomic import write_json
from .drain import DrainReport
from .layout import Layout
from .records import decode, encode, read_json

SCHEMA = "rigfleet-timings/1"
# The swap's own cost until measured (stop, memory released, front switch).
DEFAULT_OVERHEAD_S = 5.0


@dataclass(frozen=True)
class StackTimes:
    boot_s: float
    gate_s: float
    at: float = 0.0


@dataclass(frozen=True)
class Timings:
    """``timings.json``; every figure optional."""

    stacks: dict[str, StackTimes] = field(default_factory=dict)
    overhead_s: float | None = None
    drain_s: float | None = None
    steps_s: float | None = None

    def stack(self, name: str) -> tuple[str, StackTimes] | None:
        """``name``'s measured times, else the newest measured stack's, else None."""
        if name not in self.stacks and self.stacks:
            name = max(self.stacks, key=lambda s: self.stacks[s].at)
        return (name, self.stacks[name]) if name in self.stacks else None


def read_timings(lay: Layout) -> Timings:
    """This host's record; an empty one when it is missing or damaged."""
    data, _ = read_json(lay.timings_file)
    ours = isinstance(data, dict) and data.get("schema") == SCHEMA
    return (decode(Timings, data) if ours else None) or Timings()


@dataclass(frozen=True)
class Estimate:
    """``seconds`` for Retry-After (>= 1) and what it was made of."""

    seconds: int
    basis: str


def maintenance_estimate(t: Timings, stack: str | None, busy: bool, fallback_s: int,
                         steps: bool = True) -> Estimate:
    """How long a maintenance window keeps the front at 503: its steps (the last window's),
    a drain when ``busy``, and the recreation of ``stack``."""
    found = t.stack(stack) if stack is not None else None
    if found is None:
        return Estimate(max(1, int(fallback_s)), f"{int(fallback_s)} s: no window measured on "
                        "this host yet (the plan's retry_after_s)")
    name, times = found
    of = "" if name == stack else f" (of {name}: {stack} not measured here)"
    parts = [(f"boot{of}", times.boot_s), ("gate", times.gate_s),
             ("overhead" if t.overhead_s is not None else "overhead (default)",
              t.overhead_s if t.overhead_s is not None else DEFAULT_OVERHEAD_S)]
    if busy and t.drain_s:
        parts.insert(0, ("drain (last measured)", t.drain_s))
    if steps and t.steps_s:
        parts.insert(0, ("steps (last window)", t.steps_s))
    total = sum(v for _, v in parts)
    basis = " + ".join(f"{k} {v:.1f}s" for k, v in parts if v > 0 or k.startswith("boot"))
    return Estimate(max(1, math.ceil(total)), f"{basis}, measured on this host")


def swap_estimate(t: Timings, stack: str, busy: bool, fallback_s: int) -> Estimate:
    """How long a swap to ``stack`` keeps the front at 503 (``busy``: a drain first)."""
    return maintenance_estimate(t, stack, busy, fallback_s, steps=False)


def _update(lay: Layout, stack: str = "", boot_s: float = 0.0, gate_s: float = 0.0,
            **figures: float | None) -> None:
    """Merge ``stack``'s times (none: "") and the figures, rounded, into the record (None:
    keep)."""
    t = read_timings(lay)
    new = {stack: StackTimes(round(boot_s, 2), round(gate_s, 2), time.time())} if stack else {}
    kept = {k: round(v, 2) for k, v in figures.items() if v is not None}
    t = replace(t, stacks={**t.stacks, **new}, **kept)
    write_json(lay.timings_file, {"schema": SCHEMA, **encode(t)})


def record_drain(lay: Layout, drain: DrainReport | None) -> None:
    """Right after a drain that waited for requests, whatever the outcome."""
    if drain is not None and drain.waited_for_requests:
        _update(lay, drain_s=drain.seconds)


def record_swap(lay: Layout, stack: str, boot_s: float, gate_s: float, window_s: float,
                drain: DrainReport | None) -> None:
    """After a promoted swap (its drain was recorded when it ended)."""
    drained = drain.seconds if drain is not None else 0.0
    _update(lay, stack, boot_s, gate_s, overhead_s=max(0.0, window_s - drained - boot_s - gate_s))


def record_maintenance(lay: Layout, stack: str, boot_s: float, gate_s: float,
                       steps_s: float | None) -> None:
    """After a closed maintenance window (its drain was recorded when it opened)."""
    _update(lay, stack, boot_s, gate_s, steps_s=steps_s)
