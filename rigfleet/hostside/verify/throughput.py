"""The gate's throughput check: decode speed against the host's baseline, its spread, and
MTP acceptance per draft position (the bench's core; rules and records: docs/bench.md).
The measurement is kept in ``ctx.throughput_record`` for the runner to write."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..bench.baseline import Baseline, Limits, baseline_for, judge
from ..bench.measure import Bench, BenchSettings, ShapeResult
from ..layout import THROUGHPUT_HISTORY_NAME
from ..records import ShapeFigures, encode, read_throughput_history
from .health import Finding
from .report import FAIL, PASS, CheckResult

if TYPE_CHECKING:
    from .context import Context


def throughput(ctx: Context, out: CheckResult) -> CheckResult:
    p = ctx.profile
    bench = Bench(ctx.client, BenchSettings(runs=p.throughput_runs, warmup=p.throughput_warmup,
                                            timeout_s=p.throughput_timeout_s),
                  progress=ctx.progress, model=ctx.model)
    results = bench.shapes()
    measured = {name: r.figures() for name, r in results.items()}
    code = results["code"]
    # No per-position counters (an older vLLM): unknown, not "nothing accepted".
    acceptance = (code.acceptance.per_position or None) if code.acceptance else None
    reference = {"narrative": p.throughput_reference_narrative,
                 "code": p.throughput_reference_code}
    history = (read_throughput_history(Path(p.throughput_history_dir)
                                       / THROUGHPUT_HISTORY_NAME, p.throughput_stack)
               if p.throughput_stack and p.throughput_history_dir else [])
    base = baseline_for(history, p.throughput_stack, reference, p.throughput_scale,
                        p.throughput_history_n, min_records=p.throughput_history_min)
    limits = Limits(p.throughput_margin, p.throughput_cv_max, p.throughput_acceptance_floor)
    judged = bool(p.throughput_stack) or any(v > 0 for v in reference.values())
    findings = judge(measured, acceptance, base, limits)
    if not judged:
        findings = [f for f in findings if f.name == "no_measurement"]
    out.findings = findings
    out.status = FAIL if findings else PASS
    out.details = {"stack": p.throughput_stack or None, "judged": judged,
                   "baseline": base.to_dict(), "history_records": len(history),
                   "limits": encode(limits),
                   "shapes": {k: v.to_dict() for k, v in results.items()}}
    if code.acceptance is None and limits.acceptance_floor:
        out.details["acceptance_note"] = f"floors not checked: {code.acceptance_note}"
    ctx.throughput_record = bench.result.record(
        p.throughput_stack or ctx.model, result=out.status, acceptance=acceptance,
        scale=p.throughput_scale, baseline=base.to_dict(), version=ctx.version)
    out.summary = _summary(measured, base, code, findings, judged)
    return out


def _summary(measured: dict[str, ShapeFigures | None], base: Baseline, code: ShapeResult,
             findings: list[Finding], judged: bool) -> str:
    parts = []
    for shape, figs in measured.items():
        if figs is None:
            parts.append(f"{shape} -")
            continue
        want = base.figures.get(shape)
        vs = f" ({figs.decode / want:.0%} of {want:.1f})" if want and judged else ""
        cv = f" CV {figs.cv:.1%}" if figs.cv is not None else ""
        parts.append(f"{shape} {figs.decode:.1f} tok/s{vs}{cv}")
    acc = code.acceptance
    parts.append("acceptance " + ("/".join(f"{x:.0%}" for x in acc.per_position)
                                  + f" (AL {acc.length:.2f})" if acc else "unknown"))
    text = "; ".join(parts)
    if findings:
        return "; ".join(f.message for f in findings[:2]) + f" [{text}]"
    return text + ("" if judged else " (not judged: no stack and no reference)")
