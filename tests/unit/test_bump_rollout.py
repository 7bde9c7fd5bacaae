"""``rigfleet bump`` rollout decisions with a fake runner (no pyinfra, no SSH): canary first,
stop after max failures, a failed canary stops everything, unreachable hosts skipped, a host
lost mid-batch reported while its batch finishes; then the pins file written from the result."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from bump_helpers import (
    GENESIS_NEW,
    GOOD,
    NEWER,
    REGRESSED,
    bumped,
    hosts,
    probe_of,
    stack,
    write_pins,
)

from rigfleet.bump.plan import Plan, build_plan
from rigfleet.bump.rollout import (
    DeployResult,
    Status,
    classify,
    gate_of,
    host_error,
    outcome_of,
    pins_after,
    pyinfra_command,
    pyinfra_json,
    rollout,
)
from rigfleet.hostprobe import HostProbe, parse_probe
from rigfleet.hostside.records import ReportSummary, summarise_report
from rigfleet.pins import load_pins, save_pins
from rigfleet.ssh import HostUnreachable

GATE_FAIL = {
    "schema": "rigfleet-verify/1",
    "summary": {"pass": 6, "fail": 2, "skip": 0},
    "checks": [{"name": "spec_decode", "status": "fail"}, {"name": "long_gen", "status": "fail"},
               *({"name": f"c{i}", "status": "pass"} for i in range(6))],
}  # fmt: skip
GATE_PASS = {
    "schema": "rigfleet-verify/1",
    "summary": {"pass": 8, "fail": 0, "skip": 0},
    "checks": [{"name": f"c{i}", "status": "pass"} for i in range(8)],
}


def report(data: dict[str, Any], file: str) -> ReportSummary:
    """A gate report as the host probe summarises it."""
    summary = summarise_report(data, file, 1.0)
    assert summary is not None
    return summary


def state_of(stack_name: str, p: Any) -> dict[str, Any]:
    return {"stack": stack_name, "digest": p.digest, "image": p.image,
            "genesis_commit": p.genesis.commit if p.genesis else None}  # fmt: skip


class FakeRunner:
    """Hosts that promote, roll back (gate fails), get lost mid-deploy or are unreachable."""

    def __init__(self, plan: Plan, behaviour: dict[str, str]) -> None:
        self.plan = plan
        self.behaviour = behaviour  # host -> promote | rollback | lost | unreachable | error
        self.deployed: list[tuple[str, ...]] = []
        self.facts_: dict[str, HostProbe] = {}
        for h in plan.hosts:
            self.facts_[h.name] = probe_of(state_of(h.stack, plan.old_for(h.name)[h.stack]),
                                            reports=("old.json",),
                                            report=report(GATE_PASS, "old.json"))  # fmt: skip
        self.lost: set[str] = set()

    def reachable(self, hosts: Sequence[str]) -> dict[str, str | None]:
        return {h: "connection refused" if self.behaviour.get(h) == "unreachable" else None
                for h in hosts}  # fmt: skip

    def facts(self, host: str) -> HostProbe:
        if host in self.lost:
            raise HostUnreachable(f"{host}: connection refused")
        return self.facts_[host]

    def deploy(self, hosts: Sequence[str], pins_file: Path, batch: int,
               on_line: Callable[[str], None]) -> DeployResult:  # fmt: skip
        assert pins_file.name == "cand.yaml"
        self.deployed.append(tuple(hosts))
        failed, log = set(), []
        for h in hosts:
            stack_name = self.plan.host(h).stack
            b = self.behaviour.get(h, "promote")
            if b == "promote":
                new = self.plan.new_for(h)[stack_name]
                self.facts_[h] = probe_of(
                    state_of(stack_name, new), ledger_count=1,
                    reports=("old.json", f"{h}-new.json"),
                    report=report(GATE_PASS, f"{h}-new.json"))  # fmt: skip
            elif b == "rollback":
                old = self.facts_[h]
                self.facts_[h] = probe_of(
                    {**old.state, "last_swap": {
                        "id": f"swap-{batch}", "result": "rolled-back",
                        "reason": "gate failed 2 check(s): spec_decode, long_gen"}},
                    ledger_count=1, reports=("old.json", f"{h}-new.json"),
                    report=report(GATE_FAIL, f"{h}-new.json"))  # fmt: skip
                failed.add(h)
                log.append(f"[{h}] Error: swap rolled back")
            elif b == "lost":
                self.lost.add(h)
                failed.add(h)
                log.append(f"[{h}] Error: connection lost (Socket is closed)")
            elif b == "error":
                failed.add(h)
                log.append(f"[{h}] Error: apt-get failed")
        return DeployResult(1 if failed else 0, frozenset(failed), "\n".join(log), 1.0)


def make_plan(tmp_path: Path, n: int = 3, batch: int = 1, max_failures: int = 1,
              sha: str = NEWER, unreachable: dict | None = None) -> Plan:  # fmt: skip
    pins = write_pins(tmp_path)
    # host1 (the canary) also serves int8: a batch after it never swaps every int8 host at
    # once (the batch cap, rigfleet.bump.plan.serving_cap).
    stacks = ["int8"] * n
    return build_plan(hosts(*stacks), unreachable or {}, pins,
                      bumped(pins, sha, genesis=GENESIS_NEW), batch, max_failures)  # fmt: skip


def run(plan: Plan, runner: FakeRunner):
    events: list[str] = []
    result = rollout(plan, runner, Path("cand.yaml"), on_event=events.append)
    return result, events


def test_good_bump_promotes_canary_then_the_rest(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, batch=2)
    runner = FakeRunner(plan, {})
    result, events = run(plan, runner)
    assert runner.deployed == [("host1",), ("host2", "host3")]
    assert [o.status for o in result.outcomes.values()] == [Status.PROMOTED] * 3
    assert result.outcomes["host1"].gate == "pass 8/8"
    assert outcome_of(result) == "promoted" and result.stopped is None
    assert events[0] == "canary: deploying host1"
    # Pins: the fleet moves, no host overrides, one history entry with per-host gates.
    new, entry = pins_after(plan, result, "2026-05-20T10:00:00Z", "ops@ctl")
    assert new is not None and entry is not None
    assert new.stacks["int8"].digest == stack("int8", NEWER).digest
    assert new.stacks["tq3-mtp-genesis"].genesis.commit == GENESIS_NEW
    assert new.hosts == {}
    assert entry["outcome"] == "promoted"
    assert entry["old"]["int8"]["image"].endswith(GOOD)
    assert entry["new"]["tq3-mtp-genesis"]["genesis"] == GENESIS_NEW
    assert entry["hosts"]["host2"] == {"result": "promoted", "gate": "pass 8/8"}
    saved = save_pins(new, entry)
    assert load_pins(saved.path).history[-1]["serial"] == plan.pins.serial + 1


def test_regressed_canary_rolls_back_and_nobody_else_is_touched(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, sha=REGRESSED, max_failures=5)
    runner = FakeRunner(plan, {"host1": "rollback"})
    result, _ = run(plan, runner)
    assert runner.deployed == [("host1",)]
    canary = result.outcomes["host1"]
    assert canary.status is Status.FAILED and canary.runs_new is False
    assert canary.failed_checks == ("spec_decode", "long_gen")
    assert canary.gate == "fail: 2 of 8 checks failed (spec_decode, long_gen)"
    assert "rolled-back: gate failed 2 check(s)" in canary.reason
    assert {o.status for h, o in result.outcomes.items() if h != "host1"} == {
        Status.NOT_ATTEMPTED
    }
    assert "canary host1 did not promote" in (result.stopped or "")
    assert outcome_of(result) == "failed"
    assert pins_after(plan, result, "t", "by") == (None, None)  # the file is not written


def test_stop_after_max_failures(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, n=5, batch=1, max_failures=2)
    runner = FakeRunner(plan, {"host2": "rollback", "host3": "error"})
    result, _ = run(plan, runner)
    assert runner.deployed == [("host1",), ("host2",), ("host3",)]
    assert [o.status for o in result.outcomes.values()] == [
        Status.PROMOTED, Status.FAILED, Status.FAILED, Status.NOT_ATTEMPTED, Status.NOT_ATTEMPTED,
    ]  # fmt: skip
    assert result.stopped == "2 host(s) failed (--max-failures 2)"
    assert "apt-get failed" in result.outcomes["host3"].reason
    # Partial: the fleet's pins stay, host1 (promoted) is recorded on the new ones.
    new, entry = pins_after(plan, result, "t", "by")
    assert new is not None and entry is not None and entry["outcome"] == "partial"
    assert new.stacks == plan.pins.stacks
    assert set(new.hosts) == {"host1"}
    assert new.hosts["host1"]["tq3-mtp-genesis"].genesis.commit == GENESIS_NEW
    assert entry["hosts"]["host4"]["result"] == "not attempted"


def test_lost_host_does_not_stop_its_batch_and_is_reported(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, n=3, batch=2, max_failures=1)
    runner = FakeRunner(plan, {"host2": "lost"})
    result, events = run(plan, runner)
    assert runner.deployed == [("host1",), ("host2", "host3")]
    assert result.outcomes["host3"].status is Status.PROMOTED
    lost = result.outcomes["host2"]
    assert lost.status is Status.LOST and lost.runs_new is None
    assert "unreachable after its deploy started" in lost.reason
    assert "connection lost" in lost.reason
    assert any(e.startswith("batch 1: host2 lost") for e in events)
    new, entry = pins_after(plan, result, "t", "by")
    assert entry is not None and entry["outcome"] == "partial"
    assert new is not None and set(new.hosts) == {"host1", "host3"}


def test_unreachable_hosts_are_skipped_and_do_not_count(tmp_path: Path) -> None:
    # host3 down at the start (plan skips it); host2 goes down before its own batch.
    plan = make_plan(tmp_path, n=3, batch=1, max_failures=1,
                     unreachable={"host3": "connection refused"})  # fmt: skip
    runner = FakeRunner(plan, {"host2": "unreachable"})
    result, _ = run(plan, runner)
    assert runner.deployed == [("host1",)]
    assert result.outcomes["host2"].status is Status.SKIPPED
    assert "before its batch" in result.outcomes["host2"].reason
    assert result.outcomes["host3"].status is Status.SKIPPED
    assert "at the start" in result.outcomes["host3"].reason
    assert outcome_of(result) == "promoted"
    new, entry = pins_after(plan, result, "t", "by")
    assert entry is not None and entry["outcome"] == "promoted"
    assert new is not None
    # The fleet moved; the skipped hosts are recorded on what they still run.
    assert set(new.hosts) == {"host2", "host3"}
    assert new.hosts["host2"]["int8"].digest == stack("int8", GOOD).digest
    assert new.for_host("host1").stacks == new.stacks


def test_hosts_outside_limit_are_skipped_not_called_unreachable(tmp_path: Path) -> None:
    """``--limit host1,host2``: host3 showed as "unreachable at the start (outside --limit)"
    in the result table and the pins history; it was never asked, only left out."""
    plan = make_plan(tmp_path, n=3, unreachable={"host3": "outside --limit"})
    result, _ = run(plan, FakeRunner(plan, {}))
    host3 = result.outcomes["host3"]
    assert host3.status is Status.SKIPPED and host3.reason == "outside --limit"
    _, entry = pins_after(plan, result, "t", "by")
    assert entry is not None and "unreachable" not in str(entry["hosts"]["host3"])


def test_unreachable_canary_stops_before_anything(tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    runner = FakeRunner(plan, {"host1": "unreachable"})
    result, _ = run(plan, runner)
    assert runner.deployed == []
    assert "the canary host1 could not be worked on (connection refused)" in (
        result.stopped or "")
    assert outcome_of(result) == "failed"


def test_a_lone_canary_skipped_at_its_batch_is_not_called_promoted(tmp_path: Path,
                                                                    capsys) -> None:
    """A one-host fleet whose host went busy before its batch: nothing changed, yet the bump
    said "promoted, but skipped host(s): host1 ..."."""
    from rigfleet.bump.output import EXIT_SKIPPED, exit_status

    plan = make_plan(tmp_path, n=1)
    result, _ = run(plan, FakeRunner(plan, {"host1": "unreachable"}))
    assert exit_status(result) == EXIT_SKIPPED
    err = " ".join(capsys.readouterr().err.split())
    assert "promoted" not in err.replace("nothing promoted", "")
    assert "nothing promoted; skipped host(s): host1 (unreachable before its batch" in err


def test_classify_edge_cases() -> None:
    old, new = stack("int8", GOOD), stack("int8", NEWER)
    ok = DeployResult(0, frozenset(), "", 1)
    bad = DeployResult(1, frozenset({"h"}), "[h] Error: front role failed", 1)
    on_new = probe_of(state_of("int8", new))
    # Promoted by the swap, but a later role failed: it runs the new pins, yet failed.
    o = classify("h", "int8", old, new, bad, None, on_new, 1)
    assert (o.status, o.runs_new) == (Status.FAILED, True)
    assert "front role failed" in o.reason
    # Something else entirely: unknown.
    odd = probe_of({"stack": "int8", "digest": "sha256:" + "e" * 64})
    o = classify("h", "int8", old, new, ok, None, odd, 1)
    assert (o.status, o.runs_new) == (Status.FAILED, None)
    assert "state.json records" in o.reason
    # pyinfra lost the host while its swap still runs there (a transient unit): unknown.
    busy = probe_of(state_of("int8", old), busy="root@ctl since t: swap int8")
    o = classify("h", "int8", old, new, bad, None, busy, 1)
    assert (o.status, o.runs_new) == (Status.LOST, None)
    assert "a transaction still runs on the host" in o.reason
    # No JSON from pyinfra: its exit status decides.
    assert DeployResult(1, None).failed("anyone") and not DeployResult(0, None).failed("x")


def test_only_a_fresh_report_counts() -> None:
    before = probe_of(reports=("a.json",), report=report(GATE_FAIL, "a.json"))
    stale = probe_of(reports=("a.json",), report=report(GATE_FAIL, "a.json"))
    assert gate_of(before, stale) == ("", (), None)
    swap = {"id": "s2", "result": "rolled-back", "reason": "gate failed 1 check(s): needles",
            "gate": {"result": "fail", "failed_checks": ["needles"], "report": "/r/v.json",
                     "summary": "7 passed, 1 failed, 0 skipped"}}  # fmt: skip
    after = probe_of({"last_swap": swap})
    assert gate_of(None, after) == (
        "fail (needles): 7 passed, 1 failed, 0 skipped", ("needles",), "/r/v.json")
    # The same swap record seen before this run says nothing about this run.
    assert gate_of(probe_of({"last_swap": swap}), after) == ("", (), None)
    promoted = probe_of({"gate": {"result": "pass", "at": "t2"}})
    assert gate_of(probe_of({"gate": {"result": "pass", "at": "t1"}}), promoted)[0] == (
        "pass")


def test_pyinfra_plumbing() -> None:
    cmd = pyinfra_command("inv.py", "deploy.py", ["host1", "host2"], Path("/x/.p.yaml"))
    assert cmd[1:] == ["inv.py", "deploy.py", "-y", "--json", "--data", "pins_file=/x/.p.yaml",
                       "--limit", "host1", "--limit", "host2"]  # fmt: skip
    out = 'noise\n{"plan": [], "results": {"failed_hosts": ["host2"]}}\n'
    assert pyinfra_json(out) == {"plan": [], "results": {"failed_hosts": ["host2"]}}
    assert pyinfra_json("no json") is None
    log = "\x1b[31m[host2] Error: bad\x1b[0m\n[host1] Success\n[host2] did something\n"
    assert host_error(log, "host2") == "[host2] Error: bad"
    assert host_error(log, "host1") is None
    facts = parse_probe(
        '{"state": {"stack": "int8"}, "ledger": {"tail": [{"a": 1}], "count": 7}, '
        '"reports": {"files": ["x.json"], "newest": null}}', "host1")
    assert facts.state == {"stack": "int8"} and facts.ledger_count == 7
    assert facts.ledger_tail == ({"a": 1},) and facts.report_files == ("x.json",)
    with pytest.raises(HostUnreachable, match="host1: the host probe failed: Permission"):
        parse_probe("Permission denied", "host1")


def test_runner_skips_busy_and_unreachable_hosts_before_a_batch() -> None:
    from rigfleet.bump.rollout import PyinfraRunner
    from rigfleet.inventory import InventoryHost

    class FactsRemote:
        def run(self, host, command, *, timeout=120, stdin=b""):
            assert "rigfleet-host.pyz probe --full" in command and not stdin
            if host.name == "down":
                raise HostUnreachable("down: connection refused")
            lock = {"who": "root@ctl", "since": "t", "why": "boot: recreate the active stack",
                    "pid": 7, "alive": True} if host.name == "busy" else None
            return 0, json.dumps({"state": {}, "lock": lock, "ledger": {"tail": [], "count": 0}})

    hosts = {n: InventoryHost(n, (), {}) for n in ("ok", "busy", "down")}
    runner = PyinfraRunner("inv.py", hosts, FactsRemote())  # type: ignore[arg-type]
    assert runner.reachable(["ok", "busy", "down"]) == {
        "ok": None,
        "busy": "busy: locked by root@ctl since t (pid 7): boot: recreate the active stack",
        "down": "down: connection refused",
    }


def test_a_hung_pyinfra_is_killed_at_the_runner_timeout(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A pyinfra run that hangs with stderr open (an SSH session that never answers) blocked
    the bump for ever: the timeout was only applied once stderr had closed."""
    import sys
    import time

    from rigfleet.bump import rollout as rollout_mod

    monkeypatch.setattr(rollout_mod, "pyinfra_command", lambda *a: [
        sys.executable, "-c", "import sys, time; print('started', file=sys.stderr, flush=True); "
        "time.sleep(20)"])
    runner = rollout_mod.PyinfraRunner("inv.py", {}, None, log_dir=tmp_path,  # type: ignore[arg-type]
                                       timeout=1)
    t0 = time.monotonic()
    result = runner.deploy(["host1"], None, 1, lambda _: None)
    assert time.monotonic() - t0 < 10
    assert result.rc != 0 and result.failed("host1")
    assert "killed after 1 s" in (tmp_path / "batch-1.log").read_text()


