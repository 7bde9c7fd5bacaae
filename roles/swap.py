"""Swap: the host ends serving the stack the inventory asks for, verified, or keeps the old one.

The work happens on the host, in the host-side tool (``rigfleet/hostside/``, uploaded as one
zipapp): a transaction that holds the host lock, opens a 503 window on the front, stops the
old stack, waits until the cards' memory is released, starts the new stack, waits for it
(failing fast, naming known boot failures), runs the verify-stress gate, and promotes it or
rolls back to exactly what served before. It runs as a transient systemd unit, so a dropped
SSH connection does not stop it; this role starts it and follows its journal, printing
progress, copies the gate report to ``reports/<host>/``, and fails the host with the
transaction's reason when it did not promote.

What runs when (``rigfleet.swapplan.decide`` on the host's probe):

- converged (the desired stack is active, running, routed): nothing; ``--dry`` lists nothing;
- desired differs from active (another stack, or new pins/config of the same one), or nothing
  is active yet: the gated transaction (``--dry`` lists it);
- the active stack is down or the front does not route to it: ``ensure`` (recreate it from
  its verified snapshot, no gate);
- a stack serves that no transaction recorded (a host converged before swaps existed):
  ``adopt`` (record it; nothing restarts).

``rigfleet-stack.service`` recreates the active stack at boot (see its unit file);
``rigfleet-supervise.service`` recreates it when its engine dies, with a backoff and a limit
(``rigfleet.hostside.supervise``; stack containers are never restarted in place). The
supervisor is restarted when the host tool or its unit changed (that never touches the stack).

Example::

    swap(ctx)
"""

from __future__ import annotations

import io
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from pyinfra import host
from pyinfra.api import FileUploadCommand, FunctionCommand, deploy, operation
from pyinfra.api.state import State
from pyinfra.operations import files, systemd

from rigfleet.balancer.plan import SwapBatch, converge_batch
from rigfleet.batches import admit
from rigfleet.commands import hosttool
from rigfleet.facts import read_fact, read_paths
from rigfleet.hostbundle import build_bundle
from rigfleet.hostside.layout import HOST
from rigfleet.hostside.plan import Plan
from rigfleet.hostside.records import describe, live_holder
from rigfleet.hostside.steps import LOCK_WAIT_S
from rigfleet.hostside.supervise import Policy
from rigfleet.resources import project_file
from rigfleet.swapfacts import SwapProbe, UnitActive
from rigfleet.swapplan import build_plan, decide
from roles import maintenance
from roles.docker import reload_detaches_gpus
from roles.follow import follow, reports_root
from roles.maintenance import disturbing
from roles.ops import executing, fail, on_change, run_on_host
from roles.preflight import HostContext

UNIT_TEMPLATE = str(project_file("files/rigfleet-stack.service.j2"))
UNIT_PATH = f"/etc/systemd/system/{hosttool.STACK_UNIT}"
SUPERVISE_TEMPLATE = str(project_file("files/rigfleet-supervise.service.j2"))
SUPERVISE_PATH = f"/etc/systemd/system/{hosttool.SUPERVISE_UNIT}"
# Per run (State): the converge's cap, worked out once from the whole inventory
# (``converge_batch`` validates every GPU host's data), and the hosts swapping now.
_BATCH: weakref.WeakKeyDictionary[State, SwapBatch] = weakref.WeakKeyDictionary()
_SLOTS: weakref.WeakKeyDictionary[State, _Slots] = weakref.WeakKeyDictionary()
SLOT_NOTE_S = 30.0


@dataclass
class _Slots:
    """The run's hosts swapping now; ``admit`` (the rollout's batch policy) lets one more in.
    pyinfra's CLI runs hosts as gevent greenlets (threading is patched to match)."""

    moving: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)


