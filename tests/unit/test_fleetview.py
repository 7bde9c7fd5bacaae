"""The fleet view (rigfleet/fleetview.py): one pool, error rows, the host view and the probe's
JSON scan. No hosts needed: the SSH layer is a fake."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from test_status import converged_facts, write_pins

from rigfleet.desired import load_desired
from rigfleet.errors import RigfleetError
from rigfleet.facts import SwapProbe
from rigfleet.fleetview import each_host, fleet_view, probe_or_why, reachability
from rigfleet.hostprobe import HostProbe, last_json
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import HostUnreachable


class FakeRemote:
    """Answers the probe with ``answers[host]`` (a dict) or raises it (an exception)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.commands: list[tuple[str, str]] = []

    def run(self, host: InventoryHost, command: str, *, timeout: float = 120,
            stdin: bytes = b"") -> tuple[int, str]:
        self.commands.append((host.name, command))
        answer = self.answers[host.name]
        if isinstance(answer, Exception):
            raise answer
        return 0, "some noise\n" + json.dumps(answer) + "\n"

    def reachable(self, host: InventoryHost) -> str | None:
        answer = self.answers[host.name]
        return str(answer) if isinstance(answer, Exception) else None


def test_each_host_keeps_inventory_order_and_turns_errors_into_rows() -> None:
    hosts = [InventoryHost(n, (), {}) for n in ("c", "a", "b", "d")]
    seen: set[str] = set()
    lock = threading.Lock()

    def fn(h: InventoryHost) -> str:
        with lock:
            seen.add(threading.current_thread().name)
        if h.name == "a":
            raise RigfleetError("a: ssh_port: 0; allowed: 1-65535")
        if h.name == "b":
            raise OSError("b: connection reset")
        if h.name == "d":
            raise KeyError("a bug is not an error row")
        return f"{h.name}: ok"

    with pytest.raises(KeyError):
        each_host(hosts, fn, lambda h, why: f"{h.name} error: {why}")
    rows = each_host(hosts[:3], fn, lambda h, why: f"{h.name} error: {why}")
    assert rows == ["c: ok", "a error: a: ssh_port: 0; allowed: 1-65535",
                    "b error: b: connection reset"]
    assert all(name.startswith("fleet") for name in seen)
    assert each_host([], fn, lambda h, why: why) == []


def gpu_host(tmp_path: Path, name: str, **extra: Any) -> InventoryHost:
    write_pins(tmp_path / "pins.yaml")
    key = tmp_path / "api-key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o600)
    repo = {"url": "http://apt.example/debian", "key_url": "http://apt.example/k.asc",
            "suite": "stable", "components": ["main"]}
    data = {"stack": "int8", "power_caps_w": [290, 290], "gpu_count": 2,
            "model_dir": "/srv/models", "front_port": 8000, "api_key_file": str(key),
            "pins_file": str(tmp_path / "pins.yaml"),
            "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo}, **extra}
    return InventoryHost(name, ("gpu_hosts",), data)


def test_fleet_view_gives_each_host_its_want_and_probe_or_why_not(tmp_path: Path) -> None:
    good, down = gpu_host(tmp_path, "rig-a"), gpu_host(tmp_path, "rig-b")
    bad = gpu_host(tmp_path, "rig-c", stack="nope")
    want = load_desired(good.name, good.data)
    remote = FakeRemote({"rig-a": converged_facts(want),
                         "rig-b": HostUnreachable("rig-b: ssh 10.0.0.8:22: timed out")})
    views = fleet_view([good, down, bad], remote, timeout=5)
    assert [v.host.name for v in views] == ["rig-a", "rig-b", "rig-c"]
    assert views[0].probe is not None and views[0].probe.state["stack"] == "int8"
    assert views[0].error is None
    assert views[1].want is not None and views[1].probe is None
    assert views[1].error == "rig-b: ssh 10.0.0.8:22: timed out"
    # Bad data: the data's own message, and the host is never asked.
    assert views[2].want is None and views[2].probe is None
    assert views[2].error is not None and "rig-c" in views[2].error and "nope" in views[2].error
    assert sorted(h for h, _ in remote.commands) == ["rig-a", "rig-b"]
    # A service host is no rig: never probed for a stack.
    lb = InventoryHost("lb1", ("balancers",), {})
    (view,) = fleet_view([lb], remote, timeout=5)
    assert view.host.kind.balancer and not view.host.kind.gpu and view.probe is None
    assert view.error == "lb1: not a GPU host (groups balancers): no stack to probe"
    assert sorted(h for h, _ in remote.commands) == ["rig-a", "rig-b"]
    # The probe asked is the full one, for the paths and port the host should serve on.
    assert "probe --full --model-path /srv/models/" in remote.commands[0][1]
    assert "--front-port 8000" in remote.commands[0][1]


def test_reachability_and_probe_or_why() -> None:
    hosts = [InventoryHost(n, (), {}) for n in ("up", "down")]
    remote = FakeRemote({"up": {}, "down": HostUnreachable("down: connection refused")})
    assert reachability(remote, hosts) == {"up": None, "down": "down: connection refused"}

    def probe(host: str) -> HostProbe:
        if host == "down":
            raise HostUnreachable("down: connection refused")
        return HostProbe({"state": {"stack": "int8"}})

    assert probe_or_why(probe, "down") == "down: connection refused"
    got = probe_or_why(probe, "up")
    assert isinstance(got, HostProbe) and got.state == {"stack": "int8"}


def test_one_scan_for_the_last_json_line() -> None:
    assert last_json('warming up\n{"a": 1}\n{"b": 2}\n') == {"b": 2}
    assert last_json('{"a": 1}\n  {"b": [1, 2]}  \nbye\n') == {"b": [1, 2]}
    assert last_json("{not json\n") is None
    assert last_json("[1, 2]\n") is None and last_json("") is None
    assert last_json('{"a": 1}\n{"b": \n') is None  # the last one is broken: not an older one
    # The converge's fact reads the probe's answer the same way.
    assert SwapProbe().process(["noise", '{"bare": true}']) == {"bare": True}
    assert SwapProbe().process(["Permission denied"]) == {}


def test_doctor_examines_gpu_hosts_only_through_the_view(tmp_path: Path, monkeypatch, capsys
                                                         ) -> None:
    import argparse

    import rigfleet.cliargs
    import rigfleet.ssh
    from rigfleet.doctor import cli as doctor

    rig, down = gpu_host(tmp_path, "rig-a"), gpu_host(tmp_path, "rig-b")
    lb = InventoryHost("lb1", ("balancers",), {})
    remote = FakeRemote({"rig-a": {"state": {"stack": "int8"}, "doctor": {}},
                         "rig-b": HostUnreachable("rig-b: ssh 10.0.0.8:22: timed out")})
    monkeypatch.setattr(rigfleet.cliargs, "fleet_hosts", lambda args: [rig, lb, down])
    monkeypatch.setattr(rigfleet.ssh, "SshRemote", lambda connect_timeout: remote)
    args = argparse.Namespace(inventory="inv.py", limit=[], json=True, timeout=5.0, load_s=1.0)
    assert doctor.run(args) == doctor.EXIT_UNREACHABLE
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    assert [d["host"] for d in hosts] == ["rig-a", "rig-b"]  # lb1 is no rig
    assert hosts[1]["error"] == "rig-b: ssh 10.0.0.8:22: timed out"
    assert sorted(h for h, _ in remote.commands) == ["rig-a", "rig-b"]
    assert all("--doctor" in c for _, c in remote.commands)
