"""``rigfleet bench``: decode speed of any endpoint, or of every host of an inventory.

    rigfleet bench --url URL [--api-key-file F|-] [--ca-file PEM] [--stack NAME] [--scale X]
    rigfleet bench --inventory inventory/home.py [--limit HOST|GROUP ...] [--timeout S]
    rigfleet bench --inventory inventory/home.py --accept-baseline HOST

What is measured and written, and the exit statuses: docs/bench.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import progress as rich_bar
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from rigfleet.bench.plot import plot
from rigfleet.catalog import CatalogError, StackSpec, builtin_catalog
from rigfleet.cliargs import EXIT_USAGE, UsageError, console, fleet_options, select
from rigfleet.commands import hosttool
from rigfleet.desired import DesiredHost, gate_profile, load_desired
from rigfleet.endpoints import front_url, read_key
from rigfleet.errors import RigfleetError
from rigfleet.fleetview import each_host, view_host
from rigfleet.hostprobe import last_json
from rigfleet.hostside.argtypes import count, positive
from rigfleet.hostside.bench import measure
from rigfleet.hostside.bench.baseline import Baseline, baseline_for, profile_baseline
from rigfleet.hostside.bench.cli import token_counts
from rigfleet.hostside.bench.measure import Bench, BenchSettings
from rigfleet.hostside.bench.report import Entry, cell, fleet_medians, report_dict, write
from rigfleet.hostside.records import ThroughputRecord, now_iso
from rigfleet.hostside.verify.client import CA_FILE_ENV, Client, check_ca_file, redact_url
from rigfleet.hostside.verify.profiles import FULL, Profile
from rigfleet.hostside.verify.runner import read_api_key
from rigfleet.inventory import InventoryHost, gpu_hosts, load_inventory
from rigfleet.resources import deployed_by
from rigfleet.ssh import Remote, SshRemote
from rigfleet.tables import Table, ratio, show

DEFAULT_DEPTHS = (16_000, 32_000, 64_000)
EXIT_OK, EXIT_UNMEASURED = 0, 1


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
    profile: Profile | None = None  # the host's gate profile for ``stack``

    @property
    def reference(self) -> dict[str, float]:
        thr = self.stack.throughput if self.stack else None
        return {k: v * self.scale for k, v in thr.reference.items()} if thr else {}

    def baseline(self) -> Baseline | None:
        """As the host's gate judges it (``--url``: as the default profile would)."""
        if self.profile is not None:
            return profile_baseline(self.history, self.profile)
        if self.stack is None:
            return None
        ref = self.stack.throughput.reference if self.stack.throughput else {}
        return baseline_for(self.history, self.stack.name, ref, self.scale,
                            FULL.throughput_history_n, FULL.throughput_history_min)


def inventory_targets(hosts: Sequence[InventoryHost], remote: Remote,
                      timeout: float = 60.0) -> list[Target]:
    """A target per host, asked at once: front, key, CA, the stack it serves, its history."""

    def target(host: InventoryHost) -> Target:
        view = view_host(remote, host, timeout=timeout)
        if view.want is None:
            raise RigfleetError(view.error or "no desired state")
        want, probe = view.want, view.probe
        serving = probe.state.get("stack") if probe else None
        stack = want.settings.catalog.get(serving) if isinstance(serving, str) and (
            serving in want.settings.catalog) else want.spec
        return Target(host.name, front_url(host, want.settings), read_key(want.settings), stack,
                      want.settings.throughput_scale, probe.throughput_history if probe else (),
                      "" if probe else f"no history: {view.error}",
                      ca_file=want.settings.front_tls.ca_file if want.settings.front_tls else None,
                      profile=gate_profile(want.settings, stack))

    return each_host(hosts, target,
                     lambda h, why: Target(h.name, "-", error=why.partition("\n")[0][:300]))


def bench_targets(targets: Sequence[Target], settings_for: Callable[[Target], BenchSettings],
                  progress: RichProgress | None = None) -> list[Entry]:
    """Bench each target in turn (they would compete for this CPU); errors become entries."""
    out = []
    for t in targets:
        if progress is not None:
            progress.target(t.host, t.note)
        settings = BenchSettings(runs=0, warmup=0) if t.error else settings_for(t)
        bench = Bench(Client(t.url, t.api_key, ca_file=t.ca_file), settings, progress)
        result = bench.result if t.error else bench.run()
        out.append(Entry(t.host, t.stack.name if t.stack else None, result, t.reference,
                         t.scale, t.baseline(), t.history, t.error or result.error))
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
                    warmup: int, by: str = "", timeout_s: float = 300.0) -> dict[str, Any]:
    """The host's answer to ``bench --accept-baseline``; ``RuntimeError`` when none recorded."""
    rc, out = remote.run(host, hosttool.bench(
        "--accept-baseline", "--scale", f"{want.settings.throughput_scale:g}", "--by",
        by or deployed_by(), "--runs", str(runs), "--warmup", str(warmup), "--json", "--quiet",
        "--timeout-s", f"{timeout_s:g}"), timeout=3600)
    data = last_json(out)
    if rc == 0 and data is not None and data.get("accepted"):
        return data
    raise RuntimeError(f"{host.name}: the host's bench did not record a baseline (exit {rc}): "
                       f"{out.strip()[-400:] or 'no output'}")


