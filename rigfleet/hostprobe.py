"""The host probe from the control side: run ``rigfleet-host.pyz probe`` over SSH, read it
(the one parser of its JSON, ``last_json``; the deploy's ``SwapProbe`` fact reads it too)::

    probe = run_probe(SshRemote(), host, full=True, model_path=want.model_path,
                      front_port=want.settings.front_port)
    probe.state.get("stack"), probe.busy, probe.newest_report
"""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from rigfleet.commands import hosttool
from rigfleet.hostside.records import (
    GateRecord,
    ReportSummary,
    ThroughputRecord,
    describe,
    live_holder,
)
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import HostUnreachable, Remote


@dataclass(frozen=True)
class HostProbe:
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def bare(self) -> bool:
        """The host has no host-side tool yet (never deployed)."""
        return bool(self.raw.get("bare"))

    @property
    def state(self) -> dict[str, Any]:
        return self.section("state")

    @property
    def state_error(self) -> str | None:
        return self.raw.get("state_error") or (None if self.raw.get("state") else "missing")

    @property
    def active(self) -> dict[str, Any] | None:
        return self.part("active")

    @property
    def containers(self) -> dict[str, dict[str, Any]]:
        return self.section("containers")

    @property
    def route(self) -> str | None:
        return self.raw.get("route")

    @property
    def supervisor(self) -> dict[str, Any] | None:
        """The supervisor's record, plus ``alive``; None on a host without one."""
        return self.part("supervisor")

    @property
    def busy(self) -> str | None:
        """Who holds the host lock, when a live process does."""
        holder = live_holder(self.raw.get("lock"))
        return describe(holder) if holder else None

    @property
    def gate(self) -> GateRecord | None:
        """The last gate ``state.json`` records."""
        return GateRecord.from_dict(self.state.get("gate"))

    @property
    def ledger_tail(self) -> tuple[dict[str, Any], ...]:
        return tuple(e for e in self.section("ledger").get("tail") or () if isinstance(e, dict))

    @property
    def ledger_count(self) -> int:
        return int(self.section("ledger").get("count") or 0)

    @property
    def report_files(self) -> tuple[str, ...]:
        return tuple(self.section("reports").get("files") or ())

    @property
    def newest_report(self) -> ReportSummary | None:
        return ReportSummary.from_dict(self.section("reports").get("newest"))

    @property
    def throughput_last(self) -> ThroughputRecord | None:
        """The last gate's throughput record (``--full``)."""
        return ThroughputRecord.from_dict(self.section("throughput").get("last"))

    @property
    def throughput_history(self) -> tuple[ThroughputRecord, ...]:
        """The newest verified throughput records, oldest first (``--full``)."""
        raw = self.section("throughput").get("history") or ()
        return tuple(r for r in (ThroughputRecord.from_dict(x) for x in raw) if r is not None)

    def section(self, name: str) -> dict[str, Any]:
        """A section of the answer (``gpu``, ``front``, ... with ``--full``) or {}."""
        return self.part(name) or {}

    def part(self, name: str) -> dict[str, Any] | None:
        value = self.raw.get(name)
        return value if isinstance(value, dict) else None


def last_json(text: str) -> dict[str, Any] | None:
    """The JSON object on the last line of ``text`` that starts with ``{``, or None."""
    line = next((x for x in map(str.strip, reversed(text.splitlines())) if x.startswith("{")), "")
    with suppress(ValueError):
        data = json.loads(line)
        return data if isinstance(data, dict) else None
    return None


def parse_probe(text: str, where: str) -> HostProbe:
    """The probe's JSON (its last stdout line); raises ``HostUnreachable`` naming ``where``."""
    if (data := last_json(text)) is not None:
        return HostProbe(data)
    raise HostUnreachable(f"{where}: the host probe failed: {text.strip()[-300:] or 'no output'}")


def run_probe(remote: Remote, host: InventoryHost, *, full: bool = False,
              model_path: str | None = None, front_port: int | None = None,
              timeout: float = 60, doctor_load_s: float | None = None) -> HostProbe:
    """``host``'s probe (``doctor_load_s``: with the doctor's evidence); ``HostUnreachable``."""
    command = hosttool.probe(full=full, model_path=model_path, front_port=front_port,
                             doctor_load_s=doctor_load_s)
    rc, out = remote.run(host, command, timeout=timeout)
    if rc != 0 and "unrecognized arguments" in out:
        raise HostUnreachable(f"{host.name}: its host-side tool is older than this rigfleet "
                              "(no --full probe); run the deploy to update it")
    probe = parse_probe(out, host.name)
    if rc != 0:
        raise HostUnreachable(f"{host.name}: the host probe exited {rc}: {out.strip()[-300:]}")
    return probe
