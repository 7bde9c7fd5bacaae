"""Issue 4 on the simulated fleet: blue/green swaps between int8 and tq3-mtp-genesis, gated by
verify-stress, with rollback.

Each test drives the real converge (``pyinfra <inventory> deploy.py -y --limit <host> --data
stack=...``) and checks the host itself (front, ledger, state) over SSH. Faults come in the
way the issue names them: ``extra_env`` (Genesis P67 off, a slow boot), a user's stack file
whose KV cache cannot fit (it dies at boot), a killed deploy, a second deploy at once. The fleet is
put back on the inventory's stacks at the end, for the tests that follow.

    RIGFLEET_TESTBED_INSTANCE=3 RIGFLEET_KEEP_TESTBED=1 .venv/bin/python -m pytest \
        tests/e2e/test_04_swap.py -x
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from e2e_fleet import INVENTORY, REPO, STATE, last_ledger, run, wait_for

from rigfleet.hostside.front import ROUTE_HEADER

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
TOOL = "python3 /usr/local/lib/rigfleet/rigfleet-host.pyz"
# The testbed inventory sets gate_profile = "fast"; passing it keeps these tests fast on an
# inventory generated before that key existed.
FAST = ("--data", "gate_profile=fast")
TQ3 = "tq3-mtp-genesis"


def pyinfra(*args: str, check: bool = True, timeout: float = 1800):
    return run([PYINFRA, str(INVENTORY), "deploy.py", "-y", *FAST, *args], check=check,
               timeout=timeout)


def extra_env(**stacks: dict[str, str]) -> tuple[str, str]:
    return ("--data", "extra_env=" + json.dumps({k.replace("_", "-"): v
                                                 for k, v in stacks.items()}))


def swap(host, stack: str, *args: str, check: bool = True):
    return pyinfra("--limit", host.name, "--data", f"stack={stack}", *args, check=check)


def status(host) -> dict:
    rc, out = host.sh(f"{TOOL} status --json")
    assert rc == 0, out
    return json.loads(out)


def front(host, key: str, path: str = "/v1/models") -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(f"{host.front_url}{path}",
                                 headers={"Authorization": f"Bearer {key}"})
    try:
        with host.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers.items())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items())


def route_of(host, key: str) -> str | None:
    return front(host, key)[1].get(ROUTE_HEADER)


def chat(host, key: str) -> int:
    body = json.dumps({"model": "qwen3.6-27b-autoround", "max_tokens": 16,
                       "messages": [{"role": "user", "content": "Capital of France?"}]})
    req = urllib.request.Request(f"{host.front_url}/v1/chat/completions", data=body.encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with host.urlopen(req, timeout=30) as resp:
        return resp.status


class FrontProbe(threading.Thread):
    """Asks the front every 50 ms through a swap; remembers every answer (or error)."""

    def __init__(self, host, key: str) -> None:
        super().__init__(daemon=True)
        self.host, self.key = host, key
        self.seen: list[tuple[float, int | str, str | None, str | None]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            t = time.monotonic()
            try:
                code, headers = front(self.host, self.key)
                self.seen.append((t, code, headers.get(ROUTE_HEADER),
                                  headers.get("Retry-After")))
            except Exception as e:  # connection refused, reset, timeout: all failures here
                self.seen.append((t, f"{type(e).__name__}: {e}", None, None))
            time.sleep(0.05)

    def stop(self) -> FrontProbe:
        self._stop_event.set()
        self.join(15)
        return self


def settle(host, key: str) -> None:
    """Wait out a reboot an earlier test scheduled: ``systemd-run --on-active=1 systemctl
    reboot`` makes a timer with systemd's default 1-minute accuracy, so the reboot can start
    many seconds after that test moved on (and in the middle of our converge)."""
    pending = ("for s in $(systemctl list-timers --all --no-legend 'run-*' | awk '{print $NF}');"
               " do systemctl show -p ExecStart \"$s\"; done | grep -q 'systemctl reboot'")
    wait_for(lambda: _quiet_sh(host, pending) != 0, 150, f"{host.name}'s pending reboot")
    host.wait_ssh(240)
    wait_for(lambda: front_answers(host, key), 240, f"{host.name}'s front to answer")


def _quiet_sh(host, command: str) -> int:
    try:
        return host.sh(command, timeout=20)[0]
    except Exception:  # going down for the reboot we are waiting for
        return -1


def front_answers(host, key: str) -> bool:
    """The front answers 200 with the key (False while it refuses, resets or is not up)."""
    try:
        return front(host, key)[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def fleet(testbed, converged):
    """Every host converged on the inventory's stacks; put back there afterwards."""
    for host in testbed.hosts:
        settle(host, testbed.api_key)
    pyinfra()
    yield testbed
    pyinfra(check=False)


def newest_swap_dir(host) -> str:
    rc, out = host.sh("ls -1td /var/lib/rigfleet/swap/2* 2>/dev/null | head -n 1")
    return out.strip()


# --- 1. int8 -> tq3-mtp-genesis -> int8, through the gate, probed -----------------------------