def start_and_follow(swap_id: str, timeout_s: float, reports: str, box: dict[str, str],
                     batch: SwapBatch | None) -> None:
    """At execution time: take a swap slot when ``batch`` caps the run (waiting, with a line
    every 30 s, while as many hosts swap elsewhere), start the transaction, follow it, and
    give the slot back however it ended (a failed start included)."""
    slots, name = None, host.name
    if batch is not None and batch.size:
        slots = _SLOTS.setdefault(host.state, _Slots())
        t0 = time.monotonic()
        with slots.changed:
            while not admit([name], batch.size, slots.moving):
                if not slots.changed.wait(SLOT_NOTE_S):
                    host.log(f"swap waits for a slot: {batch.why} ({', '.join(slots.moving)} "
                             f"swap now; {time.monotonic() - t0:.0f}s so far)")
            slots.moving.append(name)
        host.log(f"swap slot taken ({batch.why})")
    try:
        ok, _, err = run_on_host(hosttool.start_swap(swap_id))
        if not ok:
            box["error"] = (f"{host.name}: the swap transaction did not start: "
                            f"{' '.join(err[-3:]) or 'no output'}")
            return
        follow(swap_id, timeout_s, reports, box)
    finally:
        if slots is not None:
            with slots.changed:
                slots.moving.remove(name)
                slots.changed.notify_all()


@operation(is_idempotent=False)
def serve_desired(plan: Plan, follow_timeout_s: float, reports: str,
                  batch: SwapBatch | None = None):
    """Run what ``decide`` says (nothing, the gated transaction, ensure or adopt).

    + plan: the transaction's plan (``rigfleet.swapplan.build_plan``)
    + follow_timeout_s: how long to follow the transaction (it continues on the host)
    + reports: the control-side directory for gate reports (``<reports>/<host>/``)
    + batch: the run's cap on serving hosts swapping at once (``converge_batch``)
    """
    probe = read_fact(SwapProbe)
    decision = decide(probe, plan.desired)
    if decision.kind == "none":
        host.noop(decision.reason)
        return
    holder = live_holder(probe.get("lock"))
    if holder is not None and executing():
        yield from fail(f"{host.name}: {describe(holder)}; refusing to change this host now")
        return
    plan = replace(plan, why=f"{decision.kind} {decision.change or decision.reason}")
    yield f"install -d -m 0755 {hosttool.swap_dir(plan.id)}"
    yield FileUploadCommand(io.BytesIO(plan.dumps().encode()), hosttool.plan_path(plan.id))
    if decision.kind == "adopt":
        yield hosttool.adopt(plan.id)
    elif decision.kind == "ensure":
        yield hosttool.ensure(plan.front_port, plan.by)
    else:
        box: dict[str, str] = {}
        # A serving host leaving rotation (swap, update) takes one of the run's slots; a host
        # that serves nothing yet (activate) is not in rotation, so it needs none.
        leaves = decision.kind in ("swap", "update")
        yield FunctionCommand(start_and_follow, (plan.id, follow_timeout_s, reports, box,
                                                 batch if leaves else None), {})
        if box.get("error"):  # the generator resumes after the follow ran
            yield hosttool.report_failure(box["error"])


@operation()
def unit_started(unit: str):
    """``systemctl start`` a unit that is not active (a oneshot-like unit that stays active
    after its start command exited: pyinfra's ``running`` would start it on every run).

    + unit: the unit's name
    """
    if read_fact(UnitActive, unit=unit):
        host.noop(f"{unit} is active")
        return
    yield f"systemctl start {unit}"


def supervise_policy(ctx: HostContext) -> Policy:
    """The supervisor's policy for this host: the defaults of ``rigfleet.hostside.supervise``
    with this host's time limits (``ready_timeout_s``, ``vram_timeout_s``, ``retry_after_s``)
    and its backoff, limit and window (``supervise_backoff_s``, ``supervise_limit``,
    ``supervise_window_s``)."""
    swap = ctx.want.settings.swap
    return replace(Policy(), ready_timeout_s=swap.ready_timeout_s,
                   vram_timeout_s=swap.vram_timeout_s, retry_after_s=swap.retry_after_s,
                   backoff_s=swap.supervise_backoff_s, limit=swap.supervise_limit,
                   window_s=swap.supervise_window_s)


def unit_file(name: str, src: str, dest: str, ctx: HostContext, **variables: Any) -> Any:
    """One of rigfleet's systemd units from its template (root, 0644), with the variables
    every unit has (the front's port, the host tool, the active snapshot's directory)."""
    return files.template(name=name, src=src, dest=dest, user="root", group="root",
                          mode="0644", front_port=ctx.want.settings.front_port,
                          bundle=str(HOST.bundle), active_dir=str(HOST.active_dir),
                          **variables)


