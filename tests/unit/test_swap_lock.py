"""The host lock: atomic, says who holds it, and a holder that is gone is recognised."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from swap_fakes import gone_pid

from rigfleet.hostside.layout import Layout
from rigfleet.hostside.lock import HostLock, LockHeld, WindowHold
from rigfleet.hostside.records import describe, holder_alive, pid_start_ticks, read_holder


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)



def test_acquire_writes_who_why_since_and_the_pid(lay):
    lock = HostLock(lay)
    assert lock.acquire("alice@ctl", "swap int8 -> tq3-mtp-genesis", "D1") is None
    holder = json.loads((lay.lock_dir / "holder.json").read_text())
    assert holder["who"] == "alice@ctl" and holder["why"].startswith("swap int8")
    assert holder["pid"] == os.getpid() and holder["deploy_id"] == "D1"
    assert holder["pid_start"] == pid_start_ticks(os.getpid()) and holder["since"]
    assert read_holder(lay.lock_dir)["alive"] is True
    lock.release()
    assert not lay.lock_dir.exists() and read_holder(lay.lock_dir) is None


def test_a_live_holder_refuses_a_second_one_with_its_information(lay):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        first = HostLock(lay, pid=sleeper.pid)
        first.acquire("bob@laptop", "swap int8 -> tq3-mtp-genesis", "D2")
        with pytest.raises(LockHeld) as held:
            HostLock(lay).acquire("carol@ctl", "update int8", "D3")
        text = str(held.value)
        assert text.startswith("locked by bob@laptop since ")
        assert f"pid {sleeper.pid}" in text and "deploy D2" in text
        assert text.endswith(": swap int8 -> tq3-mtp-genesis")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_stale_lock_is_recognised_and_taken_over_with_a_note(lay):
    lay.lock_dir.mkdir(parents=True)
    (lay.lock_dir / "holder.json").write_text(json.dumps(
        {"who": "dave@ctl", "why": "swap", "since": "yesterday", "pid": gone_pid()}))
    assert read_holder(lay.lock_dir)["alive"] is False
    lock = HostLock(lay)
    note = lock.acquire("erin@ctl", "swap", "D4")
    assert note.startswith("took over a stale lock (locked by dave@ctl since yesterday")
    assert json.loads((lay.lock_dir / "holder.json").read_text())["who"] == "erin@ctl"
    assert not list(lay.state_dir.glob("lock.stale.*"))
    lock.release()


def test_two_takers_of_one_stale_lock_never_both_hold_it(lay):
    # The boot-time ensure and the supervisor both find the lock a killed swap left. The
    # supervisor breaks it and takes it between the ensure's look and its own break: the
    # ensure must not remove that fresh lock and take it too.
    lay.lock_dir.mkdir(parents=True)
    (lay.lock_dir / "holder.json").write_text(json.dumps(
        {"who": "dave@ctl", "why": "swap", "since": "yesterday", "pid": gone_pid()}))
    ensure, supervisor = HostLock(lay), HostLock(lay, pid=os.getppid())
    look = ensure.read

    def look_then_the_supervisor_takes_it():
        holder = look()
        if holder is not None and not holder["alive"] and not supervisor.held:
            assert supervisor.acquire("rigfleet-supervise.service", "recreate").startswith(
                "took over a stale lock")
        return holder

    ensure.read = look_then_the_supervisor_takes_it
    with pytest.raises(LockHeld, match="rigfleet-supervise.service"):
        ensure.acquire("rigfleet-stack.service", "boot")
    assert not ensure.held
    holder = json.loads((lay.lock_dir / "holder.json").read_text())
    assert (holder["who"], holder["pid"]) == ("rigfleet-supervise.service", os.getppid())


def test_a_reused_pid_or_another_boot_is_not_the_holder():
    me = os.getpid()
    assert holder_alive({"pid": me, "pid_start": pid_start_ticks(me)})
    assert not holder_alive({"pid": me, "pid_start": (pid_start_ticks(me) or 0) + 1})
    assert not holder_alive({"pid": me, "boot_id": "not-this-boot"})
    assert not holder_alive({"pid": None}) and not holder_alive({})


def test_a_half_written_lock_counts_as_held_until_it_is_old(lay):
    lay.lock_dir.mkdir(parents=True)
    holder = read_holder(lay.lock_dir)
    assert holder["alive"] and holder["half_written"]
    with pytest.raises(LockHeld, match="lock being taken"):
        HostLock(lay).acquire("x", "y")
    old = time.time() - 3600
    os.utime(lay.lock_dir, (old, old))
    assert not read_holder(lay.lock_dir)["alive"]
    ahead = time.time() + 3600  # made before the clock was stepped back an hour
    os.utime(lay.lock_dir, (ahead, ahead))
    assert not read_holder(lay.lock_dir)["alive"]
    assert HostLock(lay).acquire("x", "y").startswith("took over a stale lock")


def test_release_never_drops_someone_elses_lock(lay):
    mine = HostLock(lay)
    mine.acquire("a", "b")
    other = HostLock(lay, pid=1)
    other.held = True  # a confused caller
    other.release()
    assert lay.lock_dir.exists()
    mine.release()
    assert describe({"who": "w", "since": "s", "pid": 7, "why": "y"}) == \
        "locked by w since s (pid 7): y"


def _adopt(root: str, start: Any, results: Any) -> None:
    lock = HostLock(Layout(Path(root)))
    start.wait()
    results.put(lock.adopt_window("maint-x", "closing maintenance window maint-x"))


def test_of_closers_adopting_one_abandoned_window_at_once_one_holds_it(lay):
    # The supervisor, a deploy closing an earlier run's window and a person's `maintenance
    # close` find the same abandoned window at once: one of them closes it (recreate + gate).
    fork = multiprocessing.get_context("fork")
    for _ in range(5):
        if lay.lock_dir.exists():
            shutil.rmtree(lay.lock_dir)
        HostLock(lay).acquire("alice@ctl", "maintenance: Docker restart", "maint-x",
                              WindowHold("maint-x", gone_pid(), "the deploy's SSH session"))
        start, results = fork.Barrier(4), fork.Queue()
        closers = [fork.Process(target=_adopt, args=(str(lay.root), start, results))
                   for _ in range(4)]
        for p in closers:
            p.start()
        for p in closers:
            p.join(30)
        assert sorted(results.get(timeout=5) for _ in closers) == [False, False, False, True]
