"""One status row per host: probe it (over ``rigfleet.ssh``), decide its drift, summarise.

    rows = fleet_status(load_inventory("inventory/home.py"))
    [r.host for r in rows if r.drift]           # hosts that differ from inventory + pins
    exit_status(rows)                           # 0 ok, 1 drift, 2 unreachable

Exit status: 0 when every host is reachable and nothing drifted, 1 when some host drifted, 2
when some host is unreachable (or its inventory data is invalid), 3 when the inventory or the
pins cannot be read (the command says so).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigfleet.bump.journal import BumpInFlight, BumpJournal
from rigfleet.desired import DesiredHost, build_desired, fleet_pins
from rigfleet.errors import RigfleetError
from rigfleet.hostdata import HostSettings, validate_host
from rigfleet.hostprobe import HostProbe, run_probe
from rigfleet.inventory import InventoryHost
from rigfleet.pins import Pins
from rigfleet.ssh import HostUnreachable, Remote, SshRemote
from rigfleet.status.drift import find_drift

EXIT_OK, EXIT_DRIFT, EXIT_UNREACHABLE, EXIT_ERROR = 0, 1, 2, 3


@dataclass
class StatusRow:
    """One host's status (``--json`` prints these as objects)."""

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
    # Where the host stands in an unfinished ``rigfleet bump`` (``BumpJournal.host_view``,
    # plus ``runs`` for a host it was deploying: what the host itself says it runs).
    bump: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.reachable and not self.drift and self.error is None


def gate_summary(probe: HostProbe) -> tuple[str | None, str | None]:
    """(result, time) of the last gate: ``state.json``'s ``gate``, else the newest report."""
    record = probe.gate
    if record is not None:
        return record.result, record.at
    report = probe.newest_report
    if report is not None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(report.mtime))
        return f"report {Path(report.file).name}: {report.text}", when
    return None, None


def build_row(want: DesiredHost, probe: HostProbe, seconds: float = 0.0) -> StatusRow:
    """The row for a reachable host from its probe (pure)."""
    state = probe.state
    c = probe.containers.get(want.current.spec.container_name) or {}
    running = next((n for n, v in probe.containers.items() if v.get("status") == "running"),
                   None)
    stack = state.get("stack") or c.get("stack") or None
    if stack is None and running:
        stack = running.removeprefix("rigfleet-")
    digests = [str(d) for d in c.get("digests") or []]
    digest = want.current.pins.digest if want.current.pins.digest in digests else (
        digests[0] if digests else None)
    result, when = gate_summary(probe)
    return StatusRow(
        host=want.name,
        reachable=True,
        stack=stack,
        digest=digest,
        genesis=probe.section("genesis").get("head"),
        model_revision=probe.section("manifest").get("revision"),
        gate=result,
        gate_time=when,
        drift=find_drift(want, probe),
        seconds=round(seconds, 2),
    )


def desired_choices(settings: HostSettings, pins: Pins,
                    journal: BumpJournal | None) -> tuple[DesiredHost, ...]:
    """What the host should run: one ``DesiredHost``; two (old pins, candidate) for a host an
    interrupted bump was deploying, which only the host can tell apart (``pick``)."""
    if journal is None:
        return (build_desired(settings, pins.for_host(settings.name)),)
    try:
        return (build_desired(settings, journal.pins_for(pins, settings.name)),)
    except BumpInFlight as e:
        return build_desired(settings, e.old), build_desired(settings, e.new)


def pick(wants: tuple[DesiredHost, ...], probe: HostProbe) -> tuple[DesiredHost, int]:
    """The one of ``wants`` whose served stack ``state.json`` records (else the first), and
    its index."""
    keys = ("stack", "digest", "genesis_commit")
    for i, want in enumerate(wants):
        if all(probe.state.get(k) == want.current.tracked.get(k) for k in keys):
            return want, i
    return wants[0], 0


def host_status(host: InventoryHost, timeout: float = 20.0, pins_base: Path | None = None,
                remote: Remote | None = None) -> StatusRow:
    """Probe one host and decide its drift; never raises (problems land in the row)."""
    started = time.monotonic()
    try:
        settings = validate_host(host.name, host.data)
        pins, journal = fleet_pins(settings, pins_base)
        if journal is not None and journal.state == "finished":
            journal = None
        wants = desired_choices(settings, pins, journal)
    except RigfleetError as e:
        return StatusRow(host.name, reachable=False, error=f"inventory/pins: {e}")
    view = journal.host_view(host.name) if journal is not None else None
    try:
        probe = run_probe(remote or SshRemote(connect_timeout=timeout), host, full=True,
                          model_path=wants[0].model_path, front_port=settings.front_port,
                          timeout=timeout)
    except HostUnreachable as e:
        return StatusRow(host.name, reachable=False, error=str(e),
                         seconds=round(time.monotonic() - started, 2), bump=view)
    if probe.bare:
        return StatusRow(host.name, reachable=True, error="not deployed yet (no host-side "
                         "tool): run the deploy", seconds=round(time.monotonic() - started, 2),
                         bump=view)
    want, which = pick(wants, probe)
    row = build_row(want, probe, time.monotonic() - started)
    if view is not None and len(wants) > 1:
        matched = any(probe.state.get("digest") == w.current.pins.digest for w in wants)
        view = {**view, "runs": ("candidate" if which else "old") if matched else "unknown"}
    row.bump = view
    return row


def fleet_status(
    hosts: Sequence[InventoryHost],
    timeout: float = 20.0,
    pins_base: Path | None = None,
    probe: Callable[[InventoryHost], StatusRow] | None = None,
) -> list[StatusRow]:
    """Every host's row, probed concurrently, in inventory order.

    A host that does not answer within ``timeout`` (+ a margin for connecting) gets an
    unreachable row; the others are not held up by it.

    + hosts: from ``rigfleet.inventory.load_inventory``
    + timeout: seconds per host (connect, and the probe's answer)
    + probe: replaces ``host_status`` (tests)
    """
    check = probe or (lambda h: host_status(h, timeout, pins_base))
    if not hosts:
        return []
    pool = ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="status")
    futures = [pool.submit(check, h) for h in hosts]
    deadline = time.monotonic() + 2 * timeout + 5
    rows = []
    for h, fut in zip(hosts, futures, strict=True):
        try:
            rows.append(fut.result(timeout=max(0.1, deadline - time.monotonic())))
        except FutureTimeout:
            rows.append(StatusRow(h.name, reachable=False, error=f"no answer in {timeout:g}s"))
    # A hung connection must not hold the command: its thread is left to its socket timeout.
    pool.shutdown(wait=False, cancel_futures=True)
    return rows


def exit_status(rows: Sequence[StatusRow]) -> int:
    """0 all good, 1 some host drifted, 2 some host unreachable (or its data invalid)."""
    if any(not r.reachable or r.error for r in rows):
        return EXIT_UNREACHABLE
    if any(r.drift for r in rows):
        return EXIT_DRIFT
    return EXIT_OK
