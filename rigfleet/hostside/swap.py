"""The swap transaction: from the active (verified) stack to the desired one, or back.

Both stacks cannot hold the two 24 GB cards at once, so a swap is sequential, and runs on the
host (a transient systemd unit, not a child of the SSH session) so it completes or rolls back
even when the deploy's connection drops::

    lock -> stage checks (nothing changes yet; a refusal leaves the old stack serving)
         -> front: 503 + Retry-After
         -> every stack down -> wait until nvidia-smi shows the cards' memory released
         -> new stack up (recreated) -> ready? (fail fast when it dies; name the boot failure)
         -> gate (verify-stress) -> promote: active snapshot, front -> new, ledger
    any failure after the window opened:
         keep the new stack's log (and the gate report) -> new stack down -> memory released
         -> old stack up from its snapshot -> it answers -> front -> old -> ledger -> exit 1

The first activation (nothing active) has no rollback: a failure stops the new stack and the
front stays at 503 (exit 2). The same transaction serves a pin bump of one stack (new image,
new Genesis commit): the snapshot in ``/var/lib/rigfleet/active/compose.yaml`` is exactly what
served before. ``Ensure`` (boot, reroute) and ``adopt`` share the steps.

Everything with side effects comes in through ``Ops`` (docker, nvidia-smi, HTTP), a ``Front``
and a gate function, so the decisions are tested with fakes (tests/unit/test_swap_*.py)::

    outcome = Transaction(plan, Layout(), SystemOps(key), front, gate_fn, journal).run()
    outcome.exit        # 0 promoted, 1 rolled back (old serves), 2 failed, 3 locked
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from . import ledger
from .front import FrontError
from .gate import GateResult, GateRun
from .journal import Journal
from .layout import Layout
from .lock import HostLock, LockHeld
from .plan import Active, Plan, PlanError, StackRef, compose_hash
from .probe import pid_start_ticks
from .stackctl import (
    BootFailure,
    ContainerState,
    GpuMemory,
    classify_boot_failure,
    vram_free_enough,
)

EXIT_PROMOTED, EXIT_ROLLED_BACK, EXIT_FAILED, EXIT_LOCKED, EXIT_BAD_PLAN = 0, 1, 2, 3, 4
READY_POLL_S = 1.0
VRAM_POLL_S = 0.5
PROGRESS_EVERY_S = 15.0
LOG_LINES_KEPT = 2000
KEEP_JOURNALS = 50
_PROJECT_NAME = re.compile(r"^name:\s*['\"]?([A-Za-z0-9][A-Za-z0-9_.-]*)", re.M)


class Ops(Protocol):
    """The host as the transaction sees it (``stackctl.SystemOps``; fakes in tests)."""

    def image_present(self, ref: str) -> bool: ...
    def image_id(self, ref: str) -> str | None: ...
    def remove(self, name: str) -> str | None: ...
    def running(self) -> list[str]: ...
    def compose_check(self, file: str, project: str) -> str | None: ...
    def up(self, file: str, project: str) -> str | None: ...
    def down(self, file: str, project: str) -> str | None: ...
    def container(self, name: str) -> ContainerState | None: ...
    def logs(self, name: str, tail: int = 300) -> str: ...
    def gpus(self) -> list[GpuMemory]: ...
    def health(self, port: int, served: str) -> tuple[bool, str]: ...
    def chat(self, port: int, served: str) -> tuple[bool, str]: ...
    def sleep(self, seconds: float) -> None: ...
    def monotonic(self) -> float: ...


class FrontControl(Protocol):
    def serve(self, ref: StackRef, wait: bool = True) -> None: ...
    def maintenance(self, message: str, retry_after_s: int, wait: bool = True) -> None: ...
    def current(self) -> str | None: ...


GateFn = Callable[[GateRun, Callable[[str], None], Callable[[], bool]], GateResult]


class Failure(Exception):
    """A step failed; ``phase`` says which, ``reason`` says why (one line, for people)."""

    def __init__(self, phase: str, reason: str, boot: BootFailure | None = None,
                 gate: GateResult | None = None) -> None:
        super().__init__(reason)
        self.phase = phase
        self.reason = reason
        self.boot = boot
        self.gate = gate


@dataclass
class Outcome:
    """How a transaction ended (``result.json``; the deploy prints ``reason`` on failure).

    + result: ``promoted``, ``rolled-back`` (the old stack serves again), ``failed``
      (nothing verified serves), ``refused`` (nothing was changed), ``locked``
    + exit: the process's exit status (see ``EXIT_*``)
    + serving: the route the front ends on (``int8/<hash>``, ``maintenance``)
    """

    result: str
    exit: int
    kind: str = ""
    stack: str = ""
    reason: str = ""
    phase: str = ""
    serving: str | None = None
    gate: dict[str, Any] | None = None
    boot_failure: dict[str, str] | None = None
    kept_log: str | None = None
    window_s: float | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_active(lay: Layout) -> Active | None:
    """``active.json`` (None when nothing was ever verified on this host)."""
    try:
        data = json.loads(lay.active_json.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise PlanError(f"{lay.active_json}: unreadable ({e})") from None
    return Active.from_dict(data)


def write_active(lay: Layout, active: Active, compose_text: str) -> None:
    """Snapshot the verified compose file and record it as active (both atomic)."""
    lay.active_dir.mkdir(parents=True, exist_ok=True)
    tmp = lay.active_compose.with_name(".compose.yaml.tmp")
    tmp.write_text(compose_text)
    tmp.replace(lay.active_compose)
    tmp = lay.active_json.with_name(".active.json.tmp")
    tmp.write_text(json.dumps(active.to_dict(), indent=2, sort_keys=True) + "\n")
    tmp.replace(lay.active_json)


def project_of(compose_text: str) -> str | None:
    """The compose project's ``name:``."""
    m = _PROJECT_NAME.search(compose_text)
    return m.group(1) if m else None


