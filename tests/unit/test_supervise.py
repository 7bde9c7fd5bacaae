"""The supervisor: a dead engine is recreated from the verified snapshot with a backoff and a
limit, then 503 with the reason; it never fights a lock holder and survives being killed.

The decisions (``step``) are tested on hand-made observations; the loop (``Supervisor``) runs
the real host-side code against ``tests/unit/swap_fakes.py`` on a fake clock (``sleep``
advances it), so "waited the backoff" and "gave up, no loop" are assertions on time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pytest
import swap_fakes
from swap_fakes import (
    FakeFront,
    FakeGate,
    FakeHost,
    gone_pid,
    journal,
    ledger_lines,
    make_plan,
    make_ref,
)

from rigfleet.hostside.__main__ import build_parser, main
from rigfleet.hostside.active import load_active, request_reset
from rigfleet.hostside.ensure import Ensure
from rigfleet.hostside.journal import Journal
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.lock import HostLock
from rigfleet.hostside.plan import Active
from rigfleet.hostside.probe import probe
from rigfleet.hostside.records import read_holder, read_supervisor
from rigfleet.hostside.stackctl import ContainerState, parse_inspect, parse_unit_state
from rigfleet.hostside.supervise import (
    Attempt,
    Observation,
    Policy,
    Record,
    epoch_of,
    parse_backoff,
    started,
    status_line,
    step,
)
from rigfleet.hostside.supervisor import AlreadyRunning, Supervisor, single_instance
from rigfleet.hostside.transaction import Transaction
from rigfleet.resources import project_file

HASH = "1111aaaa2222bbbb"
ROUTE = f"int8/{HASH}"
# What vLLM prints when the engine core dies mid-request (the testbed's simulator prints
# the same: vllm/sim/engine.py die_oom); its API server then exits.
CRASH_LOG = (
    "ERROR 11-29 10:20:00 [core.py:1050] EngineCore encountered a fatal error.\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1041\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 0.50 GiB. GPU 0 has a "
    "total capacity of 23.56 GiB of which 0.25 GiB is free.\n"
    "ERROR 11-29 10:20:00 [async_llm.py:480] AsyncLLM output_handler failed.\n"
)
# A stack that dies at every start (Genesis finds its anchors already patched, vLLM stops).
BOOT_DEATH = "Genesis Results: 41 applied, 3 skipped, 1 failed (P67: anchor not found)\n"


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)


def serving(lay: Layout) -> tuple[FakeHost, FakeFront, Any]:
    return swap_fakes.serving(lay, config_hash=HASH)


def supervisor(lay: Layout, host: FakeHost, front: FakeFront, policy: Policy | None = None,
               **kw: Any) -> Supervisor:
    return Supervisor(lay, host, front, policy or Policy(), clock=host.wall, echo=None, **kw)


def ticks_until(sup: Supervisor, done: Any, limit: int = 400) -> int:
    """Look (poll interval apart) until ``done()``; how many looks it took."""
    for n in range(1, limit + 1):
        sup.tick()
        if done():
            return n
        sup.nap(sup.policy.poll_s)
    raise AssertionError(f"not done after {limit} looks; state {sup.rec.state}: "
                         f"{sup.rec.reason}")


def ups(host: FakeHost) -> list[float]:
    """When each ``docker compose up`` ran (fake clock)."""
    return [float(c.rpartition("t=")[2]) for c in host.calls if c.startswith("up ")]



# --- the decisions, on hand-made observations ---------------------------------------------------

NOW = 1_795_000_000.0


def active_of(lay: Layout, deploy_id: str = "old-deploy") -> Active:
    ref = make_ref(lay, "int8", HASH, write=False)
    return Active(ref, "2026-11-29T10:00:00+00:00", deploy_id, "alice@ctl", {"result": "pass"})


def running(started_at: str = "2026-11-29T10:00:00Z", **kw: Any) -> ContainerState:
    return ContainerState("running", config_hash=HASH, started_at=started_at, **kw)


def obs(lay: Layout, **kw: Any) -> Observation:
    base: dict[str, Any] = dict(now=NOW, active=active_of(lay), container=running(),
                                healthy=True, health="ready", route=ROUTE)
    return Observation(**{**base, **kw})


def watched(lay: Layout, **kw: Any) -> Record:
    """A record that has seen the container serve."""
    return Record(state="watching", epoch=epoch_of(active_of(lay)), route_id=ROUTE,
                  healthy_start="2026-11-29T10:00:00Z", **kw)


def test_a_serving_stack_is_watched_and_nothing_is_done(lay):
    rec, action = step(Record(), obs(lay), Policy())
    assert (rec.state, action.kind) == ("watching", "none")
    assert rec.route_id == ROUTE and rec.healthy_start == "2026-11-29T10:00:00Z"


def test_a_dead_engine_opens_the_window_at_once_and_waits_the_first_backoff(lay):
    dead = replace(running(), status="exited", exit_code=1)
    rec, action = step(watched(lay), obs(lay, container=dead, healthy=False, log=CRASH_LOG),
                       Policy())
    assert action.kind == "open-window"
    assert rec.state == "backoff" and rec.next_attempt_at == NOW + 10
    assert rec.death.startswith("its container exited (exit code 1): CUDA out of GPU memory: "
                                "torch.OutOfMemoryError: CUDA out of memory")
    assert rec.boot_failure["kind"] == "cuda-oom"
    # The window is open now: waiting changes nothing until the backoff is over.
    rec, action = step(rec, obs(lay, now=NOW + 9, container=dead, healthy=False,
                                route="maintenance"), Policy())
    assert (rec.state, action.kind) == ("backoff", "none")
    rec, action = step(rec, obs(lay, now=NOW + 10, container=dead, healthy=False,
                                route="maintenance"), Policy())
    assert (rec.state, action.kind) == ("recreating", "recreate")


@pytest.mark.parametrize(("done", "wait"), [(0, 10), (1, 30), (2, 90)])
def test_the_nth_recreation_within_the_window_waits_the_nth_backoff(lay, done, wait):
    attempts = tuple(Attempt(at=NOW - 600 + i, reason="x", result="recreated")
                     for i in range(done))
    rec, _ = step(watched(lay, attempts=attempts),
                  obs(lay, container=None, healthy=False), Policy())
    assert rec.next_attempt_at == NOW + wait
    assert f"recreation {done + 1} of 3" in rec.reason


def test_the_last_backoff_repeats_and_a_limit_of_zero_gives_up_at_once():
    assert [Policy(backoff_s=(5.0, 7.0), limit=9).backoff(n) for n in range(4)] == [5, 7, 7, 7]
    assert Policy(backoff_s=()).backoff(3) == 0.0


def test_past_the_limit_it_gives_up_with_the_reason_and_stays_given_up(lay):
    attempts = tuple(Attempt(at=NOW - 700 + 200 * i, reason="x", result="recreated")
                     for i in range(3))
    dead = replace(running(), status="exited", exit_code=1)
    rec, action = step(watched(lay, attempts=attempts),
                       obs(lay, container=dead, healthy=False, log=BOOT_DEATH), Policy())
    assert (rec.state, action.kind) == ("gave-up", "give-up")
    assert action.reason == rec.reason
    assert rec.reason.startswith("crash loop: int8 died again (its container exited (exit code "
                                 "1): a Genesis patch failed to apply")
    assert rec.reason.endswith("gave up after 3 recreations in 12 min; run the deploy or fix "
                               "the stack")
    # No loop: dead or not, nothing more happens until a reset or a new stack.
    for later in (obs(lay, now=NOW + 3600, container=dead, healthy=False),
                  obs(lay, now=NOW + 7200, container=None, healthy=False)):
        rec, action = step(rec, later, Policy())
        assert (rec.state, action.kind) == ("gave-up", "none")


def test_a_clock_stepped_back_does_not_postpone_the_recreation_by_its_step(lay):
    # The engine died and two recreations ran before chrony stepped the clock back two hours.
    later = NOW + 7200
    attempts = tuple(Attempt(at=later - 300 + i, reason="x", result="recreated") for i in (0, 1))
    rec = replace(watched(lay, attempts=attempts), state="backoff", dead_since=later - 5)
    rec, action = step(rec, obs(lay, container=None, healthy=False, route="maintenance"),
                       Policy())
    assert rec.next_attempt_at == NOW + 90 and "recreation 3 of 3" in rec.reason
    rec, action = step(rec, obs(lay, now=NOW + 90, container=None, healthy=False,
                                route="maintenance"), Policy())
    assert action.kind == "recreate"
    # The two attempts count for the window from the stepped clock's now, not for two hours more.
    assert rec.recent(NOW + 1801, Policy().window_s) == []


def test_recreations_older_than_the_window_do_not_count(lay):
    attempts = (Attempt(at=NOW - 1900, reason="x", result="recreated"),
                Attempt(at=NOW - 1000, reason="x", result="recreated"),
                Attempt(at=NOW - 500, reason="x", result="failed"))
    rec, action = step(watched(lay, attempts=attempts), obs(lay, container=None,
                                                            healthy=False), Policy())
    assert action.kind == "open-window" and "recreation 3 of 3" in rec.reason


def test_a_new_verified_stack_or_a_reset_request_starts_the_count_again(lay):
    given_up = watched(lay, attempts=(Attempt(at=NOW - 60, reason="x"),))
    given_up = replace(given_up, state="gave-up", reason="crash loop: ...")
    dead = dict(container=None, healthy=False, route="maintenance")
    rec, action = step(given_up, obs(lay, **dead, active=active_of(lay, "new-deploy")),
                       Policy())
    assert rec.attempts == () and rec.state == "backoff" and action.kind == "none"
    assert rec.next_attempt_at == NOW + 10

    reset = {"token": "t1", "by": "alice@laptop", "why": "freed the cards"}
    rec, action = step(given_up, obs(lay, **dead, reset=reset), Policy())
    assert rec.attempts == () and rec.reset_token == "t1" and rec.state == "backoff"
    # The same request again is no new reset.
    rec2, _ = step(replace(rec, state="gave-up"), obs(lay, **dead, reset=reset), Policy())
    assert rec2.state == "gave-up"


def test_someone_elses_live_lock_or_the_stack_unit_at_work_pauses_it(lay):
    dead = dict(container=None, healthy=False)
    holder = {"who": "alice@laptop", "why": "swap int8 -> tq3-mtp-genesis", "pid": 42,
              "since": "2026-11-29T10:00:00+00:00", "alive": True}
    rec, action = step(watched(lay), obs(lay, **dead, holder=holder), Policy())
    assert (rec.state, action.kind) == ("paused", "none")
    assert rec.reason.startswith("locked by alice@laptop") and "they own the host" in rec.reason
    for unit, why in (("starting", "its ensure owns the host"), ("stopping", "going down"),
                      ("inactive", "meant not to serve")):
        rec, action = step(watched(lay), obs(lay, **dead, stack_unit=unit), Policy())
        assert (rec.state, action.kind) == ("paused", "none") and why in rec.reason
    # A stack unit whose boot-time ensure failed is no reason to wait.
    rec, action = step(watched(lay), obs(lay, **dead, stack_unit="failed"), Policy())
    assert action.kind == "open-window"


def test_nothing_verified_is_idle_and_an_unreadable_active_record_pauses(lay):
    rec, action = step(Record(), obs(lay, active=None), Policy())
    assert (rec.state, action.kind) == ("idle", "none")
    rec, action = step(Record(), obs(lay, problem="cannot tell what should serve: x"),
                       Policy())
    assert (rec.state, action.kind) == ("paused", "none")


def test_health_gone_after_it_served_is_death_only_when_it_stays_gone(lay):
    p = Policy(unhealthy_after_s=60)
    sick = dict(healthy=False, health="/health 503")
    rec, action = step(watched(lay), obs(lay, **sick), p)
    assert (rec.state, action.kind) == ("watching", "none") and rec.unhealthy_since == NOW
    rec, action = step(rec, obs(lay, now=NOW + 59, **sick), p)
    assert action.kind == "none"
    back, _ = step(rec, obs(lay, now=NOW + 30), p)  # it answered again: the clock restarts
    assert back.unhealthy_since is None
    rec, action = step(rec, obs(lay, now=NOW + 60, **sick), p)
    assert action.kind == "open-window"
    assert rec.death == "its engine stopped answering (/health 503 for 60 s)"


def test_a_container_that_never_became_ready_is_booting_until_the_ready_timeout(lay):
    p = Policy(ready_timeout_s=1200)
    boot = dict(container=running(started_at="2026-11-29T10:00:00Z"), healthy=False,
                health="/health no answer")
    start = 1_795_946_400.0  # 2026-11-29T10:00:00Z
    rec, action = step(Record(), obs(lay, now=start + 1199, **boot), p)
    assert (rec.state, action.kind) == ("booting", "none")
    rec, action = step(rec, obs(lay, now=start + 1201, **boot), p)
    assert action.kind == "open-window"
    assert rec.death == "not ready 1200 s after it started (/health no answer)"


@pytest.mark.parametrize(("container", "death"), [
    (None, "its container rigfleet-int8 is gone"),
    (ContainerState("exited", exit_code=137, oom_killed=True, config_hash=HASH),
     "its container exited (exit code 137, OOM-killed)"),
    (ContainerState("running", restarts=1, config_hash=HASH),
     "Docker restarted its container in place (Genesis' patches live in the container's "
     "writable layer: recreate, never restart)"),
    (ContainerState("running", config_hash="9999ffff0000eeee"),
     "rigfleet-int8 runs config 9999ffff0000eeee, not the verified snapshot's "
     "1111aaaa2222bbbb"),
    (ContainerState("created", config_hash=HASH), "its container is created"),
])
def test_every_way_the_engine_dies_is_named(lay, container, death):
    rec, action = step(watched(lay), obs(lay, container=container, healthy=False), Policy())
    assert action.kind == "open-window" and rec.death == death


def test_up_and_answering_but_not_routed_is_a_reroute_not_a_recreation(lay):
    rec, action = step(Record(), obs(lay, route="maintenance"), Policy())
    assert action.kind == "reroute" and "routes to maintenance" in action.reason


def test_a_new_process_counts_an_attempt_it_was_killed_in_and_stays_given_up():
    rec = Record(state="recreating", attempts=(Attempt(at=1.0, reason="x"),
                                               Attempt(at=0.5, reason="y",
                                                       result="recreated")))
    fresh = started(rec, 5.0)
    assert [a.result for a in fresh.attempts] == ["interrupted", "recreated"]
    assert fresh.state == "starting"
    assert started(replace(rec, state="gave-up"), 5.0).state == "gave-up"


def test_backoff_flags_are_checked():
    assert parse_backoff("10,30,90") == (10.0, 30.0, 90.0)
    for bad in ("", "10,,90", "ten", "-1", "nan"):
        with pytest.raises(ValueError, match="not a list of seconds; allowed: comma-separated"):
            parse_backoff(bad)


def test_the_record_round_trips_through_its_json():
    rec = Record(state="backoff", reason="r", since=1.0, route_id=ROUTE, epoch="e",
                 reset_token="t", attempts=(Attempt(at=2.0, reason="x", result="failed",
                                                    detail="d", seconds=3.5),),
                 dead_since=4.0, death="dead", boot_failure={"kind": "k", "title": "t",
                                                             "line": "l"},
                 healthy_start="s", unhealthy_since=5.0, next_attempt_at=6.0, gave_up_at=None)
    data = json.loads(json.dumps({"schema": "rigfleet-supervise/1", **rec.to_dict()}))
    assert Record.from_dict(data) == rec
    assert Record.from_dict({"schema": "other"}) == Record()


# --- the loop, on the fake host -----------------------------------------------------------------


def test_an_engine_that_crashes_is_recreated_after_the_backoff_and_the_ledger_says_so(lay):
    host, front, ref = serving(lay)
    sup = supervisor(lay, host, front)
    sup.tick()
    assert sup.rec.state == "watching" and front.routes == [ROUTE]
    host.crash("rigfleet-int8", CRASH_LOG)
    crashed = host.wall()
    ticks_until(sup, lambda: sup.rec.state == "watching" and front.current() == ROUTE)
    # The window opened at the first look after the crash, the recreation waited 10 s.
    assert front.routes == [ROUTE, "maintenance", "maintenance", ROUTE]
    assert front.messages[0] == "int8 engine died; recreating it"
    assert [t + host.epoch for t in ups(host)][0] >= crashed + 10
    assert host.running_now() == {"rigfleet-int8": HASH}
    line = ledger_lines(lay)[-1]
    assert (line["event"], line["result"], line["stack"], line["by"]) == (
        "supervise", "recreated", "int8", "rigfleet-supervise.service")
    assert line["reason"].startswith("recreated after the engine died: its container exited "
                                     "(exit code 1): CUDA out of GPU memory: torch.OutOfMemory")
    assert line["gate"]["note"].startswith("verified at promotion")
    assert line["attempt"] == 1 and Path(line["kept_log"]).read_text().endswith(CRASH_LOG)
    assert read_holder(lay.lock_dir) is None
    # Its journal is one like a transaction's (rigfleet-host.pyz status --id ...).
    [jdir] = [d for d in lay.swaps_dir.iterdir() if d.name.startswith("supervise-")
              and (d / "result.json").exists() and "recreated" in (d / "result.json").read_text()]
    assert Journal.read(jdir)["state"] == "done"
    data = read_supervisor(lay.supervise_state, now=host.wall())
    assert data["state"] == "watching" and data["recreations"] == 1 and data["alive"] is True
    assert data["attempts"][0]["result"] == "recreated"


def test_a_stack_that_dies_at_every_start_gives_up_after_the_limit_with_503_and_the_reason(lay):
    host, front, ref = serving(lay)
    sup = supervisor(lay, host, front)
    sup.tick()
    host.behaviour["int8"] = ("die", BOOT_DEATH)
    host.crash("rigfleet-int8", CRASH_LOG)
    ticks_until(sup, lambda: sup.rec.state == "gave-up")
    starts = ups(host)
    assert len(starts) == 3
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps[0] >= 30 and gaps[1] >= 90  # the second and third backoffs
    assert front.current() == "maintenance"
    assert front.messages[-1] == sup.rec.reason
    assert "a Genesis patch failed to apply" in sup.rec.reason
    assert sup.rec.reason.endswith("run the deploy or fix the stack")
    lines = ledger_lines(lay)
    assert [(x["event"], x["result"]) for x in lines[-4:]] == [
        ("supervise", "failed"), ("supervise", "failed"), ("supervise", "failed"),
        ("supervise", "gave-up")]
    assert lines[-4]["reason"].startswith("recreation 1 of 3 after the engine died (its "
                                          "container exited (exit code 1): CUDA out of GPU memory")
    assert lines[-4]["reason"].endswith("failed: int8 died while booting (exit code 1): a "
                                        "Genesis patch failed to apply (a restarted container? "
                                        "a read-only target?): Genesis Results: 41 applied, 3 "
                                        "skipped, 1 failed (P67: anchor not found)")
    assert lines[-4]["boot_failure"]["kind"] == "genesis-patch-failed"
    assert lines[-3]["reason"].startswith("recreation 2 of 3 after the engine died (its "
                                          "container exited (exit code 1): a Genesis patch")
    last = lines[-1]
    assert last["stack"] is None and last["attempted"]["stack"] == "int8"
    assert last["reason"] == sup.rec.reason and last["recreations"] == 3
    assert "gave up after 3 recreations in " in last["reason"]
    # No loop: an hour of looks later nothing more was started.
    host.calls.clear()
    for _ in range(720):
        sup.tick()
        sup.nap(5)
    assert ups(host) == [] and front.current() == "maintenance"
    assert "gave-up" in status_line(read_supervisor(lay.supervise_state, now=host.wall()))


def given_up(lay: Layout) -> tuple[FakeHost, FakeFront, Supervisor]:
    """int8 dies at every start; a supervisor with a limit of 1 has given up on it."""
    host, front, ref = serving(lay)
    sup = supervisor(lay, host, front, Policy(backoff_s=(1.0,), limit=1))
    sup.tick()
    host.behaviour["int8"] = ("die", BOOT_DEATH)
    host.crash("rigfleet-int8", CRASH_LOG)
    ticks_until(sup, lambda: sup.rec.state == "gave-up")
    return host, front, sup


def test_after_a_give_up_a_reset_starts_a_new_round_and_ensure_resets_too(lay):
    host, front, sup = given_up(lay)
    # Someone fixed the stack and says so: a new round, which now succeeds.
    host.behaviour.pop("int8")
    request_reset(lay, "alice@laptop", "freed the cards")
    ticks_until(sup, lambda: sup.rec.state == "watching" and front.current() == ROUTE)
    assert ledger_lines(lay)[-1]["result"] == "recreated"
    assert sup.rec.reason.startswith("int8/") and len(sup.rec.attempts) == 1

    # Given up again; then a deploy's ensure brings the stack back: the count starts again.
    host.behaviour["int8"] = ("die", BOOT_DEATH)
    host.crash("rigfleet-int8", CRASH_LOG)
    ticks_until(sup, lambda: sup.rec.state == "gave-up")
    host.behaviour.pop("int8")
    out = Ensure(lay, host, front, Journal(lay.swaps_dir / "ensure-x", echo=None),
                 who="alice@laptop", why="deploy: the active stack is not serving",
                 booted_at=0.0).run()
    assert out.result == "recreated"
    sup.tick()
    assert sup.rec.state == "watching" and sup.rec.attempts == ()
    assert sup.rec.reason == f"{ROUTE} serves"


def test_a_promotion_resets_the_count(lay):
    host, front, sup = given_up(lay)
    new = make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd")
    plan = make_plan(lay, new)
    out = Transaction(plan, lay, host, front, FakeGate(), journal(lay, plan)).run()
    assert out.result == "promoted"
    sup.tick()
    assert sup.rec.state == "watching" and sup.rec.attempts == ()
    assert sup.rec.route_id == new.route_id and sup.rec.reason == f"{new.route_id} serves"


def test_an_engine_that_stops_answering_while_its_container_runs_is_recreated(lay):
    host, front, ref = serving(lay)
    sup = supervisor(lay, host, front, Policy(unhealthy_after_s=60))
    sup.tick()
    host.engine_dies("rigfleet-int8")
    t0 = host.wall()
    ticks_until(sup, lambda: ledger_lines(lay) and ledger_lines(lay)[-1]["result"] ==
                "recreated")
    assert ups(host)[0] + host.epoch >= t0 + 60 + 10
    assert ledger_lines(lay)[-1]["reason"].startswith(
        "recreated after the engine died: its engine stopped answering (/health 503 for ")
    assert front.current() == ROUTE


def test_it_does_nothing_while_someone_else_holds_the_lock(lay):
    host, front, ref = serving(lay)
    sup = supervisor(lay, host, front)
    sup.tick()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        HostLock(lay, pid=sleeper.pid).acquire("alice@laptop", "swap int8 -> tq3", "D1")
        host.crash("rigfleet-int8", CRASH_LOG)
        for _ in range(60):
            sup.tick()
            sup.nap(5)
        assert ups(host) == [] and front.routes == [ROUTE]
        assert sup.rec.state == "paused" and "locked by alice@laptop" in sup.rec.reason
    finally:
        sleeper.kill()
        sleeper.wait()
    # The holder is gone (killed): the lock is stale and the supervisor takes over.
    ticks_until(sup, lambda: front.current() == ROUTE and ups(host))
    assert read_holder(lay.lock_dir) is None


class Killed(BaseException):
    """The process was killed here (SIGKILL runs no ``finally``: the lock stays behind)."""


class Cut:
    """Wraps the fake host and front; the ``at``-th call after ``arm()`` raises ``Killed``."""

    def __init__(self, target: Any, counter: list[int], at: int) -> None:
        self._target, self._counter, self._at = target, counter, at

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr) or name in ("sleep", "monotonic", "wall", "current"):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            if self._counter[0] >= 0:
                self._counter[0] += 1
                if self._counter[0] == self._at:
                    raise Killed(name)
            return attr(*args, **kw)
        return call


# The calls of one recreation: container (x3), logs, down, container, gpus..., up, container,
# health..., chat, serve. Every boundary up to the end is a place to be killed.
@pytest.mark.parametrize("at", range(1, 34))
def test_killed_at_any_point_of_a_recreation_the_next_supervisor_finishes_the_job(lay, at):
    host, front, ref = serving(lay)
    counter = [-1]
    dead = gone_pid()
    first = supervisor(lay, Cut(host, counter, at), Cut(front, counter, at), pid=dead)
    first.lock.release = lambda: None  # killed: no finally runs
    first.tick()
    host.crash("rigfleet-int8", CRASH_LOG)
    counter[0] = 0
    killed = False
    try:
        for _ in range(200):
            first.tick()
            if first.rec.state == "watching" and front.current() == ROUTE:
                break
            first.nap(5)
    except Killed:
        killed = True
    if not killed:
        pytest.skip(f"the recreation needed fewer than {at} calls")
    # A new supervisor process (systemd restarts the unit) finishes what was cut short.
    second = supervisor(lay, host, front)
    second.run(ticks=0)  # takes over the record as a new process does
    ticks_until(second, lambda: second.rec.state == "watching" and front.current() == ROUTE)
    assert host.running_now() == {"rigfleet-int8": HASH}
    assert read_holder(lay.lock_dir) is None
    assert len(second.rec.attempts) <= 2
    assert ledger_lines(lay)[-1]["result"] in ("recreated", "rerouted")
    assert ledger_lines(lay)[-1]["stack"] == "int8"


def test_a_transaction_killed_in_its_window_ends_with_the_verified_stack_serving(lay):
    host, front, ref = serving(lay)
    sup = supervisor(lay, host, front)
    sup.tick()
    plan = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd"))
    dead = gone_pid()
    lock = HostLock(lay, pid=dead)
    lock.release = lambda: None  # type: ignore[method-assign]  # killed: no finally runs

    def killed(run: Any) -> None:
        raise Killed("SIGKILL during the gate")

    with pytest.raises(Killed):
        Transaction(plan, lay, host, front, FakeGate(on_run=killed), journal(lay, plan),
                    lock=lock).run()
    pid_file = lay.swap_dir(plan.id) / "pid.json"
    pid_file.write_text(json.dumps({**json.loads(pid_file.read_text()), "pid": dead}))
    assert front.current() == "maintenance" and "rigfleet-tq3-mtp-genesis" in host.running()
    ticks_until(sup, lambda: front.current() == ROUTE)
    assert host.running_now() == {"rigfleet-int8": HASH}  # the unverified stack is down
    events = [(x["event"], x["result"]) for x in ledger_lines(lay)]
    assert events[-2:] == [("interrupted", "interrupted"), ("supervise", "recreated")]
    assert ledger_lines(lay)[-1]["reason"] == ("recreated after the engine died: its "
                                               "container rigfleet-int8 is gone")
    assert read_holder(lay.lock_dir) is None


def test_while_the_docker_daemon_does_not_answer_a_missing_container_is_no_death(lay):
    host, front, ref = serving(lay)
    sup = supervisor(lay, host, front)
    sup.tick()
    host.docker_answers = False
    host.containers.clear()  # what `docker inspect` shows while dockerd restarts: nothing
    for _ in range(30):
        sup.tick()
        sup.nap(5)
    assert ups(host) == [] and front.routes == [ROUTE]
    assert sup.rec.state == "paused" and "Docker daemon does not answer" in sup.rec.reason
    host.docker_answers = True  # back, and the container is gone for good (restart: "no")
    ticks_until(sup, lambda: front.current() == ROUTE and ups(host))


def test_a_stop_request_cuts_a_recreation_short_and_releases_the_lock(lay):
    host, front, ref = serving(lay)
    stop = [False]
    sup = supervisor(lay, host, front, stop=lambda: stop[0])
    sup.tick()
    host.crash("rigfleet-int8", CRASH_LOG)
    host.on_up = lambda project: stop.__setitem__(0, True)  # SIGTERM while it boots
    ticks_until(sup, lambda: stop[0] and sup.rec.state != "recreating")
    assert sup.rec.attempts[-1].result == "interrupted"
    assert ledger_lines(lay)[-1]["result"] == "interrupted"
    assert read_holder(lay.lock_dir) is None and front.current() == "maintenance"


def test_one_supervisor_per_host(lay):
    with single_instance(lay), pytest.raises(AlreadyRunning, match="another supervisor"), \
            single_instance(lay):
        pass
    with single_instance(lay):  # released with the first
        pass


# --- what the probe, the status command and the unit say ---------------------------------------


def test_the_probe_and_status_show_the_supervisor(lay, capsys):
    assert probe(lay)["supervisor"] is None
    host, front, ref = serving(lay)
    sup = supervisor(lay, host, front, pid=gone_pid())
    sup.tick()
    data = probe(lay)["supervisor"]
    assert data["state"] == "watching" and data["alive"] is False  # its process is gone
    assert data["policy"] == {"backoff_s": [10.0, 30.0, 90.0], "limit": 3, "window_s": 1800.0,
                              "unhealthy_after_s": 60.0, "poll_s": 5.0}
    assert data["recreations"] == 0 and isinstance(data["now"], float)
    assert main(["--root", str(lay.root), "status"]) == 0
    out = capsys.readouterr().out
    assert "watch:   watching: int8/1111aaaa2222bbbb serves (0 of 3 recreations within " \
           "1800.0 s) [not running]" in out
    assert main(["--root", str(lay.root), "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["supervisor"]["state"] == "watching"


def test_reset_by_hand_and_bad_flags(lay, capsys):
    assert main(["--root", str(lay.root), "supervise", "--reset", "--by", "alice@rig",
                 "--why", "freed the cards"]) == 0
    request = json.loads(lay.supervise_reset.read_text())
    assert (request["by"], request["why"]) == ("alice@rig", "freed the cards")
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(lay.root), "supervise", "--backoff-s", "10,soon"])
    assert exit_.value.code == 2
    assert "--backoff-s: '10,soon' is not a list of seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--root", str(lay.root), "supervise", "--window-s", "0"])
    assert "--window-s: '0' is not a number of seconds" in capsys.readouterr().err


def test_the_unit_passes_flags_the_host_tool_accepts():
    policy = replace(Policy(), ready_timeout_s=600.0, vram_timeout_s=60.0, retry_after_s=15)
    template = jinja2.Template(Path(project_file("files/rigfleet-supervise.service.j2"))
                               .read_text())
    text = template.render(front_port=8000, bundle="/usr/local/lib/rigfleet/rigfleet-host.pyz",
                           active_dir="/var/lib/rigfleet/active",
                           stack_unit="rigfleet-stack.service", flags=" ".join(policy.argv()),
                           backoff="10, 30, 90", limit=3, window_s="1800")
    [exec_start] = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    argv = exec_start.removeprefix("ExecStart=").split()
    assert argv[:3] == ["/usr/bin/python3", "/usr/local/lib/rigfleet/rigfleet-host.pyz",
                        "supervise"]
    args = build_parser().parse_args(argv[2:])
    assert (args.backoff_s, args.limit, args.window_s, args.ready_timeout_s,
            args.vram_timeout_s, args.retry_after_s, args.front_port) == (
        (10.0, 30.0, 90.0), 3, 1800.0, 600.0, 60.0, 15, 8000)
    assert "Restart=always" in text and "PartOf=rigfleet-stack.service" in text
    assert "After=docker.service nginx.service rigfleet-stack.service" in text


@pytest.mark.parametrize(("text", "state"), [
    ("active\nexited\n", "done"), ("active\nrunning\n", "starting"),
    ("activating\nstart\n", "starting"), ("deactivating\nstop\n", "stopping"),
    ("inactive\ndead\n", "inactive"), ("failed\nfailed\n", "failed"), ("", "unknown"),
])
def test_how_the_stack_unit_stands(text, state):
    assert parse_unit_state(text) == state


def test_inspect_reads_when_the_container_started():
    line = (json.dumps({"Status": "running", "ExitCode": 0, "OOMKilled": False,
                        "StartedAt": "2026-11-29T10:00:01.5Z"})
            + "\t0\t2026-11-29T10:00:00Z\t1111aaaa2222bbbb\tsha256:abc")
    assert parse_inspect(line).started_at == "2026-11-29T10:00:01.5Z"


def test_a_rolled_back_swap_asks_for_a_reset(lay):
    host, front, ref = serving(lay)
    plan = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd"))
    out = Transaction(plan, lay, host, front, FakeGate(failed=("needles",)),
                      journal(lay, plan)).run()
    assert out.result == "rolled-back"
    request = json.loads(lay.supervise_reset.read_text())
    assert request["by"] == "alice@ctl" and "rolled back" in request["why"]
    assert load_active(lay).ref.route_id == ROUTE
