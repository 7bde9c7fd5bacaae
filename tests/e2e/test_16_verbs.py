"""The operator verbs on the session fleet, and a host reached through an ssh_config alias.

All on the first fleet host (``testbed.fleet[0]``; test_17 slows the last one), in order:

1. a host whose inventory name is an alias of an ssh_config file (HostName, Port, User,
   IdentityFile and UserKnownHostsFile from the file, none in the host data) answers
   ``rigfleet status``, ``roll --dry`` and ``doctor``; without the file it is unreachable;
2. ``rigfleet logs``: the engine's log, the supervisor's journal and the ledger, and
   ``--follow`` keeps streaming;
3. ``rigfleet lock``: free; a live holder shown and its release refused; once its process is
   gone, released (and said in the host's journal);
4. ``rigfleet rollback``: after a bump of int8 to v0.28.0 (on a copy of the pins file, for
   this host alone), ``--dry`` shows the way back and changes nothing, no terminal without
   ``--yes`` is refused, and ``--yes`` takes the host back through the gate to the pins before
   the bump; the pins file records it (``action: rollback``).

    RIGFLEET_TESTBED_HOSTS=1 RIGFLEET_TESTBED_EXTRAS=0 RIGFLEET_KEEP_TESTBED=1 \
        .venv/bin/python -m pytest tests/e2e/test_16_verbs.py -x -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from e2e_fleet import BIN, INVENTORY, STATE, last_ledger, read_state, run
from rigfleet_testbed import layout

from rigfleet.pins import load_pins

ALIAS = f"tb{layout.INSTANCE}-rig-one"  # not an address: only the ssh_config file knows it
SSH_CONFIG = STATE / "verbs-ssh_config"
ALIAS_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-verbs-alias.py")
VERBS_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-verbs.py")
VERBS_PINS = STATE / "verbs-pins.yaml"
RIGFLEET = str(BIN / "rigfleet")
NEWER = "v0.28.0"  # an int8 release the twin's registry serves (test_05's newest)


def rigfleet(*args: str, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    proc = run([RIGFLEET, *args], check=False, timeout=timeout,
               env={**os.environ, "COLUMNS": "200"}, stdin=subprocess.DEVNULL, **kw)
    print(proc.stderr[-4000:])
    return proc


def said(proc: subprocess.CompletedProcess) -> str:
    return " ".join(proc.stderr.split())


def write_inventory(path, host: str, data_expr: str, name: str | None = None) -> None:
    """The testbed inventory with only ``host`` (as ``name``), its data through
    ``data_expr`` (a Python expression over ``_d``, the host's data), no balancer."""
    path.write_text(f'''"""Testbed {layout.INSTANCE} for tests/e2e/test_16_verbs.py."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
_d = dict(next(d for n, d in _hosts if n == {host!r}))
gpu_hosts = ([({(name or host)!r}, {data_expr})], _data)
canary = [{(name or host)!r}]
''')


@pytest.fixture(scope="module")
def host(testbed, converged):
    return testbed.fleet[0]


def test_a_host_behind_an_ssh_config_alias_answers_status_roll_and_doctor(host):
    SSH_CONFIG.write_text(f"""Host {ALIAS}
    HostName 127.0.0.1
    Port {host.ssh_port}
    User root
    IdentityFile {STATE / "ssh" / "id_ed25519"}
    UserKnownHostsFile {STATE / "ssh" / "known_hosts"}
""")
    gone = ("ssh_hostname", "ssh_port", "ssh_user", "ssh_key", "ssh_known_hosts_file")
    data = f"{{**{{k: v for k, v in _d.items() if k not in {gone!r}}}, " \
           f"'ssh_config_file': {str(SSH_CONFIG)!r}}}"
    write_inventory(ALIAS_INVENTORY, host.name, data, name=ALIAS)

    status = rigfleet("status", "--inventory", str(ALIAS_INVENTORY), "--json")
    row = next(r for r in json.loads(status.stdout)["hosts"] if r["host"] == ALIAS)
    assert row["reachable"] is True and row["stack"] == "int8", row
    assert row["digest"] == read_state(host)["digest"], row

    roll = rigfleet("roll", "--inventory", str(ALIAS_INVENTORY), "--dry", "--json")
    assert roll.returncode == 0, roll.stderr
    plan = json.loads(roll.stdout)
    assert plan["batches"] == [[ALIAS]] and plan["skipped"] == {}, plan
    assert plan["serving"] == [ALIAS]

    doctor = rigfleet("doctor", "--inventory", str(ALIAS_INVENTORY), "--json", "--load-s", "3")
    report = json.loads(doctor.stdout)
    text = json.dumps(report)
    assert ALIAS in text and "unreachable" not in text.lower(), text[:2000]

    # Without the file the alias is a name nothing resolves: the same commands cannot reach it.
    write_inventory(ALIAS_INVENTORY, host.name, data.replace(str(SSH_CONFIG),
                                                             str(STATE / "no-such-config")),
                    name=ALIAS)
    roll = rigfleet("roll", "--inventory", str(ALIAS_INVENTORY), "--dry", "--json")
    skipped = json.loads(roll.stdout)["skipped"]
    assert "ssh_config_file" in skipped[ALIAS] and "no such file" in skipped[ALIAS]


def test_logs_show_the_engine_the_supervisor_and_the_ledger(host):
    proc = rigfleet("logs", host.name, "--inventory", str(INVENTORY), "-n", "50")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    engine = [x for x in lines if x.startswith("engine     | ")]
    supervisor = [x for x in lines if x.startswith("supervisor | ")]
    ledger = [x for x in lines if x.startswith("ledger     | ")]
    assert engine and supervisor and ledger, proc.stdout[-3000:]
    assert any(host.container_of_stack in x for x in engine), engine[-5:]  # compose's prefix
    assert any("int8" in x and " promoted" in x for x in ledger), ledger[-5:]
    assert not any(x.removeprefix("ledger     | ").startswith("{") for x in ledger)  # pretty

    only = rigfleet("logs", host.name, "--inventory", str(INVENTORY), "--source", "ledger",
                    "--since", "2000-01-01T00:00:00Z")
    assert only.returncode == 0 and only.stdout.strip()
    assert all(" | " not in x for x in only.stdout.splitlines())  # one source: no tags
    assert len(only.stdout.splitlines()) >= len(ledger)  # the whole ledger, not its tail

    follow = subprocess.Popen([RIGFLEET, "logs", host.name, "--inventory", str(INVENTORY),
                               "--source", "ledger", "-n", "1", "--follow"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = follow.stdout.readline() if follow.stdout else ""
        assert first.strip(), follow.stderr.read() if follow.stderr else ""
        assert follow.poll() is None  # still following
    finally:
        follow.terminate()
        follow.wait(timeout=30)


def test_lock_shows_refuses_a_live_holder_and_releases_a_stale_one(host):
    show = rigfleet("lock", host.name, "--inventory", str(INVENTORY), "--json")
    assert show.returncode == 0 and json.loads(show.stdout)["state"] == "free", show.stdout
    unit = "rigfleet-e2e-lock-holder"
    rc, out = host.sh(f"systemd-run --unit {unit} --collect sleep 900 && sleep 0.5 && "
                      f"systemctl show -p MainPID --value {unit}")
    assert rc == 0, out
    pid = int(out.strip().splitlines()[-1])
    holder = {"who": "e2e@ctl", "why": "a deploy that will die", "since": "2026-12-03T10:00:00Z",
              "deploy_id": "E2E", "pid": pid, "host": "ctl",
              "boot_id": host.sh("cat /proc/sys/kernel/random/boot_id")[1].strip()}
    rc, out = host.sh(f"mkdir /var/lib/rigfleet/lock && printf '%s' '{json.dumps(holder)}' > "
                      "/var/lib/rigfleet/lock/holder.json")
    assert rc == 0, out
    try:
        shown = json.loads(rigfleet("lock", host.name, "--inventory", str(INVENTORY),
                                    "--json").stdout)
        assert shown["state"] == "held" and shown["alive"] and shown["holder"] == "e2e@ctl"
        assert shown["process"] == f"pid {pid} on ctl" and shown["why"] == holder["why"]
        refused = rigfleet("lock", host.name, "--inventory", str(INVENTORY), "--release",
                           "--reason", "e2e")
        assert refused.returncode == 1 and "the holder is alive" in said(refused)
        assert host.sh("test -e /var/lib/rigfleet/lock/holder.json")[0] == 0

        assert host.sh(f"systemctl stop {unit}")[0] == 0  # the holder dies
        shown = json.loads(rigfleet("lock", host.name, "--inventory", str(INVENTORY),
                                    "--json").stdout)
        assert shown["state"] == "stale" and shown["alive"] is False
        released = rigfleet("lock", host.name, "--inventory", str(INVENTORY), "--release",
                            "--reason", "e2e: holder stopped")
        assert released.returncode == 0, released.stderr
        assert "released a stale lock (locked by e2e@ctl" in " ".join(released.stdout.split())
        assert host.sh("test -e /var/lib/rigfleet/lock")[0] != 0
        rc, out = host.sh("journalctl -t rigfleet-host --no-pager -n 20")
        assert "e2e: holder stopped" in out, out
        assert json.loads(rigfleet("lock", host.name, "--inventory", str(INVENTORY),
                                   "--json").stdout)["state"] == "free"
    finally:
        host.sh(f"systemctl stop {unit} 2>/dev/null; rm -rf /var/lib/rigfleet/lock")


def test_rollback_takes_the_host_back_to_the_pins_before_a_bump(host):
    VERBS_PINS.write_text((STATE / "pins.yaml").read_text())
    write_inventory(VERBS_INVENTORY, host.name, "_d")
    VERBS_INVENTORY.write_text(VERBS_INVENTORY.read_text().replace(
        "gpu_hosts = (", f"_data = {{**_data, 'pins_file': {str(VERBS_PINS)!r}}}\n"
        "gpu_hosts = ("))
    before = load_pins(VERBS_PINS)
    old = before.stacks["int8"]

    bump = run([sys.executable, "-m", "rigfleet.bump.cli", "--inventory", str(VERBS_INVENTORY),
                "--image", NEWER, "--stack", "int8", "--yes"], check=False, timeout=1800)
    print(bump.stderr[-4000:])
    assert bump.returncode == 0, bump.stderr[-3000:]
    bumped = load_pins(VERBS_PINS)
    assert bumped.stacks["int8"].tag == NEWER and read_state(host)["image"].endswith(NEWER)

    verbs = ["rollback", "--inventory", str(VERBS_INVENTORY), "--limit", "canary"]
    dry = rigfleet(*verbs, "--dry", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert (plan["from_serial"], plan["to_serial"]) == (bumped.serial, before.serial)
    assert plan["batches"] == [[host.name]] and plan["canary"] == host.name
    assert plan["stacks"]["int8"]["to"].startswith(old.tag)
    assert load_pins(VERBS_PINS).serial == bumped.serial  # --dry changed nothing

    asked = rigfleet(*verbs)  # stdin is not a terminal
    assert asked.returncode == 1 and "pass --yes" in said(asked)
    assert load_pins(VERBS_PINS).serial == bumped.serial

    started = time.monotonic()
    back = rigfleet(*verbs, "--yes", timeout=1800)
    print(f"rollback took {time.monotonic() - started:.0f}s")
    assert back.returncode == 0, back.stderr[-3000:]
    after = load_pins(VERBS_PINS)
    assert after.stacks == before.stacks and after.hosts == {}
    entry = after.history[-1]
    assert (entry["action"], entry["to_serial"], entry["outcome"]) == \
        ("rollback", before.serial, "promoted")
    assert entry["hosts"][host.name]["result"] == "promoted"
    state = read_state(host)
    assert state["digest"] == old.digest and state["image"] == old.image, state
    assert state["last_swap"]["result"] == "promoted"  # through the swap gate
    assert last_ledger(host)["gate"]["result"] == "pass"
