"""Maintenance windows, the deploy's side: a step that disturbs a serving host (the driver and
its reboot, a Docker restart, a ``daemon-reload``) runs inside one, one serving host at a time
(docs/maintenance.md). The role that owns such a step wraps it::

    op = apt_packages(name="Install NVIDIA driver ...", packages=[...],
                      before=lambda inputs: maintenance.enter(ctx, step, inputs, inputs[:1]))
    maintenance.plan_step(ctx, step, op)    # prepare time
    maintenance.maintenance(ctx)            # the role after the last of them: the close
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host
from pyinfra.api import FunctionCommand, State, deploy, operation
from pyinfra.api.host import Host
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host

from rigfleet.batches import BATCH_ENV, admit, batch_size
from rigfleet.commands import hosttool
from rigfleet.facts import SwapProbe, read_fact
from rigfleet.hostbundle import build_bundle
from rigfleet.hostside.layout import BUNDLE_PATH, HOST, SUPERVISE_UNIT
from rigfleet.hostside.plan import Plan
from rigfleet.swapplan import DEPLOY_ID, build_plan
from roles.follow import failure_tail, follow, reports_root
from roles.ops import executing, run_on_host
from roles.preflight import HostContext

# A window is held by the deploy's SSH session (a deploy that dies leaves it abandoned, and the
# host's supervisor closes it); across a reboot, for the reboot wait plus this margin.
REBOOT_GRACE_MARGIN_S = 300.0
# How long the readiness check before a window waits for apt's and dpkg's locks (seconds).
LOCK_WAIT_ENV = "RIGFLEET_APT_LOCK_WAIT_S"
LOCK_WAIT_S = 120
# Window states on the host that the next deploy closes (recreate + gate).
UNFINISHED = ("abandoned", "failed", "damaged")


def lock_wait_s() -> int:
    raw = os.environ.get(LOCK_WAIT_ENV, str(LOCK_WAIT_S)).strip()
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{LOCK_WAIT_ENV}: {raw!r} is not a number of seconds; allowed: an "
                         "integer >= 1 (how long to wait for apt's and dpkg's locks)")
    return int(raw)


def batch_limit() -> int:
    """How many serving hosts one run may disturb at once (``RIGFLEET_MAINTENANCE_BATCH``)."""
    return batch_size(os.environ.get(BATCH_ENV, "1"), BATCH_ENV, "an integer >= 1 (the "
                      "serving hosts one run may disturb at once)")


@dataclass
class _Book:
    """One run's maintenance bookkeeping (per pyinfra ``State``), by host name."""

    steps: dict[str, list[str]] = field(default_factory=dict)  # disturbing steps (preparing)
    serving: dict[str, str] = field(default_factory=dict)  # the route it serves
    covered: dict[str, int] = field(default_factory=dict)  # steps a close already covers
    decided: dict[str, str | None] = field(default_factory=dict)  # None: admitted; else why not
    open_now: set[str] = field(default_factory=set)  # windows this run opened, not closed yet
    shipped: set[str] = field(default_factory=set)  # got the window's plan and the host tool
    closes: dict[str, int] = field(default_factory=dict)  # closes started (one journal each)
    plans: dict[str, Plan] = field(default_factory=dict)
    old: set[str] = field(default_factory=set)  # an earlier run's window a close covers
    apt: set[str] = field(default_factory=set)  # a step uses apt: ``ready`` waits for its locks
    ready: set[str] = field(default_factory=set)  # readiness checked this run
    follow_s: dict[str, float] = field(default_factory=dict)


_BOOKS: weakref.WeakKeyDictionary[State, _Book] = weakref.WeakKeyDictionary()


def book() -> _Book:
    if (found := _BOOKS.get(host.state)) is None:
        found = _BOOKS[host.state] = _Book()
        host.state.add_callback_handler(_CloseOnFailure())
    return found


class _CloseOnFailure(BaseStateCallback):
    """A deploy that fails inside a host's window closes it at once (recreate + gate)."""

    @staticmethod
    def operation_host_error(state: State, host: Host, op_hash: Any, *_: Any) -> None:
        b = _BOOKS.get(state)
        if b is None or host.name not in b.open_now:
            return
        b.open_now.discard(host.name)
        names = ", ".join(state.get_op_meta(op_hash).names) or "an operation"
        try:
            _close_now(state, host, b, op_hash, f"the deploy failed inside it at: {names}")
        except Exception as e:  # the host's own supervisor closes it once the deploy is gone
            host.log_styled(f"maintenance: could not close the window now ({e}); the host "
                            "closes it when this deploy ends", fg="red")