class RichProgress(measure.Progress):
    """The bench's progress bar, a task per target (``target`` says which comes next)."""

    def __init__(self, console: Console):
        self.console = console
        self.bar = rich_bar.Progress(
            rich_bar.TextColumn("[bold]{task.fields[host]}[/bold]"), rich_bar.BarColumn(),
            rich_bar.MofNCompleteColumn(), rich_bar.TextColumn("{task.description}"),
            rich_bar.TimeElapsedColumn(), console=console, transient=False)
        self.task: rich_bar.TaskID  # target() comes first
        self.host = ""

    def target(self, host: str, note: str = "") -> None:
        self.host = host
        self.task = self.bar.add_task("starting", total=None, host=host)
        if note:
            self.note(note)

    def begin(self, total: int) -> None:
        self.bar.update(self.task, total=total, description="warm-up")

    def step(self, label: str) -> None:
        self.bar.update(self.task, advance=1, description=label)

    def note(self, text: str) -> None:
        self.console.print(f"[yellow]{escape(self.host)}:[/yellow] {escape(text)}")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", parents=[fleet_options(inventory_default=None,
                                        timeout_help="(--inventory) seconds per host's SSH")],
        help="decode tok/s, CV, TTFT, MTP acceptance of an endpoint or every host",
        description="Decode speed of any OpenAI-compatible endpoint, or of every host of an "
                    "inventory, beside the fleet median, the stack's reference and the host's "
                    "history (docs/bench.md).")
    p.add_argument("--url", help="any OpenAI-compatible endpoint, e.g. http://rig-a:8000 "
                                 "(instead of --inventory: bench every host's front)")
    p.add_argument("--accept-baseline", metavar="HOST",
                   help="(--inventory) bench HOST's active stack on the host and record it as "
                        "its throughput baseline there")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="(--url) file holding the API key, '-' reads stdin")
    p.add_argument("--ca-file", metavar="PEM",
                   help="(--url) trust these certificates for https://, as rigfleet verify "
                        f"does (default: ${CA_FILE_ENV}, else the system's trust store; an "
                        "inventory's TLS fronts use their host data's CA)")
    p.add_argument("--stack", help="(--url) the stack the endpoint serves: its reference "
                                   "figures and max-num-seqs")
    p.add_argument("--scale", type=positive, default=None,
                   help="(--url) the endpoint's throughput_scale against RTX 3090s (1)")
    p.add_argument("--runs", type=count, default=5, help="measured runs per shape (5)")
    p.add_argument("--warmup", type=count, default=3, help="warm-up rounds first (3)")
    p.add_argument("--concurrency", type=count, default=None,
                   help="streams of the concurrency run (default: the stack's max-num-seqs)")
    p.add_argument("--depths", type=token_counts, default=None,
                   help="context depths in tokens (default 16000,32000,64000; those beyond "
                        "max-model-len are skipped)")
    p.add_argument("--no-depths", action="store_true", help="no depth runs")
    p.add_argument("--timeout-s", type=positive, default=300.0, help="per request (300)")
    p.add_argument("--out", type=Path, default=Path("bench-reports"),
                   help="where the reports go (default bench-reports/)")
    p.add_argument("--no-plot", action="store_true", help="no PNG")
    p.set_defaults(func=run, inventory_exit=EXIT_USAGE)


