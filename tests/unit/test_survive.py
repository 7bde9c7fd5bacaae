"""Host-side programs that survive their own faults, locks the stack unit respects, and the
verified image only (issue 19 items 3, 4, 5), on the fake host of ``swap_fakes``.

Faults are injected where the programs write: the record writers raise ``OSError`` with
``ENOSPC`` (a full disk) or ``EROFS`` (a read-only file system), as the kernel's would.
"""

from __future__ import annotations

import errno
import io
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import swap_fakes
from swap_fakes import (
    FakeFront,
    FakeGate,
    FakeHost,
    ledger_lines,
    make_active,
    make_plan,
    make_ref,
)

from rigfleet.hostside import atomic
from rigfleet.hostside.active import load_active
from rigfleet.hostside.ensure import Ensure, shutdown
from rigfleet.hostside.journal import Journal
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.lock import HostLock
from rigfleet.hostside.plan import Active
from rigfleet.hostside.records import SUPERVISE_SCHEMA
from rigfleet.hostside.stackctl import ContainerState
from rigfleet.hostside.steps import (
    EXIT_LOCKED,
    EXIT_PROMOTED,
    EXIT_RETRY,
    Failure,
    Steps,
    local_name,
)
from rigfleet.hostside.supervise import Observation, Policy, Record, engine_death, epoch_of, step
from rigfleet.hostside.supervisor import Supervisor, single_instance
from rigfleet.hostside.transaction import Transaction

HASH = "1111aaaa2222bbbb"
ROUTE = f"int8/{HASH}"
CRASH = "torch.OutOfMemoryError: CUDA out of memory.\n"


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)


def serving(lay: Layout) -> tuple[FakeHost, FakeFront, Any]:
    return swap_fakes.serving(lay, config_hash=HASH)


def tick_until_serving(sup: Any, host: FakeHost, front: FakeFront, ticks: int = 40) -> None:
    """Let the supervisor look until int8 serves and is routed again (at most ``ticks``)."""
    for _ in range(ticks):
        sup.tick()
        if front.current() == ROUTE and host.running_now():
            return
        sup.nap(sup.policy.poll_s)


def fault(code: int) -> OSError:
    return OSError(code, {errno.ENOSPC: "No space left on device",
                          errno.EROFS: "Read-only file system"}[code])


@pytest.fixture
def broken_disk(monkeypatch) -> Iterator[dict[str, Any]]:
    """While ``state["code"]`` is set, every write under ``state["under"]`` fails with it."""
    state: dict[str, Any] = {"code": None, "under": "/"}
    real_atomic, real_append = atomic.write_atomic, atomic.append_line

    def check(path: Path) -> None:
        if state["code"] is not None and str(path).startswith(str(state["under"])):
            e = fault(state["code"])
            e.filename = str(path)
            raise e

    def write_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
        check(path)
        real_atomic(path, data, mode)

    def append_line(path: Path, line: str, sync: bool = True) -> None:
        check(path)
        real_append(path, line, sync)

    for module in ("rigfleet.hostside.atomic", "rigfleet.hostside.ledger",
                   "rigfleet.hostside.journal", "rigfleet.hostside.front",
                   "rigfleet.hostside.active", "rigfleet.hostside.lock"):
        for name, fn in (("write_atomic", write_atomic), ("append_line", append_line),
                         ("atomic_write", lambda p, t, mode=0o644: write_atomic(p, t, mode))):
            monkeypatch.setattr(f"{module}.{name}", fn, raising=False)
    monkeypatch.setattr("rigfleet.hostside.steps.Path.write_text",
                        lambda self, text, *a, **k: (check(self), Path.write_bytes(
                            self, text.encode()))[1])
    yield state


