"""The simulated fleet for end-to-end tests.

One testbed per test session, brought up at the start (``rigfleet testbed up``) and taken down
at the end (``RIGFLEET_KEEP_TESTBED=1`` keeps it, and reuses a running one, while iterating):

- ``testbed.fleet``: ``RIGFLEET_TESTBED_HOSTS`` (default 3) dual-3090 Debian 13 hosts logged
  into as root, all on int8 (the inventory's default stack): the bump's, swap's and balancer's
  fleet;
- ``testbed.single`` (unless ``RIGFLEET_TESTBED_EXTRAS=0``): one more host, Debian 12 with the
  Docker CE repository stand-in, administered by a sudo user, one card (the single-card stack
  at 330 W), its front serving TLS with a certificate of the testbed's CA;
- ``testbed.balancer``: lb1, HAProxy in the inventory group ``balancers`` (with the extras);
- ``testbed.hosts``: every GPU host (the fleet, then the single-card host).

Every host is in ``inventory/testbed.py``; a fleet-wide converge converges them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pytest
from tmp_watch import TmpWatch

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
from rigfleet_testbed import layout  # noqa: E402

from rigfleet.balancer.haproxy import parse_stat_csv, show_stat_command  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
import loadgen  # noqa: E402

INVENTORY = layout.INVENTORY
STATE = layout.STATE_DIR
KEEP = os.environ.get("RIGFLEET_KEEP_TESTBED") == "1"
HOSTS = int(os.environ.get("RIGFLEET_TESTBED_HOSTS", "3"))  # the dual-3090 fleet
EXTRAS = os.environ.get("RIGFLEET_TESTBED_EXTRAS", "1") != "0"
SINGLE_STACK = "single-fp8-mtp"


def run(
    cmd: list[str], timeout: float = 1800, check: bool = True, **kw
) -> subprocess.CompletedProcess:
    """Run a command from the repository root, echoing it; output captured as text."""
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        # pyinfra prints the error where it happens and a long results table after it.
        errors = [line for line in (proc.stdout + proc.stderr).splitlines()
                  if any(w in line for w in ("rror", "failed", "Failed", "refused", "Traceback"))]
        raise AssertionError(
            f"{cmd} exited {proc.returncode}\n--- error lines\n" + "\n".join(errors[-60:])
            + f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def wait_for(predicate, timeout: float, what: str, interval: float = 0.3):
    """``predicate()``'s first truthy value within ``timeout`` seconds, else an assertion
    naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# A registry's access log line for a blob it served: client - - [time] "GET /v2/<repo>/blobs/
# <digest> HTTP/1.1" 200 (Docker's registry: the twin's upstream and a fleet cache's).
BLOB_GET = re.compile(r'(?P<client>[0-9.]+) - \S+ \[[^\]]+\] "GET /v2/\S+/blobs/'
                      r'(?P<digest>sha256:[0-9a-f]{64}) [^"]*" 200 ')


def blob_gets(text: str) -> Counter[tuple[str, str]]:
    """(client, digest) -> blobs a registry's access log says it served."""
    return Counter((m["client"], m["digest"]) for m in BLOB_GET.finditer(text))


def upstream_blob_gets(since: float) -> Counter[tuple[str, str]]:
    """Blobs the twin registry (Docker Hub's stand-in) served since ``since``."""
    proc = subprocess.run(["docker", "logs", "--since", str(int(since)),
                           layout.REGISTRY_CONTAINER], capture_output=True, text=True,
                          timeout=60, check=True)
    return blob_gets(proc.stdout + proc.stderr)


def cache_blob_gets(lb, since: float) -> Counter[tuple[str, str]]:
    """Blobs the fleet cache's registry on ``lb`` served since ``since`` (its journal)."""
    rc, out = lb.sh(f"journalctl -u docker-registry -o cat --no-pager --since @{int(since)}",
                    timeout=60)
    assert rc == 0, out
    return blob_gets(out)


def ip_of(host) -> str:
    rc, out = host.sh("hostname -i")
    assert rc == 0, out
    return out.split()[0]


def read_state(host) -> dict:
    """The host's ``/var/lib/rigfleet/state.json`` (what serves, its pins, the last swap)."""
    rc, out = host.sh("cat /var/lib/rigfleet/state.json")
    assert rc == 0, out
    return json.loads(out)


def ledger(host) -> list[dict]:
    """Every record of the host's ledger, oldest first. A line that is not JSON (a torn append:
    test_08 leaves one on host2, as a host that went down mid-write does) is skipped, as
    rigfleet's own reader skips it."""
    rc, out = host.sh("cat /var/lib/rigfleet/ledger.jsonl")
    assert rc == 0, out
    records = []
    for line in out.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            records.append(data)
    return records


def last_ledger(host) -> dict:
    """The newest readable record of the host's ledger."""
    records = ledger(host)
    assert records, f"{host.name}: the ledger has no readable record"
    return records[-1]


