"""Print how many bytes crossed "the internet" for a fresh fleet (issue 22).

    python benchmarks/fleet_fetch.py --hosts 3            # the testbed as it is (up if needed)
    python benchmarks/fleet_fetch.py --hosts 3 --fresh    # testbed down first: bare hosts
    python benchmarks/fleet_fetch.py --since 1796450000   # figures of a converge already run
    python benchmarks/fleet_fetch.py --hosts 3 --fresh --no-cache   # no lb1: peers serve

Brings up N dual-3090 testbed hosts and lb1 (balancer, monitor and fleet cache), converges
them once, and reads what each source served during that converge from its own log: the twin
hub's request log (``[hub] <client> GET <path> <status> <bytes>B``) and the twin registry's
access log (the upstreams: they stand for huggingface.co and Docker Hub), and the cache's
nginx log and its registry's access log (the LAN). One host's need is the pinned model
revision's files (the hub's listing) plus the compressed layers of the fleet's pinned images
(the registry's manifests; a layer images share counted once). The last line is
``wan ratio R``: upstream bytes / one host's need (1.0: each byte crossed the internet once).
With ``--no-cache`` there is no lb1: the first host
fetches upstream and serves its peers (their LAN bytes: each host's peer server's journal).
Set RIGFLEET_TESTBED_INSTANCE for another testbed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import yaml

from rigfleet.fleetcache import PEER_UNIT
from rigfleet.registry import MANIFEST_TYPES

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HUB_LINE = re.compile(r"\[hub\] (?P<client>\S+) (?P<method>GET|HEAD) (?P<path>\S+) "
                      r"(?P<status>\d{3}) (?P<bytes>\d+)B")
# Docker's registry (gorilla's combined log format): client - - [time] "GET /v2/... HTTP/1.1"
# status bytes ...
ACCESS_LINE = re.compile(r'^(?:.*?\s)?(?P<client>[0-9a-fA-F.:]+) - \S+ \[[^\]]+\] '
                         r'"(?P<method>[A-Z]+) (?P<path>\S+) [^"]*" (?P<status>\d{3}) '
                         r'(?P<bytes>\d+|-)')
# What the rigs' warnings about the cache say (files/rigfleet-fetch-weights.py, images.plan).
WARNED = ("cannot be reached", "fetched from the hub instead", "the pull from fleet cache",
          "the load from peer", "its server did not start")
NGINX_FIELDS = 6  # roles/cache: time, client, status, bytes, method, uri


def hub_bytes(lines: Iterable[str]) -> tuple[int, int]:
    """(bytes, requests) the twin hub served (every GET: files, listings)."""
    total = n = 0
    for line in lines:
        m = HUB_LINE.search(line)
        if m and m["method"] == "GET" and m["status"] in ("200", "206"):
            total, n = total + int(m["bytes"]), n + 1
    return total, n


def access_bytes(lines: Iterable[str], skip_clients: tuple[str, ...] = ()) -> tuple[int, int]:
    """(bytes, requests) a registry's access log says it sent (GETs with a body)."""
    total = n = 0
    for line in lines:
        m = ACCESS_LINE.search(line)
        if (m and m["method"] == "GET" and m["status"] in ("200", "206")
                and m["bytes"] != "-" and m["client"] not in skip_clients):
            total, n = total + int(m["bytes"]), n + 1
    return total, n


def nginx_bytes(lines: Iterable[str]) -> tuple[int, int, Counter[str]]:
    """(bytes, files, files per client) the cache's model server sent."""
    total = n = 0
    clients: Counter[str] = Counter()
    for line in lines:
        p = line.split()
        if len(p) == NGINX_FIELDS and p[2] in ("200", "206") and p[4] == "GET" and p[3].isdigit():
            total, n = total + int(p[3]), n + 1
            clients[p[1]] += 1
    return total, n, clients


def wan_ratio(upstream: int, need: int) -> float:
    return upstream / need if need else float("inf")


def _out(cmd: list[str], timeout: float = 120) -> list[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-2000:]}")
    return (proc.stdout + proc.stderr).splitlines()


def peer_bytes(lines: Iterable[str]) -> tuple[int, int]:
    """(bytes, requests) the peer servers sent (``<client> <status> <bytes> GET <path>``)."""
    total = n = 0
    for line in lines:
        p = line.split()
        if len(p) == 5 and p[1] == "200" and p[2].isdigit() and p[3] == "GET":
            total, n = total + int(p[2]), n + 1
    return total, n


