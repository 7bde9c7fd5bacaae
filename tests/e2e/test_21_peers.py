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
from conftest import BIN, INVENTORY, KEEP, fresh_host, remove_host, run, upstream_blob_gets

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
        yield inventory, seed_name, slot.name
    finally:
        inventory.unlink(missing_ok=True)
        if not KEEP:
            remove_host(slot)


def converge(inventory: Path) -> str:
    proc = run([str(BIN / "pyinfra"), str(inventory), "deploy.py", "-y"], timeout=1800)
    return proc.stdout + proc.stderr


def changed(out: str, host: str) -> list[str]:
    """The operations of a pyinfra run that changed ``host`` (its "Success" lines)."""
    ops, current = [], ""
    for line in out.splitlines():
        if m := re.search(r"--> Starting operation: (.*?)\s*$", line):
            current = m.group(1)
        elif re.search(rf"\[{re.escape(host)}\] Success", line):
            ops.append(current)
    return ops


def test_a_fresh_rig_loads_images_from_its_peer_and_a_second_run_changes_nothing(peer_fleet):
    inventory, seed, peer = peer_fleet
    since = time.time()
    out = converge(inventory)
    staged = [op for op in changed(out, peer) if "from a peer" in op]
    assert staged, f"{peer} loaded no image from a peer:\n{out[-4000:]}"
    assert "the load from peer" not in out, out[-4000:]  # no fallback upstream
    assert not upstream_blob_gets(since), "the twin registry served blobs: not from the peer"
    again = converge(inventory)
    for host in (seed, peer):
        assert changed(again, host) == [], f"second run changed {host}:\n{again[-4000:]}"
