"""``rigfleet roll``: the converge over the fleet, serving hosts a batch at a time (each run told
``RIGFLEET_MAINTENANCE_BATCH``), by the rollout engine without a canary (docs/maintenance.md)::

    rigfleet roll --inventory inventory/home.py --batch 2 --dry
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rigfleet.batches import batch_size, in_batches
from rigfleet.bump.rollout import (
    DeployResult,
    HostOutcome,
    RolloutResult,
    Runner,
    Status,
    host_error,
    new_ledger_lines,
    run_batches,
    with_error,
)
from rigfleet.hostprobe import HostProbe


@dataclass(frozen=True)
class RollPlan:
    """The batches (host names, inventory order), and the hosts left out (why)."""

    batches: tuple[tuple[str, ...], ...]
    serving: frozenset[str]
    skipped: Mapping[str, str] = field(default_factory=dict)

    def label(self, n: int) -> str:
        """Batch ``n``, counted from 1."""
        return f"batch {n}" + ("" if self.serving.intersection(self.batches[n - 1]) else " (bare)")


def plan_batches(order: Sequence[str], probes: Mapping[str, HostProbe | str],
                 batch: int) -> RollPlan:
    """Bare hosts first, together, then serving ones ``batch`` at a time; skip unprobed/busy."""
    batch = batch_size(batch, "--batch")
    skipped: dict[str, str] = {}
    bare: list[str] = []
    serving: list[str] = []
    for name in order:
        p = probes.get(name)
        if p is None or isinstance(p, str):
            skipped[name] = f"unreachable ({p or 'not probed'})"
        elif p.busy:
            skipped[name] = f"busy: {p.busy}"
        elif p.active and (p.active.get("ref") or {}).get("stack"):
            serving.append(name)
        else:
            bare.append(name)
    batches = ([tuple(bare)] if bare else []) + in_batches(serving, batch)
    return RollPlan(tuple(batches), frozenset(serving), skipped)


def classify(name: str, deploy: DeployResult, before: HostProbe | None,
             after: HostProbe | str, batch: int) -> HostOutcome:
    error = host_error(deploy.log, name)
    if isinstance(after, str):
        return HostOutcome(name, Status.LOST, batch, reason=with_error(
            error, f"unreachable after its run started ({after})", "; pyinfra"),
            seconds=deploy.seconds)
    lines = new_ledger_lines(before, after)
    last = next((x for x in reversed(lines) if x.get("event") == "maintenance"
                 and x.get("result") in ("closed", "failed")), None)
    gate = str(((last or {}).get("gate") or {}).get("result") or "")
    outcome = partial(HostOutcome, name, batch=batch, seconds=deploy.seconds, serving=after.route)
    if deploy.failed(name):
        reason = next((str(x["reason"]) for x in reversed(lines) if x.get("reason")),
                      error or "the deploy failed (see its log)")
        return outcome(Status.FAILED, reason=reason, gate=gate)
    if last is not None and last.get("result") == "closed":
        return outcome(Status.MAINTAINED, reason=str(last.get("reason") or ""), gate=gate)
    return outcome(Status.CONVERGED)


def roll(plan: RollPlan, runner: Runner, max_failures: int = 1,
         on_event: Callable[[str], None] = lambda _: None,
         on_line: Callable[[str], None] = lambda _: None, *,
         order: Sequence[str]) -> RolloutResult:
    """Converge the plan's batches (outcomes in ``order``); stop at ``max_failures`` bad hosts."""
    out = {n: HostOutcome(n, Status.SKIPPED, reason=why) for n, why in plan.skipped.items()}
    done = run_batches(plan.batches, runner, None, classify, out, max_failures, order,
                       time.monotonic(), canary=False, first=1, label=plan.label,
                       on_event=on_event, on_line=on_line)
    if not done.reached and not done.stopped:
        done.stopped = "reached no host: every host was skipped (unreachable or busy)"
    return done


def roll_record(o: HostOutcome) -> dict[str, Any]:
    """One host's outcome in ``rigfleet roll --json``."""
    return {"host": o.host, "result": str(o.status), "batch": o.batch, "serving": o.serving,
            "gate": o.gate or None, "reason": o.reason or None, "seconds": round(o.seconds, 1)}
