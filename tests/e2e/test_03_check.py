"""``rigfleet check`` on the simulated fleet (issue 18): the testbed inventory passes offline and
online against the twin's sources; pins naming an image digest, a model revision and a driver
branch their sources do not have are refused by ``check --online`` and by the deploy's
preflight, naming each thing and the sources tried, before anything on the host changes.

Cheap: no converge (a bare or a converged host alike), one deploy limited to one host.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml
from e2e_fleet import INVENTORY, run
from rigfleet_testbed import layout
from test_03_bad_input import REFUSAL, host_state, operations

RIGFLEET = str(Path(sys.executable).with_name("rigfleet"))
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
# The control side reaches the twin's hub and apt repository on published loopback ports (the
# inventory names them as the hosts do); the registry and Genesis already have theirs
# (bump_registry, bump_genesis_url).
REACH = layout.CONTROL_REACH
GONE_DIGEST = "sha256:" + "d" * 64
GONE_REVISION = "e" * 40
GONE_BRANCH = "599"


def check(*args: str, inventory: Path = INVENTORY):
    reach = [a for r in REACH for a in ("--reach", r)]
    # Wide enough that no note under the table wraps inside a URL.
    return run([RIGFLEET, "check", "--inventory", str(inventory), *args, *reach], check=False,
               timeout=600, env={**os.environ, "COLUMNS": "1000"})


def test_the_testbed_inventory_passes_offline_and_online(testbed):
    proc = check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = check("--online", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["problems"] == []
    things = {f["thing"]: f["status"] for f in report["findings"]}
    assert all(s in ("found", "changed") for s in things.values()), things
    kinds = {t.split(" ")[0] for t in things}
    assert {"image", "model", "genesis", "driver", "container"} <= kinds, things
    # The twin's hub moved main past the pinned revision: still there, said so, no failure.
    model = next(f for f in report["findings"] if f["thing"].startswith("model "))
    assert model["status"] == "changed" and "main is at" in model["todo"]


def gone_pins(tmp_path: Path) -> Path:
    """The testbed's pins with a digest, a model revision and a driver branch nobody has."""
    pins = yaml.safe_load((layout.STATE_DIR / "pins.yaml").read_text())
    for stack in pins["stacks"].values():
        stack["digest"] = GONE_DIGEST
    pins["model"]["revision"] = GONE_REVISION
    pins["driver"] = {"branch": GONE_BRANCH}
    path = tmp_path / "gone-pins.yaml"
    path.write_text(yaml.safe_dump(pins, sort_keys=False))
    return path


def test_what_its_source_no_longer_has_is_refused_by_check_and_by_the_deploy(testbed, tmp_path):
    pins = gone_pins(tmp_path)
    # Beside the testbed inventory: pyinfra reads group_data/ next to it.
    inventory = INVENTORY.with_name(INVENTORY.stem + "-gone.py")
    inventory.write_text(f'''"""Testbed inventory with pins its sources do not have."""
import runpy
_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
gpu_hosts = (_hosts, {{**_data, "pins_file": {str(pins)!r}}})
''')
    try:
        proc = check("--online", inventory=inventory)
    finally:
        inventory.unlink(missing_ok=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    flat = " ".join(out.split())
    assert f"{GONE_DIGEST[:19]}" in flat and "is not there at" in flat
    assert f"model Lorbus/Qwen3.6-27B-int4-AutoRound@{GONE_REVISION[:12]}: missing" in flat
    assert "no such revision" in flat
    assert (f"driver {GONE_BRANCH} (debian 13): missing at cuda {layout.CUDA_APT_BASE}"
            "/debian13/x86_64/") in flat
    # NVIDIA's debian13 repository as the twin serves it: no 580.
    assert "nvidia-driver-cuda (it has 595.58.03-1, 620.37.02-1)" in flat

    host = testbed.fleet[0]
    before = host_state(host)
    proc = run([PYINFRA, str(INVENTORY), "deploy.py", "-y", "--limit", host.name,
                "--data", f"pins_file={pins}"], check=False, timeout=900,
               env={**os.environ, "RIGFLEET_REACH": " ".join(REACH)})
    out = proc.stdout + proc.stderr
    flat = " ".join(out.split())
    assert proc.returncode != 0
    assert operations(out) and all(op.startswith(REFUSAL) for op in operations(out)), \
        operations(out)
    # Each thing named with each source tried.
    assert f"{host.name}: model Lorbus/Qwen3.6-27B-int4-AutoRound@{GONE_REVISION[:12]}: " \
           f"missing at {layout.HUB_URL}" in flat, out[-4000:]
    assert f"{host.name}: driver {GONE_BRANCH} (debian 13): missing at cuda" in flat
    assert GONE_DIGEST in flat and "hub" in flat
    assert host_state(host) == before
