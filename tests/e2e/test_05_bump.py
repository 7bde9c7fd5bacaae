"""Issue 5 on a 3-host simulated fleet: ``rigfleet bump`` rolls nightlies out canary first.

host1 serves tq3-mtp-genesis (the canary: the Genesis stack is where MTP regressions show),
host2 and host3 serve int8. The tests run in order on one fleet, each from where the previous
one left it:

1. ``--dry`` prints the plan and changes nothing;
2. a nightly no Genesis commit lists is refused before any host changes, naming both versions;
3. the regressed nightly: the canary fails its gate and rolls back, the others are never
   touched, the pins file is unchanged, the exit status is non-zero naming the failed checks;
4. the good newer nightly: canary, then a batch of two, promoted; Genesis v7.73.0 proposed;
   pins file + history updated; the image saved to a directory and copied to the mirror;
5. a host stopped during its batch: the other host of the batch finishes, the report names
   the lost host, the pins file says what each host runs; a second bump while it is down
   reports it unreachable and skips it; once it is back, a third bump finishes the job.

The bump works on its own copy of the pins file (inventory data ``pins_file``), so the fleet
goes back to the testbed's pins at the end (one converge) for the tests that follow.

    RIGFLEET_TESTBED_INSTANCE=4 RIGFLEET_TESTBED_HOSTS=3 RIGFLEET_KEEP_TESTBED=1 \
        .venv/bin/python -m pytest tests/e2e/test_05_bump.py -x -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HOSTS, INVENTORY, STATE, run
from rigfleet_testbed import layout

from rigfleet.pins import load_pins

if HOSTS < 3:
    pytest.skip("the bump tests need 3 hosts: RIGFLEET_TESTBED_HOSTS=3", allow_module_level=True)

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
RIGFLEET = str(Path(sys.executable).with_name("rigfleet"))
TQ3 = "tq3-mtp-genesis"
GOOD = "01d4d1ad375dc5854779c593eee093bcebb0cada"
DIES = "1acd67a795ebccdf9b9db7697ae9082058301657"
NEWER = "3f9c2a7e5b1d4c8a9e0f6b2d7c1a5e8f9b3d6c02"
REGRESSED = "b7e4d1c9a2f5e8b3d6c0a9f2e5b8d1c4a7f0e3b6"
BUMP_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-bump.py")
BUMP_PINS = STATE / "bump-pins.yaml"
REGISTRY = f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}"


def bump(*args: str, check: bool = False, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``rigfleet bump`` (through the module, so it runs before cli.py wires it in)."""
    cmd = [sys.executable, "-m", "rigfleet.bump.cli", "--inventory", str(BUMP_INVENTORY), *args]
    proc = run(cmd, check=False, timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    print(proc.stderr[-6000:])
    if check and proc.returncode != 0:
        raise AssertionError(f"bump exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc


def state(host) -> dict:
    rc, out = host.sh("cat /var/lib/rigfleet/state.json")
    assert rc == 0, out
    return json.loads(out)


def ledger_lines(host) -> int:
    rc, out = host.sh("wc -l < /var/lib/rigfleet/ledger.jsonl")
    assert rc == 0, out
    return int(out.strip())


def genesis_head(host) -> str:
    rc, out = host.sh("git -C /opt/rigfleet/genesis rev-parse HEAD")
    assert rc == 0, out
    return out.strip()


def has_image(host, digest: str) -> bool:
    return host.sh(f"docker image inspect vllm/vllm-openai@{digest} >/dev/null 2>&1")[0] == 0


def images(host) -> str:
    rc, out = host.sh("docker image ls --digests --format '{{.Digest}}' vllm/vllm-openai | sort")
    assert rc == 0, out
    return out


def fixture_commits() -> list[str]:
    data = json.loads((STATE / "fixtures.json").read_text())
    return [c["sha"] for c in data["genesis"]["commits"]]


def write_bump_inventory() -> None:
    """The testbed inventory with host1 on the Genesis stack, its own pins file, and where
    this machine reaches the testbed's registry and Genesis repository."""
    BUMP_INVENTORY.write_text(f'''"""Testbed {layout.INSTANCE} for tests/e2e/test_05_bump.py."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
_data = {{**_data, "pins_file": {str(BUMP_PINS)!r}, "bump_registry": {REGISTRY!r},
         "bump_genesis_url": "http://127.0.0.1:{layout.GIT_LOCAL_PORT}/genesis-vllm-patches.git"}}
gpu_hosts = ([(n, {{**d, "stack": {TQ3!r}}} if n == "host1" else d) for n, d in _hosts], _data)
canary = ["host1"]
''')


def start_host(host, key: str) -> None:
    """Start a stopped host and wait until its boot-time recreation is done and it serves."""
    subprocess.run(["docker", "start", host.container], check=False, capture_output=True)
    host.wait_ssh(180)
    wait_idle(host, key)


def wait_idle(host, key: str, timeout: float = 300) -> None:
    """No transaction holds the host's lock and the front answers with the key."""
    deadline = time.monotonic() + timeout
    probe = (f"test ! -d /var/lib/rigfleet/lock && curl -s -o /dev/null -w '%{{http_code}}' "
             f"-H 'Authorization: Bearer {key}' http://127.0.0.1:8000/v1/models")  # fmt: skip
    while time.monotonic() < deadline:
        try:
            rc, out = host.sh(probe, timeout=20)
        except Exception:  # SSH not back yet
            rc, out = 1, ""
        if rc == 0 and out.strip() == "200":
            return
        time.sleep(2)
    raise AssertionError(f"{host.name} did not come back serving within {timeout:g}s")


@pytest.fixture(scope="module")
def fleet(testbed):
    """host1 on tq3-mtp-genesis, all on the testbed's pins (a copy the bump may change)."""
    BUMP_PINS.write_text((STATE / "pins.yaml").read_text())
    write_bump_inventory()
    run([PYINFRA, str(BUMP_INVENTORY), "deploy.py", "-y"], timeout=1800)
    yield testbed
    for host in testbed.hosts:  # a host stopped by a failed test
        if subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", host.container],
                          capture_output=True, text=True).stdout.strip() != "true":  # fmt: skip
            start_host(host, testbed.api_key)
        wait_idle(host, testbed.api_key)
    run([PYINFRA, str(INVENTORY), "deploy.py", "-y"], timeout=1800, check=False)
    BUMP_INVENTORY.unlink(missing_ok=True)
    BUMP_PINS.unlink(missing_ok=True)


# --- 1. --dry ----------------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_changes_nothing(fleet):
    before_pins = BUMP_PINS.read_text()
    before = [ledger_lines(h) for h in fleet.hosts]
    pulled = images(fleet.hosts[0])
    proc = bump("--image", f"nightly-{NEWER}", "--batch-size", "2", "--dry")
    assert proc.returncode == 0
    err = proc.stderr
    assert "canary" in err and "host1 (tq3-mtp-genesis)" in err
    assert "host2 (int8), host3 (int8)" in err  # one batch of two
    assert "(v7.73.0)" in err  # the Genesis pair it would propose
    assert "0.20.2rc1.dev212+g3f9c2a7e5" in err
    assert BUMP_PINS.read_text() == before_pins
    assert [ledger_lines(h) for h in fleet.hosts] == before
    assert images(fleet.hosts[0]) == pulled  # --dry pulls nothing


def _digest(sha: str) -> str:
    from rigfleet.registry import Registry

    return Registry(REGISTRY).digest("vllm/vllm-openai", f"nightly-{sha}")


# --- 2. not on any Genesis allowlist -----------------------------------------------------------


def test_nightly_genesis_does_not_list_is_refused_before_any_host_changes(fleet):
    before_pins = BUMP_PINS.read_text()
    before = [state(h) for h in fleet.hosts]
    lines = [ledger_lines(h) for h in fleet.hosts]
    pulled = images(fleet.hosts[0])
    proc = bump("--image", f"nightly-{DIES}", "--yes")
    assert proc.returncode == 1
    err = " ".join(proc.stderr.split())
    assert "refused" in err
    assert "vLLM 0.20.2rc1.dev129+g1acd67a79 is not on Genesis" in err  # the candidate
    assert "(v7.72.2)" in err and "(v7.73.0)" in err  # the pin, and what else was checked
    assert BUMP_PINS.read_text() == before_pins
    assert [state(h) for h in fleet.hosts] == before
    assert [ledger_lines(h) for h in fleet.hosts] == lines
    # The canary pulled the candidate to read its version; the refusal removed it again.
    assert images(fleet.hosts[0]) == pulled


# --- 3. the regressed nightly ------------------------------------------------------------------


def test_regressed_nightly_fails_the_canary_gate_and_nobody_else_moves(fleet):
    old = load_pins(BUMP_PINS)
    host1, host2, host3 = fleet.hosts
    others = [(ledger_lines(h), state(h)) for h in (host2, host3)]
    proc = bump("--image", f"nightly-{REGRESSED}", "--batch-size", "2", "--yes")
    assert proc.returncode == 1
    err = " ".join(proc.stderr.split())
    assert "host1 failed (failed checks:" in err and "spec_decode" in err
    assert "the canary host1 did not promote; no other host touched" in err
    # The pins file is untouched; host1 serves the old pins again; the others never moved.
    assert load_pins(BUMP_PINS) == old
    s1 = state(host1)
    assert s1["stack"] == TQ3 and s1["digest"] == old.stacks[TQ3].digest
    assert s1["last_swap"]["result"] == "rolled-back"
    assert "spec_decode" in s1["last_swap"]["gate"]["failed_checks"]
    assert [(ledger_lines(h), state(h)) for h in (host2, host3)] == others
    # The re-converge put host1's Genesis checkout back on the pin, and its image is gone.
    assert genesis_head(host1) == old.stacks[TQ3].genesis.commit
    assert not has_image(host1, _digest(REGRESSED))


# --- 4. the good newer nightly ------------------------------------------------------------------


def test_good_nightly_promotes_canary_then_the_rest_and_records_it(fleet, tmp_path):
    old = load_pins(BUMP_PINS)
    v7730 = fixture_commits()[1]
    proc = bump("--image", f"nightly-{NEWER}", "--batch-size", "2", "--yes",
                "--save-dir", str(tmp_path), "--push-mirror", REGISTRY, "--json")  # fmt: skip
    assert proc.returncode == 0
    summary = json.loads(proc.stdout)
    assert summary["outcome"] == "promoted"
    assert {h: r["result"] for h, r in summary["hosts"].items()} == {
        "host1": "promoted", "host2": "promoted", "host3": "promoted"}  # fmt: skip
    err = proc.stderr
    assert err.index("canary: host1 promoted") < err.index("batch 1: deploying host2, host3")
    new = load_pins(BUMP_PINS)
    assert new.serial == old.serial + 1 and new.hosts == {}
    digest = _digest(NEWER)
    assert {s.digest for s in new.stacks.values()} == {digest}
    assert new.stacks[TQ3].vllm_version == "0.20.2rc1.dev212+g3f9c2a7e5"
    assert new.stacks[TQ3].genesis.commit == v7730  # proposed: v7.72.2 does not list it
    entry = new.history[-1]
    assert entry["action"] == "bump" and entry["outcome"] == "promoted"
    assert entry["old"][TQ3]["digest"] == old.stacks[TQ3].digest
    assert entry["new"][TQ3]["genesis"] == v7730
    assert all(entry["hosts"][h]["gate"].startswith("pass") for h in ("host1", "host2", "host3"))
    for host in fleet.hosts:
        s = state(host)
        assert s["digest"] == digest and s["last_swap"]["result"] == "promoted"
        assert has_image(host, old.stacks["int8"].digest)  # the previous image, for rollback
    # Kept reproducible: a docker-save archive here, the same digest in the mirror.
    archive = tmp_path / f"vllm_vllm-openai_nightly-{NEWER}.tar"
    assert archive.stat().st_size > 0
    assert json.loads(archive.with_suffix(".json").read_text())["digest"] == digest
    assert entry["mirror"]["digest"] == digest


# --- 5. a host lost mid-rollout -----------------------------------------------------------------


def test_host_stopped_during_its_batch_is_reported_and_the_batch_finishes(fleet):
    host1, host2, host3 = fleet.hosts
    before = load_pins(BUMP_PINS)
    cmd = [sys.executable, "-m", "rigfleet.bump.cli", "--inventory", str(BUMP_INVENTORY),
           "--image", f"nightly-{GOOD}", "--batch-size", "2", "--yes"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    # Stop host3 once its swap holds the host lock (the old stack is going down).
    deadline = time.monotonic() + 900
    stopped = False
    while time.monotonic() < deadline and proc.poll() is None:
        if host3.sh("test -d /var/lib/rigfleet/lock")[0] == 0:
            time.sleep(2)
            subprocess.run(["docker", "stop", "-t", "1", host3.container], check=True,
                           capture_output=True)  # fmt: skip
            stopped = True
            break
        time.sleep(0.5)
    out, err = proc.communicate(timeout=1800)
    print(err[-6000:])
    assert stopped, "host3's swap never took the lock"
    assert proc.returncode == 1
    text = " ".join(err.split())
    assert "batch 1: host2 promoted" in text
    assert "host3 lost" in text and "bump failed: host3 lost" in text
    # Partial: the fleet's pins stay; host1 and host2 are recorded on what they now run.
    after = load_pins(BUMP_PINS)
    good = _digest(GOOD)
    assert after.stacks == before.stacks
    assert set(after.hosts) == {"host1", "host2"}
    assert after.for_host("host2").stacks["int8"].digest == good
    assert after.history[-1]["outcome"] == "partial"
    assert after.history[-1]["hosts"]["host3"]["result"] == "lost"
    assert state(host2)["digest"] == good

    # While host3 is down, a bump reports it unreachable and skips it (nothing else to do).
    proc = bump("--image", f"nightly-{GOOD}", "--yes")
    assert proc.returncode == 2
    assert "host3 is unreachable" in proc.stderr

    # Back up: it serves what it served before (boot-time recreation); a bump finishes it.
    start_host(host3, fleet.api_key)
    proc = bump("--image", f"nightly-{GOOD}", "--yes")
    assert proc.returncode == 0
    assert "canary: host3 promoted" in " ".join(proc.stderr.split())
    final = load_pins(BUMP_PINS)
    assert final.hosts == {} and final.stacks["int8"].digest == good
    assert final.history[-1]["outcome"] == "promoted"
    assert state(host3)["digest"] == good
