"""Control side of the swap: what the deploy decides from a host's probe, the plan it sends,
the zipapp it ships, and the commands it runs."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from rigfleet import hostbundle
from rigfleet.commands import hosttool
from rigfleet.desired import DesiredHost, build_desired
from rigfleet.hostdata import validate_host
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.plan import Plan
from rigfleet.hostside.probe import probe as host_probe
from rigfleet.hostside.records import live_holder
from rigfleet.pins import load_pins
from rigfleet.swapplan import build_plan, decide

DIGEST = "sha256:" + "b" * 64
PINS = f"""\
schema: rigfleet-pins/1
serial: 3
driver: {{branch: "580"}}
container_toolkit: {{version: 1.17.8-1}}
huggingface_hub: {{version: 2.4.0}}
model: {{repo: Lorbus/Qwen3.6-27B-int4-AutoRound, revision: "{"a" * 40}",
         local_dir: qwen3.6-27b-autoround-int4}}
stacks:
  int8: {{image: "vllm/vllm-openai:v0.27.1", digest: "{DIGEST}", vllm_version: 0.27.1}}
  tq3-mtp-genesis:
    image: "vllm/vllm-openai:nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
    digest: "{DIGEST}"
    vllm_version: 0.20.2rc1.dev9+g01d4d1ad3
    genesis: {{repo: "http://git.example/genesis.git", commit: "{"c" * 40}"}}
