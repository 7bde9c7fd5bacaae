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

The decisions (``plan_batches``, ``classify``, ``roll``) are pure given a ``Roller``; unit tests
drive them with a fake one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from rigfleet.bump.rollout import DeployResult, host_errors
from rigfleet.fleetview import probe_or_why
from rigfleet.hostprobe import HostProbe

# How many serving hosts one pyinfra run may disturb at once (roles.maintenance reads it).
BATCH_ENV = "RIGFLEET_MAINTENANCE_BATCH"


class RollStatus(StrEnum):
    CONVERGED = "converged"  # the run changed nothing that disturbs serving
    MAINTAINED = "maintained"  # a window closed: recreated, gate passed
    FAILED = "failed"
    LOST = "lost"  # unreachable after its run started: state unknown
    SKIPPED = "skipped"  # unreachable or busy before its batch
    NOT_ATTEMPTED = "not attempted"


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


@dataclass(frozen=True)
class RollHost:
    """One host's outcome."""

    host: str
    status: RollStatus
    batch: int | None = None
    serving: str | None = None  # the route its front ends on
    gate: str = ""
    reason: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "result": str(self.status), "batch": self.batch,
                "serving": self.serving, "gate": self.gate or None,
                "reason": self.reason or None, "seconds": round(self.seconds, 1)}


@dataclass
class RollResult:
    hosts: dict[str, RollHost]  # inventory order
    stopped: str | None = None
    seconds: float = 0.0

    @property
    def reached(self) -> bool:
        """Whether any host got its run (a roll that skipped every host did nothing)."""
        return any(h.status is not RollStatus.SKIPPED for h in self.hosts.values())

    @property
    def ok(self) -> bool:
        bad = (RollStatus.FAILED, RollStatus.LOST, RollStatus.NOT_ATTEMPTED)
        return self.reached and not any(h.status in bad for h in self.hosts.values())


class Roller(Protocol):
    """The outside world of a roll (``PyinfraRoller``; tests use a fake)."""

    def probe(self, host: str) -> HostProbe: ...

    def deploy(self, hosts: Sequence[str], batch: int | str,
               on_line: Callable[[str], None]) -> DeployResult: ...


# --- decisions (pure) ------------------------------------------------------------------------


def plan_batches(order: Sequence[str], probes: Mapping[str, HostProbe | str],
                 batch: int) -> RollPlan:
    """Bare hosts first, together; then the serving ones, ``batch`` at a time, in order.

    + order: the inventory's host names, in order
    + probes: each host's probe, or why it could not be probed (it is skipped)
    """
    if batch < 1:
        raise ValueError(f"--batch: {batch} is not a number of hosts; allowed: 1 or more")
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
    batches = ([tuple(bare)] if bare else []) + [tuple(serving[i:i + batch])
                                                for i in range(0, len(serving), batch)]
    return RollPlan(tuple(batches), frozenset(serving), skipped)


def _new_lines(before: HostProbe | None, after: HostProbe) -> list[dict[str, Any]]:
    new = after.ledger_count - (before.ledger_count if before else 0)
    return list(after.ledger_tail[-new:]) if new > 0 else []


def classify(name: str, deploy: DeployResult, before: HostProbe | None,
             after: HostProbe | str, batch: int) -> RollHost:
    """One host's outcome after its batch (from its probe and pyinfra's result)."""
    errors = host_errors(deploy.log, name)
    if isinstance(after, str):
        detail = f"unreachable after its run started ({after})"
        return RollHost(name, RollStatus.LOST, batch, None, "",
                        detail + (f"; pyinfra: {errors[-1]}" if errors else ""),
                        deploy.seconds)
    lines = _new_lines(before, after)
    windows = [x for x in lines if x.get("event") == "maintenance"
               and x.get("result") in ("closed", "failed")]
    last = windows[-1] if windows else None
    gate = str(((last or {}).get("gate") or {}).get("result") or "")
    if deploy.failed(name):
        reason = next((str(x["reason"]) for x in reversed(lines) if x.get("reason")), "")
        if not reason:
            reason = errors[-1] if errors else "the deploy failed (see its log)"
        return RollHost(name, RollStatus.FAILED, batch, after.route, gate, reason,
                        deploy.seconds)
    if last is not None and last.get("result") == "closed":
        return RollHost(name, RollStatus.MAINTAINED, batch, after.route, gate,
                        str(last.get("reason") or ""), deploy.seconds)
    return RollHost(name, RollStatus.CONVERGED, batch, after.route, "", "", deploy.seconds)


def roll(plan: RollPlan, roller: Roller, max_failures: int = 1,
         on_event: Callable[[str], None] = lambda _: None,
         on_line: Callable[[str], None] = lambda _: None,
         order: Sequence[str] = ()) -> RollResult:
    """Run the plan's batches; stop once ``max_failures`` hosts failed or were lost."""
    started = time.monotonic()
    out: dict[str, RollHost] = {n: RollHost(n, RollStatus.SKIPPED, None, None, "", why)
                                for n, why in plan.skipped.items()}
    failures, stopped = 0, None
    for i, hosts in enumerate(plan.batches):
        label = plan.label(i)
        if stopped:
            for h in hosts:
                out[h] = RollHost(h, RollStatus.NOT_ATTEMPTED, i + 1, reason=stopped)
            continue
        before: dict[str, HostProbe | str] = {}
        live = []
        for h in hosts:
            before[h] = probe_or_why(roller.probe, h)
            p = before[h]
            if isinstance(p, str) or p.busy:
                why = f"unreachable before its batch ({p})" if isinstance(p, str) else \
                    f"busy: {p.busy}"
                out[h] = RollHost(h, RollStatus.SKIPPED, i + 1, reason=why)
                on_event(f"{label}: {h} skipped ({why})")
            else:
                live.append(h)
        if not live:
            continue
        on_event(f"{label}: converging {', '.join(live)}")
        result = roller.deploy(live, i + 1, on_line)
        for h in live:
            b = before[h]
            o = classify(h, result, b if isinstance(b, HostProbe) else None,
                         probe_or_why(roller.probe, h), i + 1)
            out[h] = o
            on_event(f"{label}: {h} {o.status}" + (f" (gate {o.gate})" if o.gate else "")
                     + (f": {o.reason}" if o.reason else ""))
            if o.status in (RollStatus.FAILED, RollStatus.LOST):
                failures += 1
        if failures >= max_failures:
            stopped = f"{failures} host(s) failed (--max-failures {max_failures})"
    names = list(order) or [h for b in plan.batches for h in b] + list(plan.skipped)
    done = RollResult({n: out[n] for n in names if n in out}, stopped,
                      time.monotonic() - started)
    if not done.reached and not stopped:
        done.stopped = "reached no host: every host was skipped (unreachable or busy)"
    return done


# --- the real roller ---------------------------------------------------------------------------


class PyinfraRoller:
    """``Roller`` over ``rigfleet.bump.rollout.PyinfraRunner`` (pyinfra per batch, the host
    probe over SSH); the runs get ``RIGFLEET_MAINTENANCE_BATCH=<batch>``."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def probe(self, host: str) -> HostProbe:
        return self.runner.facts(host)

    def deploy(self, hosts: Sequence[str], batch: int | str,
               on_line: Callable[[str], None]) -> DeployResult:
        return self.runner.deploy(hosts, None, batch, on_line)
