"""Maintenance windows under a slow step, a busy package manager and a step that fails
(issue 19), each on its own host, with a driver branch change as the window's work.

1. host1 (its deploy runs in the background while host2's faults run): dpkg runs ``SLOW_S``
   seconds longer than usual (an apt ``DPkg::Pre-Invoke`` hook that sleeps once, as a slow
   DKMS build or mirror does) while the host's own estimate of the window is a few seconds
   (its measured timings set short: the 503's Retry-After says so). The window is held the
   whole step (held by the deploy's SSH session, not by a guess of its duration): the front
   answers 503 maintenance throughout it, the host tool's status says ``held`` (never
   abandoned, never someone else closing it), and the window closes once, cleanly, through
   the gate, after the step.
2. host2: another process holds dpkg's frontend lock (a real ``fcntl`` lock, what apt and
   unattended-upgrades take): the deploy waits its bounded time, then refuses naming the
   holder; no window opened and the front answered 200 throughout.
3. host2: dpkg fails inside the window (a ``Pre-Invoke`` hook that fails): the deploy closes
   the window at once (recreate + gate) and the front answers 200 again before the deploy
   returns, not 20 minutes later.

Hooks are files in ``/etc/apt/apt.conf.d`` (apt's documented mechanism), removed afterwards.
The hosts are left on the other driver branch (nothing converges after this module).

    RIGFLEET_TESTBED_HOSTS=2 RIGFLEET_TESTBED_EXTRAS=0 RIGFLEET_KEEP_TESTBED=1 \
        .venv/bin/python -m pytest tests/e2e/test_14_windows.py -x -v
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path

import pytest
from e2e_fleet import HOSTS, INVENTORY, STATE, ledger, run, wait_for
from test_04_swap import FrontProbe, front_answers

if HOSTS < 2:
    pytest.skip("the window faults need 2 hosts: RIGFLEET_TESTBED_HOSTS=2",
                allow_module_level=True)

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
PINS = STATE / "windows-pins.yaml"
WINDOWS_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-windows.py")
HOOK = "/etc/apt/apt.conf.d/99rigfleet-e2e"
SLOW_S = 90  # the slow step: dpkg held back this long, once
# The slow step's start and end (the host's epoch seconds), written by the hook itself; on
# disk, not in /run: the reboot after the install must not make dpkg sleep again.
SLOW_MARK = "/var/lib/rigfleet-e2e-slow-step"
# The host's measured window times set short (``rigfleet.hostside.steps``): the window's
# estimate (its 503's Retry-After) is a few seconds, and the step runs far past it.
SHORT_TIMES = {"overhead_s": 0.5, "drain_s": None, "steps_s": 1.0}
SHORT_STACK_TIMES = {"boot_s": 0.5, "gate_s": 1.0, "at": 0.0}
ESTIMATE_S = 3  # what the host makes of them: ceil(steps 1.0 + boot 0.5 + gate 1.0 + 0.5)
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
    WINDOWS_INVENTORY.write_text(
        f'''"""The testbed inventory on {PINS.name} (tests/e2e/test_14_windows.py)."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
