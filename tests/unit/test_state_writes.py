"""Crash-safe host state: every record is written atomically (temp file in the same directory,
write, fsync, rename, fsync the directory), a damaged record is rebuilt from the ledger and
the journals or named with what to do, and a host tool killed between any two writes of a
swap ends (after the next ``ensure``) serving a verified stack.

The os calls the writers make are recorded through a proxy of the ``os`` module that
``rigfleet.hostside.atomic`` (and ``active``, for the snapshot link) use; the kills raise a
``BaseException`` at a chosen call, which, like SIGKILL, runs past every ``except
Exception`` (the lock's release is disabled as SIGKILL would skip it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import swap_fakes as fakes
from swap_fakes import (
    FakeFront,
    FakeGate,
    FakeHost,
    compose_text,
    gone_pid,
    journal,
    ledger_lines,
    make_plan,
    make_ref,
)

import rigfleet.hostside.active as active_mod
import rigfleet.hostside.atomic as atomic
import rigfleet.hostside.lock as lock_mod
from rigfleet.hostside import ledger
from rigfleet.hostside.active import ActiveDamaged, load_active, request_reset
from rigfleet.hostside.ensure import Ensure
from rigfleet.hostside.front import Front
from rigfleet.hostside.journal import Journal
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.lock import HostLock
from rigfleet.hostside.maintenance import Maintenance, window_status
from rigfleet.hostside.probe import probe
from rigfleet.hostside.supervise import Policy
from rigfleet.hostside.supervisor import Supervisor
from rigfleet.hostside.transaction import Transaction

OLD, NEW = "1111aaaa2222bbbb", "3333cccc4444dddd"


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)


class Killed(BaseException):
    """The host tool was killed here (SIGKILL: no ``except``, no ``finally`` that matters)."""


class OsProxy:
    """``os`` for the writers: records (call, path) of the calls that make a write durable,
    and raises ``Killed`` before the ``kill_at``-th of them (replace, fsync, a ledger append)."""

    def __init__(self, kill_at: int = 0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fds: dict[int, str] = {}
        self.kill_at = kill_at
        self.points = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _point(self, what: str) -> None:
        self.points += 1
        if self.kill_at and self.points == self.kill_at:
            raise Killed(what)

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        fd = os.open(path, flags, mode)
        self.fds[fd] = str(path)
        kind = "open-dir" if os.path.isdir(path) else \
            "append" if flags & os.O_APPEND else "open-tmp" if flags & os.O_EXCL else "open"
        self.calls.append((kind, str(path)))
        return fd

    def write(self, fd: int, data: Any) -> int:
        if self.fds.get(fd, "").endswith(".jsonl") and self.fds[fd].endswith("ledger.jsonl"):
            self._point(f"ledger append {data[:60]!r}")
        self.calls.append(("write", self.fds.get(fd, "?")))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._point(f"fsync {self.fds.get(fd)}")
        self.calls.append(("fsync", self.fds.get(fd, "?")))
        os.fsync(fd)

    def close(self, fd: int) -> None:
        self.calls.append(("close", self.fds.pop(fd, "?")))
        os.close(fd)

    def replace(self, src: Any, dst: Any) -> None:
        self._point(f"rename {src} -> {dst}")
        self.calls.append(("replace", f"{src} -> {dst}"))
        os.replace(src, dst)

    def rename(self, src: Any, dst: Any) -> None:
        self.calls.append(("rename", f"{src} -> {dst}"))
        os.rename(src, dst)

    def lock_taken(self, lock_dir: Path) -> bool:
        """The lock appeared whole: its holder written atomically in a fresh directory
        beside it, then that directory renamed onto the lock, then the parent fsynced."""
        for i, (kind, where) in enumerate(self.calls):
            src, _, dst = where.partition(" -> ")
            if kind == "rename" and dst == str(lock_dir):
                before = self.writes_of(Path(src) / "holder.json")
                after = self.calls[i + 1:i + 3]
                return before == ATOMIC and after == [("open-dir", str(lock_dir.parent)),
                                                       ("fsync", str(lock_dir.parent))]
        return False

    def writes_of(self, path: Path) -> list[str]:
        """The calls that wrote ``path`` atomically, as a pattern (paths made generic)."""
        out: list[str] = []
        name, parent = path.name, str(path.parent)
        tmp = None
        for kind, where in self.calls:
            if kind == "open-tmp" and Path(where).parent == path.parent \
                    and Path(where).name.startswith(f".{name}."):
                tmp = where
                out = ["open temp in the same directory"]
            elif tmp and where == tmp and kind in ("write", "fsync", "close"):
                out.append(f"{kind} temp")
            elif tmp and kind == "replace" and where == f"{tmp} -> {path}":
                out.append("rename over the record")
            elif tmp and kind == "open-dir" and where == parent and out[-1:] == [
                    "rename over the record"]:
                out.append("open its directory")
            elif tmp and kind == "fsync" and where == parent and out[-1:] == [
                    "open its directory"]:
                out.append("fsync its directory")
                tmp = None
        return out


ATOMIC = ["open temp in the same directory", "write temp", "fsync temp", "close temp",
          "rename over the record", "open its directory", "fsync its directory"]


@pytest.fixture
def proxy(monkeypatch) -> OsProxy:
    p = OsProxy()
    monkeypatch.setattr(atomic, "os", p)
    monkeypatch.setattr(active_mod, "os", p)
    monkeypatch.setattr(lock_mod, "os", p)
    return p



def serving(lay: Layout) -> tuple[FakeHost, FakeFront, Any]:
    """int8 serving, promoted by a transaction the ledger and state.json recorded."""
    host, front, ref = fakes.serving(lay, "int8", OLD)
    ledger.append(lay, "activate", "promoted", ref, deploy_id="old-deploy",
                  gate={"result": "pass"}, active=True)
    ledger.update_state(lay, **ledger.stack_fields(ref), gate={"result": "pass"})
    return host, front, ref


def swap(lay: Layout, host: FakeHost, front: FakeFront, **kw: Any) -> Any:
    plan = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", NEW))
    return plan, Transaction(plan, lay, host, front, FakeGate(), journal(lay, plan), **kw)


# --- the order of every write ------------------------------------------------------------------


def test_every_record_is_written_temp_fsync_rename_fsync_dir(lay, proxy):
    host, front, ref = serving(lay)
    proxy.calls.clear()
    plan, t = swap(lay, host, front)
    assert t.run().result == "promoted"
    front_real = Front(lay, 8000, lambda argv, timeout: (0, ""),
                       lambda *a: (200, {"X-Rigfleet-Route": "maintenance"}, b""))
    front_real.maintenance("test", 30, wait=False)
    request_reset(lay, "alice", "test")
    HostLock(lay).acquire("alice", "test")
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=None)
    sup.save(sup.rec)
    records = {
        "active.json": lay.active_json,
        "the named snapshot": lay.active_snapshot(NEW),
        "state.json": lay.state_file,
        "the transaction's result": lay.swap_dir(plan.id) / "result.json",
        "the transaction's pid record": lay.swap_dir(plan.id) / "pid.json",
        "the staged copy of the compose file": lay.swap_dir(plan.id) / "compose.yaml",
        "the front's route": lay.front_route,
        "the supervisor's record": lay.supervise_state,
        "the reset request": lay.supervise_reset,
    }
    for what, path in records.items():
        assert proxy.writes_of(path) == ATOMIC, what
    assert proxy.lock_taken(lay.lock_dir)
    # The pair changes with one rename: the snapshot is on disk before active.json names it.
    order = [w for k, w in proxy.calls if k == "replace"]
    snap = next(i for i, w in enumerate(order) if w.endswith(str(lay.active_snapshot(NEW))))
    record = next(i for i, w in enumerate(order) if w.endswith(f"-> {lay.active_json}"))
    link = next(i for i, w in enumerate(order) if w.endswith(f"-> {lay.active_compose}"))
    assert snap < record < link
    # The ledger is appended (one write, O_APPEND) and fsynced.
    appends = [i for i, (k, w) in enumerate(proxy.calls) if k == "append"
               and w == str(lay.ledger_file)]
    assert appends and all(proxy.calls[i + 1][0] == "write" and proxy.calls[i + 2][0] == "fsync"
                           for i in appends)


def test_the_window_record_and_its_lock_are_written_atomically(lay, proxy):
    host, front, ref = serving(lay)
    plan = make_plan(lay, make_ref(lay, "int8", OLD), plan_id="maint-x")
    Maintenance(lay, host, front, journal(lay, plan), plan).open("Docker restart")
    assert proxy.writes_of(lay.window_file) == ATOMIC
    assert proxy.lock_taken(lay.lock_dir)


def test_no_state_file_is_written_any_other_way(lay, monkeypatch):
    """A guard on the plain ways to write a file: during a swap, a recreation by the
    supervisor and a maintenance window, only logs (kept container logs) are written so."""
    plain: list[str] = []
    state = str(lay.root / "var/lib/rigfleet")
    for cls_method in ("write_text", "write_bytes"):
        original = getattr(Path, cls_method)

        def guard(self: Path, *a: Any, _o: Any = original, **kw: Any) -> Any:
            if str(self).startswith(state) and "/reports/" not in str(self):
                plain.append(str(self))
            return _o(self, *a, **kw)

        monkeypatch.setattr(Path, cls_method, guard)
    host, front, ref = serving(lay)
    plan, t = swap(lay, host, front)
    assert t.run().result == "promoted"
    host.crash("rigfleet-tq3-mtp-genesis", "ValueError: boom\n")
    sup = Supervisor(lay, host, front, Policy(backoff_s=(0,)), clock=host.wall, echo=None,
                     gate=FakeGate())
    for _ in range(20):
        sup.tick()
        sup.nap(5)
    window = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", NEW), plan_id="maint-y")
    Maintenance(lay, host, front, journal(lay, window), window).open("Docker restart")
    Maintenance(lay, host, front, journal(lay, window), window, gate=FakeGate()).close(own=True)
    # make_plan (the test's stand-in for the deploy's upload) wrote its plan files plainly.
    assert [p for p in plain if not p.endswith((".log", "plan.json"))] == []


# --- damaged records ---------------------------------------------------------------------------

DAMAGE = {
    "empty": b"",
    "truncated": None,  # the first 40 bytes of the real record
    "garbage": b"\x00\x00\x00\x00\x00\x00",
    # Random bytes are rarely UTF-8 (tests/e2e/test_08_faults.py: the supervisor's every
    # look died with UnicodeDecodeError instead of rebuilding the record).
    "not text": b"\x8f\xafQ\xff\x00\xc3(",
    "not an object": b"[]\n",
    "not a record": b'{"schema": "rigfleet-active/1", "ref": {"stack": "int8"}}\n',
}


def boot(lay: Layout, host: FakeHost, front: FakeFront, gate: Any = None) -> Any:
    """The machine restarted: every container is gone; rigfleet-stack.service's ensure."""
    host.containers.clear()
    return Ensure(lay, host, front, Journal(lay.swap_dir(f"ensure-{host.t}"), echo=None),
                  who="rigfleet-stack.service", why="boot", booted_at=10**12,
                  gate=gate or FakeGate()).run()


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_active_record_is_rebuilt_from_the_ledger_at_boot(lay, damage):
    host, front, ref = serving(lay)
    plan, t = swap(lay, host, front)
    assert t.run().result == "promoted"
    text = lay.active_json.read_bytes()
    lay.active_json.write_bytes(DAMAGE[damage] if DAMAGE[damage] is not None else text[:40])
    with pytest.raises(ActiveDamaged, match="the next ensure, swap or deploy rebuilds it"):
        load_active(lay)  # readers never repair
    assert probe(lay)["active_error"]
    out = boot(lay, host, front)
    assert (out.result, out.serving) == ("recreated", f"tq3-mtp-genesis/{NEW}")
    assert host.running_now() == {"rigfleet-tq3-mtp-genesis": NEW}
    rebuilt = load_active(lay)
    assert rebuilt.ref.route_id == f"tq3-mtp-genesis/{NEW}" and rebuilt.deploy_id == plan.id
    assert rebuilt.gate["result"] == "pass"
    line = next(x for x in ledger_lines(lay) if x["event"] == "recover")
    assert line["result"] == "recovered" and "rebuilt from the ledger" in line["reason"]
    assert list(lay.active_dir.glob("active.json.damaged-*"))  # kept for a person


