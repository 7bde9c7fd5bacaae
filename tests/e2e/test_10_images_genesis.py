"""Issue 9 on the simulated fleet: images no registry keeps, Genesis v7 on a branch-only
commit, the Marlin boot failure, a retired switch, and the supervisor with the network cut.

Two fleet hosts, each from the session's converged state (int8 on the default pins). Three
converges in all, each shared by the tests of one step:

1. refused before any host changes (one run): host B pinned to the purged nightly
   ``nightly-01d4d1ad...`` (0.20.2rc1.dev9), on tq3-mtp-genesis with the Genesis v7.72.2 pin
   (the fixture's commit on branch ``dev``, whose allowlist names dev9), no source holding it:
   the preflight names the image and each source tried; host A on the default pins with
   ``extra_env`` turning on P64, which Genesis v12.1.0 retired: the host's Genesis gate names
   the switch and the version. ``rigfleet pins lock`` refuses the nightly on its own, with
   what to do.
2. ``rigfleet images import <archive> --into DIR`` (the copy the testbed keeps in
   ``.testbed-<n>/archives/``, DIR an ``archive`` image source), then one run: host B serves
   that nightly (its id is the pinned image id; Genesis v7 mounted as ``vllm/_genesis`` and
   applied with ``apply_all``); host A swaps to a user's copy of tq3-mtp-genesis without P87
   on the same image, which dies at boot with vLLM's Marlin error and is rolled back.
3. on host B, with its outbound traffic cut (iptables on the host): the engine killed, the
   supervisor recreates the stack from the derived image (no package install, no network);
   then a weight shard gone, the engine killed again: the recreation dies at boot, and the
   supervisor gives up at its limit (2 within 10 min, shortened by host data), front at 503
   with the reason.

Finally both hosts converge on the generated inventory again (int8, default pins, default
supervisor policy). The module works on copies (inventory, pins, stacks dir, archive dir)
under ``.testbed-<n>/``, removed at the end.

    RIGFLEET_TESTBED_INSTANCE=7 RIGFLEET_TESTBED_HOSTS=2 RIGFLEET_TESTBED_EXTRAS=0 \\
        RIGFLEET_KEEP_TESTBED=1 .venv/bin/python -m pytest tests/e2e/test_10_images_genesis.py -x
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from e2e_fleet import INVENTORY, STATE, ledger, run, under_load, wait_for
from rigfleet_testbed import layout
from test_04_swap import chat  # one chat completion through the front: its status

from rigfleet.catalog import BUILTIN_DIR
from rigfleet.hostside.front import ROUTE_HEADER
from rigfleet.images.archive import inspect_archive

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
RIGFLEET = str(Path(sys.executable).with_name("rigfleet"))
TOOL = "python3 /usr/local/lib/rigfleet/rigfleet-host.pyz"
TQ3 = "tq3-mtp-genesis"
NOP87 = "tq3-mtp-genesis-nop87"
NIGHTLY = "vllm/vllm-openai:nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
DEV9 = "0.20.2rc1.dev9+g01d4d1ad3"
ARCHIVE = STATE / "archives" / f"{NIGHTLY.split(':')[1]}.tar"
P64 = "GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING"
# The copies this module deploys with (the generated inventory and pins stay as they are).
TEN_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-images.py")
TEN_PINS = STATE / "images-pins.yaml"
LOCK_PINS = STATE / "images-lock-pins.yaml"
TEN_STACKS = STATE / "images-stacks"
TEN_ARCHIVES = STATE / "images-archive"
# The digest the operator's pins recorded while Docker Hub still had the tag. The twin never
# served this build (vllm_builds: purged before the testbed's "today"), so no registry knows a
# digest for it; any well-formed one stands for it, and the mirror 404s it as Docker Hub does a
# purged manifest (by tag and by digest: docs/architecture.md, "Retention").
PURGED_DIGEST = "sha256:" + hashlib.sha256(f"{NIGHTLY} (purged)".encode()).hexdigest()
# This module does not judge throughput (test_09 does): on the shared 2-core CI machine a
# shape's CV over the fast profile's 5 short runs crosses 10% now and then, which would roll
# back a swap this module needs.
NOISY_CV = "throughput_cv_max=0.5"
# The supervisor's policy on host B: a real rig's 10/30/90 s, 3 in 30 min is too slow here.
POLICY = {"supervise_backoff_s": [1], "supervise_limit": 2, "supervise_window_s": 600}

# --- helpers -----------------------------------------------------------------------------------


def deploy(inventory: Path, *hosts, data: tuple[str, ...] = ()):
    """One converge of ``hosts`` (never fails the test itself: each test reads the outcome)."""
    limits = [arg for h in hosts for arg in ("--limit", h.name)]
    return run([PYINFRA, str(inventory), "deploy.py", "-y", *limits, *data], check=False,
               timeout=1200)


def sh(host, command: str, timeout: float = 120) -> str:
    rc, out = host.sh(command, timeout=timeout)
    assert rc == 0, f"{host.name}: {command}: exit {rc}: {out[-2000:]}"
    return out


def snapshot(host) -> dict[str, str]:
    """What a refused deploy must not change on a host."""
    probes = {
        "state": "cat /var/lib/rigfleet/state.json",
        "ledger": "wc -l < /var/lib/rigfleet/ledger.jsonl",
        "route": "cat /etc/nginx/rigfleet/route.conf",
        "containers": "docker ps -a --no-trunc --format '{{.Names}} {{.ID}} {{.Status}}' | "
                      "sed 's/ Up .*/ Up/' | sort",
        "images": "docker image ls --no-trunc --format '{{.Repository}}:{{.Tag}} {{.ID}}' | sort",
        "genesis": "git -C /opt/rigfleet/genesis rev-parse HEAD",
        "files": "sha256sum /opt/rigfleet/stacks/*/compose.yaml "
                 "/etc/systemd/system/rigfleet-*.service",
    }
    return {k: sh(host, v) for k, v in probes.items()}


def front(host, key: str, path: str = "/v1/models") -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(f"{host.front_url}{path}",
                                 headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers.items()), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read().decode(errors="replace")


def inspect(host, ref: str) -> dict:
    return json.loads(sh(host, f"docker inspect {ref}"))[0]


def v7_pin() -> dict[str, str]:
    """The fixture's Genesis v7.72.2 (``release(v7.72.2)``, reachable from ``dev`` only)."""
    genesis = json.loads((STATE / "fixtures.json").read_text())["genesis"]
    [c] = [c for c in genesis["commits"] if c["title"].startswith("release(v7.72.2)")]
    assert c["layout"] == "v7" and c["branch"] == "dev" and not c["tag"]
    assert DEV9 in c["allowlist"]
    return {"repo": layout.GENESIS_URL, "commit": c["sha"], "layout": "v7", "version": "v7.72.2"}