class Logs:
    """Every source's log lines since a moment, read from the testbed's containers."""

    def __init__(self, layout, hosts: int, cache: bool) -> None:
        from rigfleet_testbed.layout import BalancerSlot, HostSlot

        self.layout, self.cache = layout, cache
        self.lb = BalancerSlot(1).container
        self.rigs = [HostSlot(i).container for i in range(1, hosts + 1)]

    def read(self, since: float) -> dict[str, list[str]]:
        """Lines logged at ``since`` (seconds since the epoch) or later."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since))
        lb = ["docker", "exec", self.lb]
        journal = ["journalctl", "-o", "cat", "--no-pager", "--since", f"@{int(since)}", "-u"]
        nginx = _out([*lb, "sh", "-c", "cat /var/log/nginx/rigfleet-cache.log 2>/dev/null "
                      "|| true"]) if self.cache else []
        return {
            "hub": _out(["docker", "logs", "--since", str(int(since)),
                         self.layout.SERVICES_CONTAINER]),
            "registry": _out(["docker", "logs", "--since", str(int(since)),
                              self.layout.REGISTRY_CONTAINER]),
            # ISO 8601 times in one zone sort as text.
            "cache-models": [line for line in nginx if line[:19] >= stamp],
            "cache-registry": _out([*lb, *journal, "docker-registry"]) if self.cache else [],
            "peers": [line for rig in self.rigs
                      for line in _out(["docker", "exec", rig, *journal, PEER_UNIT])],
        }


def need_bytes(layout, inventory: Path) -> tuple[int, int]:
    """(model bytes, image bytes) of one fleet's pins: the revision's files from the hub's
    listing, the compressed layers of every pinned image from the registry."""
    from huggingface_hub import HfApi

    from rigfleet.desired import load_desired
    from rigfleet.inventory import gpu_hosts, load_inventory
    from rigfleet.registry import registry_of, split_image

    pins = yaml.safe_load((layout.STATE_DIR / "pins.yaml").read_text())
    info = HfApi(endpoint=f"http://127.0.0.1:{layout.HUB_LOCAL_PORT}").model_info(
        pins["model"]["repo"], revision=pins["model"]["revision"], files_metadata=True)
    model = sum(int(s.lfs.size if s.lfs else s.size or 0) for s in info.siblings or [])
    images: set[tuple[str, str]] = set()
    for h in gpu_hosts(load_inventory(inventory, cwd=REPO)):
        want = load_desired(h.name, h.data)
        images |= {(registry_of(split_image(s.pins.image)[0])[1], s.pins.digest)
                   for s in want.stacks.values()}
    base = f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}"
    blobs: dict[str, int] = {}  # images that share layers need each once
    for path, digest in images:
        blobs |= image_blobs(base, path, digest)
    return model, sum(blobs.values())


def _manifest(base: str, path: str, ref: str) -> dict:
    req = urllib.request.Request(f"{base}/v2/{path}/manifests/{ref}",
                                 headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(req, timeout=60) as answer:
        return json.loads(answer.read())


def image_blobs(base: str, path: str, digest: str) -> dict[str, int]:
    """The linux/amd64 image's config and layers: digest -> compressed bytes."""
    top = _manifest(base, path, digest)
    amd64 = [m["digest"] for m in top.get("manifests", [])
             if m.get("platform", {}).get("os") == "linux"
             and m.get("platform", {}).get("architecture") == "amd64"]
    image = _manifest(base, path, amd64[0]) if amd64 else top
    return {d["digest"]: int(d["size"]) for d in (image["config"], *image["layers"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3, help="GPU hosts (default 3)")
    parser.add_argument("--fresh", action="store_true",
                        help="take the testbed down first (bare hosts; else it must be bare)")
    parser.add_argument("--no-cache", action="store_true",
                        help="no lb1 (no fleet cache): the hosts serve their peers")
    parser.add_argument("--since", type=float, metavar="EPOCH_S",
                        help="no converge: the figures of one that started then (the testbed "
                        "as it is)")
    args = parser.parse_args(argv)
    from rigfleet_testbed import layout

    rigfleet = str(BIN / "rigfleet")
    warnings: list[str] = []
    since = args.since
    if since is None:
        if args.fresh:
            subprocess.run([rigfleet, "testbed", "down"], cwd=REPO, check=True, timeout=900)
        subprocess.run([rigfleet, "testbed", "up", "--hosts", str(args.hosts),
                        *([] if args.no_cache else ["--balancer"])],
                       cwd=REPO, check=True, timeout=1800)
        since = time.time() - 1
        print(f"converge from {since:.0f} (--since {since:.0f} prints these figures again)")
        proc = subprocess.run([str(BIN / "pyinfra"), str(layout.INVENTORY), "deploy.py", "-y"],
                              cwd=REPO, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            print((proc.stdout + proc.stderr)[-4000:], file=sys.stderr)
            raise SystemExit("the converge failed")
        # The host's warnings the deploy shows (a cache skipped, a bad copy from it).
        warnings = [line for line in (proc.stdout + proc.stderr).splitlines()
                    if any(w in line for w in WARNED)]
    new = Logs(layout, args.hosts, cache=not args.no_cache).read(since)
    hub, hub_n = hub_bytes(new["hub"])
    reg, reg_n = access_bytes(new["registry"])
    lan_models, files, clients = nginx_bytes(new["cache-models"])
    lan_images, blobs = access_bytes(new["cache-registry"], skip_clients=("127.0.0.1", "::1"))
    lan_peers, peer_n = peer_bytes(new["peers"])
    model, images = need_bytes(layout, layout.INVENTORY)
    from rigfleet.inventory import gpu_hosts, load_inventory

    rigs = len(gpu_hosts(load_inventory(layout.INVENTORY, cwd=REPO)))
    print(f"fleet: {rigs} GPU host(s)"
          f"{' (no cache: peers)' if args.no_cache else ' + lb1 (fleet cache)'}, "
          f"instance {layout.INSTANCE}")
    print(f"upstream hub {layout.HUB_URL}: {hub} bytes ({hub_n} GETs)")
    print(f"upstream registry {layout.MIRROR_URL}: {reg} bytes ({reg_n} GETs)")
    print(f"LAN cache lb1 model files: {lan_models} bytes ({files} files to "
          f"{len(clients)} host(s))")
    print(f"LAN cache lb1 registry: {lan_images} bytes ({blobs} GETs)")
    print(f"LAN peers: {lan_peers} bytes ({peer_n} GETs)")
    print(f"one host needs: model {model} bytes + images {images} bytes")
    for line in warnings:
        print(f"warning: {line.strip()}")
    print(f"wan ratio {wan_ratio(hub + reg, model + images):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
