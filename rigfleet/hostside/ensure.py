"""Keep the verified stack serving without a gate: ``Ensure`` (boot, reroute), ``adopt`` (a
stack that served before swaps were recorded) and ``shutdown`` (before the machine goes down).
Around a maintenance window: docs/maintenance.md.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from . import ledger
from .active import ActiveDamaged, load_active, mark_interrupted, request_reset, write_active
from .front import FrontError
from .journal import Journal
from .layout import Layout
from .lock import HostLock, LockHeld
from .maintenance import Maintenance, plan_of, window_status
from .plan import READY_TIMEOUT_S, RETRY_AFTER_S, VRAM_TIMEOUT_S, Active, Plan, compose_hash
from .records import BOOT_CLOCK, now_iso
from .stackctl import docker_time
from .steps import (
    EXIT_FAILED,
    EXIT_LOCKED,
    EXIT_PROMOTED,
    EXIT_RETRY,
    LOCK_WAIT_S,
    Failure,
    FrontControl,
    GateFn,
    Ops,
    Outcome,
    Steps,
    fs_problem,
    known_projects,
)


def take_lock(lock: HostLock, who: str, why: str, wait_s: float, ops: Ops) -> str | None:
    """``lock.acquire``, waiting up to ``wait_s`` for a live holder (not for a window's)."""
    deadline = ops.monotonic() + wait_s
    while True:
        try:
            return lock.acquire(who, why)
        except LockHeld as held:
            if held.holder.get("window") or ops.monotonic() >= deadline:
                raise
        ops.sleep(1.0)


class Ensure(Steps):
    """The active stack serves, in a container created since this boot (at boot, and when
    the front's route is not the active stack). Nothing is gated: the snapshot passed."""

    def __init__(self, lay: Layout, ops: Ops, front: FrontControl, journal: Journal,
                 who: str, why: str, booted_at: float | None = None, gate: GateFn | None = None,
                 lock_wait_s: float = 0.0, leave_held: bool = False) -> None:
        super().__init__(lay, ops, front, journal)
        self.who, self.why, self.gate = who, why, gate
        # The epoch second PID 1 started: the boot, also in a systemd container (the
        # simulated hosts), whose "reboot" keeps the kernel's boot time.
        self.booted_at = time.time() - BOOT_CLOCK.since_boot() if booted_at is None else booted_at
        self.lock = HostLock(lay)
        # The stack unit's start waits for a transaction that holds the host, then leaves it
        # alone (exit 0); the deploy's ensure says "locked" at once (exit 3).
        self.lock_wait_s, self.leave_held = lock_wait_s, leave_held

    def run(self) -> Outcome:
        try:
            if note := take_lock(self.lock, self.who, self.why, self.lock_wait_s, self.ops):
                self.j.event("lock", note, level="warning")
            mark_interrupted(self.lay, self.j)
            return self._run()
        except LockHeld as held:
            if held.holder.get("window"):  # a maintenance window: the stack stays down, at 503
                self.say_503(f"{held.holder.get('why') or 'maintenance'}; the stack comes back "
                             "through the gate", RETRY_AFTER_S, "warning")
                return self._said("deferred", EXIT_PROMOTED, f"deferred: {held}")
            if self.leave_held:
                return self._said("left-alone", EXIT_PROMOTED, f"left alone: {held} (waited "
                                  f"{self.lock_wait_s:g} s); it decides what serves, and the "
                                  "supervisor watches what it leaves", "warning")
            self.j.event("lock", str(held), level="error")
            return Outcome("locked", EXIT_LOCKED, "ensure", reason=str(held), phase="lock")
        except (Failure, ActiveDamaged) as f:
            reason = str(f)  # a Failure's is its reason
            self.j.event("ensure", reason, level="error")
            if isinstance(f, ActiveDamaged):
                # Never a silent 503: the front's message says it too.
                self.say_503("the active record is damaged; run the deploy", RETRY_AFTER_S,
                             "warning")
            ledger.append(self.lay, "ensure", "failed", None, by=self.who, reason=reason)
            phase = f.phase if isinstance(f, Failure) else "active"
            return Outcome("failed", EXIT_FAILED, "ensure", reason=reason, phase=phase,
                           serving=self.front.current())
        except OSError as e:  # a full disk, a read-only file system: the unit retries
            reason = f"{fs_problem(e)}; stopped there; rigfleet-stack.service tries again"
            with contextlib.suppress(OSError):
                ledger.append(self.lay, "ensure", "failed", None, by=self.who, reason=reason)
            return self._said("failed", EXIT_RETRY, reason, "error", "disk")
        finally:
            with contextlib.suppress(OSError):
                self.lock.release()

    def _said(self, result: str, code: int, reason: str, level: str = "info",
              phase: str = "") -> Outcome:
        self.j.event("ensure", reason, level=level)
        return Outcome(result, code, "ensure", reason=reason, phase=phase,
                       serving=self.front.current())

    def _run(self) -> Outcome:
        win, status, why = window_status(self.lay)
        if status in ("abandoned", "failed", "damaged"):  # closed here: recreate + gate
            if (plan := plan_of(win, self.lay)) is None or self.gate is None:
                reason = (f"{why}: the stack needs the gate before it serves again; run "
                          "`rigfleet-host.pyz maintenance close` or the deploy")
                self.front.maintenance(reason, RETRY_AFTER_S, wait=False)
                return self._said("failed", EXIT_FAILED, reason, "error", "maintenance")
            self.j.event("ensure", f"{why}: closing it (recreate + gate)")
            return Maintenance(self.lay, self.ops, self.front, self.j, plan, gate=self.gate,
                               lock=self.lock).close()
        active = load_active(self.lay, repair=True, by=self.who)
        if active is None:
            self.front.maintenance("no verified stack on this host yet", RETRY_AFTER_S, wait=False)
            self.j.event("ensure", "nothing was ever verified here: the front answers 503")
            return Outcome("failed", EXIT_FAILED, "ensure", reason="no active stack",
                           serving="maintenance")
        ref = active.ref
        st = self.ops.container(ref.container)
        # Its container must be this boot's, from the snapshot's config and verified image (a
        # compose file edited by hand keeps the labels, not the image; a tag may have moved).
        image = ref.image_id or self.ops.image_id(ref.image_ref)
        if st is None:
            why = "its container is gone"
        elif not st.running:
            why = f"its container is {st.status}"
        elif st.config_hash != ref.config_hash or (st.image_id and image and st.image_id != image):
            why = "its container is not the snapshot's (other config or image)"
        elif (created := docker_time(st.created)) is None or created < self.booted_at:
            why = ("its container is from before this boot (Genesis patches live in the "
                   "container's writable layer: recreate, never restart)")
        else:
            self.wait_ready(ref, READY_TIMEOUT_S)
            if self.front.current() == ref.route_id:
                self.j.event("ensure", f"{ref.route_id} already serves")
                return Outcome("noop", EXIT_PROMOTED, "ensure", ref.stack, serving=ref.route_id)
            self.front.serve(ref)
            self.j.event("ensure", f"front routed to {ref.route_id}")
            request_reset(self.lay, self.who, f"ensure routed the front to {ref.route_id}")
            return Outcome("rerouted", EXIT_PROMOTED, "ensure", ref.stack, serving=ref.route_id)
        t0 = self.ops.monotonic()
        self.j.event("ensure", f"recreating {ref.route_id}: {why}")
        self.recreate(ref, f"recreating {ref.stack}", RETRY_AFTER_S, VRAM_TIMEOUT_S,
                      READY_TIMEOUT_S)
        window = self.ops.monotonic() - t0
        ledger.append(
            self.lay, "ensure", "recreated", ref, by=self.who, deploy_id=active.deploy_id,
            gate=active.snapshot_gate(), reason=self.why + "".join(
                f"; {note}" for note in self.image_notes),
            extra={"image": "; ".join(self.image_notes)} if self.image_notes else None)
        request_reset(self.lay, self.who, f"ensure recreated {ref.route_id}: {self.why}")
        self.j.event("ensure", f"{ref.route_id} recreated and serving ({window:.1f}s)")
        return Outcome("recreated", EXIT_PROMOTED, "ensure", ref.stack, serving=ref.route_id,
                       window_s=window)


def adopt(plan: Plan, lay: Layout, ops: Ops, front: FrontControl, journal: Journal) -> Outcome:
    """Record the plan's stack as active when it already serves; nothing restarts."""
    new = plan.desired
    lock = HostLock(lay)
    try:
        lock.acquire(plan.by, f"adopt {new.route_id}", plan.id)
    except LockHeld as held:
        return Outcome("locked", EXIT_LOCKED, "adopt", new.stack, str(held), "lock")
    try:
        st = ops.container(new.container)
        if st is None or not st.running or st.config_hash != new.config_hash:
            raise Failure("adopt", f"{new.container} is not running with config hash "
                          f"{new.config_hash} ({st})")
        Steps(lay, ops, front, journal).wait_ready(new, plan.ready_timeout_s)
        text = Path(new.compose_file).read_text()
        if compose_hash(text) != new.config_hash:
            raise Failure("adopt", f"{new.compose_file} is not the running configuration")
        gate = {"result": "not-run", "note": "adopted: it served before rigfleet recorded swaps"}
        snapshot = write_active(lay, Active(new, now_iso(), plan.id, plan.by, gate), text).ref
        front.serve(snapshot)
        ledger.append(lay, "adopt", "adopted", snapshot, host=plan.host, by=plan.by,
                      deploy_id=plan.id, gate=gate, active=True)
        ledger.update_state(lay, **ledger.stack_fields(snapshot), since=now_iso(),
                            by=plan.by, deploy_id=plan.id, gate=gate)
        journal.event("adopt", f"{new.route_id} recorded as active; the front routes to it")
        return Outcome("adopted", EXIT_PROMOTED, "adopt", new.stack, serving=new.route_id)
    except (Failure, OSError) as e:
        reason = str(e)  # a Failure says its reason
        journal.event("adopt", reason, level="error")
        return Outcome("failed", EXIT_FAILED, "adopt", new.stack, reason, "adopt",
                       serving=front.current())
    finally:
        lock.release()


def shutdown(lay: Layout, ops: Ops, front: FrontControl, journal: Journal,
             lock_wait_s: float = LOCK_WAIT_S, going_down: Callable[[], bool] = lambda: True,
             who: str = "rigfleet-stack.service") -> str:
    """The front to 503 (nginx starts in maintenance at boot), then every stack down (Docker
    restarts no old container at boot). A transaction holding the host lock is waited for,
    then left alone unless the machine is ``going_down``; ``stopped`` or ``left-alone``."""
    lock = HostLock(lay)
    try:
        take_lock(lock, who, "the stack unit stops: front to 503, every stack down",
                  lock_wait_s, ops)
    except LockHeld as held:
        if not held.holder.get("window"):
            if not going_down():
                journal.event("shutdown", f"left alone: {held} (waited {lock_wait_s:g} s); "
                              "nothing was stopped: stop the unit again after it",
                              level="warning")
                return "left-alone"
            journal.event("shutdown", f"{held}: the machine goes down; stopping anyway",
                          level="warning")
    except OSError as e:  # a read-only or full disk: the stacks still go down
        journal.event("shutdown", f"host lock: {e.filename}: {e.strerror}; stopping without it",
                      level="warning")
    try:
        try:
            front.maintenance("host restarting", RETRY_AFTER_S, wait=False)
        except (FrontError, OSError) as e:
            journal.event("shutdown", f"front: {e}", level="warning")
        for project, file in known_projects(lay):
            journal.event("shutdown", f"docker compose down {project}")
            if err := ops.down(file, project):
                journal.event("shutdown", err, level="warning")
    finally:
        with contextlib.suppress(OSError):
            lock.release()
    return "stopped"
