"""The flags and host lookup the operator verbs (``rollback``, ``logs``, ``lock``) share.

One function adds the common flags, so a shared parent parser can replace it in one place::

    p = subparsers.add_parser("logs", ...)
    add_common(p)                      # --inventory, --timeout (and --limit with limit=True)
    host = one_host(args.inventory, args.host)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rigfleet.inventory import InventoryHost, load_inventory

DEFAULT_INVENTORY = "inventory/home.py"


def add_common(p: argparse.ArgumentParser, *, limit: bool = False, json: bool = True) -> None:
    """``--inventory``, ``--timeout`` and (optionally) ``--limit``/``--json`` on ``p``."""
    p.add_argument("--inventory", default=DEFAULT_INVENTORY,
                   help=f"pyinfra inventory file (default {DEFAULT_INVENTORY})")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="SSH connect timeout per host, seconds (default 10)")
    if limit:
        p.add_argument("--limit", action="append", default=[], metavar="HOST",
                       help="only this host or inventory group (repeatable)")
    if json:
        p.add_argument("--json", action="store_true", help="print JSON on stdout")


def inventory_hosts(path: str) -> list[InventoryHost]:
    """The inventory's hosts; an inventory without any is an error naming the file."""
    hosts = load_inventory(path)
    if not hosts:
        raise ValueError(f"{path}: no hosts; allowed: an inventory that lists at least one "
                         "host (is the path right?)")
    return hosts


def one_host(path: str, name: str) -> InventoryHost:
    """Host ``name`` of the inventory at ``path`` (an error lists the hosts there)."""
    hosts = inventory_hosts(path)
    for h in hosts:
        if h.name == name:
            return h
    raise ValueError(f"{path}: host: {name!r} is not in the inventory; allowed: "
                     f"{', '.join(h.name for h in hosts)}")


def limited(hosts: Sequence[InventoryHost], limit: Sequence[str], path: str) -> set[str]:
    """The names ``--limit`` picks (host names or group names); every name when empty."""
    if not limit:
        return {h.name for h in hosts}
    names = {h.name for h in hosts}
    groups = {g for h in hosts for g in h.groups}
    unknown = [x for x in limit if x not in names and x not in groups]
    if unknown:
        raise ValueError(f"{path}: --limit: {', '.join(unknown)}; allowed: a host "
                         f"({', '.join(sorted(names))}) or group ({', '.join(sorted(groups))})")
    return {h.name for h in hosts if h.name in limit or set(h.groups) & set(limit)}