# --- 19.3: programs that survive their own faults ---------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_the_supervisor_rides_out_an_unwritable_state_dir_and_still_recreates(lay, broken_disk,
                                                                             code):
    host, front, ref = serving(lay)
    echo = io.StringIO()
    broken_disk.update(code=code, under=lay.supervise_dir)
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=echo)
    assert sup.run(ticks=1) == 0                           # no crash at its start
    said = echo.getvalue()
    assert f"cannot write {lay.supervise_state}: {fault(code).strerror}; watching on" in said
    assert not lay.supervise_state.exists()
    host.crash("rigfleet-int8", CRASH)                     # the engine dies meanwhile
    tick_until_serving(sup, host, front)
    assert front.routes[-2:] == ["maintenance", ROUTE]     # recreated, served again
    assert ledger_lines(lay)[-1]["result"] == "recreated"  # the ledger is on another disk
    assert any("cannot keep rigfleet-int8's log" in f.read_text()
               for f in lay.swaps_dir.glob("supervise-*/events.jsonl"))
    broken_disk.update(code=None)                          # the disk freed: written again
    sup.tick()
    assert json.loads(lay.supervise_state.read_text())["state"] == "watching"
    assert "records are written again" in echo.getvalue()


def test_on_a_full_disk_it_waits_for_room_for_the_host_lock_then_serves_again(lay,
                                                                            broken_disk):
    host, front, ref = serving(lay)
    echo = io.StringIO()
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=echo)
    sup.tick()
    broken_disk.update(code=errno.ENOSPC, under=lay.root)  # everything of rigfleet's
    host.crash("rigfleet-int8", CRASH)
    for _ in range(10):                                    # no lock, no action, no crash
        sup.tick()
        sup.nap(sup.policy.poll_s)
    said = echo.getvalue()
    assert "the host lock cannot be taken" in said and "No space left on device" in said
    assert host.running_now() == {} and "internal error" not in said
    broken_disk.update(code=None)                          # the cause gone, nobody there
    tick_until_serving(sup, host, front)
    assert front.current() == ROUTE and host.running_now() == {"rigfleet-int8": HASH}


def test_a_recreation_survives_a_ledger_and_journal_that_cannot_be_written(lay, broken_disk,
                                                                          monkeypatch):
    host, front, ref = serving(lay)
    echo = io.StringIO()
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=echo)
    sup.tick()
    broken_disk.update(code=errno.EROFS, under=lay.swaps_dir)
    monkeypatch.setattr("rigfleet.hostside.ledger.append",
                        lambda lay, *line, **fields: (_ for _ in ()).throw(fault(errno.EROFS)))
    host.crash("rigfleet-int8", CRASH)
    tick_until_serving(sup, host, front)
    assert front.current() == ROUTE and host.running_now() == {"rigfleet-int8": HASH}
    said = echo.getvalue()
    assert "journal: cannot write the journal" in said and "ledger: cannot write" in said
    assert "internal error" not in said


def test_a_damaged_supervisor_state_starts_a_fresh_count_with_the_reason(lay):
    host, front, _ = serving(lay)
    lay.supervise_dir.mkdir(parents=True, exist_ok=True)
    lay.supervise_state.write_text(json.dumps({"schema": SUPERVISE_SCHEMA, "attempts": 7}))
    echo = io.StringIO()
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=echo)
    assert sup.rec == Record() and "is damaged (TypeError" in echo.getvalue()
    assert sup.run(ticks=1) == 0 and sup.rec.state == "watching"


def test_a_truncated_supervisor_state_is_said_too(lay):
    host, front, _ = serving(lay)
    lay.supervise_dir.mkdir(parents=True, exist_ok=True)
    lay.supervise_state.write_text(f'{{"schema": "{SUPERVISE_SCHEMA}", "state": "gave-')
    echo = io.StringIO()
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=echo)
    assert sup.rec == Record()
    assert f"{lay.supervise_state} is damaged (" in echo.getvalue()
    assert "starting a fresh count" in echo.getvalue()


