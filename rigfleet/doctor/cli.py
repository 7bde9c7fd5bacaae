"""``rigfleet doctor [--load-s 15]``: each GPU host's decode under a short load against its
baseline and its peers' median, the known causes ranked (exit statuses: docs/bench.md)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from rigfleet.catalog import DEFAULT_MARGIN
from rigfleet.cliargs import console, fleet_options
from rigfleet.desired import gate_profile
from rigfleet.doctor.evidence import Evidence, parse_evidence
from rigfleet.doctor.rules import CAUSE, RULED_OUT, Cause, Expect, Verdict, diagnose, verdict
from rigfleet.hostdata import HostSettings
from rigfleet.hostprobe import HostProbe
from rigfleet.hostside.argtypes import positive
from rigfleet.hostside.bench.baseline import profile_baseline
from rigfleet.inventory import gpu_hosts
from rigfleet.tables import Table, ratio, show

EXIT_OK, EXIT_SLOW, EXIT_UNREACHABLE, EXIT_ERROR = 0, 1, 2, 3


@dataclass
class Diagnosis:
    host: str
    stack: str | None = None
    pins: tuple[str, ...] = ()
    evidence: Evidence | None = None
    verdict: Verdict | None = None
    causes: list[Cause] = field(default_factory=list)
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        ev = self.evidence
        return {"host": self.host, "stack": self.stack, "pins": list(self.pins),
                "verdict": self.verdict.to_dict() if self.verdict else None,
                "causes": [c.to_dict() for c in self.causes],
                "graph_mode": ev.graph_mode if ev else None,
                "cards": [vars(c) for c in ev.cards] if ev else [],
                "error": self.error or None}


def examine(host: str, probe: HostProbe, settings: HostSettings) -> Diagnosis:
    """One probed host's evidence, causes and baseline (``judge_fleet`` adds its peers)."""
    ev = parse_evidence(host, probe.section("doctor"))
    stack = ev.stack or probe.state.get("stack")
    stack = stack if isinstance(stack, str) else None
    spec = settings.catalog.stacks.get(stack or "")
    thr = spec.throughput if spec else None
    pins = tuple(str(probe.state.get(k) or "") for k in ("digest", "genesis_commit",
                                                         "model_revision"))
    d = Diagnosis(host, stack, pins, ev, error=ev.error)
    if ev.error:
        return d
    exp, base, source, margin = Expect(), None, "", DEFAULT_MARGIN
    if spec is not None:  # what the stack should do, the code runs' acceptance of the last gate
        last = probe.throughput_last
        exp = Expect(tp=spec.tensor_parallel_size, kv_cache_dtype=spec.kv_cache_dtype,
                     floors=thr.floors if thr else (),
                     acceptance_reference=thr.acceptance if thr else (),
                     gate_acceptance=last.acceptance if last and last.stack == spec.name else None)
        profile = gate_profile(settings, spec)  # judged as this host's gate judges it
        b = profile_baseline(probe.throughput_history, profile)
        base, source = b.figures.get("narrative"), b.sources.get("narrative", "")
        margin = profile.throughput_margin
    d.causes = diagnose(ev, exp)
    d.verdict = Verdict(ev.load_decode, base, source, margin=margin)
    return d


def judge_fleet(diagnoses: Sequence[Diagnosis]) -> None:
    """Each host's verdict against its baseline and its peers' median."""
    for d in diagnoses:
        if (v := d.verdict) is not None:
            peers = [p.verdict.now for p in diagnoses if p.verdict and p.verdict.now is not None
                     and (p.stack, p.pins) == (d.stack, d.pins)]
            d.verdict = verdict(v.now, v.baseline, v.baseline_source, peers, v.margin)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "doctor", parents=[fleet_options(timeout=120.0,
                                         timeout_help="seconds per host on top of the load")],
        help="why a host decodes slower than its baseline or the fleet: causes "
                       "ranked, with evidence and fixes",
        description="Why a host decodes slower than its baseline or the fleet's median: the "
                    "known causes ranked by likely impact, each with the evidence read from the "
                    "host under a short load and what to change.")
    p.add_argument("--load-s", type=positive, default=15.0,
                   help="how long the load runs on each host while the cards are sampled (15)")
    p.set_defaults(func=run, inventory_exit=EXIT_ERROR)


def render(diagnoses: Sequence[Diagnosis], title: str) -> Table:
    """One line per host; the causes (then what was ruled out) as notes under the table."""
    table = Table(title, ["host", "stack", "tok/s now", "vs base", "vs fleet", "graphs",
                          "verdict", "top cause"])
    for d in diagnoses:
        v, ev = d.verdict, d.evidence
        if d.error or v is None or ev is None:
            table.row(d.host, d.stack or "-", "-", "-", "-", "-", Text("error", style="red"), "-")
            table.note(d.host, Text(d.error or "no evidence", style="red"))
            continue
        top = next((c for c in d.causes if c.kind == CAUSE), None)
        table.row(d.host, d.stack or "-", f"{v.now:.1f}" if v.now is not None else "-",
                  ratio(v.now, v.baseline, 0.85), ratio(v.now, v.fleet_median, 0.85),
                  ev.graph_mode or "?",
                  Text("slow", style="red") if v.slow else Text("ok", style="green"),
                  f"{top.title} (~{top.impact:.0%})" if top else "-")
        for reason in v.reasons:
            table.note(d.host, Text(reason, style="red"))
        rank = 0
        for c in d.causes:
            if c.kind == RULED_OUT:
                table.note(d.host, Text(f"ruled out: {c.title}: {'; '.join(c.evidence)}"
                                        + (f" ({c.basis})" if c.basis else ""), style="dim"))
                continue
            rank += c.kind == CAUSE
            head = f"{rank}. {c.title} (~{c.impact:.0%})" if c.kind == CAUSE else \
                f"info: {c.title}"
            text = (f"{head}: {'; '.join(c.evidence)}" + (f" -> {c.fix}" if c.fix else "")
                    + (f" [{c.basis}]" if c.basis else ""))
            table.note(d.host, Text(text, style="yellow" if c.kind == CAUSE else ""))
    return table


def run(args: argparse.Namespace) -> int:
    from rigfleet.cliargs import fleet_hosts
    from rigfleet.fleetview import fleet_view
    from rigfleet.ssh import SshRemote

    hosts = gpu_hosts(fleet_hosts(args))
    console.print(f"doctor: {len(hosts)} host(s), {args.load_s:g} s of load each ...")
    diagnoses = [examine(v.host.name, v.probe, v.want.settings)
                 if v.want is not None and v.probe is not None
                 else Diagnosis(v.host.name, error=v.error or "no probe")
                 for v in fleet_view(hosts, SshRemote(connect_timeout=args.timeout),
                                     timeout=args.load_s + args.timeout, doctor_load_s=args.load_s)]
    judge_fleet(diagnoses)
    show(args.json, {"hosts": [d.to_dict() for d in diagnoses]},
         render(diagnoses, f"rigfleet doctor ({args.inventory})"))
    if any(d.error for d in diagnoses):
        return EXIT_UNREACHABLE
    return EXIT_SLOW if any(d.verdict and d.verdict.slow for d in diagnoses) else EXIT_OK

