"""An interrupted ``rigfleet bump``: the journal beside the pins file, read back after a kill at
each step of the rollout; what a plain converge then makes of each host; a later bump that
finishes the plan (or records it and stops). Fake runner (no pyinfra, no SSH).

Run: ``.venv/bin/python -m pytest tests/unit/test_bump_journal.py -q``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from bump_helpers import GENESIS_NEW, GOOD, NEWER, probe_of, stack
from test_bump_rollout import FakeRunner, make_plan

from rigfleet.bump import cli as bump_cli
from rigfleet.bump import decide, execute, output
from rigfleet.bump.execute import end_journal, resume_of
from rigfleet.bump.journal import (
    SCHEMA,
    BumpInFlight,
    BumpJournal,
    JournalError,
    journal_path,
    load_journal,
)
from rigfleet.bump.plan import Plan
from rigfleet.bump.rollout import (
    DeployResult,
    Resume,
    Status,
    StillRunning,
    pins_after,
    probe_of_record,
    probe_record,
    rollout,
)
from rigfleet.hostprobe import HostProbe
from rigfleet.pins import Pins, PinsError, load_pins, save_pins

OLD_INT8, NEW_INT8 = stack("int8", GOOD).digest, stack("int8", NEWER).digest


class Killed(BaseException):
    """The control machine dies: nothing after this runs (no ``finally`` writes anything)."""


class KillingRunner(FakeRunner):
    """``FakeRunner`` that dies at one point: ``reach-<batch>`` (before the batch starts),
    ``deploy-<batch>`` (the batch's pyinfra run finished on the hosts, the bump dies before it
    reads them), ``half-<batch>`` (the first host of the batch promoted, the bump and the
    batch's run die before the others started)."""

    def __init__(self, plan: Plan, behaviour: dict[str, str], kill: str | None) -> None:
        super().__init__(plan, behaviour)
        self.kill = kill
        self.reach_calls = 0

    def reachable(self, hosts: Sequence[str]) -> dict[str, str | None]:
        batch = self._batch(hosts[0])
        if self.kill == f"reach-{batch}":
            raise Killed
        return super().reachable(hosts)

    def deploy(self, hosts: Sequence[str], pins_file: Path, batch: int,
               on_line: Callable[[str], None]) -> DeployResult:  # fmt: skip
        if self.kill == f"half-{batch}":
            super().deploy(hosts[:1], pins_file, batch, on_line)
            raise Killed
        result = super().deploy(hosts, pins_file, batch, on_line)
        if self.kill == f"deploy-{batch}":
            raise Killed
        return result

    def _batch(self, host: str) -> int:
        return next(i for i, b in enumerate(self.plan.batches) if host in b)


def journal_for(plan: Plan) -> BumpJournal:
    cand = {"repository": "vllm/vllm-openai", "tag": f"nightly-{NEWER}",
            "digest": NEW_INT8, "created": None}  # fmt: skip
    return BumpJournal.start(plan, "20261129T104000Z-4242", "ops@ctl", cand, "0.20.2rc1")


def reload(plan: Plan) -> tuple[Pins, BumpJournal]:
    pins = load_pins(plan.pins.path)
    journal = load_journal(pins)
    assert journal is not None
    return pins, journal


def converge_view(plan: Plan) -> dict[str, str]:
    """What a plain converge makes of each host: ``new`` / ``old`` pins, or ``refused``."""
    pins, journal = reload(plan)
    out = {}
    for h in plan.hosts:
        try:
            digest = journal.pins_for(pins, h.name).stacks["int8"].digest
        except BumpInFlight:
            out[h.name] = "refused"
            continue
        out[h.name] = "new" if digest == NEW_INT8 else "old"
    return out


def resume(plan: Plan, runner: FakeRunner) -> tuple[Any, BumpJournal]:
    """A later ``rigfleet bump``: the journal's plan, what it did, the rest rolled out."""
    _, journal = reload(plan)
    runner.deployed.clear()
    result = rollout(journal.plan(plan.pins), runner, Path("cand.yaml"), journal=journal,
                     resume=resume_of(journal))
    return result, journal


# --- a kill at each step ---------------------------------------------------------------------

# (where it dies, what a converge then does per host, what the resumed bump deploys)
KILLS = [
    ("reach-0", {"host1": "old", "host2": "old", "host3": "old"},
     [("host1",), ("host2", "host3")]),
    ("deploy-0", {"host1": "refused", "host2": "old", "host3": "old"}, [("host2", "host3")]),
    ("reach-1", {"host1": "new", "host2": "old", "host3": "old"}, [("host2", "host3")]),
    ("half-1", {"host1": "new", "host2": "refused", "host3": "refused"}, [("host3",)]),
    ("deploy-1", {"host1": "new", "host2": "refused", "host3": "refused"}, []),
]


@pytest.mark.parametrize(("kill", "view", "redeployed"), KILLS, ids=[k[0] for k in KILLS])
def test_killed_then_converged_then_resumed(tmp_path: Path, kill: str, view: dict[str, str],
                                            redeployed: list[tuple[str, ...]]) -> None:
    plan = make_plan(tmp_path, n=3, batch=2)
    runner = KillingRunner(plan, {}, kill)
    journal = journal_for(plan)
    with pytest.raises(Killed):
        rollout(plan, runner, Path("cand.yaml"), journal=journal)
    on_disk = json.loads(journal_path(plan.pins.path).read_text())
    assert on_disk["schema"] == SCHEMA and on_disk["batches"] == [["host1"], ["host2", "host3"]]
    assert converge_view(plan) == view
    runner.kill = None
    result, resumed = resume(plan, runner)
    assert runner.deployed == redeployed  # nobody's swap runs twice
    assert [o.status for o in result.outcomes.values()] == [Status.PROMOTED] * 3
    assert resumed.deploying is None and set(resumed.outcomes) == {"host1", "host2", "host3"}
    new, entry = pins_after(resumed.plan(plan.pins), result, "t", "by", {"bump_id": resumed.id})
    assert new is not None and entry is not None and entry["outcome"] == "promoted"
    assert new.stacks["int8"].digest == NEW_INT8 and new.hosts == {}


def test_a_host_rolled_back_while_the_bump_was_dead_is_failed_not_redeployed(tmp_path):
    plan = make_plan(tmp_path, n=3, batch=2, max_failures=1)
    runner = KillingRunner(plan, {"host3": "rollback"}, "deploy-1")
    with pytest.raises(Killed):
        rollout(plan, runner, Path("cand.yaml"), journal=journal_for(plan))
    runner.kill = None
    result, journal = resume(plan, runner)
    assert runner.deployed == []
    assert result.outcomes["host2"].status is Status.PROMOTED
    host3 = result.outcomes["host3"]
    assert (host3.status, host3.runs_new) == (Status.FAILED, False)
    assert "gate failed 2 check(s)" in host3.reason
    new, entry = pins_after(journal.plan(plan.pins), result, "t", "by")
    assert entry is not None and entry["outcome"] == "partial"
    assert new is not None and set(new.hosts) == {"host1", "host2"}


def test_a_failed_canary_recorded_before_the_kill_still_stops_the_rollout(tmp_path):
    plan = make_plan(tmp_path, n=3, batch=1, max_failures=5)
    runner = KillingRunner(plan, {"host1": "rollback"}, "reach-1")
    journal = journal_for(plan)
    rollout(plan, runner, Path("cand.yaml"), journal=journal)  # stops after the canary
    assert journal.stopped and journal.outcomes["host1"]["status"] == "failed"
    result, _ = resume(plan, runner)
    assert runner.deployed == []
    assert result.outcomes["host2"].status is Status.NOT_ATTEMPTED


def test_a_swap_that_still_runs_is_waited_for(tmp_path):
    plan = make_plan(tmp_path, n=2, batch=1)
    runner = KillingRunner(plan, {}, "deploy-0")
    with pytest.raises(Killed):
        rollout(plan, runner, Path("cand.yaml"), journal=journal_for(plan))
    runner.facts_["host1"] = HostProbe({**runner.facts_["host1"].raw,
                                        "lock": {"who": "root@ctl", "alive": True}})
    runner.kill = None
    with pytest.raises(StillRunning, match="host1: a transaction still runs there"):
        resume(plan, runner)
    _, journal = reload(plan)
    assert journal.in_flight == ["host1"]  # nothing recorded: the next try reads it again


def test_abandon_settles_what_was_deploying_and_starts_nothing(tmp_path):
    plan = make_plan(tmp_path, n=3, batch=2)
    runner = KillingRunner(plan, {}, "half-1")
    with pytest.raises(Killed):
        rollout(plan, runner, Path("cand.yaml"), journal=journal_for(plan))
    _, journal = reload(plan)
    runner.deployed.clear()
    result = rollout(journal.plan(plan.pins), runner, Path("cand.yaml"), journal=journal,
                     resume=replace(resume_of(journal), stop="abandoned by ops"))
    assert runner.deployed == []
    assert [result.outcomes[h].status for h in ("host1", "host2", "host3")] == [
        Status.PROMOTED, Status.PROMOTED, Status.NOT_ATTEMPTED]
    new, _ = pins_after(journal.plan(plan.pins), result, "t", "by")
    assert new is not None and set(new.hosts) == {"host1", "host2"}


def test_settle_tells_a_swap_of_this_batch_from_an_older_one():
    from rigfleet.bump.rollout import settle

    old, new = stack("int8", GOOD), stack("int8", NEWER)
    before = probe_of({"stack": "int8", "digest": old.digest,
                              "last_swap": {"id": "older", "result": "promoted"}},
                       reports=("a.json",))  # fmt: skip
    same = probe_of(dict(before.state), reports=("a.json",))
    assert settle("h", "int8", old, new, before, same, 1) is None  # never started: deploy it
    back = probe_of({**before.state, "last_swap": {"id": "this", "result": "rolled-back",
                                                          "reason": "gate failed"}})
    failed = settle("h", "int8", old, new, before, back, 1)
    assert failed is not None and failed.status is Status.FAILED and failed.runs_new is False
    promoted = settle("h", "int8", old, new, before,
                      probe_of({"stack": "int8", "digest": new.digest}), 1)
    assert promoted is not None and promoted.status is Status.PROMOTED
    lost = settle("h", "int8", old, new, before, "connection refused", 1)
    assert lost is not None and lost.status is Status.LOST
    # What the journal keeps of the facts is enough to tell them apart.
    kept = probe_of_record(json.loads(json.dumps(probe_record(before))))
    assert settle("h", "int8", old, new, kept, same, 1) is None


# --- the journal file and its states -----------------------------------------------------------


def test_the_journal_is_written_before_any_host_changes_and_after_each_host(tmp_path):
    plan = make_plan(tmp_path, n=3, batch=2)
    seen: list[dict[str, Any]] = []
    path = journal_path(plan.pins.path)

    class Watching(FakeRunner):
        def reachable(self, hosts):
            seen.append(json.loads(path.read_text()))
            return super().reachable(hosts)

        def deploy(self, hosts, pins_file, batch, on_line):
            seen.append(json.loads(path.read_text()))
            return super().deploy(hosts, pins_file, batch, on_line)

    rollout(plan, Watching(plan, {}), Path("cand.yaml"), journal=journal_for(plan))
    first, canary_deploying, after_canary, batch1_deploying = seen
    assert first["outcomes"] == {} and first["deploying"] is None
    assert first["new_stacks"]["int8"]["digest"] == NEW_INT8 and first["base_serial"] == 4
    assert canary_deploying["deploying"]["hosts"] == ["host1"]
    assert canary_deploying["deploying"]["before"]["host1"]["reports"] == ["old.json"]
    assert after_canary["outcomes"]["host1"]["status"] == "promoted"
    assert after_canary["deploying"] is None
    assert batch1_deploying["deploying"]["hosts"] == ["host2", "host3"]
    final = json.loads(path.read_text())
    assert set(final["outcomes"]) == {"host1", "host2", "host3"} and final["deploying"] is None
    assert not list(tmp_path.glob(".pins.yaml.bump-journal.json.*"))  # no temporary left


def test_of_two_bumps_starting_at_once_the_second_is_refused(tmp_path, monkeypatch):
    # Both saw no journal before either wrote one: both started, the later write dropping the
    # earlier bump's journal while it rolled hosts out.
    import os
    import socket
    import threading
    from contextlib import suppress

    from rigfleet.bump import journal as journal_module

    plan = make_plan(tmp_path, n=2, batch=1)
    both_checked = threading.Barrier(2, timeout=1)
    real_write = journal_module.write_keeping_mode

    def write_once_both_checked(p: Path, text: str) -> None:
        with suppress(threading.BrokenBarrierError):  # under the lock the other one waits
            both_checked.wait()
        real_write(p, text)

    monkeypatch.setattr(journal_module, "write_keeping_mode", write_once_both_checked)
    outcomes: list[Any] = []

    def start() -> None:
        try:
            outcomes.append(journal_for(plan))
        except JournalError as e:
            outcomes.append(e)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [str(o) for o in outcomes if isinstance(o, JournalError)]
    assert len(refused) == 1, outcomes
    assert refused[0].startswith("the bump 20261129T104000Z-4242 (int8 -> ")
    assert refused[0].endswith(
        f"journal {journal_path(plan.pins.path)}): another bump owns this journal now (pid "
        f"{os.getpid()} on {socket.gethostname()}); nothing changed; allowed: one bump at a "
        "time: wait for it to end, then run `rigfleet bump` again")


# (two take-overs of one journal: each one's control machine, pid, and --abandon or not)
TWO_RESUMES = {"two control machines": {"r1": ("ctlA", 4243, False), "r2": ("ctlB", 4243, False)},
               "two terminals": {"r1": ("ctl", 4243, False), "r2": ("ctl", 4244, False)},
               "a resume and --abandon": {"r1": ("ctl", 4243, False), "r2": ("ctl", 4244, True)}}


@pytest.mark.parametrize("where", TWO_RESUMES.values(), ids=TWO_RESUMES.keys())
def test_of_two_resumes_at_once_the_second_is_refused_naming_the_owner(tmp_path, monkeypatch,
                                                                       capsys, where):
    """Both checked the journal's owner (dead) before either took it over: both took it over
    and rolled the same hosts out, each overwriting the other's outcomes in the journal."""
    import threading
    from contextlib import suppress
    from types import SimpleNamespace

    from rigfleet.bump import journal as journal_module

    plan = make_plan(tmp_path, n=3, batch=2)
    cli_fleet(tmp_path, monkeypatch, plan, FakeRunner(plan, {}))
    journal = journal_for(plan)
    journal.owner = {"host": "ctl", "pid": 4242}  # the bump that wrote it died
    journal.save()
    monkeypatch.setattr(execute, "_alive", lambda pid: False)
    me = lambda: where[threading.current_thread().name]  # noqa: E731
    monkeypatch.setattr(journal_module, "socket", SimpleNamespace(gethostname=lambda: me()[0]))
    monkeypatch.setattr(journal_module, "os", SimpleNamespace(getpid=lambda: me()[1]))
    both_checked = threading.Barrier(2, timeout=5)
    real_take_over = BumpJournal.take_over

    def take_over_once_both_checked(self: BumpJournal) -> None:
        with suppress(threading.BrokenBarrierError):
            both_checked.wait()
        real_take_over(self)

    monkeypatch.setattr(BumpJournal, "take_over", take_over_once_both_checked)
    rolled: list[tuple[str, int, bool]] = []  # who went on to roll (or record) the hosts

    def roll(*_: Any, journal: BumpJournal, **__: Any) -> int:
        rolled.append(me())
        assert journal.owner == {"host": me()[0], "pid": me()[1]}
        raise StillRunning("host2: its swap still runs")  # --abandon: changes nothing more

    monkeypatch.setattr(execute, "execute", roll)
    monkeypatch.setattr(execute, "rollout", roll)
    rcs: dict[str, int] = {}

    def run(name: str) -> None:
        with suppress(StillRunning):
            rcs[name] = execute.run_journal(cli_args(tmp_path, abandon=me()[2]))

    threads = [threading.Thread(target=run, args=(n,), name=n) for n in where]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rolled) == 1, rolled  # one goes on
    host, pid, _ = rolled[0]
    loser = next(n for n, w in where.items() if w != rolled[0])
    assert rcs[loser] == output.EXIT_FAILED
    assert json.loads(journal.path.read_text())["owner"] == {"host": host, "pid": pid}
    text = " ".join(capsys.readouterr().err.split())  # (a console capture is per thread)
    assert (f"refused: {journal.describe()}: another bump owns this journal now (pid {pid} on "
            f"{host}); nothing changed; allowed: one bump at a time: wait for it to end, then "
            "run `rigfleet bump` again") in text, text


