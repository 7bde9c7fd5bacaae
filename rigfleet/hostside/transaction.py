"""The swap transaction, run on the host: from the active (verified) stack to the desired one,
or back to the old one after any failure past the 503 (docs/swap.md, its steps)::

    outcome = Transaction(plan, Layout(), SystemOps(key), front, gate_fn, journal).run()
    outcome.exit        # 0 promoted, 1 rolled back (old serves), 2 failed, 3 locked
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import ledger
from .active import (
    ActiveDamaged,
    load_active,
    mark_interrupted,
    prune_journals,
    prune_snapshots,
    request_reset,
    write_active,
)
from .atomic import fsync_dir, move_aside, write_atomic
from .drain import DrainReport
from .front import FrontError
from .gate import GateResult
from .journal import Journal
from .layout import Layout
from .lock import HostLock, LockHeld
from .maintenance import supersede, window_status
from .plan import Active, Plan, StackRef, change_kind, compose_hash
from .records import now_iso
from .steps import (
    EXIT_FAILED,
    EXIT_LOCKED,
    EXIT_PROMOTED,
    EXIT_ROLLED_BACK,
    Failure,
    FrontControl,
    GateFn,
    Ops,
    Outcome,
    Steps,
    fs_problem,
    local_name,
    read_timings,
    record_swap,
    window_estimate,
)


class Transaction(Steps):
    def __init__(self, plan: Plan, lay: Layout, ops: Ops, front: FrontControl, gate: GateFn,
                 journal: Journal, interrupted: Callable[[], bool] = lambda: False,
                 lock: HostLock | None = None,
                 on_locked: Callable[[], None] = lambda: None) -> None:
        super().__init__(lay, ops, front, journal, interrupted)
        self.plan = plan
        # Called once the lock is held, before anything changes (the metrics textfiles).
        self.on_locked = on_locked
        self.gate_fn = gate
        self.lock = lock or HostLock(lay)
        self.dir = lay.swap_dir(plan.id)
        self.timings: dict[str, float] = {}
        self.rollback_to: StackRef | None = None
        self.drained: DrainReport | None = None
        self.retry_after_s: int | None = None

    def run(self) -> Outcome:
        plan = self.plan
        self.j.event("lock", f"taking the host lock for {plan.by}: {plan.why}")
        try:
            note = self.lock.acquire(plan.by, plan.why, plan.id)
        except LockHeld as held:
            return self._not_taken(Outcome("locked", EXIT_LOCKED, stack=plan.desired.stack,
                                           reason=f"{plan.host or 'host'}: {held}",
                                           phase="lock"))
        except OSError as e:  # a read-only or full disk: nothing changed, said why
            return self._not_taken(Outcome(
                "refused", EXIT_FAILED, stack=plan.desired.stack, phase="disk",
                reason=f"{plan.host or 'host'}: refused before any change: the host lock "
                f"cannot be taken: {fs_problem(e)}", serving=self.front.current()))
        try:
            if note:
                self.j.event("lock", note, level="warning")
                mark_interrupted(self.lay, self.j, exclude=plan.id)
            prune_journals(self.lay)
            self.on_locked()
            outcome = self._run()
        except Exception as e:  # a bug must still end with a result and a released lock
            outcome = Outcome("failed", EXIT_FAILED, stack=plan.desired.stack, phase="internal",
                              reason=f"internal error: {type(e).__name__}: {e}",
                              serving=self.front.current())
            self.j.event("internal", outcome.reason, level="error")
        try:
            self._record(outcome)
        finally:  # the records are written under the lock: no other writer of state.json
            self.lock.release()
        return outcome

    def _record(self, outcome: Outcome) -> None:
        """``last_swap`` in ``state.json``, then ``result.json``: a follower that sees the
        result reads the new ``last_swap``, and a kill before it is an interrupted swap."""
        outcome.timings = self.timings
        self.j.event("done", f"{outcome.result}: {outcome.reason or outcome.serving}",
                     level="info" if outcome.exit == 0 else "error")
        # "last_swap": what rigfleet.bump.rollout reads (with its "gate" and "reason").
        try:
            kept = ("kind", "result", "reason", "stack", "serving", "gate", "boot_failure",
                    "drain", "retry_after_s")
            ledger.update_state(self.lay, last_swap={
                "id": self.plan.id, "at": now_iso(), **{k: getattr(outcome, k) for k in kept}})
        except OSError as e:  # the journal's result (below) still says how it ended
            self.j.event("done", f"state.json not updated: {fs_problem(e)}", level="warning")
        self.j.finish(outcome.to_dict())

    def _run(self) -> Outcome:
        plan, new = self.plan, self.plan.desired
        try:
            active = load_active(self.lay, repair=True, by=plan.by)
        except ActiveDamaged as e:
            # Nothing verified can be named: the desired stack is activated through the gate.
            kept = move_aside(self.lay.active_json)
            self.j.event("plan", f"{e}; kept as {kept}; activating {new.route_id} instead",
                         level="warning")
            active = None
        old = active.ref if active else None
        kind = change_kind(old.stack if old else None, new.stack)
        _, status, why = window_status(self.lay)
        # After a maintenance that left nothing verified, the old stack is no way back.
        self.rollback_to = old if status not in ("failed", "abandoned", "damaged") else None
        if old is not None and self.rollback_to is None:
            self.j.event("plan", f"{why}: {old.route_id} is not verified since; a failure "
                         "leaves the front at 503", level="warning")
        self.j.event("plan", f"{kind}: {old.route_id if old else 'nothing'} -> {new.route_id}")
        try:
            staged = self._stage(new, old)
            # The image the gate verifies and the record keeps: its id now, not its tag.
            new = replace(new, image_id=self.ops.image_id(local_name(new)) or "")
            times = read_timings(self.lay)
            busy = self.holds_requests(old)
            estimate = window_estimate(times, new.stack, busy, plan.retry_after_s)
            message = f"{kind} {old.stack if old else 'nothing'} -> {new.stack} in progress"
            t_window = self.ops.monotonic()
            self.front.maintenance(message, estimate.seconds)
        except (Failure, OSError) as e:  # a stage check, the front refusing its 503, the disk
            f = e if isinstance(e, Failure) else Failure("disk", fs_problem(e))
            if f.phase != "front":
                self.j.event("stage", f.reason, level="error")
            return Outcome("refused", EXIT_ROLLED_BACK if self.rollback_to else EXIT_FAILED,
                           kind, new.stack, f"refused before any change: {f.reason}", f.phase,
                           serving=self.front.current())
        self.retry_after_s = estimate.seconds
        # What the front accepted before the 503 finishes on the old stack first.
        self.drained = self.drain_requests(
            old, plan.drain_timeout_for(old.stack if old else None), message, estimate,
            window_estimate(times, new.stack, False, plan.retry_after_s), stoppable=True)
        if self.drained is not None:
            self.timings["drain_s"] = self.drained.seconds
            # Not back to a stack a failed window left unverified: the stop rolls back (503).
            if self.drained.result == "interrupted" and self.rollback_to is not None:
                return self._undrain(kind, self.rollback_to, new)
        try:
            boot_s = self.bring_up(new, plan.vram_timeout_s, plan.ready_timeout_s, [
                *([(old.project, old.compose_file)] if old else []),
                (new.project, staged), *plan.projects], staged, self.timings)
            gate = self.verify(new, self.gate_fn, plan, self.timings)
            self._promote(new, staged, gate, old, kind)
        except Exception as e:  # a full or read-only disk (a record, a gate report), a bug: go back
            failure = e if isinstance(e, Failure) else (
                Failure("disk", fs_problem(e)) if isinstance(e, OSError)
                else Failure("internal", f"internal error: {type(e).__name__}: {e}"))
            return self._rollback(kind, new, staged, failure, t_window)
        window = self.ops.monotonic() - t_window
        self.timings["window_s"] = window
        self.j.event("promote", f"{new.route_id} serves (503 window {window:.1f}s)")
        try:
            record_swap(self.lay, new.stack, boot_s, self.timings["gate_s"], window, self.drained)
        except OSError as e:  # Retry-After keeps the last measured window
            self.j.event("promote", f"timings not recorded: {fs_problem(e)}", level="warning")
        return Outcome("promoted", EXIT_PROMOTED, kind, new.stack, "", "promote",
                       serving=new.route_id, gate=gate.record(), window_s=window,
                       **self._window())

    def _not_taken(self, outcome: Outcome) -> Outcome:
        self.j.event("lock", outcome.reason, level="error")
        self.j.finish(outcome.to_dict())
        return outcome

    def _window(self, drop_none: bool = False) -> dict[str, Any]:
        """The window's drain and Retry-After: the outcome's; a ledger line's ``drop_none``."""
        found = {"drain": self.drained.to_dict() if self.drained is not None else None,
                 "retry_after_s": self.retry_after_s}
        return {k: v for k, v in found.items() if v is not None or not drop_none}

    def _undrain(self, kind: str, old: StackRef, new: StackRef) -> Outcome:
        """Stopped while draining: nothing was stopped yet, the old stack serves again."""
        reason, code = "asked to stop while draining: nothing was stopped", EXIT_ROLLED_BACK
        try:
            self.front.serve(old)
            said = f"{reason}; {old.route_id} serves again"
        except (FrontError, OSError) as e:  # it runs, unrouted: nothing verified serves
            reason += f"; the front could not be routed back to {old.route_id}: {e}"
            said, code = reason, EXIT_FAILED
        self.j.event("drain", said, level="warning")
        return Outcome("refused", code, kind, new.stack, reason, "drain",
                       serving=self.front.current(), **self._window())

    def _stage(self, new: StackRef, old: StackRef | None) -> str:
        """Checks that change nothing (compose file, images, a rollback's); the staged copy."""
        try:
            text = Path(new.compose_file).read_text()
        except OSError as e:
            raise Failure("stage", f"{new.compose_file} cannot be read ({e.strerror})") from None
        if (found := compose_hash(text)) != new.config_hash:
            raise Failure("stage", f"{new.compose_file} has config hash {found}, the plan "
                          f"expects {new.config_hash} (did another deploy render it since?)")
        staged = self.dir / "compose.yaml"
        write_atomic(staged, text)  # the exact promoted text: a damaged record is rebuilt from it
        if err := self.ops.compose_check(str(staged), new.project):
            raise Failure("stage", f"docker compose config refuses {new.compose_file}: {err}")
        if not self.ops.image_present(new.image_ref):
            raise Failure("stage", f"image {new.image_ref} is not on the host (not staged)")
        if old is not None and self.rollback_to is not None:
            if not Path(old.compose_file).exists():
                raise Failure("stage", f"the active stack's snapshot {old.compose_file} is "
                              "missing: a failed swap could not roll back")
            # A rollback runs the verified image by its id (``Steps.pin_image``).
            if not self.ops.image_present(image := old.image_id or old.image_ref):
                raise Failure("stage", f"the active stack's image {image} is gone: a "
                              "failed swap could not roll back")
        self.j.event("stage", f"{new.stack} staged: compose file checked, image present")
        return str(staged)

    def _promote(self, new: StackRef, staged: str, gate: GateResult, old: StackRef | None,
                 kind: str) -> None:
        plan = self.plan
        previous = load_active(self.lay) if old is not None else None
        # Record first, then switch: after a crash between the two, "active" names the
        # running, verified stack, and the boot-time ensure routes the front to it.
        try:
            snapshot = write_active(self.lay, Active(new, now_iso(), plan.id, plan.by,
                                                     gate.record()), Path(staged).read_text()).ref
            self.front.serve(snapshot)
        except (FrontError, OSError) as e:  # the rollback's stack is the active one again
            if previous is not None:
                write_active(self.lay, previous)
            else:
                self.lay.active_json.unlink(missing_ok=True)
                fsync_dir(self.lay.active_dir)
            if isinstance(e, OSError):  # half written on a full disk (its active.json, link)
                raise
            raise Failure("front", f"the front could not be switched to {new.stack}: {e}",
                          gate=gate) from None
        try:
            ledger.append(self.lay, kind, "promoted", snapshot, host=plan.host, by=plan.by,
                          deploy_id=plan.id, gate=gate.record(), previous=old, active=True,
                          extra=self._window(drop_none=True))
            ledger.update_state(self.lay, **ledger.stack_fields(snapshot), since=now_iso(),
                                by=plan.by, deploy_id=plan.id, gate=gate.record())
            supersede(self.lay, plan.by, f"{kind} {plan.id} promoted {snapshot.route_id}")
            prune_snapshots(self.lay)
        except OSError as e:  # it serves and active.json names it: a rollback would undo that
            self.j.event("promote", f"{snapshot.route_id} serves; a record was not written: "
                         f"{fs_problem(e)}", level="warning")

    def _records(self, *writes: Callable[[], object]) -> None:
        """A rollback's records; a disk that refuses one is said: what serves stays said."""
        try:
            for write in writes:
                write()
        except OSError as e:
            self.j.event("rollback", f"a record was not written: {fs_problem(e)}", level="warning")

    def _rollback(self, kind: str, new: StackRef, staged: str, failure: Failure,
                  t_window: float) -> Outcome:
        plan, old = self.plan, self.rollback_to
        gate, boot = failure.gate, failure.boot
        back = old.stack if old else "nothing (first activation)" if kind == "activate" \
            else "nothing verified (the front stays at 503)"
        self.j.event("rollback", f"{failure.phase} failed: {failure.reason}; back to {back}",
                     level="error")
        if kept := self.keep_log(new, self.dir):
            self.j.event("rollback", f"kept {new.stack}'s log in {kept}")
        line: dict[str, Any] = dict(
            attempted=new, host=plan.host, by=plan.by, deploy_id=plan.id, gate=gate,
            reason=failure.reason,
            extra={"phase": failure.phase, "boot_failure": boot, "kept_log": kept,
                   **self._window(drop_none=True)})
        outcome = Outcome("failed", EXIT_FAILED, kind, new.stack, failure.reason, failure.phase,
                          gate=gate, boot_failure=boot, kept_log=kept, **self._window())
        try:
            self.interrupted = lambda: False  # a stop request must not stop the way back
            self.stop([(new.project, staged)])
            if old is None:
                self.front.maintenance("no verified stack is serving", plan.retry_after_s)
                outcome.serving = "maintenance"
                self._records(lambda: ledger.append(self.lay, kind, "failed", None, **line))
                return outcome
            self.bring_up(old, plan.vram_timeout_s, plan.ready_timeout_s, [])
            self.answers(old)
            self.front.serve(old)
        except Failure as f2:
            outcome.reason = f"{failure.reason}; rollback failed too: {f2.reason}"
            outcome.serving = self.front.current()
            self.j.event("rollback", f"rollback failed: {f2.reason}", level="error")
            self._records(lambda: ledger.append(
                self.lay, kind, "failed", None, **{**line, "previous": old,
                                                   "reason": outcome.reason}))
            return outcome
        window = self.ops.monotonic() - t_window
        self.j.event("rollback", f"{old.route_id} serves again (503 window {window:.1f}s)")
        if self.image_notes:  # the old stack's tag had moved: said with the rollback
            line["extra"] = {**line["extra"], "image": "; ".join(self.image_notes)}
        self._records(lambda: ledger.append(self.lay, kind, "rolled-back", old, **line),
                      lambda: request_reset(self.lay, plan.by,
                                            f"{kind} rolled back: {old.route_id} serves again"))
        outcome.result, outcome.exit = "rolled-back", EXIT_ROLLED_BACK
        outcome.serving, outcome.window_s = old.route_id, window
        return outcome


