"""A balancer's plan: one pool per stack of the GPU hosts whose desired stack it is (pure;
docs/balancer.md says why a host is never sent another stack's requests)::

    plan = plan_balancer("lb1", balancer_settings, [GpuHost("host1", settings, "10.0.0.11")])
    plan.default_stack                      # 'int8': the only stack, so /v1/... goes there
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rigfleet.errors import RigfleetError
from rigfleet.hostchecks import host_name_or_ip, url_host
from rigfleet.hostdata import (
    BalancerSettings,
    HostDataError,
    HostSettings,
    ports_taken,
    validate_balancer,
    validate_host,
)
from rigfleet.inventory import HostKind, host_kind
from rigfleet.validate import Problems

# Clients ask a stack by path, /stacks/<stack>/v1/...; the host's front never sees the prefix.
STACK_PREFIX = "/stacks/"
# What HAProxy takes in a server's name (and the balancer in a file name): @fake/rig1 -> _fake_rig1
_NOT_ID = re.compile(r"[^A-Za-z0-9._-]")
T = TypeVar("T")


class BalancerError(RigfleetError, ValueError):
    """The balancer cannot be built from this inventory."""


@dataclass(frozen=True)
class GpuHost:
    name: str
    settings: HostSettings
    ssh_hostname: str | None = None


@dataclass(frozen=True)
class Server:
    """One GPU host's front in a pool; ``verify_name`` and ``ca_file`` only for TLS fronts."""

    host: str
    id: str
    address: str
    verify_name: str | None = None
    ca_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.ca_file is not None


@dataclass(frozen=True)
class Pool:
    """The hosts whose desired stack is ``stack`` (an HAProxy backend ``stack_<stack>``)."""

    stack: str
    served_model_name: str
    servers: tuple[Server, ...]

    @property
    def backend(self) -> str:  # catalog names are [a-z0-9-]: valid in HAProxy as they are
        return f"stack_{self.stack}"

    @property
    def prefix(self) -> str:
        return f"{STACK_PREFIX}{self.stack}"


@dataclass(frozen=True)
class BalancerPlan:
    """One balancer: its settings, one pool per stack (sorted), the stack of ``/v1/...``."""

    name: str
    settings: BalancerSettings
    pools: tuple[Pool, ...]
    default_stack: str | None
    hosts: tuple[GpuHost, ...] = ()

    def pool(self, stack: str) -> Pool:
        return next(p for p in self.pools if p.stack == stack)


