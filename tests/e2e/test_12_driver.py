"""A driver branch change rolled over the fleet, and a Secure Boot host without DKMS's key.

1. ``rigfleet roll`` with the pins' driver branch moved 595 -> 620 (production to the next
   long-term-support branch, the move a fleet on 595 makes before 595's end of life in 2027-03;
   on a copy of the pins file, inventory data ``pins_file``), from NVIDIA's debian13
   repository as the twin serves it: one serving host at a time installs 620, reboots inside its
   maintenance window and comes back through the gate. Every front of the fleet is asked every
   50 ms the whole time: the host in its window answers 503 with Retry-After, or nothing while
   it reboots; the others answer 200 throughout.
2. host3's firmware gets Secure Boot switched on (as a person does in the firmware setup, then
   the machine restarts): DKMS's key is not enrolled, so the kernel refuses the module at boot.
   The deploy stops with the enrolment steps instead of rebooting, and a second deploy does
   not reboot either. The steps work: ``mokutil --import``, a person at the console at the next
   boot (``rigfleet testbed mok-enroll``), the module loads, and the deploy passes: the host
   serves again.

It leaves the fleet on driver 620 (test_17, the last module, runs no converge).

    RIGFLEET_TESTBED_HOSTS=3 RIGFLEET_KEEP_TESTBED=1 \
        .venv/bin/python -m pytest tests/e2e/test_12_driver.py -x -v
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from e2e_fleet import BIN, HOSTS, INVENTORY, STATE, ledger, run, wait_for
from test_04_swap import FrontProbe, front_answers

if HOSTS < 3:
    pytest.skip("the driver roll needs 3 hosts: RIGFLEET_TESTBED_HOSTS=3",
                allow_module_level=True)

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
OLD_BRANCH, NEW_BRANCH = "595", "620"
ROLL_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-driver.py")
ROLL_PINS = STATE / "driver-pins.yaml"
NO_REBOOT = "/run/rigfleet-e2e-no-reboot"  # /run is a tmpfs: a reboot takes it away
DKMS_CERT = "/var/lib/dkms/mok.pub"


def driver_version(host) -> str:
    rc, out = host.sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    return out.splitlines()[0].strip() if rc == 0 and out.strip() else f"(rc {rc}) {out.strip()}"


@pytest.fixture(scope="module")
def fleet(converged, testbed):
    """The converged fleet and an inventory whose pins file says driver 620."""
    from rigfleet.pins import load_pins

    text = (STATE / "pins.yaml").read_text()
    assert load_pins(STATE / "pins.yaml").driver_branch == OLD_BRANCH, text
    ROLL_PINS.write_text(text.replace(f"branch: '{OLD_BRANCH}'", f"branch: '{NEW_BRANCH}'", 1))
    assert load_pins(ROLL_PINS).driver_branch == NEW_BRANCH
    ROLL_INVENTORY.write_text(
        f'''"""The testbed inventory on {ROLL_PINS.name} (tests/e2e/test_12_driver.py)."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
