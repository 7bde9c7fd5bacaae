"""``rigfleet status --inventory inventory/home.py [--json] [--timeout 20]``.

For every host, concurrently, one SSH connection runs the host probe (``rigfleet-host.pyz
probe --full``); the drift against inventory + pins is decided on this side
(``rigfleet.status.drift``). The exit status says the worst found (``rigfleet.status.rows``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from rigfleet.status.render import render_json, render_table
from rigfleet.status.rows import EXIT_ERROR, exit_status, fleet_status


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``rigfleet status`` on the CLI's subparsers (``cli.py`` calls this)."""
    p = subparsers.add_parser(
        "status",
        help="one row per host: reachable, stack, pins, last gate, drift",
        description="One row per host: what it runs and whether it drifted from the "
                    "inventory + pins.",
    )
    p.add_argument("--inventory", default="inventory/home.py", help="pyinfra inventory file")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per host (default 20)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """``rigfleet status``: print the fleet's rows; the exit status says the worst found."""
    from rigfleet.inventory import InventoryError, load_inventory

    try:
        hosts = load_inventory(args.inventory)
    except InventoryError as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        return EXIT_ERROR
    rows = fleet_status(hosts, timeout=args.timeout)
    if args.json:
        print(render_json(rows))
    else:
        render_table(rows, f"rigfleet status ({args.inventory})").print(Console())
    return exit_status(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rigfleet.status --inventory ...``: the same command without ``cli.py``."""
    parser = argparse.ArgumentParser(prog="rigfleet")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["status", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))
