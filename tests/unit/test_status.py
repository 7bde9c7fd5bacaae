"""rigfleet status: the host's model from inventory + pins, drift decisions over the host probe,
rows, rendering and the exit status. No hosts needed."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

import rigfleet.desired
from rigfleet import fleetview
from rigfleet.bump.journal import BumpJournal
from rigfleet.bump.plan import PlanHost, build_plan
from rigfleet.desired import DesiredHost, build_desired, load_desired, resolve_pins_path
from rigfleet.errors import RigfleetError
from rigfleet.hostprobe import HostProbe
from rigfleet.inventory import InventoryHost
from rigfleet.pins import GenesisPin, StackPins, load_pins, save_pins
from rigfleet.resources import PROJECT_ROOT
from rigfleet.status import cli as status_cli
from rigfleet.status.cli import as_json, render_table
from rigfleet.status.drift import find_drift
from rigfleet.status.rows import (
    StatusRow,
    build_row,
    exit_status,
    fleet_status,
    gate_summary,
    host_status,
)

SHA = "01d4d1ad375dc5854779c593eee093bcebb0cada"
IMAGE = f"vllm/vllm-openai:nightly-{SHA}"
DIGEST = "sha256:" + "a" * 64
OTHER_DIGEST = "sha256:" + "c" * 64
REVISION = "0123456789abcdef0123456789abcdef01234567"
GENESIS = GenesisPin("http://git.example/genesis.git", "1f9bfb9ecf0b0e8ac3058a712257058304cb878e")
OTHER_COMMIT = "1e79e8380a450acb1af94552b8cfbedf2e7017d4"
GPU_OUT = "0, 580.105.08, 290.00, Enabled\n1, 580.105.08, 290.00, Enabled\n"


def write_pins(path: Path) -> None:
    path.write_text(yaml.safe_dump({
        "schema": "rigfleet-pins/1", "serial": 4, "driver": {"branch": "580"},
        "container_toolkit": {"version": "1.17.8-1"}, "huggingface_hub": {"version": "2.4.0"},
        "model": {"repo": "Lorbus/Qwen3.6-27B-int4-AutoRound", "revision": REVISION,
                  "local_dir": "qwen3.6-27b-autoround-int4"},
        "stacks": {
            "int8": {"image": "vllm/vllm-openai:v0.27.1", "digest": DIGEST,
                     "vllm_version": "0.27.1"},
            "tq3-mtp-genesis": {"image": IMAGE, "digest": OTHER_DIGEST,
                                "vllm_version": "0.20.2rc1.dev9+g01d4d1ad3",
                                "genesis": {"repo": GENESIS.repo, "commit": GENESIS.commit}},
        },
        "history": [],
    }))  # fmt: skip


@pytest.fixture
def inventory_host(tmp_path) -> InventoryHost:
    write_pins(tmp_path / "pins.yaml")
    key = tmp_path / "api-key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o600)
    repo = {"url": "http://apt.example/debian", "key_url": "http://apt.example/k.asc",
            "suite": "stable", "components": ["main"]}  # fmt: skip
    data = {
        "stack": "int8", "power_caps_w": [290, 290], "gpu_count": 2, "model_dir": "/srv/models",
        "front_port": 8000, "api_key_file": str(key), "pins_file": "pins.yaml",
        "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo},
        "ssh_hostname": "10.0.0.7",
    }  # fmt: skip
    return InventoryHost("rig-a", ("gpu_hosts",), data)


@pytest.fixture
def want(inventory_host, tmp_path) -> DesiredHost:
    return load_desired(inventory_host.name, inventory_host.data, tmp_path)


def converged_facts(want: DesiredHost) -> dict[str, Any]:
    """What the probe reports on a host that is exactly what ``want`` says."""
    h = want.current.config_hash
    return {
        "schema": "rigfleet-probe/1",
        "state": {
            "stack": "int8",
            "digest": DIGEST,
            "genesis_commit": None,
            "model_revision": REVISION,
            "gate": {"result": "pass", "at": "2026-11-29T10:00:00"},
        },  # fmt: skip
        "state_error": None,
        "ledger": {"tail": [{"stack": "int8"}], "count": 1, "error": None},
        "reports": {"files": [], "newest": None},
        "gpu": {"rc": 0, "stdout": GPU_OUT, "stderr": ""},
        "caps_unit_enabled": "enabled",
        "containers": {
            "rigfleet-int8": {
                "status": "running",
                "stack": "int8",
                "hash": h,
                "image_id": "sha256:" + "1" * 64,
                "image": f"{IMAGE}@{DIGEST}",
                "digests": [DIGEST],
            }
        },
        "genesis": {"head": GENESIS.commit, "origin": GENESIS.repo, "error": None},
        "manifest": {
            "repo": "Lorbus/Qwen3.6-27B-int4-AutoRound",
            "revision": REVISION,
            "intact": True,
            "reason": "matches manifest",
        },
        "front": {"no_key": 401, "with_key": 200, "models": ["qwen3.6-27b-autoround"]},
        "route": f"int8/{h}",
        "active": {"ref": {"stack": "int8", "config_hash": h}},
    }


def drift(want: DesiredHost, facts: dict[str, Any]) -> list[str]:
    return find_drift(want, HostProbe(facts))


# --- drift decisions -------------------------------------------------------------------------


def test_a_converged_host_has_no_drift(want):
    assert drift(want, converged_facts(want)) == []


def test_a_cap_set_by_hand_is_drift_naming_card_and_both_values(want):
    facts = converged_facts(want)
    facts["gpu"]["stdout"] = GPU_OUT.replace("0, 580.105.08, 290.00", "0, 580.105.08, 200.00")
    assert drift(want, facts) == ["card 0 power limit 200 W, inventory 290 W"]


def test_caps_within_half_a_watt_are_equal(want):
    facts = converged_facts(want)
    facts["gpu"]["stdout"] = GPU_OUT.replace("290.00", "290.40")
    assert drift(want, facts) == []


def test_a_missing_card_and_a_failing_nvidia_smi_are_drift(want):
    facts = converged_facts(want)
    facts["gpu"]["stdout"] = "0, 580.105.08, 290.00, Enabled\n"
    assert drift(want, facts) == ["card 1 missing (inventory cap 290 W)"]
    facts["gpu"] = {
        "rc": 9,
        "stdout": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
        "stderr": "",
    }
    found = drift(want, facts)
    assert len(found) == 1 and found[0].startswith("nvidia-smi fails (NVIDIA-SMI has failed")


def test_the_container_replaced_by_another_image_names_both_digests(want):
    facts = converged_facts(want)
    other = "vllm/vllm-openai:nightly-3f9c2a7e5b1d4c8a9e0f6b2d7c1a5e8f9b3d6c02"
    facts["containers"]["rigfleet-int8"].update(image=other, digests=[OTHER_DIGEST])
    assert drift(want, facts) == [
        f"rigfleet-int8 runs {other} (digest sha256:cccccccccccc), pin is sha256:aaaaaaaaaaaa"
    ]


def test_an_image_without_repo_digest_is_drift(want):
    facts = converged_facts(want)
    facts["containers"]["rigfleet-int8"]["digests"] = []
    assert drift(want, facts)[0].endswith("(digest -), pin is sha256:aaaaaaaaaaaa")


def test_container_missing_stopped_or_another_stack_running(want):
    facts = converged_facts(want)
    facts["containers"]["rigfleet-int8"]["status"] = "exited"
    facts["containers"]["rigfleet-tq3-mtp-genesis"] = {"status": "running"}
    assert drift(want, facts) == [
        "container rigfleet-int8 is exited, not running",
        "container rigfleet-tq3-mtp-genesis is running too (only rigfleet-int8 should)",
    ]
    facts = converged_facts(want)
    facts["containers"] = {}
    assert drift(want, facts) == ["container rigfleet-int8 does not exist"]


def test_a_container_from_another_config_and_a_front_routing_elsewhere(want):
    h = want.current.config_hash
    facts = converged_facts(want)
    facts["containers"]["rigfleet-int8"]["hash"] = "0" * 16
    facts["route"] = "maintenance"
    assert drift(want, facts) == [
        "rigfleet-int8 was started from another config (config-hash 0000000000000000, "
        f"inventory + pins render {h})",
        f"front routes to maintenance, expected int8/{h}",
    ]
    facts["route"] = None  # no route file (a front without swaps): not judged on its own
    facts["containers"]["rigfleet-int8"]["hash"] = h
    assert drift(want, facts) == []


def test_genesis_moved_is_drift_only_when_genesis_is_pinned(want, inventory_host, tmp_path):
    facts = converged_facts(want)
    facts["genesis"]["head"] = OTHER_COMMIT
    assert drift(want, facts) == ["Genesis HEAD 1e79e8380a45, pin 1f9bfb9ecf0b"]
    facts["genesis"] = None
    assert drift(want, facts) == ["Genesis HEAD -, pin 1f9bfb9ecf0b"]
    # Pins without a Genesis stack: no checkout is expected.
    pins = tmp_path / "int8-only.yaml"
    data = yaml.safe_load((tmp_path / "pins.yaml").read_text())
    del data["stacks"]["tq3-mtp-genesis"]
    pins.write_text(yaml.safe_dump(data))
    alone = load_desired("rig-a", {**inventory_host.data, "pins_file": str(pins)})
    assert alone.genesis is None
    assert drift(alone, {**facts, "containers": converged_facts(alone)["containers"],
                         "route": converged_facts(alone)["route"]}) == []


def test_weights_revision_and_modified_shard(want):
    facts = converged_facts(want)
    facts["manifest"].update(
        revision="f" * 40,
        intact=False,
        reason="model-00002-of-00004.safetensors was modified after it was verified",
    )
    assert drift(want, facts) == [
        "manifest revision ffffffffffff, pin 0123456789ab",
        "weights: model-00002-of-00004.safetensors was modified after it was verified",
    ]
    facts["manifest"] = {"error": "missing"}
    assert drift(want, facts) == ["weights manifest missing"]


def test_weights_of_another_repository_name_the_repository(want):
    """A manifest of another model repo at the pinned revision said "manifest revision
    0123456789ab, pin 0123456789ab": two equal values, nothing to act on."""
    facts = converged_facts(want)
    facts["manifest"]["repo"] = "someone/other-model"
    assert drift(want, facts) == [
        "manifest repo someone/other-model, pin Lorbus/Qwen3.6-27B-int4-AutoRound"]