def split_address(address: str) -> tuple[str, int | None]:
    """``rig-a.lan:8000`` -> (``rig-a.lan``, 8000); ``[fd00::1]`` -> (``fd00::1``, None)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else None
    host, sep, port = address.partition(":")
    return host, int(port) if sep else None


def front_target(host: GpuHost) -> tuple[str, str]:
    """(``host:port`` HAProxy connects to, the name in the front's certificate)."""
    given = host.settings.balancer_front_address
    name, port = split_address(given) if given else (host.ssh_hostname or host.name, None)
    port = port or host.settings.front_port
    return f"{url_host(name)}:{port}", name


def plan_balancer(name: str, settings: BalancerSettings, hosts: Sequence[GpuHost]) -> BalancerPlan:
    """``/v1/...`` goes to ``balancer_default_stack``, else to the only stack, else nowhere."""
    if not hosts:
        raise BalancerError(f"{name}: balancers: the inventory has no GPU host to balance; "
                            "allowed: a balancer beside at least one GPU host (every host "
                            "not only in group balancers, or in group gpu_hosts)")
    plain = [h.name for h in hosts if h.settings.front_tls is None]
    if settings.tls is not None and plain and not settings.plain_fronts:
        raise BalancerError(
            f"{name}: balancer_plain_fronts: False, but {name} serves HTTPS "
            f"(balancer_tls_cert_file) in front of GPU host(s) {', '.join(plain)} serving plain "
            f"HTTP: the API key clients send would cross the LAN in clear from {name} to them; "
            "allowed: TLS on those fronts (front_tls_cert_file and front_tls_key_file in their "
            f"data), or balancer_plain_fronts: True in {name}'s data (the LAN between them is "
            "trusted, on purpose)")
    by_stack: dict[str, list[Server]] = {}
    served: dict[str, str] = {}
    seen: dict[str, str] = {}
    ids: dict[str, str] = {}
    for h in hosts:
        address, verify = front_target(h)
        if not host_name_or_ip(verify):
            key = ("balancer_front_address" if h.settings.balancer_front_address
                   else "ssh_hostname" if h.ssh_hostname else "inventory name")
            raise BalancerError(
                f"{name}: {key}: {verify!r} (GPU host {h.name}) is not a host name or "
                "address, and haproxy.cfg would name it as one; allowed: ssh_hostname or "
                f"balancer_front_address in {h.name}'s data set to a host name or IP address")
        sid = _NOT_ID.sub("_", h.name)
        if (first := ids.setdefault(sid, h.name)) != h.name:
            raise BalancerError(
                f"{name}: balancers: GPU hosts {first!r} and {h.name!r} both become server "
                f"{sid!r} in HAProxy; allowed: inventory names that differ in letters, digits "
                "or ._-")
        if (first := seen.setdefault(address, h.name)) != h.name:
            raise BalancerError(
                f"{name}: balancer_front_address: {h.name} and {first} are both "
                f"reached at {address!r}; allowed: one front per address (set "
                "balancer_front_address in each host's data)")
        tls = h.settings.front_tls
        by_stack.setdefault(h.settings.stack, []).append(Server(
            h.name, sid, address, verify if tls else None, tls.ca_file if tls else None))
        served[h.settings.stack] = h.settings.spec.served_model_name
    pools = tuple(Pool(stack, served[stack], tuple(servers))
                  for stack, servers in sorted(by_stack.items()))
    default = settings.default_stack
    if default is not None and default not in by_stack:
        raise BalancerError(
            f"{name}: balancer_default_stack: {default!r} is no GPU host's stack; allowed: "
            f"{', '.join(sorted(by_stack))} (or unset: /v1/... then goes to the only stack)")
    if default is None and len(pools) == 1:
        default = pools[0].stack
    return BalancerPlan(name, settings, pools, default, tuple(hosts))


def read_fleet(name: str, group: str, why: str, inventory: Iterable[Any],
               read: Callable[[Any, HostKind], T | None], who: str = "") -> list[T]:
    """What ``read(host, kind)`` makes of each host of ``inventory`` (pyinfra's ``Host``s or
    ``InventoryHost``s; None: nothing); the first whose data does not validate refuses ``name``."""
    out = []
    for other in inventory:
        try:
            got = read(other, host_kind(other.groups))
        except RigfleetError as e:
            raise BalancerError(
                f"{name}: {group}: {who}{other.name}'s data does not validate, so {why}; "
                f"allowed: fix it first ({str(e).splitlines()[0]})") from None
        if got is not None:
            out.append(got)
    return out


def read_gpu_host(other: Any, kind: HostKind) -> GpuHost | None:
    return GpuHost(other.name, validate_host(other.name, other.data),
                   other.data.get("ssh_hostname")) if kind.gpu else None


def validate_balancer_host(name: str, groups: Iterable[str], data: Any) -> BalancerSettings:
    """``validate_balancer`` given the ports the host's other services take (a monitor's, a GPU
    host's node exporter; a cache's ports are checked by the cache); ``HostDataError``."""
    kind = host_kind(groups)
    settings = validate_balancer(name, data, gpu_host=kind.gpu)
    p = Problems(name)
    ports_taken(p, {"balancer_port": settings.port}, kind)
    p.raise_if_any(HostDataError)
    return settings


def fleet_plan(balancer: Any, inventory: Iterable[Any]) -> BalancerPlan:
    """From every GPU host of the inventory, ``--limit`` aside."""
    name = balancer.name
    settings = validate_balancer_host(name, balancer.groups, balancer.data)
    hosts = read_fleet(name, "balancers", "the balancer cannot be built", inventory,
                       read_gpu_host, who="GPU host ")
    return plan_balancer(name, settings, hosts)


@dataclass(frozen=True)
class SwapBatch:
    """How many GPU hosts a converge may swap at once (None: no cap), and why."""

    size: int | None
    why: str


def swap_batch(plan: BalancerPlan | None) -> SwapBatch:
    """The converge's batch cap: one host of every stack with two or more keeps serving."""
    if plan is None:
        return SwapBatch(None, "no balancer in the inventory: each host is its own endpoint")
    if not (shared := [p for p in plan.pools if len(p.servers) >= 2]):
        return SwapBatch(None, f"each stack behind {plan.name} has one host (its 503 window "
                         "either way)")
    tight = min(shared, key=lambda p: len(p.servers))
    size = len(tight.servers) - 1
    return SwapBatch(size, f"{size} host(s) at a time, so that one {tight.stack} host keeps "
                     f"serving behind {plan.name}")


def converge_batch(inventory: Iterable[Any]) -> SwapBatch:
    """``swap_batch`` of the first balancer; one at a time when it cannot be built."""
    entries = list(inventory)
    if (balancer := next((e for e in entries if host_kind(e.groups).balancer), None)) is None:
        return swap_batch(None)
    try:
        return swap_batch(fleet_plan(balancer, entries))
    except (BalancerError, HostDataError):
        return SwapBatch(1, f"one host at a time ({balancer.name}'s data does not validate)")