def write_copies(image_id: str) -> None:
    """The pins (tq3 and its P87-less copy on the nightly with Genesis v7, as an operator locked
    them while the tag existed), a pins file ``pins lock`` must refuse, the user's stack file."""
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    nightly = {"image": NIGHTLY, "digest": PURGED_DIGEST, "image_id": image_id,
               "vllm_version": DEV9, "genesis": v7_pin()}
    lock = json.loads(json.dumps(pins))
    lock["stacks"][TQ3] = {**nightly, "digest": "unresolved"}
    del lock["stacks"][TQ3]["image_id"]
    LOCK_PINS.write_text(yaml.safe_dump(lock, sort_keys=False))
    pins["stacks"][TQ3] = nightly
    pins["stacks"][NOP87] = dict(nightly)
    TEN_PINS.write_text(yaml.safe_dump(pins, sort_keys=False))
    doc = yaml.safe_load((BUILTIN_DIR / f"{TQ3}.yaml").read_text())
    on = doc["genesis"]["switches"]["v7"]["on"]
    assert "P87" in on
    on.remove("P87")
    doc.update(name=NOP87, port=8016, summary="tq3-mtp-genesis without Genesis P87")
    TEN_STACKS.mkdir(exist_ok=True)
    (TEN_STACKS / f"{NOP87}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def write_inventory(per_host: dict[str, dict]) -> None:
    """The generated inventory with ``per_host`` data on top of each host's own."""
    TEN_INVENTORY.write_text(
        f'''"""Testbed {layout.INSTANCE} for tests/e2e/test_10_images_genesis.py."""
import json
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
_extra = json.loads({json.dumps(per_host)!r})
gpu_hosts = ([(n, {{**d, **_extra.get(n, {{}})}}) for n, d in _hosts], _data)
''')


def on_nightly(stack: str, **more) -> dict:
    """Host data serving ``stack`` from the copies, the archive dir after the hub."""
    return {"pins_file": str(TEN_PINS), "stacks_dir": str(TEN_STACKS), "stack": stack,
            "stacks": ["int8", TQ3, NOP87],
            "image_sources": [{"kind": "hub"}, {"kind": "archive", "path": str(TEN_ARCHIVES)}],
            "gate_set": [NOISY_CV], **more}


# --- the fleet ---------------------------------------------------------------------------------


class Fleet:
    """Hosts A and B, the API key, and the outcome of each step's converge."""

    def __init__(self, testbed) -> None:
        self.testbed, self.a, self.b = testbed, testbed.fleet[0], testbed.fleet[1]
        self.key = testbed.api_key
        self.image_id = inspect_archive(ARCHIVE).images[0].image_id
        self.restored = False
        self.refused = self.served = None
        self.before: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module")
def fleet(testbed, converged):
    if len(testbed.fleet) < 2:
        pytest.skip("needs two fleet hosts: RIGFLEET_TESTBED_HOSTS=2 or more")
    # `rigfleet testbed up` (the session's first step, after collection) keeps this copy.
    assert ARCHIVE.exists(), f"{ARCHIVE} is missing: `rigfleet testbed up` should have kept it"
    f = Fleet(testbed)
    shutil.rmtree(TEN_ARCHIVES, ignore_errors=True)
    TEN_ARCHIVES.mkdir()
    write_copies(f.image_id)
    for host in (f.a, f.b):
        forget_copies(host)
    yield f
    for host in (f.a, f.b):
        undo_faults(host)
    if not f.restored:
        deploy(INVENTORY, f.a, f.b)
    for host in (f.a, f.b):
        forget_copies(host)
    for path in (TEN_INVENTORY, TEN_PINS, LOCK_PINS):
        path.unlink(missing_ok=True)
    shutil.rmtree(TEN_STACKS, ignore_errors=True)
    shutil.rmtree(TEN_ARCHIVES, ignore_errors=True)


# --- 1. refused before any host changes ----------------------------------------------------------


def test_pins_lock_refuses_the_purged_nightly_saying_what_to_do(fleet):
    before = LOCK_PINS.read_text()
    proc = run([RIGFLEET, "pins", "lock", "--pins", str(LOCK_PINS),
                "--registry", f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}",
                "--hub", f"http://127.0.0.1:{layout.HUB_LOCAL_PORT}",
                "--genesis-url", f"http://127.0.0.1:{layout.GIT_LOCAL_PORT}/sndr_core_engine.git"],
               check=False, timeout=120)
    err = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, err
    assert (f"stacks.{TQ3}.image: {NIGHTLY} is not in http://127.0.0.1:"
            f"{layout.REGISTRY_LOCAL_PORT} (vLLM keeps only the 14 newest nightly-* tags") in err
    assert "import a saved copy (`rigfleet images import FILE`) and pin its digest and image id" \
        in err
    assert LOCK_PINS.read_text() == before  # nothing written


