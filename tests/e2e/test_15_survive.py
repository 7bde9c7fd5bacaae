"""Issue 19 (items 3, 5, 6) on the simulated fleet: host-side programs that survive their own
faults, the verified image only, and a readiness answer that says little without the key.

Each fault on its own host of the converged fleet (the first and the last; one host runs
both in turn), checked from the host itself over SSH and through its front:

1. the supervisor's state directory full (a 256 KiB tmpfs mounted over it and filled, never
   the machine's disk) as the supervisor restarts: it says why and keeps watching (no
   restart, no crash loop); the space freed, the engine killed: the front answers 200 again
   without a person, and the readiness path meanwhile said only "starting";
2. the stack's local tag moved to another image (``docker tag``), the engine killed: the
   stack comes back on the image id the gate verified, the tag names it again, and the
   ledger line says why;
3. the readiness path without a key, serving and not: ready or not, a class and
   Retry-After; no path, log line or figure.

The hosts end as they were found (the inventory's int8 stack, serving, tmpfs unmounted).

    RIGFLEET_TESTBED_INSTANCE=2 RIGFLEET_TESTBED_HOSTS=2 RIGFLEET_TESTBED_EXTRAS=0 \\
        RIGFLEET_KEEP_TESTBED=1 .venv/bin/python -m pytest tests/e2e/test_15_survive.py -x -v
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest
from e2e_fleet import ledger
from test_04_swap import front, route_of, settle, wait_for

from rigfleet.hostside.front import READY_CLASSES, READY_PATH

SUPERVISE_DIR = "/var/lib/rigfleet/supervise"
ACTIVE = "/var/lib/rigfleet/active/active.json"
ENGINE = "rigfleet-int8"  # the int8 stack's container (catalog: container_name)
OTHER_IMAGE = "vllm/vllm-openai:v0.28.0"  # another image the mirror serves (test_06's)
# What the readiness path must never tell a caller without the key.
TELLS = re.compile(rb"/(var|opt|srv|etc)/|GiB|MiB|\d+\.\d+|log|error|Traceback|exit code")


@pytest.fixture(scope="module")
def fleet(testbed, converged):
    for host in testbed.fleet:
        settle(host, testbed.api_key)
    yield testbed


def sh(host, command: str, timeout: float = 120) -> str:
    rc, out = host.sh(command, timeout=timeout)
    assert rc == 0, f"{host.name}: {command}: {out}"
    return out.strip()


def ready(host) -> tuple[int, dict[str, str], bytes]:
    """``GET /rigfleet/ready`` through the front, without a key."""
    try:
        with host.urlopen(f"{host.front_url}{READY_PATH}", timeout=10) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()
    except OSError:
        return 0, {}, b""


def not_ready_says_little(answer: tuple[int, dict[str, str], bytes]) -> str:
    """The class of a 503 readiness answer, after checking it says nothing more."""
    code, headers, body = answer
    assert code == 503 and int(headers["Retry-After"]) > 0, answer
    data = json.loads(body)
    assert set(data) == {"ready", "class", "retry_after_s"} and data["ready"] is False, data
    assert data["class"] in READY_CLASSES and not TELLS.search(body), body
    return str(data["class"])


def serving_again(host, key: str, started: str) -> bool:
    """The front answers 200 on int8, from a container started after ``started``."""
    code, headers = front(host, key)
    now = host.sh(f"docker inspect -f '{{{{.State.StartedAt}}}}' {ENGINE}")[1].strip()
    return code == 200 and str(route_of(host, key)).startswith("int8/") and now != started


def window_class(host) -> str | None:
    """The class the readiness path says while the front is at 503, else None."""
    answer = ready(host)
    return not_ready_says_little(answer) if answer[0] == 503 else None


def test_a_full_state_dir_then_freed_then_a_dead_engine_serves_again_unattended(fleet):
    host, key = fleet.fleet[0], fleet.api_key
    started = sh(host, f"docker inspect -f '{{{{.State.StartedAt}}}}' {ENGINE}")
    sh(host, f"mount -t tmpfs -o size=256k,mode=0755 rigfleet-e2e-full {SUPERVISE_DIR} && "
       f"(dd if=/dev/zero of={SUPERVISE_DIR}/fill bs=4k 2>/dev/null; true) && "
       "systemctl restart rigfleet-supervise")
    try:
        invocation = sh(host, "systemctl show -p InvocationID --value rigfleet-supervise")
        journal = f"journalctl -o cat --no-pager _SYSTEMD_INVOCATION_ID={invocation}"
        said = wait_for(lambda: "No space left on device" in host.sh(journal)[1]
                        and host.sh(journal)[1], 60, "the supervisor to say the disk is full")
        assert "watching on" in said and "Traceback" not in said, said
        props = sh(host, "systemctl show -p NRestarts -p ActiveState rigfleet-supervise")
        assert props.splitlines() == ["NRestarts=0", "ActiveState=active"], props
        assert host.sh(f"test -e {SUPERVISE_DIR}/state.json")[0] != 0  # nothing half-written

        sh(host, f"rm -f {SUPERVISE_DIR}/fill")                       # the space freed
        count = len(ledger(host))
        sh(host, f"docker kill {ENGINE}")
        # (A 503 before the supervisor's window says "down": the engine does not answer.)
        wait_for(lambda: window_class(host) == "starting", 60, "the supervisor's 503 window")
        wait_for(lambda: serving_again(host, key, started), 300, "int8 to serve again")
        recreated = [x for x in ledger(host)[count:]
                     if (x.get("event"), x.get("result")) == ("supervise", "recreated")]
        assert recreated and "engine died" in recreated[-1]["reason"], ledger(host)[count:]
        # The records are written again, by the same process (never restarted).
        wait_for(lambda: host.sh(f"test -s {SUPERVISE_DIR}/state.json")[0] == 0, 30,
                 "state.json written once there is room")
        assert sh(host, "systemctl show -p NRestarts --value rigfleet-supervise") == "0"
    finally:
        host.sh(f"systemctl stop rigfleet-supervise; umount {SUPERVISE_DIR}; "
                "systemctl start rigfleet-supervise")


def test_a_moved_tag_comes_back_on_the_verified_image(fleet):
    host, key = fleet.fleet[-1], fleet.api_key
    verified = wait_for(lambda: json.loads(sh(host, f"cat {ACTIVE}"))["ref"].get("image_id"),
                        60, "the active record's verified image id")
    tag = sh(host, f"docker inspect -f '{{{{.Config.Image}}}}' {ENGINE}")
    assert sh(host, f"docker inspect -f '{{{{.Image}}}}' {ENGINE}") == verified
    started = sh(host, f"docker inspect -f '{{{{.State.StartedAt}}}}' {ENGINE}")
    sh(host, f"docker pull -q {OTHER_IMAGE} && docker tag {OTHER_IMAGE} {tag}", timeout=300)
    try:
        assert sh(host, f"docker image inspect -f '{{{{.Id}}}}' {tag}") != verified
        count = len(ledger(host))
        sh(host, f"docker kill {ENGINE}")
        wait_for(lambda: window_class(host) == "starting", 60, "the supervisor's 503 window")
        wait_for(lambda: serving_again(host, key, started), 300, "int8 to serve again")
        assert sh(host, f"docker inspect -f '{{{{.Image}}}}' {ENGINE}") == verified
        assert sh(host, f"docker image inspect -f '{{{{.Id}}}}' {tag}") == verified
        recreated = [x for x in ledger(host)[count:]
                     if (x.get("event"), x.get("result")) == ("supervise", "recreated")]
        assert recreated, ledger(host)[count:]
        assert f"the tag {tag} named" in recreated[-1]["reason"]
        assert "moved it back to the verified image" in recreated[-1]["image"]
    finally:
        host.sh(f"docker image inspect -f '{{{{.Id}}}}' {tag} | grep -qx {verified} || "
                f"docker tag {verified} {tag}; docker rmi -f {OTHER_IMAGE}")


def test_the_ready_path_without_a_key_says_ready_or_a_class(fleet):
    for host in fleet.fleet:
        code, headers, body = ready(host)
        assert code == 200 and body == b"" and headers["X-Rigfleet-Route"].startswith("int8/")
    host = fleet.fleet[0]
    # The front to 503 as the host goes down (the stack unit's stop), then back (its start).
    sh(host, "systemctl stop rigfleet-stack")
    try:
        assert not_ready_says_little(ready(host)) == "down"
    finally:
        sh(host, "systemctl start rigfleet-stack", timeout=600)
    wait_for(lambda: ready(host)[0] == 200, 300, "the front to be ready again")