def _close_now(state: State, host: Host, b: _Book, op_hash: Any, cause: str) -> None:
    plan = b.plans[host.name]
    n = b.closes[host.name] = b.closes.get(host.name, 0) + 1
    journal = f"close-{DEPLOY_ID}-{n}"
    host.log_styled(f"maintenance: {cause}; closing the window now", fg="yellow")
    box: dict[str, str] = {}
    failed = state.get_op_data_for_host(host, op_hash)
    with ctx_host.use(host):  # with the failed operation's connector arguments (sudo)
        host.current_op_global_arguments = failed.global_arguments
        try:
            ok, _, err = run_on_host(hosttool.start_close(plan, journal, cause=cause))
            if not ok:
                raise RuntimeError(" ".join(err[-2:]) or "systemd-run failed")
            follow(journal, b.follow_s.get(host.name, 1800.0), str(reports_root()), box,
                   describe=close_message, label="maintenance", unit=hosttool.close_unit(plan.id))
        finally:
            host.current_op_global_arguments = None
    host.log_styled(f"maintenance: {box.get('error') or 'window closed: the stack serves'}",
                    fg="red" if box.get("error") else "green")


def window_plan(ctx: HostContext) -> Plan:
    return build_plan(ctx.want, ctx.by, why="maintenance", deploy_id=f"maint-{DEPLOY_ID}")


def serves(ctx: HostContext) -> str | None:
    """(Preparing) the route this host serves (noted as serving); None on a bare host."""
    active = read_fact(SwapProbe).get("active")
    ref = active.get("ref") if isinstance(active, dict) else None
    if not isinstance(ref, dict) or not ref.get("stack"):
        return None
    b = book()
    route = b.serving[ctx.want.name] = f"{ref.get('stack')}/{ref.get('config_hash')}"
    b.plans.setdefault(ctx.want.name, window_plan(ctx))
    b.follow_s[ctx.want.name] = ctx.want.settings.swap.follow_timeout_s
    return route


def plan_step(ctx: HostContext, what: str, will: OperationMeta | bool, apt: bool = False) -> None:
    """(Preparing) note: ``what`` (``apt``: it uses apt) disturbs this serving host if ``will``."""
    if not (will if isinstance(will, bool) else will.will_change) or not serves(ctx):
        return
    lock_wait_s()  # a bad value stops the run while preparing, before anything changes
    b = book()
    b.steps.setdefault(ctx.want.name, []).append(what)
    if apt:
        b.apt.add(ctx.want.name)


def _decide_all(state: State) -> None:
    """Admit serving hosts that need a window, in inventory order, up to the batch limit."""
    b = book()
    limit = batch_limit()
    failed = {h.name for h in state.failed_hosts}
    order = [h.name for h in state.inventory if h.name in b.steps and h.name not in b.decided]
    admitted = [h for h, d in b.decided.items() if d is None]
    # the inventory as the person typed it (pyinfra's first argument)
    typed = len(sys.argv) > 1 and os.path.basename(sys.argv[0]).startswith("pyinfra")
    inventory = sys.argv[1] if typed else "<inventory>"
    admitted += admit([n for n in order if n not in failed], limit, admitted)
    b.decided.update(dict.fromkeys(admitted))
    for name in [n for n in order if n not in b.decided]:
        others = ", ".join(admitted) or "other hosts"
        b.decided[name] = (
            f"{name}: serves {b.serving.get(name)} and needs {'; '.join(b.steps[name])}, "
            f"which disturb(s) its serving path; this run already disturbs {others} (at most "
            f"{limit} serving host(s) at a time; {BATCH_ENV}={limit}). Nothing was disturbed "
            f"here. Roll the fleet one host at a time: rigfleet roll --inventory "
            f"{inventory} (or run this deploy with --limit {name})")


