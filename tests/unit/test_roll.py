"""``rigfleet roll``: bare hosts first and together, serving hosts one batch at a time in the
inventory's order, each run told its batch size; outcomes read back from each host's probe;
the roll stops at the first failure (``--max-failures``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rigfleet.batches import BATCH_ENV
from rigfleet.bump.rollout import DeployResult, PyinfraRunner, Status, pyinfra_command
from rigfleet.hostprobe import HostProbe
from rigfleet.roll import classify, plan_batches, roll
from rigfleet.ssh import HostUnreachable

ROUTE = "int8/1111aaaa2222bbbb"


def serving(route: str = ROUTE, lines: Sequence[dict[str, Any]] = (),
            lock: dict[str, Any] | None = None) -> HostProbe:
    stack, _, config_hash = route.partition("/")
    return HostProbe({"active": {"ref": {"stack": stack, "config_hash": config_hash}},
                      "route": route, "lock": lock,
                      "ledger": {"tail": list(lines), "count": len(lines)}})


def bare() -> HostProbe:
    return HostProbe({"bare": True})


@dataclass
class FakeRunner:
    """Hosts' probes before and after their run; what each run does to them."""

    probes: dict[str, HostProbe | str]
    after_run: dict[str, HostProbe | str] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    runs: list[tuple[str, ...]] = field(default_factory=list)

    def facts(self, host: str) -> HostProbe:
        p = self.probes[host]
        if isinstance(p, str):
            raise HostUnreachable(p)
        return p

    def reachable(self, hosts: Sequence[str]) -> dict[str, str | None]:
        return {h: p if isinstance(p, str) else (f"busy: {p.busy}" if p.busy else None)
                for h, p in ((h, self.probes[h]) for h in hosts)}

    def deploy(self, hosts: Sequence[str], pins_file: Path | None, batch: int | str,
               on_line: Callable[[str], None]) -> DeployResult:
        assert pins_file is None  # a roll converges on the inventory's own pins
        self.runs.append(tuple(hosts))
        for h in hosts:
            if h in self.after_run:
                self.probes[h] = self.after_run[h]
        log = "".join(f"[{h}] Error: rig failed its check\n" for h in hosts if h in self.failing)
        return DeployResult(1 if set(hosts) & self.failing else 0,
                            frozenset(set(hosts) & self.failing), log, 12.0)


CLOSED = {"event": "maintenance", "result": "closed", "gate": {"result": "pass"},
          "reason": "recreated and verified after: NVIDIA driver 590 install; reboot"}
OPENED = {"event": "maintenance", "result": "opened"}


def test_bare_hosts_go_first_together_then_serving_hosts_one_at_a_time_in_order():
    probes: dict[str, HostProbe | str] = {
        "rig-a": serving(), "new-1": bare(), "rig-b": serving(), "rig-c": serving(),
        "new-2": bare(), "gone": "ssh: connection refused",
        "busy": serving(lock={"who": "bob", "why": "swap", "alive": True, "pid": 3})}
    plan = plan_batches(list(probes), probes, batch=1)
    assert plan.batches == (("new-1", "new-2"), ("rig-a",), ("rig-b",), ("rig-c",))
    assert plan.label(1) == "batch 1 (bare)" and plan.label(2) == "batch 2"
    assert plan.skipped["gone"].startswith("unreachable") and "bob" in plan.skipped["busy"]
    two = plan_batches(list(probes), probes, batch=2)
    assert two.batches == (("new-1", "new-2"), ("rig-a", "rig-b"), ("rig-c",))
    with pytest.raises(ValueError, match="--batch: 0 is not a number of hosts"):
        plan_batches(list(probes), probes, batch=0)


def test_each_serving_host_is_maintained_in_its_own_run_and_the_roll_stops_at_a_failure():
    names = ["rig-a", "rig-b", "rig-c"]
    roller = FakeRunner(
        probes={n: serving() for n in names},
        after_run={"rig-a": serving(lines=[OPENED, CLOSED]),
                   "rig-b": serving(route="maintenance", lines=[OPENED, {
                       "event": "maintenance", "result": "failed", "gate": {"result": "fail"},
                       "reason": "maintenance failed (gate): gate failed 1 check(s): needles"}])},
        failing={"rig-b"})
    events: list[str] = []
    result = roll(plan_batches(names, dict(roller.probes), 1), roller, on_event=events.append,
                  order=names)
    assert roller.runs == [("rig-a",), ("rig-b",)]  # one pyinfra run per serving host
    a, b, c = result.outcomes.values()
    assert (a.status, a.gate, a.serving) == (Status.MAINTAINED, "pass", ROUTE)
    assert (b.status, b.gate, b.serving) == (Status.FAILED, "fail", "maintenance")
    assert b.reason == "maintenance failed (gate): gate failed 1 check(s): needles"
    assert c.status is Status.NOT_ATTEMPTED and "--max-failures 1" in c.reason
    assert not result.ok and result.stopped == "1 host(s) failed (--max-failures 1)"
    assert "batch 1: rig-a maintained (gate pass): recreated and verified after" in events[1]


