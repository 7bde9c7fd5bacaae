"""The options every fleet command shares, and the rules they keep::

    p = sub.add_parser("status", parents=[fleet_options()], help=...)
    hosts = fleet_hosts(args)          # the inventory with --limit applied; never empty
    add_yes(p, "roll out")             # commands that install, reboot or swap
    confirm(args, "roll 3 host(s)")    # --yes, else ask; no terminal: refuse, naming --yes

``UsageError`` (an unknown ``--limit``, a refusal to ask) exits 2, as argparse does.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from rigfleet import inventory as _inventory
from rigfleet.errors import RigfleetError
from rigfleet.hostside.argtypes import positive
from rigfleet.inventory import InventoryError, InventoryHost
from rigfleet.resources import PROJECT_ROOT

DEFAULT_INVENTORY = "inventory/home.py"
EXIT_USAGE = 2
# soft_wrap: a message is one line however long (a path is never broken for the width).
console = Console(stderr=True, highlight=False, soft_wrap=True)


class UsageError(RigfleetError, ValueError):
    """Bad arguments: the message says what is allowed; the CLI exits 2."""


def log(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; an expected error (it says what to do) is one line, not a trace:
    2 for a ``UsageError``, else 1 (an unreadable inventory: the command's ``inventory_exit``)."""
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, RuntimeError, RigfleetError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        if isinstance(exc, UsageError):
            return EXIT_USAGE
        return getattr(args, "inventory_exit", 1) if isinstance(exc, InventoryError) else 1


def fleet_options(*, inventory_default: str | None = DEFAULT_INVENTORY, timeout: float = 20.0,
                  timeout_help: str = "seconds per host") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("fleet options")
    g.add_argument("--inventory", default=inventory_default,
                   metavar="FILE", help="pyinfra inventory file"
                   + (f" (default {inventory_default})" if inventory_default else ""))
    g.add_argument("--limit", action="append", default=[], metavar="HOST|GROUP",
                   help="only this host, or this inventory group's hosts (repeatable)")
    g.add_argument("--json", action="store_true", help="print JSON on stdout, not a table")
    g.add_argument("--timeout", type=positive, default=timeout, metavar="S",
                   help=f"{timeout_help} (default {timeout:g})")
    return p


def ssh_command(subparsers: Any, name: str, help: str, doc: str) -> argparse.ArgumentParser:
    """A command over SSH: ``doc``'s first line describes it, the rest follows as written."""
    first, *rest = doc.splitlines()
    return subparsers.add_parser(name, help=help, description=first, epilog="\n".join(rest),
                                 parents=[fleet_options(timeout=10.0,
                                                        timeout_help="seconds per SSH connect")],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def host_command(subparsers: Any, name: str, help: str, doc: str) -> argparse.ArgumentParser:
    """An ``ssh_command`` about one inventory host."""
    p = ssh_command(subparsers, name, help, doc)
    p.add_argument("host", metavar="HOST", help="an inventory host")
    return p


def one_or_more(text: str) -> int:
    """An integer >= 1 (hosts per batch, failed hosts that stop a rollout)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: an integer >= 1")
    return int(text)


def add_rollout(p: argparse.ArgumentParser, batch: str = "--batch-size",
                batch_help: str = "hosts per batch after the canary (default 1)",
                canary: bool = True) -> None:
    """The options of a command that deploys hosts batch by batch (bump, rollback, roll)."""
    p.add_argument(batch, type=one_or_more, default=1, metavar="N", help=batch_help)
    p.add_argument("--max-failures", type=one_or_more, default=1, metavar="N",
                   help="stop after this many failed hosts (default 1"
                   + ("; a failed canary always stops)" if canary else ")"))
    p.add_argument("--deploy", default=str(PROJECT_ROOT / "deploy.py"),
                   help="the deploy file (default: this checkout's deploy.py)")
    p.add_argument("--dry", action="store_true", help="print the plan; change nothing")


def add_yes(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--yes", "-y", action="store_true",
                   help=f"{what} without asking (needed when no terminal can answer)")


def select(hosts: Sequence[InventoryHost], limits: Sequence[str],
           inventory: str) -> list[InventoryHost]:
    """``hosts`` narrowed to ``--limit`` (host names or group names), in inventory order."""
    if not limits:
        return list(hosts)
    names = {h.name for h in hosts}
    groups = {g for h in hosts for g in h.groups}
    if unknown := [x for x in limits if x not in names and x not in groups]:
        raise UsageError(f"{inventory}: --limit: {', '.join(unknown)}; allowed: a host "
                         f"({', '.join(h.name for h in hosts)}) or a group "
                         f"({', '.join(sorted(groups)) or 'none'})")
    wanted = set(limits)
    return [h for h in hosts if h.name in wanted or wanted & set(h.groups)]


def fleet_hosts(args: argparse.Namespace) -> list[InventoryHost]:
    """The inventory's hosts with ``--limit`` applied (``InventoryError`` when it has none)."""
    return select(_inventory.load_inventory(args.inventory), args.limit, args.inventory)


def one_host(args: argparse.Namespace) -> InventoryHost:
    """The inventory host ``args.host`` names (within ``--limit`` when given)."""
    hosts = fleet_hosts(args)
    if (host := next((h for h in hosts if h.name == args.host), None)) is not None:
        return host
    raise UsageError(f"{args.inventory}: host: {args.host!r} is not in the inventory"
                     f"{' within --limit' if args.limit else ''}; allowed: "
                     f"{', '.join(h.name for h in hosts)}")


def confirm(args: argparse.Namespace, action: str) -> None:
    """Go on with ``--yes`` or a "y" typed at the terminal; otherwise raise ``UsageError``."""
    if getattr(args, "yes", False):
        return
    if not sys.stdin.isatty():
        raise UsageError(f"not a terminal, nobody to ask whether to {action}: pass --yes")
    try:
        answer = input(f"{action}? [y/N] ")
    except EOFError:  # Ctrl-D at the prompt: no
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError(f"not confirmed; nothing changed (pass --yes to {action} without "
                         "asking)")