history: []
"""


def host_data(tmp_path: Path, **changes) -> dict:
    key = tmp_path / "api-key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o600)
    (tmp_path / "pins.yaml").write_text(PINS)
    repo = {"url": "http://apt.example/debian", "key_url": "http://apt.example/k.asc",
            "suite": "stable", "components": ["main"]}
    return {
        "stack": "tq3-mtp-genesis", "power_caps_w": 250, "model_dir": "/srv/models",
        "front_port": 8000, "api_key_file": str(key), "pins_file": str(tmp_path / "pins.yaml"),
        "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo},
        "gate_profile": "fast", "gate_set": ["soak_sessions=2"], **changes}


def desired(tmp_path: Path, **changes) -> DesiredHost:
    settings = validate_host("host1", host_data(tmp_path, **changes))
    return build_desired(settings, load_pins(tmp_path / "pins.yaml"))


@pytest.fixture
def ctx(tmp_path) -> DesiredHost:
    return desired(tmp_path)


def test_plan_carries_everything_the_host_needs(ctx, tmp_path):
    plan = build_plan(ctx, "alice@ctl", why="serve tq3", deploy_id="D1")
    d = plan.desired
    assert (d.stack, d.project, d.container, d.port) == (
        "tq3-mtp-genesis", "rigfleet-tq3-mtp-genesis", "rigfleet-tq3-mtp-genesis", 8015)
    assert d.compose_file == "/opt/rigfleet/stacks/tq3-mtp-genesis/compose.yaml"
    # A Genesis stack runs its derived image; the pinned digest is its base (and recorded).
    assert d.image_ref == f"rigfleet/tq3-mtp-genesis-runtime:{DIGEST[7:19]}-85af14d5"
    assert d.record["digest"] == DIGEST and d.gpu_memory_utilization == 0.85
    assert d.record["genesis_commit"] == "c" * 40 and d.record["pins_serial"] == 3
    assert len(d.config_hash) == 16
    assert plan.projects == (
        ("rigfleet-int8", "/opt/rigfleet/stacks/int8/compose.yaml"),
        ("rigfleet-tq3-mtp-genesis", "/opt/rigfleet/stacks/tq3-mtp-genesis/compose.yaml"))
    # The stack's own gate overrides (its throughput baseline and references) first, then
    # host data's gate_set, which wins.
    assert (plan.gate_profile, plan.id) == ("fast", "D1")
    assert plan.gate_set == ctx.current.gate_set and plan.gate_set[-1] == "soak_sessions=2"
    assert "throughput_stack=tq3-mtp-genesis" in plan.gate_set
    assert "throughput_reference_narrative=89.2" in plan.gate_set
    assert Plan.from_dict(json.loads(plan.dumps())) == plan
    # The hash is the compose file's own label: a changed extra_env changes it.
    other = desired(tmp_path, extra_env={"tq3-mtp-genesis": {"X": "1"}}).current.ref
    assert other.config_hash != d.config_hash


def probe(active=None, state=None, containers=None, route=None, lock=None):
    return {"active": {"ref": active} if active else None, "state": state,
            "containers": containers or {}, "route": route, "lock": lock}


def test_decisions(ctx):
    desired = ctx.stacks["tq3-mtp-genesis"].ref
    mine = {"stack": desired.stack, "config_hash": desired.config_hash}
    running = {desired.container: {"status": "running", "hash": desired.config_hash}}
    assert decide(probe(mine, containers=running, route=desired.route_id), desired).kind == \
        "none"
    assert decide(probe(mine, containers=running, route="maintenance"), desired).kind == \
        "ensure"
    exited = {desired.container: {"status": "exited", "hash": desired.config_hash}}
    assert decide(probe(mine, containers=exited, route=desired.route_id), desired).kind == \
        "ensure"
    assert decide(probe({"stack": "int8", "config_hash": "x"}), desired).kind == "swap"
    bumped = decide(probe({"stack": desired.stack, "config_hash": "old"}), desired)
    assert bumped.kind == "update"
    assert "tq3-mtp-genesis/old -> tq3-mtp-genesis/" in bumped.reason
    assert decide(probe(), desired).kind == "activate"
    assert decide(probe(state={"stack": "tq3-mtp-genesis"}, containers=running),
                  desired).kind == "adopt"
    assert decide(probe(state={"stack": "int8"}, containers=running), desired).kind == "activate"
    assert live_holder(probe(lock={"who": "x", "alive": True})["lock"]) == {"who": "x",
                                                                           "alive": True}
    assert live_holder(probe(lock={"who": "x", "alive": False})["lock"]) is None


def test_bundle_is_deterministic_complete_and_runs(tmp_path):
    hostbundle.build_bundle.cache_clear()
    first = hostbundle.build_bundle()
    hostbundle.build_bundle.cache_clear()
    assert hostbundle.build_bundle() == first
    (tmp_path / "h.pyz").write_bytes(first)
    names = zipfile.ZipFile(tmp_path / "h.pyz").namelist()
    assert "__main__.py" in names and "rigfleet/hostside/transaction.py" in names
    assert "rigfleet/hostside/verify/runner.py" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith("testbed/rigfleet_testbed")]
    out = subprocess.run([sys.executable, str(tmp_path / "h.pyz"), "--root", str(tmp_path),
                          "status", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["active"] is None
    gate = subprocess.run([sys.executable, str(tmp_path / "h.pyz"), "verify", "--help"],
                          capture_output=True, text=True)
    assert gate.returncode == 0 and "--api-key-file" in gate.stdout


def test_the_probe_answers_on_an_empty_root_and_the_fact_on_a_bare_host(tmp_path):
    data = host_probe(Layout(tmp_path))
    assert data["schema"] == "rigfleet-probe/1"
    assert {"active", "state", "lock", "containers", "route", "bundle"} <= set(data)
    assert data["state"] is None and data["state_error"] == "missing" and data["lock"] is None
    full = host_probe(Layout(tmp_path), full=True, model_path=str(tmp_path / "m"))
    assert full["ledger"] == {"tail": [], "count": 0, "error": "missing"}
    assert full["manifest"] == {"error": "missing"} and full["genesis"] is None
    # A host the deploy never reached has no bundle: the fact's command says so itself.
    out = subprocess.run(["sh", "-c", hosttool.probe()], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == {"schema": "rigfleet-probe/1", "bare": True}


def test_host_tool_commands_are_valid_sh(ctx):
    plan = build_plan(ctx, "alice@ctl", why="serve tq3", deploy_id="20261129T100000Z-abcdef")
    for command in (hosttool.start_swap(plan), hosttool.start_close(plan, "close-1", "it's"),
                    hosttool.status("20261129T100000Z-abcdef", 3), hosttool.probe(),
                    hosttool.probe(full=True, model_path="/srv/m o", front_port=8000),
                    hosttool.adopt("X"),
                    hosttool.ensure(8000, "alice@ctl"),
                    hosttool.report_failure("host1: it's 'quoted' $HOME `x`")):
        proc = subprocess.run(["sh", "-n", "-c", command], capture_output=True, text=True)
        assert proc.returncode == 0, (command, proc.stderr)
    assert hosttool.start_swap(replace(plan, id="X")).startswith(
        "systemd-run --unit rigfleet-swap-X --collect ")
    proc = subprocess.run(["sh", "-c", hosttool.report_failure("it's $HOME")],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr == "it's $HOME\n"


def test_a_container_from_another_image_is_not_up(ctx):
    desired = ctx.stacks["tq3-mtp-genesis"].ref
    mine = {"stack": desired.stack, "config_hash": desired.config_hash}
    other = {desired.container: {"status": "running", "hash": desired.config_hash,
                                 "image": "vllm/vllm-openai:nightly-3f9c", "digests": [
                                     "sha256:" + "e" * 64]}}
    decision = decide(probe(mine, containers=other, route=desired.route_id), desired)
    assert decision.kind == "ensure" and "runs vllm/vllm-openai:nightly-3f9c" in decision.reason
    pinned = {desired.container: {**other[desired.container], "digests": [DIGEST]}}
    assert decide(probe(mine, containers=pinned, route=desired.route_id), desired).kind == "none"
    by_hand = {desired.container: {"status": "running", "hash": "", "stack": ""}}
    assert decide(probe(mine, containers=by_hand, route=desired.route_id), desired).kind == \
        "ensure"


def test_a_genesis_stack_without_a_switch_set_for_its_pinned_layout_is_refused(tmp_path):
    from dataclasses import replace

    from rigfleet.desired import check_switch_sets

    settings = validate_host("host1", host_data(tmp_path))
    pins = load_pins(tmp_path / "pins.yaml")
    spec = settings.catalog.get("tq3-mtp-genesis")
    assert spec.genesis is not None
    assert check_switch_sets(settings, pins, [spec]) == []  # the shipped file has both sets
    only_v12 = replace(spec, genesis=replace(spec.genesis, switches={
        "v12": spec.genesis.switches["v12"]}))
    assert check_switch_sets(settings, pins, [only_v12]) == [
        f"host1: stack tq3-mtp-genesis: {spec.source}: genesis.switches has no 'v7' set, but "
        f"{pins.path} pins Genesis {'c' * 12} with the v7 layout; allowed: add "
        "genesis.switches.v7 to the stack file (have: v12), or pin a Genesis commit with a "
        "layout it has"]


def test_the_plan_carries_each_stacks_drain_timeout_and_host_data_overrides_them(tmp_path):
    plan = build_plan(desired(tmp_path), "alice@ctl", why="serve tq3", deploy_id="D1")
    assert plan.drain_timeout_s == 600.0
    assert plan.drain_timeouts == {"int8": 600.0, "tq3-mtp-genesis": 600.0}
    assert plan.drain_timeout_for("int8") == 600.0 and plan.drain_timeout_for(None) == 600.0
    plan = build_plan(desired(tmp_path, drain_timeout_s=0), "alice@ctl", why="x",
                      deploy_id="D2")
    assert plan.drain_timeout_s == 0.0 and set(plan.drain_timeouts.values()) == {0.0}
    assert Plan.from_dict(json.loads(plan.dumps())) == plan
    with pytest.raises(Exception, match=r"host1.*drain_timeout_s.*9000.*seconds in \[0, 7200\]"):
        desired(tmp_path, drain_timeout_s=9000)


def test_probe_names_the_digest_a_peers_load_stands_for(tmp_path, monkeypatch):
    """An image loaded from a peer has no RepoDigests; the record its checked load wrote
    gives the probe its digest, so the next converge finds the stack up (no recreation)."""
    image_id, digest = "sha256:" + "1" * 64, "sha256:" + "d" * 64
    answers = {
        "ps": "rigfleet-int8\trunning\tint8\tabc\t2026-12-04",
        "inspect": f"/rigfleet-int8\tvllm/vllm-openai:v1\t{image_id}\t2026-12-04\t0",
        "image": f"{image_id}\t[]\t{{}}",
    }
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text("#!/bin/sh\ncase \"$1\" in\n" + "".join(
        f"{k}) printf '%s\\n' '{v}' ;;\n" for k, v in answers.items()) + "esac\n")
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    lay = Layout(tmp_path)
    from rigfleet.hostside.probe import containers
    assert containers(lay)["rigfleet-int8"]["digests"] == []
    lay.loaded_image(digest).parent.mkdir(parents=True)
    lay.loaded_image(digest).write_text(image_id + "\n")
    found = containers(lay)["rigfleet-int8"]
    assert found["digests"] == [digest] and found["image_id"] == image_id