gpu_hosts = (_hosts, {{**_data, "pins_file": {str(ROLL_PINS)!r}}})
balancers = _tb.get("balancers", ([], {{}}))
''')
    for host in testbed.fleet:
        wait_for(lambda h=host: front_answers(h, testbed.api_key), 240, f"{host.name} serving")
    yield testbed
    for f in (ROLL_INVENTORY, ROLL_PINS):
        f.unlink(missing_ok=True)


def boot_recreation_done(host) -> bool:
    """``rigfleet-stack.service`` (the stack's recreation at boot) has run to its end: it holds
    the host lock until then, and a deploy is refused, naming it."""
    try:
        rc, out = host.sh("systemctl show -p ActiveState -p MainPID rigfleet-stack.service",
                          timeout=20)
    except Exception:  # SSH not back yet
        return False
    props = dict(line.split("=", 1) for line in out.split() if "=" in line)
    return props.get("MainPID") == "0" and props.get("ActiveState") in ("active", "failed")


def windows(seen: list[tuple]) -> tuple[float, float] | None:
    """The span from a front's first answer that is not a 200 to its last one."""
    bad = [s[0] for s in seen if s[1] != 200]
    return (bad[0], bad[-1]) if bad else None


def test_a_driver_branch_change_rolls_one_host_at_a_time_through_the_gate(fleet):
    hosts, key = fleet.fleet, fleet.api_key
    assert all(driver_version(h).startswith(f"{OLD_BRANCH}.") for h in hosts)
    probes = {h.name: FrontProbe(h, key) for h in hosts}
    for p in probes.values():
        p.start()
    try:
        proc = run([str(BIN / "rigfleet"), "roll", "--inventory", str(ROLL_INVENTORY), "--json",
                    "--yes",
                    *[a for h in hosts for a in ("--limit", h.name)]],
                   check=False, timeout=1800, env={**os.environ, "COLUMNS": "200"})
    finally:
        seen = {name: p.stop().seen for name, p in probes.items()}
    print(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["ok"] and result["stopped"] is None, result
    got = {h["host"]: h for h in result["hosts"]}
    assert [got[h.name]["batch"] for h in hosts] == [1, 2, 3], got  # one at a time, in order
    for h in hosts:
        assert (got[h.name]["result"], got[h.name]["gate"]) == ("maintained", "pass"), got
        assert driver_version(h).startswith(f"{NEW_BRANCH}."), driver_version(h)
        line = [x for x in ledger(h) if x.get("event") == "maintenance"][-1]
        assert line["result"] == "closed" and line["gate"]["result"] == "pass", line
        assert f"NVIDIA driver {NEW_BRANCH} install" in line["reason"], line
        assert front_answers(h, key)

    # Each host was out of service once, and never while another one was.
    spans = {}
    for h in hosts:
        answers = seen[h.name]
        assert answers and answers[0][1] == 200 and answers[-1][1] == 200, (h.name, answers[-3:])
        span = windows(answers)
        assert span is not None, f"{h.name}: its front never left 200 (was it rebooted?)"
        spans[h.name] = span
        inside = [s for s in answers if span[0] <= s[0] <= span[1]]
        refused = [s for s in inside if s[1] == 503]
        assert refused, f"{h.name}: no 503 in its window"
        assert all(s[3] for s in refused), f"{h.name}: a 503 without Retry-After"
        # Between its 503s: 503s, the reboot (no answer), or 200s once its stack is back
        # (the window closes through the gate, then the front routes again).
        assert all(s[1] in (200, 503) or isinstance(s[1], str) for s in inside)
    order = sorted(spans.items(), key=lambda kv: kv[1][0])
    assert [name for name, _ in order] == [h.name for h in hosts], order
    for (a, sa), (b, sb) in zip(order, order[1:], strict=False):
        assert sa[1] < sb[0], f"{a} and {b} were out of service at the same time: {sa} {sb}"
    for h in hosts:
        mine = spans[h.name]
        others = [s for s in seen[h.name] if not mine[0] <= s[0] <= mine[1]]
        assert {s[1] for s in others} == {200}, (h.name, {str(s[1]) for s in others})
    print({n: round(b - a, 1) for n, (a, b) in spans.items()}, "s out of service")


def test_secure_boot_without_the_dkms_key_stops_with_the_steps_and_does_not_reboot(fleet):
    host, key = fleet.fleet[-1], fleet.api_key
    nvram = STATE / "hosts" / host.name / "firmware"
    assert (nvram / "SecureBoot").read_text().strip() == "0"
    deploy = [PYINFRA, str(ROLL_INVENTORY), "deploy.py", "-y", "--limit", host.name]
    try:
        # The firmware setup: Secure Boot on, then the machine starts again.
        (nvram / "SecureBoot").write_text("1\n")
        host.reboot()
        wait_for(lambda: boot_recreation_done(host), 180, f"{host.name}: its boot-time recreation")
        assert not front_answers(host, key)  # no module, no GPUs: the stack cannot start
        why = [x for x in ledger(host) if x.get("event") == "ensure"][-1]  # the 503 explained
        assert why["result"] == "failed" and "NVIDIA driver does not answer" in why["reason"], why
        rc, out = host.sh(f"mokutil --sb-state; mokutil --test-key {DKMS_CERT}")
        assert "SecureBoot enabled" in out and "is not enrolled" in out, out
        assert host.sh("nvidia-smi")[0] != 0  # the module was refused at boot
        assert host.sh(f"touch {NO_REBOOT}")[0] == 0
        for attempt in (1, 2):
            proc = run(deploy, check=False, timeout=900)
            out = " ".join((proc.stdout + proc.stderr).split())
            assert proc.returncode != 0, f"deploy {attempt} passed on a refused module"
            assert "Secure Boot is on" in out and f"mokutil --import {DKMS_CERT}" in out, \
                out[-3000:]
            assert "Enroll MOK" in out, out[-3000:]
            assert host.sh(f"test -e {NO_REBOOT}")[0] == 0, f"deploy {attempt} rebooted"
        # The steps, as a person follows them: the import (a one-time password), then the
        # reboot with somebody at the console who confirms it.
        rc, out = host.sh(f"printf 'otp-1234\\notp-1234\\n' | mokutil --import {DKMS_CERT}")
        assert rc == 0, out
        run([str(BIN / "rigfleet"), "testbed", "mok-enroll", host.name], timeout=600)
        rc, out = host.sh(f"mokutil --test-key {DKMS_CERT}")
        assert "is already enrolled" in out, out
        assert driver_version(host).startswith(f"{NEW_BRANCH}.")  # loaded at this boot
        wait_for(lambda: boot_recreation_done(host), 180, f"{host.name}: its boot-time recreation")
        run(deploy, timeout=900)  # step 3: the deploy again passes
        wait_for(lambda: front_answers(host, key), 120, f"{host.name} serving")
    finally:
        if not front_answers(host, key):
            # For the modules after this one: Secure Boot off again, and the host back.
            (nvram / "SecureBoot").write_text("0\n")
            host.reboot()
            wait_for(lambda: front_answers(host, key), 300, f"{host.name} serving again")
    assert front_answers(host, key)