def test_an_older_ledger_without_the_record_is_rebuilt_from_the_transactions_journal(lay):
    host, front, ref = serving(lay)
    plan, t = swap(lay, host, front)
    assert t.run().result == "promoted"
    lines = ledger_lines(lay)
    for line in lines:
        line.pop("ref", None)  # what the ledger of an older rigfleet holds
    lay.ledger_file.write_text("".join(json.dumps(x) + "\n" for x in lines))
    lay.active_json.write_bytes(b"")
    for snap in lay.active_dir.glob("compose*.yaml"):
        snap.unlink()  # and the snapshot is gone too: the transaction kept its own copy
    out = boot(lay, host, front)
    assert out.result == "recreated" and host.running_now() == {"rigfleet-tq3-mtp-genesis": NEW}
    assert lay.active_snapshot(NEW).read_text() == compose_text("tq3-mtp-genesis", NEW)


def test_a_missing_snapshot_is_written_again_from_the_staged_file_with_the_same_hash(lay):
    host, front, ref = serving(lay)
    lay.active_snapshot(OLD).unlink()
    lay.active_compose.unlink()
    out = boot(lay, host, front)
    assert out.result == "recreated" and host.running_now() == {"rigfleet-int8": OLD}
    assert ledger_lines(lay)[-2]["event"] == "recover"


