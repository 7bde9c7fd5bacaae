"""``rigfleet rollback``: back to an earlier pin set from the pins file's history, canary first.

A rollback is a bump whose candidate is an earlier pin set: the stacks' pins at serial ``N``
are rebuilt from ``pins.yaml``'s history (each bump or rollback entry records the stacks' pins
before and after it), then the bump's engine rolls them out (``rigfleet.bump``: the canary,
then batches, each host through the swap gate; the journal; the pins file written for what
promoted, with a history entry ``action: rollback``, ``to_serial: N``)::

    rigfleet rollback --inventory inventory/home.py --dry          # the plan, nothing runs
    rigfleet rollback --inventory inventory/home.py --yes          # before the last change
    rigfleet rollback --inventory inventory/home.py --to 3 --limit host2 --yes

Default ``--to``: the serial before the newest entry that moved stacks. Entries that record no
earlier pins (``pins lock``) cannot be gone back over: the refusal names them. Exit status as
the bump's: 0 rolled back everywhere (or nothing to do), 1 refused or a host failed, 2 hosts
were skipped (unreachable, or outside ``--limit``: the pins file says what they still run),
3 the inventory or the pins file could not be read.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from rigfleet.bump.decide import BumpOptions, Inputs, load_fleet
from rigfleet.bump.execute import execute
from rigfleet.bump.journal import load_journal
from rigfleet.bump.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SKIPPED,
    confirm,
    console,
    error,
    log,
    print_steps,
    refused,
)
from rigfleet.bump.plan import Plan, build_plan, pin_text
from rigfleet.cliargs import UsageError, add_rollout, select, ssh_command
from rigfleet.errors import RigfleetError
from rigfleet.fleetview import reachability
from rigfleet.pins import GenesisPin, Pins, StackPins, parse_pins
from rigfleet.ssh import SshRemote
from rigfleet.tables import Table, show

MOVES = ("bump", "rollback")  # history actions that record ``old``/``new`` stack pins


class RollbackRefused(ValueError):
    """The history cannot give the pins asked for."""


def _serial(entry: dict[str, Any]) -> int | None:
    s = entry.get("serial")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


def default_target(pins: Pins) -> int:
    """The serial before the newest history entry that moved stacks."""
    for entry in reversed(pins.history):
        if entry.get("action") in MOVES and isinstance(entry.get("old"), dict) \
                and _serial(entry) is not None:
            return int(entry["serial"]) - 1
    raise RollbackRefused(f"{pins.path}: history: no bump or rollback recorded; nothing to go "
                          "back to")


def _rebuild(pins: Pins, name: str, summary: Any, serial: int) -> StackPins:
    """A stack's pins from a history summary (``rigfleet.bump.rollout.stack_summary``)."""
    if not isinstance(summary, dict) or not all(
            isinstance(summary.get(k), str) for k in ("image", "digest", "vllm_version")):
        raise RollbackRefused(f"{pins.path}: history: serial {serial}: old.{name}: "
                              f"{summary!r}; allowed: image, digest and vllm_version")
    image_id = summary.get("image_id")
    if "image_id" not in summary:  # an entry older than the key: the same digest's id
        known = [*pins.stacks.values(), *(p for h in pins.hosts.values() for p in h.values())]
        image_id = next((p.image_id for p in known if p.digest == summary["digest"]), None)
    genesis = None
    if commit := summary.get("genesis"):
        base = now.genesis if (now := pins.stacks.get(name)) is not None else None
        if base is None:
            raise RollbackRefused(f"{pins.path}: history: serial {serial}: old.{name}.genesis: "
                                  f"{commit}: the stack no longer pins a Genesis repository")
        same = base.commit == commit
        genesis = GenesisPin(base.repo, str(commit),
                             str(summary.get("genesis_layout") or base.layout),
                             summary.get("genesis_version") or (base.version if same else None))
    return StackPins(name, summary["image"], summary["digest"], summary["vllm_version"],
                     genesis, image_id)


