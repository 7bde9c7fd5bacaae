"""Issue 22 (items 1-3) on the simulated fleet: lb1 is also the fleet cache (group ``caches``).
After the session's converge every GPU host got the weights from the cache, which fetched them
from the hub once (the cache's nginx log and the twin hub's own request log, not timing), and
its images through the cache's pull-through registry; a corrupted file in the cache is caught
by sha256 and fetched from the hub, and the cache's model server down sends the rig to the hub,
each with a warning naming the cache (the rig's own fetcher, run as the deploy runs it).
Images: one the suite does not pin is seeded into the cache (each blob from the upstream once);
a flipped byte in a cached layer fails Docker's digest check and its registry down sends the
rig's pull (the images role's command) to the hub, each with the warning; a good cache serves
all of it over the LAN.

    RIGFLEET_TESTBED_INSTANCE=2 RIGFLEET_TESTBED_HOSTS=1 RIGFLEET_KEEP_TESTBED=1 \\
        .venv/bin/python -m pytest tests/e2e/test_17_cache.py -x -v
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.request
from collections import Counter

import pytest
import yaml
from e2e_fleet import EXTRAS, STATE, ip_of, upstream_blob_gets
from rigfleet_testbed import layout
from rigfleet_testbed.layout import BalancerSlot

from rigfleet.commands import weights as weights_commands
from rigfleet.fleetcache import MODEL_LOG, REGISTRY_STORAGE, model_path, seed_command, warm_marker
from rigfleet.image_sources import NO_CHECK, ImageSource
from rigfleet.images.plan import WARNING_MARK, SourceResult, WantedImage, cache_steps

pytestmark = pytest.mark.skipif(not EXTRAS, reason="the cache runs on lb1 (the extras)")

MODEL_DIR = "/srv/rigfleet-cache/models"  # host data cache_model_dir's default
MIRROR = f"http://{BalancerSlot(1).name}:8081"
OTHER = "vllm/vllm-openai:v0.24.0"  # an image the registry serves that no test pins
REGISTRY = f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}"


@pytest.fixture(scope="module")
def fleet(testbed, converged):
    yield testbed


def model_pin() -> tuple[str, str]:
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    return pins["model"]["repo"], pins["model"]["revision"]


def sh_ok(host, command: str, timeout: float = 300) -> str:
    rc, out = host.sh(command, timeout=timeout)
    assert rc == 0, f"{host.name}: {command}: {out[-3000:]}"
    return out


def hub_gets(path: str) -> list[str]:
    """Clients the twin hub served ``path`` to in full (its request log: ``[hub] <client>
    GET <path> 200 <bytes>B``), one per download, in order."""
    proc = subprocess.run(["docker", "logs", layout.SERVICES_CONTAINER], capture_output=True,
                          text=True, timeout=60, check=True)
    out = []
    for line in (proc.stdout + proc.stderr).splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "[hub]" and parts[3] == "GET" \
                and parts[4] == path and parts[5] == "200":
            out.append(parts[2])
    return out


def cache_gets(lb, uri: str) -> list[str]:
    """Clients the cache's nginx served ``uri`` to with 200 (its log: time, client, status,
    bytes, method, uri)."""
    out = sh_ok(lb, f"cat {MODEL_LOG}")
    return [p[1] for p in (line.split() for line in out.splitlines())
            if len(p) == 6 and p[2] == "200" and p[4] == "GET" and p[5] == uri]


def largest_file(lb, repo: str, revision: str) -> tuple[str, int]:
    """The cached revision's largest file (name, bytes): what the cache saves most."""
    out = sh_ok(lb, f"cd {shlex.quote(model_path(MODEL_DIR, repo, revision))} && find . -type f "
                    "-not -path '*/.*' -printf '%s %P\\n' | sort -n | tail -n 1")
    size, name = out.split()
    return name, int(size)


