"""The doctor's evidence from the host probe's ``doctor`` section, typed (pure parsing)::

    ev = parse_evidence("rig-a", probe.section("doctor"))
    ev.cards[0].power_limit_w, ev.cards[0].gen_load, ev.graph_mode, ev.load_decode
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from statistics import fmean
from typing import Any

# nvidia-smi's words: no value, and a clock event reason's state.
_WORDS: dict[str, bool | None] = {
    **dict.fromkeys(("", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]",
                     "[insufficient permissions]")), "active": True, "not active": False}
_REASONS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
            "hw_power_brake_slowdown")


def _value(raw: str) -> str | float | bool | None:
    text = raw.strip()
    low = text.lower()
    if low in _WORDS:
        return _WORDS[low]
    try:
        return float(int(low, 16)) if low.startswith("0x") else float(text)
    except ValueError:
        return text


def parse_sample(sample: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One nvidia-smi sample as one dict per card, keyed by field ([] when it failed)."""
    if sample.get("rc") != 0:
        return []
    fields = [str(f).replace("clocks_throttle_reasons.", "clocks_event_reasons.")
              for f in sample.get("fields") or []]
    return [{f: _value(v) for f, v in zip(fields, row, strict=True)}
            for row in csv.reader(io.StringIO(str(sample.get("stdout") or "")))
            if len(row) == len(fields)]


def _num(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, float) else None


def _over(rows: Sequence[Mapping[str, Any]], key: str,
          how: Callable[[list[float]], float]) -> float | None:
    """``how`` (max or mean) of ``key`` over the rows that report it."""
    got = [v for r in rows if (v := _num(r, key)) is not None]
    return how(got) if got else None


@dataclass(frozen=True)
class Card:
    """One card: its limits, and what it did under the load (means, maxima, reasons)."""

    index: int
    name: str = ""
    power_limit_w: float | None = None
    power_default_w: float | None = None
    power_max_w: float | None = None
    power_draw_w: float | None = None  # mean under load
    power_draw_max_w: float | None = None
    utilization: float | None = None  # mean under load, %
    clocks_sm: float | None = None
    clocks_mem: float | None = None
    clocks_max_sm: float | None = None
    clocks_max_mem: float | None = None
    reasons: tuple[str, ...] = ()  # clock event reasons active in any load sample
    gen_idle: float | None = None
    gen_load: float | None = None  # the highest generation under load (the link drops at idle)
    gen_max: float | None = None  # what this slot and card allow together
    gen_gpumax: float | None = None  # what the card itself supports
    width_load: float | None = None
    width_max: float | None = None
    temperature_max: float | None = None
    pstate_load: str = ""
    samples: int = 0


def summarise(index: int, idle: Mapping[str, Any], load: Sequence[Mapping[str, Any]]) -> Card:
    first = load[0] if load else idle
    at, over = partial(_num, first), partial(_over, load)
    return Card(
        index=index, name=str(first.get("name") or ""), power_limit_w=at("power.limit"),
        power_default_w=at("power.default_limit"), power_max_w=at("power.max_limit"),
        power_draw_w=over("power.draw", fmean), power_draw_max_w=over("power.draw", max),
        utilization=over("utilization.gpu", fmean), clocks_sm=over("clocks.sm", fmean),
        clocks_mem=over("clocks.mem", fmean), clocks_max_sm=at("clocks.max.sm"),
        clocks_max_mem=at("clocks.max.mem"),
        reasons=tuple(r for r in _REASONS
                      if any(row.get(f"clocks_event_reasons.{r}") is True for row in load)),
        gen_idle=_num(idle, "pcie.link.gen.current"), gen_load=over("pcie.link.gen.current", max),
        gen_max=at("pcie.link.gen.max"), gen_gpumax=at("pcie.link.gen.gpumax"),
        width_load=over("pcie.link.width.current", max), width_max=at("pcie.link.width.max"),
        temperature_max=over("temperature.gpu", max),
        pstate_load=str(load[-1].get("pstate") or "") if load else "", samples=len(load))


@dataclass(frozen=True)
class Evidence:
    """Everything the doctor read on one host (``error`` when it could read nothing)."""

    host: str
    stack: str | None = None
    cards: tuple[Card, ...] = ()
    engine: Mapping[str, Any] = field(default_factory=dict)
    enforce_eager: bool = False
    mounts: tuple[tuple[str, str], ...] = ()  # (host source, container destination)
    load_decode: float | None = None  # narrative tok/s under the doctor's load
    load_acceptance: tuple[float, ...] | None = None
    error: str = ""

    @property
    def graph_mode(self) -> str | None:
        """The CUDA-graph mode the engine runs in (``NONE`` under --enforce-eager)."""
        return "NONE" if self.enforce_eager else self.engine.get("graph_mode")


def parse_evidence(host: str, section: Mapping[str, Any]) -> Evidence:
    if not section:
        return Evidence(host, error="the probe has no doctor section (an older host-side "
                                    "tool: run the deploy)")
    gpu = section.get("gpu") or {}
    idle_rows = parse_sample(gpu.get("idle") or {})
    load_rows = [parse_sample(s) for s in gpu.get("load") or []]
    cards = (summarise(int(idle["index"]) if isinstance(idle.get("index"), float) else pos, idle,
                       [rows[pos] for rows in load_rows if pos < len(rows)])
             for pos, idle in enumerate(idle_rows))
    load = section.get("load") or {}
    acc = load.get("acceptance") or {}
    per_pos = acc.get("per_position") if isinstance(acc, dict) else None
    decode = load.get("decode_mean") if isinstance(load.get("decode_mean"), int | float) else None
    return Evidence(
        host=host, stack=section.get("stack"), cards=tuple(cards),
        engine=section.get("engine") or {}, enforce_eager=bool(section.get("enforce_eager")),
        mounts=tuple((str(m.get("source")), str(m.get("destination")))
                     for m in section.get("mounts") or () if isinstance(m, dict)),
        load_decode=decode,
        load_acceptance=tuple(float(x) for x in per_pos) if isinstance(per_pos, list) else None,
        error=str(section.get("error") or "") or ("" if decode is not None else _unmeasured(load)))


def _unmeasured(load: Mapping[str, Any]) -> str:
    """Why a load that measured no decode speed is no evidence (its first run failed)."""
    runs = [r for r in load.get("runs") or () if isinstance(r, dict)]
    if not runs:
        return "the load measured no decode speed"
    why = (f"HTTP {runs[0]['http_status']}" if runs[0].get("http_status") else "no HTTP answer")
    return (f"the load measured no decode speed (first run: {why}"
            + (f": {runs[0]['error']})" if runs[0].get("error") else ")"))
