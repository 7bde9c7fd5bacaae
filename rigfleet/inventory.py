"""Read a pyinfra inventory from outside pyinfra (in a subprocess: importing ``pyinfra_cli``
would monkey-patch gevent into our process), and what each host is, from its groups only::

    hosts = load_inventory("inventory/home.py")
    gpu_hosts(hosts)                 # the hosts that serve; also balancers, monitors, caches
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MONITOR_GROUP = "monitors"
SERVICE_GROUPS = ("balancers", MONITOR_GROUP, "caches")  # roles/balancer.py, monitor.py, cache.py
GPU_GROUP = "gpu_hosts"  # needed only for a service host that serves as well


@dataclass(frozen=True)
class HostKind:
    """Which roles a host gets (any mix)."""

    gpu: bool
    balancer: bool
    monitor: bool = False
    cache: bool = False


def host_kind(groups: Iterable[str]) -> HostKind:
    """A host's roles from ``groups``: GPU unless only in ``SERVICE_GROUPS`` (no ``gpu_hosts``)."""
    names = set(groups)
    balancer, monitor, cache = (group in names for group in SERVICE_GROUPS)
    return HostKind(not (balancer or monitor or cache) or GPU_GROUP in names, balancer, monitor,
                    cache)


class InventoryError(RuntimeError):
    """The inventory could not be loaded; the message quotes pyinfra."""


@dataclass(frozen=True)
class InventoryHost:
    name: str
    groups: tuple[str, ...]
    data: dict[str, Any]

    @classmethod
    def of(cls, host: Any) -> InventoryHost:
        return cls(host.name, (), dict(host.data.dict()) if hasattr(host.data, "dict") else {})

    @property
    def kind(self) -> HostKind:
        return host_kind(self.groups)

    @property
    def ssh_target(self) -> tuple[str, int, str]:
        """(hostname, port, user) as pyinfra's SSH connector would use them."""
        from rigfleet.sshconfig import resolve

        t = resolve(self.name, self.data)
        return t.hostname, t.port, t.user


def load_inventory(path: str | Path) -> list[InventoryHost]:
    """The hosts of inventory file ``path``; ``InventoryError``: missing, unloadable, empty."""
    if not Path(path).is_file():
        raise InventoryError(f"inventory {path}: no such file; allowed: a pyinfra inventory "
                             "file (a .py file whose module-level lists name the hosts)")
    pyinfra = Path(sys.executable).with_name("pyinfra")
    cmd = [str(pyinfra) if pyinfra.exists() else "pyinfra", str(path), "debug-inventory", "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise InventoryError(f"cannot load inventory {path}: pyinfra took more than 60 s to read "
                             "it; allowed: an inventory that loads without waiting (no network "
                             "look-ups at import time)") from None
    except OSError as e:
        raise InventoryError(f"cannot load inventory {path}: cannot run {cmd[0]} "
                             f"({e.strerror or e}); allowed: pyinfra installed beside this "
                             "Python or on PATH") from None
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
    """The hosts that serve, in inventory order (likewise ``balancers``)."""
    return [h for h in hosts if h.kind.gpu]


def balancers(hosts: Sequence[InventoryHost]) -> list[InventoryHost]:
    return [h for h in hosts if h.kind.balancer]