def test_front_not_answering_or_answering_without_the_key(want):
    facts = converged_facts(want)
    facts["front"] = {"no_key": 200, "with_key": 502, "models": []}
    assert drift(want, facts) == [
        "front :8000 answers 502 with the key",
        "front :8000 answers 200 without the key",
    ]
    facts["front"] = {"no_key": None, "with_key": None, "error": "ConnectionRefusedError: x"}
    assert drift(want, facts)[0] == (
        "front :8000 answers None with the key (ConnectionRefusedError: x)"
    )
    facts["front"] = {"no_key": 401, "with_key": 200, "models": ["other"]}
    assert drift(want, facts) == ["front lists ['other'], not qwen3.6-27b-autoround"]


def test_state_json_that_disagrees_or_is_missing(want):
    facts = converged_facts(want)
    facts["state"]["stack"] = "tq3-mtp-genesis"
    assert drift(want, facts) == ["state.json stack tq3-mtp-genesis, expected int8"]
    facts["state"] = None
    facts["state_error"] = "missing"
    assert drift(want, facts) == ["state.json missing"]


# --- gate, rows, exit status -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({"state": {"gate": {"result": "fail", "at": "T1"}}}, ("fail", "T1")),
        ({"state": {"gate": {"result": "pass", "at": "T2", "failed_checks": []}}},
         ("pass", "T2")),
        ({"state": {}, "reports": {"newest": {
            "file": "verify-1.json", "mtime": 86400.0, "failed": ["needles"], "total": 8,
            "counts": {"pass": 7, "fail": 1}}}},
         ("report verify-1.json: fail: 1 of 8 checks failed (needles)",
          "1970-01-02T00:00:00Z")),
        ({"state": None}, (None, None)),
    ],
)  # fmt: skip
def test_gate_summary_reads_the_gate_record_or_the_newest_report(facts, expected):
    assert gate_summary(HostProbe(facts)) == expected


