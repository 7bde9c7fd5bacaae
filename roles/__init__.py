"""rigfleet's pyinfra roles, one module per concern, and ``converge`` that runs them in order.

Order (each role relies on the ones before it):

1. ``preflight``        validate host data, pins, OS (control side; nothing changes)
2. ``base``             base packages, chrony, optional site CA
3. ``docker``           Docker Engine + Compose v2, daemon.json merged
4. ``nvidia_driver``    pinned driver branch (open modules), held, reboot if needed, verified
5. ``container_toolkit`` pinned toolkit, Docker's nvidia runtime, verified
   ``exporter``         node exporter on loopback (bound before it starts), the metrics timer
   ``maintenance``      close the maintenance window the steps above opened on a serving host
                        (recreate the verified stack, gate, route); nothing on a bare host
6. ``power``            nvidia-persistenced, power-caps unit, caps applied and read back
7. ``weights``          huggingface_hub venv, fetcher, verified weights
8. ``images``           every staged stack's image by digest, verified
9. ``genesis``          Genesis checkout at the pinned commit, its tree, the compatibility gate
10. ``stacks``          secrets, compose projects (staged, not started)
11. ``front``          nginx with the API key; its route is the host-side tool's
12. ``swap``           the gated host-side transaction: desired stack promoted, or rolled back
13. ``ledger``         state.json and the append-only ledger (pins the swap did not record)

Service hosts (``rigfleet.inventory.host_kind``, docs/monitoring.md): group ``balancers``
gets ``preflight_balancer``, ``base``, ``balancer``; group ``monitors`` gets
``preflight_monitor``, ``base``, ``monitor``; one also in ``gpu_hosts`` gets the GPU roles first.
Example (``deploy.py``)::

    from roles import converge

    converge()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

# Modules, not their role functions, are bound here: ``roles.power`` stays the module (tests
# patch its constants), and ``roles.power.power`` is the role.
from pyinfra import host

from rigfleet.inventory import host_kind
from roles import (
    balancer,
    base,
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
from roles.monitor import MonitorContext
from roles.preflight import BalancerContext, HostContext

# pyinfra's @deploy stubs do not keep the functions' own signatures: each takes the context.
ROLES: tuple[Callable[[HostContext], Any], ...] = cast(tuple[Callable[[HostContext], Any], ...], (
    base.base,
    docker.docker,
    nvidia_driver.nvidia_driver,
    container_toolkit.container_toolkit,
    exporter.exporter,
    maintenance.maintenance,
    power.power,
    weights.weights,
    images.images,
    genesis.genesis,
    stacks.stacks,
    front.front,
    swap.swap,
    ledger.ledger,
))

# A balancer host's roles after its preflight (``base`` only when no GPU role ran it).
BALANCER_ROLES: tuple[Callable[[BalancerContext], Any], ...] = cast(
    tuple[Callable[[BalancerContext], Any], ...], (base.base, balancer.balancer))

# A monitor host's roles after its preflight (``base`` only when no other kind ran it).
MONITOR_ROLES: tuple[Callable[[MonitorContext], Any], ...] = cast(
    tuple[Callable[[MonitorContext], Any], ...], (base.base, monitor.monitor))


def converge() -> HostContext | BalancerContext | MonitorContext:
    """Run the current host's roles, each kind's preflight first (see the module docstring);
    returns its context (the GPU host's when it is several kinds, else the balancer's)."""
    kind = host_kind(host.groups)
    ctx: HostContext | None = None
    if kind.gpu:
        # pyinfra's @deploy returns what the function returns; its stubs say OperationMeta.
        ctx = cast(HostContext, preflight.preflight())
        # host.loop: pyinfra names an operation by the line numbers of its call stack alone
        # (no file names), so two roles calling an operation at the same line would be one
        # operation to it, and a host that skips one role's operation (no Genesis stack on a
        # one-card host) would order the fleet's operations in a cycle. The loop position
        # tells the roles apart.
        for role in host.loop(ROLES):
            role(ctx)
    lb: BalancerContext | None = None
    if kind.balancer:
        lb = cast(BalancerContext, preflight.preflight_balancer(gpu_host=kind.gpu))
        for lb_role in host.loop(BALANCER_ROLES[1:] if kind.gpu else BALANCER_ROLES):
            lb_role(lb)
    mon: MonitorContext | None = None
    if kind.monitor:
        mon = cast(MonitorContext, monitor.preflight_monitor(gpu_host=kind.gpu))
        roles = MONITOR_ROLES[1:] if kind.gpu or kind.balancer else MONITOR_ROLES
        for mon_role in host.loop(roles):
            mon_role(mon)
    result = ctx or lb or mon
    assert result is not None
    return result


__all__ = ["BALANCER_ROLES", "MONITOR_ROLES", "ROLES", "BalancerContext", "HostContext",
           "MonitorContext", "converge"]
