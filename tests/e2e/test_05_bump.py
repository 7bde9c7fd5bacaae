"""``rigfleet bump`` on the session fleet: release tags by version order, canary first.

host1..host3 serve int8 on the default pins (host1 is the inventory's canary); host4 (when the
session has it) serves the single-card stack, which a ``--stack int8`` bump leaves alone. The
tests run in order on one fleet, each from where the previous one left it:

1. ``--latest --dry`` proposes the newest release above the pin (v0.28.0, by version order)
   and changes nothing;
2. images the int8 stack file does not allow (a nightly; a release below v0.22.0, which has no
   INT8 per-token-head KV) are refused before any host changes;
3. the bump to v0.28.0 (with the extras: seeded into lb1's fleet cache first, each blob from
   the upstream once, and pulled by the canary from there) is killed (its whole process group,
   as when the control machine dies) as soon as the canary promoted: a converge keeps host1 on
   the candidate (the bump journal)
   and the others on the pins file; the next ``rigfleet bump`` resumes the plan, and host3 is
   stopped while its swap holds the lock: host2 promotes, host3 is reported lost, the pins file
   records what each host runs; a bump while host3 is down reports it unreachable; once it is
   back, a bump finishes the job, saves the image to a directory and copies it to a mirror;
4. behind lb1 (with the extras), a bump takes all three back to the pinned release under
   load (canary, then two at once): an int8 host stays in rotation, nothing fails or is cut.

The bump works on its own copy of the pins file (inventory data ``pins_file``), so the fleet
goes back to the default pins at the end (test 4, else the fixture's converge) for the modules
that follow.

    RIGFLEET_TESTBED_HOSTS=3 RIGFLEET_TESTBED_EXTRAS=0 RIGFLEET_KEEP_TESTBED=1 \
        .venv/bin/python -m pytest tests/e2e/test_05_bump.py -x -v
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from e2e_fleet import (
    HOSTS,
    INVENTORY,
    REPO,
    STATE,
    cache_blob_gets,
    ip_of,
    run,
    under_load,
    upstream_blob_gets,
)
from e2e_fleet import read_state as state
from rigfleet_testbed import layout

from rigfleet.bump.journal import journal_path
from rigfleet.pins import load_pins

if HOSTS < 3:
    pytest.skip("the bump tests need 3 hosts: RIGFLEET_TESTBED_HOSTS=3", allow_module_level=True)

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
NEWEST = "v0.28.0"  # the newest release the twin's mirror serves (Docker Hub's today)
NIGHTLY = "nightly-f090c883507d730ae76900d4ae60b673430b4bbf"  # served: among the 14 newest
TOO_OLD = "v0.20.0"  # no int8_per_token_head before v0.22.0
BUMP_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-bump.py")
BUMP_PINS = STATE / "bump-pins.yaml"
JOURNAL = journal_path(BUMP_PINS)
REGISTRY = f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}"
BUMP = [sys.executable, "-m", "rigfleet.bump.cli", "--inventory", str(BUMP_INVENTORY)]
TO_NEWEST = ["--image", NEWEST, "--stack", "int8", "--batch-size", "2", "--yes"]


def bump(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``rigfleet bump --inventory <the bump inventory> ARGS``; stderr printed."""
    proc = run([*BUMP, *args], check=False, timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    print(proc.stderr[-6000:])
    return proc


def said(proc: subprocess.CompletedProcess) -> str:
    """stderr with the terminal's line wrapping undone."""
    return " ".join(proc.stderr.split())


def ledger_lines(host) -> int:
    rc, out = host.sh("wc -l < /var/lib/rigfleet/ledger.jsonl")
    assert rc == 0, out
    return int(out.strip())


def images(host) -> str:
    rc, out = host.sh("docker image ls --digests --format '{{.Digest}}' vllm/vllm-openai | sort")
    assert rc == 0, out
    return out


def digest_of(tag: str) -> str:
    from rigfleet.registry import Registry

    return Registry(REGISTRY).digest("vllm/vllm-openai", tag)


def write_bump_inventory() -> None:
    """The testbed inventory with its own pins file, host1 as the canary, and where this
    machine reaches the testbed's registry and Genesis repository."""
    BUMP_INVENTORY.write_text(f'''"""Testbed {layout.INSTANCE} for tests/e2e/test_05_bump.py."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
_data = {{**_data, "pins_file": {str(BUMP_PINS)!r}, "bump_registry": {REGISTRY!r},
         "bump_genesis_url": "http://127.0.0.1:{layout.GIT_LOCAL_PORT}/genesis-vllm-patches.git"}}
gpu_hosts = (_hosts, _data)
balancers = _tb.get("balancers", ([], {{}}))
caches = _tb.get("caches", ([], {{}}))
canary = ["host1"]
''')


def running(host) -> bool:
    return subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", host.container],
                          capture_output=True, text=True).stdout.strip() == "true"  # fmt: skip