def test_the_rigs_got_weights_and_images_from_the_cache_which_fetched_them_once(fleet):
    lb, repo, revision = fleet.balancer, *model_pin()
    name, _ = largest_file(lb, repo, revision)
    rigs = {ip_of(h): h.name for h in fleet.hosts}
    served = set(cache_gets(lb, f"/{repo}/{revision}/{name}"))
    # A cache hit on every GPU host (a second host among them), over the LAN.
    assert set(rigs) <= served, (rigs, served)
    # The internet (the twin hub) gave that file to the cache, not to any rig.
    from_hub = hub_gets(f"/{repo}/resolve/{revision}/{name}")
    assert ip_of(lb) in from_hub and not set(rigs) & set(from_hub), (from_hub, rigs)
    # Images: each rig pulled its pinned image through the cache's registry ...
    host = fleet.fleet[0]
    digests = sh_ok(host, "docker image inspect --format '{{json .RepoDigests}}' "
                          f"$(docker inspect --format '{{{{.Config.Image}}}}' "
                          f"{host.container_of_stack})")
    assert "lb1:5000/vllm/vllm-openai@sha256:" in digests, digests
    # ... which the cache pulled through once, whole, before the rigs (its marker).
    assert sh_ok(lb, "ls /var/lib/rigfleet/cache-warm").split(), "no image came through"


def fetch_on(host, repo: str, revision: str, scratch: str) -> str:
    """The rig's fetcher as the weights role runs it (the cache first, then the hub), into a
    scratch directory; its output."""
    cmd = weights_commands.fetch(repo, revision, scratch, endpoint=layout.HUB_URL,
                                 mirrors=(MIRROR,))
    return sh_ok(host, f"{cmd} 2>&1 && test -f {shlex.quote(scratch)}/.rigfleet-manifest.json")


def test_a_bad_file_in_the_cache_or_the_cache_down_sends_the_rig_to_the_hub(fleet):
    lb, host, (repo, revision) = fleet.balancer, fleet.fleet[0], model_pin()
    name, _ = largest_file(lb, repo, revision)
    cached = f"{model_path(MODEL_DIR, repo, revision)}/{name}"
    kept = f"{model_path(MODEL_DIR, repo, revision)}/.e2e-kept"
    scratch = "/var/tmp/rigfleet-e2e-cache"
    hub_path = f"/{repo}/resolve/{revision}/{name}"
    me = ip_of(host)
    before = hub_gets(hub_path).count(me)
    sh_ok(host, f"rm -rf {scratch}")
    # One byte of the cache's copy flipped (same size, same name): what a bad disk does.
    sh_ok(lb, f"cp -p {shlex.quote(cached)} {kept} && printf X | dd of={shlex.quote(cached)} "
              "bs=1 seek=100 conv=notrunc status=none")
    try:
        out = fetch_on(host, repo, revision, f"{scratch}/bad@{revision[:12]}")
    finally:
        sh_ok(lb, f"mv -f {kept} {shlex.quote(cached)}")
    assert f"WARNING: mirror {MIRROR}: {name}: sha256 " in out, out[-3000:]
    assert "not used, fetched from the hub instead" in out
    assert hub_gets(hub_path).count(me) == before + 1  # that file alone, from the hub
    # The cache's model server down: skipped with a warning, everything from the hub.
    sh_ok(lb, "systemctl stop nginx")
    try:
        out = fetch_on(host, repo, revision, f"{scratch}/down@{revision[:12]}")
    finally:
        sh_ok(lb, "systemctl start nginx")
        sh_ok(host, f"rm -rf {scratch}")
    assert f"WARNING: mirror {MIRROR} cannot be reached" in out, out[-3000:]
    assert hub_gets(hub_path).count(me) == before + 2


