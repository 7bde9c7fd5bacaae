"""Small statistics of run figures (stdlib only)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def cv(values: Sequence[float]) -> float | None:
    """Sample standard deviation over the mean; None for fewer than two values."""
    if len(values) < 2:
        return None
    m = statistics.fmean(values)
    return statistics.stdev(values) / m if m > 0 else None


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
