"""Maintenance windows under a busy package manager and a step that fails, with a driver
branch change as the window's work.

(A step far longer than usual is not here yet: its watch of the window's status saw no answer
at all in its one run in pytest, and was taken out until that is understood.)

1. host2: another process holds dpkg's frontend lock (a real ``fcntl`` lock, what apt and
   unattended-upgrades take): the deploy waits its bounded time, then refuses naming the
   holder; no window opened and the front answered 200 throughout.
2. host2: dpkg fails inside the window (a ``Pre-Invoke`` hook that fails): the deploy closes
   the window at once (recreate + gate) and the front answers 200 again before the deploy
   returns, not 20 minutes later.

Hooks are files in ``/etc/apt/apt.conf.d`` (apt's documented mechanism), removed afterwards.
The hosts are left on the other driver branch (nothing converges after this module).

    RIGFLEET_TESTBED_HOSTS=2 RIGFLEET_TESTBED_EXTRAS=0 RIGFLEET_KEEP_TESTBED=1 \
        .venv/bin/python -m pytest tests/e2e/test_14_windows.py -x -v
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest
from conftest import HOSTS, INVENTORY, STATE, ledger, run, wait_for
from test_04_swap import FrontProbe, front_answers

if HOSTS < 2:
    pytest.skip("the window faults need 2 hosts: RIGFLEET_TESTBED_HOSTS=2",
                allow_module_level=True)

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
PINS = STATE / "windows-pins.yaml"
WINDOWS_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-windows.py")
HOOK = "/etc/apt/apt.conf.d/99rigfleet-e2e"
HOLDER_UNIT = "rigfleet-e2e-dpkg-holder"
HOLD_LOCK = ("import fcntl, time; f = open('/var/lib/dpkg/lock-frontend', 'r+'); "
             "fcntl.lockf(f, fcntl.LOCK_EX); time.sleep(1800)")
TOOL = "python3 /usr/local/lib/rigfleet/rigfleet-host.pyz"


def branch_of(host) -> str:
    rc, out = host.sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert rc == 0 and out.strip(), out
    return out.splitlines()[0].split(".")[0]


def maintenance_lines(host, since: int) -> list[dict]:
    return [x for x in ledger(host)[since:] if x.get("event") == "maintenance"]


def deploy(host, *, env: dict[str, str] | None = None):
    return run([PYINFRA, str(WINDOWS_INVENTORY), "deploy.py", "-y", "--limit", host.name],
               check=False, timeout=1800, env={**os.environ, **(env or {})})


def put_hook(host, body: str) -> None:
    rc, out = host.sh(f"printf '%s\\n' {shlex.quote(body)} > {HOOK}")
    assert rc == 0, out


@pytest.fixture(scope="module")
def fleet(testbed, converged):
    """The converged fleet and an inventory whose pins name the other driver branch."""
    hosts = testbed.fleet[:2]
    for h in hosts:
        wait_for(lambda h=h: front_answers(h, testbed.api_key), 300, f"{h.name} serving")
    now = {branch_of(h) for h in hosts}
    assert len(now) == 1, now
    other = "620" if now == {"595"} else "595"  # both in every NVIDIA repository the twin serves
    text = (STATE / "pins.yaml").read_text()
    # After test_12 the hosts run 620 and the testbed's pins already say 595: the same text.
    changed = re.sub(r"branch: '\d+'", f"branch: '{other}'", text, count=1)
    assert f"branch: '{other}'" in changed and other not in now, (changed, now)
    PINS.write_text(changed)
    WINDOWS_INVENTORY.write_text(f'''"""The testbed inventory on {PINS.name} (tests/e2e/test_14_windows.py)."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
gpu_hosts = (_hosts, {{**_data, "pins_file": {str(PINS)!r}}})
balancers = _tb.get("balancers", ([], {{}}))
''')
    yield testbed, other
    for h in hosts:
        h.sh(f"rm -f {HOOK}; systemctl stop {HOLDER_UNIT} 2>/dev/null || true")
    for f in (WINDOWS_INVENTORY, PINS):
        f.unlink(missing_ok=True)


def test_a_held_dpkg_lock_keeps_the_host_serving_and_the_deploy_names_its_holder(fleet):
    testbed, other = fleet
    host, key = testbed.fleet[1], testbed.api_key
    before = branch_of(host)
    since = len(ledger(host))
    rc, out = host.sh(f"systemd-run --unit {HOLDER_UNIT} --collect python3 -c "
                      f"{shlex.quote(HOLD_LOCK)} && sleep 1 && systemctl show -p MainPID "
                      f"--value {HOLDER_UNIT}")
    assert rc == 0, out
    pid = int(out.split()[-1])
    probe = FrontProbe(host, key)
    probe.start()
    try:
        t0 = time.monotonic()
        proc = deploy(host, env={"RIGFLEET_APT_LOCK_WAIT_S": "20"})
        took = time.monotonic() - t0
    finally:
        answers = probe.stop().seen
        host.sh(f"systemctl stop {HOLDER_UNIT}")
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, said[-3000:]
    assert re.search(rf"/var/lib/dpkg/lock-frontend is held by pid {pid} \(\S*python3 -c "
                     r"import fcntl", said), said[-3000:]
    assert re.search(r"still after 2\d s", said) and "Nothing was disturbed" in said, \
        said[-3000:]
    assert maintenance_lines(host, since) == [] and branch_of(host) == before
    assert answers and {a[1] for a in answers} == {200}, {str(a[1]) for a in answers}
    print(f"refused after {took:.0f}s; {len(answers)} front answers, all 200")


def test_a_deploy_failing_inside_its_window_closes_it_at_once(fleet):
    testbed, other = fleet
    host, key = testbed.fleet[1], testbed.api_key
    before = branch_of(host)
    since = len(ledger(host))
    put_hook(host, 'DPkg::Pre-Invoke {"echo rigfleet-e2e: dpkg refused >&2; exit 1";};')
    probe = FrontProbe(host, key)
    probe.start()
    try:
        proc = deploy(host)
        back = front_answers(host, key)  # right when the deploy returns
    finally:
        answers = probe.stop().seen
        host.sh(f"rm -f {HOOK}")
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, said[-3000:]
    assert "closing the window now" in said and "window closed: the stack serves" in said, \
        said[-3000:]
    assert back and branch_of(host) == before
    lines = maintenance_lines(host, since)
    assert [x["result"] for x in lines] == ["opened", "closed"], lines
    assert "the deploy failed inside it at: NVIDIA driver | Install NVIDIA driver" \
        in lines[-1]["reason"], lines[-1]
    assert lines[-1]["gate"]["result"] == "pass"
    bad = [a[0] for a in answers if a[1] != 200]
    assert bad and answers[-1][1] == 200
    print(f"out of service {bad[-1] - bad[0]:.0f}s (one recreation and gate)")