def test_swap_to_tq3_and_back_passes_the_gate_and_the_front_never_refuses(fleet):
    host, key = fleet.hosts[0], fleet.api_key
    before = route_of(host, key)
    assert before and before.startswith("int8/"), before
    probe = FrontProbe(host, key)
    probe.start()
    proc = swap(host, TQ3)
    seen = probe.stop().seen
    out = proc.stdout + proc.stderr
    assert "swap gate: pass" in out and "swap promote:" in out, out[-3000:]

    after = route_of(host, key)
    assert after and after.startswith(f"{TQ3}/")
    assert chat(host, key) == 200
    line = last_ledger(host)
    assert (line["event"], line["result"], line["stack"]) == ("swap", "promoted", TQ3)
    assert line["previous"]["stack"] == "int8" and line["gate"]["result"] == "pass"
    assert line["genesis_commit"] and line["gate"]["report"].startswith("/var/lib/rigfleet/")
    local = REPO / "reports" / host.name / Path(line["gate"]["report_md"]).name
    assert local.exists() and "verify-stress gate: PASS" in local.read_text()
    st = status(host)
    assert st["active"]["ref"]["stack"] == TQ3 and st["route"] == after

    # Only 200s and 503s with Retry-After; the 200s come from the old stack, then the new one.
    codes = {s[1] for s in seen}
    assert codes <= {200, 503}, sorted(map(str, codes))
    assert 503 in codes and 200 in codes
    assert all(s[3] for s in seen if s[1] == 503), "a 503 without Retry-After"
    routes = [s[2] for s in seen if s[1] == 200]
    assert set(routes) <= {before, after}
    assert routes == sorted(routes, key=lambda r: r == after), "the old stack answered again"

    # Converged: nothing to do, and --dry says so.
    plan = run([PYINFRA, str(INVENTORY), "deploy.py", "--dry", "--json", *FAST, "--limit",
                host.name, "--data", f"stack={TQ3}"]).stdout
    changes = [op["name"] for op in json.loads(plan[plan.index("{"):])["plan"]
               if op.get("hosts_with_change")]
    assert changes == []

    back = swap(host, "int8")
    assert "swap promote:" in back.stdout + back.stderr
    assert route_of(host, key).startswith("int8/")
    assert last_ledger(host)["stack"] == "int8"


# --- 2. tq3 with Genesis P67 off: its boot line is missing; unchecked, the needles fail -------


def unchecked_tq3(tmp_path: Path) -> tuple[Path, Path]:
    """A user's copy of tq3-mtp-genesis without ``boot.expect`` (``stacks_dir``), pinned like
    it. Returns (stacks dir, pins file)."""
    import yaml

    from rigfleet.catalog import BUILTIN_DIR

    doc = yaml.safe_load((BUILTIN_DIR / f"{TQ3}.yaml").read_text())
    doc.update(name=UNCHECKED, port=8018, summary="tq3-mtp-genesis without boot.expect")
    del doc["boot"]["expect"]
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / f"{UNCHECKED}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    pins["stacks"][UNCHECKED] = dict(pins["stacks"][TQ3])
    path = tmp_path / "pins-unchecked.yaml"
    path.write_text(yaml.safe_dump(pins, sort_keys=False))
    return stacks, path


UNCHECKED = "tq3-unchecked"
P67_OFF = {"GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL": "0"}