def test_a_journal_removed_before_its_take_over_is_not_written_again(tmp_path):
    """A resume confirmed after another one finished the bump wrote the journal back (then
    rolled the hosts out again from what it had read)."""
    plan = make_plan(tmp_path)
    journal_for(plan)
    _, read = reload(plan)
    read.path.unlink()  # the other resume ended: the pins file records the bump
    with pytest.raises(JournalError, match="its journal was removed or rewritten meanwhile; "
                                           "nothing changed"):
        read.take_over()
    assert not read.path.exists()


def test_states_open_finished_and_stale(tmp_path):
    plan = make_plan(tmp_path)
    journal = journal_for(plan)
    pins = load_pins(plan.pins.path)
    assert load_journal(pins).state == "open"
    # The bump saved the pins file (its history entry names the journal) and died before
    # removing the journal: finished, ignored by converges.
    saved = save_pins(pins, {"action": "bump", "bump_id": journal.id})
    finished = load_journal(saved)
    assert finished.state == "finished"
    assert finished.pins_for(saved, "host1").stacks == saved.stacks
    # Someone else saved the pins file meanwhile: stale; converges refuse, naming both.
    other = save_pins(saved, {"action": "lock"})
    stale = load_journal(other)
    assert stale.state == "stale"
    with pytest.raises(JournalError, match=r"serial: 6, but the bump 20261129T104000Z-4242 .* "
                                           r"started from serial 4.*--abandon"):
        stale.pins_for(other, "host2")


