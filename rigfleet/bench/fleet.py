"""What ``rigfleet bench`` benches (endpoint, stack, scale, history from the probe), and benching::

    targets = inventory_targets(load_inventory("inventory/home.py"), SshRemote())
    entries = bench_targets(targets, lambda t: BenchSettings(runs=5), progress)
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rigfleet.catalog import StackSpec
from rigfleet.commands import hosttool
from rigfleet.desired import DesiredHost
from rigfleet.endpoints import front_url, read_key
from rigfleet.errors import RigfleetError
from rigfleet.fleetview import each_host, view_host
from rigfleet.hostprobe import last_json
from rigfleet.hostside.bench import measure
from rigfleet.hostside.bench.baseline import Baseline, baseline_for
from rigfleet.hostside.bench.measure import Bench, BenchSettings
from rigfleet.hostside.bench.report import Entry
from rigfleet.hostside.records import ThroughputRecord
from rigfleet.hostside.verify.client import Client
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import Remote

HISTORY_N = 5  # as the gate's default throughput_history_n


class Progress(measure.Progress):
    """The bench's progress, told which target comes next; this one shows nothing."""

    def target(self, host: str) -> None:
        pass


@dataclass(frozen=True)
class Target:
    """One endpoint to bench, with what its figures stand beside (stack None: unknown)."""

    host: str
    url: str
    api_key: str | None = None
    stack: StackSpec | None = None
    scale: float = 1.0
    history: tuple[ThroughputRecord, ...] = ()
    note: str = ""
    error: str = ""
    ca_file: str | None = None

    @property
    def reference(self) -> dict[str, float]:
        if self.stack is None or self.stack.throughput is None:
            return {}
        return {k: v * self.scale for k, v in self.stack.throughput.reference.items()}

    def baseline(self) -> Baseline | None:
        if self.stack is None:
            return None
        ref = self.stack.throughput.reference if self.stack.throughput else {}
        return baseline_for(self.history, self.stack.name, ref, self.scale, HISTORY_N)


def inventory_targets(hosts: Sequence[InventoryHost], remote: Remote,
                      timeout: float = 60.0) -> list[Target]:
    """A target per host, asked at once: its front, key and CA, the stack it serves
    (``state.json``, else the inventory's), its history (the host probe)."""

    def target(host: InventoryHost) -> Target:
        view = view_host(remote, host, timeout=timeout)
        if view.want is None:
            raise RigfleetError(view.error or "no desired state")
        want, probe = view.want, view.probe
        url, key = front_url(host, want.settings), read_key(want.settings)
        serving = probe.state.get("stack") if probe else None
        stack = want.settings.catalog.get(serving) if isinstance(serving, str) and (
            serving in want.settings.catalog) else want.spec
        tls = want.settings.front_tls
        return Target(host.name, url, key, stack, want.settings.throughput_scale,
                      probe.throughput_history if probe else (),
                      "" if probe else f"no history: {view.error}",
                      ca_file=tls.ca_file if tls else None)

    return each_host(hosts, target,
                     lambda h, why: Target(h.name, "-", error=why.partition("\n")[0][:300]))


def bench_targets(targets: Sequence[Target], settings_for: Callable[[Target], BenchSettings],
                  progress: Progress | None = None) -> list[Entry]:
    """Bench each target in turn (one at a time: the bench's client must not compete with
    itself for this machine's CPU); a target with an error gets an entry with it."""
    progress = progress or Progress()
    out = []
    for t in targets:
        progress.target(t.host)
        if t.note:
            progress.note(t.note)
        if t.error:
            result = Bench(Client(t.url), BenchSettings(runs=0, warmup=0)).result
            out.append(Entry(t.host, t.stack.name if t.stack else None, result, error=t.error))
            continue
        result = Bench(Client(t.url, t.api_key, ca_file=t.ca_file), settings_for(t), progress).run()
        out.append(Entry(t.host, t.stack.name if t.stack else None, result, t.reference,
                         t.scale, t.baseline(), t.history, result.error))
    return out


def settings_for(target: Target, runs: int, warmup: int, concurrency: int | None,
                 depths: tuple[int, ...], timeout_s: float = 300.0) -> BenchSettings:
    """The concurrency run at the stack's max-num-seqs unless given (none for one stream)."""
    if concurrency is None:
        seqs = target.stack.max_num_seqs if target.stack else 0
        concurrency = seqs if seqs > 1 else 0
    return BenchSettings(runs=runs, warmup=warmup, timeout_s=timeout_s,
                         concurrency=concurrency, depths=depths)


def accept_baseline(remote: Remote, host: InventoryHost, want: DesiredHost, runs: int,
                    warmup: int, by: str = "") -> dict[str, Any]:
    """The host's JSON answer to ``rigfleet-host.pyz bench --accept-baseline``; raises
    ``HostUnreachable`` (SSH) or ``RuntimeError`` (refused, or nothing measured)."""
    by = by or f"{getpass.getuser()}@{socket.gethostname()}"
    command = hosttool.bench("--accept-baseline", "--scale", f"{want.settings.throughput_scale:g}",
                             "--by", by, "--runs", str(runs), "--warmup", str(warmup), "--json",
                             "--quiet")
    rc, out = remote.run(host, command, timeout=3600)
    data = last_json(out)
    if rc == 0 and data is not None and data.get("accepted"):
        return data
    raise RuntimeError(f"{host.name}: the host's bench did not record a baseline (exit {rc}): "
                       f"{out.strip()[-400:] or 'no output'}")
