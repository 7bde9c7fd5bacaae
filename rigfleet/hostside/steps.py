"""The steps the swap transaction, ``Ensure``, ``adopt``, the supervisor and maintenance share,
and this host's measured 503 windows (``timings.json``: what ``Retry-After`` says)::

    window_estimate(read_timings(lay), "int8", busy=True, fallback_s=30)   # Estimate(24, "...")
    record_swap(lay, "int8", boot_s=4.1, gate_s=12.0, window_s=25.0, drain=report)
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from .atomic import write_json
from .drain import DRAIN_POLL_S, Drainer, DrainReport, parse_load
from .gate import GateResult, GateRun
from .journal import Journal
from .layout import Layout
from .plan import Plan, StackRef
from .records import Coded, read_json, read_text
from .stackctl import (
    BootFailure,
    ContainerState,
    SystemOps,
    classify_boot_failure,
    missing_boot_lines,
    vram_free_enough,
)

EXIT_PROMOTED, EXIT_ROLLED_BACK, EXIT_FAILED, EXIT_LOCKED, EXIT_BAD_PLAN = 0, 1, 2, 3, 4
# A host fault that may pass (a full disk): nothing changed; the stack unit tries again.
EXIT_RETRY = 75
# How long the stack unit's ensure and shutdown wait for a lock-holding transaction.
LOCK_WAIT_S = 60.0
READY_POLL_S = 1.0
VRAM_POLL_S = 0.5
# nvidia-smi failing this long in a row while waiting for GPU memory: no driver.
DRIVER_GRACE_S = 10.0
PROGRESS_EVERY_S = 15.0
LOG_LINES_KEPT = 2000
_PROJECT_NAME = re.compile(r"^name:\s*['\"]?([A-Za-z0-9][A-Za-z0-9_.-]*)", re.M)


# The host as the steps see it (tests pass fakes with the same methods).
Ops = SystemOps


class FrontControl(Protocol):
    def serve(self, ref: StackRef, wait: bool = True) -> None: ...
    def maintenance(self, message: str, retry_after_s: int, wait: bool = True) -> None: ...
    def current(self) -> str | None: ...


GateFn = Callable[[GateRun, Callable[[str], None], Callable[[], bool]], GateResult]


class Failure(Exception):
    """A step failed; ``phase`` says which, ``reason`` says why (one line, for people);
    ``boot`` and ``gate``: what the step found, as the records say it (None: nothing)."""

    def __init__(self, phase: str, reason: str, boot: BootFailure | None = None,
                 gate: GateResult | None = None) -> None:
        super().__init__(reason)
        self.phase = phase
        self.reason = reason
        self.boot = asdict(boot) if boot else None
        self.gate = gate.record() if gate else None


@dataclass
class Outcome(Coded):
    """How a transaction ended (``result.json``): ``promoted``, ``rolled-back``, ``failed``
    (nothing verified serves), ``refused`` (nothing was changed) or ``locked``."""

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
    drain: dict[str, Any] | None = None
    retry_after_s: int | None = None


def known_projects(lay: Layout) -> list[tuple[str, str]]:
    """(project, compose file) of the active snapshot and every rendered stack."""
    found: dict[str, str] = {}
    for path in [lay.active_compose, *sorted(lay.stacks_dir.glob("*/compose.yaml"))]:
        if m := _PROJECT_NAME.search(read_text(path) or ""):
            found.setdefault(m.group(1), str(path))
    return list(found.items())


def fs_problem(e: OSError) -> str:
    """``OSError`` -> "<file>: <why>"."""
    return f"{e.filename or 'the disk'}: {e.strerror or e}"


def local_name(ref: StackRef) -> str:
    """The local ``<repo>:<tag>`` a stack's compose file runs."""
    return ref.image_ref.split("@", 1)[0]


def short_id(image: str) -> str:
    """``sha256:0123456789ab...`` -> ``sha256:0123456789ab``."""
    return image[:19] if image.startswith("sha256:") else image