def known_projects(lay: Layout, stacks_dir: Path | None = None) -> list[tuple[str, str]]:
    """(project, compose file) of the active snapshot and every rendered stack."""
    found: list[tuple[str, str]] = []
    files = [lay.active_compose] + sorted((stacks_dir or lay.root / "opt/rigfleet/stacks")
                                          .glob("*/compose.yaml"))
    for path in files:
        try:
            project = project_of(path.read_text())
        except OSError:
            continue
        if project and project not in {p for p, _ in found}:
            found.append((project, str(path)))
    return found


class _Steps:
    """Steps shared by the transaction, ``Ensure`` and ``adopt``."""

    def __init__(self, lay: Layout, ops: Ops, front: FrontControl, journal: Journal,
                 interrupted: Callable[[], bool] = lambda: False) -> None:
        self.lay = lay
        self.ops = ops
        self.front = front
        self.j = journal
        self.interrupted = interrupted

    def check_interrupt(self) -> None:
        if self.interrupted():
            raise Failure("interrupted", "the transaction was asked to stop (SIGTERM)")

    def stop(self, projects: list[tuple[str, str]]) -> None:
        """``docker compose down`` every project (one that has no container is a no-op), then
        remove any container still holding a stack's name: one started by hand (``docker
        run --name rigfleet-int8``) is no compose project's, holds the cards and the name."""
        done: set[str] = set()
        for project, file in projects:
            if project in done or not Path(file).exists():
                continue
            done.add(project)
            self.j.event("stop", f"docker compose down {project}")
            err = self.ops.down(file, project)
            if err:
                raise Failure("stop", f"docker compose down {project} failed: {err}")
        # A stack's container is named as its project (rigfleet/catalog.py: rigfleet-<name>).
        for name in sorted(done):
            if self.ops.container(name) is not None:
                self.j.event("stop", f"removing container {name}: it is not from its compose "
                             "project (started by hand?)", level="warning")
                err = self.ops.remove(name)
                if err:
                    raise Failure("stop", f"docker rm {name} failed: {err}")

    def wait_vram(self, utilization: float, timeout_s: float) -> float:
        """Until every card has ``utilization`` x total free, twice in a row (settled)."""
        t0 = self.ops.monotonic()
        good, detail, last_note = 0, "", t0
        while True:
            self.check_interrupt()
            try:
                ok, detail = vram_free_enough(self.ops.gpus(), utilization)
            except ValueError as e:
                ok, detail = False, str(e)
            good = good + 1 if ok else 0
            now = self.ops.monotonic()
            if good >= 2:
                self.j.event("vram", f"GPU memory released ({detail}) after {now - t0:.1f}s")
                return now - t0
            if now - t0 > timeout_s:
                others = ", ".join(self.ops.running()) or "none"
                raise Failure("vram", f"GPU memory not released within {timeout_s:g}s "
                              f"({detail}); need {utilization:g} of each card free; running "
                              f"containers: {others}")
            if now - last_note > PROGRESS_EVERY_S:
                self.j.event("vram", f"waiting for GPU memory: {detail}")
                last_note = now
            self.ops.sleep(VRAM_POLL_S)

    def start(self, ref: StackRef, compose_file: str) -> None:
        self.j.event("start", f"docker compose up {ref.project} (recreated) from {compose_file}")
        err = self.ops.up(compose_file, ref.project)
        if err:
            boot = classify_boot_failure(err)
            raise Failure("start", f"docker compose up {ref.project} failed: {err}", boot=boot)

    def wait_ready(self, ref: StackRef, timeout_s: float) -> float:
        """Until ``/health`` and ``/v1/models`` answer; fail fast when the container dies."""
        t0 = self.ops.monotonic()
        first = self.ops.container(ref.container)
        if first is None:
            raise Failure("boot", f"container {ref.container} does not exist after compose up")
        restarts = first.restarts
        last_note, detail = t0, ""
        while True:
            self.check_interrupt()
            st = self.ops.container(ref.container)
            if st is None or st.status in ("exited", "dead", "restarting") \
                    or st.restarts > restarts or st.oom_killed:
                raise self._died(ref, st)
            ok, detail = self.ops.health(ref.port, ref.served_model_name)
            now = self.ops.monotonic()
            if ok:
                self.j.event("ready", f"{ref.stack} ready after {now - t0:.1f}s")
                return now - t0
            if now - t0 > timeout_s:
                boot = classify_boot_failure(self.ops.logs(ref.container, 400))
                raise Failure("ready", f"{ref.stack} not ready after {timeout_s:g}s ({detail})"
                              + (f"; its log shows {boot}" if boot else ""), boot=boot)
            if now - last_note > PROGRESS_EVERY_S:
                self.j.event("ready", f"waiting for {ref.stack}: {detail}")
                last_note = now
            self.ops.sleep(READY_POLL_S)

    def _died(self, ref: StackRef, st: ContainerState | None) -> Failure:
        log = self.ops.logs(ref.container, 400)
        boot = classify_boot_failure(log)
        if st is None:
            how = "disappeared while booting"
        elif st.status in ("exited", "dead"):
            how = (f"died while booting (exit code {st.exit_code}"
                   + (", OOM-killed" if st.oom_killed else "") + ")")
        else:  # its restart policy brought it back: it died at least once
            how = f"died while booting (Docker restarted it, {st.status} now)"
        cause = str(boot) if boot else "no known boot failure in its log; last lines: " + \
            " | ".join(line.strip() for line in log.strip().splitlines()[-3:])
        return Failure("boot", f"{ref.stack} {how}: {cause}", boot=boot)

    def keep_log(self, ref: StackRef, directory: Path) -> str | None:
        if self.ops.container(ref.container) is None:
            return None  # it never started (the failure came before)
        text = self.ops.logs(ref.container, LOG_LINES_KEPT)
        if not text.strip():
            return None
        path = directory / f"{ref.stack}-{ref.config_hash}.log"
        path.write_text(text)
        return str(path)

    def answers(self, ref: StackRef) -> None:
        ok, detail = self.ops.chat(ref.port, ref.served_model_name)
        if not ok:
            raise Failure("answer", f"{ref.stack} is up but does not answer: {detail}")
        self.j.event("answer", f"{ref.stack} answers a chat completion")


