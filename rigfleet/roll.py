"""Roll the converge over the fleet so that serving hosts are disturbed one at a time.

A converge may disturb a serving host (a driver change installs and reboots, a daemon.json
change restarts Docker): the deploy then runs those steps in the host's maintenance window
(``roles.maintenance``: 503 + Retry-After from the first such step, the stack recreated and
gated at its end), and a plain ``pyinfra`` run lets only one serving host do so at a time.
``rigfleet roll`` runs the converge so that every host gets its turn: one pyinfra run per
batch, as the bump does (``rigfleet.bump.rollout.PyinfraRunner``)::

    rigfleet roll --inventory inventory/home.py              # serving hosts one at a time
    rigfleet roll --inventory inventory/home.py --batch 2    # two at a time
    rigfleet roll --inventory inventory/home.py --dry        # the batches, nothing runs

Batches, in the inventory's order: first every bare host together (nothing serves there:
nothing to protect, as fast as a plain run), then the serving hosts ``--batch`` at a time;
each run gets ``RIGFLEET_MAINTENANCE_BATCH=<batch>``. A host unreachable or busy (a live
holder of its lock) when its batch starts is skipped. After each batch every host of it is
probed: ``converged`` (nothing was disturbed), ``maintained`` (its window closed: the stack
was recreated and passed the gate), ``failed`` (the deploy failed it; the reason from its
ledger or pyinfra) or ``lost``. The roll stops once ``--max-failures`` hosts failed (default
1: a broken driver never reaches the next host); the rest is ``not attempted``.

The decisions (``plan_batches``, ``classify``) are pure; the batches run through the rollout
engine (``rigfleet.bump.rollout.run_batches``, the bump's, without a canary); unit tests drive
it with a fake runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rigfleet.batches import batch_size, in_batches
from rigfleet.bump.rollout import (
    DeployResult,
    HostOutcome,
    RolloutResult,
    Runner,
    Status,
    host_errors,
    run_batches,
)
from rigfleet.hostprobe import HostProbe


@dataclass(frozen=True)
class RollPlan:
    """The batches (host names, inventory order), and the hosts left out (why)."""

    batches: tuple[tuple[str, ...], ...]
    serving: frozenset[str]
    skipped: Mapping[str, str] = field(default_factory=dict)

    def label(self, i: int) -> str:
        hosts = self.batches[i]
        if not any(h in self.serving for h in hosts):
            return f"batch {i + 1} (bare)"
        return f"batch {i + 1}"


# --- decisions (pure) ------------------------------------------------------------------------


def plan_batches(order: Sequence[str], probes: Mapping[str, HostProbe | str],
                 batch: int) -> RollPlan:
    """Bare hosts first, together; then the serving ones, ``batch`` at a time, in order.

    + order: the inventory's host names, in order
    + probes: each host's probe, or why it could not be probed (it is skipped)
    """
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


def _new_lines(before: HostProbe | None, after: HostProbe) -> list[dict[str, Any]]:
    new = after.ledger_count - (before.ledger_count if before else 0)
    return list(after.ledger_tail[-new:]) if new > 0 else []


def classify(name: str, deploy: DeployResult, before: HostProbe | None,
             after: HostProbe | str, batch: int) -> HostOutcome:
    """One host's outcome after its batch (from its probe and pyinfra's result)."""
    errors = host_errors(deploy.log, name)
    if isinstance(after, str):
        detail = f"unreachable after its run started ({after})"
        return HostOutcome(name, Status.LOST, batch, reason=detail + (
            f"; pyinfra: {errors[-1]}" if errors else ""), seconds=deploy.seconds)
    lines = _new_lines(before, after)
    windows = [x for x in lines if x.get("event") == "maintenance"
               and x.get("result") in ("closed", "failed")]
    last = windows[-1] if windows else None
    gate = str(((last or {}).get("gate") or {}).get("result") or "")
    if deploy.failed(name):
        reason = next((str(x["reason"]) for x in reversed(lines) if x.get("reason")), "")
        if not reason:
            reason = errors[-1] if errors else "the deploy failed (see its log)"
        return HostOutcome(name, Status.FAILED, batch, reason=reason, gate=gate,
                           seconds=deploy.seconds, serving=after.route)
    if last is not None and last.get("result") == "closed":
        return HostOutcome(name, Status.MAINTAINED, batch, reason=str(last.get("reason") or ""),
                           gate=gate, seconds=deploy.seconds, serving=after.route)
    return HostOutcome(name, Status.CONVERGED, batch, seconds=deploy.seconds,
                       serving=after.route)


def roll(plan: RollPlan, runner: Runner, max_failures: int = 1,
         on_event: Callable[[str], None] = lambda _: None,
         on_line: Callable[[str], None] = lambda _: None,
         order: Sequence[str] = ()) -> RolloutResult:
    """Run the plan's batches (the inventory's pins, batches numbered from 1); stop once
    ``max_failures`` hosts failed or were lost."""
    started = time.monotonic()
    out = {n: HostOutcome(n, Status.SKIPPED, reason=why) for n, why in plan.skipped.items()}
    stopped = run_batches(plan.batches, runner, None, classify, out, max_failures,
                          canary=False, first=1, label=lambda n: plan.label(n - 1),
                          on_event=on_event, on_line=on_line)
    names = list(order) or [h for b in plan.batches for h in b] + list(plan.skipped)
    done = RolloutResult({n: out[n] for n in names if n in out}, stopped,
                         time.monotonic() - started)
    if not done.reached and not stopped:
        done.stopped = "reached no host: every host was skipped (unreachable or busy)"
    return done


def roll_record(o: HostOutcome) -> dict[str, Any]:
    """One host's outcome in ``rigfleet roll --json``."""
    return {"host": o.host, "result": str(o.status), "batch": o.batch, "serving": o.serving,
            "gate": o.gate or None, "reason": o.reason or None, "seconds": round(o.seconds, 1)}