def test_build_row_reports_what_runs(want):
    row = build_row(want, HostProbe(converged_facts(want)), 0.4321)
    assert row == StatusRow(
        host="rig-a", reachable=True, stack="int8", digest=DIGEST, genesis=GENESIS.commit,
        model_revision=REVISION, gate="pass", gate_time="2026-11-29T10:00:00", drift=[],
        seconds=0.43,
    )  # fmt: skip
    assert row.ok


def test_build_row_of_a_host_off_its_stack_shows_the_image_that_runs(want):
    """A host serving another staged stack (``--data stack=...``): its image column is that
    stack's container's (a derived Genesis image stands for its base digest), not "-"."""
    facts = converged_facts(want)
    facts["state"]["stack"] = "tq3-mtp-genesis"
    facts["containers"] = {"rigfleet-tq3-mtp-genesis": {
        "status": "running", "stack": "tq3-mtp-genesis", "digests": [OTHER_DIGEST]}}
    row = build_row(want, HostProbe(facts))
    assert (row.stack, row.digest) == ("tq3-mtp-genesis", OTHER_DIGEST)
    assert "container rigfleet-int8 does not exist" in row.drift


def test_build_row_without_state_falls_back_to_the_running_container(want):
    facts = converged_facts(want)
    facts["state"] = None
    facts["containers"]["rigfleet-int8"]["stack"] = ""
    assert build_row(want, HostProbe(facts)).stack == "int8"