def enter(ctx: HostContext, what: str, inputs: Sequence[str] = (), otherwise: Sequence[str] = (),
          reboot_grace_s: float | None = None) -> Iterator[Any]:
    """(Executing, before a disturbing step) open this host's window once (plan, host tool,
    ``ready``, ``inputs``) or add the step to it; preparing, or on a bare host: ``otherwise``."""
    name, b = ctx.want.name, book()
    if not executing() or (name not in b.serving and not serves(ctx)):
        yield from otherwise
        return
    b.steps.setdefault(name, [what])  # a step the prepare phase did not foresee: count it now
    if name not in b.decided:
        _decide_all(host.state)
    if (why := b.decided.get(name)) is not None:
        yield hosttool.report_failure(why)  # fails this host, the message on its stderr
        return
    plan = b.plans[name]
    if name not in b.shipped:  # the window's plan, and the host tool when not this deploy's
        data = build_bundle()  # built once (cached)
        if read_fact(SwapProbe).get("bundle") != hashlib.sha256(data).hexdigest():
            # Renamed into place: the running supervisor keeps reading its own zip (lazily).
            yield from hosttool.upload_atomic(data, BUNDLE_PATH, mode="0755")
            yield f"systemctl try-restart {SUPERVISE_UNIT}"
        yield from _plan_upload(plan)
        b.shipped.add(name)
    if name not in b.ready or inputs:
        b.ready.add(name)
        yield hosttool.maintenance_ready(name in b.apt or bool(inputs), lock_wait_s())
    yield from inputs
    b.open_now.add(name)
    yield hosttool.maintenance_open(plan.id, what, reboot_grace_s)


def back_from_reboot(ctx: HostContext) -> Iterator[Any]:
    """(After a window step's reboot) the window held by the deploy's new SSH session."""
    if executing() and ctx.want.name in book().open_now:
        yield hosttool.maintenance_hold(book().plans[ctx.want.name].id)


def _plan_upload(plan: Plan) -> Iterator[Any]:
    yield f"install -d -m 0755 {shlex.quote(str(HOST.maintenance_dir))}"
    yield from hosttool.upload_atomic(plan.dumps().encode(), str(HOST.window_plan(plan.id)))


def close_message(name: str, result: dict[str, Any], reports: list[Any]) -> str:
    """One message for a close that did not end serving (the deploy fails the host with it)."""
    reason = str(result.get("reason") or "no reason recorded").rstrip(".")
    if result.get("result") == "locked":
        return f"{name}: the maintenance window could not be closed: {reason}"
    return (f"{name}: after maintenance the host is not serving: {reason}. The front answers "
            f"503 with Retry-After.{failure_tail(result, reports, 'The stack')} Fix the cause "
            "and run the deploy again (it closes the window again: recreate + gate), or on the "
            f"host: {hosttool.tool('maintenance', 'close')}")


@operation(is_idempotent=False)
def close_window(plan: Plan, pending: int, left: str, follow_timeout_s: float, reports: str):
    """Close this run's window (``pending`` steps) and ``left``, an earlier run's."""
    b = book()
    ours = host.name in b.open_now if executing() else pending > 0
    if not ours and not left:
        host.noop("no maintenance window to close")
        return
    n = b.closes.get(host.name, 0) + 1
    if executing():
        b.closes[host.name] = n
        b.open_now.discard(host.name)
    journal = f"close-{DEPLOY_ID}-{n}"
    if left:  # an earlier run's window: the plan is this run's (gate profile, limits)
        yield from _plan_upload(plan)
    yield hosttool.start_close(plan, journal)
    box: dict[str, str] = {}
    yield FunctionCommand(follow, (journal, follow_timeout_s, reports, box),
                          {"describe": close_message, "label": "maintenance",
                           "unit": hosttool.close_unit(plan.id)})
    if box.get("error"):
        yield hosttool.report_failure(box["error"])


def close_pending(ctx: HostContext) -> None:
    """The close operation for the steps noted so far, and for a window an earlier run left."""
    name, b = ctx.want.name, book()
    pending = len(b.steps.get(name, [])[b.covered.get(name, 0):])
    b.covered[name] = len(b.steps.get(name, []))
    window = {} if name in b.old else read_fact(SwapProbe).get("maintenance")
    m: dict[str, Any] = window if isinstance(window, dict) else {}
    status = str(m.get("status") or "none")
    left = f"{status}: {m.get('why') or 'maintenance window'}" if status in UNFINISHED else ""
    what = [f"{pending} step(s) of this run"] if pending else []
    if left:
        b.old.add(name)
        what.append(f"an earlier window ({left})")
    close_window(name="Close the maintenance window (recreate the verified stack, gate, "
                 "route)" + (f": {'; '.join(what)}" if what else ""),
                 plan=b.plans.setdefault(name, window_plan(ctx)), pending=pending, left=left,
                 follow_timeout_s=ctx.want.settings.swap.follow_timeout_s,
                 reports=str(reports_root()))


maintenance = deploy("Maintenance window")(close_pending)