def test_the_instance_lock_holds_on_a_read_only_state_dir(lay, monkeypatch):
    lay.supervise_dir.mkdir(parents=True)
    (lay.supervise_dir / "supervisor.lock").touch()
    real_open = __import__("os").open

    def read_only(path, flags, *args):  # EROFS for anything opened to write
        if flags & (0o1 | 0o2 | 0o100):
            raise fault(errno.EROFS)
        return real_open(path, flags, *args)

    monkeypatch.setattr("rigfleet.hostside.supervisor.os.open", read_only)
    with single_instance(lay):
        from rigfleet.hostside.supervisor import AlreadyRunning

        with pytest.raises(AlreadyRunning), single_instance(lay):
            pass


def test_a_journal_that_cannot_be_written_goes_to_the_log_only(tmp_path, broken_disk):
    broken_disk.update(code=errno.EROFS, under=tmp_path)
    echo = io.StringIO()
    j = Journal(tmp_path / "j", echo=echo)
    j.event("ensure", "recreating int8")
    j.finish({"result": "recreated"})
    out = echo.getvalue()
    assert out.count("Read-only file system") == 1 and "recreating int8" in out
    broken_disk.update(code=None)
    j.event("ensure", "written again")
    assert "written again" in (tmp_path / "j" / "events.jsonl").read_text()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_ensure_on_an_unwritable_disk_says_why_and_asks_to_be_retried(lay, broken_disk, code):
    host, front, ref = serving(lay)
    host.down(ref.compose_file, ref.project)               # the boot: the stack is down
    broken_disk.update(code=code, under=lay.root)
    out = Ensure(lay, host, front, Journal(lay.swaps_dir / "e", echo=None), "boot", "boot").run()
    assert (out.result, out.exit, out.phase) == ("failed", EXIT_RETRY, "disk")
    assert fault(code).strerror in out.reason and "tries again" in out.reason
    broken_disk.update(code=None)                          # the cause gone: the retry serves
    out = Ensure(lay, host, front, Journal(lay.swaps_dir / "e2", echo=None), "boot",
                 "boot").run()
    assert out.exit == EXIT_PROMOTED and front.current() == ROUTE


def test_shutdown_on_a_read_only_disk_still_takes_the_stacks_down(lay, broken_disk):
    host, front, ref = serving(lay)
    broken_disk.update(code=errno.EROFS, under=lay.root)
    j = Journal(lay.swaps_dir / "s", echo=None)
    assert shutdown(lay, host, front, j) == "stopped"
    assert host.running_now() == {} and front.current() == "maintenance"


def test_the_stack_unit_restarts_a_retryable_failure_without_a_start_limit():
    from rigfleet.resources import project_file

    stack = project_file("files/rigfleet-stack.service.j2").read_text()
    supervise = project_file("files/rigfleet-supervise.service.j2").read_text()
    assert "StartLimitIntervalSec=0" in stack and "StartLimitIntervalSec=0" in supervise
    assert "Restart=on-failure" in stack and "RestartPreventExitStatus=2 4" in stack
    assert "StartLimitBurst" not in supervise and "Restart=always" in supervise
    assert EXIT_RETRY not in (2, 4)


# --- 19.4: the stack unit and a transaction that holds the lock ------------------------------


def held_by_a_swap(lay: Layout) -> HostLock:
    lock = HostLock(lay)  # this test process: alive
    lock.acquire("alice@ctl", "swap int8 -> tq3-mtp-genesis", "d1")
    return lock


def test_the_stack_units_start_waits_then_leaves_a_running_swap_alone(lay):
    host, front, ref = serving(lay)
    lock = held_by_a_swap(lay)
    try:
        t0 = host.t
        out = Ensure(lay, host, front, Journal(lay.swaps_dir / "e", echo=None), "unit", "boot",
                     lock_wait_s=60, leave_held=True).run()
        assert (out.result, out.exit) == ("left-alone", EXIT_PROMOTED)
        assert "alice@ctl" in out.reason and host.t - t0 >= 60  # it waited (fake clock)
        assert [c for c in host.calls if c.startswith(("up", "down"))] == []
        # The deploy's ensure says "locked" at once.
        out = Ensure(lay, host, front, Journal(lay.swaps_dir / "e2", echo=None), "deploy",
                     "x").run()
        assert out.exit == EXIT_LOCKED
    finally:
        lock.release()