def test_exit_status_is_the_worst_found():
    ok = StatusRow("a", True)
    drifted = StatusRow("b", True, drift=["x"])
    down = StatusRow("c", False, error="timeout")
    assert exit_status([ok]) == 0
    assert exit_status([ok, drifted]) == 1
    assert exit_status([ok, drifted, down]) == 2
    assert exit_status([]) == 0


def test_fleet_status_probes_hosts_concurrently_in_inventory_order():
    hosts = [InventoryHost(n, (), {}) for n in ("c", "a", "b")]

    def probe(h: InventoryHost) -> StatusRow:
        time.sleep(0.5)
        return StatusRow(h.name, True)

    started = time.monotonic()
    rows = fleet_status(hosts, timeout=5, probe=probe)
    assert time.monotonic() - started < 1.2  # not 3 x 0.5 s
    assert [r.host for r in rows] == ["c", "a", "b"]


def test_fleet_status_marks_a_host_past_its_deadline_unreachable(monkeypatch):
    monkeypatch.setattr(fleetview.time, "monotonic", _clock(jump_after=1))
    hosts = [InventoryHost("stuck", (), {})]
    rows = fleet_status(hosts, timeout=0.01, probe=lambda h: time.sleep(1) or StatusRow("x", True))
    assert rows == [StatusRow("stuck", False, error="no answer in 0.01s")]


def _clock(jump_after: int):
    calls = {"n": 0}
    real = time.monotonic

    def monotonic() -> float:
        calls["n"] += 1
        return real() + (1000.0 if calls["n"] > jump_after else 0.0)

    return monotonic


