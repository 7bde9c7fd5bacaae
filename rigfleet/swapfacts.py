"""Facts about a host's serving state and its units.

``SwapProbe`` runs the host probe ``rigfleet status`` uses, read by its one parser
(``rigfleet.hostprobe``); a host without the tool answers as bare::

    probe = read_fact(SwapProbe)    # {"active": ..., "lock": ..., "containers": ..., ...}
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

from rigfleet.commands import hosttool
from rigfleet.hostprobe import last_json


class SwapProbe(FactBase[dict[str, Any]]):
    """The host probe's basic answer (``HostProbe.raw``)."""

    default = dict

    @override
    def command(self) -> str:
        return hosttool.probe()

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return last_json("\n".join(output)) or {}


class UnitActive(FactBase[bool]):
    default = bool

    @override
    def command(self, unit: str) -> str:
        return f"systemctl is-active {unit} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> bool:
        return bool(output) and output[-1].strip() == "active"