def test_a_host_with_nothing_to_disturb_is_converged_and_a_lost_one_is_lost():
    names = ["rig-a", "rig-b"]
    roller = FakeRunner(probes={"rig-a": serving(), "rig-b": serving()},
                        after_run={"rig-b": "timed out"})
    result = roll(plan_batches(names, dict(roller.probes), 1), roller, max_failures=5,
                  order=names)
    assert result.outcomes["rig-a"].status is Status.CONVERGED
    assert result.outcomes["rig-b"].status is Status.LOST
    assert "unreachable after its run started (timed out)" in result.outcomes["rig-b"].reason


def test_classify_takes_the_reason_from_pyinfra_when_the_ledger_has_none():
    before = serving()
    run = DeployResult(1, frozenset({"rig-a"}), "[rig-a] Error: driver verification: "
                       "nvidia-smi lists 1 GPU(s); gpu_count is 2\n", 30.0)
    out = classify("rig-a", run, before, serving(lines=[OPENED]), 1)
    assert out.status is Status.FAILED and "gpu_count is 2" in out.reason


def test_the_batch_runs_use_the_inventorys_pins_and_say_the_batch_size():
    assert "--data" not in pyinfra_command("inv.py", "deploy.py", ["rig-a"], None)
    cmd = pyinfra_command("inv.py", "deploy.py", ["rig-a", "rig-b"], None)
    assert cmd[1:] == ["inv.py", "deploy.py", "-y", "--json", "--limit", "rig-a",
                       "--limit", "rig-b"]
    runner = PyinfraRunner("inv.py", {}, remote=None, env={BATCH_ENV: "2"})  # type: ignore[arg-type]
    assert runner.env == {"RIGFLEET_MAINTENANCE_BATCH": "2"}


def test_the_runner_hands_the_batch_size_to_pyinfra(monkeypatch):
    import sys

    import rigfleet.bump.rollout as rollout

    script = ("import json, os, sys; sys.stderr.write('batch=' + os.environ['"
              + BATCH_ENV + "'] + chr(10)); print(json.dumps({'results': {'failed_hosts': []}}))")
    monkeypatch.setattr(rollout, "pyinfra_command",
                        lambda *a: [sys.executable, "-c", script])
    runner = PyinfraRunner("inv.py", {}, remote=None, env={BATCH_ENV: "3"})  # type: ignore[arg-type]
    lines: list[str] = []
    result = runner.deploy(["rig-a"], None, 1, lines.append)
    assert lines == ["batch=3"] and result.rc == 0 and result.failed_hosts == frozenset()


def test_the_runner_hands_pyinfra_absolute_paths_and_runs_in_the_deploys_directory(
        tmp_path, monkeypatch):
    """roll, bump and a bump's resume: paths relative to where rigfleet was started, not to the
    deploy's directory where pyinfra runs."""
    import sys

    import rigfleet.bump.rollout as rollout

    asked: list[tuple[Any, ...]] = []
    script = ("import json, os, sys; sys.stderr.write(os.getcwd() + chr(10)); "
              "print(json.dumps({'results': {'failed_hosts': []}}))")

    def command(*args: Any) -> list[str]:
        asked.append(args)
        return [sys.executable, "-c", script]

    (tmp_path / "ops").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rollout, "pyinfra_command", command)
    runner = PyinfraRunner("fleet.py", {}, remote=None,  # type: ignore[arg-type]
                           deploy_file="ops/deploy.py")
    lines: list[str] = []
    assert runner.deploy(["rig-a"], Path("cand.yaml"), 1, lines.append).rc == 0
    assert asked == [(str(tmp_path / "fleet.py"), str(tmp_path / "ops" / "deploy.py"), ["rig-a"],
                      tmp_path / "cand.yaml")]
    assert lines == [str(tmp_path / "ops")]