def test_the_stack_units_start_takes_a_lock_freed_during_its_wait(lay):
    host, front, ref = serving(lay)
    host.down(ref.compose_file, ref.project)
    lock = held_by_a_swap(lay)
    sleep = host.sleep

    def swap_ends(seconds: float) -> None:
        sleep(seconds)
        if host.t > 30:
            lock.release()

    host.sleep = swap_ends  # type: ignore[method-assign]
    out = Ensure(lay, host, front, Journal(lay.swaps_dir / "e", echo=None), "unit", "boot",
                 lock_wait_s=60, leave_held=True).run()
    assert out.result == "recreated" and front.current() == ROUTE


def test_the_stack_units_stop_leaves_a_running_swap_alone_unless_the_machine_goes_down(lay):
    host, front, ref = serving(lay)
    lock = held_by_a_swap(lay)
    try:
        j = Journal(lay.swaps_dir / "s", echo=None)
        assert shutdown(lay, host, front, j, lock_wait_s=30,
                        going_down=lambda: False) == "left-alone"
        assert host.running_now() == {"rigfleet-int8": HASH} and front.current() == ROUTE
        assert "left alone" in (j.dir / "events.jsonl").read_text()
        assert shutdown(lay, host, front, j, lock_wait_s=30,
                        going_down=lambda: True) == "stopped"
        assert host.running_now() == {} and front.current() == "maintenance"
        assert lock.read()["who"] == "alice@ctl"  # never taken from the swap
    finally:
        lock.release()


def test_the_stack_units_stop_takes_and_releases_a_free_lock(lay):
    host, front, ref = serving(lay)
    assert shutdown(lay, host, front, Journal(lay.swaps_dir / "s", echo=None)) == "stopped"
    assert host.running_now() == {} and HostLock(lay).read() is None


# --- 19.5: the verified image only ------------------------------------------------------------


def verified(lay: Layout, host: FakeHost) -> Any:
    """int8 active with its verified image id recorded; the ref as ``active.json`` has it."""
    ref = make_ref(lay, "int8", HASH)
    ref = replace(ref, image_id=host.image_id(local_name(ref)))
    return make_active(lay, ref)


def steps(lay: Layout, host: FakeHost) -> Steps:
    return Steps(lay, host, FakeFront(), Journal(lay.swaps_dir / "s", echo=None))


def test_a_tag_that_names_the_verified_image_is_left_as_it_is(lay):
    host = FakeHost()
    ref = verified(lay, host)
    s = steps(lay, host)
    s.pin_image(ref)
    assert s.image_notes == [] and not any(c.startswith("tag") for c in host.calls)


def test_a_moved_tag_is_put_back_on_the_verified_id_and_said(lay):
    host = FakeHost()
    ref = verified(lay, host)
    host.tags[local_name(ref)] = "sha256:" + "e" * 64      # someone retagged another image
    s = steps(lay, host)
    s.start(ref, ref.compose_file)
    assert host.image_id(local_name(ref)) == ref.image_id
    assert host.container("rigfleet-int8").image_id == ref.image_id
    assert s.image_notes == [f"the tag {local_name(ref)} named sha256:eeeeeeeeeeee, not the "
                             f"verified image {ref.image_id[:19]}: moved it back to the "
                             f"verified image (from {ref.image_id[:19]})"]