class Transaction(_Steps):
    """One swap (see the module docstring)."""

    def __init__(self, plan: Plan, lay: Layout, ops: Ops, front: FrontControl, gate: GateFn,
                 journal: Journal, interrupted: Callable[[], bool] = lambda: False,
                 lock: HostLock | None = None) -> None:
        super().__init__(lay, ops, front, journal, interrupted)
        self.plan = plan
        self.gate_fn = gate
        self.lock = lock or HostLock(lay)
        self.dir = lay.swap_dir(plan.id)
        self.timings: dict[str, float] = {}

    # -- entry --------------------------------------------------------------------------------

    def run(self) -> Outcome:
        plan = self.plan
        self.j.event("lock", f"taking the host lock for {plan.by}: {plan.why}")
        try:
            note = self.lock.acquire(plan.by, plan.why, plan.id)
        except LockHeld as held:
            outcome = Outcome("locked", EXIT_LOCKED, stack=plan.desired.stack,
                              reason=f"{plan.host or 'host'}: {held}", phase="lock")
            self.j.event("lock", outcome.reason, level="error")
            self.j.finish(outcome.to_dict())
            return outcome
        try:
            if note:
                self.j.event("lock", note, level="warning")
                mark_interrupted(self.lay, self.j, exclude=plan.id)
            prune_journals(self.lay)
            outcome = self._run()
        except Exception as e:  # a bug must still end with a result and a released lock
            outcome = Outcome("failed", EXIT_FAILED, stack=plan.desired.stack, phase="internal",
                              reason=f"internal error: {type(e).__name__}: {e}",
                              serving=self.front.current())
            self.j.event("internal", outcome.reason, level="error")
        finally:
            self.lock.release()
        outcome.timings = self.timings
        self.j.event("done", f"{outcome.result}: {outcome.reason or outcome.serving}",
                     level="info" if outcome.exit == 0 else "error")
        self.j.finish(outcome.to_dict())
        # "last_swap": what rigfleet.bump.rollout reads (with its "gate" and "reason").
        ledger.update_state(self.lay, last_swap={
            "id": plan.id, "kind": outcome.kind, "result": outcome.result,
            "reason": outcome.reason, "at": ledger.now_iso(), "stack": plan.desired.stack,
            "serving": outcome.serving, "gate": outcome.gate,
            "boot_failure": outcome.boot_failure})
        return outcome

    # -- the story ----------------------------------------------------------------------------

    def _run(self) -> Outcome:
        plan, new = self.plan, self.plan.desired
        active = read_active(self.lay)
        old = active.ref if active else None
        kind = "activate" if old is None else "swap" if old.stack != new.stack else "update"
        self.j.event("plan", f"{kind}: {old.route_id if old else 'nothing'} -> {new.route_id}")
        try:
            staged = self._stage(new, old)
        except Failure as f:
            self.j.event("stage", f.reason, level="error")
            return Outcome("refused", EXIT_ROLLED_BACK if old else EXIT_FAILED, kind, new.stack,
                           f"refused before any change: {f.reason}", f.phase,
                           serving=self.front.current())
        t_window = self.ops.monotonic()
        try:
            self.front.maintenance(
                f"{kind} {old.stack if old else 'nothing'} -> {new.stack} in progress",
                plan.retry_after_s)
        except FrontError as e:
            return Outcome("refused", EXIT_ROLLED_BACK if old else EXIT_FAILED, kind, new.stack,
                           f"refused before any change: {e}", "front",
                           serving=self.front.current())
        self.j.event("front", f"maintenance: 503 + Retry-After {plan.retry_after_s}s")
        gate: GateResult | None = None
        try:
            t = self.ops.monotonic()
            self.stop(self._teardown(old, staged))
            self.timings["stop_s"] = self.ops.monotonic() - t
            self.timings["vram_s"] = self.wait_vram(new.gpu_memory_utilization,
                                                    plan.vram_timeout_s)
            self.check_interrupt()
            t = self.ops.monotonic()
            self.start(new, staged)
            self.timings["up_s"] = self.ops.monotonic() - t
            self.timings["ready_s"] = self.wait_ready(new, plan.ready_timeout_s)
            gate = self._gate(new)
            if not gate.passed:
                raise Failure("gate", self._gate_reason(gate), gate=gate)
            self._promote(new, staged, gate, old, kind)
        except Failure as f:
            return self._rollback(kind, old, new, staged, f, t_window)
        except Exception as e:  # a bug inside the window: still go back to what served
            failure = Failure("internal", f"internal error: {type(e).__name__}: {e}")
            return self._rollback(kind, old, new, staged, failure, t_window)
        window = self.ops.monotonic() - t_window
        self.timings["window_s"] = window
        self.j.event("promote", f"{new.route_id} serves (503 window {window:.1f}s)")
        return Outcome("promoted", EXIT_PROMOTED, kind, new.stack, "", "promote",
                       serving=new.route_id, gate=gate.record() if gate else None,
                       window_s=window)

    def _stage(self, new: StackRef, old: StackRef | None) -> str:
        """Checks that change nothing: the staged compose file is the one the deploy rendered
        (copied aside, so a concurrent deploy cannot change it under us), it parses, the
        images are here, and the old stack's snapshot exists (a rollback needs it)."""
        try:
            text = Path(new.compose_file).read_text()
        except OSError as e:
            raise Failure("stage", f"{new.compose_file} cannot be read ({e.strerror})") from None
        found = compose_hash(text)
        if found != new.config_hash:
            raise Failure("stage", f"{new.compose_file} has config hash {found}, the plan "
                          f"expects {new.config_hash} (did another deploy render it since?)")
        staged = self.dir / "compose.yaml"
        staged.write_text(text)
        err = self.ops.compose_check(str(staged), new.project)
        if err:
            raise Failure("stage", f"docker compose config refuses {new.compose_file}: {err}")
        if not self.ops.image_present(new.image_ref):
            raise Failure("stage", f"image {new.image_ref} is not on the host (not staged)")
        if old is not None:
            if not Path(old.compose_file).exists():
                raise Failure("stage", f"the active stack's snapshot {old.compose_file} is "
                              "missing: a failed swap could not roll back")
            if not self.ops.image_present(old.image_ref):
                raise Failure("stage", f"the active stack's image {old.image_ref} is gone: a "
                              "failed swap could not roll back")
        self.j.event("stage", f"{new.stack} staged: compose file checked, image present")
        return str(staged)

    def _teardown(self, old: StackRef | None, staged: str) -> list[tuple[str, str]]:
        projects = [(old.project, old.compose_file)] if old else []
        projects.append((self.plan.desired.project, staged))
        projects += [p for p in self.plan.projects]
        return projects

    def _gate(self, new: StackRef) -> GateResult:
        self.check_interrupt()
        plan = self.plan
        self.j.event("gate", f"verify-stress gate, profile {plan.gate_profile}, against "
                     f"{new.stack} on 127.0.0.1:{new.port}")
        run = GateRun(url=f"http://127.0.0.1:{new.port}", key_file=self.lay.api_key_file,
                      profile=plan.gate_profile, report_dir=self.lay.reports_dir,
                      sets=plan.gate_set, timeout_s=plan.gate_timeout_s)

        def on_line(line: str) -> None:
            if line.strip() and set(line.strip()) - set(".0123456789 "):
                self.j.event("gate", line.strip())

        t = self.ops.monotonic()
        result = self.gate_fn(run, on_line, self.interrupted)
        self.timings["gate_s"] = self.ops.monotonic() - t
        self.j.event("gate", f"{result.result}: {result.summary}; report {result.report_json}",
                     level="info" if result.passed else "error")
        return result

    @staticmethod
    def _gate_reason(gate: GateResult) -> str:
        if gate.result == "error":
            return f"the gate could not decide: {gate.summary}"
        # The per-check details stay in the report and the ledger's gate record.
        return (f"gate failed {len(gate.failed_checks)} check(s): "
                f"{', '.join(gate.failed_checks)}; report {gate.report_json}")

    def _promote(self, new: StackRef, staged: str, gate: GateResult, old: StackRef | None,
                 kind: str) -> None:
        plan = self.plan
        snapshot = StackRef(**{**new.to_dict(), "compose_file": str(self.lay.active_compose)})
        previous = (self.lay.active_json.read_text(), self.lay.active_compose.read_text()) \
            if old is not None and self.lay.active_json.exists() else None
        # Record first, then switch: a crash between the two leaves "active" pointing at the
        # running, verified stack, and the boot-time ensure routes the front to it.
        write_active(self.lay, Active(snapshot, ledger.now_iso(), plan.id, plan.by,
                                      gate.record()), Path(staged).read_text())
        try:
            self.front.serve(snapshot)
        except FrontError as e:
            if previous is not None:
                self.lay.active_json.write_text(previous[0])
                self.lay.active_compose.write_text(previous[1])
            else:
                self.lay.active_json.unlink(missing_ok=True)
            raise Failure("front", f"the front could not be switched to {new.stack}: {e}",
                          gate=gate) from None
        ledger.append(self.lay, ledger.entry(
            kind, "promoted", snapshot, host=plan.host, by=plan.by, deploy_id=plan.id,
            gate=gate.record(), previous=old))
        ledger.update_state(self.lay, **ledger.stack_fields(snapshot), since=ledger.now_iso(),
                            by=plan.by, deploy_id=plan.id, gate=gate.record())

    def _rollback(self, kind: str, old: StackRef | None, new: StackRef, staged: str,
                  failure: Failure, t_window: float) -> Outcome:
        plan = self.plan
        gate = failure.gate.record() if failure.gate else None
        boot = asdict(failure.boot) if failure.boot else None
        target = old.stack if old else "nothing (first activation)"
        self.j.event("rollback", f"{failure.phase} failed: {failure.reason}; back to {target}",
                     level="error")
        kept = self.keep_log(new, self.dir)
        if kept:
            self.j.event("rollback", f"kept {new.stack}'s log in {kept}")
        line = dict(attempted=new, host=plan.host, by=plan.by, deploy_id=plan.id, gate=gate,
                    reason=failure.reason,
                    extra={"phase": failure.phase, "boot_failure": boot, "kept_log": kept})
        outcome = Outcome("failed", EXIT_FAILED, kind, new.stack, failure.reason, failure.phase,
                          gate=gate, boot_failure=boot, kept_log=kept)
        try:
            self.interrupted = lambda: False  # a stop request must not stop the way back
            self.stop([(new.project, staged)])
            if old is None:
                self.front.maintenance("no verified stack is serving", plan.retry_after_s)
                outcome.serving = "maintenance"
                ledger.append(self.lay, ledger.entry(kind, "failed", None, **line))
                return outcome
            self.wait_vram(old.gpu_memory_utilization, plan.vram_timeout_s)
            self.start(old, old.compose_file)
            self.wait_ready(old, plan.ready_timeout_s)
            self.answers(old)
            self.front.serve(old)
        except (Failure, FrontError) as f2:
            reason = getattr(f2, "reason", str(f2))
            outcome.reason = f"{failure.reason}; rollback failed too: {reason}"
            outcome.serving = self.front.current()
            self.j.event("rollback", f"rollback failed: {reason}", level="error")
            ledger.append(self.lay, ledger.entry(kind, "failed", None, **{
                **line, "previous": old, "reason": outcome.reason}))
            return outcome
        window = self.ops.monotonic() - t_window
        self.j.event("rollback", f"{old.route_id} serves again (503 window {window:.1f}s)")
        ledger.append(self.lay, ledger.entry(kind, "rolled-back", old, **line))
        outcome.result, outcome.exit = "rolled-back", EXIT_ROLLED_BACK
        outcome.serving, outcome.window_s = old.route_id, window
        return outcome