class FakeRemote:
    """The SSH layer, answering with a probe's JSON (or as a host that is not deployed)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.commands: list[str] = []

    def run(self, host, command, *, timeout=120, stdin=b""):
        self.commands.append(command)
        return 0, json.dumps(self.answer) + "\n"


def test_host_status_runs_the_full_probe_with_the_hosts_paths(inventory_host, tmp_path, want):
    remote = FakeRemote(converged_facts(want))
    row = host_status(inventory_host, pins_base=tmp_path, remote=remote)  # type: ignore[arg-type]
    assert row.ok and row.stack == "int8"
    [command] = remote.commands
    assert "rigfleet-host.pyz probe --full --model-path " \
           f"/srv/models/qwen3.6-27b-autoround-int4@{REVISION[:12]} --front-port 8000" in command
    bare = host_status(inventory_host, pins_base=tmp_path,
                       remote=FakeRemote({"schema": "rigfleet-probe/1", "bare": True}))  # type: ignore[arg-type]
    assert bare.error is not None and "not deployed yet" in bare.error and not bare.ok


# --- rendering -------------------------------------------------------------------------------


def test_render_json_has_full_values_and_ok_flags(want):
    rows = [build_row(want, HostProbe(converged_facts(want))),
            StatusRow("rig-b", False, error="refused")]
    data = as_json(rows)
    assert data["ok"] is False
    assert data["hosts"][0]["digest"] == DIGEST and data["hosts"][0]["ok"] is True
    assert data["hosts"][1] == {
        "host": "rig-b", "reachable": False, "stack": None, "digest": None, "genesis": None,
        "model_revision": None, "gate": None, "gate_time": None, "drift": [], "error": "refused",
        "seconds": 0.0, "throughput": None, "bump": None, "ok": False,
    }  # fmt: skip


def _rendered(rows: list[StatusRow], width: int) -> str:
    out = io.StringIO()
    render_table(rows).print(Console(file=out, width=width, color_system=None))
    return out.getvalue()


def test_render_table_shows_hosts_short_pins_drift_and_errors(want):
    facts = converged_facts(want)
    facts["genesis"]["head"] = OTHER_COMMIT
    rows = [build_row(want, HostProbe(facts)), StatusRow("rig-b", False, error="ssh refused")]
    text = _rendered(rows, 200)
    assert "rig-a" in text and "rig-b" in text
    assert "aaaaaaa/1e79e83/0123456" in text
    assert "Genesis HEAD 1e79e8380a45, pin 1f9bfb9ecf0b" in text
    assert "ssh refused" in text and "pass 11-29 10:00" in text and "unreachable" in text


def test_a_host_not_deployed_yet_is_not_shown_without_drift():
    """A reachable host with no host-side tool was never checked for drift, yet its drift
    cell said "none" in green."""
    row = StatusRow("rig-c", True, error="not deployed yet (no host-side tool): run the deploy")
    line = next(x for x in _rendered([row], 200).splitlines() if x.split()[:1] == ["rig-c"])
    assert "none" not in line


def test_in_80_columns_and_a_pipe_each_host_is_one_line_and_no_word_is_cut(want):
    facts = converged_facts(want)
    facts["genesis"]["head"] = OTHER_COMMIT
    facts["manifest"].update(intact=False, reason="model-00002-of-00004.safetensors was "
                             "modified after it was verified")
    rows = [build_row(want, HostProbe(facts)),
            StatusRow("rig-b", False, error="ssh root@10.0.0.8:22: connection refused "
                      "after several attempts to reach the host over the network"),
            replace(build_row(want, HostProbe(converged_facts(want))), host="rig-c")]
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    code = ("import sys, pickle; from rich.console import Console; "
            "from rigfleet.status.cli import render_table; "
            "render_table(pickle.loads(sys.stdin.buffer.read())).print(Console())")
    import pickle

    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(rows), env=env,
                          capture_output=True, check=True)
    text = proc.stdout.decode()
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    # One table line per host, each starting with the host's name in the first cell.
    for name in ("rig-a", "rig-b", "rig-c"):
        assert sum(1 for line in lines if line.split()[:1] == [name]) == 1, text
    # The notes wrap between words: every word of a drift line is whole somewhere.
    words = set(" ".join(lines).split())
    for word in ("model-00002-of-00004.safetensors", "modified", "verified", "attempts"):
        assert word in words, (word, text)


def test_add_parser_and_run_print_rows_and_return_the_exit_status(monkeypatch, capsys):
    parser = argparse.ArgumentParser(prog="rigfleet")
    status_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["status", "--inventory", "inv.py", "--json", "--timeout", "3"])
    assert (args.inventory, args.json, args.timeout, args.func) == (
        "inv.py", True, 3.0, status_cli.run)
    monkeypatch.setattr("rigfleet.inventory.load_inventory",
                        lambda path: [InventoryHost("h", ("gpu_hosts",), {})])
    monkeypatch.setattr(
        status_cli, "fleet_status", lambda hosts, timeout: [StatusRow("h", True, drift=["d"])]
    )
    assert status_cli.run(args) == 1
    assert json.loads(capsys.readouterr().out)["hosts"][0]["drift"] == ["d"]


# --- the host's model from inventory + pins --------------------------------------------------


def test_the_model_from_inventory_data_and_pins(want, tmp_path):
    assert want.settings.power_caps_w == (290, 290)
    assert (want.current.spec.container_name, want.other_containers) == (
        "rigfleet-int8", ("rigfleet-tq3-mtp-genesis",))
    assert (want.current.pins.digest, want.current.pins.repository, want.spec.port) == (
        DIGEST, "vllm/vllm-openai", 8011)
    # int8 runs without Genesis, but the deploy keeps the tq3 stack's checkout on the host.
    assert want.current.pins.genesis is None and want.genesis == GENESIS
    assert want.model_path == "/srv/models/qwen3.6-27b-autoround-int4@" + REVISION[:12]
    assert want.pins.path == str(tmp_path / "pins.yaml")
    assert want.current.tracked["pins_serial"] == 4
    assert want.current.tracked["genesis_commit"] is None
    h = want.current.config_hash
    assert len(h) == 16 and want.current.ref.route_id == f"int8/{h}"


def test_the_model_of_a_genesis_stack(inventory_host, tmp_path):
    want = load_desired("rig-a", {**inventory_host.data, "stack": "tq3-mtp-genesis"}, tmp_path)
    assert want.current.pins.genesis == want.genesis == GENESIS
    assert want.current.tracked["genesis_commit"] == GENESIS.commit
    assert want.current.pins.digest == OTHER_DIGEST
    assert want.other_containers == ("rigfleet-int8",)


def test_invalid_data_is_refused_with_the_deploys_message(inventory_host, tmp_path):
    host = replace(inventory_host, data={**inventory_host.data, "power_caps_w": [250]})
    with pytest.raises(RigfleetError, match="power_caps_w"):
        load_desired(host.name, host.data, tmp_path)
    row = host_status(host, pins_base=tmp_path)
    assert not row.reachable and row.error.startswith("inventory/pins: rig-a: power_caps_w")


def test_relative_pins_file_is_relative_to_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_pins_path("pins.yaml") == PROJECT_ROOT / "pins.yaml"
    assert resolve_pins_path("/abs/p.yaml") == Path("/abs/p.yaml")
    assert resolve_pins_path("p.yaml", tmp_path) == tmp_path / "p.yaml"


# --- the host checks' own copies of role data ------------------------------------------------


def _hosts_module(name: str) -> Any:
    # tests/hosts does not import the roles (a role being edited must not break host checks),
    # so the package lists it keeps are compared with the roles' here.
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "hosts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"rigfleet_hosts_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("os_id", ["debian", "ubuntu"])
def test_host_checks_know_the_driver_packages_the_role_installs(os_id):
    from types import SimpleNamespace

    from rigfleet.packages import driver_packages

    mine = _hosts_module("test_gpus").driver_packages(os_id, "580")
    assert mine == driver_packages(SimpleNamespace(id=os_id), "580")


def test_host_checks_know_the_toolkit_packages_the_role_installs():
    from rigfleet.packages import TOOLKIT_PACKAGES

    assert _hosts_module("test_docker_runtime").TOOLKIT_PACKAGES == TOOLKIT_PACKAGES


# --- a fleet in the middle of a bump -----------------------------------------------------------

NEW_INT8 = StackPins("int8", "vllm/vllm-openai:v0.28.0", "sha256:" + "d" * 64, "0.28.0")


def unfinished_bump(tmp_path: Path, rig_a: str) -> BumpJournal:
    """A bump of int8 over rig-a (canary) and rig-b; rig-a ``promoted``, ``in flight`` or not
    reached yet (``old``). The pins cache is dropped, as a new process would start."""
    pins = load_pins(tmp_path / "pins.yaml")
    plan = build_plan([PlanHost("rig-a", "int8", ("canary",)), PlanHost("rig-b", "int8")], {},
                      pins, {"int8": NEW_INT8})
    journal = BumpJournal.start(plan, "20261129T104000Z-4242", "ops@ctl", None, "0.20.2rc1")
    if rig_a == "promoted":
        journal.record("rig-a", {"status": "promoted", "batch": 0, "runs_new": True})
    elif rig_a == "in flight":
        journal.deploying_batch(0, ["rig-a"], {"rig-a": None})
    rigfleet.desired._PINS.clear()
    return journal


def facts_running(want: DesiredHost) -> dict[str, Any]:
    """A converged host's probe, running what ``want`` runs."""
    facts = converged_facts(want)
    digest = want.current.pins.digest
    facts["state"]["digest"] = digest
    facts["containers"]["rigfleet-int8"].update(digests=[digest],
                                                image=f"{want.current.pins.image}@{digest}")
    return facts