def test_a_moved_tag_whose_verified_id_is_gone_comes_back_from_the_pinned_digest(lay):
    host = FakeHost()
    ref = verified(lay, host)
    pinned = f"{local_name(ref).rsplit(':', 1)[0]}@{ref.record['digest']}"
    host.images = {pinned}                                 # pruned by id; there by digest
    host.tags[local_name(ref)] = "sha256:" + "e" * 64
    host.image_id = lambda r: (ref.image_id if r == pinned else  # type: ignore[method-assign]
                               FakeHost.image_id(host, r))
    s = steps(lay, host)
    s.pin_image(ref)
    assert f"tag {pinned} {local_name(ref)}" in host.calls
    assert s.image_notes[0].endswith(f"(from {pinned})")


def test_a_moved_tag_with_the_verified_image_gone_is_refused_with_the_reason(lay):
    host = FakeHost()
    ref = verified(lay, host)
    host.tags[local_name(ref)] = "sha256:" + "e" * 64
    host.images = {local_name(ref)}                        # the verified id is gone
    with pytest.raises(Failure) as e:
        steps(lay, host).start(ref, ref.compose_file)
    assert e.value.phase == "image" and "refused" in e.value.reason
    assert "run the deploy" in e.value.reason and not host.containers


def test_a_promotion_records_the_image_id_the_gate_verified(lay):
    host, front = FakeHost(), FakeFront()
    new = make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd")
    plan = make_plan(lay, new)
    out = Transaction(plan, lay, host, front, FakeGate(), Journal(lay.swap_dir(plan.id),
                                                                   echo=None)).run()
    assert out.result == "promoted"
    active = load_active(lay)
    assert active is not None and active.ref.image_id == host.image_id(local_name(new))
    assert ledger_lines(lay)[-1]["ref"]["image_id"] == active.ref.image_id  # recoverable


def test_a_rollback_runs_the_verified_image_after_its_tag_moved(lay):
    host, front = FakeHost(), FakeFront()
    old = verified(lay, host)
    host.up(old.compose_file, old.project)
    front.serve(old)
    host.tags[local_name(old)] = "sha256:" + "e" * 64      # moved while it served
    host.behaviour["tq3-mtp-genesis"] = ("die", "RuntimeError: boom\n")
    new = make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd")
    plan = make_plan(lay, new)
    out = Transaction(plan, lay, host, front, FakeGate(), Journal(lay.swap_dir(plan.id),
                                                                   echo=None)).run()
    assert out.result == "rolled-back" and host.container("rigfleet-int8").image_id == \
        old.image_id
    line = ledger_lines(lay)[-1]
    assert line["result"] == "rolled-back" and "moved it back" in line["image"]


def test_an_engine_on_another_image_than_the_verified_one_is_dead(lay):
    ref = replace(make_ref(lay, "int8", HASH, write=False), image_id="sha256:" + "a" * 64)
    active = Active(ref, "2026-11-29T10:00:00+00:00", "d", "alice@ctl", {"result": "pass"})
    st = ContainerState("running", config_hash=HASH, image_id="sha256:" + "e" * 64)
    obs = Observation(now=1.0, active=active, container=st, healthy=True, route=ROUTE)
    assert "not the verified sha256:aaaaaaaaaaaa" in engine_death(Record(), obs, Policy())


def test_a_record_from_before_image_ids_learns_the_one_it_serves_on_once(lay):
    host, front, ref = serving(lay)                        # make_active: no image_id
    assert ref.image_id == ""
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=None)
    sup.tick()
    sup.tick()
    active = load_active(lay)
    assert active is not None and active.ref.image_id == host.container("rigfleet-int8").image_id
    recorded = [x for x in ledger_lines(lay) if x["result"] == "recorded"]
    assert len(recorded) == 1 and recorded[0]["ref"]["image_id"] == active.ref.image_id
    # Nothing restarted, the same epoch (no fresh count), never again.
    assert not [c for c in host.calls if c.startswith(("up", "down"))]
    assert epoch_of(active) == sup.rec.epoch
    rec, action = step(sup.rec, sup.observe(), Policy())
    assert action.kind == "none"
