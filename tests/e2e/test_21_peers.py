"""Peers without a fleet cache: a fresh rig takes the images from the seed, then stays still.

An inventory of the session's host1 (the seed: first in the run, already serving) and a fresh
bare host (``host8``, outside every session layout) and no ``caches`` group. The fresh host's
images come from host1's peer server (the twin registry, Docker Hub's stand-in, serves no blob
meanwhile); a load has no RepoDigests, so the next converge must still find the image present
and the stack up: it changes nothing on either host (no second load, no recreated container).
"""

from __future__ import annotations

import re
import runpy
import time
from pathlib import Path
from pprint import pformat

import pytest
from e2e_fleet import (
    INVENTORY,
    KEEP,
    dry_plan,
    fresh_host,
    pyinfra,
    remove_host,
    run,
    upstream_blob_gets,
)

PEER_SLOT = 8


@pytest.fixture(scope="module")
def peer_fleet(testbed, converged, tmp_path_factory):
    """host1 and a fresh bare host8 in an inventory of their own (no cache); host8 removed
    after."""
    import docker as docker_sdk
    from rigfleet_testbed import fleet

    slot = fresh_host(testbed, PEER_SLOT)
    tmp = tmp_path_factory.mktemp("peers")
    known = tmp / "known_hosts"
    session = runpy.run_path(str(INVENTORY))
    seed_name, seed_data = session["gpu_hosts"][0][0]
    group_data = session["gpu_hosts"][1]
    known.write_text(Path(seed_data["ssh_known_hosts_file"]).read_text()
                     + f"[127.0.0.1]:{slot.ssh_port} "
                     f"{fleet.host_key(docker_sdk.from_env(), slot)}\n")
    peer_data = {**seed_data, "ssh_port": slot.ssh_port,
                 "front_url": f"http://127.0.0.1:{slot.front_port}",
                 "balancer_front_address": f"{slot.name}:8000",
                 "testbed_container": slot.container}
    hosts = [(seed_name, {**seed_data, "ssh_known_hosts_file": str(known)}),
             (slot.name, {**peer_data, "ssh_known_hosts_file": str(known)})]
    # beside the session's (git-ignored), so that inventory/group_data applies to it too
    inventory = INVENTORY.with_name(f"{INVENTORY.stem}-peers.py")
    inventory.write_text(f"_data = {pformat(group_data)}\n\n"
                         f"gpu_hosts = ({pformat(hosts)}, _data)\n")
    try:
        yield inventory, next(h for h in testbed.hosts if h.name == seed_name), slot
    finally:
        inventory.unlink(missing_ok=True)
        if not KEEP:
            remove_host(slot)


def converge(inventory: Path) -> str:
    proc = pyinfra("-y", inventory=inventory)
    return proc.stdout + proc.stderr


def started_at(container: str, stack_container: str) -> str:
    """When the serving container on a testbed host last started (docker inside the host)."""
    proc = run(["docker", "exec", container, "docker", "inspect", "-f", "{{.State.StartedAt}}",
                stack_container], timeout=60)
    return proc.stdout.strip()


def test_a_fresh_rig_loads_images_from_its_peer_and_a_second_run_changes_nothing(peer_fleet):
    inventory, seed, slot = peer_fleet
    since = time.time()
    out = converge(inventory)
    assert "the load from peer" not in out, out[-4000:]  # no fallback upstream
    assert not upstream_blob_gets(since), "the twin registry served blobs: not from the peer"
    # What the fresh host loaded from its peer is on record, written only after a checked load
    # (a load gives an image no RepoDigests).
    records = run(["docker", "exec", slot.container, "ls", "/var/lib/rigfleet/images-loaded"],
                  timeout=60).stdout.split()
    assert records and all(re.fullmatch(r"[0-9a-f]{64}", r) for r in records), records

    containers = (seed.container, slot.container)
    before = [started_at(c, seed.container_of_stack) for c in containers]
    changes = [(op["name"], op["hosts_with_change"]) for op in dry_plan(inventory)
               if op.get("hosts_with_change")]
    assert changes == [], f"--dry after the first run lists changes: {changes}"
    converge(inventory)
    assert [started_at(c, seed.container_of_stack) for c in containers] == before  # not recreated
