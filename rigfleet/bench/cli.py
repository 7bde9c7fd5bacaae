"""``rigfleet bench``: decode speed of any endpoint, or of every host of an inventory.

    rigfleet bench --url URL [--api-key-file F|-] [--ca-file PEM] [--stack NAME] [--scale X]
    rigfleet bench --inventory inventory/home.py [--limit HOST|GROUP ...] [--timeout S]
    rigfleet bench --inventory inventory/home.py --accept-baseline HOST

What is measured and written: docs/bench.md. Exit status: 0 all measured, 1 something measured
nothing, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich import progress as rich_bar
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from rigfleet.bench import fleet
from rigfleet.bench.plot import plot
from rigfleet.cliargs import EXIT_USAGE, fleet_options
from rigfleet.hostside.bench.cli import count, positive, token_counts
from rigfleet.hostside.bench.report import Entry, cell, fleet_medians, report_dict, write
from rigfleet.hostside.verify.client import CA_FILE_ENV
from rigfleet.hostside.verify.runner import read_api_key
from rigfleet.tables import Table, ratio, show

DEFAULT_DEPTHS = (16_000, 32_000, 64_000)
EXIT_OK, EXIT_UNMEASURED = 0, 1


class RichProgress(fleet.Progress):
    def __init__(self, console: Console):
        self.console = console
        self.bar = rich_bar.Progress(
            rich_bar.TextColumn("[bold]{task.fields[host]}[/bold]"), rich_bar.BarColumn(),
            rich_bar.MofNCompleteColumn(), rich_bar.TextColumn("{task.description}"),
            rich_bar.TimeElapsedColumn(), console=console, transient=False)
        self.task: rich_bar.TaskID | None = None
        self.host = ""

    def target(self, host: str) -> None:
        self.host = host
        self.task = self.bar.add_task("starting", total=None, host=host)

    def begin(self, total: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, total=total, description="warm-up")

    def step(self, label: str) -> None:
        if self.task is not None:
            self.bar.update(self.task, advance=1, description=label)

    def note(self, text: str) -> None:
        self.console.print(f"[yellow]{self.host}:[/yellow] {text}")


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
    p.add_argument("--scale", type=positive, default=1.0,
                   help="(--url) the endpoint's throughput_scale against RTX 3090s (1)")
    p.add_argument("--runs", type=count, default=5, help="measured runs per shape (5)")
    p.add_argument("--warmup", type=count, default=3, help="warm-up rounds first (3)")
    p.add_argument("--concurrency", type=count, default=None,
                   help="streams of the concurrency run (default: the stack's max-num-seqs)")
    p.add_argument("--depths", type=token_counts, default=DEFAULT_DEPTHS,
                   help="context depths in tokens (default 16000,32000,64000; those beyond "
                        "max-model-len are skipped)")
    p.add_argument("--no-depths", action="store_true", help="no depth runs")
    p.add_argument("--timeout-s", type=positive, default=300.0, help="per request (300)")
    p.add_argument("--out", type=Path, default=Path("bench-reports"),
                   help="where the reports go (default bench-reports/)")
    p.add_argument("--no-plot", action="store_true", help="no PNG")
    p.set_defaults(func=run, inventory_exit=EXIT_USAGE)


def run(args: argparse.Namespace) -> int:
    from rigfleet.catalog import CatalogError, builtin_catalog
    from rigfleet.cliargs import UsageError, select
    from rigfleet.errors import RigfleetError
    from rigfleet.hostside.verify.report import now_iso
    from rigfleet.inventory import gpu_hosts, load_inventory
    from rigfleet.ssh import SshRemote

    err = Console(stderr=True, highlight=False)
    if bool(args.url) == bool(args.inventory):
        raise UsageError("say what to bench: --url URL (one endpoint) or --inventory FILE "
                         "(every host's front), not both")
    if args.url and (args.limit or args.accept_baseline):
        raise UsageError("--limit and --accept-baseline need --inventory (they name hosts)")
    if args.inventory and (args.stack or args.api_key_file or args.ca_file):
        raise UsageError("--stack, --api-key-file and --ca-file are for --url (an inventory "
                         "names them)")
    depths = () if args.no_depths else tuple(args.depths)
    if args.url:
        try:
            spec = builtin_catalog().get(args.stack) if args.stack else None
            key = read_api_key(args.api_key_file) if args.api_key_file else None
        except (CatalogError, ValueError) as e:
            raise UsageError(str(e)) from None
        ca = str(Path(args.ca_file).expanduser().absolute()) if args.ca_file else None
        targets = [fleet.Target(args.url, args.url, key, spec, args.scale, ca_file=ca)]
    else:
        hosts = {h.name: h for h in load_inventory(args.inventory)}
        if args.accept_baseline:
            if args.accept_baseline not in hosts:
                raise UsageError(f"{args.inventory}: --accept-baseline {args.accept_baseline}: "
                                 f"no such host; allowed: {', '.join(hosts)}")
            return _accept(args, hosts[args.accept_baseline], err)
        try:
            chosen = gpu_hosts(select(list(hosts.values()), args.limit, args.inventory))
            targets = fleet.inventory_targets(chosen, SshRemote(connect_timeout=args.timeout))
        except RigfleetError as e:  # no rig: no bench
            raise UsageError(str(e)) from None
    started = now_iso()
    progress = RichProgress(err)
    with progress.bar:
        entries = fleet.bench_targets(targets, lambda t: fleet.settings_for(
            t, args.runs, args.warmup, args.concurrency, depths, args.timeout_s), progress)
    paths = write(entries, args.out, started)
    png = None
    if not args.no_plot:
        png, problem = plot(entries, paths[0].with_suffix(".png"))
        if problem:
            err.print(f"[yellow]{escape(problem)}[/yellow]")
    show(args.json, report_dict(entries, started), render(entries))
    if not args.json:
        err.print("reports: " + " ".join(str(p) for p in (*paths, *([png] if png else []))))
    measured = all(any(s.figures() for s in e.result.shapes.values()) for e in entries)
    return EXIT_OK if measured else EXIT_UNMEASURED


def _accept(args: argparse.Namespace, host: Any, err: Console) -> int:
    from rigfleet.desired import load_desired
    from rigfleet.ssh import SshRemote

    want = load_desired(host.name, host.data)
    err.print(f"{host.name}: benching its active stack on the host "
              f"({args.warmup} warm-up round(s), {args.runs} run(s) per shape) ...")
    data = fleet.accept_baseline(SshRemote(), host, want, args.runs, args.warmup)
    if args.json:
        print(json.dumps(data, indent=2))
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
                  "/".join(f"{x:.0%}" for x in acc.per_position) if acc else "unknown",
                  ratio(nd, e.reference.get("narrative")),
                  ratio(nd, medians.get(e.stack or "", {}).get("narrative")), ratio(nd, base))
        if e.error:
            table.note(e.host, Text(e.error, style="red"))
        if e.result.concurrency is not None:
            cc = e.result.concurrency
            table.note(e.host, f"{cc.streams} streams: {cell(cc.per_stream_decode)} tok/s each, "
                               f"{cell(cc.aggregate_tok_s)} in all")
        depths = [d for d in e.result.depths if d.run is not None]
        if depths:
            table.note(e.host, "depth: " + ", ".join(
                f"{d.depth // 1000}K {cell(d.run.decode_tok_s if d.run else None)}"
                for d in depths))
        if c is not None and c.acceptance is None and c.acceptance_note:
            table.note(e.host, f"acceptance {c.acceptance_note}")
    return table

