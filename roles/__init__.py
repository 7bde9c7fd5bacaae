"""rigfleet's pyinfra roles and ``converge``: a GPU host gets ``preflight`` then ``ROLES`` in order,
a service host (``rigfleet.inventory.host_kind``) its kind's, a cache's first (docs/images.md).
Example (``deploy.py``): ``from roles import converge; converge()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Modules, not their role functions, are bound here: ``roles.power`` stays the module (tests
# patch its constants), and ``roles.power.power`` is the role.
from pyinfra import host

from rigfleet.inventory import host_kind
from roles import (
    balancer,
    base,
    cache,
    container_toolkit,
    docker,
    exporter,
    front,
    genesis,
    images,
    ledger,
    maintenance,
    monitor,
    nvidia_driver,
    power,
    preflight,
    stacks,
    swap,
    weights,
)

ROLES: tuple[Callable[..., Any], ...] = (
    base.base, docker.docker, nvidia_driver.nvidia_driver, container_toolkit.container_toolkit,
    exporter.exporter,
    maintenance.maintenance,  # closes the window the steps above opened on a serving host
    power.power, weights.weights, images.images, genesis.genesis, stacks.stacks, front.front,
    swap.swap, ledger.ledger)
BALANCER_ROLES: tuple[Callable[..., Any], ...] = (base.base, balancer.balancer)
MONITOR_ROLES: tuple[Callable[..., Any], ...] = (base.base, monitor.monitor)
CACHE_ROLES: tuple[Callable[..., Any], ...] = (base.base, cache.cache)


def converge() -> None:
    """Run this host's roles, each kind's preflight first."""
    kind = host_kind(host.groups)
    # Each kind calls its roles from its own line, the cache's first: pyinfra orders operations
    # by their call lines (docs/images.md). host.loop: else two roles' operations at one line
    # would be one, and a host that skips one role's operation would order them in a cycle.
    contexts: list[Any] = []
    if kind.cache:
        contexts.append(cache.preflight_cache(gpu_host=kind.gpu))
        for cache_role in host.loop(CACHE_ROLES):
            cache_role(contexts[-1])
    if kind.gpu:  # @deploy returns what the function returns (its stubs: OperationMeta)
        contexts.append(preflight.preflight())
        for role in host.loop(ROLES):  # base again on a cache host: a no-op there
            role(contexts[-1])
    if kind.balancer:
        contexts.append(preflight.preflight_balancer(gpu_host=kind.gpu))
        for lb_role in host.loop(BALANCER_ROLES[1:] if len(contexts) > 1 else BALANCER_ROLES):
            lb_role(contexts[-1])
    if kind.monitor:
        contexts.append(monitor.preflight_monitor(gpu_host=kind.gpu))
        for mon_role in host.loop(MONITOR_ROLES[1:] if len(contexts) > 1 else MONITOR_ROLES):
            mon_role(contexts[-1])