class Steps:
    """Steps shared by the transaction, ``Ensure`` and ``adopt``."""

    def __init__(self, lay: Layout, ops: Ops, front: FrontControl, journal: Journal,
                 interrupted: Callable[[], bool] = lambda: False) -> None:
        self.lay = lay
        self.ops = ops
        self.front = front
        self.j = journal
        self.interrupted = interrupted
        # Local tags ``pin_image`` moved back (for the ledger line).
        self.image_notes: list[str] = []

    def check_interrupt(self) -> None:
        if self.interrupted():
            raise Failure("interrupted", "the transaction was asked to stop (SIGTERM)")

    def stop(self, projects: list[tuple[str, str]]) -> None:
        """``docker compose down`` every project, then remove a container started by hand."""
        done: set[str] = set()
        for project, file in projects:
            if project in done or not Path(file).exists():
                continue
            done.add(project)
            self.j.event("stop", f"docker compose down {project}")
            if err := self.ops.down(file, project):
                raise Failure("stop", f"docker compose down {project} failed: {err}")
        # A stack's container is named as its project (rigfleet/catalog.py: rigfleet-<name>).
        for name in sorted(done):
            if self.ops.container(name) is not None:
                self.j.event("stop", f"removing container {name}: it is not from its compose "
                             "project (started by hand?)", level="warning")
                if err := self.ops.remove(name):
                    raise Failure("stop", f"docker rm {name} failed: {err}")

    def say_503(self, message: str, retry_after_s: int, level: str = "error") -> None:
        """The front to 503 saying ``message``, not waiting; a front that cannot is said."""
        try:
            self.front.maintenance(message, retry_after_s, wait=False)
        except Failure as e:  # the front's FrontError
            self.j.event("front", str(e), level=level)

    def holds_requests(self, ref: StackRef | None) -> bool:
        """``ref`` holds requests now: its drain will take a while."""
        if ref is None:
            return False
        load = parse_load(self.ops.metrics(ref.port))
        return bool(load is not None and load.busy) or bool(self.ops.front_draining())

    def drain_requests(self, ref: StackRef | None, timeout_s: float, message: str,
                       said: Estimate, rest: Estimate,
                       stoppable: bool = False) -> DrainReport | None:
        """Wait up to ``timeout_s`` for what the front accepted before its 503 (``message``,
        which said ``said``); clients refused from then on are told the ``rest``."""
        self.j.event("front", f"maintenance: new requests get 503 + Retry-After "
                     f"{said.seconds}s ({said.basis})")
        if ref is None:
            return None
        d = Drainer(timeout_s)
        t0 = last_note = self.ops.monotonic()
        while True:
            now = self.ops.monotonic()
            if stoppable and self.interrupted():
                d.interrupt(now)
                break
            if d.observe(now, parse_load(self.ops.metrics(ref.port)), self.ops.front_draining()):
                break
            if now - last_note > PROGRESS_EVERY_S:
                load, front = d.latest
                self.j.event("drain", f"waiting for {load.busy if load else '?'} request(s) "
                             f"on {ref.stack}" + (f", {front} front worker(s)" if front else "")
                             + f" ({now - t0:.0f}s of {timeout_s:g}s)")
                last_note = now
            self.ops.sleep(DRAIN_POLL_S)
        report = d.report()
        self.j.event("drain", f"{ref.stack}: {report.line()}",
                     level="warning" if report.cut or report.result == "unknown" else "info")
        if report.waited_for_requests:  # drained, stale or timed out: never interrupted
            try:
                record_times(self.lay, drain_s=report.seconds)
            except OSError as e:  # a full disk: the window goes on (Retry-After: the last)
                self.j.event("drain", f"not recorded: {fs_problem(e)}", level="warning")
            # The front's own error, or its route file on a full disk: it still says 503.
            with contextlib.suppress(Failure, OSError):
                self.front.maintenance(message, rest.seconds, wait=False)
        return report

    def wait_vram(self, utilization: float, timeout_s: float) -> float:
        """Until every card has ``utilization`` free twice in a row; fails at ``timeout_s``."""
        t0 = self.ops.monotonic()
        good, detail, last_note = 0, "", t0
        failing_since: float | None = None
        while True:
            self.check_interrupt()
            try:
                ok, detail = vram_free_enough(self.ops.gpus(), utilization)
                failing_since = None
            except ValueError as e:
                ok, detail = False, str(e)
                failing_since = self.ops.monotonic() if failing_since is None else failing_since
            good = good + 1 if ok else 0
            now = self.ops.monotonic()
            if failing_since is not None and now - failing_since >= DRIVER_GRACE_S:
                raise Failure("driver", f"the NVIDIA driver does not answer ({detail}) for "
                              f"{now - failing_since:.0f}s: no stack can start without it. "
                              "`nvidia-smi` on the host shows the error; a deploy names the "
                              "cause and the fix (e.g. a module Secure Boot refused)")
            if good >= 2:
                self.j.event("vram", f"GPU memory released ({detail}) after {now - t0:.1f}s")
                return now - t0
            if now - t0 > timeout_s:
                raise Failure("vram", f"GPU memory not released within {timeout_s:g}s "
                              f"({detail}); need {utilization:g} of each card free; running "
                              f"containers: {', '.join(self.ops.running()) or 'none'}")
            if now - last_note > PROGRESS_EVERY_S:
                self.j.event("vram", f"waiting for GPU memory: {detail}")
                last_note = now
            self.ops.sleep(VRAM_POLL_S)

    def start(self, ref: StackRef, compose_file: str) -> None:
        """``docker compose up`` of ``ref``; the container must run its verified image."""
        self.pin_image(ref)
        self.j.event("start", f"docker compose up {ref.project} (recreated) from {compose_file}")
        if err := self.ops.up(compose_file, ref.project):
            boot = classify_boot_failure(err, ref.boot_failures)
            raise Failure("start", f"docker compose up {ref.project} failed: {err}", boot=boot)
        st = self.ops.container(ref.container)
        if ref.image_id and st is not None and st.image_id and st.image_id != ref.image_id:
            self.ops.down(compose_file, ref.project)
            raise Failure("image", f"{ref.container} started on image {short_id(st.image_id)}, "
                          f"not the verified {short_id(ref.image_id)} (its tag "
                          f"{local_name(ref)} moved while it started); taken down")

    def pin_image(self, ref: StackRef) -> None:
        """Put ``ref``'s local tag back on its verified image (by id or pinned digest)."""
        if not ref.image_id:
            return
        name = local_name(ref)
        if (found := self.ops.image_id(name)) == ref.image_id:
            return
        moved = (f"the tag {name} named {short_id(found) if found else 'no image'}, not the "
                 f"verified image {short_id(ref.image_id)}")
        source = ref.image_id if self.ops.image_present(ref.image_id) else None
        digest = str(ref.record.get("digest") or "")
        if source is None and digest.startswith("sha256:"):
            pinned = f"{name.rsplit(':', 1)[0]}@{digest}"
            source = pinned if self.ops.image_id(pinned) == ref.image_id else None
        if source is None:
            reason = (f"{ref.stack}: refused: {moved}, and the verified image is no longer on "
                      f"the host (by id or pinned digest {digest or 'none'}); run the deploy: "
                      "it stages the pinned image and gates it")
            self.j.event("image", reason, level="error")
            raise Failure("image", reason)
        if err := self.ops.tag(source, name):
            raise Failure("image", f"{ref.stack}: {moved}; docker image tag failed: {err}")
        note = f"{moved}: moved it back to the verified image (from {short_id(source)})"
        self.j.event("image", note, level="warning")
        self.image_notes.append(note)

    def wait_ready(self, ref: StackRef, timeout_s: float) -> float:
        """Until ``/health`` and ``/v1/models`` answer; fail fast when the container dies."""
        t0 = self.ops.monotonic()
        if (first := self.ops.container(ref.container)) is None:
            raise Failure("boot", f"container {ref.container} does not exist after compose up")
        last_note, detail = t0, ""
        while True:
            self.check_interrupt()
            st = self.ops.container(ref.container)
            if st is None or st.status in ("exited", "dead", "restarting") \
                    or st.restarts > first.restarts or st.oom_killed:
                raise self._died(ref, st)
            ok, detail = self.ops.health(ref.port, ref.served_model_name)
            now = self.ops.monotonic()
            if ok:
                self.check_boot_lines(ref)
                self.j.event("ready", f"{ref.stack} ready after {now - t0:.1f}s")
                return now - t0
            if now - t0 > timeout_s:
                boot = classify_boot_failure(self.ops.logs(ref.container, 400), ref.boot_failures)
                raise Failure("ready", f"{ref.stack} not ready after {timeout_s:g}s ({detail})"
                              + (f"; its log shows {boot}" if boot else ""), boot=boot)
            if now - last_note > PROGRESS_EVERY_S:
                self.j.event("ready", f"waiting for {ref.stack}: {detail}")
                last_note = now
            self.ops.sleep(READY_POLL_S)

    def check_boot_lines(self, ref: StackRef) -> None:
        """The boot log must show each of the stack file's ``boot.expect`` lines."""
        if not ref.boot_expect:
            return
        if missing := missing_boot_lines(self.ops.logs(ref.container, LOG_LINES_KEPT),
                                         ref.boot_expect):
            boot = BootFailure("boot-line-missing", "its stack file's boot.expect line(s) "
                               "missing from the boot log", "; ".join(missing),
                               "see what the stack's Genesis switches and image apply; the "
                               "kept log shows what it printed")
            raise Failure("boot", f"{ref.stack} answers, but {boot}", boot=boot)
        self.j.event("ready", f"{ref.stack}: boot log shows "
                     + "; ".join(title for _, title in ref.boot_expect))

    def _died(self, ref: StackRef, st: ContainerState | None) -> Failure:
        log = self.ops.logs(ref.container, 400)
        boot = classify_boot_failure(log, ref.boot_failures)
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

    def keep_log(self, ref: StackRef, directory: Path, name: str = "") -> str | None:
        """Copy the container's log to ``directory/<name>``; None when there is none."""
        if self.ops.container(ref.container) is None:
            return None  # it never started (the failure came before)
        if not (text := self.ops.logs(ref.container, LOG_LINES_KEPT)).strip():
            return None
        path = directory / (name or f"{ref.stack}-{ref.config_hash}.log")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as e:  # a full disk must not stop what the log is kept for
            self.j.event("log", f"cannot keep {ref.container}'s log in {path}: "
                         f"{e.strerror or e}", level="warning")
            return None
        return str(path)

    def recreate(self, ref: StackRef, message: str, retry_after_s: int, vram_timeout_s: float,
                 ready_timeout_s: float) -> None:
        """The verified ``ref`` in a fresh container behind a 503, then served; ``Failure``: 503."""
        self.front.maintenance(message, retry_after_s, wait=False)
        self.bring_up(ref, vram_timeout_s, ready_timeout_s)
        self.answers(ref)
        self.front.serve(ref)

    def bring_up(self, ref: StackRef, vram_timeout_s: float, ready_timeout_s: float,
                 projects: list[tuple[str, str]] | None = None, compose_file: str = "",
                 timings: dict[str, float] | None = None) -> float:
        """``projects`` (else all) down, the cards free, ``ref`` up and ready; boot seconds."""
        times = {} if timings is None else timings
        t = self.ops.monotonic()
        self.stop(known_projects(self.lay) if projects is None else projects)
        times["stop_s"] = self.ops.monotonic() - t
        times["vram_s"] = self.wait_vram(ref.gpu_memory_utilization, vram_timeout_s)
        self.check_interrupt()
        t = self.ops.monotonic()
        self.start(ref, compose_file or ref.compose_file)
        times["up_s"] = self.ops.monotonic() - t
        times["ready_s"] = self.wait_ready(ref, ready_timeout_s)
        return times["up_s"] + times["ready_s"]

    def verify(self, ref: StackRef, gate_fn: GateFn, plan: Plan,
               times: dict[str, float]) -> GateResult:
        """The verify-stress gate against ``ref`` on loopback; ``Failure`` unless it passed."""
        self.check_interrupt()
        t = self.ops.monotonic()
        self.j.event("gate", f"verify-stress gate, profile {plan.gate_profile}, against "
                     f"{ref.stack} on 127.0.0.1:{ref.port}")
        run = GateRun(url=f"http://127.0.0.1:{ref.port}", key_file=self.lay.api_key_file,
                      profile=plan.gate_profile, report_dir=self.lay.reports_dir,
                      sets=plan.gate_set, timeout_s=plan.gate_timeout_s)

        def on_line(line: str) -> None:
            if set(line.strip()) - set(".0123456789 "):  # not blank, not a progress count
                self.j.event("gate", line.strip())

        result = gate_fn(run, on_line, self.interrupted)
        times["gate_s"] = self.ops.monotonic() - t
        self.j.event("gate", f"{result.result}: {result.summary}; report {result.report}",
                     level="info" if result.passed else "error")
        if result.result == "error":  # one line; the details stay in its report
            raise Failure("gate", f"the gate could not decide: {result.summary}", gate=result)
        if not result.passed:
            raise Failure("gate", f"gate failed {len(result.failed_checks)} check(s): "
                          f"{', '.join(result.failed_checks)}; report {result.report}",
                          gate=result)
        return result

    def answers(self, ref: StackRef) -> None:
        ok, detail = self.ops.chat(ref.port, ref.served_model_name)
        if not ok:
            raise Failure("answer", f"{ref.stack} is up but does not answer: {detail}")
        self.j.event("answer", f"{ref.stack} answers a chat completion")


