"""Host maintenance as a transaction (docs/maintenance.md): what disturbs serving (a driver, a
reboot, a Docker restart) runs in a *window* ending with the stack gated and serving, or 503::

    window = Maintenance(lay, ops, front, journal, plan, gate=run_gate_fn)
    window.open("driver 580 -> 590")      # Outcome: open (exit 0), locked (3), refused (1)
    window.hold()                         # the deploy back after the reboot
    window.close(own=True)                # Outcome: closed (0, serving), failed (2), locked
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from . import ledger
from . import steps as st
from .active import ActiveDamaged, load_active, prune_snapshots, request_reset, write_active
from .atomic import move_aside, write_json
from .front import MAINTENANCE, FrontError
from .journal import Journal
from .layout import Layout
from .lock import HostLock, LockHeld, WindowHold
from .plan import Active, Plan, PlanError
from .records import Coded, describe, live_holder, read_holder, read_json
from .steps import Failure, FrontControl, GateFn, Ops, Outcome, Steps, known_projects

KIND = "maintenance"
SCHEMA = "rigfleet-maintenance/1"


@dataclass(frozen=True)
class Window(Coded):
    """``maintenance/window.json`` (times: epoch seconds)."""

    id: str = ""
    state: str = "open"
    by: str = ""
    host: str = ""
    opened_at: float = 0.0
    until: float = 0.0
    steps: tuple[dict[str, Any], ...] = ()
    plan: dict[str, Any] = field(default_factory=dict)
    serving_before: str | None = None
    reason: str = ""
    gate: dict[str, Any] | None = None
    closed_at: float | None = None
    drain: dict[str, Any] | None = None  # how the requests in flight at the open ended
    schema: ClassVar[str] = SCHEMA

    @property
    def why(self) -> str:
        return "; ".join(str(s.get("what")) for s in self.steps) or "maintenance"


def window_status(lay: Layout) -> tuple[Window | None, str, str]:
    """(the window, its status, why); status: ``none``, ``held``, ``abandoned``, ``failed``
    or ``damaged`` (docs/maintenance.md)."""
    data, err = read_json(lay.window_file)
    if err == "missing":
        return None, "none", ""
    ours = isinstance(data, dict) and data.get("state") in ("open", "closed", "failed")
    window = Window.from_dict(data) if ours else None
    if window is None:
        return None, "damaged", f"{lay.window_file}: {err or f'not a {SCHEMA} record'}"
    if window.state == "closed":
        return window, "none", window.reason
    if window.state == "failed":
        return window, "failed", window.reason or "the maintenance window failed"
    holder = live_holder(read_holder(lay.lock_dir))
    if holder is not None and holder.get("window") == window.id:
        return window, "held", window.why
    if holder is not None and holder.get("deploy_id") == window.id:
        return window, "held", f"{window.why} (closing)"
    return window, "abandoned", (f"maintenance window {window.id} ({window.why}) was opened by "
                                 f"{window.by or 'someone'} and never closed")


def plan_of(window: Window | None, lay: Layout) -> Plan | None:
    """The plan the window was opened with, else the newest one a deploy uploaded for a window."""
    if window is not None and window.plan:
        with contextlib.suppress(PlanError):
            return Plan.from_dict(window.plan)
    for path in sorted(lay.maintenance_dir.glob("plan-*.json"),
                       key=lambda p: p.stat().st_mtime, reverse=True):
        with contextlib.suppress(PlanError):
            return Plan.load(path)
    return None


class Maintenance(Steps):
    """One maintenance window on this host; it brings back the *active* stack, not the
    plan's desired one. Without a ``gate`` close refuses."""

    def __init__(self, lay: Layout, ops: Ops, front: FrontControl, journal: Journal,
                 plan: Plan, gate: GateFn | None = None, lock: HostLock | None = None,
                 interrupted: Callable[[], bool] = lambda: False) -> None:
        super().__init__(lay, ops, front, journal, interrupted)
        self.plan = plan
        self.gate_fn = gate
        self.lock = lock or HostLock(lay)
        self.cause = ""

    def open(self, step: str, hold: WindowHold | None = None) -> Outcome:
        """Open the window (or add ``step`` to this plan's open window)."""
        plan, now = self.plan, time.time()
        hold = hold or WindowHold.here(plan.id)
        current, status, damaged = window_status(self.lay)
        mine = current if current and current.id == plan.id and current.state == "open" else None
        try:
            note = self.lock.acquire(plan.by, f"maintenance: {step}", hold.window, hold)
        except LockHeld as held:
            if held.holder.get("window") == plan.id and mine is not None \
                    and self.lock.hold_window(hold, f"maintenance: {step}"):  # not taken since
                return self._join(mine, step, now, f"window {plan.id} already open; step: "
                                  f"{step}; held by pid {hold.pid} ({hold.what})"
                                  + (" and across the reboot" if hold.reboot else ""))
            return self._locked(describe(self.lock.read() or held.holder))
        if note:
            self.j.event("lock", note, level="warning")
        if mine is not None:
            # This deploy's own window, its holder gone meanwhile (a new connection): go on.
            return self._join(mine, step, now, f"window {plan.id} held again by pid {hold.pid} "
                              f"({hold.what}); step: {step}")
        if current is not None and status == "abandoned":
            ledger.append(
                self.lay, KIND, "abandoned", None, host=plan.host, by=plan.by, deploy_id=current.id,
                reason=f"window {current.id} ({current.why}) was never closed; window "
                       f"{plan.id} takes over (its close recreates the stack and runs the gate)")
        try:
            active = load_active(self.lay, repair=True, by=plan.by)
        except ActiveDamaged as e:
            active = None
            self.j.event("maintenance", str(e), level="warning")
        serving = self.front.current()
        window = Window(plan.id, "open", plan.by, plan.host, now, 0.0,
                        ({"what": step, "at": now},), plan.to_dict(),
                        serving if serving != MAINTENANCE else
                        (current.serving_before if current is not None else None))
        write_json(self.lay.window_file, window.to_dict())
        ref = active.ref if active else None
        stack = ref.stack if ref else None
        times = st.read_timings(self.lay)
        estimate = st.window_estimate(times, stack, self.holds_requests(ref),
                                      plan.retry_after_s, steps=True)
        try:
            self.front.maintenance(f"maintenance: {step}", estimate.seconds)
        except FrontError as e:
            # Nothing was disturbed yet: give the host back as it was (an unfinished window
            # it took over stays unfinished: its stack still needs the gate).
            if current is not None and status != "none":
                write_json(self.lay.window_file, current.to_dict())
            else:
                self._finish(window, "failed" if status == "damaged" else "closed",
                             f"not opened: the front refused 503: {e}"
                             + (f"; {damaged}" if status == "damaged" else ""))
            if self.lock.adopt_window(plan.id, "giving back a window that did not open",
                                      take_live=True):
                self.lock.release()
            return Outcome("refused", st.EXIT_ROLLED_BACK, KIND, reason=f"the front could not be "
                           f"switched to 503 ({e}): nothing was disturbed", phase="front",
                           serving=self.front.current())
        rest = st.window_estimate(times, stack, False, plan.retry_after_s, steps=True)
        # What the front accepted before the 503 finishes on the stack before any step runs.
        drained = self.drain_requests(ref, plan.drain_timeout_for(stack), f"maintenance: {step}",
                                      estimate, rest)
        drain = drained.to_dict() if drained else None
        write_json(self.lay.window_file, replace(window, drain=drain).to_dict())
        ledger.append(self.lay, KIND, "opened", None, host=plan.host, by=plan.by,
                      deploy_id=plan.id, previous=ref, reason=step,
                      extra={"drain": drain} if drain else None)
        self.j.event("maintenance", f"window {plan.id} open while pid {hold.pid} "
                     f"({hold.what}) lives: the front answers 503 + Retry-After "
                     f"{estimate.seconds}s; step: {step}")
        return Outcome("open", st.EXIT_PROMOTED, KIND, stack or "", serving=MAINTENANCE,
                       drain=drain, retry_after_s=estimate.seconds)

    def _join(self, window: Window, step: str, now: float, said: str) -> Outcome:
        steps = (*window.steps, {"what": step, "at": now})
        write_json(self.lay.window_file, replace(window, steps=steps).to_dict())
        self.j.event("maintenance", said)
        return Outcome("open", st.EXIT_PROMOTED, KIND, reason=f"already open: {step}",
                       serving=self.front.current())

    def _locked(self, why: str, topic: str = "maintenance") -> Outcome:
        reason = f"{self.plan.host or 'host'}: {why}"
        self.j.event(topic, reason, level="error")
        return Outcome("locked", st.EXIT_LOCKED, KIND, reason=reason, phase="lock")

    def hold(self, hold: WindowHold) -> Outcome:
        """The deploy back after its reboot holds this plan's window again (exit 3: not open)."""
        plan = self.plan
        window, status, why = window_status(self.lay)
        if window is None or window.id != plan.id or window.state != "open":
            return self._locked(f"maintenance window {plan.id} is not open here any more "
                                f"({status}{': ' + why if why else ''})")
        if not self.lock.hold_window(hold, "maintenance: back from the reboot"):
            try:
                self.lock.acquire(plan.by, "maintenance: back from the reboot", hold.window, hold)
            except LockHeld as held:
                return self._locked(str(held))
        self.j.event("maintenance", f"window {plan.id} held by pid {hold.pid} ({hold.what})")
        return Outcome("open", st.EXIT_PROMOTED, KIND, reason="held", serving=self.front.current())

    def close(self, own: bool = False, force: bool = False, cause: str = "") -> Outcome:
        """Recreate the verified stack, gate it, route the front to it. ``own``: the deploy
        holding this window; ``force``: take a live holder's lock; ``cause``: for the ledger."""
        plan = self.plan
        window, status, why = window_status(self.lay)
        if status == "none" and not self.lock.held:
            self.j.event("maintenance", "no maintenance window to close")
            return Outcome("noop", st.EXIT_PROMOTED, KIND, reason="no maintenance window to close",
                           serving=self.front.current())
        self.cause = cause
        if cause:
            self.j.event("maintenance", f"closing at once: {cause}", level="warning")
        ours = not self.lock.held  # a caller that holds the lock keeps it
        if ours:
            wid = window.id if window is not None else ""
            take_live = force or (own and wid == plan.id)
            try:
                adopted = bool(wid) and self.lock.adopt_window(
                    wid, f"closing maintenance window {wid}", take_live=take_live)
            except LockHeld as held:
                return self._locked(f"{held}; refusing to take it from a holder that lives "
                                    "(`maintenance close --force` does, naming it)", "lock")
            if adopted and status == "held" and force and not own:
                self.j.event("lock", f"took window {wid} from a live holder (--force)",
                             level="warning")
            if not adopted:
                try:
                    note = self.lock.acquire(plan.by, f"closing maintenance window {wid}",
                                             wid or plan.id)
                except LockHeld as held:
                    return self._locked(str(held), "lock")
                if note:
                    self.j.event("lock", note, level="warning")
        try:
            self.j.event("maintenance", f"closing: {why or 'maintenance'}")
            return self._close(window, status == "held")
        except Exception as e:  # a bug must still end with a result, 503 and a ledger line
            return self._failed(window, None, Failure("internal",
                                                      f"internal error: {type(e).__name__}: {e}"))
        finally:
            if ours:
                self.lock.release()

    def _close(self, window: Window | None, held: bool) -> Outcome:
        """``held``: its steps just ran (a failed or abandoned window's time is no step's)."""
        plan = self.plan
        t0 = self.ops.monotonic()
        try:
            active = load_active(self.lay, repair=True, by=plan.by)
        except ActiveDamaged as e:
            return self._failed(window, None, Failure("active", str(e)))
        if active is None:
            self._finish(window, "closed", "nothing verified on this host: nothing to bring "
                         "back; the front answers 503 until a deploy activates a stack")
            self.front.maintenance("no verified stack on this host yet", plan.retry_after_s,
                                   wait=False)
            return Outcome("closed", st.EXIT_PROMOTED, KIND, reason="nothing verified here",
                           serving=MAINTENANCE)
        ref = active.ref
        if self.gate_fn is None:
            return self._failed(window, active, Failure(
                "gate", "the window cannot be closed without the gate (none available here)"))
        recreate = st.window_estimate(st.read_timings(self.lay), ref.stack, False,
                                      plan.retry_after_s)
        steps_s = max(0.0, time.time() - window.opened_at
                      - float((window.drain or {}).get("seconds") or 0.0)) \
            if held and window is not None and window.opened_at else None
        try:
            self.front.maintenance(f"maintenance: recreating {ref.stack}", recreate.seconds,
                                   wait=False)
            times: dict[str, float] = {}
            boot_s = self.bring_up(ref, plan.vram_timeout_s, plan.ready_timeout_s, timings=times)
            self.answers(ref)
            gate = self.verify(ref, self.gate_fn, plan, times)
            written = write_active(self.lay, replace(active, gate=gate.record()))
            self.front.serve(written.ref)
        except Failure as f:  # a FrontError too
            return self._failed(window, active, f)
        seconds = self.ops.monotonic() - t0
        ledger.append(
            self.lay, KIND, "closed", written.ref, host=plan.host, by=plan.by,
            deploy_id=window.id if window else plan.id, gate=gate.record(), active=True,
            reason=f"recreated and verified after: {window.why if window else 'maintenance'}"
                   + (f" ({self.cause})" if self.cause else ""))
        ledger.update_state(self.lay, **ledger.stack_fields(written.ref), gate=gate.record())
        st.record_times(self.lay, ref.stack, boot_s, times["gate_s"], steps_s=steps_s)
        request_reset(self.lay, plan.by, f"maintenance closed: {written.ref.route_id} verified")
        prune_snapshots(self.lay)
        self._finish(window, "closed", f"{written.ref.route_id} recreated and passed the gate",
                     gate=gate.record())
        self.j.event("maintenance", f"{written.ref.route_id} serves again (recreated, gate "
                     f"passed, {seconds:.1f}s)")
        opened = window.opened_at if window is not None else time.time()
        return Outcome("closed", st.EXIT_PROMOTED, KIND, ref.stack, serving=written.ref.route_id,
                       gate=gate.record(), window_s=round(time.time() - opened, 1))

    def _failed(self, window: Window | None, active: Active | None, failure: Failure) -> Outcome:
        """Nothing verified serves: the stack down, 503 with the reason, the window failed."""
        plan = self.plan
        ref = active.ref if active else None
        self.interrupted = lambda: False  # the way to 503 must not be cut short
        kept = self.keep_log(ref, self.lay.maintenance_dir) if ref else None
        try:
            if ref is not None:
                self.stop(known_projects(self.lay))
        except Failure as f:
            self.j.event("maintenance", f.reason, level="warning")
        reason = f"maintenance failed ({failure.phase}): {failure.reason}" \
            + (f" (closed because {self.cause})" if self.cause else "")
        self.say_503(f"not serving: {failure.reason}", plan.retry_after_s)
        gate, boot = failure.gate, failure.boot
        ledger.append(
            self.lay, KIND, "failed", None, attempted=ref, host=plan.host, by=plan.by,
            deploy_id=window.id if window else plan.id, gate=gate, reason=reason,
            extra={"phase": failure.phase, "boot_failure": boot, "kept_log": kept})
        self._finish(window, "failed", reason, gate=gate)
        self.j.event("maintenance", reason, level="error")
        return Outcome("failed", st.EXIT_FAILED, KIND, ref.stack if ref else "", reason,
                       failure.phase, serving=MAINTENANCE, gate=gate, boot_failure=boot,
                       kept_log=kept)

    def _finish(self, window: Window | None, state: str, reason: str,
                gate: dict[str, Any] | None = None) -> None:
        plan = self.plan
        window = window or Window(plan.id, by=plan.by, host=plan.host, opened_at=time.time(),
                                  plan=plan.to_dict())
        write_json(self.lay.window_file, replace(window, state=state, reason=reason, gate=gate,
                                                 closed_at=time.time()).to_dict())


def supersede(lay: Layout, by: str, why: str) -> None:
    """A swap promoted a stack through its own gate: a failed, abandoned or damaged window is
    over (a damaged record is kept aside)."""
    window, status, _ = window_status(lay)
    if status not in ("failed", "abandoned", "damaged"):
        return
    reason = f"superseded: {why} (by {by})"
    if window is None:
        window = Window(by=by)
        reason += f"; damaged record kept: {move_aside(lay.window_file)}"
    write_json(lay.window_file, replace(window, state="closed", closed_at=time.time(),
                                        reason=reason).to_dict())
