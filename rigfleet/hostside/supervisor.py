"""The supervisor's loop (``rigfleet-host.pyz supervise``): look, ask ``supervise.step`` what to
do, do it with the host lock (docs/swap.md, "When the engine dies")::

    with single_instance(Layout()):
        Supervisor(Layout(), SystemOps(key), front, Policy(), stop=stop_requested).run()
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from . import ledger
from .active import ActiveDamaged, load_active, mark_interrupted, prune_journals, write_active
from .atomic import write_json
from .front import FrontError
from .journal import Journal
from .layout import STACK_UNIT, Layout
from .lock import HostLock, LockHeld
from .maintenance import Maintenance, plan_of, window_status
from .plan import Active, PlanError, StackRef
from .records import SUPERVISE_SCHEMA, live_holder, process_id, read_holder, read_json, read_state
from .steps import Failure, FrontControl, GateFn, Ops, Steps, fs_problem
from .supervise import WHO, Action, Attempt, Observation, Policy, Record, moved, started, step

KEEP_LOGS = 10
LOG_TAIL = 400


class AlreadyRunning(Exception):
    """Another supervisor process runs on this host."""


@contextlib.contextmanager
def single_instance(lay: Layout) -> Iterator[None]:
    """One supervisor per host: an ``flock`` the kernel drops when the process ends."""
    fd = _lock_fd(lay)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(f"another supervisor runs on this host "
                                 f"({lay.supervise_state})") from None
        yield
    finally:
        os.close(fd)


def _lock_fd(lay: Layout) -> int:
    """``supervisor.lock``, else read-only, else the directory: a full disk must not stop us."""
    with contextlib.suppress(OSError):
        lay.supervise_dir.mkdir(parents=True, exist_ok=True)
        return os.open(lay.supervise_dir / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        return os.open(lay.supervise_dir / "supervisor.lock", os.O_RDONLY)
    except OSError:
        return os.open(lay.supervise_dir, os.O_RDONLY | os.O_DIRECTORY)


@dataclass
class Supervisor:
    """The loop around ``supervise.step``. ``refresh`` runs before each look (a rotated API
    key); with a ``gate`` an abandoned maintenance window is closed here."""

    lay: Layout
    ops: Ops
    front: FrontControl
    policy: Policy = field(default_factory=Policy)
    clock: Callable[[], float] = time.time
    stop: Callable[[], bool] = lambda: False
    refresh: Callable[[], None] = lambda: None
    gate: GateFn | None = None
    echo: TextIO | None = sys.stdout
    pid: int = 0

    def __post_init__(self) -> None:
        self.pid = self.pid or os.getpid()
        self.lock = HostLock(self.lay, self.pid)
        self.problem: str | None = None  # the last record write that failed (said once)
        data, err = read_json(self.lay.supervise_state)
        try:
            if err not in (None, "missing"):
                raise ValueError(err)  # not JSON (cut short), or unreadable
            self.rec = Record.from_dict(data)
        except (TypeError, ValueError, AttributeError) as e:
            self.say(f"{self.lay.supervise_state} is damaged ({type(e).__name__}: {e}); "
                     "starting a fresh count")
            self.rec = Record()
        self._saved: dict[str, Any] | None = None
        self._acts = 0

    def save(self, rec: Record) -> None:
        """Write ``state.json`` when it changed; a failed write is said once, not raised."""
        self.rec = rec
        data = {"schema": SUPERVISE_SCHEMA, **rec.to_dict(), "policy": self.policy.summary(),
                **process_id(self.pid)}
        if data == self._saved:
            return
        problem = None
        try:
            write_json(self.lay.supervise_state, {**data, "updated": self.clock()})
            self._saved = data
        except OSError as e:  # a full or read-only disk: watching on from the record in memory
            problem = f"cannot write {self.lay.supervise_state}: {e.strerror or e}"
        if problem != self.problem:
            self.say(f"{problem}; watching on, retrying at each look" if problem
                     else "records are written again")
        self.problem = problem

    def note(self, result: str, ref: StackRef | None, of: Active, reason: str,
             **fields: Any) -> None:
        """Append a ``supervise`` ledger line; one that cannot be written is said, not raised."""
        try:
            ledger.append(self.lay, "supervise", result, ref, by=WHO, deploy_id=of.deploy_id,
                          reason=reason, **fields)
        except OSError as e:
            self.say(f"ledger: cannot write {e.filename or 'a record'}: {e.strerror or e}; "
                     f"lost: supervise {result}: {reason}")

    def say(self, message: str) -> None:
        if self.echo is not None:
            self.echo.write(f"supervise: {message}\n")
            self.echo.flush()

    def run(self, ticks: int | None = None) -> int:
        """Watch until stopped (or for ``ticks`` looks, in tests); 0 when stopped."""
        self.save(started(self.rec, self.clock()))
        self.say(f"watching ({self.policy.limit} recreations within "
                 f"{self.policy.window_s:g} s, backoff {list(self.policy.backoff_s)})")
        done = 0
        while not self.stop() and (ticks is None or done < ticks):
            try:
                self.tick()
            except Exception as e:  # a bug must not end the watch; the next look retries
                self.say(f"internal error: {type(e).__name__}: {e}")
            done += 1
            self.nap(self.policy.poll_s)
        return 0

    def nap(self, seconds: float) -> None:
        """Sleep, waking for a stop request."""
        end = self.ops.monotonic() + seconds
        while not self.stop() and self.ops.monotonic() < end:
            self.ops.sleep(min(1.0, end - self.ops.monotonic()))

    def observe(self) -> Observation:
        self.refresh()
        holder = live_holder(read_holder(self.lay.lock_dir))
        if holder is not None and holder.get("pid") == self.pid and not holder.get("window"):
            holder = None  # ours (a window's holder is nobody's process)
        _, window, window_why = window_status(self.lay)
        base: dict[str, Any] = dict(now=self.clock(), holder=holder,
                                    stack_unit=self.ops.unit(STACK_UNIT),
                                    route=self.front.current(),
                                    reset=read_state(self.lay.supervise_reset) or None,
                                    window=window, window_why=window_why,
                                    can_close=self.gate is not None)
        try:
            active = load_active(self.lay)
        except PlanError as e:
            return Observation(**base, problem=f"cannot tell what should serve: {e}",
                               damaged=isinstance(e, ActiveDamaged))
        if active is None:
            return Observation(**base)
        ref = active.ref
        st = self.ops.container(ref.container)
        # While Docker restarts, a container it cannot show is no dead engine.
        if st is None and not self.ops.docker_up():
            return Observation(**base, active=active, problem="the Docker daemon does not "
                               "answer (restarting?): waiting for it")
        healthy, detail = self.ops.health(ref.port, ref.served_model_name) \
            if st is not None and st.running else (False, "")
        log = self.ops.logs(ref.container, LOG_TAIL) if st is not None and not healthy else ""
        return Observation(**base, active=active, container=st, healthy=healthy,
                           health=detail, log=log)

    def tick(self) -> Action:
        before = self.rec
        rec, action = step(before, self.observe(), self.policy)
        if rec.state != before.state or (rec.reason != before.reason and rec.state != "booting"):
            self.say(f"{rec.state}: {rec.reason}")
        if action.kind == "none":
            self.save(rec)
        else:
            self._locked(action, before)
        return action

    def _locked(self, action: Action, before: Record) -> None:
        """Act with the host lock, if a look under the lock still calls for it."""
        try:
            note = self.lock.acquire(WHO, f"{action.kind}: {action.reason}")
        except LockHeld as held:
            self.say(f"not now: {held}")
            return
        except OSError as e:  # its directory full or read-only: nobody can take it; retried
            self.say(f"not now: the host lock cannot be taken: {fs_problem(e)}; retrying at "
                     "the next look")
            return
        try:
            obs = self.observe()
            rec, again = step(before, obs, self.policy)
            if again.kind == action.kind == "repair":
                self._repair(rec)
                return
            if again.kind != action.kind or obs.active is None:
                self.save(rec)
                return
            self._acts += 1
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(obs.now))
            journal = Journal(self.lay.swaps_dir / f"supervise-{stamp}-{self.pid}-{self._acts}",
                              echo=self.echo)
            if note:
                journal.event("lock", note, level="warning")
            steps = Steps(self.lay, self.ops, self.front, journal, interrupted=self.stop)
            act = getattr(self, "_" + action.kind.replace("-", "_"))  # "give-up": _give_up
            try:
                mark_interrupted(self.lay, journal)
                result = act(rec, obs.active, steps)
            except OSError as e:  # a full or read-only disk: said, retried at the next look
                reason = f"{action.kind} stopped: {fs_problem(e)}; retrying at the next look"
                journal.event(action.kind, reason, level="error")
                self.say(reason)
                result = {"result": "failed", "exit": 1, "reason": reason}
            journal.finish(result)
            with contextlib.suppress(OSError):
                prune_journals(self.lay)
        finally:
            self.lock.release()

    def _repair(self, rec: Record) -> None:
        """Rebuild a damaged active record (the ledger and the journals: ``load_active``)."""
        try:
            active = load_active(self.lay, repair=True, by=WHO)
        except PlanError as e:
            self.save(moved(rec, "paused", f"cannot tell what should serve: {e}", self.clock()))
            return
        self.say(f"rebuilt the active record: {active.ref.route_id if active else 'nothing'}")
        self.save(rec)

    def _close_window(self, rec: Record, active: Active, steps: Steps) -> dict[str, Any]:
        """Close an abandoned maintenance window with its own plan (recreate + gate)."""
        window, _, why = window_status(self.lay)
        plan = plan_of(window, self.lay)
        if plan is None:
            steps.j.event("maintenance", f"{why}: its plan is unreadable; waiting for the "
                          "deploy", level="error")
            return {"result": "failed", "exit": 1, "reason": why}
        outcome = Maintenance(self.lay, self.ops, self.front, steps.j, plan, gate=self.gate,
                              lock=self.lock, interrupted=self.stop).close()
        self.save(moved(rec, "watching" if outcome.exit == 0 else "paused",
                        outcome.reason or f"{outcome.serving} serves", self.clock()))
        self.say(f"maintenance window: {outcome.result}: {outcome.reason or outcome.serving}")
        return outcome.to_dict()

    def _open_window(self, rec: Record, active: Active, steps: Steps) -> dict[str, Any]:
        steps.j.event("front", f"{active.ref.route_id}: {rec.reason}; the front answers 503")
        try:
            self.front.maintenance(f"{active.ref.stack} engine died; recreating it",
                                   self.policy.retry_after_s, wait=False)
        except FrontError as e:
            steps.j.event("front", str(e), level="error")
            return {"result": "failed", "exit": 1, "reason": str(e)}
        self.save(rec)
        return {"result": "window-open", "exit": 0, "reason": rec.reason}

    def _reroute(self, rec: Record, active: Active, steps: Steps) -> dict[str, Any]:
        ref = active.ref
        try:
            steps.answers(ref)
            self.front.serve(ref)
        except Failure as e:
            steps.j.event("reroute", e.reason, level="error")
            return {"result": "failed", "exit": 1, "reason": e.reason}
        cut = rec.unnoted()
        reason = (f"rerouted: {ref.route_id} was up and answering while the front routed away"
                  + (f" (after a recreation cut short; the engine had died: {cut.reason})"
                     if cut else ""))
        self.note("rerouted", ref, active, reason, gate=active.snapshot_gate())
        self.save(moved(rec.noted(), "watching", f"{ref.route_id} serves", self.clock()))
        steps.j.event("reroute", f"front routed to {ref.route_id}")
        return {"result": "rerouted", "exit": 0, "serving": ref.route_id, "reason": reason}

    def _record(self, rec: Record, active: Active, steps: Steps) -> dict[str, Any]:
        """It serves, recreated by a supervisor that was killed before its ledger line."""
        ref, cut = active.ref, rec.unnoted()
        assert cut is not None
        reason = (f"recreated after the engine died: {cut.reason} (the supervisor that "
                  "recreated it was stopped before it recorded it)")
        self.note("recreated", ref, active, reason, gate=active.snapshot_gate(),
                  extra={"kept_log": cut.kept_log})
        done = replace(cut, result="recreated") if cut.result == "interrupted" else cut
        self.save(rec.noted(done if cut is rec.attempts[-1] else None))
        steps.j.event("record", reason)
        return {"result": "recorded", "exit": 0, "serving": ref.route_id, "reason": reason}

    def _record_image(self, rec: Record, active: Active, steps: Steps) -> dict[str, Any]:
        """Record the image id its verified container runs (a record from before image ids)."""
        ref = active.ref
        st = self.ops.container(ref.container)
        if st is None or not st.image_id or st.config_hash != ref.config_hash:
            return {"result": "skipped", "exit": 0, "reason": "its container changed"}
        written = write_active(self.lay, replace(active, ref=replace(ref, image_id=st.image_id)))
        reason = (f"recorded the verified image id {st.image_id[:19]} of {ref.route_id} (its "
                  "record was from before image ids were kept; the image it has served on)")
        self.note("recorded", written.ref, active, reason, gate=active.gate, active=True)
        steps.j.event("record", reason)
        self.save(rec)
        return {"result": "recorded", "exit": 0, "serving": ref.route_id, "reason": reason}

    def _give_up(self, rec: Record, active: Active, steps: Steps) -> dict[str, Any]:
        ref = active.ref
        kept = steps.keep_log(ref, self.lay.supervise_dir, self._log_name(rec))
        steps.j.event("give-up", rec.reason, level="error")
        steps.say_503(rec.reason, self.policy.retry_after_s)
        self.note("gave-up", None, active, rec.reason, attempted=ref, extra={
            "boot_failure": rec.boot_failure, "kept_log": kept,
            "recreations": len(rec.recent(self.clock(), self.policy.window_s)),
            "window_s": self.policy.window_s})
        # Recorded after the front and the ledger: killed before, the next one gives up again.
        self.save(rec.noted())
        self.say(rec.reason)
        return {"result": "gave-up", "exit": 2, "reason": rec.reason, "kept_log": kept}

    def _recreate(self, rec: Record, active: Active, steps: Steps) -> dict[str, Any]:
        ref, p = active.ref, self.policy
        n = len(rec.recent(self.clock(), p.window_s)) + 1
        kept = steps.keep_log(ref, self.lay.supervise_dir, self._log_name(rec))
        logs = sorted(self.lay.supervise_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)
        for path in logs[:-KEEP_LOGS]:
            path.unlink(missing_ok=True)
        attempt = Attempt(at=self.clock(), reason=rec.death, journal=steps.j.dir.name,
                          kept_log=kept)
        # Counted before anything changes: killed from here on, it still counts.
        self.save(replace(rec, attempts=(*rec.attempts, attempt)))
        steps.j.event("recreate", f"{ref.route_id}: {rec.reason}")
        t0 = self.ops.monotonic()
        try:
            steps.recreate(ref, f"{ref.stack} engine died; recreating it (attempt {n} of "
                           f"{p.limit})", p.retry_after_s, p.vram_timeout_s, p.ready_timeout_s)
        except Failure as e:
            return self._failed(active, steps, attempt, n, e, round(self.ops.monotonic() - t0, 1))
        seconds = round(self.ops.monotonic() - t0, 1)
        reason = f"recreated after the engine died: {rec.death}" + "".join(
            f"; {note}" for note in steps.image_notes)
        self.note("recreated", ref, active, reason, gate=active.snapshot_gate(), extra={
            "attempt": n, "limit": p.limit, "window_s": p.window_s, "seconds": seconds,
            "boot_failure": rec.boot_failure, "kept_log": kept,
            "image": "; ".join(steps.image_notes) or None})
        st = self.ops.container(ref.container)
        done = replace(self.rec, dead_since=None, death="", boot_failure=None,
                       next_attempt_at=None, unhealthy_since=None,
                       healthy_start=st.started_at if st else "")
        self.save(moved(done.noted(replace(attempt, result="recreated", seconds=seconds)),
                        "watching", f"{ref.route_id} serves (recreated after the engine died)",
                        self.clock()))
        steps.j.event("recreate", f"{ref.route_id} recreated and serving ({seconds:.1f}s)")
        self.say(f"{ref.route_id} {reason}")
        return {"result": "recreated", "exit": 0, "serving": ref.route_id, "reason": reason,
                "window_s": seconds}

    def _failed(self, active: Active, steps: Steps, attempt: Attempt, n: int, e: Failure,
                seconds: float) -> dict[str, Any]:
        """A recreation that failed (or was stopped): 503 stays, the next backoff from now."""
        limit, reason = self.policy.limit, e.reason
        result = "interrupted" if e.phase == "interrupted" else "failed"
        said = f"recreation {n} of {limit} {result}: {reason}"
        steps.j.event("recreate", said, level="error")
        self.note(result, None, active, f"recreation {n} of {limit} after the engine died "
                  f"({attempt.reason}) {result}: {reason}", attempted=active.ref,
                  extra={"phase": e.phase, "boot_failure": e.boot, "kept_log": attempt.kept_log})
        now = self.clock()
        after = replace(self.rec, dead_since=now, death=reason,
                        boot_failure=e.boot or self.rec.boot_failure)
        self.save(moved(after.noted(replace(attempt, result=result, detail=reason,
                                            seconds=seconds)), "backoff", said, now))
        return {"result": result, "exit": 1, "reason": reason, "phase": e.phase}

    def _log_name(self, rec: Record) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(rec.dead_since or self.clock()))
        return f"{rec.route_id or 'stack'}-{stamp}.log".replace("/", "-")