def test_an_active_record_nothing_can_rebuild_says_exactly_what_to_do(lay):
    host, front, ref = serving(lay)
    lay.ledger_file.write_text("")
    lay.active_json.write_text("{garbage")
    for snap in lay.active_dir.glob("compose*.yaml"):
        snap.unlink()
    lay.compose_file("int8").unlink()
    out = boot(lay, host, front)
    assert (out.result, out.exit, out.phase) == ("failed", 2, "active")
    assert "is not JSON" in out.reason and "cannot be rebuilt" in out.reason
    assert "run the deploy (it activates the inventory's stack through the gate)" in out.reason
    assert front.current() == "maintenance" and "run the deploy" in front.messages[-1]
    assert ledger_lines(lay)[-1]["result"] == "failed"
    # The deploy's swap then activates the desired stack through the gate (no rollback).
    plan, t = swap(lay, host, front)
    done = t.run()
    assert done.result == "promoted" and done.kind == "activate"


def test_a_damaged_state_file_is_rebuilt_from_the_ledger_not_emptied(lay):
    host, front, ref = serving(lay)
    lay.state_file.write_text('{"stack": "int8", "dig')
    state = ledger.update_state(lay, last_swap={"id": "x"})
    assert state["stack"] == "int8" and state["config_hash"] == OLD
    assert state["gate"] == {"result": "pass"} and state["last_swap"] == {"id": "x"}
    assert list(lay.state_dir.glob("state.json.damaged-*"))


