"""The host-side tool and its units, then what ``rigfleet.swapplan.decide`` says (docs/swap.md)."""

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
from pyinfra.operations import systemd

from rigfleet.balancer.plan import SwapBatch, converge_batch
from rigfleet.batches import admit
from rigfleet.commands import hosttool
from rigfleet.facts import SwapProbe, UnitActive, read_fact, read_paths
from rigfleet.hostbundle import build_bundle
from rigfleet.hostside.layout import BUNDLE_PATH, HOST, STACK_UNIT, SUPERVISE_UNIT
from rigfleet.hostside.plan import Plan
from rigfleet.hostside.records import describe, live_holder
from rigfleet.hostside.steps import LOCK_WAIT_S
from rigfleet.hostside.supervise import Policy
from rigfleet.resources import project_file
from rigfleet.swapplan import build_plan, decide
from roles import maintenance, weights
from roles.docker import reload_detaches_gpus
from roles.follow import follow, reports_root
from roles.ops import changed, executing, fail, on_change, root_put, root_template, run_on_host
from roles.preflight import HostContext

UNIT_TEMPLATE = str(project_file("files/rigfleet-stack.service.j2"))
UNIT_PATH = f"/etc/systemd/system/{STACK_UNIT}"
SUPERVISE_TEMPLATE = str(project_file("files/rigfleet-supervise.service.j2"))
SUPERVISE_PATH = f"/etc/systemd/system/{SUPERVISE_UNIT}"
# Per run (State): the converge's cap, from the whole inventory, and the hosts swapping now.
_BATCH: weakref.WeakKeyDictionary[State, SwapBatch] = weakref.WeakKeyDictionary()
_SLOTS: weakref.WeakKeyDictionary[State, _Slots] = weakref.WeakKeyDictionary()
SLOT_NOTE_S = 30.0


@dataclass
class _Slots:
    """The run's hosts swapping now (gevent greenlets: pyinfra patches threading to match)."""

    moving: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)


def start_and_follow(plan: Plan, timeout_s: float, reports: str, box: dict[str, str],
                     batch: SwapBatch | None) -> None:
    """At execution time: start the transaction and follow it (in a slot, if capped)."""
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
        ok, _, err = run_on_host(hosttool.start_swap(plan))
        if not ok:
            box["error"] = (f"{host.name}: the swap transaction did not start: "
                            f"{' '.join(err[-3:]) or 'no output'}")
            return
        follow(plan.id, timeout_s, reports, box)
    finally:
        if slots is not None:
            with slots.changed:
                slots.moving.remove(name)
                slots.changed.notify_all()


@operation(is_idempotent=False)
def serve_desired(plan: Plan, follow_timeout_s: float, reports: str,
                  batch: SwapBatch | None = None):
    """Run what ``decide`` says: nothing, the gated transaction, ensure or adopt."""
    probe = read_fact(SwapProbe)
    decision = decide(probe, plan.desired)
    if decision.kind == "none":
        host.noop(decision.reason)
        return
    if executing() and (holder := live_holder(probe.get("lock"))) is not None:
        yield from fail(f"{host.name}: {describe(holder)}; refusing to change this host now")
        return
    plan = replace(plan, why=f"{decision.kind} {decision.change or decision.reason}")
    yield f"install -d -m 0755 {HOST.swap_dir(plan.id)}"
    yield FileUploadCommand(io.BytesIO(plan.dumps().encode()), str(HOST.plan_file(plan.id)))
    if decision.kind == "adopt":
        yield hosttool.adopt(plan.id)
    elif decision.kind == "ensure":
        yield hosttool.ensure(plan.front_port, plan.by)
    else:
        box: dict[str, str] = {}
        # Only a serving host leaving rotation (swap, update) takes one of the run's slots.
        leaves = decision.kind in ("swap", "update")
        yield FunctionCommand(start_and_follow, (plan, follow_timeout_s, reports, box,
                                                 batch if leaves else None), {})
        if box.get("error"):  # the generator resumes after the follow ran
            yield hosttool.report_failure(box["error"])


@operation()
def unit_started(unit: str):
    """``systemctl start`` an inactive unit (``running`` would start a oneshot each run)."""
    if read_fact(UnitActive, unit=unit):
        host.noop(f"{unit} is active")
        return
    yield f"systemctl start {unit}"


