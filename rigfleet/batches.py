"""How many serving hosts move at once: one policy for the rollout's batches, the deploy's
maintenance admission (``RIGFLEET_MAINTENANCE_BATCH``) and the converge's swap slots::

    in_batches(["a", "b", "c"], 2)         # [("a", "b"), ("c",)]
    admit(["b", "c"], 2, moving=["a"])     # ["b"]
"""

from __future__ import annotations

from collections.abc import Sequence

BATCH_ENV = "RIGFLEET_MAINTENANCE_BATCH"


def batch_size(raw: str | int, what: str, allowed: str = "1 or more") -> int:
    """``raw`` as a number of hosts (>= 1), else ValueError naming ``what`` and the value."""
    text = str(raw).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{what}: {raw!r} is not a number of hosts; allowed: {allowed}")
    return int(text)


def in_batches(hosts: Sequence[str], size: int) -> list[tuple[str, ...]]:
    """``hosts`` in their order, ``size`` at a time."""
    return [tuple(hosts[i:i + size]) for i in range(0, len(hosts), size)]


def admit(waiting: Sequence[str], size: int, moving: Sequence[str] = ()) -> list[str]:
    """The first of ``waiting`` that may start moving while ``moving`` do, ``size`` at most."""
    return list(waiting[:max(0, size - len(moving))])
