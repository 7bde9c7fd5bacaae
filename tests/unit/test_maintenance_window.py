"""The maintenance window on the host: open (lock, record, drain, 503), close (recreate, gate,
route), or fail with the reason; what the boot-time ensure, the supervisor and a swap do
while one is open, abandoned or failed.

The real ``rigfleet.hostside`` code runs against a temporary root and the fakes of
``tests/unit/swap_fakes.py`` (docker, nvidia-smi, HTTP, the front and the gate).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from swap_fakes import (
    FakeFront,
    FakeGate,
    FakeHost,
    gone_pid,
    ledger_lines,
    make_plan,
    make_ref,
    serving,
)

from rigfleet.hostside.__main__ import main
from rigfleet.hostside.active import load_active
from rigfleet.hostside.ensure import Ensure
from rigfleet.hostside.journal import Journal
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.lock import HostLock, LockHeld, WindowHold, session_anchor
from rigfleet.hostside.maintenance import Maintenance, window_status
from rigfleet.hostside.plan import Plan
from rigfleet.hostside.records import BootClock, boot_id, holder_alive, pid_start_ticks, read_holder
from rigfleet.hostside.steps import read_timings, window_estimate
from rigfleet.hostside.supervise import Policy
from rigfleet.hostside.supervisor import Supervisor
from rigfleet.hostside.transaction import Transaction

HASH = "1111aaaa2222bbbb"
ROUTE = f"int8/{HASH}"


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)


def window_plan(lay: Layout, plan_id: str = "maint-20261201T100000Z-aaaaaa", **kw: Any) -> Plan:
    return make_plan(lay, make_ref(lay, "int8", HASH), plan_id=plan_id, gate_profile="fast",
                     **kw)


def maint(lay: Layout, host: FakeHost, front: FakeFront, plan: Plan, gate: Any = None,
          **kw: Any) -> Maintenance:
    return Maintenance(lay, host, front, Journal(lay.swap_dir(f"j-{time.monotonic_ns()}"),
                                                 echo=None), plan, gate=gate, **kw)


def supervisor(lay: Layout, host: FakeHost, front: FakeFront, **kw: Any) -> Supervisor:
    return Supervisor(lay, host, front, Policy(), clock=host.wall, echo=None, **kw)


def events(lay: Layout) -> list[tuple[str, str]]:
    return [(x["event"], x["result"]) for x in ledger_lines(lay)]


# --- open ---------------------------------------------------------------------------------------


def test_open_takes_the_lock_as_the_window_and_answers_503(lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    out = maint(lay, host, front, plan).open("Docker restart (daemon.json: exec-opts)")
    assert (out.result, out.exit, out.serving) == ("open", 0, "maintenance")
    holder = read_holder(lay.lock_dir)
    # The window holds the lock, alive while the process the steps run in (the deploy's SSH
    # session; here pytest's parent) lives; no deadline.
    assert holder["window"] == plan.id and holder["alive"] and "until" not in holder
    assert holder["pid"] == session_anchor()[0] != os.getpid()
    assert front.current() == "maintenance"
    assert front.messages[-1] == "maintenance: Docker restart (daemon.json: exec-opts)"
    window, status, why = window_status(lay)
    assert status == "held" and window.state == "open" and window.serving_before == ROUTE
    line = ledger_lines(lay)[-1]
    assert (line["event"], line["result"], line["stack"]) == ("maintenance", "opened", None)
    assert line["previous"]["stack"] == "int8" and host.calls == []  # nothing else touched
    # The next step joins the same window (held across its reboot from now on).
    again = maint(lay, host, front, plan).open("reboot to load the NVIDIA driver",
                                               WindowHold.here(plan.id, reboot_grace_s=1200))
    assert again.exit == 0 and again.reason.startswith("already open")
    window, _, why = window_status(lay)
    assert [s["what"] for s in window.steps] == ["Docker restart (daemon.json: exec-opts)",
                                                 "reboot to load the NVIDIA driver"]
    assert read_holder(lay.lock_dir)["reboot"]["grace_s"] == 1200
    # Another deploy's window (or swap) is refused while this one is open, and the message
    # does not suggest taking it over.
    other = maint(lay, host, front, window_plan(lay, "maint-other")).open("x")
    assert other.result == "locked" and other.exit == 3
    assert "maintenance window maint-20261201T100000Z-aaaaaa, held while pid" in other.reason
    assert "maintenance close" not in other.reason


def test_a_step_does_not_join_a_window_a_close_took_meanwhile(lay):
    # `maintenance close --force` takes the window between the next step's look at the lock
    # and its joining: the step is refused (the close recreates the stack), not run in it.
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    maint(lay, host, front, plan).open("NVIDIA driver 590 install")
    step = maint(lay, host, front, plan)
    closer = HostLock(lay, pid=os.getppid())
    look = step.lock.acquire

    def acquire(*args: Any, **kw: Any) -> str | None:
        try:
            return look(*args, **kw)
        except LockHeld:
            assert closer.adopt_window(plan.id, "closing (--force)", take_live=True)
            raise

    step.lock.acquire = acquire  # type: ignore[method-assign]
    out = step.open("reboot to load the NVIDIA driver")
    assert (out.result, out.exit) == ("locked", 3) and "closing (--force)" in out.reason
    assert read_holder(lay.lock_dir)["why"] == "closing (--force)"
    assert [s["what"] for s in window_status(lay)[0].steps] == ["NVIDIA driver 590 install"]


class Clock(BootClock):
    """A boot-time clock the test moves (and a boot it replaces)."""

    def __init__(self) -> None:
        self.boot_key, self.up, self.started = "boot-1", 5_000.0, 0.0

    def boot(self) -> str:
        return self.boot_key

    def uptime(self) -> float:
        return self.up

    def since_boot(self) -> float:
        return self.up - self.started

    def reboot(self, gap_s: float) -> None:
        self.boot_key, self.started = self.boot_key + "+", self.up + gap_s
        self.up = self.started + 1.0


def test_a_window_is_held_while_its_process_lives_whatever_the_wall_clock_says():
    me = os.getpid()
    holder = {"window": "maint-x", "anchor": "the deploy's SSH session", "pid": me,
              "pid_start": pid_start_ticks(me), "boot_id": boot_id()}
    # A step of any length, and wall clocks stepped by years either way: held.
    for now in (0.0, time.time() - 10 * 365 * 86400, time.time() + 10 * 365 * 86400):
        assert holder_alive(holder, now=now)
    # Its process gone (the deploy ended or died): abandoned at once, whatever the clock.
    gone = {**holder, "pid": gone_pid(), "pid_start": 1}
    assert not holder_alive(gone, now=0.0) and not holder_alive(gone)


def test_across_its_reboot_a_window_is_held_by_a_grace_on_the_boot_time_clock():
    clock = Clock()
    hold = {"boot": "boot-1", "at": clock.up, "grace_s": 1200.0}
    holder = {"window": "maint-x", "anchor": "the deploy's SSH session", "pid": gone_pid(),
              "pid_start": 1, "reboot": hold}
    # Before the machine goes down (sshd already killed): held for the grace from the request.
    clock.up += 600
    assert holder_alive(holder, clock=clock)
    # The next boot, 3 minutes later; the wall clock jumps by a year (an RTC reset): held for
    # the grace from the boot's start, on the boot-time clock only.
    clock.reboot(180.0)
    for now in (0.0, time.time() + 365 * 86400):
        assert holder_alive(holder, now=now, clock=clock)
    clock.up += 1100
    assert holder_alive(holder, clock=clock)
    clock.up += 200  # the deploy never came back: abandoned (the supervisor closes it)
    assert not holder_alive(holder, clock=clock)
    # A reboot that never came: the grace from the request ends it in the same boot.
    same = Clock()
    stuck = {**holder, "reboot": {"boot": "boot-1", "at": same.up, "grace_s": 1200.0}}
    same.up += 1201
    assert not holder_alive(stuck, clock=same)


def test_an_older_tools_window_still_lives_until_its_deadline():
    holder = {"window": "maint-x", "until": 2_000.0, "pid": 999_999, "boot_id": "other-boot"}
    assert holder_alive(holder, now=1_999.0)
    assert not holder_alive(holder, now=2_000.5)
    assert not holder_alive({"pid": 999_999, "boot_id": "other-boot"}, now=0)


def test_a_front_that_refuses_503_gives_the_host_back_undisturbed(lay):
    host, front, ref = serving(lay)
    front.fail_on = "maintenance"
    out = maint(lay, host, front, window_plan(lay)).open("Docker restart")
    assert out.result == "refused" and "nothing was disturbed" in out.reason
    assert read_holder(lay.lock_dir) is None and front.current() == ROUTE
    assert window_status(lay)[1] == "none"


def test_a_front_refusing_503_leaves_a_failed_window_it_was_to_take_over_failed(lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    maint(lay, host, front, plan).open("NVIDIA driver 590 install")
    maint(lay, host, front, plan, gate=FakeGate(failed=("needles",))).close(own=True)
    assert window_status(lay)[1] == "failed" and host.running_now() == {}
    # The next deploy's window cannot open (its 503 is refused): the failed one stays failed,
    # so neither the supervisor nor the boot-time ensure brings its stack back ungated.
    front.fail_on = "maintenance"
    out = maint(lay, host, front, window_plan(lay, "maint-20261202T100000Z-bbbbbb")).open(
        "NVIDIA driver 595 install")
    assert out.result == "refused" and read_holder(lay.lock_dir) is None
    window, status, _ = window_status(lay)
    assert (status, window.id) == ("failed", plan.id)
    front.fail_on = None
    sup = supervisor(lay, host, front, gate=FakeGate())
    for _ in range(30):
        sup.tick()
        sup.nap(5)
    assert host.running_now() == {} and "out of service" in sup.rec.reason


# --- close --------------------------------------------------------------------------------------


def test_close_recreates_gates_and_routes_then_frees_the_lock(lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    maint(lay, host, front, plan).open("Docker restart (daemon.json: exec-opts)")
    host.containers.clear()  # the restart stopped it (no live-restore yet)
    gate = FakeGate()
    out = maint(lay, host, front, plan, gate=gate).close(own=True)
    assert (out.result, out.exit, out.serving) == ("closed", 0, ROUTE)
    assert [c.split(" t=")[0] for c in host.calls if c.startswith(("up", "down"))] == [
        "down rigfleet-int8", "up rigfleet-int8 1111aaaa2222bbbb"]
    [run] = gate.runs
    assert run.profile == "fast" and run.url == "http://127.0.0.1:8011"
    assert front.routes[-2:] == ["maintenance", ROUTE] and read_holder(lay.lock_dir) is None
    window, status, _ = window_status(lay)
    assert status == "none" and window.state == "closed" and window.gate["result"] == "pass"
    line = ledger_lines(lay)[-1]
    assert (line["event"], line["result"], line["stack"]) == ("maintenance", "closed", "int8")
    assert line["ref"]["config_hash"] == HASH and line["gate"]["result"] == "pass"
    state = json.loads(lay.state_file.read_text())
    assert state["gate"]["result"] == "pass" and state["stack"] == "int8"
    assert load_active(lay).gate["result"] == "pass"
    assert json.loads(lay.supervise_reset.read_text())["why"].startswith("maintenance closed")


def test_a_close_whose_gate_fails_keeps_503_stops_the_stack_and_says_why(lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    maint(lay, host, front, plan).open("NVIDIA driver 590 install")
    out = maint(lay, host, front, plan, gate=FakeGate(failed=("needles",))).close(own=True)
    assert (out.result, out.exit, out.serving) == ("failed", 2, "maintenance")
    assert out.reason.startswith("maintenance failed (gate): gate failed 1 check(s): needles")
    assert host.running_now() == {}  # it did not pass: nothing may route to it
    assert front.current() == "maintenance" and front.messages[-1].startswith("not serving:")
    assert window_status(lay)[1] == "failed" and read_holder(lay.lock_dir) is None
    line = ledger_lines(lay)[-1]
    assert (line["event"], line["result"], line["stack"]) == ("maintenance", "failed", None)
    assert line["attempted"]["stack"] == "int8" and line["gate"]["failed_checks"] == ["needles"]
    # The supervisor never brings a stack back that failed its gate after a maintenance.
    sup = supervisor(lay, host, front, gate=FakeGate())
    for _ in range(30):
        sup.tick()
        sup.nap(5)
    assert host.running_now() == {} and sup.rec.state == "paused"
    assert "out of service" in sup.rec.reason and "maintenance close" in sup.rec.reason
    # The boot-time ensure (a person rebooted after fixing it) closes it again, gated.
    out = Ensure(lay, host, front, Journal(lay.swap_dir("ensure-1"), echo=None), who="boot",
                 why="boot", booted_at=0.0, gate=FakeGate()).run()
    assert (out.result, out.serving) == ("closed", ROUTE) and window_status(lay)[1] == "none"


def test_only_a_held_windows_close_measures_its_steps_for_the_next_retry_after(lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    maint(lay, host, front, plan).open("NVIDIA driver 590 install")
    window = json.loads(lay.window_file.read_text())
    lay.window_file.write_text(json.dumps({**window, "opened_at": time.time() - 42.0}))
    maint(lay, host, front, plan, gate=FakeGate()).close(own=True)
    assert 41.0 <= read_timings(lay).steps_s < 60.0  # the deploy's steps, measured
    # A window that failed its close, closed again three days later by the next deploy: the
    # days in between are no step of it (they would be the next window's Retry-After).
    later = window_plan(lay, "maint-20261202T100000Z-bbbbbb")
    maint(lay, host, front, later).open("NVIDIA driver 595 install")
    maint(lay, host, front, later, gate=FakeGate(failed=("needles",))).close(own=True)
    window = json.loads(lay.window_file.read_text())
    lay.window_file.write_text(json.dumps({**window, "opened_at": time.time() - 3 * 86400}))
    out = maint(lay, host, front, later, gate=FakeGate()).close(own=True)
    assert out.result == "closed" and 41.0 <= read_timings(lay).steps_s < 60.0
    est = window_estimate(read_timings(lay), "int8", False, 30, steps=True)
    assert est.seconds < 3600


def test_while_a_window_holds_the_host_ensure_and_the_supervisor_leave_it_alone(lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    maint(lay, host, front, plan).open("reboot to load the NVIDIA driver")
    host.containers.clear()  # the reboot: the stack is gone
    out = Ensure(lay, host, front, Journal(lay.swap_dir("ensure-boot"), echo=None),
                 who="rigfleet-stack.service", why="boot", booted_at=0.0,
                 gate=FakeGate()).run()
    assert (out.result, out.exit) == ("deferred", 0) and "maintenance window" in out.reason
    assert host.running_now() == {} and front.current() == "maintenance"
    sup = supervisor(lay, host, front, gate=FakeGate())
    for _ in range(30):
        sup.tick()
        sup.nap(5)
    assert [c for c in host.calls if c.startswith("up")] == []
    assert sup.rec.state == "paused" and "maintenance window" in sup.rec.reason
    # A swap is refused too, naming the window.
    swap = Transaction(make_plan(lay, make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd")),
                       lay, host, front, FakeGate(), Journal(lay.swap_dir("s1"), echo=None)).run()
    assert swap.result == "locked" and "maintenance window" in swap.reason


def test_an_abandoned_window_is_closed_by_the_supervisor_with_the_gate(lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    # The deploy that opened it is gone (its SSH session ended).
    maint(lay, host, front, plan).open("Docker restart", WindowHold(plan.id, gone_pid(), "x"))
    host.containers.clear()
    assert window_status(lay)[1] == "abandoned"
    gate = FakeGate()
    sup = supervisor(lay, host, front, gate=gate)
    for _ in range(10):
        sup.tick()
        if front.current() == ROUTE:
            break
        sup.nap(5)
    assert front.current() == ROUTE and host.running_now() == {"rigfleet-int8": HASH}
    assert len(gate.runs) == 1 and gate.runs[0].profile == "fast"  # the window's own plan
    assert window_status(lay)[1] == "none" and read_holder(lay.lock_dir) is None
    assert events(lay)[-1] == ("maintenance", "closed")


def test_a_close_killed_midway_leaves_an_abandoned_window_the_next_holder_closes(lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    maint(lay, host, front, plan).open("Docker restart")

    class Killed(BaseException):
        pass

    def die(run: Any) -> None:
        raise Killed("SIGKILL during the close's gate")

    closer = maint(lay, host, front, plan, gate=FakeGate(on_run=die),
                   lock=HostLock(lay, pid=gone_pid()))
    closer.lock.release = lambda: None  # type: ignore[method-assign]  # killed: no finally
    with pytest.raises(Killed):
        closer.close(own=True)
    # Its lock is a dead process's now: stale. The window record still says open.
    assert not read_holder(lay.lock_dir)["alive"] and window_status(lay)[1] == "abandoned"
    out = Ensure(lay, host, front, Journal(lay.swap_dir("ensure-2"), echo=None), who="boot",
                 why="boot", booted_at=0.0, gate=FakeGate()).run()
    assert (out.result, out.serving) == ("closed", ROUTE)
    assert host.running_now() == {"rigfleet-int8": HASH} and front.current() == ROUTE


def test_a_swap_that_promotes_supersedes_a_failed_window_and_one_that_fails_has_no_way_back(
        lay):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    maint(lay, host, front, plan).open("NVIDIA driver 590 install")
    maint(lay, host, front, plan, gate=FakeGate(failed=("soak",))).close(own=True)
    swap_plan = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd"),
                          plan_id="20261201T110000Z-bbbbbb")
    failed = Transaction(swap_plan, lay, host, front, FakeGate(failed=("needles",)),
                         Journal(lay.swap_dir(swap_plan.id), echo=None)).run()
    # The old stack failed its gate after the maintenance: it is no way back.
    assert (failed.result, failed.serving) == ("failed", "maintenance")
    assert host.running_now() == {}
    swap_plan = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd"),
                          plan_id="20261201T120000Z-cccccc")
    ok = Transaction(swap_plan, lay, host, front, FakeGate(),
                     Journal(lay.swap_dir(swap_plan.id), echo=None)).run()
    assert ok.result == "promoted"
    window, status, _ = window_status(lay)
    assert status == "none" and window.reason.startswith("superseded:")


def test_a_swap_that_promotes_ends_a_damaged_window_too(lay):
    # A damaged window counts as failed: the swap treats it so (no way back), and its promotion
    # through its own gate ends it, so the supervisor watches the new stack.
    host, front, ref = serving(lay)
    lay.maintenance_dir.mkdir(parents=True, exist_ok=True)
    lay.window_file.write_text('{"schema": "rigfleet-maintenance/1", "state": "op')
    assert window_status(lay)[1] == "damaged"
    swap_plan = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd"),
                          plan_id="20261201T120000Z-cccccc")
    ok = Transaction(swap_plan, lay, host, front, FakeGate(),
                     Journal(lay.swap_dir(swap_plan.id), echo=None)).run()
    assert ok.result == "promoted"
    window, status, why = window_status(lay)
    assert status == "none" and why.startswith("superseded:")
    assert [p.name for p in lay.maintenance_dir.glob("window.json.damaged-*")]
    sup = supervisor(lay, host, front, gate=FakeGate())
    sup.tick()
    assert sup.rec.state == "watching"


def test_the_cli_opens_reports_and_closes(lay, monkeypatch, capsys):
    host, front, ref = serving(lay)
    plan = window_plan(lay)
    lay.maintenance_dir.mkdir(parents=True, exist_ok=True)
    lay.window_plan(plan.id).write_text(plan.dumps())
    import rigfleet.hostside.__main__ as cli

    monkeypatch.setattr(cli, "_parts", lambda lay_, port: (host, front))
    monkeypatch.setattr(cli, "_gate_fn", lambda: FakeGate())
    root = ["--root", str(lay.root)]
    assert main([*root, "maintenance", "open", "--plan", str(lay.window_plan(plan.id)),
                 "--step", "Docker restart"]) == 0
    assert main([*root, "maintenance", "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status["status"] == "held" and status["window"]["steps"][0]["what"] == "Docker restart"
    # Its holder lives (the session that opened it): a close by hand is refused, naming it.
    assert main([*root, "maintenance", "close", "--journal-id", "close-x-0"]) == 3
    err = capsys.readouterr().err
    assert f"held while pid {session_anchor()[0]}" in err and "--force" in err
    assert window_status(lay)[1] == "held" and front.current() == "maintenance"
    # --force names the holder and (no terminal to ask at) takes it.
    assert main([*root, "maintenance", "close", "--force", "--journal-id", "close-x-1"]) == 0
    assert "close --force: locked by" in capsys.readouterr().err
    done = Journal.read(lay.swap_dir("close-x-1"))
    assert done["state"] == "done" and done["result"]["result"] == "closed"
    assert front.current() == ROUTE



def test_a_close_by_hand_on_a_host_that_never_had_a_window_has_nothing_to_close(lay, capsys):
    """docs/maintenance.md: `close` exits 0 when there was nothing to close; with no window
    ever (no plan to find) it exited 4, "no plan to close with (none: none)"."""
    assert main(["--root", str(lay.root), "maintenance", "close"]) == 0
    assert "no maintenance window to close" in capsys.readouterr().out


def follow_answers(monkeypatch, answers: list[dict[str, Any]]) -> dict[str, float]:
    """``roles.follow`` against a host whose ``status --id`` gives ``answers`` (the last one
    repeats), on a fake clock."""
    import types

    import roles.follow

    clock = {"t": 0.0}
    monkeypatch.setattr(roles.follow, "time", types.SimpleNamespace(
        monotonic=lambda: clock["t"], sleep=lambda s: clock.update(t=clock["t"] + s)))
    monkeypatch.setattr(roles.follow, "host", types.SimpleNamespace(name="rig-a",
                                                                    log=lambda line: None))
    said = iter(answers)

    def status(command: str) -> tuple[bool, list[str], list[str]]:
        answer = next(said, answers[-1])
        return True, [json.dumps({"events": [], "next": 0, "result": None, **answer})], []

    monkeypatch.setattr(roles.follow, "run_on_host", status)
    return clock


def test_a_job_just_started_is_not_taken_for_dead_before_its_journal_appears(monkeypatch):
    # The swap's plan went up before it waited minutes for a balancer slot: until the started
    # job writes its pid, the host judges it by the plan's age ("died"). The deploy that has
    # just started it waits for the journal instead of failing the host (and freeing the
    # slot while the swap runs).
    import roles.follow

    follow_answers(monkeypatch, [
        {"state": "died"}, {"state": "died"},
        {"state": "running", "events": [{"phase": "lock", "message": "taken"}], "next": 1},
        {"state": "done", "next": 1, "result": {"result": "promoted", "exit": 0,
                                                "serving": "tq3/3333"}}])
    box: dict[str, str] = {}
    roles.follow.follow("20261201T120000Z-cccccc", 7000.0, "/tmp", box)
    assert box == {}
    # One that never writes anything is dead after the start grace.
    clock = follow_answers(monkeypatch, [{"state": "died"}])
    roles.follow.follow("20261201T120000Z-dddddd", 7000.0, "/tmp", box)
    assert "ended without a result" in box["error"] and clock["t"] < 120.0


def test_the_deploy_stops_following_a_close_that_never_started(monkeypatch):
    # `maintenance close` that exits before its journal exists (a plan the host's tool refuses,
    # a bundle that does not start): no pid.json, and a close's journal has no plan.json, so
    # the host says "starting" for ever. The deploy says so after the start grace, not after
    # its whole follow timeout (hours).
    import types

    import roles.follow

    clock = {"t": 0.0}
    monkeypatch.setattr(roles.follow, "time", types.SimpleNamespace(
        monotonic=lambda: clock["t"], sleep=lambda s: clock.update(t=clock["t"] + s)))
    monkeypatch.setattr(roles.follow, "host", types.SimpleNamespace(name="rig-a",
                                                                    log=lambda line: None))
    answer = json.dumps({"events": [], "next": 0, "result": None, "state": "starting"})
    monkeypatch.setattr(roles.follow, "run_on_host", lambda command: (True, [answer], []))
    box: dict[str, str] = {}
    roles.follow.follow("close-d1-1", 7000.0, "/tmp", box, label="maintenance",
                        unit="rigfleet-maint-maint-d1")
    assert "did not start" in box["error"]
    assert "journalctl -u rigfleet-maint-maint-d1" in box["error"]
    assert clock["t"] < 120.0