def unit_file(name: str, src: str, dest: str, ctx: HostContext, **variables: Any) -> Any:
    """One of rigfleet's systemd units from its template, with the variables every unit has."""
    return root_template(name=name, src=src, dest=dest, front_port=ctx.want.settings.front_port,
                         bundle=str(HOST.bundle), active_dir=str(HOST.active_dir), **variables)


@deploy("Swap")
def swap(ctx: HostContext) -> None:
    read_paths([BUNDLE_PATH, UNIT_PATH, SUPERVISE_PATH])
    bundle = root_put(name="Host-side tool (rigfleet-host.pyz: swap, lock, ledger, front, gate)",
                      src=io.BytesIO(build_bundle()), dest=BUNDLE_PATH, mode="0755")
    unit = unit_file(f"{STACK_UNIT} (recreates the active stack at boot)",
                     UNIT_TEMPLATE, UNIT_PATH, ctx, lock_wait_s=f"{LOCK_WAIT_S:g}")
    limits = ctx.want.settings.swap
    policy = Policy(ready_timeout_s=limits.ready_timeout_s, vram_timeout_s=limits.vram_timeout_s,
                    retry_after_s=limits.retry_after_s, backoff_s=limits.supervise_backoff_s,
                    limit=limits.supervise_limit, window_s=limits.supervise_window_s)
    supervise_unit = unit_file(
        f"{SUPERVISE_UNIT} (recreates the active stack when its engine dies)",
        SUPERVISE_TEMPLATE, SUPERVISE_PATH, ctx, stack_unit=STACK_UNIT,
        flags=" ".join(policy.argv()), backoff=", ".join(f"{s:g}" for s in policy.backoff_s),
        limit=policy.limit, window_s=f"{policy.window_s:g}")
    # A daemon-reload could take the serving container's GPUs: then in a maintenance window.
    detaches = reload_detaches_gpus(ctx)
    reload_step = "systemd daemon-reload (the serving container could lose its GPUs)"
    maintenance.plan_step(ctx, reload_step, detaches and changed([unit, supervise_unit]))
    on_change(name="systemd daemon-reload (a rigfleet unit changed)",
              commands=["systemctl daemon-reload"], gates=[unit, supervise_unit],
              window=lambda: maintenance.enter(ctx, reload_step) if detaches else (),
              reason="units unchanged")
    if detaches:
        maintenance.close_pending(ctx)
    # Enabled only, started after the swap: started here, either could hold the host lock (the
    # stack unit's ``ensure``, the supervisor's recreation) as the swap probes it, and refuse it.
    for name, what in ((STACK_UNIT, "at boot"), (SUPERVISE_UNIT, "with the stack unit")):
        systemd.service(name=f"{name} enabled {what}", service=name, enabled=True, running=None)
    plan = build_plan(ctx.want, ctx.by, why=f"serve {ctx.want.stack}")
    # Behind a balancer, every stack with two or more hosts keeps one serving.
    if (batch := _BATCH.get(host.state)) is None:
        batch = _BATCH[host.state] = converge_batch(host.inventory)
    serve = serve_desired(
        name=f"Serve {plan.desired.route_id} (gated swap; rollback on failure"
             + (f"; {batch.why}" if batch.size else "") + ")",
        plan=plan, batch=batch, reports=str(reports_root()),
        # The drain comes first: as long as the longest drain timeout it may wait.
        follow_timeout_s=ctx.want.settings.swap.follow_timeout_s
        + max([plan.drain_timeout_s, *plan.drain_timeouts.values()]))
    if serve.will_change:  # what only the replaced stack mounted goes once it is replaced
        weights.prune(ctx, released=True)
    # Active from now on, so its stop command runs at shutdown (``ensure`` changes nothing).
    unit_started(name=f"{STACK_UNIT} active", unit=STACK_UNIT)
    # After the swap (which held the host lock); restarting the supervisor never touches the stack.
    on_change(name=f"{SUPERVISE_UNIT} restarted (the host tool or its unit changed)",
              commands=[f"systemctl restart {SUPERVISE_UNIT}"],
              gates=[bundle, supervise_unit], reason="host tool and unit unchanged")
    unit_started(name=f"{SUPERVISE_UNIT} active", unit=SUPERVISE_UNIT)
