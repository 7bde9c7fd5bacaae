"""One status row per host (probed, its drift decided). Exit status: 0 all good, 1 some host
drifted, 2 some host unreachable (or its data invalid), 3 inventory or pins unreadable."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigfleet.bump.journal import BumpInFlight
from rigfleet.desired import DesiredHost, build_desired, fleet_pins
from rigfleet.errors import RigfleetError
from rigfleet.fleetview import each_host, probe_for
from rigfleet.hostdata import validate_host
from rigfleet.hostprobe import HostProbe
from rigfleet.hostside.records import now_iso
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import HostUnreachable, Remote, SshRemote
from rigfleet.status.drift import find_drift

EXIT_OK, EXIT_DRIFT, EXIT_UNREACHABLE, EXIT_ERROR = 0, 1, 2, 3
PINS_ERROR = "inventory/pins: "  # a row's error when the host was not asked: nothing to ask


@dataclass
class StatusRow:
    host: str
    reachable: bool
    stack: str | None = None
    digest: str | None = None
    genesis: str | None = None
    model_revision: str | None = None
    gate: str | None = None
    gate_time: str | None = None
    drift: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    throughput: dict[str, Any] | None = None
    # Where the host stands in an unfinished bump (``BumpJournal.host_view``, plus ``runs``).
    bump: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.reachable and not self.drift and self.error is None


def gate_summary(probe: HostProbe) -> tuple[str | None, str | None]:
    """(result, time) of the last gate: ``state.json``'s ``gate``, else the newest report."""
    if (record := probe.gate) is not None:
        return record.result, record.at
    if (report := probe.newest_report) is not None:
        return f"report {Path(report.file).name}: {report.text}", now_iso(report.mtime, suffix="Z")
    return None, None


def build_row(want: DesiredHost, probe: HostProbe, seconds: float = 0.0) -> StatusRow:
    c = probe.containers.get(want.current.spec.container_name) or {}
    stack = probe.state.get("stack") or c.get("stack") or next(
        (n.removeprefix("rigfleet-") for n, v in probe.containers.items()
         if v.get("status") == "running"), None)
    # The image of the stack that runs, also when it is not the desired one (drift says so).
    runs = want.stacks.get(stack or "", want.current)
    c = probe.containers.get(runs.spec.container_name, c)
    digests = [str(d) for d in c.get("digests") or []]
    digest = runs.pins.digest if runs.pins.digest in digests else (
        digests[0] if digests else None)
    result, when = gate_summary(probe)
    last = probe.throughput_last
    throughput = None if last is None else {
        "stack": last.stack, "narrative": last.decode("narrative"), "code": last.decode("code"),
        "result": last.result, "at": last.at, "scale": last.scale}
    return StatusRow(want.name, True, stack=stack, digest=digest,
                     genesis=probe.section("genesis").get("head"),
                     model_revision=probe.section("manifest").get("revision"), gate=result,
                     gate_time=when, drift=find_drift(want, probe), seconds=round(seconds, 2),
                     throughput=throughput)


def host_status(host: InventoryHost, timeout: float = 20.0, pins_base: Path | None = None,
                remote: Remote | None = None) -> StatusRow:
    """Probe one host and decide its drift; never raises (problems land in the row)."""
    started = time.monotonic()
    try:
        settings = validate_host(host.name, host.data)
        pins, journal = fleet_pins(settings, pins_base)
        if journal is not None and journal.state == "finished":
            journal = None
        try:
            pinned = journal.pins_for(pins, host.name) if journal else pins.for_host(host.name)
            wants: tuple[DesiredHost, ...] = (build_desired(settings, pinned),)
        except BumpInFlight as e:  # mid-bump: old pins or candidate (the probe tells which)
            wants = build_desired(settings, e.old), build_desired(settings, e.new)
    except RigfleetError as e:
        return StatusRow(host.name, reachable=False, error=f"{PINS_ERROR}{e}")
    view = journal.host_view(host.name) if journal is not None else None
    try:
        probe = probe_for(remote or SshRemote(connect_timeout=timeout), host, wants[0],
                          timeout=timeout)
    except HostUnreachable as e:
        return StatusRow(host.name, reachable=False, error=str(e),
                         seconds=round(time.monotonic() - started, 2), bump=view)
    if probe.bare:
        return StatusRow(host.name, reachable=True, error="not deployed yet (no host-side "
                         "tool): run the deploy", seconds=round(time.monotonic() - started, 2),
                         bump=view)
    keys = ("stack", "digest", "genesis_commit")  # the want state.json records, else the first
    which = next((i for i, w in enumerate(wants)
                  if all(probe.state.get(k) == w.current.tracked.get(k) for k in keys)), 0)
    row = build_row(wants[which], probe, time.monotonic() - started)
    if view is not None and len(wants) > 1:
        matched = any(probe.state.get("digest") == w.current.pins.digest for w in wants)
        view = {**view, "runs": ("candidate" if which else "old") if matched else "unknown"}
    row.bump = view
    return row


def fleet_status(hosts: Sequence[InventoryHost], timeout: float = 20.0,
                 probe: Callable[[InventoryHost], StatusRow] | None = None) -> list[StatusRow]:
    """Every host's row, probed at once, in inventory order (``probe``: tests' stand-in)."""
    return each_host(hosts, probe or (lambda h: host_status(h, timeout)),
                     lambda h, why: StatusRow(h.name, reachable=False, error=why),
                     timeout=timeout)


def exit_status(rows: Sequence[StatusRow]) -> int:
    if any(not r.reachable or r.error for r in rows):
        return EXIT_UNREACHABLE
    if any(r.drift for r in rows):
        return EXIT_DRIFT
    return EXIT_OK
