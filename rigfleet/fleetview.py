"""The fleet as the commands see it: one thread pool (``each_host``), one rule for error rows
(bad data or pins, an SSH failure: a row saying why, never an exception), one way to probe a
host for what it should run (``probe_for``)::

    views = fleet_view(gpu_hosts(hosts), SshRemote(connect_timeout=20), timeout=20)
    rows = each_host(hosts, one_row, lambda host, why: Row(host.name, error=why), timeout=20)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TypeVar

from rigfleet.desired import DesiredHost, load_desired
from rigfleet.errors import RigfleetError
from rigfleet.hostprobe import HostProbe, run_probe
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import HostUnreachable, Remote

WORKERS = 32  # hosts asked at once
CONNECT_MARGIN_S = 5.0  # on top of twice the per-host timeout, before a host is given up

T = TypeVar("T")


@dataclass(frozen=True)
class HostView:
    """One host: what it should run (``want``) and its probe, or why there is none."""

    host: InventoryHost
    want: DesiredHost | None = None
    probe: HostProbe | None = None
    error: str | None = None


def each_host(hosts: Sequence[InventoryHost], fn: Callable[[InventoryHost], T],
              error_row: Callable[[InventoryHost, str], T], *,
              timeout: float | None = None) -> list[T]:
    """``fn(host)`` for every host at once, in inventory order; an error, or no answer after
    twice ``timeout`` plus ``CONNECT_MARGIN_S``, becomes ``error_row(host, why)`` (a hung
    thread is left to its socket timeout)."""

    def guarded(host: InventoryHost) -> T:
        try:
            return fn(host)
        except (RigfleetError, OSError, ValueError) as e:
            return error_row(host, str(e))

    if not hosts:
        return []
    pool = ThreadPoolExecutor(max_workers=min(WORKERS, len(hosts)), thread_name_prefix="fleet")
    futures = [pool.submit(guarded, h) for h in hosts]
    end = None if timeout is None else time.monotonic() + 2 * timeout + CONNECT_MARGIN_S
    rows = []
    for host, fut in zip(hosts, futures, strict=True):
        try:
            rows.append(fut.result(None if end is None else max(0.1, end - time.monotonic())))
        except FutureTimeout:
            rows.append(error_row(host, f"no answer in {timeout:g}s"))
    pool.shutdown(wait=end is None, cancel_futures=True)
    return rows


def probe_for(remote: Remote, host: InventoryHost, want: DesiredHost, *, timeout: float,
              doctor_load_s: float | None = None) -> HostProbe:
    """The host's full probe for what ``want`` serves; raises ``HostUnreachable``."""
    return run_probe(remote, host, full=True, model_path=want.model_path,
                     front_port=want.settings.front_port, timeout=timeout,
                     doctor_load_s=doctor_load_s)


def view_host(remote: Remote, host: InventoryHost, *, timeout: float,
              doctor_load_s: float | None = None) -> HostView:
    """One host's view: its data and pins, then its probe (a service host: an error row)."""
    if not host.kind.gpu:
        return HostView(host, error=f"{host.name}: not a GPU host (groups "
                        f"{', '.join(host.groups)}): no stack to probe")
    try:
        want = load_desired(host.name, host.data)
    except RigfleetError as e:
        return HostView(host, error=str(e))
    try:
        probe = probe_for(remote, host, want, timeout=timeout, doctor_load_s=doctor_load_s)
    except HostUnreachable as e:
        return HostView(host, want, error=str(e))
    return HostView(host, want, probe)


def fleet_view(hosts: Sequence[InventoryHost], remote: Remote, *, timeout: float,
               doctor_load_s: float | None = None) -> list[HostView]:
    return each_host(
        hosts, lambda h: view_host(remote, h, timeout=timeout, doctor_load_s=doctor_load_s),
        lambda h, why: HostView(h, error=why), timeout=timeout)


def probe_or_why(probe: Callable[[str], HostProbe], host: str) -> HostProbe | str:
    try:
        return probe(host)
    except HostUnreachable as e:
        return str(e)


def reachability(remote: Remote, hosts: Sequence[InventoryHost]) -> dict[str, str | None]:
    """host name -> None (SSH works) or the reason, all hosts asked at once."""
    answers = each_host(hosts, remote.reachable, lambda h, why: why)
    return {h.name: a for h, a in zip(hosts, answers, strict=True)}
