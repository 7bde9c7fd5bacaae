"""``rigfleet lock``: the host tool's ``lock --release`` (stale only, the host's liveness rule)
and the control side's view of a holder."""

from __future__ import annotations

import json
import os
import time

import pytest
from swap_fakes import gone_pid

from rigfleet.hostside.__main__ import main as host_main
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.lock import HostLock, LockHeld
from rigfleet.lockcmd import holder_row, read_lock


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)



def write_holder(lay: Layout, **holder) -> None:
    lay.lock_dir.mkdir(parents=True)
    (lay.lock_dir / "holder.json").write_text(json.dumps(
        {"who": "bob@laptop", "why": "swap int8", "since": "2026-12-03T10:00:00+00:00",
         "deploy_id": "D9", "host": "ctl", **holder}))


def test_release_removes_a_holder_whose_process_is_gone(lay, capsys):
    write_holder(lay, pid=gone_pid())
    rc = host_main(["--root", str(lay.root), "lock", "--release", "--reason", "host rebooted",
                    "--by", "alice@ctl"])
    out = capsys.readouterr().out
    assert rc == 0 and not lay.lock_dir.exists()
    assert "released a stale lock (locked by bob@laptop" in out
    assert "by alice@ctl: host rebooted" in out
    HostLock(lay).acquire("carol@ctl", "swap")  # free again


def test_release_refuses_a_live_holder_and_keeps_it(lay, capsys):
    write_holder(lay, pid=os.getpid())
    rc = host_main(["--root", str(lay.root), "lock", "--release", "--reason", "x"])
    assert rc == 3 and (lay.lock_dir / "holder.json").exists()
    assert "refused: locked by bob@laptop" in capsys.readouterr().err
    with pytest.raises(LockHeld):
        HostLock(lay).release_stale()


def test_release_of_a_window_lock_waits_for_its_deadline(lay):
    write_holder(lay, pid=None, window="W1", until=time.time() + 600)
    with pytest.raises(LockHeld):
        HostLock(lay).release_stale()
    (lay.lock_dir / "holder.json").write_text(json.dumps(
        {"who": "bob", "window": "W1", "until": time.time() - 1}))
    assert HostLock(lay).release_stale()["window"] == "W1"
    assert not lay.lock_dir.exists()


def test_release_of_a_free_lock_and_without_a_reason(lay, capsys):
    assert host_main(["--root", str(lay.root), "lock", "--release", "--reason", "x"]) == 0
    assert "free; nothing to release" in capsys.readouterr().out
    assert host_main(["--root", str(lay.root), "lock", "--release"]) == 2


def test_holder_row_says_held_or_stale_and_who():
    assert holder_row(None) == {"state": "free"}
    row = holder_row({"who": "bob", "since": "s", "why": "swap", "pid": 12, "host": "ctl",
                      "alive": True, "deploy_id": "D1"})
    assert row["state"] == "held" and row["process"] == "pid 12 on ctl" and row["alive"]
    row = holder_row({"who": "bob", "window": "W1", "until": 0, "alive": False})
    assert row["state"] == "stale" and row["process"] == "maintenance window W1"
    assert row["until"] == "1970-01-01T00:00:00Z"


class FakeRemote:
    def __init__(self, rc: int, out: str) -> None:
        self.rc, self.out, self.commands = rc, out, []

    def run(self, host, command, *, timeout=120, stdin=b""):
        self.commands.append(command)
        return self.rc, self.out


class Host:
    name = "host1"
    data: dict = {}


def test_read_lock_runs_the_host_tool_and_reads_its_json():
    remote = FakeRemote(0, '{"who": "bob", "alive": false}\n')
    assert read_lock(remote, Host()) == {"who": "bob", "alive": False}
    assert remote.commands == ["/usr/bin/python3 /usr/local/lib/rigfleet/rigfleet-host.pyz "
                               "lock --json"]
    assert read_lock(FakeRemote(0, "null\n"), Host()) is None
    with pytest.raises(RuntimeError, match="no host tool there: run the deploy first"):
        read_lock(FakeRemote(2, "python3: can't open file: No such file or directory"), Host())


def test_release_of_a_free_lock_with_json_prints_json(monkeypatch, capsys):
    import argparse

    from rigfleet import lockcmd

    remote = FakeRemote(0, "null\n")
    monkeypatch.setattr(lockcmd, "SshRemote", lambda timeout: remote)
    monkeypatch.setattr(lockcmd, "one_host", lambda args: Host())
    args = argparse.Namespace(release=True, reason="host rebooted", json=True, timeout=10.0)
    assert lockcmd.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"host": "host1", "state": "free", "released": False}
    assert len(remote.commands) == 1  # nothing to release: only the lock was read