gpu_hosts = (_hosts, {{**_data, "pins_file": {str(PINS)!r}}})
balancers = _tb.get("balancers", ([], {{}}))
''')
    slow = SlowDeploy(hosts[0], testbed.api_key)
    slow.start()
    try:
        yield testbed, other, slow
    finally:
        slow.join(1800)
        for h in hosts:
            h.sh(f"rm -f {HOOK} {SLOW_MARK}.*; "
                 f"systemctl stop {HOLDER_UNIT} 2>/dev/null || true")
    for f in (WINDOWS_INVENTORY, PINS):
        f.unlink(missing_ok=True)


class StatusWatch(threading.Thread):
    """Asks the host tool for the window's status every 3 s (what the supervisor and
    ``ensure`` go by): ``seen`` holds (monotonic time, status, why), or (time, "error", what
    went wrong) for an answer it could not get (the reboot), so an empty watch says why.

    The stop flag is ``_stop_event``: a ``threading.Thread`` subclass must not set ``_stop``,
    the name of the method ``join()`` calls once the thread ended (the earlier watch did; its
    ``join`` raised ``TypeError: 'Event' object is not callable``, and what it had seen was
    lost with the exception)."""

    def __init__(self, host) -> None:
        super().__init__(daemon=True)
        self.host = host
        self.seen: list[tuple[float, str, str]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            t = time.monotonic()
            try:
                rc, out = self.host.sh(f"{TOOL} maintenance status --json", timeout=30)
                data = json.loads(out) if rc == 0 else {"status": "error", "why": out[-300:]}
                self.seen.append((t, str(data["status"]), str(data.get("why") or "")))
            except Exception as e:  # the reboot: SSH refused or cut
                self.seen.append((t, "error", f"{type(e).__name__}: {e}"))
            self._stop_event.wait(3)

    def stop(self) -> StatusWatch:
        self._stop_event.set()
        self.join(60)
        return self


class SlowDeploy(threading.Thread):
    """host1's deploy with dpkg slowed by ``SLOW_S`` (once) and the window's estimate set
    short, watched (window status, front). Whatever goes wrong in the thread is kept in
    ``error`` for the test (an exception in a thread is otherwise only a warning)."""

    def __init__(self, host, key: str) -> None:
        super().__init__(daemon=True)
        self.host, self.key = host, key
        self.proc, self.error = None, None
        self.seen: list[tuple[float, str, str]] = []
        self.answers: list[tuple] = []
        self.since = len(ledger(host))

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:
            self.error = e

    def _run(self) -> None:
        host = self.host
        timings = shlex.quote(json.dumps({"schema": "rigfleet-timings/1", **SHORT_TIMES,
                                          "stacks": {host.stack: SHORT_STACK_TIMES}}))
        rc, out = host.sh(f"rm -f {SLOW_MARK}.* && printf '%s\\n' {timings} "
                          "> /var/lib/rigfleet/timings.json")
        assert rc == 0, out
        put_hook(host, f'DPkg::Pre-Invoke {{"if [ ! -e {SLOW_MARK}.start ]; then date +%s.%N '
                       f'> {SLOW_MARK}.start; sleep {SLOW_S}; date +%s.%N > {SLOW_MARK}.end; '
                       'fi";};')
        watch, probe = StatusWatch(host), FrontProbe(host, self.key)
        watch.start()
        probe.start()
        try:
            self.proc = deploy(host)
        finally:
            self.seen, self.answers = watch.stop().seen, probe.stop().seen
            host.sh(f"rm -f {HOOK}")

    def step(self) -> tuple[float, float]:
        """The slow step's start and end (epoch seconds, as the hook wrote them)."""
        rc, out = self.host.sh(f"cat {SLOW_MARK}.start {SLOW_MARK}.end")
        assert rc == 0, f"{self.host.name}: the slow step did not run to its end: {out}"
        start, end = (float(x) for x in out.split())
        return start, end


def epoch(t: float) -> float:
    """A ``time.monotonic()`` of the watches as epoch seconds (the hosts are containers on
    this machine: their wall clock is this machine's)."""
    return t + time.time() - time.monotonic()


def test_a_held_dpkg_lock_keeps_the_host_serving_and_the_deploy_names_its_holder(fleet):
    testbed, other, _ = fleet
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
    testbed, other, _ = fleet
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


def test_a_step_far_past_its_estimate_keeps_its_window_held_and_it_closes_once(fleet):
    testbed, other, slow = fleet
    host, key = testbed.fleet[0], testbed.api_key
    slow.join(1800)
    assert not slow.is_alive(), "host1's slow deploy still runs after 30 min"
    assert slow.error is None, repr(slow.error)
    proc = slow.proc
    assert proc is not None and proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert branch_of(host) == other
    start, end = slow.step()
    assert end - start >= SLOW_S, (start, end)
    # The front, every 50 ms: 503 maintenance for the whole step, saying the short estimate.
    during = [a for a in slow.answers if start <= epoch(a[0]) <= end]
    assert len(during) > SLOW_S, f"{len(during)} front answers during the step"
    wrong = [a for a in during if a[1] != 503 or a[2] != "maintenance"]
    assert not wrong, wrong[:5]
    said = {int(a[3]) for a in during}
    assert said and max(said) <= ESTIMATE_S, said
    # The host tool's view every 3 s: held by the deploy from before the step to its end;
    # never abandoned, failed or closing (someone else's close: the supervisor's).
    seen = [s for s in slow.seen if start <= epoch(s[0]) <= end]
    assert seen and epoch(seen[0][0]) - start <= 10 and end - epoch(seen[-1][0]) <= 10, \
        (start, end, slow.seen)
    assert {s[1] for s in seen} == {"held"} and not any("closing" in s[2] for s in seen), seen
    assert not {s[1] for s in slow.seen} & {"abandoned", "failed", "damaged"}, slow.seen
    # The ledger: opened before the step, closed once after it, through the gate; nothing
    # (a supervisor's recreation or close, an abandoned window) written during the step.
    written = ledger(host)[slow.since:]
    assert not [x for x in written if start <= parse_time(x["time"]) <= end], written
    lines = maintenance_lines(host, slow.since)
    assert [x["result"] for x in lines] == ["opened", "closed"], lines
    opened, closed = (parse_time(x["time"]) for x in lines)
    assert opened <= start and closed > end, (lines, start, end)
    assert lines[1]["gate"]["result"] == "pass" and "install" in lines[1]["reason"], lines[1]
    assert lines[1]["deploy_id"] == lines[0]["deploy_id"]
    rc, out = host.sh(f"{TOOL} maintenance status --json")
    assert rc == 0 and json.loads(out)["status"] == "none", out
    # Before the deploy and after it: 200.
    assert slow.answers[0][1] == 200 and slow.answers[-1][1] == 200 and front_answers(host, key)
    out_of_service = [a[0] for a in slow.answers if a[1] != 200]
    print(f"step {end - start:.0f}s past an estimate of {max(said)}s; "
          f"{len(during)} front answers during it, all 503 maintenance; "
          f"{len(seen)} status answers, all held; out of service "
          f"{out_of_service[-1] - out_of_service[0]:.0f}s; closed once through the gate")


def parse_time(text: str) -> float:
    """A ledger line's ``time`` (ISO 8601) as epoch seconds."""
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