def test_tq3_without_p67_fails_at_boot_or_the_long_needles_and_int8_is_restored(fleet, tmp_path):
    host, key = fleet.hosts[0], fleet.api_key
    before = route_of(host, key)
    # The shipped stack file expects P67's [ON] line: the boot fails as soon as it answers.
    proc = swap(host, TQ3, *extra_env(tq3_mtp_genesis=P67_OFF), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"swap to {TQ3} rolled back (boot failed)" in out, out[-3000:]
    assert "boot.expect line(s) missing from the boot log: Genesis P67" in out
    assert route_of(host, key) == before and chat(host, key) == 200
    line = last_ledger(host)
    assert (line["result"], line["stack"], line["attempted"]["stack"]) == (
        "rolled-back", "int8", TQ3)
    assert line["boot_failure"]["kind"] == "boot-line-missing"
    assert "gate" not in line or not line["gate"].get("failed_checks")

    # A copy without boot.expect boots; the gate's long needles catch what P67 is for.
    stacks, pins = unchecked_tq3(tmp_path)
    proc = swap(host, UNCHECKED, *extra_env(tq3_unchecked=P67_OFF), "--data",
                f"stacks_dir={stacks}", "--data", f"pins_file={pins}", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"swap to {UNCHECKED} rolled back (gate failed)" in out, out[-3000:]
    assert "needles" in out and "needles_deep" in out
    assert route_of(host, key) == before and chat(host, key) == 200
    line = last_ledger(host)
    assert (line["result"], line["stack"], line["attempted"]["stack"]) == (
        "rolled-back", "int8", UNCHECKED)
    assert {"needles", "needles_deep"} <= set(line["gate"]["failed_checks"])
    report = REPO / "reports" / host.name / Path(line["gate"]["report_md"]).name
    text = report.read_text()
    assert "FAIL" in text and "`needles`" in text and "`needles_deep`" in text
    assert status(host)["last_swap"]["result"] == "rolled-back"


# --- 3. a stack that dies at boot: rollback, the boot failure named ---------------------------


def desktop_stack(tmp_path: Path) -> tuple[Path, Path]:
    """A user's stack file (``stacks_dir``): int8 with gpu_memory_utilization 0.60, to leave
    room for a desktop session. At 262K context the KV cache then does not fit, so vLLM refuses
    to start: a mistake no check before the boot can see. Returns (stacks dir, pins file that
    pins it like int8)."""
    import yaml

    from rigfleet.catalog import BUILTIN_DIR

    doc = yaml.safe_load((BUILTIN_DIR / "int8.yaml").read_text())
    doc.update(name="int8-desktop", port=8019,
               summary="int8 with room for a desktop session on the cards")
    doc["vllm"]["gpu_memory_utilization"] = 0.60
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "int8-desktop.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    pins["stacks"]["int8-desktop"] = dict(pins["stacks"]["int8"])
    path = tmp_path / "pins-desktop.yaml"
    path.write_text(yaml.safe_dump(pins, sort_keys=False))
    return stacks, path


def test_a_stack_that_dies_at_boot_is_rolled_back_naming_the_failure(fleet, tmp_path):
    host, key = fleet.hosts[1], fleet.api_key
    before = route_of(host, key)
    assert before.startswith("int8/")
    stacks, pins = desktop_stack(tmp_path)
    started = time.monotonic()
    proc = swap(host, "int8-desktop", "--data", f"stacks_dir={stacks}",
                "--data", f"pins_file={pins}", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "swap to int8-desktop rolled back (boot failed)" in out, out[-3000:]
    assert "KV cache too small for max-model-len" in out
    assert "estimated maximum model length is" in out  # vLLM's own advice, passed on
    assert time.monotonic() - started < 300  # failed fast, not after the ready timeout
    assert route_of(host, key) == before and chat(host, key) == 200
    line = last_ledger(host)
    assert (line["event"], line["result"]) == ("swap", "rolled-back")
    assert line["boot_failure"]["kind"] == "kv-cache-too-small"
    assert line["attempted"]["stack"] == "int8-desktop" and line["stack"] == "int8"
    rc, log = host.sh(f"cat {line['kept_log']}")
    assert rc == 0 and "To serve at least one request with the model's max seq len" in log


# --- 4. the deploy's SSH connection dies mid-swap -------------------------------------------


def test_killing_the_deploy_mid_swap_leaves_the_host_on_a_verified_stack(fleet):
    host, key = fleet.hosts[1], fleet.api_key
    cmd = [PYINFRA, str(INVENTORY), "deploy.py", "-y", *FAST, "--limit", host.name,
           "--data", f"stack={TQ3}", *extra_env(tq3_mtp_genesis={"SIM_BOOT_SECONDS": "8"})]
    before = newest_swap_dir(host)
    deploy = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        swap_dir = wait_for(lambda: (d := newest_swap_dir(host)) != before and d, 300,
                            "the transaction to start")
        wait_for(lambda: host.sh(f"grep -q '\"phase\": \"start\"' {swap_dir}/events.jsonl")[0]
                 == 0, 120, "the new stack to be starting")
    finally:
        os.killpg(deploy.pid, signal.SIGKILL)  # the control side and its SSH connection die
        deploy.wait()
    result = json.loads(wait_for(
        lambda: (r := host.sh(f"cat {swap_dir}/result.json")) and r[0] == 0 and r[1], 300,
        "the transaction to finish on the host"))
    assert result["result"] == "promoted", result
    active = status(host)["active"]["ref"]
    assert active["stack"] == TQ3
    assert route_of(host, key) == f"{TQ3}/{active['config_hash']}" and chat(host, key) == 200
    line = last_ledger(host)
    assert (line["stack"], line["config_hash"], line["result"]) == (
        TQ3, active["config_hash"], "promoted")
    assert line["gate"]["result"] == "pass"


# --- 5. two deploys at once on one host --------------------------------------------------


def test_a_second_deploy_during_a_swap_is_refused_with_the_holder(fleet):
    host = fleet.hosts[1]
    cmd = [PYINFRA, str(INVENTORY), "deploy.py", "-y", *FAST, "--limit", host.name,
           "--data", "stack=int8", *extra_env(int8={"SIM_BOOT_SECONDS": "12"})]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)  # pyinfra's log lines are on stderr
    try:
        wait_for(lambda: host.sh("test -f /var/lib/rigfleet/lock/holder.json")[0] == 0, 300,
                 "the first deploy's swap to take the host lock")
        second = pyinfra("--limit", host.name, check=False)
    finally:
        out_first, _ = first.communicate(timeout=600)
    text = second.stdout + second.stderr
    assert second.returncode != 0
    assert f"{host.name}: locked by " in text and " since " in text, text[-2000:]
    assert "swap " in text and "-> int8/" in text  # why
    assert "pid " in text and "deploy " in text
    assert first.returncode == 0, out_first[-3000:]
    assert "swap promote:" in out_first
    assert host.sh("test -e /var/lib/rigfleet/lock")[0] != 0  # released