def test_a_broken_journal_is_refused_naming_file_key_and_value(tmp_path):
    plan = make_plan(tmp_path)
    journal = journal_for(plan)
    data = json.loads(journal.path.read_text())
    data["new_stacks"]["int8"]["digest"] = "sha256:nothex"
    data["outcomes"] = {"host9": {"status": "promoted"}, "host1": {"status": "converged"}}
    journal.path.write_text(json.dumps(data))
    with pytest.raises(JournalError) as e:
        load_journal(load_pins(plan.pins.path))
    text = str(e.value)
    assert f"{journal.path}: new_stacks.int8.digest: 'sha256:nothex'" in text
    assert f"{journal.path}: outcomes.host9:" in text
    # A roll's own outcome is never a bump's.
    assert (f"{journal.path}: outcomes.host1: {{'status': 'converged'}} is not valid; allowed: a "
            "journal host's {status: promoted, failed, lost, skipped, not attempted, up to date"
            in text)
    journal.path.write_text("{not json")
    with pytest.raises(JournalError, match="not JSON"):
        load_journal(load_pins(plan.pins.path))


# --- the converge and the CLI -----------------------------------------------------------------


def test_the_deploy_keeps_a_promoted_canary_on_the_candidate(tmp_path, monkeypatch):
    """``rigfleet.desired`` (what the deploy, status and the host checks build) reads the
    journal with the pins: the canary's compose file is the candidate's, the others' the old."""
    import rigfleet.desired
    from rigfleet.desired import load_desired

    # The bump helpers' fleet runs nightlies on both stacks; int8's stack file allows only
    # releases (tested in test_stack_files and test_swap_plan). The journal is what this is about.
    monkeypatch.setattr(rigfleet.desired, "check_image_rules", lambda *args: None)

    plan = make_plan(tmp_path, n=3, batch=2)
    runner = KillingRunner(plan, {}, "half-1")
    with pytest.raises(Killed):
        rollout(plan, runner, Path("cand.yaml"), journal=journal_for(plan))
    key = tmp_path / "api-key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o600)
    repo = {"url": "http://apt.example/debian", "key_url": "http://apt.example/k.asc",
            "suite": "stable", "components": ["main"]}  # fmt: skip

    def data(stack_name: str) -> dict[str, Any]:
        return {"stack": stack_name, "power_caps_w": [290, 290], "gpu_count": 2,
                "model_dir": "/srv/models", "front_port": 8000, "api_key_file": str(key),
                "pins_file": plan.pins.path,
                "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo}}  # fmt: skip

    rigfleet.desired._PINS.clear()
    canary = load_desired("host1", data("tq3-mtp-genesis"))
    assert canary.current.pins.genesis.commit == GENESIS_NEW
    assert canary.stacks["int8"].pins.digest == NEW_INT8
    assert canary.current.ref.record["pins_serial"] == plan.pins.serial
    assert load_desired("host9", data("int8")).current.pins.digest == OLD_INT8  # not in the plan
    with pytest.raises(BumpInFlight, match=r"host3: the bump .* was deploying this host since"):
        load_desired("host3", data("int8"))
    rigfleet.desired._PINS.clear()


def args_for(tmp_path: Path, **kw: Any) -> argparse.Namespace:
    base = {"inventory": "inv.py", "deploy": str(tmp_path / "deploy.py"), "image": None,
            "latest": False, "genesis": None, "stack": [], "abandon": False}
    return argparse.Namespace(**{**base, **kw})


def test_another_candidate_is_refused_while_a_bump_is_unfinished(tmp_path):
    plan = make_plan(tmp_path)
    journal = journal_for(plan)
    assert execute.other_target(args_for(tmp_path, image=f"nightly-{NEWER}"), journal) is None
    assert execute.other_target(args_for(tmp_path, latest=True), journal) is None
    other = execute.other_target(args_for(tmp_path, image=f"nightly-{GOOD}"), journal)
    assert other is not None and f"--image nightly-{GOOD} is not its candidate" in other
    assert "is not its Genesis" in (execute.other_target(
        args_for(tmp_path, genesis="0" * 40), journal) or "")
    assert execute.other_target(args_for(tmp_path, genesis=GENESIS_NEW[:12]), journal) is None


def test_the_end_removes_the_journal_once_the_pins_file_says_it(tmp_path):
    plan = make_plan(tmp_path)
    journal = journal_for(plan)
    result = rollout(plan, FakeRunner(plan, {}), Path("cand.yaml"), journal=journal)
    saved = execute.record_pins(plan, result, {"bump_id": journal.id})
    assert saved is not None and saved.history[-1]["bump_id"] == journal.id
    end_journal(journal, result, saved)
    assert not journal.path.exists()
    # The pins file saved by someone else meanwhile: the result goes aside, the journal stays.
    (tmp_path / "b").mkdir()
    plan2 = make_plan(tmp_path / "b")
    journal2 = journal_for(plan2)
    result2 = rollout(plan2, FakeRunner(plan2, {}), Path("cand.yaml"), journal=journal2)
    save_pins(load_pins(plan2.pins.path), {"action": "someone else"})
    assert execute.record_pins(plan2, result2, {"bump_id": journal2.id}) is None
    end_journal(journal2, result2, None)
    assert journal2.path.exists()
    assert load_journal(load_pins(plan2.pins.path)).state == "stale"


def test_a_resume_is_a_plain_rollout_over_the_journals_plan(tmp_path):
    """``resume_of`` of a fresh journal is empty: a new bump and a resumed one are one loop."""
    plan = make_plan(tmp_path)
    assert resume_of(journal_for(plan)) == Resume({}, {})


def cli_fleet(tmp_path: Path, monkeypatch, plan: Plan, runner: FakeRunner) -> None:
    """The bump's command line over ``plan``'s hosts, with pyinfra and SSH faked by ``runner``."""
    from rigfleet.inventory import InventoryHost

    key = tmp_path / "api-key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o600)
    repo = {"url": "http://apt.example/debian", "key_url": "http://apt.example/k.asc",
            "suite": "stable", "components": ["main"]}  # fmt: skip
    inventory = [InventoryHost(h.name, h.groups, {
        "stack": h.stack, "power_caps_w": [290, 290], "gpu_count": 2, "model_dir": "/srv/models",
        "front_port": 8000, "api_key_file": str(key), "pins_file": plan.pins.path,
        "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo}}) for h in plan.hosts]
    monkeypatch.setattr(decide, "load_inventory", lambda path: inventory)
    monkeypatch.setattr(execute, "PyinfraRunner", lambda *a, **k: runner)
    for module in (bump_cli, execute):
        monkeypatch.setattr(module, "SshRemote", lambda **_: None)
    monkeypatch.setattr(execute, "keep_images", lambda *a, **k: {})
    monkeypatch.setattr(execute, "PROJECT_ROOT", tmp_path)


def cli_args(tmp_path: Path, **kw: Any) -> argparse.Namespace:
    base = dict(
        inventory="inv.py", deploy=str(tmp_path / "deploy.py"), image=None, latest=False,
        genesis=None, stack=[], batch_size=1, max_failures=1, registry=None, genesis_url=None,
        save_dir=None, push_mirror=None, no_prune=False, dry=False, yes=True, json=False,
        abandon=False, timeout=10.0)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


class CliRunner(KillingRunner):
    """``KillingRunner`` behind the command line: Ctrl-C (``KeyboardInterrupt``) instead of a
    death, and the real candidate pins file checked."""

    def deploy(self, hosts, pins_file, batch, on_line):
        assert pins_file.name.startswith(".pins.yaml.bump-") and pins_file.exists()
        return super().deploy(hosts, Path("cand.yaml"), batch, on_line)

    def reachable(self, hosts):
        if self.kill == f"reach-{self._batch(hosts[0])}":
            raise KeyboardInterrupt
        return FakeRunner.reachable(self, hosts)


def test_ctrl_c_then_the_same_command_again_finishes_the_bump(tmp_path, monkeypatch):
    """The command line end to end (pyinfra and SSH faked): Ctrl-C after the canary promoted
    keeps the journal and says so; ``rigfleet bump`` again finishes the rest, saves the pins
    file (its history names the journal) and removes the journal."""
    from rigfleet.bump.decide import BumpOptions

    plan = make_plan(tmp_path, n=3, batch=2)
    runner = CliRunner(plan, {}, "reach-1")
    cli_fleet(tmp_path, monkeypatch, plan, runner)
    opts = BumpOptions(inventory="inv.py", deploy=str(tmp_path / "deploy.py"),
                       image=f"nightly-{NEWER}", batch_size=2, yes=True)
    inputs = decide.load_inputs(opts)
    rc = execute.execute(opts, inputs, None, plan, None, "0.20.2rc1")
    assert rc == output.EXIT_INTERRUPTED
    pins, journal = reload(plan)
    assert journal.promoted == ["host1"] and pins.serial == plan.pins.serial  # not saved yet
    assert not list(tmp_path.glob(".pins.yaml.bump-*.yaml"))  # the candidate file went
    # Another candidate is refused while this one is unfinished; nothing changes.
    assert bump_cli.run(cli_args(tmp_path, image=f"nightly-{GOOD}")) == bump_cli.EXIT_FAILED
    assert runner.deployed == [("host1",)]

    runner.kill = None
    runner.deployed.clear()
    assert bump_cli.run(cli_args(tmp_path)) == bump_cli.EXIT_OK
    assert runner.deployed == [("host2", "host3")]  # the journal's batches, not --batch-size
    saved = load_pins(plan.pins.path)
    assert saved.serial == plan.pins.serial + 1 and saved.hosts == {}
    assert saved.stacks["int8"].digest == NEW_INT8
    assert saved.history[-1]["bump_id"] == journal.id
    assert saved.history[-1]["outcome"] == "promoted"
    assert not journal.path.exists()


def test_a_broken_journal_stops_a_new_bump_before_the_registry_is_asked(tmp_path, monkeypatch,
                                                                        capsys):
    """An unreadable journal was passed over: the bump resolved and pulled the candidate,
    then refused with "another bump's journal is there ... run `rigfleet bump` to finish it",
    which refused the same way again; the journal's own problem was never said."""
    plan = make_plan(tmp_path)
    cli_fleet(tmp_path, monkeypatch, plan, FakeRunner(plan, {}))
    journal_for(plan).path.write_text("{not json")

    def registry(*a: Any) -> Any:
        raise AssertionError("the registry was asked")

    monkeypatch.setattr(bump_cli, "find_candidate", registry)
    args = cli_args(tmp_path, image=f"nightly-{NEWER}", limit=[])
    assert bump_cli.run(args) == output.EXIT_ERROR
    assert "bump-journal.json: top level: not JSON" in " ".join(capsys.readouterr().err.split())


def test_abandon_records_what_promoted_and_removes_the_journal(tmp_path, monkeypatch):
    plan = make_plan(tmp_path, n=3, batch=2)
    runner = KillingRunner(plan, {}, "half-1")  # --abandon never deploys
    cli_fleet(tmp_path, monkeypatch, plan, runner)
    with pytest.raises(Killed):
        rollout(plan, runner, Path("cand.yaml"), journal=journal_for(plan))
    save_pins(load_pins(plan.pins.path), {"action": "someone else"})  # stale now
    assert bump_cli.run(cli_args(tmp_path)) == bump_cli.EXIT_FAILED  # cannot be finished
    runner.kill = None
    runner.deployed.clear()
    assert bump_cli.run(cli_args(tmp_path, abandon=True)) == bump_cli.EXIT_OK
    assert runner.deployed == []
    saved = load_pins(plan.pins.path)
    assert saved.serial == plan.pins.serial + 2  # over the file as it is now
    assert set(saved.hosts) == {"host1", "host2"}  # host2 settled from what it says
    assert saved.hosts["host2"]["int8"].digest == NEW_INT8
    assert saved.stacks["int8"].digest == OLD_INT8
    assert saved.history[-1]["outcome"] == "partial" and saved.history[-1]["abandoned"]
    assert not journal_path(plan.pins.path).exists()
    assert bump_cli.run(cli_args(tmp_path, abandon=True)) == output.EXIT_ERROR  # none left


def test_pins_lock_is_refused_while_a_bump_is_unfinished(tmp_path):
    from rigfleet.pinlock import lock

    plan = make_plan(tmp_path)
    journal = journal_for(plan)
    before = Path(plan.pins.path).read_text()
    with pytest.raises(PinsError, match=r"bump 20261129T104000Z-4242 .* is unfinished .*"
                                        r"rigfleet bump --yes.*rigfleet bump --abandon"):
        lock(plan.pins.path, registry_url="http://127.0.0.1:9", hub_url="http://127.0.0.1:9")
    assert Path(plan.pins.path).read_text() == before  # nothing looked up, nothing written
    assert load_journal(load_pins(plan.pins.path)).state == "open"
    assert journal.path.exists()


class BracketRunner(CliRunner):
    """pyinfra's lines and a host's reason as they can be: a path in brackets reads as a rich
    closing tag (``[/var/lib/rigfleet]``)."""

    def deploy(self, hosts, pins_file, batch, on_line):
        on_line("[host1] --> [/var/lib/rigfleet] Success")
        if batch == "restore":  # the re-converge of a host that rolled back
            return DeployResult(0, frozenset(), "", 0.1)
        done = super().deploy(hosts, pins_file, batch, on_line)
        for h in hosts:
            if self.behaviour.get(h) == "rollback":
                self.facts_[h].state["last_swap"]["reason"] = "disk full [/var/lib/docker]"
        return done


def test_pyinfra_lines_and_reasons_with_brackets_are_printed_as_text(tmp_path, monkeypatch):
    from rigfleet.bump.decide import BumpOptions

    plan = make_plan(tmp_path, n=2)
    runner = BracketRunner(plan, {"host2": "rollback"}, None)
    cli_fleet(tmp_path, monkeypatch, plan, runner)
    opts = BumpOptions(inventory="inv.py", deploy=str(tmp_path / "deploy.py"),
                       image=f"nightly-{NEWER}", yes=True)
    with output.console.capture() as seen:
        rc = execute.execute(opts, decide.load_inputs(opts), None, plan, None, "0.20.2rc1")
    assert rc == output.EXIT_FAILED
    assert "disk full [/var/lib/docker]" in " ".join(seen.get().split())  # as text, whole


def test_a_resumed_rollback_is_recorded_as_the_rollback(tmp_path, monkeypatch):
    """The history entry's own fields (a rollback's action and serial) live in the journal, so
    the run that finishes an interrupted rollback records them, not a plain bump."""
    from rigfleet.bump.decide import BumpOptions

    plan = make_plan(tmp_path, n=3, batch=2)
    runner = CliRunner(plan, {}, "reach-1")
    cli_fleet(tmp_path, monkeypatch, plan, runner)
    opts = BumpOptions(inventory="inv.py", deploy=str(tmp_path / "deploy.py"), batch_size=2,
                       rollback_to=plan.pins.serial - 1, yes=True)
    rc = execute.execute(opts, decide.load_inputs(opts), None, plan, None, "",
                         history={"action": "rollback", "to_serial": plan.pins.serial - 1})
    assert rc == output.EXIT_INTERRUPTED
    assert reload(plan)[1].history == {"action": "rollback", "to_serial": plan.pins.serial - 1}
    runner.kill = None
    assert bump_cli.run(cli_args(tmp_path)) == bump_cli.EXIT_OK
    entry = load_pins(plan.pins.path).history[-1]
    assert (entry["action"], entry["to_serial"]) == ("rollback", plan.pins.serial - 1)


def test_a_rollback_says_rollback_in_its_result_and_exit_line(tmp_path, monkeypatch, capsys):
    """``rigfleet rollback`` ended with "rigfleet bump: partial in 1s" and "bump failed: ...":
    the command the person ran was not the one named."""
    from rigfleet.bump.decide import BumpOptions

    plan = make_plan(tmp_path, n=3, batch=1)
    cli_fleet(tmp_path, monkeypatch, plan, CliRunner(plan, {"host2": "rollback"}, None))
    monkeypatch.setattr(execute, "restore", lambda *a: None)
    opts = BumpOptions(inventory="inv.py", deploy=str(tmp_path / "deploy.py"),
                       rollback_to=plan.pins.serial - 1, yes=True)
    rc = execute.execute(opts, decide.load_inputs(opts), None, plan, None, "",
                         history={"action": "rollback", "to_serial": plan.pins.serial - 1})
    assert rc == output.EXIT_FAILED
    err = " ".join(capsys.readouterr().err.split())
    assert "rigfleet rollback: partial in" in err and "rollback failed: host2 failed" in err
    assert "bump failed" not in err and "rigfleet bump:" not in err


def test_abandon_with_dry_changes_nothing(tmp_path, monkeypatch):
    """``--abandon --dry`` shows where the hosts stand; it neither saves the pins file nor
    removes the journal (nor does ``--dry`` remove a finished journal)."""
    plan = make_plan(tmp_path, n=3, batch=2)
    runner = KillingRunner(plan, {}, "half-1")
    cli_fleet(tmp_path, monkeypatch, plan, runner)
    with pytest.raises(Killed):
        rollout(plan, runner, Path("cand.yaml"), journal=journal_for(plan))
    before = Path(plan.pins.path).read_text()
    journal_text = journal_path(plan.pins.path).read_text()
    runner.kill = None
    assert bump_cli.run(cli_args(tmp_path, abandon=True, dry=True)) == bump_cli.EXIT_OK
    assert Path(plan.pins.path).read_text() == before
    assert journal_path(plan.pins.path).read_text() == journal_text
    # A finished journal (the pins file names it) stays under --dry too.
    save_pins(load_pins(plan.pins.path), {"action": "bump", "bump_id": "20261129T104000Z-4242"})
    assert execute.run_journal(cli_args(tmp_path, dry=True)) is None  # on to a new bump
    assert journal_path(plan.pins.path).exists()


@pytest.mark.parametrize("abandon", [False, True], ids=["resume", "abandon"])
def test_resume_and_abandon_connect_with_the_timeout_given(tmp_path, monkeypatch, abandon):
    """``--timeout`` (seconds per SSH connect) holds for the run that finishes or records an
    unfinished bump, as for a new one (it used SshRemote's own default)."""
    from rigfleet.bump.decide import BumpOptions

    plan = make_plan(tmp_path, n=3, batch=2)
    runner = CliRunner(plan, {}, "reach-1")
    cli_fleet(tmp_path, monkeypatch, plan, runner)
    opts = BumpOptions(inventory="inv.py", deploy=str(tmp_path / "deploy.py"),
                       image=f"nightly-{NEWER}", batch_size=2, yes=True)
    rc = execute.execute(opts, decide.load_inputs(opts), None, plan, None, "0.20.2rc1")
    assert rc == output.EXIT_INTERRUPTED
    runner.kill = None
    asked: list[float] = []
    monkeypatch.setattr(execute, "SshRemote", lambda connect_timeout=10.0: asked.append(
        connect_timeout))
    assert bump_cli.run(cli_args(tmp_path, abandon=abandon, timeout=3.0)) == bump_cli.EXIT_OK
    assert asked == [3.0]


def test_ctrl_c_while_the_promoted_image_is_saved_keeps_the_journal_and_says_so(
        tmp_path, monkeypatch):
    """Ctrl-C during ``--save-dir``'s docker save (or the mirror copy), after the rollout but
    before the pins file records it: exit 130 with the message naming the journal, as a Ctrl-C
    during the rollout (it was a silent 130 from the top level)."""
    from rigfleet.bump.decide import BumpOptions

    plan = make_plan(tmp_path, n=2)
    runner = CliRunner(plan, {}, None)
    cli_fleet(tmp_path, monkeypatch, plan, runner)

    def ctrl_c(*_: Any, **__: Any) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(execute, "keep_images", ctrl_c)
    opts = BumpOptions(inventory="inv.py", deploy=str(tmp_path / "deploy.py"),
                       image=f"nightly-{NEWER}", yes=True)
    with output.console.capture() as seen:
        rc = execute.execute(opts, decide.load_inputs(opts), None, plan, None, "0.20.2rc1")
    assert rc == output.EXIT_INTERRUPTED
    assert "interrupted" in seen.get() and "host1, host2" in seen.get()
    pins, journal = reload(plan)
    assert pins.serial == plan.pins.serial and journal.promoted == ["host1", "host2"]
    assert not list(tmp_path.glob(".pins.yaml.bump-*.yaml"))


def test_a_resume_never_deploys_hosts_outside_limit(tmp_path, monkeypatch):
    """``rigfleet bump --limit host2`` over an unfinished bump finished the whole plan, host3
    included; now it is refused unless every host still to deploy is inside --limit."""
    from rigfleet.bump.decide import BumpOptions

    plan = make_plan(tmp_path, n=3, batch=1)
    runner = CliRunner(plan, {}, "reach-1")
    cli_fleet(tmp_path, monkeypatch, plan, runner)
    opts = BumpOptions(inventory="inv.py", deploy=str(tmp_path / "deploy.py"),
                       image=f"nightly-{NEWER}", yes=True)
    rc = execute.execute(opts, decide.load_inputs(opts), None, plan, None, "0.20.2rc1")
    assert rc == output.EXIT_INTERRUPTED
    runner.kill = None
    runner.deployed.clear()
    with output.console.capture() as seen:
        rc = bump_cli.run(cli_args(tmp_path, limit=["host2"]))
    assert rc == bump_cli.EXIT_FAILED and runner.deployed == []
    assert "would still deploy host3, outside --limit host2" in " ".join(seen.get().split())
    assert journal_path(plan.pins.path).exists()
    assert bump_cli.run(cli_args(tmp_path, limit=["host2", "host3"])) == bump_cli.EXIT_OK
    assert runner.deployed == [("host2",), ("host3",)]