@pytest.fixture(scope="module")
def refused(fleet):
    """Step 1's converge: B on the purged nightly, A with P64 on (both refused)."""
    if fleet.refused is None:
        write_inventory({fleet.a.name: {"extra_env": {TQ3: {P64: "1"}}},
                         fleet.b.name: on_nightly(TQ3, **POLICY)})
        fleet.before = {h.name: snapshot(h) for h in (fleet.a, fleet.b)}
        fleet.refused = deploy(TEN_INVENTORY, fleet.a, fleet.b)
    return fleet


def test_a_nightly_no_source_has_is_refused_naming_each_source(refused):
    f, b = refused, refused.b.name
    out = " ".join((f.refused.stdout + f.refused.stderr).split())
    assert f.refused.returncode != 0
    assert (f"{b}: image_sources: {NIGHTLY} (stacks {TQ3}, {NOP87}) is not on the host and no "
            f"source can provide it (digest {PURGED_DIGEST}, image id {f.image_id})") in out, \
        out[-4000:]
    assert (f"{b}: image_sources[0] (hub): vllm/vllm-openai@{PURGED_DIGEST} is not there at "
            f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT} (HTTP 404") in out
    assert "vLLM keeps only the 14 newest nightly-* tags" in out
    assert f"{b}: image_sources[1] (archive {TEN_ARCHIVES}" in out
    assert f"{TEN_ARCHIVES} on this machine holds no *.tar archive" in out
    assert snapshot(f.b) == f.before[b]


def test_an_enabled_retired_switch_is_refused_naming_it_and_the_genesis_version(refused):
    f, a = refused, refused.a.name
    out = " ".join((f.refused.stdout + f.refused.stderr).split())
    assert (f"{a}: stack {TQ3}: {P64}=1: patch P64 is retired in Genesis v12.1.0") in out, \
        out[-4000:]
    assert f"remove it from host data extra_env.{TQ3} (or set it to 0)" in out
    assert snapshot(f.a) == f.before[a]
    assert chat(f.a, f.key) == 200


# --- 2. the saved copy imported: served by image id on Genesis v7; P87 missing dies -------------


@pytest.fixture(scope="module")
def served(refused):
    """Step 2: the archive kept as a source, then A to the P87-less stack, B to tq3."""
    f = refused
    if f.served is None:
        proc = run([RIGFLEET, "images", "import", str(ARCHIVE), "--into", str(TEN_ARCHIVES),
                    "--digest", PURGED_DIGEST, "--json"], timeout=300)
        f.imported = json.loads(proc.stdout)
        write_inventory({f.a.name: on_nightly(NOP87), f.b.name: on_nightly(TQ3, **POLICY)})
        f.served = deploy(TEN_INVENTORY, f.a, f.b)
    return f


def test_after_images_import_the_same_deploy_serves_it_verified_by_image_id(served):
    f, b = served, served.b
    assert f.imported["pin"] == {"image": NIGHTLY, "digest": PURGED_DIGEST,
                                 "image_id": f.image_id}
    kept = Path(f.imported["into"])
    assert kept.parent == TEN_ARCHIVES and kept.stat().st_size == ARCHIVE.stat().st_size
    out = f.served.stdout + f.served.stderr
    assert f"[{b.name}] swap promote:" in out, out[-4000:]
    # The pinned name on the host is the loaded copy: the pinned image id, no repo digest.
    staged = inspect(b, NIGHTLY)
    assert staged["Id"] == f.image_id and staged["RepoDigests"] == []
    # The stack runs the image derived from it (Genesis' packages baked in): built on exactly
    # those layers, labelled with the pinned digest.
    container = inspect(b, f"rigfleet-{TQ3}")
    runtime = inspect(b, container["Image"])
    layers = staged["RootFS"]["Layers"]
    assert runtime["RootFS"]["Layers"][:len(layers)] == layers
    assert runtime["Config"]["Labels"]["io.rigfleet.base-digest"] == PURGED_DIGEST
    line = ledger(b)[-1]
    assert (line["result"], line["stack"], line["image"], line["vllm_version"]) == (
        "promoted", TQ3, NIGHTLY, DEV9)
    assert front(b, f.key)[1].get(ROUTE_HEADER, "").startswith(f"{TQ3}/")
    assert chat(b, f.key) == 200


def test_a_v7_pin_is_checked_out_from_its_branch_mounted_and_applied_the_v7_way(served):
    b, pin = served.b, v7_pin()
    assert sh(b, "git -C /opt/rigfleet/genesis rev-parse HEAD").strip() == pin["commit"]
    container = inspect(b, f"rigfleet-{TQ3}")
    mounts = {m["Destination"]: m["Source"] for m in container["Mounts"]}
    target = "/usr/local/lib/python3.12/dist-packages/vllm/_genesis"
    assert mounts[target] == f"/opt/rigfleet/genesis-trees/{pin['commit']}/vllm/_genesis"
    assert "/opt/genesis" not in mounts  # where a v12 tree goes
    script = " ".join(container["Config"]["Entrypoint"] + container["Config"]["Cmd"])
    assert "python3 -m vllm._genesis.patches.apply_all" in script and "sndr" not in script
    logs = sh(b, f"docker logs rigfleet-{TQ3} 2>&1")
    assert "[Genesis] apply_all " in logs and "sndr.apply" not in logs
    assert re.search(r"^\[Genesis\] P87 +\[ON\]", logs, re.M) and ", 0 failed" in logs
    assert ledger(b)[-1]["genesis_commit"] == pin["commit"]


def test_tq3_without_p87_on_a_pre_marlin_fix_image_dies_at_boot_and_is_rolled_back(served):
    f, a = served, served.a
    out = " ".join((f.served.stdout + f.served.stderr).split())
    assert f"{a.name}: swap to {NOP87} rolled back (boot failed)" in out, out[-4000:]
    assert "GPTQ_MARLIN_MIN_THREAD_N (64) > out_features" in out
    assert "Boot failure: the Marlin pad-sub-tile-n fix is missing" in out
    line = ledger(a)[-1]
    assert (line["event"], line["result"], line["stack"]) == ("swap", "rolled-back", "int8")
    assert line["attempted"]["stack"] == NOP87
    assert line["boot_failure"]["kind"] == "marlin-min-thread-n"
    log = sh(a, f"cat {line['kept_log']}")
    assert "MarlinLinearKernel cannot implement due to: GPTQ_MARLIN_MIN_THREAD_N (64) > " \
        "out_features" in log
    assert re.search(r"^\[Genesis\] P67 +\[ON\]", log, re.M)  # Genesis applied ...
    assert not re.search(r"^\[Genesis\] P87 +\[ON\]", log, re.M)  # ... without P87
    assert front(a, f.key)[1].get(ROUTE_HEADER, "").startswith("int8/")
    assert chat(a, f.key) == 200


# --- 3. the supervisor, with the host's outbound network cut -------------------------------------

CUT = ("for chain in OUTPUT FORWARD; do iptables -I $chain 1 -o eth0 -m conntrack --ctstate NEW "
       "-m comment --comment rigfleet-e2e-cut -j DROP; done")
UNCUT = ("for chain in OUTPUT FORWARD; do while iptables -D $chain -o eth0 -m conntrack --ctstate "
         "NEW -m comment --comment rigfleet-e2e-cut -j DROP 2>/dev/null; do :; done; done")


def shard_of(host, container: str) -> str:
    """The host path of the model's last weight shard, as the stack mounts it."""
    mounts = inspect(host, container)["Mounts"]
    [weights] = [m["Source"] for m in mounts if m["Source"].startswith("/srv/models/")]
    return sh(host, f"ls -1 {weights}/model-*.safetensors | tail -n 1").strip()


def undo_faults(host) -> None:
    """The network back, a shard put aside back (safe to run when neither was done)."""
    host.sh(UNCUT)
    host.sh("for f in /srv/models/*/*/*.e2e-aside /srv/models/*/*.e2e-aside; do "
            "[ -e \"$f\" ] && mv \"$f\" \"${f%.e2e-aside}\"; done; true")


def forget_copies(host) -> None:
    """The nightly, the images derived from it and the user stack's directory off the host (an
    earlier run's, or this one's at the end): the converge back leaves staged images and the
    directories of stacks it no longer lists in place."""
    host.sh(f"ids=$(docker image ls -q --filter label=io.rigfleet.base-digest={PURGED_DIGEST}); "
            f"docker image rm -f $ids {NIGHTLY} >/dev/null 2>&1; "
            f"rm -rf /opt/rigfleet/stacks/{NOP87}; true")


def kill_engine(host, container: str) -> str:
    """SIGKILL the engine (the container's main process) from the host; its container id."""
    st = inspect(host, container)
    assert st["State"]["Running"], st["State"]
    sh(host, f"kill -KILL {st['State']['Pid']}")
    return st["Id"]


def supervise_lines(host, since: int) -> list[dict]:
    return [line for line in ledger(host)[since:] if line.get("event") == "supervise"]


def test_the_supervisor_recreates_a_killed_engine_offline_and_gives_up_on_a_crash_loop(served):
    f, b = served, served.b
    ctr = f"rigfleet-{TQ3}"
    assert chat(b, f.key) == 200
    start = len(ledger(b))
    shard = shard_of(b, ctr)
    try:
        sh(b, CUT)
        # Cut: nothing the stack could fetch at start is reachable (PyPI, registry, hub, git).
        for url in (layout.PYPI_URL, f"{layout.MIRROR_URL}/v2/", f"{layout.HUB_URL}/api/models",
                    f"{layout.GIT_BASE_URL}/sndr_core_engine.git/info/refs"):
            rc, out = b.sh(f"curl -sS -m 3 -o /dev/null {url}")
            assert rc != 0, f"{url} is still reachable from {b.name}: {out}"
        rc, out = b.sh(f"docker exec {ctr} python3 -c \"import urllib.request; "
                       f"urllib.request.urlopen('{layout.PYPI_URL}', timeout=3)\"")
        assert rc != 0, f"the stack's container still reaches {layout.PYPI_URL}: {out}"

        old = kill_engine(b, ctr)
        line = wait_for(lambda: next(iter(supervise_lines(b, start)), None), 120,
                        "the supervisor to recreate the killed engine")
        assert line["result"] == "recreated", line
        assert line["reason"].startswith("recreated after the engine died: its container "
                                         "exited (exit code 137)"), line
        assert (line["stack"], line["attempt"], line["limit"]) == (TQ3, 1, 2)
        now = inspect(b, ctr)
        assert now["Id"] != old and now["RestartCount"] == 0  # a fresh container
        assert chat(b, f.key) == 200
        assert front(b, f.key)[1].get(ROUTE_HEADER, "").startswith(f"{TQ3}/")

        # Every start dies now: the last weight shard is gone.
        sh(b, f"mv {shard} {shard}.e2e-aside")
        kill_engine(b, ctr)
        gave_up = wait_for(lambda: next((x for x in supervise_lines(b, start)
                                         if x["result"] == "gave-up"), None), 180,
                           "the supervisor to give up")
    finally:
        undo_faults(b)
    lines = supervise_lines(b, start)
    assert [x["result"] for x in lines] == ["recreated", "failed", "gave-up"], lines
    assert "FileNotFoundError: [Errno 2] No such file or directory" in lines[1]["reason"]
    reason = gave_up["reason"]
    assert reason.startswith(f"crash loop: {TQ3} died again (its container exited (exit code 1)")
    assert "FileNotFoundError" in reason and "gave up after 2 recreations in " in reason
    assert gave_up["stack"] is None and gave_up["recreations"] == 2
    code, headers, body = front(b, f.key)
    assert code == 503 and headers.get("Retry-After") and "crash loop" in body
    assert "gave-up: crash loop" in sh(b, f"{TOOL} status")
    time.sleep(7)  # a poll later: nothing more happens (no loop)
    assert supervise_lines(b, start) == lines


# --- back to the inventory's stacks and the default pins -----------------------------------------


def test_the_fleet_converges_back_on_its_inventory_stacks_and_default_pins(served):
    """Behind lb1 (with the extras) under the load generator: while A and B come back to
    int8 (both at once: the converge's cap for three int8 hosts is two), the third int8 host
    serves every request; none fails, none is cut."""
    f = served
    # A third int8 host to serve meanwhile (A and B serve other stacks until now).
    lb = f.testbed.balancer if len(f.testbed.fleet) >= 3 else None
    box: dict = {}
    if lb is None:
        box["p"] = deploy(INVENTORY, f.a, f.b)
    else:
        report, fewest = under_load(lb, f.key, lambda: box.setdefault(
            "p", deploy(INVENTORY, f.a, f.b)))
    proc = box["p"]
    f.restored = True
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    if lb is not None:
        assert fewest >= 1, fewest
        assert report.sent >= 10 and report.answered == report.sent
        assert report.failed == {}, report.failed
        assert report.cut == 0, report.cut_reasons
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())["stacks"]["int8"]
    for host in (f.a, f.b):
        state = json.loads(sh(host, "cat /var/lib/rigfleet/state.json"))
        assert (state["stack"], state["digest"]) == ("int8", pins["digest"])
        assert chat(host, f.key) == 200
    unit = sh(f.b, "cat /etc/systemd/system/rigfleet-supervise.service")
    assert "--backoff-s 10,30,90 --limit 3 --window-s 1800" in unit