def start_host(host, key: str) -> None:
    """Start a stopped host and wait until its boot-time recreation is done and it serves."""
    subprocess.run(["docker", "start", host.container], check=False, capture_output=True)
    host.wait_ssh(180)
    wait_idle(host, key)


def wait_idle(host, key: str, timeout: float = 300) -> None:
    """No transaction holds the host's lock and the front answers with the key."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            busy = host.sh("test -d /var/lib/rigfleet/lock", timeout=20)[0] == 0
            req = urllib.request.Request(f"{host.front_url}/v1/models",
                                         headers={"Authorization": f"Bearer {key}"})
            if not busy and host.urlopen(req, timeout=10).status == 200:
                return
        except Exception:  # SSH or the front not back yet
            pass
        time.sleep(2)
    raise AssertionError(f"{host.name} did not come back serving within {timeout:g}s")


@pytest.fixture(scope="module")
def fleet(converged, testbed):
    """The converged fleet, on a copy of the default pins that the bump may change."""
    BUMP_PINS.write_text((STATE / "pins.yaml").read_text())
    JOURNAL.unlink(missing_ok=True)
    write_bump_inventory()
    yield testbed
    for host in testbed.hosts:  # a host stopped by a failed test
        if not running(host):
            start_host(host, testbed.api_key)
        wait_idle(host, testbed.api_key)
    run([PYINFRA, str(INVENTORY), "deploy.py", "-y"], timeout=1800, check=False)
    for f in (BUMP_INVENTORY, BUMP_PINS, JOURNAL):
        f.unlink(missing_ok=True)


def untouched(fleet):
    """What a refused bump must leave as it is: the pins file, each host's state, ledger and
    the canary's images."""
    return (BUMP_PINS.read_text(), [state(h) for h in fleet.hosts],
            [ledger_lines(h) for h in fleet.hosts], images(fleet.hosts[0]))


# --- 1. --latest --dry ----------------------------------------------------------------------


def test_latest_dry_proposes_the_newest_release_by_version_and_changes_nothing(fleet):
    before = untouched(fleet)
    proc = bump("--latest", "--stack", "int8", "--batch-size", "2", "--dry")
    assert proc.returncode == 0, proc.stderr
    err = said(proc)
    assert f"vllm/vllm-openai:{NEWEST}" in err and "0.28.0" in err
    assert "canary" in err and "host1 (int8)" in err
    assert "host2 (int8), host3 (int8)" in err  # one batch of two
    assert untouched(fleet) == before  # nothing pulled, written or swapped
    assert not JOURNAL.exists()


# --- 2. images the stack file does not allow -----------------------------------------------


@pytest.mark.parametrize("tag, named", [
    (NIGHTLY, "release"),  # int8 takes release tags only
    (TOO_OLD, "0.22.0"),  # and none below v0.22.0
])
def test_an_image_the_stack_file_does_not_allow_is_refused_before_any_host_changes(
        fleet, tag, named):
    before = untouched(fleet)
    proc = bump("--image", tag, "--stack", "int8", "--yes")
    assert proc.returncode != 0
    err = said(proc)
    assert "refused" in err and "int8" in err and tag.split("-")[-1][:12] in err, err
    assert named in err, err
    assert untouched(fleet) == before
    assert not JOURNAL.exists()


# --- 3. killed after the canary, resumed, a host lost, finished -----------------------------


def test_a_bump_killed_after_the_canary_promoted_is_kept_by_the_converge(fleet):
    host1, host2, host3 = fleet.fleet[:3]
    old = load_pins(BUMP_PINS)
    others = [(ledger_lines(h), state(h)["digest"]) for h in (host2, host3)]
    started = time.time() - 1
    proc = subprocess.Popen([*BUMP, *TO_NEWEST], cwd=REPO, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "200"},
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 900
    promoted = False
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            outcomes = json.loads(JOURNAL.read_text()).get("outcomes", {})
        except (FileNotFoundError, ValueError):
            outcomes = {}
        if outcomes.get("host1", {}).get("status") == "promoted":
            os.killpg(proc.pid, signal.SIGKILL)  # the bump and its pyinfra run, at once
            promoted = True
            break
        time.sleep(0.1)
    proc.wait(timeout=60)
    print(proc.stderr.read()[-4000:] if proc.stderr else "")
    assert promoted, "the canary never promoted"
    new = digest_of(NEWEST)
    if fleet.balancer is not None:  # lb1 is the fleet cache: the candidate came from it
        canary, lb = ip_of(host1), ip_of(fleet.balancer)
        rigs = {ip_of(h) for h in fleet.hosts}
        # (this machine reads the candidate's config blob too: its build time)
        upstream = upstream_blob_gets(started)
        assert not [k for k in upstream if k[0] in rigs], upstream  # no rig went upstream
        assert all(n == 1 for (c, _), n in upstream.items() if c == lb), upstream  # once
        cached = cache_blob_gets(fleet.balancer, started)
        assert any(client == canary for client, _ in cached), cached
    assert JOURNAL.exists() and load_pins(BUMP_PINS) == old  # unfinished: pins not written
    assert state(host1)["digest"] == new

    converge = run([PYINFRA, str(BUMP_INVENTORY), "deploy.py", "-y", "--limit", "host1",
                    "--limit", "host2", "--limit", "host3"], timeout=1800)  # fmt: skip
    assert converge.returncode == 0
    s1 = state(host1)
    assert s1["digest"] == new and s1["last_swap"]["result"] == "promoted"
    assert [(ledger_lines(h), state(h)["digest"]) for h in (host2, host3)] == others