# The swap's own cost until measured (stop, memory released, front switch).
DEFAULT_OVERHEAD_S = 5.0


@dataclass(frozen=True)
class StackTimes:
    boot_s: float
    gate_s: float
    at: float = 0.0


@dataclass(frozen=True)
class Timings(Coded):
    """``timings.json``; every figure optional."""

    schema: ClassVar[str] = "rigfleet-timings/1"
    stacks: dict[str, StackTimes] = field(default_factory=dict)
    overhead_s: float | None = None
    drain_s: float | None = None
    steps_s: float | None = None


def read_timings(lay: Layout) -> Timings:
    """This host's record; an empty one when it is missing or damaged."""
    return Timings.from_dict(read_json(lay.timings_file)[0]) or Timings()


@dataclass(frozen=True)
class Estimate:
    """``seconds`` for Retry-After (>= 1) and what it was made of."""

    seconds: int
    basis: str


def window_estimate(t: Timings, stack: str | None, busy: bool, fallback_s: int,
                    steps: bool = False) -> Estimate:
    """How long a swap to ``stack`` keeps the front at 503 (``busy``: a drain first), or a
    maintenance window (``steps``: the last window's steps, then the recreation of ``stack``)."""
    name = stack if stack in t.stacks else max(t.stacks, key=lambda s: t.stacks[s].at, default=None)
    if stack is None or name is None:
        return Estimate(max(1, int(fallback_s)), f"{int(fallback_s)} s: no window measured on "
                        "this host yet (the plan's retry_after_s)")
    times = t.stacks[name]
    of = "" if name == stack else f" (of {name}: {stack} not measured here)"
    parts = [(f"boot{of}", times.boot_s), ("gate", times.gate_s),
             ("overhead" if t.overhead_s is not None else "overhead (default)",
              t.overhead_s if t.overhead_s is not None else DEFAULT_OVERHEAD_S)]
    if busy and t.drain_s:
        parts.insert(0, ("drain (last measured)", t.drain_s))
    if steps and t.steps_s:
        parts.insert(0, ("steps (last window)", t.steps_s))
    basis = " + ".join(f"{k} {v:.1f}s" for k, v in parts if v > 0 or k.startswith("boot"))
    return Estimate(max(1, math.ceil(sum(v for _, v in parts))), f"{basis}, measured on this host")


def record_times(lay: Layout, stack: str = "", boot_s: float = 0.0, gate_s: float = 0.0,
                 **figures: float | None) -> None:
    """Merge ``stack``'s times (none: "") and the figures (None: keep), rounded, into it."""
    t = read_timings(lay)
    new = {stack: StackTimes(round(boot_s, 2), round(gate_s, 2), time.time())} if stack else {}
    kept = {k: round(v, 2) for k, v in figures.items() if v is not None}
    write_json(lay.timings_file, replace(t, stacks={**t.stacks, **new}, **kept).to_dict())


def record_swap(lay: Layout, stack: str, boot_s: float, gate_s: float, window_s: float,
                drain: DrainReport | None) -> None:
    """After a promoted swap (its drain was recorded when it ended)."""
    drained = drain.seconds if drain is not None else 0.0
    record_times(lay, stack, boot_s, gate_s,
                 overhead_s=max(0.0, window_s - drained - boot_s - gate_s))
