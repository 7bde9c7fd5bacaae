"""``rigfleet status``: the hosts' rows (one probe each), then the balancers' rotation table;
the exit status says the worst found. ``--html FILE`` writes a page from the monitor's
Prometheus instead (docs/monitoring-rules.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rigfleet.balancer.status import balancer_rows
from rigfleet.cliargs import UsageError, fleet_options, select
from rigfleet.inventory import balancers, gpu_hosts
from rigfleet.ssh import SshRemote
from rigfleet.status.render import as_json, render_balancers, render_table
from rigfleet.status.rows import EXIT_ERROR, EXIT_OK, EXIT_UNREACHABLE, exit_status, fleet_status
from rigfleet.tables import show


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("status", parents=[fleet_options()],
                              help="one row per host: reachable, stack, pins, last gate, drift",
                              description="One row per host: what it runs and whether it "
                                          "drifted from the inventory + pins.")
    g = p.add_argument_group("page")
    g.add_argument("--html", metavar="FILE",
                   help="write a self-contained HTML page (per-host tokens/s over time, the "
                        "alerts) from the Prometheus of the inventory's monitors host, "
                        "instead of the table")
    g.add_argument("--hours", type=_hours, default=6.0, metavar="H",
                   help="the page's time window, hours back from now (default 6)")
    p.set_defaults(func=run, inventory_exit=EXIT_ERROR)


def _hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.25 <= value <= 720:
        raise argparse.ArgumentTypeError(f"--hours: {text}; allowed: 0.25 to 720")
    return value


def run(args: argparse.Namespace) -> int:
    from rigfleet.inventory import load_inventory  # looked up when run (tests stand it in)

    if args.html and args.json:
        raise UsageError("--html with --json: allowed: one of them (the page, or the rows "
                         "as JSON)")
    hosts = load_inventory(args.inventory)
    chosen = {h.name for h in select(hosts, args.limit, args.inventory)}
    if args.html:
        return write_page(args, hosts, chosen)
    rows = fleet_status([h for h in gpu_hosts(hosts) if h.name in chosen], timeout=args.timeout)
    remote = SshRemote(connect_timeout=args.timeout)
    lbs = [row for lb in balancers(hosts) if lb.name in chosen
           for row in balancer_rows(lb, hosts, remote, timeout=args.timeout)]
    show(args.json, as_json(rows, lbs),
         render_table(rows, f"rigfleet status ({args.inventory})"),
         *([render_balancers(lbs)] if lbs else []))
    return max(exit_status(rows), balancer_exit(lbs))


def write_page(args: argparse.Namespace, hosts: Sequence[Any], chosen: set[str]) -> int:
    """``--html FILE``: ask the monitor's Prometheus over SSH, render, write."""
    from rigfleet.monitor.page import PageInput, render
    from rigfleet.monitor.query import MonitorError, fetch, monitor_host

    err = Console(stderr=True)
    try:
        monitor = monitor_host(hosts, args.inventory)
        now = time.time()
        answers = fetch(SshRemote(connect_timeout=args.timeout), monitor, now=now,
                        hours=args.hours, timeout=args.timeout)
    except MonitorError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        return EXIT_ERROR
    serving = [h.name for h in gpu_hosts(hosts) if h.name in chosen]
    page = render(PageInput(hosts=serving, monitor=monitor.name, now=now, hours=args.hours,
                            answers=answers,
                            others=[h.name for h in hosts if h.name not in serving]))
    try:
        Path(args.html).write_text(page, encoding="utf-8")
    except OSError as e:
        err.print(f"[red]error:[/red] --html: {escape(args.html)}: {escape(e.strerror or str(e))}")
        return EXIT_ERROR
    alerts = len(answers.alerts.get("data", {}).get("alerts", []))
    print(f"wrote {args.html}: {len(serving)} host(s), {alerts} alert(s), "
          f"last {args.hours:g} h, from Prometheus on {monitor.name}")
    return EXIT_OK


def balancer_exit(rows: Sequence[Any]) -> int:
    """An unreadable balancer, or a stack with no host in rotation, counts as unreachable."""
    return EXIT_OK if all(r.ok for r in rows) else EXIT_UNREACHABLE
