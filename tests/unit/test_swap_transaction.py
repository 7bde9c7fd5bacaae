"""The swap transaction's decisions, with fakes for docker, nvidia-smi, the front and the gate.

Every test runs the real ``rigfleet.hostside`` transaction code against a temporary root
(``Layout(tmp_path)``) and ``tests/unit/swap_fakes.py``: the fake host keeps a fake clock, so
"fails fast" and "waited for the memory" are assertions on time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from swap_fakes import (
    FakeFront,
    FakeGate,
    FakeHost,
    compose_text,
    journal,
    ledger_lines,
    make_active,
    make_plan,
    make_ref,
)

from rigfleet.catalog import builtin_catalog
from rigfleet.commands import hosttool
from rigfleet.hostside import ledger
from rigfleet.hostside.active import load_active
from rigfleet.hostside.ensure import Ensure, adopt
from rigfleet.hostside.journal import Journal
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.lock import HostLock
from rigfleet.hostside.plan import READY_TIMEOUT_S, VRAM_TIMEOUT_S
from rigfleet.hostside.records import read_state
from rigfleet.hostside.steps import EXIT_FAILED, EXIT_LOCKED, EXIT_PROMOTED, EXIT_ROLLED_BACK
from rigfleet.hostside.transaction import Transaction

OSERROR_LOG = (
    "INFO 11-29 10:00:00 [api_server.py:1880] vLLM API server version 0.20.2rc1.dev129\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/transformers/utils/hub.py", line 533\n'
    "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
    "'/root/.cache/huggingface/qwen3.6-27b-autoround-int4'. Use `repo_type` argument if needed.\n"
)


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)


def setup_swap(lay: Layout, old_stack: str | None = "int8", new_stack: str = "tq3-mtp-genesis",
               old_hash: str = "1111aaaa2222bbbb", new_hash: str = "3333cccc4444dddd", **kw):
    """An active ``old_stack`` serving on a fake host, and a plan for ``new_stack``."""
    host, front = FakeHost(), FakeFront()
    old = None
    if old_stack is not None:
        old = make_active(lay, make_ref(lay, old_stack, old_hash))
        host.up(str(lay.active_compose), old.project)
        host.t += 10
        front.serve(old)
        host.calls.clear()
    new = make_ref(lay, new_stack, new_hash)
    return host, front, old, make_plan(lay, new, **kw)


def run(lay, host, front, plan, gate=None, **kw):
    return Transaction(plan, lay, host, front, gate or FakeGate(), journal(lay, plan), **kw).run()


# --- the happy path ---------------------------------------------------------------------------


def test_swap_stops_old_waits_for_memory_starts_new_gates_and_promotes(lay):
    host, front, old, plan = setup_swap(lay)
    gate = FakeGate()
    out = run(lay, host, front, plan, gate)
    assert (out.result, out.exit, out.kind) == ("promoted", EXIT_PROMOTED, "swap")
    assert host.running_now() == {"rigfleet-tq3-mtp-genesis": "3333cccc4444dddd"}
    # Old down, then memory polled until released (settled twice), then the new stack up.
    down = next(i for i, c in enumerate(host.calls) if c.startswith("down rigfleet-int8"))
    up = next(i for i, c in enumerate(host.calls) if c.startswith("up rigfleet-tq3"))
    polls = [c for c in host.calls[down:up] if c.startswith("gpus")]
    assert down < up and len(polls) >= 3
    up_at = float(host.calls[up].rsplit("t=", 1)[1])
    assert up_at >= host.release_s
    # The front: 503 during the window, then the new stack (never the unverified one before).
    assert front.routes == ["int8/1111aaaa2222bbbb", "maintenance",
                            "tq3-mtp-genesis/3333cccc4444dddd"]
    # The gate ran against the new stack's loopback port with the host's key file.
    [g] = gate.runs
    assert g.url == "http://127.0.0.1:8015" and g.key_file == lay.api_key_file
    assert g.profile == "full" and g.report_dir == lay.reports_dir
    # Active record: a snapshot of exactly what passed.
    active = load_active(lay)
    assert active.ref.stack == "tq3-mtp-genesis" and active.deploy_id == plan.id
    # The snapshot is named by its config hash (written before active.json names it); the
    # compose.yaml link points at it.
    assert active.ref.compose_file == str(lay.active_snapshot("3333cccc4444dddd"))
    assert lay.active_compose.read_text() == compose_text("tq3-mtp-genesis", "3333cccc4444dddd")
    assert sorted(p.name for p in lay.active_dir.iterdir()) == [
        "active.json", "compose-3333cccc4444dddd.yaml", "compose.yaml"]  # the old one pruned
    assert active.gate["result"] == "pass"
    # Ledger and state.
    [line] = ledger_lines(lay)
    assert (line["event"], line["result"], line["stack"]) == ("swap", "promoted",
                                                              "tq3-mtp-genesis")
    assert line["previous"]["stack"] == "int8" and line["gate"]["result"] == "pass"
    assert line["gate"]["report"].endswith(".json") and line["deploy_id"] == plan.id
    state = read_state(lay.state_file)
    assert state["stack"] == "tq3-mtp-genesis" and state["gate"]["result"] == "pass"
    assert state["last_swap"]["result"] == "promoted"
    assert all(state[k] == line[k] for k in ledger.TRACKED_KEYS)
    assert not lay.lock_dir.exists()
    assert out.window_s and out.timings["gate_s"] >= 0
    done = Journal.read(lay.swap_dir(plan.id))
    assert done["state"] == "done" and done["result"]["result"] == "promoted"
    assert [e["phase"] for e in done["events"]][:3] == ["lock", "plan", "stage"]


def test_the_result_and_last_swap_are_written_before_the_lock_is_released(lay):
    """Another lock holder (a deploy's ``record``) started the moment the lock is free must
    find ``last_swap`` written (no two writers of state.json), and a kill right after the
    release must leave a result, not a swap a later takeover marks ``interrupted``."""
    host, front, _, plan = setup_swap(lay)
    seen: list[tuple[dict, dict | None]] = []

    class WatchedLock(HostLock):
        def release(self) -> None:
            seen.append((read_state(lay.state_file),
                         Journal.read(lay.swap_dir(plan.id))["result"]))
            super().release()

    out = run(lay, host, front, plan, lock=WatchedLock(lay))
    assert out.result == "promoted"
    [(state, result)] = seen
    assert state["last_swap"]["id"] == plan.id and state["last_swap"]["result"] == "promoted"
    assert result is not None and result["result"] == "promoted"
    assert not lay.lock_dir.exists()


def test_the_monitor_hears_of_the_swap_once_the_lock_is_held_before_anything_changes(lay):
    """``on_locked`` (the host tool writes the metrics textfiles there) runs with the lock
    held and before the old stack goes down: the monitor's engine-down alert spares a swap."""
    host, front, _, plan = setup_swap(lay)
    seen: list[tuple[bool, list[str], list[str]]] = []
    out = run(lay, host, front, plan,
              on_locked=lambda: seen.append((lay.lock_dir.is_dir(), list(host.calls),
                                             list(front.routes))))
    assert out.result == "promoted"
    assert seen == [(True, [], ["int8/1111aaaa2222bbbb"])]


def test_first_activation_promotes_without_anything_to_stop(lay):
    host, front, _, plan = setup_swap(lay, old_stack=None, new_stack="int8",
                                      new_hash="5555eeee6666ffff")
    out = run(lay, host, front, plan)
    assert (out.result, out.kind) == ("promoted", "activate")
    assert front.routes == ["maintenance", "int8/5555eeee6666ffff"]
    assert ledger_lines(lay)[-1]["event"] == "activate"


# --- rollbacks --------------------------------------------------------------------------------


def test_gate_failure_rolls_back_to_exactly_the_old_snapshot(lay):
    host, front, old, plan = setup_swap(lay)
    # The stacks directory's int8 file changed since (a later render): the snapshot wins.
    (lay.root / "opt/rigfleet/stacks/int8/compose.yaml").write_text(
        compose_text("int8", "9999999999999999"))
    out = run(lay, host, front, plan, FakeGate(failed=("needles", "needles_deep")))
    assert (out.result, out.exit, out.phase) == ("rolled-back", EXIT_ROLLED_BACK, "gate")
    assert "gate failed 2 check(s): needles, needles_deep" in out.reason
    assert host.running_now() == {"rigfleet-int8": "1111aaaa2222bbbb"}
    assert front.routes[-2:] == ["maintenance", "int8/1111aaaa2222bbbb"]
    assert "tq3-mtp-genesis/3333cccc4444dddd" not in front.routes
    line = ledger_lines(lay)[-1]
    assert (line["event"], line["result"], line["stack"]) == ("swap", "rolled-back", "int8")
    assert line["attempted"]["stack"] == "tq3-mtp-genesis"
    assert line["gate"]["failed_checks"] == ["needles", "needles_deep"]
    assert line["gate"]["report"] and out.kept_log and os.path.exists(out.kept_log)
    state = read_state(lay.state_file)
    assert state.get("stack") in (None, "int8")
    assert state["last_swap"]["result"] == "rolled-back"
    assert state["last_swap"]["gate"]["failed_checks"] == ["needles", "needles_deep"]
    assert load_active(lay).ref.stack == "int8"


def test_a_stack_that_dies_at_boot_fails_fast_naming_the_boot_failure(lay):
    host, front, old, plan = setup_swap(lay, ready_timeout_s=1200.0)
    host.behaviour["tq3-mtp-genesis"] = ("die", OSERROR_LOG)
    gate = FakeGate()
    out = run(lay, host, front, plan, gate)
    assert (out.result, out.phase) == ("rolled-back", "boot")
    assert out.boot_failure["kind"] == "transformers-oserror"
    assert "tq3-mtp-genesis died while booting (exit code 1)" in out.reason
    assert "OSError: Repo id must be in the form" in out.reason
    assert gate.runs == []  # never gated
    assert host.t < 60  # fast: no 1200 s wait
    assert "OSError: Repo id" in Path(out.kept_log).read_text()
    assert host.running_now() == {"rigfleet-int8": "1111aaaa2222bbbb"}


TQ3_EXPECT = tuple((b.pattern, b.title)
                   for b in builtin_catalog().get("tq3-mtp-genesis").boot_expect)
GENESIS_BOOT = ("[Genesis] P66   [ON] cudagraph capture-size filter\n"
                "[Genesis] P67   [ON] TurboQuant multi-query verify kernel\n"
                "INFO [vllm.py:1530] [Genesis P66] Filtered cudagraph_capture_sizes for MTP K=3: "
                "[1, 2, 4, 8] -> [4, 8]\n")


def test_a_stack_that_answers_without_its_expected_boot_lines_is_rolled_back(lay):
    host, front, old, plan = setup_swap(lay)
    plan = replace(plan, desired=replace(plan.desired, boot_expect=TQ3_EXPECT))
    (lay.swap_dir(plan.id) / "plan.json").write_text(plan.dumps())
    host.behaviour["tq3-mtp-genesis"] = ("ok", GENESIS_BOOT.replace("P67   [ON]", "P67   [OFF]"))
    gate = FakeGate()
    out = run(lay, host, front, plan, gate)
    assert (out.result, out.phase) == ("rolled-back", "boot")
    assert out.boot_failure["kind"] == "boot-line-missing"
    assert out.boot_failure["line"] == "Genesis P67 (TurboQuant multi-query verify kernel) applied"
    assert "tq3-mtp-genesis answers, but its stack file's boot.expect line(s) missing" \
        in out.reason
    assert gate.runs == []  # never gated
    assert host.running_now() == {"rigfleet-int8": "1111aaaa2222bbbb"}
    # The same stack printing both lines passes on to the gate and is promoted.
    host.behaviour["tq3-mtp-genesis"] = ("ok", GENESIS_BOOT)
    again = replace(plan, id="20261129T110000Z-abcdef")
    lay.swap_dir(again.id).mkdir(parents=True)
    (lay.swap_dir(again.id) / "plan.json").write_text(again.dumps())
    out = run(lay, host, front, again, gate)
    assert out.result == "promoted", out.reason
    assert load_active(lay).ref.boot_expect == TQ3_EXPECT  # the supervisor checks them too


def test_the_stack_files_failure_signature_comes_first_with_its_hint(lay):
    host, front, old, plan = setup_swap(lay)
    failures = tuple((b.kind, b.pattern, b.title, b.hint)
                     for b in builtin_catalog().get("tq3-mtp-genesis").boot_failures)
    plan = replace(plan, desired=replace(plan.desired, boot_failures=failures))
    (lay.swap_dir(plan.id) / "plan.json").write_text(plan.dumps())
    host.behaviour["tq3-mtp-genesis"] = (
        "die", "ERROR 11-29 10:00:00 [core.py:843] ValueError: Failed to find a kernel that can "
        "implement the WNA16 linear layer. Reasons: \nMarlinLinearKernel cannot implement due "
        "to: GPTQ_MARLIN_MIN_THREAD_N (64) > out_features (48)\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n")
    out = run(lay, host, front, plan)
    assert out.phase == "boot" and out.boot_failure["kind"] == "marlin-min-thread-n"
    assert out.boot_failure["line"].startswith("MarlinLinearKernel cannot implement")
    assert "what to do: keep P87 in genesis.switches" in out.reason


def test_a_restart_loop_is_a_boot_failure_too(lay):
    host, front, old, plan = setup_swap(lay)
    host.behaviour["tq3-mtp-genesis"] = (
        "restart-loop", "[Genesis pin-gate] STRICT FAIL: UNKNOWN — vllm pin 'x' is NOT on the "
        "Genesis known-good list\n")
    out = run(lay, host, front, plan)
    assert out.phase == "boot" and out.boot_failure["kind"] == "genesis-pin-gate"
    assert "Docker restarted it" in out.reason


def test_not_ready_in_time_is_a_failure_with_what_the_log_says(lay):
    host, front, old, plan = setup_swap(lay, ready_timeout_s=30.0)
    host.behaviour["tq3-mtp-genesis"] = ("hang", "")
    out = run(lay, host, front, plan)
    assert out.phase == "ready" and "not ready after 30s" in out.reason
    assert out.result == "rolled-back"


def test_same_stack_pin_bump_rolls_back_to_the_previous_config(lay):
    host, front, old, plan = setup_swap(lay, new_stack="int8", new_hash="7777777777777777")
    host.behaviour["int8"] = ("ok", "")
    gate = FakeGate(failed=("soak",))
    out = run(lay, host, front, plan, gate)
    assert out.kind == "update" and out.result == "rolled-back"
    ups = [c for c in host.calls if c.startswith("up ")]
    assert [c.split()[2] for c in ups] == ["7777777777777777", "1111aaaa2222bbbb"]
    assert host.running_now() == {"rigfleet-int8": "1111aaaa2222bbbb"}


def test_first_activation_failure_stops_it_and_leaves_the_front_at_503(lay):
    host, front, _, plan = setup_swap(lay, old_stack=None)
    out = run(lay, host, front, plan, FakeGate(failed=("needles",)))
    assert (out.result, out.exit, out.serving) == ("failed", EXIT_FAILED, "maintenance")
    assert host.running_now() == {}
    assert front.current() == "maintenance"
    line = ledger_lines(lay)[-1]
    assert line["stack"] is None and line["attempted"]["stack"] == "tq3-mtp-genesis"
    assert load_active(lay) is None


def test_memory_never_released_fails_and_the_front_stays_at_503(lay):
    host, front, old, plan = setup_swap(lay, vram_timeout_s=10.0)
    host.never_release = True
    out = run(lay, host, front, plan)
    assert out.exit == EXIT_FAILED and "GPU memory not released within 10s" in out.reason
    assert "rollback failed too" in out.reason
    assert front.current() == "maintenance"
    assert not any(c.startswith("up rigfleet-tq3") for c in host.calls)


def test_no_driver_fails_in_seconds_not_at_the_memory_timeout(lay):
    # A module Secure Boot refused at boot: nvidia-smi fails. Waiting the 120 s for memory
    # would only hold the host lock (a deploy that would say why is refused meanwhile).
    host, front, old, plan = setup_swap(lay, vram_timeout_s=120.0)
    host.driver_down = True
    out = run(lay, host, front, plan)
    assert out.exit == EXIT_FAILED and "the NVIDIA driver does not answer" in out.reason
    assert "couldn't communicate with the NVIDIA driver" in out.reason
    assert host.t < 60, host.t  # two tries (the stack, then its rollback) of ~10 s each
    assert front.current() == "maintenance"

def test_a_stop_request_during_the_gate_rolls_back(lay):
    host, front, old, plan = setup_swap(lay)
    flag = {"stop": False}
    gate = FakeGate(on_run=lambda run: flag.update(stop=True))
    out = run(lay, host, front, plan, gate, interrupted=lambda: flag["stop"])
    assert out.result == "rolled-back" and out.phase == "gate"
    assert host.running_now() == {"rigfleet-int8": "1111aaaa2222bbbb"}


def test_a_broken_gate_is_a_failure_not_a_pass(lay):
    host, front, old, plan = setup_swap(lay)
    out = run(lay, host, front, plan, FakeGate(result="error"))
    assert out.result == "rolled-back" and "the gate could not decide" in out.reason


def test_front_switch_failure_after_the_gate_rolls_back(lay):
    host, front, old, plan = setup_swap(lay)
    front.fail_on = "tq3-mtp-genesis"
    out = run(lay, host, front, plan)
    assert out.result == "rolled-back" and out.phase == "front"
    assert load_active(lay).ref.stack == "int8"
    assert front.current() == "int8/1111aaaa2222bbbb"


# --- refusals: nothing changes ------------------------------------------------------------------


def test_a_compose_file_changed_since_staging_is_refused_before_any_change(lay):
    host, front, old, plan = setup_swap(lay)
    (lay.root / "opt/rigfleet/stacks/tq3-mtp-genesis/compose.yaml").write_text(
        compose_text("tq3-mtp-genesis", "0000000000000000"))
    out = run(lay, host, front, plan)
    assert out.result == "refused" and "has config hash 0000000000000000" in out.reason
    assert host.calls == [] and front.routes == ["int8/1111aaaa2222bbbb"]


def test_a_missing_image_is_refused_before_any_change(lay):
    host, front, old, plan = setup_swap(lay)
    host.images = {old.image_ref}
    out = run(lay, host, front, plan)
    assert out.result == "refused" and "is not on the host (not staged)" in out.reason
    assert host.calls == []


def test_a_live_lock_refuses_with_the_holders_information(lay):
    host, front, old, plan = setup_swap(lay)
    holder = HostLock(lay)  # this test process: alive
    holder.acquire("bob@laptop", "swap int8 -> tq3-mtp-genesis", "other-deploy")
    try:
        out = run(lay, host, front, plan)
    finally:
        holder.release()
    assert (out.result, out.exit) == ("locked", EXIT_LOCKED)
    assert "locked by bob@laptop since" in out.reason and "other-deploy" in out.reason
    assert f"pid {os.getpid()}" in out.reason
    assert host.calls == []


def test_a_stale_lock_is_taken_over_and_its_interrupted_transaction_recorded(lay):
    host, front, old, plan = setup_swap(lay)
    # A transaction that died mid-swap: its plan and pid file, no result; its lock left behind.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    other = make_plan(lay, plan.desired, plan_id="20261129T090000Z-dead00")
    (lay.swap_dir(other.id) / "pid.json").write_text(json.dumps({"pid": dead_pid}))
    lay.lock_dir.mkdir(parents=True)
    (lay.lock_dir / "holder.json").write_text(json.dumps(
        {"who": "carol@ctl", "why": "swap", "since": "earlier", "pid": dead_pid}))
    out = run(lay, host, front, plan)
    assert out.result == "promoted"
    events = Journal.read(lay.swap_dir(plan.id))["events"]
    assert any("took over a stale lock" in e["message"] and "carol@ctl" in e["message"]
               for e in events)
    interrupted = [x for x in ledger_lines(lay) if x["event"] == "interrupted"]
    assert interrupted and interrupted[0]["deploy_id"] == other.id
    assert json.loads((lay.swap_dir(other.id) / "result.json").read_text())["result"] == \
        "interrupted"


# --- ensure (boot) and adopt ------------------------------------------------------------------


def test_ensure_recreates_a_container_from_before_the_boot(lay):
    host, front = FakeHost(), FakeFront()
    old = make_active(lay, make_ref(lay, "int8", "1111aaaa2222bbbb"))
    host.up(str(lay.active_compose), old.project)
    host.created["rigfleet-int8"] = "2026-11-29T09:00:00.123456789Z"  # before the boot
    host.t += 10
    host.calls.clear()
    j = Journal(lay.swaps_dir / "ensure", echo=None)
    booted = datetime(2026, 11, 29, 9, 40, tzinfo=UTC).timestamp()
    out = Ensure(lay, host, front, j, who="rigfleet-stack.service", why="boot",
                 booted_at=booted).run()
    assert out.result == "recreated"
    assert [c.split()[0] for c in host.calls if c.split()[0] in ("up", "down")] == [
        "down", "up"]
    assert front.routes == ["maintenance", "int8/1111aaaa2222bbbb"]
    assert ledger_lines(lay)[-1]["event"] == "ensure"

    # A container created since this boot is left alone; only the route is fixed.
    host.created["rigfleet-int8"] = "2026-11-29T10:00:00Z"
    host.calls.clear()
    front.routes.append("maintenance")
    out = Ensure(lay, host, front, j, who="x", why="y", booted_at=booted).run()
    assert out.result == "rerouted" and not [c for c in host.calls if c.startswith("up")]
    out = Ensure(lay, host, front, j, who="x", why="y", booted_at=booted).run()
    assert out.result == "noop"


def test_ensure_without_an_active_stack_keeps_the_front_at_503(lay):
    front = FakeFront()
    out = Ensure(lay, FakeHost(), front, Journal(lay.swaps_dir / "e", echo=None), "x", "y",
                 booted_at=0).run()
    assert out.exit == EXIT_FAILED and front.routes == ["maintenance"]


def test_adopt_records_a_stack_that_already_serves(lay):
    host, front = FakeHost(), FakeFront()
    ref = make_ref(lay, "int8", "1111aaaa2222bbbb")
    host.up(ref.compose_file, ref.project)
    host.t += 10
    plan = make_plan(lay, ref)
    out = adopt(plan, lay, host, front, journal(lay, plan))
    assert out.result == "adopted"
    assert load_active(lay).ref.config_hash == "1111aaaa2222bbbb"
    assert front.routes == ["int8/1111aaaa2222bbbb"]
    assert ledger_lines(lay)[-1]["gate"]["result"] == "not-run"
    assert [c for c in host.calls if c.startswith(("up", "down"))] == ["up rigfleet-int8 "
                                                                      "1111aaaa2222bbbb t=0"]


def test_record_pins_updates_state_active_record_and_ledger_only_for_the_active_stack(lay):
    from rigfleet.hostside.active import record_pins
    from rigfleet.hostside.plan import PlanError

    old = make_active(lay, make_ref(lay, "int8", "1111aaaa2222bbbb"))
    tracked = {**old.record, "pins_serial": 2, "driver_branch": "590"}
    assert record_pins(lay, tracked, "1111aaaa2222bbbb", by="alice") == "recorded"
    assert read_state(lay.state_file)["pins_serial"] == 2
    assert load_active(lay).ref.record["driver_branch"] == "590"
    line = ledger_lines(lay)[-1]
    assert (line["event"], line["stack"], line["pins_serial"]) == ("pins", "int8", 2)
    assert line["previous"]["pins_serial"] is None
    assert record_pins(lay, tracked, "1111aaaa2222bbbb") == "unchanged"
    with pytest.raises(PlanError, match="the active stack is int8/1111aaaa2222bbbb"):
        record_pins(lay, {**tracked, "stack": "tq3-mtp-genesis"}, "1111aaaa2222bbbb")
    assert not lay.lock_dir.exists()


def test_a_container_started_by_hand_under_a_stacks_name_is_removed_not_waited_for(lay):
    host, front = FakeHost(), FakeFront()
    old = make_active(lay, make_ref(lay, "int8", "1111aaaa2222bbbb"))
    host.start_by_hand("rigfleet-int8", "int8")  # `docker run --name rigfleet-int8 ...`
    host.t += 10
    j = Journal(lay.swaps_dir / "ensure", echo=None)
    out = Ensure(lay, host, front, j, who="deploy", why="the active stack is not serving",
                 booted_at=0).run()
    assert out.result == "recreated", out.reason
    assert "rm rigfleet-int8" in " ".join(host.calls)
    assert host.running_now() == {"rigfleet-int8": "1111aaaa2222bbbb"}
    events = [e["message"] for e in Journal.read(lay.swaps_dir / "ensure")["events"]]
    assert any("removing container rigfleet-int8" in m for m in events)
    assert front.current() == old.route_id


def test_ensure_recreates_a_container_running_another_image(lay):
    host, front = FakeHost(), FakeFront()
    old = make_active(lay, make_ref(lay, "int8", "1111aaaa2222bbbb"))
    host.up(str(lay.active_compose), old.project)
    host.t += 10
    host.calls.clear()
    real = host.container
    host.container = lambda name: (replace(real(name), image_id="sha256:otherimage")
                                   if real(name) else None)
    out = Ensure(lay, host, front, Journal(lay.swaps_dir / "e", echo=None), "x", "y",
                 booted_at=0).run()
    assert out.result == "recreated"
    assert [c.split()[0] for c in host.calls if c.split()[0] in ("up", "down")] == [
        "down", "up"]


def test_memory_that_is_never_released_names_what_runs(lay):
    host, front, old, plan = setup_swap(lay, vram_timeout_s=5.0)
    host.start_by_hand("someone-elses-llm", "int8")
    out = run(lay, host, front, plan)
    assert "running containers: someone-elses-llm" in out.reason


def test_an_unexpected_error_inside_the_window_still_rolls_back(lay):
    host, front, old, plan = setup_swap(lay)

    def broken_gate(run, on_line, should_stop):
        raise RuntimeError("the gate module is broken")

    out = Transaction(plan, lay, host, front, broken_gate, journal(lay, plan)).run()
    assert out.result == "rolled-back" and out.phase == "internal"
    assert "RuntimeError: the gate module is broken" in out.reason
    assert host.running_now() == {"rigfleet-int8": "1111aaaa2222bbbb"}
    assert not lay.lock_dir.exists()


def test_a_ledger_that_cannot_be_written_after_the_switch_does_not_undo_the_promotion(
        lay, monkeypatch):
    host, front, old, plan = setup_swap(lay)
    real_append = ledger.append

    def full_disk(lay_, event, result, *a, **k):
        if result == "promoted":
            raise OSError(28, "No space left on device", str(lay.ledger_file))
        return real_append(lay_, event, result, *a, **k)

    def no_timings(path, data, indent=2):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr("rigfleet.hostside.transaction.ledger.append", full_disk)
    monkeypatch.setattr("rigfleet.hostside.steps.write_json", no_timings)
    out = run(lay, host, front, plan)
    # The front routes the new stack and active.json names it: the promotion stands.
    assert (out.result, out.exit) == ("promoted", EXIT_PROMOTED)
    assert host.running_now() == {"rigfleet-tq3-mtp-genesis": "3333cccc4444dddd"}
    assert front.current() == "tq3-mtp-genesis/3333cccc4444dddd"
    assert load_active(lay).ref.stack == "tq3-mtp-genesis"
    assert "No space left on device" in (lay.swap_dir(plan.id) / "events.jsonl").read_text()



def test_a_full_disk_while_staging_is_refused_before_any_change(lay, monkeypatch):
    host, front, old, plan = setup_swap(lay)

    def full_disk(path, text, mode=0o644):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr("rigfleet.hostside.transaction.write_atomic", full_disk)
    out = run(lay, host, front, plan)
    assert (out.result, out.exit, out.phase) == ("refused", EXIT_ROLLED_BACK, "disk")
    assert "No space left on device" in out.reason
    assert host.calls == [] and front.routes == ["int8/1111aaaa2222bbbb"]


def test_a_rollback_whose_ledger_line_cannot_be_written_still_says_the_old_stack_serves(
        lay, monkeypatch):
    host, front, old, plan = setup_swap(lay)

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device", str(lay.ledger_file))

    monkeypatch.setattr("rigfleet.hostside.transaction.ledger.append", full_disk)
    monkeypatch.setattr("rigfleet.hostside.transaction.request_reset", full_disk)
    out = run(lay, host, front, plan, FakeGate(failed=("needles",)))
    assert (out.result, out.exit, out.phase) == ("rolled-back", EXIT_ROLLED_BACK, "gate")
    assert out.serving == "int8/1111aaaa2222bbbb" == front.current()
    assert "No space left on device" in (lay.swap_dir(plan.id) / "events.jsonl").read_text()


def test_a_stop_request_while_draining_after_a_failed_window_leaves_the_front_at_503(lay):
    host, front, old, plan = setup_swap(lay)
    lay.window_file.parent.mkdir(parents=True, exist_ok=True)
    lay.window_file.write_text("{damaged")        # nothing verified since: old is no way back
    front.maintenance("maintenance failed", 30)
    out = run(lay, host, front, plan, interrupted=lambda: True)
    assert front.current() == "maintenance"
    assert "int8/1111aaaa2222bbbb" not in front.routes[1:]
    assert out.exit == EXIT_FAILED and out.serving == "maintenance"


def test_an_active_record_half_written_at_promotion_is_put_back_with_the_rollback(
        lay, monkeypatch):
    host, front, old, plan = setup_swap(lay)

    def full_disk(src, dst):
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr("rigfleet.hostside.active.os.symlink", full_disk)
    out = run(lay, host, front, plan)
    assert (out.result, out.phase) == ("rolled-back", "disk")
    assert front.current() == "int8/1111aaaa2222bbbb"
    assert load_active(lay).ref.route_id == "int8/1111aaaa2222bbbb"  # what serves


def test_a_failure_after_a_failed_window_does_not_call_itself_a_first_activation(lay):
    host, front, old, plan = setup_swap(lay)
    lay.window_file.parent.mkdir(parents=True, exist_ok=True)
    lay.window_file.write_text("{damaged")        # nothing verified since: old is no way back
    out = run(lay, host, front, plan, FakeGate(failed=("needles",)))
    assert (out.result, out.exit, front.current()) == ("failed", EXIT_FAILED, "maintenance")
    events = (lay.swap_dir(plan.id) / "events.jsonl").read_text()
    assert "first activation" not in events
    assert "int8/1111aaaa2222bbbb is not verified" in events


def test_a_refusal_after_a_failed_window_says_nothing_verified_serves(lay):
    host, front, old, plan = setup_swap(lay)
    lay.window_file.parent.mkdir(parents=True, exist_ok=True)
    lay.window_file.write_text("{damaged")        # nothing verified since: old is no way back
    front.maintenance("maintenance failed", 30)
    host.images = {old.image_ref}                 # the new image is not staged
    out = run(lay, host, front, plan)
    assert (out.result, out.exit, out.serving) == ("refused", EXIT_FAILED, "maintenance")


@pytest.mark.parametrize("ready_timeout_s", [READY_TIMEOUT_S, 3000.0])  # the default, host data
def test_a_stop_request_rolls_back_within_the_swap_units_stop_timeout(lay, ready_timeout_s):
    """systemd SIGKILLs the swap unit TimeoutStopSec after its SIGTERM (systemd.service(5),
    KillMode=mixed: systemd.kill(5)); the way back may take the plan's whole limits for the
    memory and the old stack's boot, and must still end with the old stack serving."""
    host, front, old, plan = setup_swap(lay, ready_timeout_s=ready_timeout_s,
                                        vram_timeout_s=VRAM_TIMEOUT_S)
    host.release_s, host.boot_s = plan.vram_timeout_s - 5, plan.ready_timeout_s - 5
    stopped: dict[str, float] = {}
    gate = FakeGate(on_run=lambda run: stopped.setdefault("at", host.t))
    out = run(lay, host, front, plan, gate, interrupted=lambda: "at" in stopped)
    assert out.result == "rolled-back" and front.current() == old.route_id
    limit = re.search(r"TimeoutStopSec=(\d+) ", hosttool.start_swap(plan))
    assert limit and host.t - stopped["at"] <= int(limit.group(1)), host.t - stopped["at"]