def test_a_damaged_window_record_is_a_failed_window_the_boot_closes_with_the_gate(lay):
    host, front, ref = serving(lay)
    plan = make_plan(lay, make_ref(lay, "int8", OLD), plan_id="maint-z", gate_profile="fast")
    lay.maintenance_dir.mkdir(parents=True, exist_ok=True)
    lay.window_plan(plan.id).write_text(plan.dumps())
    lay.window_file.write_text("{\"schema\": \"rigfleet-mainten")
    assert window_status(lay)[1] == "damaged"
    gate = FakeGate()
    out = boot(lay, host, front, gate)
    assert (out.result, out.serving) == ("closed", f"int8/{OLD}") and gate.runs[0].profile == "fast"


def test_a_damaged_supervisor_record_starts_a_fresh_count(lay):
    host, front, ref = serving(lay)
    lay.supervise_dir.mkdir(parents=True, exist_ok=True)
    lay.supervise_state.write_text("\x00\x00")
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=None)
    sup.tick()
    assert sup.rec.state == "watching"
    assert json.loads(lay.supervise_state.read_text())["state"] == "watching"


def test_the_supervisor_repairs_a_damaged_active_record_with_the_lock(lay):
    host, front, ref = serving(lay)
    lay.active_json.write_text("")
    sup = Supervisor(lay, host, front, Policy(), clock=host.wall, echo=None)
    sup.tick()
    assert load_active(lay).ref.route_id == f"int8/{OLD}"
    sup.tick()
    assert sup.rec.state == "watching" and host.running_now() == {"rigfleet-int8": OLD}


# --- killed between any two writes of a swap ---------------------------------------------------


def kill_points(lay: Layout) -> int:
    """How many kill points one swap has (counted on a run that is not killed)."""
    host, front, ref = serving(lay)
    p = OsProxy()
    import pytest as _pytest

    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(atomic, "os", p)
        mp.setattr(active_mod, "os", p)
        plan, t = swap(lay, host, front)
        assert t.run().result == "promoted"
    return p.points