def other_image() -> WantedImage:
    """OTHER as pinned: its digest, image id (config) and the blobs of its layers."""
    accept = "application/vnd.docker.distribution.manifest.v2+json"
    req = urllib.request.Request(f"{REGISTRY}/v2/vllm/vllm-openai/manifests/v0.24.0",
                                 headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as answer:
        digest, manifest = answer.headers["Docker-Content-Digest"], json.loads(answer.read())
    return WantedImage(OTHER, digest, manifest["config"]["digest"], ("e2e",)), manifest


def pull_with_fallback(host, want: WantedImage) -> str:
    """The images role's command for a host whose first source is the fleet cache lb1."""
    cache = ImageSource("registry", url=f"http://{BalancerSlot(1).name}:5000", check=NO_CHECK,
                        cache=BalancerSlot(1).name)
    [step] = cache_steps(want, SourceResult(0, cache, True, "not checked"),
                         SourceResult(0, ImageSource("hub"), True, "there"))
    out = sh_ok(host, f"{step.command} 2>&1", timeout=600)
    got = sh_ok(host, f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(OTHER)}")
    assert got.strip() == want.image_id, (got, want.image_id)
    return out


def test_an_image_is_seeded_once_and_a_bad_blob_or_the_cache_down_sends_the_rig_upstream(
        fleet):
    lb, host = fleet.balancer, fleet.fleet[0]
    want, manifest = other_image()
    lb_ip, me = ip_of(lb), ip_of(host)
    t0 = time.time() - 1
    sh_ok(lb, f"rm -f {warm_marker(want.digest)}")
    sh_ok(lb, seed_command(layout.MIRROR_URL, "vllm/vllm-openai", want.digest,
                           warm_marker(want.digest)), timeout=600)
    # Every blob the cache lacked came from the upstream once (the proxy alone: twice).
    from_lb = {d: n for (client, d), n in upstream_blob_gets(t0).items() if client == lb_ip}
    unique = manifest["layers"][-1]["digest"]  # the layer OTHER shares with no pinned image
    assert from_lb and set(from_lb.values()) == {1} and unique in from_lb, from_lb
    assert sh_ok(lb, "systemctl is-active rigfleet-cache-seed || true").strip() == "inactive"
    data = f"{REGISTRY_STORAGE}/docker/registry/v2/blobs/sha256/{unique[7:9]}/{unique[7:]}/data"
    rm_other = f"docker image rm -f {shlex.quote(OTHER)} >/dev/null 2>&1; true"
    # One byte of the cached layer flipped: Docker's digest check fails the pull from the
    # cache, and the rig pulls from its next source (the hub) with a warning.
    sh_ok(host, rm_other)
    sh_ok(lb, f"cp -p {data} {data}.e2e-kept && printf X | dd of={data} bs=1 seek=10 "
              "conv=notrunc status=none")

    def mine() -> Counter[str]:  # blobs the rig got upstream since t0 (logs count seconds)
        return Counter({d: n for (c, d), n in upstream_blob_gets(t0).items() if c == me})

    before = mine()
    try:
        out = pull_with_fallback(host, want)
    finally:
        sh_ok(lb, f"mv -f {data}.e2e-kept {data}")
        sh_ok(host, rm_other)
    warning = f"{WARNING_MARK}{OTHER}: the pull from fleet cache {BalancerSlot(1).name}"
    assert warning in out and "pulling from image_sources[0] (hub) instead" in out, out[-2000:]
    assert mine()[unique] == before[unique] + 1
    # The cache's registry down: the same warning, the hub again.
    sh_ok(lb, "systemctl stop docker-registry")
    try:
        out = pull_with_fallback(host, want)
    finally:
        sh_ok(lb, "systemctl start docker-registry && for i in $(seq 60); do "
                  "curl -fsS -o /dev/null http://127.0.0.1:5000/v2/ && exit 0; sleep 0.5; "
                  "done; exit 1")
        sh_ok(host, rm_other)
    assert warning in out, out[-2000:]
    assert mine()[unique] == before[unique] + 2
    # A good cache: the rig's pull is all from the LAN, nothing from the upstream.
    before = mine()
    try:
        out = pull_with_fallback(host, want)
    finally:
        sh_ok(host, rm_other)
    assert WARNING_MARK not in out and mine() == before, out[-2000:]