def run(args: argparse.Namespace) -> int:
    if bool(args.url) == bool(args.inventory):
        raise UsageError("say what to bench: --url URL (one endpoint) or --inventory FILE "
                         "(every host's front), not both")
    if args.url and (args.limit or args.accept_baseline):
        raise UsageError("--limit and --accept-baseline need --inventory (they name hosts)")
    if args.inventory and (args.stack or args.api_key_file or args.ca_file
                           or args.scale is not None):
        raise UsageError("--stack, --scale, --api-key-file and --ca-file are for --url (an "
                         "inventory names them)")
    if args.accept_baseline and (args.limit or args.concurrency is not None
                                 or args.depths is not None or args.no_depths):
        raise UsageError("--limit, --concurrency, --depths and --no-depths are not for "
                         "--accept-baseline HOST (it names its host and records the gate's "
                         "shapes, narrative and code)")
    depths = () if args.no_depths else tuple(DEFAULT_DEPTHS if args.depths is None else args.depths)
    if args.url:
        try:
            spec = builtin_catalog().get(args.stack) if args.stack else None
            key = read_api_key(args.api_key_file) if args.api_key_file else None
            check_ca_file(args.ca_file)
        except (CatalogError, ValueError) as e:
            raise UsageError(str(e)) from None
        ca = str(Path(args.ca_file).expanduser().absolute()) if args.ca_file else None
        targets = [Target(redact_url(args.url), args.url, key, spec, args.scale or 1.0,
                          ca_file=ca)]
    else:
        hosts = {h.name: h for h in load_inventory(args.inventory)}
        if args.accept_baseline:
            if args.accept_baseline not in hosts:
                raise UsageError(f"{args.inventory}: --accept-baseline {args.accept_baseline}: "
                                 f"no such host; allowed: {', '.join(hosts)}")
            return _accept(args, hosts[args.accept_baseline], console)
        try:
            chosen = gpu_hosts(select(list(hosts.values()), args.limit, args.inventory))
            targets = inventory_targets(chosen, SshRemote(connect_timeout=args.timeout),
                                        args.timeout)
        except RigfleetError as e:  # no rig: no bench
            raise UsageError(str(e)) from None
    try:  # before the bench runs, not after its minutes are spent
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {args.out}: {e.strerror or e}; allowed: a directory this "
                         "user can create and write") from None
    started = now_iso(suffix="Z")
    progress = RichProgress(console)
    with progress.bar:
        entries = bench_targets(targets, lambda t: settings_for(
            t, args.runs, args.warmup, args.concurrency, depths, args.timeout_s), progress)
    try:
        paths = write(entries, args.out, started)
    except OSError as e:
        raise RuntimeError(f"--out {args.out}: cannot write the reports: "
                           f"{e.strerror or e}") from None
    png = None
    if not args.no_plot:
        png, problem = plot(entries, paths[0].with_suffix(".png"))
        if problem:
            console.print(f"[yellow]{escape(problem)}[/yellow]")
    show(args.json, report_dict(entries, started), render(entries))
    if not args.json:
        console.print("reports: " + " ".join(str(p) for p in (*paths, *([png] if png else []))))
    measured = all(any(s.figures() for s in e.result.shapes.values()) for e in entries)
    return EXIT_OK if measured else EXIT_UNMEASURED


def _accept(args: argparse.Namespace, host: InventoryHost, err: Console) -> int:
    want = load_desired(host.name, host.data)
    err.print(f"{host.name}: benching its active stack on the host "
              f"({args.warmup} warm-up round(s), {args.runs} run(s) per shape) ...")
    data = accept_baseline(SshRemote(connect_timeout=args.timeout), host, want, args.runs,
                           args.warmup, timeout_s=args.timeout_s)
    show(args.json, data)
    if args.json:
        return EXIT_OK
    rec = data.get("accepted") or {}
    shapes = rec.get("shapes") or {}
    figs = ", ".join(f"{k} {v.get('decode'):.1f} tok/s" for k, v in shapes.items()
                     if isinstance(v, dict) and isinstance(v.get("decode"), int | float))
    Console().print(f"{host.name}: accepted {figs} as {data.get('stack')}'s baseline "
                    f"({rec.get('at')}); the gate's rolling median restarts from it")
    return EXIT_OK


def render(entries: list[Entry]) -> Table:
    """A line per target: decode, CV, acceptance, narrative vs reference, fleet and baseline."""
    medians = fleet_medians(entries)
    table = Table("rigfleet bench: decode tok/s", [
        "host", "stack", "narrative", "code", "CV n/c", "acceptance", "vs ref", "vs fleet",
        "vs base"])
    for e in entries:
        n, c = e.result.shapes.get("narrative"), e.result.shapes.get("code")
        acc = c.acceptance if c else None
        cv = (f"{cell(n.decode_cv if n else None, '.1%')}/"
              f"{cell(c.decode_cv if c else None, '.1%')}")
        base = e.baseline.figures.get("narrative") if e.baseline else None
        nd = n.decode_mean if n else None
        table.row(e.host, e.stack or "-", cell(nd), cell(c.decode_mean if c else None), cv,
                  ("/".join(f"{x:.0%}" for x in acc.per_position) or str(acc)) if acc
                  else "unknown",
                  ratio(nd, e.reference.get("narrative")),
                  ratio(nd, medians.get(e.stack or "", {}).get("narrative")), ratio(nd, base))
        if e.error:
            table.note(e.host, Text(e.error, style="red"))
        if (cc := e.result.concurrency) is not None:
            table.note(e.host, f"{cc.streams} streams: {cell(cc.per_stream_decode)} tok/s each, "
                               f"{cell(cc.aggregate_tok_s)} in all")
        if depths := [d for d in e.result.depths if d.run is not None]:
            table.note(e.host, "depth: " + ", ".join(
                f"{d.depth // 1000}K {cell(d.run.decode_tok_s if d.run else None)}"
                for d in depths))
        if c is not None and c.acceptance is None and c.acceptance_note:
            table.note(e.host, f"acceptance {c.acceptance_note}")
    return table

