"""Peers without a fleet cache: the seed fetches from upstream, the others from the seed, falling
back to upstream with a warning (docs/images.md)::

    p = peer_for(lambda want: model in want.models)     # None: fetch it yourself
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger

from rigfleet.balancer.plan import GpuHost, front_target, url_host
from rigfleet.desired import DesiredHost, load_desired
from rigfleet.errors import RigfleetError
from rigfleet.fleetcache import peer_serve_command
from rigfleet.inventory import InventoryHost, host_kind
from rigfleet.registry import split_image
from rigfleet.resources import project_file
from rigfleet.ssh import HostUnreachable, Remote, SshRemote

# The SSH layer a seed's server is started and an image archive streamed over (tests: a fake).
REMOTE: Callable[[], Remote] = SshRemote


@dataclass(frozen=True)
class Peer:
    """The seed this host takes a pinned thing from, and how to start its server."""

    seed: str
    url: str
    start: str
    target: InventoryHost


def _desired(name: str, data: Any) -> DesiredHost | None:
    memo = host.state.__dict__.setdefault("_rigfleet_peer_desired", {})
    if name not in memo:
        try:
            memo[name] = load_desired(name, data)
        except RigfleetError:
            memo[name] = None  # its own preflight refuses it
    return memo[name]


def peer_for(wants: Callable[[DesiredHost], bool]) -> Peer | None:
    """The seed when this host is a peer for what ``wants`` picks: no fleet cache in the
    inventory, and an earlier GPU host of this run (inventory order) wants it too."""
    hosts = list(host.inventory)
    if any(host_kind(h.groups).cache for h in hosts):
        return None
    run = [h for h in hosts if host_kind(h.groups).gpu and host.state.is_host_in_limit(h)
           and h not in host.state.failed_hosts]  # (refused in preflight)
    wanting = [(h, d) for h in run if (d := _desired(h.name, h.data)) is not None and wants(d)]
    if not wanting or wanting[0][0].name == host.name:
        return None
    seed, want = wanting[0]
    repos = {split_image(s.pins.image)[0] for _, d in wanting for s in d.stacks.values()}
    port = want.settings.peer_port
    # where the LAN reaches the seed: as the balancer reaches its front
    address = front_target(GpuHost(seed.name, want.settings, seed.data.get("ssh_hostname")))[1]
    return Peer(seed.name, f"http://{url_host(address)}:{port}", peer_serve_command(
        port, want.settings.model_dir, repos), InventoryHost.of(seed))


def start_seed(state: Any, host: Any, peer: Peer) -> None:
    """Start the seed's server over SSH; a failure is a warning (the fetch goes upstream)."""
    try:
        rc, out = REMOTE().run(peer.target, peer.start, timeout=60, stdin=project_file(
            "files/rigfleet-peer-serve.py").read_bytes())
    except HostUnreachable as e:
        rc, out = -1, str(e)
    if rc != 0:
        logger.warning(f"[{host.name}] peer {peer.seed}: its server did not start "
                       f"({out.strip()[-200:] or f'exit {rc}'}); fetching upstream")
