"""Issue 10 on the simulated fleet: faults around the swap.

Each test injects a fault on a serving host of the converged fleet and checks the host itself
(from inside the serving container, the front, the ledger, the records) over SSH:

1. ``systemctl daemon-reload`` and ``systemctl restart docker`` by hand on a serving host: the
   stack keeps serving with its GPUs (``nvidia-smi`` in the container; the twin drops the
   runtime hook's device rules of a systemd-managed container at a daemon-reload, as
   nvidia-container-toolkit#48 describes, so this fails without the deploy's cgroupfs driver),
   and the container is the same one (``live-restore``);
2. damaged records (``active.json`` empty, truncated, garbage; a torn ledger line): the host
   keeps serving, the record is rebuilt from the ledger (``recover``) and the damaged file is
   kept; with no usable ledger line either, the host tool says why and what to do (no
   traceback) and the host still serves its verified stack;
3. a SIGKILL of the host tool mid-swap (the new stack booting, and its gate running): the
   host ends serving its verified stack, and the ledger and status say what happened;
4. the second model revision of the hub fixture (it downloads and boots, but fails the
   gate's needles) rolls back onto the first revision's own directory: the running
   container's mount.

The hosts end as they were found (the inventory's stacks, the default pins): every fault
here ends on the verified int8 stack, and the fixture converges a host only when its front
routes elsewhere at the end.

    RIGFLEET_TESTBED_INSTANCE=5 RIGFLEET_TESTBED_HOSTS=2 RIGFLEET_TESTBED_EXTRAS=0 \\
        RIGFLEET_KEEP_TESTBED=1 .venv/bin/python -m pytest tests/e2e/test_08_faults.py -x -v
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from e2e_fleet import INVENTORY, REPO, STATE, ledger
from test_04_swap import (
    FAST,
    PYINFRA,
    TOOL,
    FrontProbe,
    chat,
    extra_env,
    last_ledger,
    newest_swap_dir,
    route_of,
    settle,
    status,
    swap,
    wait_for,
)

STATE_DIR = "/var/lib/rigfleet"
ACTIVE = f"{STATE_DIR}/active/active.json"
LEDGER = f"{STATE_DIR}/ledger.jsonl"


@pytest.fixture(scope="module")
def fleet(testbed, converged):
    """The converged fleet, serving; a host whose front routes elsewhere at the end (a test
    that failed half-way) is converged back onto its inventory stack."""
    for host in testbed.fleet:
        settle(host, testbed.api_key)
    found = {h.name: route_of(h, testbed.api_key) for h in testbed.fleet}
    assert all(r and r.startswith("int8/") for r in found.values()), found
    yield testbed
    moved = [h for h in testbed.fleet if _route_or_none(h, testbed.api_key) != found[h.name]]
    for host in moved:
        settle(host, testbed.api_key)
        swap(host, host.stack, check=False)


def _route_or_none(host, key: str) -> str | None:
    try:
        return route_of(host, key)
    except OSError:
        return None


def _chat_or_none(host, key: str) -> int | None:
    try:
        return chat(host, key)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def sh_ok(host, command: str, timeout: float = 120) -> str:
    rc, out = host.sh(command, timeout=timeout)
    assert rc == 0, f"{host.name}: {command}: exit {rc}\n{out}"
    return out


def gpus_in_container(host) -> tuple[int, str]:
    """``nvidia-smi -L`` inside the serving container (the toolkit mounts it in with the
    ``utility`` capability): (exit status, output)."""
    return host.sh(f"docker exec {host.container_of_stack} nvidia-smi -L", timeout=60)


def container_identity(host) -> str:
    return sh_ok(host, "docker inspect -f '{{.Id}} {{.State.StartedAt}} {{.RestartCount}}' "
                 f"{host.container_of_stack}").strip()


# --- 1. daemon-reload and a Docker restart while serving -------------------------------------


def test_daemon_reload_and_docker_restart_keep_the_stack_serving_with_its_gpus(fleet):
    host, key = fleet.fleet[0], fleet.api_key
    route = route_of(host, key)
    rc, out = gpus_in_container(host)
    assert rc == 0 and out.count("GPU ") == 2, out
    ident = container_identity(host)

    # Any package's postinst runs one; the twin then re-applies each systemd-managed
    # container's DeviceAllow= (nvidia-container-toolkit#48).
    sh_ok(host, "systemctl daemon-reload")
    rc, out = gpus_in_container(host)
    assert rc == 0 and out.count("GPU ") == 2, f"GPUs lost to a daemon-reload:\n{out}"
    assert "Unknown Error" not in out
    assert chat(host, key) == 200

    probe = FrontProbe(host, key)
    probe.start()
    sh_ok(host, "systemctl restart docker", timeout=180)
    wait_for(lambda: host.sh("docker info >/dev/null 2>&1")[0] == 0, 120, "dockerd back")
    # live-restore: the same container, never stopped, and its GPUs with it.
    assert container_identity(host) == ident
    rc, out = gpus_in_container(host)
    assert rc == 0 and out.count("GPU ") == 2, f"GPUs lost to a Docker restart:\n{out}"
    wait_for(lambda: _route_or_none(host, key) == route, 60, "the front to serve")
    assert chat(host, key) == 200
    seen = probe.stop().seen
    # A daemon-reload after the restart (the new dockerd read the same cgroupfs driver).
    sh_ok(host, "systemctl daemon-reload")
    rc, out = gpus_in_container(host)
    assert rc == 0 and out.count("GPU ") == 2, out
    # Nobody recreated it behind our back (the supervisor would have, had it looked dead).
    assert container_identity(host) == ident
    # A restart by hand is outside any maintenance window: while dockerd restarts, its port
    # proxies do too, and the front answers 502 for a moment (real Docker; the deploy's own
    # restart runs in a window: 503 + Retry-After). The container itself never stopped.
    down = [t for t, code, *_ in seen if code != 200]
    print(f"front not 200 for {max(down) - min(down) if down else 0:.1f}s of the restart "
          f"({len(down)} of {len(seen)} probes)")
    assert seen and seen[-1][1] == 200


# --- 2. damaged records ------------------------------------------------------------------------


DAMAGE = {
    "empty": ": > {f}",
    "truncated": "head -c 37 {f}.good > {f}",
    "garbage": "head -c 300 /dev/urandom > {f}",
}


def test_damaged_active_record_is_rebuilt_from_the_ledger_while_serving(fleet):
    host, key = fleet.fleet[1], fleet.api_key
    route = route_of(host, key)
    good = json.loads(sh_ok(host, f"cat {ACTIVE}"))
    # A torn append (the host went down mid-write): a half line at the ledger's end.
    sh_ok(host, f"printf '%s' '{{\"event\": \"swap\", \"resu' >> {LEDGER}")
    st = status(host)  # the reader skips the torn line
    assert st["active"]["ref"]["config_hash"] == good["ref"]["config_hash"]
    probe = FrontProbe(host, key)
    probe.start()
    for kind, damage in DAMAGE.items():
        before = len(ledger(host))
        sh_ok(host, f"cp {ACTIVE} {ACTIVE}.good && "
              + damage.format(f=ACTIVE) + f" && rm -f {ACTIVE}.good")
        # The supervisor (a reader holding the host lock) rebuilds it from the ledger.
        line = wait_for(lambda n=before: next((ln for ln in ledger(host)[n:]
                                               if ln.get("result") == "recovered"), None),
                        60, f"{host.name}: the {kind} active.json to be recovered")
        assert line["event"] == "recover" and line["config_hash"] == good["ref"]["config_hash"]
        now = json.loads(sh_ok(host, f"cat {ACTIVE}"))
        assert now["ref"] == good["ref"], kind
        kept = sh_ok(host, f"ls {ACTIVE}.damaged-*").split()
        assert kept, kind
        assert route_of(host, key) == route and chat(host, key) == 200
    seen = probe.stop().seen
    assert {s[1] for s in seen} == {200}, sorted(map(str, {s[1] for s in seen}))
    sh_ok(host, f"rm -f {ACTIVE}.damaged-*")

    # Nothing to rebuild it from (no ledger line readable either): the supervisor keeps the
    # stack serving and says why; the boot-time ensure puts the front at 503 saying why.
    sh_ok(host, f"cp -p {LEDGER} /root/ledger.keep && cp -p {ACTIVE} /root/active.keep"
          f" && head -c 200 /dev/urandom | base64 > {LEDGER} && : > {ACTIVE}")
    try:
        wait_for(lambda: "cannot tell what should serve" in json.dumps(
            status(host).get("supervisor") or {}), 60, "the supervisor to say why it waits")
        assert route_of(host, key) == route and chat(host, key) == 200
        rc, out = host.sh(f"{TOOL} status")
        assert "Traceback" not in out and "active.json" in out, out
        rc, out = host.sh(f"{TOOL} ensure --why 'test_08 damaged records'")
        assert "Traceback" not in out, out
        assert rc != 0 and "ledger" in out, out
        # Never a silent 503: the stack (untouched) answers, or the front says why.
        code, headers, body = front_answer(host, key)
        assert code == 200 or (code == 503 and headers.get("Retry-After") and "damaged" in body
                               and "deploy" in body), (code, headers, body)
    finally:
        host.sh(f"cp -p /root/ledger.keep {LEDGER} && cp -p /root/active.keep {ACTIVE} && "
                f"rm -f /root/ledger.keep /root/active.keep {ACTIVE}.damaged-*")
    # The records back: the supervisor routes the front to the stack, which never stopped.
    wait_for(lambda: _route_or_none(host, key) == route, 60, "the front to serve again")
    assert status(host)["active"]["ref"] == good["ref"] and chat(host, key) == 200


def front_answer(host, key: str) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(f"{host.front_url}/v1/models",
                                 headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers.items()), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read().decode(errors="replace")


# --- 3. the host tool killed mid-swap ----------------------------------------------------------


def swap_in_background(host, *args: str) -> subprocess.Popen:
    cmd = [PYINFRA, str(INVENTORY), "deploy.py", "-y", *FAST, "--limit", host.name, *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


@pytest.mark.parametrize("kill_at", ["start", "ready"])
def test_the_host_tool_killed_mid_swap_leaves_the_verified_stack_serving(fleet, kill_at):
    host, key = fleet.fleet[1], fleet.api_key
    before_route = route_of(host, key)
    before_dir = newest_swap_dir(host)
    # int8 with another environment: another config, so a swap; its boot takes 8 s.
    deploy = swap_in_background(host, *extra_env(int8={"SIM_BOOT_SECONDS": "8"}))
    try:
        swap_dir = wait_for(lambda: (d := newest_swap_dir(host)) != before_dir and d, 300,
                            "the transaction to start")
        wait_for(lambda: host.sh(f"grep -q '\"phase\": \"{kill_at}\"' "
                                 f"{swap_dir}/events.jsonl")[0] == 0, 120,
                 f"the transaction to reach {kill_at}", interval=0.1)
        rc, out = host.sh(f"kill -KILL $(python3 -c 'import json,sys; "
                          f"print(json.load(open(sys.argv[1]))[\"pid\"])' {swap_dir}/pid.json)"
                          f" && test ! -e {swap_dir}/result.json")
        assert rc == 0, f"the host tool was not killed before its result ({kill_at}): {out}"
        out, _ = deploy.communicate(timeout=600)
    finally:
        if deploy.poll() is None:
            os.killpg(deploy.pid, signal.SIGKILL)
            deploy.wait()
    # The deploy says what happened to its transaction (not a silent success).
    assert deploy.returncode != 0, out[-3000:]
    assert "ended without a result (killed?)" in out, out[-3000:]
    # The host ends serving its verified stack (the supervisor recreates it from its snapshot).
    wait_for(lambda: _route_or_none(host, key) == before_route, 240,
             f"{host.name} to serve {before_route} again")
    # The test sees the route from the first new nginx worker while the supervisor's switch may
    # still wait for an old one to stop taking connections (Front._wait_for): one more request
    # may get the old 503 (seen on a loaded machine).
    wait_for(lambda: _chat_or_none(host, key) == 200, 10, f"{host.name} to answer a chat")
    assert status(host)["route"] == before_route
    # The killed transaction got its result and its ledger line (mark_interrupted).
    result = json.loads(sh_ok(host, f"cat {swap_dir}/result.json"))
    assert result["result"] == "interrupted", result
    lines = ledger(host)
    [line] = [ln for ln in lines if ln.get("deploy_id") == Path(swap_dir).name
              and ln.get("result") == "interrupted"]
    assert line["config_hash"] == before_route.split("/")[1], line
    # Nothing on the host still believes the killed transaction runs.
    assert host.sh("test -e /var/lib/rigfleet/lock/holder.json")[0] != 0 or \
        "swap" not in sh_ok(host, "cat /var/lib/rigfleet/lock/holder.json")


# --- 4. the second model revision rolls back onto the first one's files ----------------------


def test_second_model_revision_rolls_back_onto_the_first_revisions_files(fleet, tmp_path):
    host, key = fleet.fleet[0], fleet.api_key
    route = route_of(host, key)
    fixtures = json.loads((STATE / "fixtures.json").read_text())
    first, later = fixtures["model"]["revision"], fixtures["model"]["later_revision"]
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    assert pins["model"]["revision"] == first
    local = pins["model"]["local_dir"]
    first_dir = f"/srv/models/{local}@{first[:12]}"
    later_dir = f"/srv/models/{local}@{later[:12]}"

    def mounts() -> set[str]:
        out = sh_ok(host, "docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' "
                    f"{host.container_of_stack}")
        return set(out.split())

    assert first_dir in mounts()
    sums = sh_ok(host, f"cd {shlex.quote(first_dir)} && find . -type f | sort | xargs sha256sum")
    pins["model"]["revision"] = later
    pins["serial"] = int(pins.get("serial", 0)) + 1
    bumped = tmp_path / "pins-later-model.yaml"
    bumped.write_text(yaml.safe_dump(pins, sort_keys=False))

    proc = swap(host, host.stack, "--data", f"pins_file={bumped}", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "rolled back (gate failed)" in out, out[-3000:]
    line = last_ledger(host)
    assert (line["result"], line["stack"]) == ("rolled-back", "int8"), line
    assert line["model_revision"] == first, line
    # The new revision was downloaded beside, into its own directory ...
    assert host.sh(f"test -d {shlex.quote(later_dir)}")[0] == 0
    # ... and the old stack came back on the first revision's files, unchanged.
    found = mounts()
    assert first_dir in found and later_dir not in found, found
    assert sh_ok(host, f"cd {shlex.quote(first_dir)} && find . -type f | sort | "
                 "xargs sha256sum") == sums
    assert route_of(host, key) == route and chat(host, key) == 200