def pins_at(pins: Pins, serial: int) -> dict[str, StackPins]:
    """The fleet's stack pins as they were at ``serial``, rebuilt from the history."""
    entries = [e for e in pins.history if (_serial(e) or 0) > serial]
    first = min((_serial(e) or pins.serial for e in pins.history), default=pins.serial)
    if serial >= pins.serial or serial < first - 1 or serial < 1:
        raise RollbackRefused(f"{pins.path}: --to: {serial}; allowed: a serial from "
                              f"{max(1, first - 1)} to {pins.serial - 1} (the pins file is at "
                              f"{pins.serial})")
    if missing := sorted(set(range(serial + 1, pins.serial + 1)) - {_serial(e) for e in entries}):
        raise RollbackRefused(f"{pins.path}: history: no entry for serial "
                              f"{', '.join(map(str, missing))}, so serial {serial} cannot be "
                              f"rebuilt; allowed: --to {max(missing)} or later")
    stacks = dict(pins.stacks)
    for entry in sorted(entries, key=lambda e: _serial(e) or 0, reverse=True):
        s = _serial(entry)
        if entry.get("action") not in MOVES or not isinstance(entry.get("old"), dict):
            raise RollbackRefused(
                f"{pins.path}: history: serial {s} ({entry.get('action') or 'no action'}) "
                f"records no earlier pins, so serial {serial} cannot be rebuilt; allowed: "
                f"--to {s} or later")
        for name, summary in entry["old"].items():
            stacks[name] = _rebuild(replace(pins, stacks=stacks), name, summary, s or 0)
    parse_pins(replace(pins, stacks=stacks).to_dict(), pins.path)
    return stacks


def changes(pins: Pins, target: dict[str, StackPins], hosts: list[str]) -> dict[str, StackPins]:
    """The stacks whose target pins differ from the fleet's or from some host's."""
    return {name: p for name, p in target.items()
            if pins.stacks.get(name) != p
            or any(pins.for_host(h).stacks.get(name) != p for h in hosts)}


def add_parser(subparsers: Any) -> None:
    p = ssh_command(subparsers, "rollback", "go back to an earlier pin set from the pins "
                    "history, canary first, through the gate", __doc__)
    p.add_argument("--to", type=int, metavar="N",
                   help="the pins serial to go back to (default: before the last bump or "
                        "rollback)")
    add_rollout(p)
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before rolling back")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        hosts, plan_hosts, pins, first = load_fleet(args.inventory, args.deploy)
        picked = {h.name for h in select(hosts, args.limit, args.inventory)}
        journal = load_journal(pins, first.catalog)
    except (RigfleetError, ValueError, RuntimeError) as e:
        return error(e)
    if journal is not None and journal.state != "finished":
        return refused(f"{journal.describe()} is unfinished; run `rigfleet bump --inventory "
                       f"{args.inventory}` to finish it (or add --abandon), then roll back")
    try:
        to = default_target(pins) if args.to is None else args.to
        target = pins_at(pins, to)
        opts = BumpOptions.from_args(args, stacks=tuple(target), rollback_to=to)
        new = changes(pins, target, [h.name for h in hosts])
        log(f"{pins.path}: at serial {pins.serial}; rolling back to the stacks of serial {to}")
        if not new:
            log(f"every host already runs the stacks of serial {to}; nothing to do")
            return EXIT_OK
        remote = SshRemote(args.timeout)
        unreachable = {**{h.name: "not in --limit" for h in hosts if h.name not in picked},
                       **reachability(remote, [h for h in hosts if h.name in picked])}
        plan = build_plan(plan_hosts, unreachable, pins, new, args.batch_size,
                          args.max_failures)
    except UsageError:
        raise
    except (RigfleetError, ValueError) as e:
        return refused(e)
    print_plan(plan, to)
    if args.dry:
        show(args.json, plan_json(plan, to))
        return EXIT_OK
    if plan.empty:
        log("every reachable host already runs these pins; nothing to do")
        return EXIT_SKIPPED if plan.skipped else EXIT_OK
    if not args.yes and not confirm("Roll back", "[red]refused:[/red] not a terminal: pass --yes "
                                    "to roll back; nothing changed",
                                    "not confirmed; nothing changed"):
        return EXIT_FAILED
    return execute(opts, Inputs(hosts, plan_hosts, pins, "", None, None, first.catalog), remote,
                   plan, None, "", history={"action": "rollback", "to_serial": to})


def plan_json(plan: Plan, to: int) -> dict[str, Any]:
    return {"to_serial": to, "from_serial": plan.pins.serial,
            "stacks": {n: {"now": pin_text(plan.pins.stacks[n], True), "to": pin_text(p, True)}
                       for n, p in plan.new_stacks.items()},
            "batches": [list(b) for b in plan.batches], "canary": plan.canary,
            "skipped": dict(plan.skipped), "up_to_date": list(plan.up_to_date)}


def print_plan(plan: Plan, to: int) -> None:
    """What ``--dry`` shows: each stack now -> serial ``to``; canary, batches, skipped."""
    table = Table(f"rigfleet rollback: pins serial {plan.pins.serial} -> {to}",
                  ["stack", "now", "back to"], keys=("stack",))
    for name, p in plan.new_stacks.items():
        table.row(name, pin_text(plan.pins.stacks[name], True), pin_text(p, True))
    table.print(console)
    print_steps(plan, "rollback")