def status_of(host: InventoryHost, tmp_path: Path, facts: dict[str, Any]) -> StatusRow:
    return host_status(host, pins_base=tmp_path, remote=FakeRemote(facts))  # type: ignore[arg-type]


def test_a_mid_bump_fleet_shows_who_is_on_the_candidate_and_since_when(inventory_host,
                                                                       tmp_path, want):
    unfinished_bump(tmp_path, "promoted")
    candidate = load_desired("rig-a", inventory_host.data, tmp_path)
    assert candidate.current.pins.digest == NEW_INT8.digest  # the deploy's view too
    rig_b = InventoryHost("rig-b", ("gpu_hosts",), inventory_host.data)
    rows = [status_of(inventory_host, tmp_path, facts_running(candidate)),
            status_of(rig_b, tmp_path, facts_running(want))]
    assert [r.drift for r in rows] == [[], []]  # each is where the bump left it
    assert rows[0].digest == NEW_INT8.digest and rows[1].digest == DIGEST
    assert [r.bump["state"] for r in rows if r.bump] == ["candidate", "old"]
    assert rows[0].bump is not None and rows[0].bump["since"]
    text = _rendered(rows, 200)
    assert "rigfleet status (mid-bump)" in text
    assert "on candidate " + rows[0].bump["since"][5:10] in text and "old pins" in text
    assert ("mid-bump: 20261129T104000Z-4242 (int8 -> vllm/vllm-openai:v0.28.0), "
            "started") in " ".join(text.split())
    assert "`rigfleet bump` finishes it" in " ".join(text.split())
    data = as_json(rows)
    [bump] = data["bumps"]
    assert bump["hosts"] == {"candidate": ["rig-a"], "old": ["rig-b"]}
    assert bump["journal"] == str(tmp_path / "pins.yaml.bump-journal.json")
    assert data["hosts"][0]["bump"]["state"] == "candidate"
    assert exit_status(rows) == 0  # mid-bump is not drift
    narrow = _rendered(rows, 80).splitlines()
    assert all(len(line) <= 80 for line in narrow)
    for name in ("rig-a", "rig-b"):  # still one table line per host with the bump column
        assert sum(1 for line in narrow if line.split()[:1] == [name]) == 1, narrow


