"""rigfleet status: expected state from inventory + pins, drift decisions, the host probe
(run locally against a fake layout), rows, rendering and the exit status. No hosts needed."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from rich.console import Console

from rigfleet import status
from rigfleet.inventory import InventoryHost
from rigfleet.pins import GenesisPin
from rigfleet.status import (
    Expected,
    StatusRow,
    build_row,
    exit_status,
    expected_state,
    find_drift,
    fleet_status,
    gate_summary,
    render_json,
    render_table,
)

SHA = "01d4d1ad375dc5854779c593eee093bcebb0cada"
IMAGE = f"vllm/vllm-openai:nightly-{SHA}"
DIGEST = "sha256:" + "a" * 64
OTHER_DIGEST = "sha256:" + "c" * 64
REVISION = "0123456789abcdef0123456789abcdef01234567"
GENESIS = GenesisPin("http://git.example/genesis.git", "1f9bfb9ecf0b0e8ac3058a712257058304cb878e")
OTHER_COMMIT = "1e79e8380a450acb1af94552b8cfbedf2e7017d4"
HASH = "e6ca3be5a90a19ac"
GPU_OUT = "0, 580.105.08, 290.00, Enabled\n1, 580.105.08, 290.00, Enabled\n"


def expected(**overrides: Any) -> Expected:
    tracked = {
        "stack": "int8", "image": IMAGE, "digest": DIGEST,
        "vllm_version": "0.20.2rc1.dev9+g01d4d1ad3", "genesis_commit": None,
        "model_repo": "Lorbus/Qwen3.6-27B-int4-AutoRound", "model_revision": REVISION,
        "driver_branch": "580", "toolkit_version": "1.17.8-1", "pins_serial": 1,
    }  # fmt: skip
    exp = Expected(
        host="rig-a", stack="int8", container="rigfleet-int8",
        other_containers=("rigfleet-tq3-mtp-genesis",), stack_port=8011,
        served_model_name="qwen3.6-27b-autoround", image=IMAGE,
        repository="vllm/vllm-openai", digest=DIGEST,
        vllm_version="0.20.2rc1.dev9+g01d4d1ad3", genesis=GENESIS, stack_genesis=None,
        model_repo="Lorbus/Qwen3.6-27B-int4-AutoRound", model_revision=REVISION,
        model_path="/srv/models/qwen3.6-27b-autoround-int4", power_caps_w=(290, 290),
        gpu_count=2, driver_branch="580", driver_version=None, toolkit_version="1.17.8-1",
        front_port=8000, front_url="http://10.0.0.1:8000", api_key_file="/k",
        pins_path="pins.yaml", config_hash=HASH, tracked=tracked,
    )  # fmt: skip
    return replace(exp, **overrides)


def converged_facts() -> dict[str, Any]:
    """What the probe reports on a host that is exactly what ``expected()`` says."""
    return {
        "errors": [],
        "state": {
            "stack": "int8",
            "digest": DIGEST,
            "genesis_commit": None,
            "model_revision": REVISION,
            "gate": {"result": "pass", "at": "2026-11-29T10:00:00"},
        },  # fmt: skip
        "ledger_last": {"stack": "int8"},
        "gpu": {"rc": 0, "stdout": GPU_OUT, "stderr": ""},
        "caps_unit_enabled": "enabled",
        "containers": {
            "rigfleet-int8": {
                "status": "running",
                "image_id": "sha256:" + "1" * 64,
                "config_image": f"{IMAGE}@{DIGEST}",
                "labels": {"io.rigfleet.stack": "int8", "io.rigfleet.config-hash": HASH},
                "repo_digests": [f"vllm/vllm-openai@{DIGEST}"],
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
        "route": f"int8/{HASH}",
        "active": {"stack": "int8", "config_hash": HASH},
    }


# --- drift decisions -------------------------------------------------------------------------


def test_a_converged_host_has_no_drift():
    assert find_drift(expected(), converged_facts()) == []


def test_a_cap_set_by_hand_is_drift_naming_card_and_both_values():
    facts = converged_facts()
    facts["gpu"]["stdout"] = GPU_OUT.replace("0, 580.105.08, 290.00", "0, 580.105.08, 200.00")
    assert find_drift(expected(), facts) == ["card 0 power limit 200 W, inventory 290 W"]


def test_caps_within_half_a_watt_are_equal():
    facts = converged_facts()
    facts["gpu"]["stdout"] = GPU_OUT.replace("290.00", "290.40")
    assert find_drift(expected(), facts) == []


def test_a_missing_card_and_a_failing_nvidia_smi_are_drift():
    facts = converged_facts()
    facts["gpu"]["stdout"] = "0, 580.105.08, 290.00, Enabled\n"
    assert find_drift(expected(), facts) == ["card 1 missing (inventory cap 290 W)"]
    facts["gpu"] = {
        "rc": 9,
        "stdout": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
        "stderr": "",
    }
    drift = find_drift(expected(), facts)
    assert len(drift) == 1 and drift[0].startswith("nvidia-smi fails (NVIDIA-SMI has failed")


def test_the_container_replaced_by_another_image_names_both_digests():
    facts = converged_facts()
    other = "vllm/vllm-openai:nightly-3f9c2a7e5b1d4c8a9e0f6b2d7c1a5e8f9b3d6c02"
    facts["containers"]["rigfleet-int8"].update(
        config_image=other, repo_digests=[f"vllm/vllm-openai@{OTHER_DIGEST}"]
    )
    assert find_drift(expected(), facts) == [
        f"rigfleet-int8 runs {other} (digest sha256:cccccccccccc), pin is sha256:aaaaaaaaaaaa"
    ]


def test_an_image_without_repo_digest_is_drift():
    facts = converged_facts()
    facts["containers"]["rigfleet-int8"]["repo_digests"] = []
    assert find_drift(expected(), facts)[0].endswith("(digest -), pin is sha256:aaaaaaaaaaaa")


def test_container_missing_stopped_or_another_stack_running():
    facts = converged_facts()
    facts["containers"]["rigfleet-int8"]["status"] = "exited"
    facts["containers"]["rigfleet-tq3-mtp-genesis"] = {"status": "running"}
    assert find_drift(expected(), facts) == [
        "container rigfleet-int8 is exited, not running",
        "container rigfleet-tq3-mtp-genesis is running too (only rigfleet-int8 should)",
    ]
    facts = converged_facts()
    facts["containers"] = {}
    assert find_drift(expected(), facts) == ["container rigfleet-int8 does not exist"]


def test_a_container_from_another_config_and_a_front_routing_elsewhere():
    facts = converged_facts()
    facts["containers"]["rigfleet-int8"]["labels"]["io.rigfleet.config-hash"] = "0" * 16
    facts["route"] = "maintenance"
    assert find_drift(expected(), facts) == [
        "rigfleet-int8 was started from another config (config-hash 0000000000000000, "
        f"inventory + pins render {HASH})",
        f"front routes to maintenance, expected int8/{HASH}",
    ]
    facts["route"] = None  # no route file (a front without swaps): not judged on its own
    facts["containers"]["rigfleet-int8"]["labels"]["io.rigfleet.config-hash"] = HASH
    assert find_drift(expected(), facts) == []


def test_genesis_moved_is_drift_only_when_genesis_is_pinned():
    facts = converged_facts()
    facts["genesis"]["head"] = OTHER_COMMIT
    assert find_drift(expected(), facts) == ["Genesis HEAD 1e79e8380a45, pin 1f9bfb9ecf0b"]
    facts["genesis"] = None
    assert find_drift(expected(), facts) == ["Genesis HEAD -, pin 1f9bfb9ecf0b"]
    assert find_drift(expected(genesis=None), facts) == []


def test_weights_revision_and_modified_shard():
    facts = converged_facts()
    facts["manifest"].update(
        revision="f" * 40,
        intact=False,
        reason="model-00002-of-00004.safetensors was modified after it was verified",
    )
    assert find_drift(expected(), facts) == [
        "manifest revision ffffffffffff, pin 0123456789ab",
        "weights: model-00002-of-00004.safetensors was modified after it was verified",
    ]
    facts["manifest"] = {"error": "missing"}
    assert find_drift(expected(), facts) == ["weights manifest missing"]


def test_front_not_answering_or_answering_without_the_key():
    facts = converged_facts()
    facts["front"] = {"no_key": 200, "with_key": 502, "models": []}
    assert find_drift(expected(), facts) == [
        "front :8000 answers 502 with the key",
        "front :8000 answers 200 without the key",
    ]
    facts["front"] = {"no_key": None, "with_key": None, "error": "ConnectionRefusedError: x"}
    assert find_drift(expected(), facts)[0] == (
        "front :8000 answers None with the key (ConnectionRefusedError: x)"
    )
    facts["front"] = {"no_key": 401, "with_key": 200, "models": ["other"]}
    assert find_drift(expected(), facts) == ["front lists ['other'], not qwen3.6-27b-autoround"]


def test_state_json_that_disagrees_or_is_missing():
    facts = converged_facts()
    facts["state"]["stack"] = "tq3-mtp-genesis"
    assert find_drift(expected(), facts) == ["state.json stack tq3-mtp-genesis, expected int8"]
    facts["state"] = None
    facts["state_error"] = "missing"
    assert find_drift(expected(), facts) == ["state.json missing"]


# --- gate, rows, exit status -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "want"),
    [
        ({"state": {"gate": {"result": "fail", "at": "T1"}}}, ("fail", "T1")),
        ({"state": {"gate": {"passed": True, "time": "T2"}}}, ("pass", "T2")),
        ({"state": {}, "last_report": {"file": "/r/verify-1.json", "mtime": 0.0,
                                       "data": {"ok": False, "finished": "T3"}}}, ("fail", "T3")),
        ({"state": {}, "last_report": {"file": "/r/verify-1.json", "mtime": 86400.0}},
         ("report verify-1.json", "1970-01-02T00:00:00Z")),
        ({"state": None}, (None, None)),
    ],
)  # fmt: skip
def test_gate_summary(facts, want):
    assert gate_summary(facts) == want


def test_build_row_reports_what_runs():
    row = build_row(expected(), converged_facts(), 0.4321)
    assert row == StatusRow(
        host="rig-a", reachable=True, stack="int8", digest=DIGEST, genesis=GENESIS.commit,
        model_revision=REVISION, gate="pass", gate_time="2026-11-29T10:00:00", drift=[],
        seconds=0.43,
    )  # fmt: skip
    assert row.ok


def test_build_row_without_state_falls_back_to_the_running_container():
    facts = converged_facts()
    facts["state"] = None
    facts["containers"]["rigfleet-int8"]["labels"] = {}
    assert build_row(expected(), facts).stack == "int8"


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
    monkeypatch.setattr(status.time, "monotonic", _clock(jump_after=1))
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


# --- rendering -------------------------------------------------------------------------------


def test_render_json_has_full_values_and_ok_flags():
    rows = [build_row(expected(), converged_facts()), StatusRow("rig-b", False, error="refused")]
    data = json.loads(render_json(rows))
    assert data["ok"] is False
    assert data["hosts"][0]["digest"] == DIGEST and data["hosts"][0]["ok"] is True
    assert data["hosts"][1] == {
        "host": "rig-b", "reachable": False, "stack": None, "digest": None, "genesis": None,
        "model_revision": None, "gate": None, "gate_time": None, "drift": [], "error": "refused",
        "seconds": 0.0, "ok": False,
    }  # fmt: skip


def test_render_table_shows_hosts_short_pins_drift_and_errors():
    facts = converged_facts()
    facts["genesis"]["head"] = OTHER_COMMIT
    rows = [build_row(expected(), facts), StatusRow("rig-b", False, error="ssh refused")]
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render_table(rows))
    text = out.getvalue()
    assert "rig-a" in text and "rig-b" in text
    assert "aaaaaaaa" in text and "1e79e838" in text and "01234567" in text
    assert "Genesis HEAD 1e79e8380a45, pin 1f9bfb9ecf0b" in text
    assert "ssh refused" in text and "pass 2026-11-29 10:00" in text


def test_add_parser_and_run_print_rows_and_return_the_exit_status(monkeypatch, capsys):
    parser = argparse.ArgumentParser(prog="rigfleet")
    status.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["status", "--inventory", "inv.py", "--json", "--timeout", "3"])
    assert (args.inventory, args.json, args.timeout, args.func) == ("inv.py", True, 3.0, status.run)
    monkeypatch.setattr("rigfleet.inventory.load_inventory", lambda path: ["h"])
    monkeypatch.setattr(
        status, "fleet_status", lambda hosts, timeout: [StatusRow("h", True, drift=["d"])]
    )
    assert status.run(args) == 1
    assert json.loads(capsys.readouterr().out)["hosts"][0]["drift"] == ["d"]


# --- expected state from inventory + pins ----------------------------------------------------


def write_pins(path: Path) -> None:
    path.write_text(yaml.safe_dump({
        "schema": "rigfleet-pins/1", "serial": 4, "driver": {"branch": "580"},
        "container_toolkit": {"version": "1.17.8-1"}, "huggingface_hub": {"version": "2.4.0"},
        "model": {"repo": "Lorbus/Qwen3.6-27B-int4-AutoRound", "revision": REVISION,
                  "local_dir": "qwen3.6-27b-autoround-int4"},
        "stacks": {
            "int8": {"image": IMAGE, "digest": DIGEST,
                     "vllm_version": "0.20.2rc1.dev9+g01d4d1ad3"},
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
        "stack": "int8", "power_caps_w": 250, "gpu_count": 2, "model_dir": "/data/models",
        "front_port": 8000, "api_key_file": str(key), "pins_file": "pins.yaml",
        "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo},
        "ssh_hostname": "10.0.0.7",
    }  # fmt: skip
    return InventoryHost("rig-a", ("gpu_hosts",), data)


def test_expected_state_from_inventory_data_and_pins(inventory_host, tmp_path):
    exp = expected_state(inventory_host, pins_base=tmp_path)
    assert exp.power_caps_w == (250, 250)  # one int in the data: one cap per card
    assert (exp.container, exp.other_containers) == ("rigfleet-int8", ("rigfleet-tq3-mtp-genesis",))
    assert (exp.digest, exp.repository, exp.stack_port) == (DIGEST, "vllm/vllm-openai", 8011)
    # int8 runs without Genesis, but the deploy keeps the tq3 stack's checkout on the host.
    assert exp.stack_genesis is None and exp.genesis == GENESIS
    assert exp.model_path == "/data/models/qwen3.6-27b-autoround-int4"
    assert exp.front_url == "http://10.0.0.7:8000"
    assert exp.pins_path == str(tmp_path / "pins.yaml")
    assert exp.tracked["pins_serial"] == 4 and exp.tracked["genesis_commit"] is None
    assert len(exp.config_hash) == 16 and exp.route_id == f"int8/{exp.config_hash}"


def test_expected_state_of_a_genesis_stack(inventory_host, tmp_path):
    host = replace(inventory_host, data={**inventory_host.data, "stack": "tq3-mtp-genesis"})
    exp = expected_state(host, pins_base=tmp_path)
    assert exp.stack_genesis == exp.genesis == GENESIS
    assert exp.tracked["genesis_commit"] == GENESIS.commit and exp.digest == OTHER_DIGEST
    assert exp.other_containers == ("rigfleet-int8",)


def test_expected_state_refuses_invalid_data_with_the_deploys_message(inventory_host, tmp_path):
    host = replace(inventory_host, data={**inventory_host.data, "power_caps_w": [250]})
    with pytest.raises(status.RigfleetError, match="power_caps_w"):
        expected_state(host, pins_base=tmp_path)
    row = status.host_status(host, pins_base=tmp_path)
    assert not row.reachable and row.error.startswith("inventory/pins: rig-a: power_caps_w")


def test_relative_pins_file_is_relative_to_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert status.resolve_pins_path("pins.yaml") == status.REPO_ROOT / "pins.yaml"
    assert status.resolve_pins_path("/abs/p.yaml") == Path("/abs/p.yaml")
    assert status.resolve_pins_path("p.yaml", tmp_path) == tmp_path / "p.yaml"


def test_tracked_keys_are_what_the_ledger_role_records(tmp_path):
    from roles.ledger import desired_state

    write_pins(tmp_path / "pins.yaml")
    pins = status.load_pins(tmp_path / "pins.yaml")
    ctx = SimpleNamespace(stack="int8", desired=pins.stacks["int8"], pins=pins)
    assert tuple(desired_state(ctx)) == status.TRACKED_KEYS


def test_host_paths_match_the_roles():
    from rigfleet.facts import MANIFEST_NAME
    from roles import ledger, power

    assert (status.STATE_FILE, status.LEDGER_FILE) == (ledger.STATE_FILE, ledger.LEDGER_FILE)
    assert status.POWER_CAPS_UNIT == power.UNIT
    assert status.MANIFEST_NAME == MANIFEST_NAME


# --- the host-side probe, run here against a fake layout -------------------------------------


def test_probe_reads_a_host_layout_and_survives_missing_tools(tmp_path):
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    shard = model / "model-00001.safetensors"
    shard.write_bytes(b"x" * 10)
    manifest = {
        "repo": "Lorbus/Qwen3.6-27B-int4-AutoRound",
        "revision": REVISION,
        "files": {shard.name: {"size": 10, "mtime": shard.stat().st_mtime, "sha256": "-"}},
    }
    (model / ".rigfleet-manifest.json").write_text(json.dumps(manifest))
    state_dir = tmp_path / "state"
    (state_dir / "reports").mkdir(parents=True)
    (state_dir / "state.json").write_text(json.dumps({"stack": "int8"}))
    (state_dir / "ledger.jsonl").write_text('{"stack": "a"}\n{"stack": "int8"}\n')
    (state_dir / "reports" / "verify-1.json").write_text('{"passed": true}')
    (state_dir / "active.json").write_text(json.dumps({"ref": {"stack": "int8"}}))
    (tmp_path / "route.conf").write_text(f"# rigfleet route: int8/{HASH}\nproxy_pass ...;\n")
    params = {
        **status.probe_params(expected(model_path=str(model), front_port=1)),
        "state_file": str(state_dir / "state.json"),
        "ledger_file": str(state_dir / "ledger.jsonl"),
        "reports_dir": str(state_dir / "reports"),
        "genesis_dir": str(tmp_path / "no-genesis"),
        "active_file": str(state_dir / "active.json"),
        "route_file": str(tmp_path / "route.conf"),
        "auth_header_file": str(tmp_path / "no-header"),
    }
    env = {"PATH": str(tmp_path / "empty-bin")}  # no nvidia-smi, docker, systemctl, git
    proc = subprocess.run(
        [sys.executable, "-", json.dumps(params)], input=status.PROBE, capture_output=True,
        text=True, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["state"] == {"stack": "int8"} and facts["ledger_last"] == {"stack": "int8"}
    assert facts["last_report"]["data"] == {"passed": True}
    assert facts["active"] == {"stack": "int8"} and facts["route"] == f"int8/{HASH}"
    assert facts["manifest"]["intact"] and facts["manifest"]["revision"] == REVISION
    assert facts["gpu"]["rc"] == 127 and facts["containers"] == {} and facts["genesis"] is None
    assert facts["front"]["no_key"] is None and "cannot read" in facts["front"]["error"]

    # A modified shard (same size, new mtime) is found without hashing.
    time.sleep(0.01)
    shard.write_bytes(b"y" * 10)
    proc = subprocess.run(
        [sys.executable, "-", json.dumps(params)], input=status.PROBE, capture_output=True,
        text=True, env=env, timeout=60,
    )  # fmt: skip
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["manifest"]["reason"] == f"{shard.name} was modified after it was verified"


def test_probe_command_quotes_its_parameters_and_never_carries_the_key():
    cmd = status.probe_command(expected(model_path="/srv/it's here"), sudo=True)
    assert cmd.startswith("sudo -n python3 - '")
    assert "VLLM_API_KEY" not in cmd and "Bearer" not in cmd


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
    from roles.nvidia_driver import driver_packages

    mine = _hosts_module("test_gpus").driver_packages(os_id, "580")
    assert mine == driver_packages(SimpleNamespace(id=os_id), "580")


def test_host_checks_know_the_toolkit_packages_the_role_installs():
    from roles.container_toolkit import TOOLKIT_PACKAGES

    assert _hosts_module("test_docker_runtime").TOOLKIT_PACKAGES == TOOLKIT_PACKAGES


# --- SSH settings from inventory data --------------------------------------------------------


@pytest.mark.parametrize(
    ("strict", "policy"),
    [(None, "RejectPolicy"), ("yes", "RejectPolicy"), ("accept-new", "AutoAddPolicy"),
     ("no", "AutoAddPolicy")],
)  # fmt: skip
def test_ssh_client_uses_the_inventorys_known_hosts_and_strictness(
    tmp_path, monkeypatch, strict, policy
):
    import paramiko

    known = tmp_path / "known_hosts"
    known.write_text(
        "[127.0.0.1]:2221 ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIMZH7zZH9gYuD65T6GB9JM+L5Qb67lZbICgIwnw4gNjR\n"
    )
    seen: dict[str, Any] = {}

    def connect(self, hostname, **kw):
        seen.update(kw, hostname=hostname, policy=type(self._policy).__name__,
                    keys=list(self.get_host_keys().keys()))  # fmt: skip
        raise paramiko.SSHException(f"Server '[{hostname}]:{kw['port']}' not found in known_hosts")

    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": 2221, "ssh_user": "root",
            "ssh_key": str(tmp_path / "id"), "ssh_known_hosts_file": str(known)}  # fmt: skip
    if strict is not None:
        data["ssh_strict_host_key_checking"] = strict
    with pytest.raises(status.HostUnreachable, match=r"127.0.0.1:2221 is not in .*known_hosts"):
        status.ssh_client(InventoryHost("host1", (), data), timeout=3)
    assert seen["policy"] == policy
    assert seen["keys"] == ["[127.0.0.1]:2221"]  # only the inventory's file
    assert (seen["hostname"], seen["port"], seen["username"]) == ("127.0.0.1", 2221, "root")
    assert seen["key_filename"] == str(tmp_path / "id") and not seen["look_for_keys"]


def test_an_unreadable_known_hosts_file_makes_the_host_unreachable(tmp_path):
    host = InventoryHost("h", (), {"ssh_known_hosts_file": str(tmp_path / "missing")})
    with pytest.raises(status.HostUnreachable, match="cannot read known hosts"):
        status.ssh_client(host, timeout=1)
