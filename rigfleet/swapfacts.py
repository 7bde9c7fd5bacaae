"""Facts about a host's serving state and its lock (one command each, never failing).

Both run ``rigfleet/hostside/probe.py``'s source with ``python3 -c``, so they answer before
the host-side bundle is installed and read the lock with the same liveness rules the bundle
uses (``rigfleet.hostside.probe.holder_alive``)::

    probe = host.get_fact(SwapProbe)        # {"active": ..., "containers": ..., "route": ...}
    holder = host.get_fact(HostLockHolder)  # {"who": ..., "alive": True, ...} or None
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

from rigfleet.commands import hosttool


def _last_json(output: list[str]) -> dict[str, Any]:
    for line in reversed(output):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


class SwapProbe(FactBase[dict[str, Any]]):
    """Active record, ``state.json``, lock holder, stack containers, front route, bundle hash."""

    default = dict

    @override
    def command(self) -> str:
        return hosttool.probe()

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return _last_json(output)


class HostLockHolder(FactBase[dict[str, Any] | None]):
    """Who holds ``/var/lib/rigfleet/lock`` (with ``alive``), or None when it is free."""

    @override
    def command(self) -> str:
        return hosttool.probe(lock_only=True)

    @override
    def process(self, output: list[str]) -> dict[str, Any] | None:
        holder = _last_json(output).get("lock")
        return holder if isinstance(holder, dict) else None


class UnitActive(FactBase[bool]):
    """``systemctl is-active <unit>`` says ``active``."""

    default = bool

    @override
    def command(self, unit: str) -> str:
        return f"systemctl is-active {unit} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> bool:
        return bool(output) and output[-1].strip() == "active"