def prune_journals(lay: Layout, keep: int = KEEP_JOURNALS) -> list[str]:
    """Drop the oldest finished journals (transactions, ensure and shutdown runs) beyond
    ``keep``; ones without a result are never dropped (``mark_interrupted`` needs them)."""
    if not lay.swaps_dir.exists():
        return []
    done = sorted((d for d in lay.swaps_dir.iterdir() if (d / "result.json").exists()),
                  key=lambda d: (d / "result.json").stat().st_mtime)
    dropped = []
    for directory in done[:-keep] if len(done) > keep else []:
        for child in sorted(directory.iterdir()):
            child.unlink(missing_ok=True)
        directory.rmdir()
        dropped.append(directory.name)
    return dropped


def mark_interrupted(lay: Layout, journal: Journal, exclude: str = "") -> list[str]:
    """Transactions that died without a result (killed, host rebooted): give each a result
    and a ledger line, so the ledger never leaves one hanging."""
    found = []
    for directory in sorted(lay.swaps_dir.glob("*")) if lay.swaps_dir.exists() else []:
        if directory.name == exclude or not (directory / "pid.json").exists() \
                or not (directory / "plan.json").exists():
            continue
        state = Journal.read(directory, since=10**9)
        if state["state"] != "died":
            continue
        found.append(directory.name)
        result = {"result": "interrupted", "exit": EXIT_FAILED, "reason":
                  "the transaction's process ended without a result (killed or rebooted)"}
        (directory / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        try:
            plan = Plan.load(directory / "plan.json")
            tried, by = plan.desired, plan.by
        except PlanError:
            tried, by = None, ""
        try:
            active = read_active(lay)
        except PlanError:
            active = None
        # What serves next is the active (verified) stack: Ensure brings it back.
        ledger.append(lay, ledger.entry("interrupted", "interrupted",
                                        active.ref if active else None, attempted=tried,
                                        deploy_id=directory.name, by=by,
                                        reason=result["reason"]))
        journal.event("recover", f"transaction {directory.name} was interrupted; recorded")
    return found


def boot_time() -> float:
    """The epoch second this system booted: when its PID 1 started (``btime`` of /proc/stat
    plus PID 1's start). The same as the kernel's boot on a machine, and right in a container
    that runs systemd (the simulated hosts), whose "reboot" keeps the kernel's ``btime``."""
    try:
        btime = next(float(line.split()[1]) for line in
                     Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return 0.0
    ticks = pid_start_ticks(1)
    return btime + (ticks / os.sysconf("SC_CLK_TCK") if ticks else 0.0)


def docker_time(text: str) -> float | None:
    """``2026-11-29T10:00:01.123456789Z`` -> epoch seconds (None when unparseable)."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?", text.strip())
    if not m:
        return None
    tz = m.group(3) or "Z"
    stamp = m.group(1) + ("+00:00" if tz == "Z" else tz)
    return datetime.fromisoformat(stamp).timestamp()


class Ensure(_Steps):
    """The active stack serves, in a container created since this boot (``rigfleet-stack``
    runs it at boot; the deploy runs it when the front's route is not the active stack).

    A container from before a reboot keeps Genesis' text patches in its writable layer; it is
    recreated, never restarted. Nothing is gated: the snapshot is what passed the gate.
    """

    def __init__(self, lay: Layout, ops: Ops, front: FrontControl, journal: Journal,
                 who: str, why: str, retry_after_s: int = 30, ready_timeout_s: float = 1200.0,
                 vram_timeout_s: float = 120.0, booted_at: float | None = None,
                 lock: HostLock | None = None) -> None:
        super().__init__(lay, ops, front, journal)
        self.who, self.why = who, why
        self.retry_after_s = retry_after_s
        self.ready_timeout_s = ready_timeout_s
        self.vram_timeout_s = vram_timeout_s
        self.booted_at = boot_time() if booted_at is None else booted_at
        self.lock = lock or HostLock(lay)

    def run(self) -> Outcome:
        try:
            note = self.lock.acquire(self.who, self.why)
        except LockHeld as held:
            self.j.event("lock", str(held), level="error")
            return Outcome("locked", EXIT_LOCKED, "ensure", reason=str(held), phase="lock")
        try:
            if note:
                self.j.event("lock", note, level="warning")
            mark_interrupted(self.lay, self.j)
            return self._run()
        except (Failure, FrontError) as f:
            reason = f.reason if isinstance(f, Failure) else str(f)
            self.j.event("ensure", reason, level="error")
            ledger.append(self.lay, ledger.entry("ensure", "failed", None, by=self.who,
                                                 reason=reason))
            return Outcome("failed", EXIT_FAILED, "ensure", reason=reason,
                           phase=getattr(f, "phase", "front"), serving=self.front.current())
        finally:
            self.lock.release()

    def _run(self) -> Outcome:
        active = read_active(self.lay)
        if active is None:
            self.front.maintenance("no verified stack on this host yet", self.retry_after_s,
                                   wait=False)
            self.j.event("ensure", "nothing was ever verified here: the front answers 503")
            return Outcome("failed", EXIT_FAILED, "ensure", reason="no active stack",
                           serving="maintenance")
        ref = active.ref
        st = self.ops.container(ref.container)
        created = docker_time(st.created) if st else None
        # Its container must be this boot's, from the snapshot's config and image (a compose
        # file edited by hand keeps the labels, not the image).
        image = self.ops.image_id(ref.image_ref)
        fresh = (st is not None and st.running and st.config_hash == ref.config_hash
                 and created is not None and created >= self.booted_at
                 and (not st.image_id or image is None or st.image_id == image))
        if fresh:
            self.wait_ready(ref, self.ready_timeout_s)
            if self.front.current() == ref.route_id:
                self.j.event("ensure", f"{ref.route_id} already serves")
                return Outcome("noop", EXIT_PROMOTED, "ensure", ref.stack, serving=ref.route_id)
            self.front.serve(ref)
            self.j.event("ensure", f"front routed to {ref.route_id}")
            return Outcome("rerouted", EXIT_PROMOTED, "ensure", ref.stack, serving=ref.route_id)
        t0 = self.ops.monotonic()
        if st is None:
            why = "its container is gone"
        elif not st.running:
            why = f"its container is {st.status}"
        elif st.config_hash != ref.config_hash or (st.image_id and image
                                                   and st.image_id != image):
            why = "its container is not the snapshot's (other config or image)"
        else:
            why = ("its container is from before this boot (Genesis patches live in the "
                   "container's writable layer: recreate, never restart)")
        self.j.event("ensure", f"recreating {ref.route_id}: {why}")
        self.front.maintenance(f"recreating {ref.stack}", self.retry_after_s, wait=False)
        self.stop(known_projects(self.lay))
        self.wait_vram(ref.gpu_memory_utilization, self.vram_timeout_s)
        self.start(ref, ref.compose_file)
        self.wait_ready(ref, self.ready_timeout_s)
        self.answers(ref)
        self.front.serve(ref)
        window = self.ops.monotonic() - t0
        ledger.append(self.lay, ledger.entry(
            "ensure", "recreated", ref, by=self.who, deploy_id=active.deploy_id,
            gate={**active.gate, "note": f"verified at promotion {active.since}"},
            reason=self.why))
        self.j.event("ensure", f"{ref.route_id} recreated and serving ({window:.1f}s)")
        return Outcome("recreated", EXIT_PROMOTED, "ensure", ref.stack, serving=ref.route_id,
                       window_s=window)


def adopt(plan: Plan, lay: Layout, ops: Ops, front: FrontControl, journal: Journal) -> Outcome:
    """Record a stack that already serves (a host converged before swaps were recorded): its
    running container must carry the plan's config hash and answer; nothing restarts."""
    new = plan.desired
    lock = HostLock(lay)
    try:
        lock.acquire(plan.by, f"adopt {new.route_id}", plan.id)
    except LockHeld as held:
        return Outcome("locked", EXIT_LOCKED, "adopt", new.stack, str(held), "lock")
    steps = _Steps(lay, ops, front, journal)
    try:
        st = ops.container(new.container)
        if st is None or not st.running or st.config_hash != new.config_hash:
            raise Failure("adopt", f"{new.container} is not running with config hash "
                          f"{new.config_hash} ({st})")
        steps.wait_ready(new, plan.ready_timeout_s)
        text = Path(new.compose_file).read_text()
        if compose_hash(text) != new.config_hash:
            raise Failure("adopt", f"{new.compose_file} is not the running configuration")
        snapshot = StackRef(**{**new.to_dict(), "compose_file": str(lay.active_compose)})
        gate = {"result": "not-run", "note": "adopted: it served before rigfleet recorded swaps"}
        write_active(lay, Active(snapshot, ledger.now_iso(), plan.id, plan.by, gate), text)
        front.serve(snapshot)
        ledger.append(lay, ledger.entry("adopt", "adopted", snapshot, host=plan.host,
                                        by=plan.by, deploy_id=plan.id, gate=gate))
        ledger.update_state(lay, **ledger.stack_fields(snapshot), since=ledger.now_iso(),
                            by=plan.by, deploy_id=plan.id, gate=gate)
        journal.event("adopt", f"{new.route_id} recorded as active; the front routes to it")
        return Outcome("adopted", EXIT_PROMOTED, "adopt", new.stack, serving=new.route_id)
    except (Failure, FrontError, OSError) as e:
        reason = getattr(e, "reason", str(e))
        journal.event("adopt", reason, level="error")
        return Outcome("failed", EXIT_FAILED, "adopt", new.stack, reason, "adopt",
                       serving=front.current())
    finally:
        lock.release()


def shutdown(lay: Layout, ops: Ops, front: FrontControl, journal: Journal,
             retry_after_s: int = 30) -> None:
    """Before the machine goes down: the front to 503 (so nginx starts in maintenance at
    boot, never proxying to a stack that is not up yet), then every stack down (so Docker does
    not restart a container with an old writable layer at boot)."""
    try:
        front.maintenance("host restarting", retry_after_s, wait=False)
    except FrontError as e:
        journal.event("shutdown", f"front: {e}", level="warning")
    for project, file in known_projects(lay):
        journal.event("shutdown", f"docker compose down {project}")
        err = ops.down(file, project)
        if err:
            journal.event("shutdown", err, level="warning")


def record_pins(lay: Layout, tracked: dict[str, Any], config_hash: str, by: str = "",
                deploy_id: str = "", host: str = "") -> str:
    """Record pins that changed without a swap (driver branch, toolkit, pins serial) in
    ``state.json``, the active record and the ledger (``event: "pins"``); returns
    ``recorded`` or ``unchanged``. Refuses (``PlanError``) when the active stack is not the
    one the deploy rendered: only a swap may change what runs."""
    lock = HostLock(lay)
    lock.acquire(by or "unknown", "record pins", deploy_id)
    try:
        active = read_active(lay)
        if active is None or active.ref.config_hash != config_hash \
                or active.ref.stack != tracked.get("stack"):
            raise PlanError(f"the active stack is {active.ref.route_id if active else 'none'}, "
                            f"not {tracked.get('stack')}/{config_hash}: not recording its pins")
        state = ledger.read_state(lay)
        if all(state.get(k) == v for k, v in tracked.items()) \
                and active.ref.record == {**active.ref.record, **tracked}:
            return "unchanged"
        previous = {k: state.get(k) for k in tracked}
        ref = StackRef(**{**active.ref.to_dict(), "record": {**active.ref.record, **tracked}})
        write_active(lay, Active(ref, active.since, active.deploy_id, active.by, active.gate),
                     lay.active_compose.read_text())
        ledger.update_state(lay, **tracked, since=ledger.now_iso(), by=by)
        ledger.append(lay, ledger.entry("pins", "recorded", ref, host=host, by=by,
                                        deploy_id=deploy_id, gate=active.gate,
                                        extra={"previous": previous}))
        return "recorded"
    finally:
        lock.release()