@dataclass(frozen=True)
class TestHost:
    __test__ = False  # a host, not a test class (pytest collects Test* names)

    name: str
    ssh_port: int
    front_url: str
    container: str
    user: str = "root"  # "rig" on a host made with --sudo-user (.testbed/hosts/<h>/host.json)
    os: str = "debian13"
    stack: str = "int8"  # what the inventory has it serve
    ca_file: str | None = None  # its front serves TLS with a certificate of this CA

    @property
    def container_of_stack(self) -> str:
        return f"rigfleet-{self.stack}"

    def urlopen(self, req: urllib.request.Request | str, timeout: float = 30):
        """``urllib.request.urlopen`` trusting this host's CA when its front serves TLS."""
        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        return urllib.request.urlopen(req, timeout=timeout, context=context)

    def ssh(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.load_host_keys(str(STATE / "ssh" / "known_hosts"))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect("127.0.0.1", port=self.ssh_port, username=self.user,
                       key_filename=str(STATE / "ssh" / "id_ed25519"),
                       timeout=10, allow_agent=False, look_for_keys=False)
        return client

    def sh(self, command: str, timeout: float = 120) -> tuple[int, str]:
        """Run ``command`` on the host over SSH as root (through ``sudo -n`` for a sudo user);
        (exit status, stdout+stderr)."""
        if self.user != "root":
            command = f"sudo -n sh -c {shlex.quote(command)}"
        client = self.ssh()
        try:
            _, stdout, _ = client.exec_command(command, timeout=timeout, get_pty=False)
            stdout.channel.set_combine_stderr(True)
            out = stdout.read().decode(errors="replace")
            return stdout.channel.recv_exit_status(), out
        finally:
            client.close()

    def reboot(self, timeout: float = 180) -> None:
        """Reboot from inside (as pyinfra's server.reboot does) and wait until it is back.

        A file in /run (tmpfs) marks the old boot: the host is back once SSH answers and the
        marker is gone.
        """
        assert self.sh("touch /run/rigfleet-test-boot && "
                       "systemd-run --on-active=1 --timer-property=AccuracySec=100ms "
                       "systemctl reboot", timeout=20)[0] == 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                # Only a complete answer counts: a shell killed by the shutdown also exits != 0.
                rc, out = self.sh("test -e /run/rigfleet-test-boot && echo old-boot || "
                                  "echo new-boot; systemctl is-system-running --wait", timeout=60)
            except Exception:
                continue  # going down or not up yet
            if rc in (0, 1) and out.startswith("new-boot"):
                return
        raise AssertionError(f"{self.name}: did not reboot and come back within {timeout}s")

    def wait_ssh(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.sh("true", timeout=10)[0] == 0:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: SSH did not come back in {timeout}s")
            time.sleep(1)


@dataclass(frozen=True)
class Testbed:
    hosts: list[TestHost]  # every GPU host: the fleet, then the single-card host
    inventory: Path
    api_key: str
    fleet: list[TestHost] = field(default_factory=list)  # the dual hosts, on int8
    single: TestHost | None = None
    balancer: TestHost | None = None


def _host_meta(name: str) -> dict[str, str]:
    """The login user and OS ``testbed up`` gave a host (root and Debian 13 by default)."""
    try:
        meta = json.loads((STATE / "hosts" / name / "host.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"user": meta.get("ssh_user", "root"), "os": meta.get("os", "debian13")}


def up_args() -> list[str]:
    """``rigfleet testbed up`` arguments of the session's layout (see the module docstring)."""
    args = ["--hosts", str(HOSTS + (1 if EXTRAS else 0))]
    if EXTRAS:
        single = f"host{HOSTS + 1}"
        args += ["--os", f"{single}=debian12", "--sudo-user", single,
                 "--hardware", f"{single}:cards=1", "--tls", single, "--balancer"]
    return args


@pytest.fixture(scope="session")
def testbed() -> Testbed:
    from rigfleet_testbed.layout import BalancerSlot, HostSlot

    run([str(BIN / "rigfleet"), "testbed", "up", *up_args()], timeout=1500)
    fleet = [TestHost(s.name, s.ssh_port, f"http://127.0.0.1:{s.front_port}", s.container,
                      **_host_meta(s.name))
             for s in (HostSlot(i) for i in range(1, HOSTS + 1))]
    single = balancer = None
    if EXTRAS:
        s = HostSlot(HOSTS + 1)
        single = TestHost(s.name, s.ssh_port, f"https://127.0.0.1:{s.front_port}", s.container,
                          **_host_meta(s.name), stack=SINGLE_STACK,
                          ca_file=str(STATE / "secrets" / "tls" / "ca.pem"))
        b = BalancerSlot(1)
        balancer = TestHost(b.name, b.ssh_port, f"http://127.0.0.1:{b.port}", b.container,
                            stack="")
    key = (STATE / "secrets" / "api-key").read_text().strip()
    yield Testbed(fleet + ([single] if single else []), INVENTORY, key, fleet, single, balancer)
    if not KEEP:
        run([str(BIN / "rigfleet"), "testbed", "down"], timeout=600, check=False)


def remove_host(slot) -> None:
    """A slot's container and its Docker volume gone (nothing left when there was none)."""
    for args in (["rm", "-f", slot.container], ["volume", "rm", "-f", slot.docker_volume]):
        subprocess.run(["docker", *args], capture_output=True, timeout=300, check=False)


def fresh_host(testbed, number: int):
    """A fresh bare host in slot ``number`` (outside the session's hosts), made as the session
    makes its own, also when RIGFLEET_KEEP_TESTBED=1 kept the last run's; returns its slot."""
    import docker as docker_sdk
    from rigfleet_testbed import fleet, hostspec

    c = docker_sdk.from_env()
    paths = fleet.Paths()
    spec = hostspec.host_specs(number)[-1]
    paths.hardware(spec.slot.name).parent.mkdir(parents=True, exist_ok=True)
    paths.hardware(spec.slot.name).write_text(fleet.hardware.render(spec.profile))
    remove_host(spec.slot)
    fleet.ensure_host(c, spec, paths, c.containers.get(testbed.hosts[0].container).image.id)
    return spec.slot


PYINFRA = str(BIN / "pyinfra")


def pyinfra(*args: str, check: bool = True, timeout: float = 1800, inventory: Path = INVENTORY):
    """``pyinfra <testbed inventory> deploy.py ARGS`` from the repository root."""
    return run([PYINFRA, str(inventory), "deploy.py", *args], check=check, timeout=timeout)


def dry_plan(inventory: Path = INVENTORY) -> list[dict]:
    """The operations ``--dry --json`` would run, with the hosts each would change."""
    proc = pyinfra("--dry", "--json", inventory=inventory)
    return json.loads(proc.stdout[proc.stdout.index("{"):])["plan"]


@pytest.fixture(scope="session")
def converged(testbed):
    """The testbed converged once per session (bare hosts to serving). On the sudo host
    (host4, with the extras) inotify watches /tmp the whole time (``TMP_WATCH``; test_02 reads
    it), with a canary file first that it must catch."""
    started = time.monotonic()
    sudo = next((h for h in testbed.hosts if h.user != "root"), None)
    if sudo is None:
        proc = pyinfra("-y")
    else:
        with TmpWatch(sudo.container, watched_secrets(testbed.api_key)) as watch:
            rc, out = sudo.sh(f"printf '%s' {CANARY_SECRET} > {CANARY} && chmod 644 {CANARY}")
            assert rc == 0, out
            proc = pyinfra("-y")
        sudo.sh(f"rm -f {CANARY}")
        TMP_WATCH[sudo.name] = watch
    print(f"converge took {time.monotonic() - started:.1f}s")
    return proc


# What the session's converge wrote to the sudo host's /tmp (``converged``).
TMP_WATCH: dict[str, TmpWatch] = {}
CANARY = "/tmp/rigfleet-e2e-watch-canary"
CANARY_SECRET = "canary-0123456789abcdef0123456789abcdef"  # not a secret of the deploy


def watched_secrets(api_key: str) -> list[bytes]:
    """The fleet's API key, a line of each TLS private key the inventory names, and the
    watch's own canary."""
    needles = [api_key.encode(), CANARY_SECRET.encode()]
    for key in sorted((STATE / "secrets" / "tls").glob("host*.key")):
        body = [ln for ln in key.read_text().splitlines() if ln and not ln.startswith("-----")]
        needles += [body[len(body) // 2].encode()] if body else []
    return needles


# --- the fleet endpoint under load (test_05, test_07, test_10) ---------------------------------


def in_rotation(lb: TestHost) -> dict[str, set[str]]:
    rc, out = lb.sh(show_stat_command())
    assert rc == 0, out
    rows = parse_stat_csv(out)
    return {b: {s.host for s in rows if s.backend == b and s.in_rotation}
            for b in {s.backend for s in rows}}


def under_load(lb, key: str, action) -> tuple[loadgen.Report, int]:
    """Run ``action()`` while the load generator asks lb1 for int8 at 1 request/s (streaming
    and not, short and long prompts); (its report, the fewest int8 hosts in rotation seen at
    any check, every 0.5 s)."""
    cfg = loadgen.LoadConfig(lb.front_url, key, rate=1.0, duration_s=600, max_tokens=32,
                             timeout_s=120, path="/stacks/int8/v1/chat/completions")
    stop, fewest = threading.Event(), [99]

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # an SSH hiccup is no sample
                fewest[0] = min(fewest[0], len(in_rotation(lb).get("stack_int8", set())))
            stop.wait(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        report = loadgen.during(cfg, action)
    finally:
        stop.set()
        watcher.join(timeout=30)
    print("\n".join(report.lines()))
    return report, fewest[0]
