"""Bench reports: JSON (schema ``rigfleet-bench/1``) and Markdown, one entry per host benched.

    entry = Entry("rig-a", "int8", result, reference={"narrative": 130.8}, baseline=base)
    paths = write([entry], Path("bench-reports"))   # bench-<ts>.json and .md
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import SHAPES, ThroughputRecord, now_iso
from ..verify.report import write_pair
from .baseline import Baseline
from .measure import BenchResult

SCHEMA = "rigfleet-bench/1"


@dataclass
class Entry:
    """One bench (``host``: an inventory name, or the URL) and what it stands beside."""

    host: str
    stack: str | None
    result: BenchResult
    reference: Mapping[str, float] = field(default_factory=dict)  # already x scale
    scale: float = 1.0
    baseline: Baseline | None = None
    history: Sequence[ThroughputRecord] = ()
    error: str = ""

    def decode(self, shape: str) -> float | None:
        return s.decode_mean if (s := self.result.shapes.get(shape)) else None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "stack": self.stack, "scale": self.scale,
                "reference": dict(self.reference),
                "baseline": self.baseline.to_dict() if self.baseline else None,
                "history": [{"at": r.at, "source": r.source,
                             **{s: r.decode(s) for s in SHAPES}} for r in self.history],
                "bench": self.result.to_dict(), "error": self.error or None}


def fleet_medians(entries: Sequence[Entry]) -> dict[str, dict[str, float]]:
    """stack -> shape -> the median decode tok/s over the entries of that stack."""
    out: dict[str, dict[str, float]] = {}
    for stack in sorted({e.stack for e in entries if e.stack}):
        for shape in SHAPES:
            values = [v for e in entries if e.stack == stack if (v := e.decode(shape)) is not None]
            if values:
                out.setdefault(stack, {})[shape] = round(statistics.median(values), 3)
    return out


def report_dict(entries: Sequence[Entry], started: str = "") -> dict[str, Any]:
    return {"schema": SCHEMA, "started": started, "finished": now_iso(suffix="Z"),
            "entries": [e.to_dict() for e in entries], "fleet": fleet_medians(entries)}


def cell(value: float | None, fmt: str = ".1f") -> str:
    """A figure as table text, "-" for none."""
    return "-" if value is None else format(value, fmt)


def _vs(value: float | None, against: float | None) -> str:
    return "-" if value is None or not against else f"{value / against:.0%} of {against:.1f}"


def markdown(entries: Sequence[Entry]) -> str:
    """The report for people: per host the shapes, acceptance, concurrency and depths."""
    fleet = fleet_medians(entries)
    lines = ["# rigfleet bench", ""]
    for e in entries:
        r = e.result
        lines += [f"## {e.host}" + (f" ({e.stack})" if e.stack else ""), "",
                  f"- URL `{r.url}`, model `{r.model or '?'}`, version `{r.version or '?'}`, "
                  f"max_model_len `{r.max_model_len or '?'}`",
                  f"- {r.settings.warmup} warm-up round(s), {r.settings.runs} run(s) per shape, "
                  f"{r.seconds:.1f} s ({r.overhead_s:.2f} s outside the requests)"]
        if e.error or r.error:
            lines += [f"- **error**: {e.error or r.error}"]
        lines += ["", "| shape | decode tok/s | CV | wall tok/s | TTFT s | acceptance | "
                  "vs reference | vs fleet median | vs baseline |", "|---" * 9 + "|"]
        for shape, sr in r.shapes.items():
            acc = str(sr.acceptance) if sr.acceptance else sr.acceptance_note or "unknown"
            base = e.baseline.figures.get(shape) if e.baseline else None
            lines.append(
                f"| {shape} | {cell(sr.decode_mean)} | {cell(sr.decode_cv, '.1%')} | "
                f"{cell(sr.wall_mean)} | {cell(sr.ttft_mean, '.3f')} | {acc} | "
                f"{_vs(sr.decode_mean, e.reference.get(shape))} | "
                f"{_vs(sr.decode_mean, fleet.get(e.stack or '', {}).get(shape))} | "
                f"{_vs(sr.decode_mean, base)} |")
        if (c := r.concurrency) is not None:
            lines += ["", f"Concurrency: {c.streams} streams, {cell(c.per_stream_decode)} tok/s "
                          f"each, {cell(c.aggregate_tok_s)} tok/s in all"]
        if r.depths:
            lines += ["", "| context depth | prompt tokens | decode tok/s | TTFT s | note |",
                      "|---|---|---|---|---|"]
            for d in r.depths:
                lines.append(f"| {d.depth} | {d.prompt_tokens or '-'} | "
                             f"{cell(d.run.decode_tok_s if d.run else None)} | "
                             f"{cell(d.run.first_token_s if d.run else None, '.2f')} | "
                             f"{d.note or ''} |")
        if e.history:
            lines += ["", "History (verified gates, accepted baselines): " + ", ".join(
                f"{h.at[:16]} {cell(h.decode('narrative'))}/{cell(h.decode('code'))}"
                + (" (accepted)" if h.source == "accepted" else "") for h in e.history[-8:])]
        lines += [*(f"- note: {n}" for n in r.notes), ""]
    return "\n".join(lines) + "\n"


def write(entries: Sequence[Entry], directory: Path, started: str = "") -> tuple[Path, Path]:
    """``bench-<UTC timestamp>.json`` and ``.md`` in ``directory`` (created)."""
    return write_pair(directory, "bench",
                      json.dumps(report_dict(entries, started), indent=2) + "\n",
                      markdown(entries))
