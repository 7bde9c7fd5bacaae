"""``rigfleet testbed up|status|down``: the simulated fleet's command line.

The product's ``rigfleet`` command registers this parser when the testbed package is
installed (``pip install -e ./testbed``, which ``make demo`` and ``make test`` do); the same
commands are also the ``rigfleet-testbed`` console script::

    rigfleet testbed up --hosts 2
    rigfleet testbed up --hosts 3 --balancer     # + lb1, the fleet endpoint (HAProxy)
    rigfleet testbed up --hosts 3 --os host3=debian12 --sudo-user host2 \
        --hardware host1:secure_boot=1
    rigfleet testbed mok-enroll host1     # the person at host1's console enrols the MOK
    rigfleet-testbed status
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from rigfleet_testbed import hardware

console = Console(stderr=True, highlight=False)


def _log(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


def run(args: argparse.Namespace) -> int:
    """Carry out ``testbed <action>``; a ``TestbedError`` is printed, not raised."""
    from rigfleet_testbed import fleet, hostspec
    from rigfleet_testbed.layout import INVENTORY

    try:
        if args.action == "up":
            started = time.monotonic()
            overrides = [hardware.parse_override(spec) for spec in args.hardware]
            oses = [hostspec.parse_os(spec) for spec in args.os]
            slots = fleet.up(fleet.UpOptions(hosts=args.hosts, hardware_overrides=overrides,
                                             oses=oses, sudo=list(args.sudo_user),
                                             sim_speedup=args.sim_speedup,
                                             balancer=args.balancer,
                                             tls=list(args.tls)), _log)
            _log(f"testbed up: {len(slots)} host(s) in {time.monotonic() - started:.1f}s; "
                 f"{INVENTORY.relative_to(INVENTORY.parents[1])} written")
            _print_status(fleet.status())
        elif args.action == "mok-enroll":
            fleet.mok_enroll(args.host, _log, reboot=not args.no_reboot)
        elif args.action == "down":
            fleet.down(_log)
            _log("testbed down: containers, network and volumes removed")
        else:
            _print_status(fleet.status())
    except (fleet.TestbedError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    return 0


def _print_status(rows: list[dict[str, Any]]) -> None:
    table = Table(title="rigfleet testbed")
    cols = ("name", "state", "os", "ports", "systemd", "driver")
    for col in cols:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(row.get(col, "")) for col in cols))
    Console().print(table if rows else "no testbed containers")


def _speedup(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"--sim-speedup {value!r}: allowed a number above 0")
    return x


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``testbed`` on a CLI's subparsers (``rigfleet.cli`` calls this)."""
    tb = subparsers.add_parser("testbed", help="the simulated fleet (containers on this machine)")
    tb_sub = tb.add_subparsers(dest="action", required=True)
    tb_up = tb_sub.add_parser("up", help="build and start the simulated fleet")
    tb_up.add_argument("--hosts", type=int, default=2, help="number of hosts (1-12, default 2)")
    tb_up.add_argument("--hardware", action="append", default=[], metavar="HOST:KEY=V,...",
                       help="per-host hardware override, e.g. host2:cards=1,memory_mib=20480 "
                            "or host1:secure_boot=1[,mok_enrolled=1] "
                            "or host2:gpu1_pcie_gen_max=3,gpu1_pcie_width_max=4")
    tb_up.add_argument("--sim-speedup", type=_speedup, default=hardware.DEFAULT_SIM_SPEEDUP,
                       metavar="X", help="serving simulators run X times faster than a real "
                       f"rig (default {hardware.DEFAULT_SIM_SPEEDUP:g}; 1 = real-rig tok/s)")
    tb_up.add_argument("--os", action="append", default=[], metavar="HOST=OS",
                       help="a host's Debian release: debian13 (default) or debian12")
    tb_up.add_argument("--tls", action="append", default=[], metavar="HOST",
                       help="HOST's front serves TLS with a certificate from the testbed's CA "
                            "(the inventory names the files, front_tls_*)")
    tb_up.add_argument("--balancer", action="store_true",
                       help="also a balancer host lb1 (plain Debian, no GPU) in the inventory "
                            "group 'balancers': HAProxy, the fleet endpoint")
    tb_up.add_argument("--sudo-user", action="append", default=[], metavar="HOST",
                       help="log into HOST as 'rig' with passwordless sudo instead of root")
    tb_mok = tb_sub.add_parser("mok-enroll", help="be the person at a host's console who "
                               "enrols the pending MOK request (reboots the host)")
    tb_mok.add_argument("host", help="e.g. host1")
    tb_mok.add_argument("--no-reboot", action="store_true",
                        help="only be there at the next boot (which something else starts)")
    tb_sub.add_parser("status", help="show the simulated fleet")
    tb_sub.add_parser("down", help="remove every container, network and volume it made")
    tb.set_defaults(func=run)
    return tb


def main(argv: Sequence[str] | None = None) -> int:
    """``rigfleet-testbed up|status|down``."""
    parser = argparse.ArgumentParser(prog="rigfleet")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["testbed", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