def test_a_pins_file_saved_meanwhile_is_never_overwritten(tmp_path: Path) -> None:
    from rigfleet.bump.execute import record_pins

    plan = make_plan(tmp_path)
    result, _ = run(plan, FakeRunner(plan, {}))
    save_pins(load_pins(plan.pins.path), {"action": "someone else"})  # serial moves on
    before = Path(plan.pins.path).read_text()
    assert record_pins(plan, result, {}) is None
    assert Path(plan.pins.path).read_text() == before
    aside = load_pins(Path(plan.pins.path).with_name("pins.yaml.bump-result.yaml"))
    assert aside.stacks["int8"].digest == stack("int8", NEWER).digest
    assert aside.history[-1]["outcome"] == "promoted"


def test_the_result_aside_is_what_save_pins_would_have_written(tmp_path: Path,
                                                                monkeypatch) -> None:
    """``<pins>.bump-result.yaml`` (the pins file was saved meanwhile) carried the old serial
    and a history entry without ``serial``, unlike every entry the pins file holds (merged in,
    ``rigfleet rollback`` could not use it); and it was written in place, not atomically."""
    from rigfleet.bump import execute

    plan = make_plan(tmp_path)
    result, _ = run(plan, FakeRunner(plan, {}))
    save_pins(load_pins(plan.pins.path), {"action": "someone else"})  # serial moves on
    written: list[Path] = []
    real = execute.write_keeping_mode
    monkeypatch.setattr(execute, "write_keeping_mode",
                        lambda path, text: (written.append(path), real(path, text)))
    assert execute.record_pins(plan, result, {}) is None
    aside_path = Path(plan.pins.path).with_name("pins.yaml.bump-result.yaml")
    assert written == [aside_path]
    aside = load_pins(aside_path)
    assert aside.serial == plan.pins.serial + 1
    assert aside.history[-1]["serial"] == aside.serial
