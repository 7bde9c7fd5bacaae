"""The candidate image into the fleet caches (group ``caches``) before the canary pulls it
(docs/images.md); a cache that cannot fetch it is a warning, the canary pulls upstream::

    held = prefetch(SshRemote(), load_inventory("inventory/home.py"), candidate, log)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rigfleet.bump.candidate import Candidate
from rigfleet.errors import RigfleetError
from rigfleet.fleetcache import seed_command, warm_marker
from rigfleet.hostdata import HostDataError, validate_cache
from rigfleet.inventory import InventoryHost, host_kind
from rigfleet.registry import registry_of
from rigfleet.ssh import Remote

# Seeding a vLLM image (several GB) through a home uplink.
SEED_TIMEOUT_S = 3600


def prefetch(remote: Remote, inventory: Sequence[InventoryHost], candidate: Candidate,
             log: Callable[[str], object]) -> tuple[str, ...]:
    """Seed ``candidate`` into every fleet cache; the registries (``host:port``) that hold it."""
    registry, path = registry_of(candidate.repository)
    if registry is not None:  # the caches pull through for Docker Hub's names only
        return ()
    held: list[str] = []
    for h in inventory:
        if not host_kind(h.groups).cache:
            continue
        try:
            c = validate_cache(h.name, h.data)
        except HostDataError:
            continue  # its own preflight names the problem; the canary pulls upstream
        where = f"{c.address}:{c.registry_port}"
        log(f"fleet cache {h.name}: fetching {path}@{candidate.digest[:19]} from "
            f"{c.registry_upstream} once, before the canary")
        try:
            rc, out = remote.run(h, seed_command(c.registry_upstream, path, candidate.digest,
                                                 warm_marker(candidate.digest)),
                                 timeout=SEED_TIMEOUT_S)
        except RigfleetError as e:
            rc, out = -1, str(e)
        if rc == 0:
            held.append(where)
        else:
            last = out.strip().splitlines()[-1:] or ["no output"]
            log(f"[yellow]warning:[/yellow] fleet cache {h.name}: the candidate is not in the "
                f"cache (exit {rc}: {last[0][-300:]}); the canary pulls it from the upstream")
    return tuple(held)