@pytest.mark.parametrize("runs", ["candidate", "old"])
def test_a_host_the_bump_was_deploying_shows_what_it_runs(inventory_host, tmp_path, want, runs):
    unfinished_bump(tmp_path, "in flight")
    with pytest.raises(RigfleetError, match="was deploying this host"):
        load_desired("rig-a", inventory_host.data, tmp_path)  # the deploy refuses it
    running = want if runs == "old" else build_desired(
        want.settings, replace(want.pins, stacks={**want.pins.stacks, "int8": NEW_INT8}))
    facts = facts_running(running)
    row = status_of(inventory_host, tmp_path, facts)
    assert row.bump is not None and row.bump["state"] == "in flight"
    assert row.bump["runs"] == runs and row.drift == []
    assert f"in flight {row.bump['since'][5:10]}" in _rendered([row], 200)
    assert f"(runs {runs})" in _rendered([row], 200)


def test_a_finished_or_stale_journal(inventory_host, tmp_path, want):
    journal = unfinished_bump(tmp_path, "promoted")
    pins = load_pins(tmp_path / "pins.yaml")
    save_pins(pins, {"action": "bump", "bump_id": journal.id})  # the bump ended, then died
    rigfleet.desired._PINS.clear()
    row = status_of(inventory_host, tmp_path, facts_running(want))
    assert row.bump is None
    save_pins(load_pins(tmp_path / "pins.yaml"), {"action": "lock"})
    journal.path.write_text(journal.path.read_text().replace('"base_serial": 4',
                                                             '"base_serial": 3'))
    rigfleet.desired._PINS.clear()
    row = status_of(inventory_host, tmp_path, facts_running(want))
    assert row.error is not None and "--abandon" in row.error and not row.ok
    # The host was never asked (the pins say nothing it should run): not "unreachable", which
    # every host of a fleet whose bump went stale showed.
    line = next(x for x in _rendered([row], 200).splitlines() if x.split()[:1] == ["rig-a"])
    assert "unreachable" not in line and "not probed" in line


def test_the_supervisor_says_when_the_engine_is_dying_or_given_up():
    from rigfleet.status.drift import supervisor_drift

    assert supervisor_drift(None) == []
    assert supervisor_drift({"state": "watching", "alive": True}) == []
    assert supervisor_drift({"state": "backoff", "alive": True, "recreations": 2,
                             "death": "exited 137"}) == [
        "engine died (exited 137); the supervisor is recreating it (attempt 2)"]
    assert supervisor_drift({"state": "gave-up", "alive": True,
                             "reason": "crash loop: 3 recreations in 1800 s"}) == [
        "supervisor gave up: crash loop: 3 recreations in 1800 s (the front answers 503; fix "
        "the cause, then `rigfleet-host.pyz supervise --reset` or converge)"]
    assert supervisor_drift({"state": "watching", "alive": False}) == [
        "the engine supervisor (rigfleet-supervise.service) is not running"]
    assert supervisor_drift({"error": "not JSON", "alive": False}) == [
        "supervisor record not JSON"]