KILL_POINTS = 40  # a swap has 29 today (each record write: fsync, rename, fsync the dir)


def test_the_kill_points_cover_the_whole_swap(tmp_path):
    assert 20 <= kill_points(Layout(tmp_path)) <= KILL_POINTS


@pytest.mark.parametrize("at", range(1, KILL_POINTS + 1))
def test_killed_between_any_two_writes_of_a_swap_the_host_ends_serving_a_verified_stack(
        tmp_path, monkeypatch, at):
    if at > kill_points(Layout(tmp_path / "count")):
        pytest.skip(f"a swap has fewer than {at} kill points")
    lay = Layout(tmp_path / "host")
    host, front, ref = serving(lay)
    proxy = OsProxy(kill_at=at)
    monkeypatch.setattr(atomic, "os", proxy)
    monkeypatch.setattr(active_mod, "os", proxy)
    dead = gone_pid()
    lock = HostLock(lay, pid=dead)
    lock.release = lambda: None  # type: ignore[method-assign]  # SIGKILL: no finally
    plan = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", NEW))
    try:
        Transaction(plan, lay, host, front, FakeGate(), journal(lay, plan), lock=lock).run()
    except Killed:
        pass
    else:
        pytest.fail(f"kill point {at} was not reached")
    monkeypatch.setattr(atomic, "os", os)
    monkeypatch.setattr(active_mod, "os", os)
    pid_file = lay.swap_dir(plan.id) / "pid.json"
    if pid_file.exists():  # the killed process's pid, as the next boot sees it
        pid_file.write_text(json.dumps({**json.loads(pid_file.read_text()), "pid": dead}))
    hour_ago = os.stat(lay.plan_file(plan.id)).st_mtime - 3600
    os.utime(lay.plan_file(plan.id), (hour_ago, hour_ago))  # the boot comes later
    # Every record reads back whole: the old one or the new one.
    active = load_active(lay)
    assert active is not None and active.ref.route_id in (f"int8/{OLD}", f"tq3-mtp-genesis/{NEW}")
    assert json.loads(lay.state_file.read_text())["stack"] in ("int8", "tq3-mtp-genesis")
    out = boot(lay, host, front)
    assert out.exit == 0, out.reason
    active = load_active(lay)
    assert front.current() == active.ref.route_id == out.serving
    assert host.running_now() == {active.ref.container: active.ref.config_hash}
    # The killed transaction has its result and a ledger line (never left hanging), unless
    # it died before it began (no pid record: it took no lock and changed nothing).
    done = Journal.read(lay.swap_dir(plan.id))
    if pid_file.exists():
        assert done["state"] == "done"
        assert done["result"]["result"] != "interrupted" or \
            any(x["event"] == "interrupted" for x in ledger_lines(lay))
    else:
        assert done["state"] == "died" and host.calls.count("up") == 0


def test_a_line_appended_after_a_torn_one_is_a_line_of_its_own(tmp_path: Path) -> None:
    """A crash cut the ledger's last line (no newline): the next append must not glue onto
    it, or the good line is unreadable too (tests/e2e/test_08_faults.py met it)."""
    path = tmp_path / "ledger.jsonl"
    atomic.append_line(path, json.dumps({"n": 1}))
    with path.open("a") as f:
        f.write('{"event": "swap", "resu')  # torn
    atomic.append_line(path, json.dumps({"n": 2}))
    atomic.append_line(path, json.dumps({"n": 3}))
    lines = path.read_text().splitlines()
    assert lines == ['{"n": 1}', '{"event": "swap", "resu', '{"n": 2}', '{"n": 3}']
    assert [x.get("n") for x in ledger_tail_of(path)] == [1, 2, 3]


def ledger_tail_of(path: Path) -> list[dict[str, Any]]:
    from rigfleet.hostside.records import ledger_tail

    return ledger_tail(path, 10)[0]


def test_a_ledger_with_bytes_that_are_not_text_is_read_line_by_line(tmp_path: Path) -> None:
    from rigfleet.hostside.records import ledger_tail

    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b'{"n": 1}\n\x8f\xaf\xff garbage\n{"n": 2}\n')
    lines, count, problem = ledger_tail(path)
    assert [x["n"] for x in lines] == [1, 2] and count == 3 and problem
