"""Read a pyinfra inventory from outside pyinfra (the rollout, status, testinfra bridge).

pyinfra's CLI does the loading (group data, precedence) in a subprocess: importing
``pyinfra_cli`` here would monkey-patch gevent into our process::

    hosts = load_inventory("inventory/home.py")
    hosts[0].name, hosts[0].data["power_caps_w"]
    gpu_hosts(hosts)                 # the hosts that serve (status, bump, endpoints)
    balancers(hosts)                 # the hosts of group ``balancers`` (HAProxy)
    monitors(hosts)                  # the hosts of group ``monitors`` (Prometheus)
    caches(hosts)                    # the hosts of group ``caches`` (the fleet cache)

What a host is comes from its groups, decided here only (``host_kind``). A host in
``balancers`` runs the balancer, one in ``monitors`` the monitor (docs/monitoring.md), one in
``caches`` the fleet cache (docs/images.md): all are service hosts (of the fleet, not rigs: no NVIDIA, no Docker, never converged as a rig);
such a host is also a GPU host only when it is in ``gpu_hosts`` too. Every other host is a
GPU host, as before service hosts existed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The inventory group whose hosts run the fleet endpoint (roles/balancer.py).
BALANCER_GROUP = "balancers"
# The inventory group whose hosts run Prometheus and Alertmanager (roles/monitor.py).
MONITOR_GROUP = "monitors"
# The inventory group whose hosts run the fleet cache (roles/cache.py).
CACHE_GROUP = "caches"
# The groups of service hosts: hosts of the fleet that are not rigs.
SERVICE_GROUPS = (BALANCER_GROUP, MONITOR_GROUP, CACHE_GROUP)
# The group of serving hosts; needed only for a service host that serves as well.
GPU_GROUP = "gpu_hosts"


@dataclass(frozen=True)
class HostKind:
    """Which roles a host gets: the GPU roles, the balancer, the monitor, the cache (any
    mix)."""

    gpu: bool
    balancer: bool
    monitor: bool = False
    cache: bool = False

    @property
    def service(self) -> bool:
        """A service host: in a service group (it may serve too, in ``gpu_hosts``)."""
        return self.balancer or self.monitor or self.cache


def host_kind(groups: Iterable[str]) -> HostKind:
    """``host_kind(["balancers"])`` -> balancer only; ``["monitors"]`` -> monitor only;
    ``["balancers", "monitors"]`` -> both services; ``["caches"]`` -> the cache only; with
    ``gpu_hosts`` too -> a GPU host as well; a host in no service group -> a GPU host."""
    names = set(groups)
    balancer, monitor = BALANCER_GROUP in names, MONITOR_GROUP in names
    cache = CACHE_GROUP in names
    return HostKind(gpu=not (balancer or monitor or cache) or GPU_GROUP in names,
                    balancer=balancer, monitor=monitor, cache=cache)


class InventoryError(RuntimeError):
    """The inventory could not be loaded; the message quotes pyinfra."""


@dataclass(frozen=True)
class InventoryHost:
    name: str
    groups: tuple[str, ...]
    data: dict[str, Any]

    @classmethod
    def of(cls, host: Any) -> InventoryHost:
        """A pyinfra host (its name and data) as the SSH layer takes it."""
        return cls(host.name, (), dict(host.data.dict()) if hasattr(host.data, "dict") else {})

    @property
    def kind(self) -> HostKind:
        return host_kind(self.groups)

    @property
    def ssh_target(self) -> tuple[str, int, str]:
        """(hostname, port, user) as pyinfra's SSH connector would use them: the data over
        the ssh_config file (``rigfleet.sshconfig``; an alias resolves to its HostName)."""
        from rigfleet.sshconfig import resolve

        t = resolve(self.name, self.data)
        return t.hostname, t.port, t.user


def load_inventory(path: str | Path, cwd: str | Path | None = None) -> list[InventoryHost]:
    """The hosts of the inventory file ``path``; ``InventoryError`` when it is missing, pyinfra
    cannot load it, or it names no host (pyinfra alone would take a missing file for a host
    name, or warn and go on with no hosts)."""
    where = Path(cwd or ".") / path
    if not where.is_file():
        raise InventoryError(f"inventory {path}: no such file; allowed: a pyinfra inventory "
                             "file (a .py file whose module-level lists name the hosts)")
    pyinfra = Path(sys.executable).with_name("pyinfra")
    cmd = [str(pyinfra) if pyinfra.exists() else "pyinfra", str(path), "debug-inventory", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=60)
    if proc.returncode != 0:
        raise InventoryError(f"cannot load inventory {path}: {proc.stderr.strip()[-2000:]}")
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise InventoryError(f"pyinfra printed no JSON for {path}: {proc.stdout[:500]}") from None
    if not rows:
        said = " ".join(x for x in proc.stderr.splitlines() if not x.startswith("-->"))[-500:]
        raise InventoryError(f"inventory {path}: no hosts; allowed: an inventory with at least "
                             "one host (a module-level list of names or (name, data) pairs)"
                             + (f"; pyinfra said: {said}" if said else ""))
    return [InventoryHost(r["name"], tuple(r.get("groups", [])), r.get("data", {})) for r in rows]


def gpu_hosts(hosts: Sequence[InventoryHost]) -> list[InventoryHost]:
    """The hosts that serve (every host but a balancer-only one), in inventory order."""
    return [h for h in hosts if h.kind.gpu]


def monitors(hosts: Sequence[InventoryHost]) -> list[InventoryHost]:
    """The hosts of group ``monitors``, in inventory order."""
    return [h for h in hosts if h.kind.monitor]


def balancers(hosts: Sequence[InventoryHost]) -> list[InventoryHost]:
    """The hosts of group ``balancers``, in inventory order."""
    return [h for h in hosts if h.kind.balancer]


def caches(hosts: Sequence[InventoryHost]) -> list[InventoryHost]:
    """The hosts of group ``caches``, in inventory order."""
    return [h for h in hosts if h.kind.cache]