@deploy("Swap")
def swap(ctx: HostContext) -> None:
    """Install the host-side tool and the units, serve the desired stack, then (re)start the
    supervisor."""
    read_paths([hosttool.PYZ, UNIT_PATH, SUPERVISE_PATH])
    bundle = files.put(
        name="Host-side tool (rigfleet-host.pyz: swap, lock, ledger, front, gate)",
        src=io.BytesIO(build_bundle()),
        dest=hosttool.PYZ,
        user="root",
        group="root",
        mode="0755",
    )
    unit = unit_file(f"{hosttool.STACK_UNIT} (recreates the active stack at boot)",
                     UNIT_TEMPLATE, UNIT_PATH, ctx, lock_wait_s=f"{LOCK_WAIT_S:g}")
    policy = supervise_policy(ctx)
    supervise_unit = unit_file(
        f"{hosttool.SUPERVISE_UNIT} (recreates the active stack when its engine dies)",
        SUPERVISE_TEMPLATE, SUPERVISE_PATH, ctx, stack_unit=hosttool.STACK_UNIT,
        flags=" ".join(policy.argv()), backoff=", ".join(f"{s:g}" for s in policy.backoff_s),
        limit=policy.limit, window_s=f"{policy.window_s:g}")
    # A daemon-reload takes the GPUs of a container whose cgroup systemd owns
    # (NVIDIA/nvidia-container-toolkit#48): in a maintenance window while that could happen.
    detaches = reload_detaches_gpus(ctx)
    reload_step = "systemd daemon-reload (the serving container could lose its GPUs)"
    maintenance.plan_step(ctx, reload_step, detaches and (unit.will_change
                                                          or supervise_unit.will_change))
    disturbing(
        name="systemd daemon-reload (a rigfleet unit changed)",
        ctx=ctx,
        commands=["systemctl daemon-reload"],
        what=reload_step,
        gates=[unit, supervise_unit],
        reason="units unchanged",
        window=detaches,
    )
    if detaches:
        maintenance.close_pending(ctx)
    # Enabled only (pyinfra's ``running`` defaults to True), both started after the swap:
    # started here, the stack unit's ``ensure`` would hold the host lock just as the swap below
    # probes it ("locked by rigfleet-stack.service") on a host whose unit is not active (a
    # failed first activation), and a supervisor someone stopped would find the container they
    # replaced by hand, take the lock to recreate it, and refuse the swap that repairs it.
    for name, what in ((hosttool.STACK_UNIT, "at boot"),
                       (hosttool.SUPERVISE_UNIT, "with the stack unit")):
        systemd.service(name=f"{name} enabled {what}", service=name, enabled=True,
                        running=None)
    plan = build_plan(ctx.want, ctx.by, why=f"serve {ctx.want.stack}")
    # Behind a balancer, at most ``batch.size`` serving hosts swap at once, so that every
    # stack with two or more hosts keeps one serving: the fleet endpoint never goes dark.
    if host.state not in _BATCH:
        _BATCH[host.state] = converge_batch(host.inventory)
    batch = _BATCH[host.state]
    serve_desired(
        name=f"Serve {plan.desired.route_id} (gated swap; rollback on failure"
             + (f"; {batch.why}" if batch.size else "") + ")",
        plan=plan,
        batch=batch,
        # The drain comes first: as long as the longest drain timeout it may wait.
        follow_timeout_s=ctx.want.settings.swap.follow_timeout_s + max([plan.drain_timeout_s,
                                                          *plan.drain_timeouts.values()]),
        reports=str(reports_root()),
    )
    # Active (exited) from now on, so its stop command runs at shutdown; starting it when the
    # stack is up and routed changes nothing (``ensure`` finds it so).
    unit_started(name=f"{hosttool.STACK_UNIT} active", unit=hosttool.STACK_UNIT)
    # After the swap (it held the host lock: the supervisor would only have waited): new code
    # or flags take effect now; restarting the supervisor never touches the stack.
    on_change(
        name=f"{hosttool.SUPERVISE_UNIT} restarted (the host tool or its unit changed)",
        commands=[f"systemctl restart {hosttool.SUPERVISE_UNIT}"],
        gates=[bundle, supervise_unit],
        reason="host tool and unit unchanged",
    )
    unit_started(name=f"{hosttool.SUPERVISE_UNIT} active", unit=hosttool.SUPERVISE_UNIT)
