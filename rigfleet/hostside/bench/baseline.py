"""What a host's decode speed is judged against, and the judgement (pure; docs/bench.md)::

    base = baseline_for(history, "tq3-mtp-genesis", {"narrative": 89.2, "code": 119.1},
                        scale=1.0, n=5)
    findings = judge({"narrative": figs}, None, base, Limits(margin=0.15, cv_max=0.10))
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import SHAPES, SOURCE_ACCEPTED, ShapeFigures, ThroughputRecord
from ..verify.health import Finding
from ..verify.profiles import Profile


@dataclass(frozen=True)
class Baseline:
    """Per shape: the decode tok/s the host should reach, and where that figure comes from."""

    figures: Mapping[str, float] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: round(v, 3) for k, v in self.figures.items()}, "source": dict(self.sources)}


def since_accepted(history: Sequence[ThroughputRecord], stack: str) -> list[ThroughputRecord]:
    """``stack``'s records from its newest accepted baseline on (all of them without one)."""
    recs = [r for r in history if r.stack == stack]
    starts = [i for i, r in enumerate(recs) if r.source == SOURCE_ACCEPTED]
    return recs[starts[-1]:] if starts else recs


MIN_RECORDS = 3  # verified gates before a host's own history is its baseline


def baseline_for(history: Sequence[ThroughputRecord], stack: str,
                 reference: Mapping[str, float], scale: float, n: int,
                 min_records: int = MIN_RECORDS) -> Baseline:
    """Per shape the median of ``stack``'s last ``n`` records, else reference x scale (docs)."""
    recent = since_accepted(history, stack)[-max(n, 1):]
    accepted = any(r.source == SOURCE_ACCEPTED for r in recent)
    enough = min(max(min_records, 1), max(n, 1))
    figures: dict[str, float] = {}
    sources: dict[str, str] = {}
    for shape in SHAPES:
        values = [v for v in (r.decode(shape) for r in recent) if v is not None]
        if values and (accepted or len(values) >= enough):
            figures[shape] = statistics.median(values)
            sources[shape] = (f"history: median of {len(values)} "
                              + ("record(s) since the accepted baseline" if accepted
                                 else "verified gate(s)"))
        elif reference.get(shape, 0.0) > 0:
            figures[shape] = reference[shape] * scale
            sources[shape] = f"reference {reference[shape]:g} x {scale:g}"
    return Baseline(figures, sources)


def profile_baseline(history: Sequence[ThroughputRecord], p: Profile) -> Baseline:
    """The baseline the gate's throughput check judges by under profile ``p``."""
    reference = {"narrative": p.throughput_reference_narrative,
                 "code": p.throughput_reference_code}
    return baseline_for(history, p.throughput_stack, reference, p.throughput_scale,
                        p.throughput_history_n, min_records=p.throughput_history_min)


@dataclass(frozen=True)
class Limits:
    """How far a measurement may stray below the baseline, in CV, and in code acceptance."""

    margin: float = 0.15
    cv_max: float = 0.10
    acceptance_floor: tuple[float, ...] = ()


def judge(measured: Mapping[str, ShapeFigures | None], acceptance: Sequence[float] | None,
          baseline: Baseline, limits: Limits) -> list[Finding]:
    """Findings (none: it passes); figures None: nothing measured; ``acceptance`` None: unknown."""
    out: list[Finding] = []
    for shape, figs in measured.items():
        if figs is None:
            out.append(Finding("no_measurement", f"{shape}: no run measured a decode speed",
                               shape))
            continue
        want = baseline.figures.get(shape)
        if want and figs.decode < (floor := want * (1.0 - limits.margin)):
            out.append(Finding(
                "slow_decode", f"{shape}: decode {figs.decode:.1f} tok/s is "
                f"{1.0 - figs.decode / want:.0%} below the baseline {want:.1f} "
                f"({baseline.sources.get(shape)}); allowed: at most {limits.margin:.0%} below "
                f"({floor:.1f} tok/s)", shape))
        if figs.cv is not None and figs.cv > limits.cv_max:
            out.append(Finding(
                "unstable_decode", f"{shape}: decode CV {figs.cv:.1%} over {figs.runs} runs is "
                f"above {limits.cv_max:.0%}", shape))
    have = tuple(acceptance or ())  # empty: no per-position counters, unknown
    for i, floor in enumerate(limits.acceptance_floor if have else ()):
        if i >= len(have):
            out.append(Finding(
                "missing_acceptance", f"code: no MTP acceptance at draft position {i + 1} in "
                f"/metrics (it shows {len(have)} position(s)); the stack has a floor "
                f"{floor:.0%} there", f"position {i + 1}"))
        elif have[i] < floor:
            out.append(Finding(
                "low_acceptance", f"code: MTP acceptance at draft position {i + 1} is "
                f"{have[i]:.0%}, below the stack's floor {floor:.0%}", f"position {i + 1}"))
    return out