def test_the_next_bump_resumes_it_and_reports_a_host_lost_in_its_batch(fleet):
    host1, host2, host3 = fleet.fleet[:3]
    old = load_pins(BUMP_PINS)
    proc = subprocess.Popen([*BUMP, "--yes"], cwd=REPO, text=True,
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
    _, err = proc.communicate(timeout=1800)
    print(err[-6000:])
    assert stopped, "host3's swap never took the lock"
    assert proc.returncode == 1
    text = " ".join(err.split())
    assert "resuming" in text
    assert "batch 1: host2 promoted" in text
    assert "host3 lost" in text and "bump failed: host3 lost" in text
    # Partial: the fleet's pins stay; host1 and host2 are recorded on what they now run.
    after = load_pins(BUMP_PINS)
    new = digest_of(NEWEST)
    assert after.stacks == old.stacks
    assert set(after.hosts) == {"host1", "host2"}
    assert after.for_host("host1").stacks["int8"].digest == new
    assert after.for_host("host2").stacks["int8"].digest == new
    assert after.history[-1]["outcome"] == "partial"
    assert after.history[-1]["hosts"]["host3"]["result"] == "lost"
    assert state(host2)["digest"] == new
    assert not JOURNAL.exists()

    # While host3 is down, a bump reports it unreachable and skips it (nothing else to do).
    proc = bump(*TO_NEWEST)
    assert proc.returncode == 2
    assert "host3 is unreachable" in said(proc)


def test_once_the_lost_host_is_back_a_bump_finishes_and_keeps_the_image(fleet, tmp_path):
    host3 = fleet.fleet[2]
    start_host(host3, fleet.api_key)  # it serves what it served before (boot-time recreation)
    proc = bump(*TO_NEWEST, "--save-dir", str(tmp_path), "--push-mirror", REGISTRY, "--json")
    assert proc.returncode == 0
    assert "canary: host3 promoted" in said(proc)
    new = digest_of(NEWEST)
    final = load_pins(BUMP_PINS)
    assert final.hosts == {} and final.stacks["int8"].digest == new
    assert final.stacks["int8"].image == f"vllm/vllm-openai:{NEWEST}"
    assert final.stacks["int8"].vllm_version == "0.28.0"
    entry = final.history[-1]
    assert entry["action"] == "bump" and entry["outcome"] == "promoted"
    for host in fleet.fleet[:3]:
        s = state(host)
        assert s["digest"] == new and s["last_swap"]["result"] == "promoted", host.name
    # Kept reproducible: a docker-save archive here, the same digest in the mirror.
    archive = tmp_path / f"vllm_vllm-openai_{NEWEST}.tar"
    assert archive.stat().st_size > 0
    assert json.loads(archive.with_suffix(".json").read_text())["digest"] == new
    assert entry["mirror"]["digest"] == new
    summary = json.loads(proc.stdout)
    assert summary["outcome"] == "promoted"


# --- 6. behind the balancer: a bump across all three under load ---------------------------------


def test_behind_the_balancer_a_bump_across_all_three_fails_and_cuts_nothing(fleet):
    """All three on v0.28.0 (test 5), bumped back to the pinned release while the load asks
    lb1: the canary, then the other two at once (batch 2: one int8 host keeps serving); an
    int8 host is in rotation at every check, no request fails and no stream is cut. The
    fleet ends on the default pins (the fixture's converge then changes nothing)."""
    lb = fleet.balancer
    if lb is None:
        pytest.skip("the session's testbed has no balancer (RIGFLEET_TESTBED_EXTRAS=0)")
    hosts = fleet.fleet[:3]
    default = load_pins(STATE / "pins.yaml").stacks["int8"]
    back = default.image.rpartition(":")[2]
    assert all(state(h)["digest"] != default.digest for h in hosts)  # test 5 bumped them
    box = {}
    report, fewest = under_load(lb, fleet.api_key, lambda: box.setdefault("p", bump(
        "--image", back, "--stack", "int8", "--batch-size", "2", "--yes")))
    proc = box["p"]
    assert proc.returncode == 0, said(proc)[-4000:]
    assert "canary: host1 promoted" in said(proc)
    assert fewest >= 1, fewest
    assert report.sent >= 30 and report.answered == report.sent
    assert report.failed == {}, report.failed
    assert report.cut == 0, report.cut_reasons
    for host in hosts:
        s = state(host)
        assert s["digest"] == default.digest and s["last_swap"]["result"] == "promoted", host.name
