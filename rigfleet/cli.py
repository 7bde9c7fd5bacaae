"""The ``rigfleet`` command: what pyinfra's own CLI does not do (the converge itself is plain
pyinfra). Each command module registers itself with ``add_parser(subparsers)`` (``_commands``);
fleet options and exit statuses: ``rigfleet/cliargs.py`` (``verify``'s usage errors exit 101).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from rich.markup import escape
from rich.text import Text

from rigfleet import __version__
from rigfleet.cliargs import (
    UsageError,
    add_rollout,
    add_yes,
    confirm,
    console,
    fleet_hosts,
    fleet_options,
    log,
    run_command,
    select,
)
from rigfleet.inventory import balancers, gpu_hosts, load_inventory
from rigfleet.resources import PROJECT_ROOT
from rigfleet.tables import Table, show


def cmd_pins(args: argparse.Namespace) -> int:
    from rigfleet.catalog import load_catalog
    from rigfleet.check import online_pass, verify_pins
    from rigfleet.pinlock import lock
    from rigfleet.pins import Pins

    if args.limit and not args.inventory:
        raise UsageError(f"--limit {' '.join(args.limit)}: allowed only with --inventory "
                         "(whose hosts' sources the pins are checked at)")
    hosts = fleet_hosts(args) if args.inventory else []
    token_file = args.hf_token_file or next((str(h.data["hf_token_file"]) for h in hosts
                                             if h.kind.gpu and h.data.get("hf_token_file")), None)

    def verify(pins: Pins) -> list[str]:
        """The refusals of the inventory's sources (each pin is there); warnings logged."""
        online = online_pass(images=True, reach=args.reach, timeout=args.timeout)
        refusals, warnings = verify_pins(hosts, pins, online)
        for line in warnings:
            log(f"warning: {line}")
        return refusals

    dirs = dict.fromkeys(str(h.data["stacks_dir"]) for h in hosts if h.data.get("stacks_dir"))
    changes = lock(args.pins, registry_url=args.registry, hub_url=args.hub,
                   refresh=args.refresh, genesis_url=args.genesis_url,
                   token_file=token_file, verify=verify if args.inventory else None,
                   catalog=load_catalog(dirs))
    show(args.json, {"pins": args.pins, "changes": changes or []})
    if not args.json:
        for line in changes or ["pins already locked; nothing to do"]:
            log(line)
    return 0


def cmd_endpoints(args: argparse.Namespace) -> int:
    from rigfleet.endpoints import check, check_balancer

    hosts = load_inventory(args.inventory)
    picked = select(hosts, args.limit, args.inventory)  # in inventory order
    rows = [check(host, args.timeout) for host in gpu_hosts(picked)]
    rows += [row for lb in balancers(picked) for row in check_balancer(lb, hosts, args.timeout)]
    if not rows:
        raise UsageError(f"{args.inventory}: no serving host or balancer among "
                         f"{', '.join(sorted(h.name for h in picked))}; nothing to ask")
    failed = sum(row.status != 200 for row in rows)
    show(args.json, {"hosts": [asdict(r) for r in rows], "ok": not failed},
         endpoints_table(rows, f"serving endpoints ({args.inventory})"))
    return 1 if failed else 0


def endpoints_table(rows: Sequence[Any], title: str) -> Table:
    table = Table(title, ["host", "status", "s", "model", "answer", "url"])
    for row in rows:
        table.row(row.host, row.status, f"{row.seconds:.2f}", row.model, row.answer, row.url)
    return table


def cmd_roll(args: argparse.Namespace) -> int:
    from rigfleet.batches import BATCH_ENV
    from rigfleet.bump.output import progress
    from rigfleet.bump.rollout import PyinfraRunner
    from rigfleet.fleetview import each_host, probe_or_why
    from rigfleet.roll import plan_batches, roll, roll_record
    from rigfleet.ssh import SshRemote

    hosts = load_inventory(args.inventory)
    chosen = select(hosts, args.limit, args.inventory)
    names = [h.name for h in chosen]
    log_dir = PROJECT_ROOT / "reports" / "rolls" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    runner = PyinfraRunner(args.inventory, {h.name: h for h in hosts},
                           SshRemote(connect_timeout=args.timeout), deploy_file=args.deploy,
                           log_dir=log_dir, env={BATCH_ENV: str(args.batch)})
    probes = dict(zip(names, each_host(chosen, lambda h: probe_or_why(runner.facts, h.name),
                                       lambda h, why: why), strict=True))
    plan = plan_batches(names, probes, args.batch)
    if args.dry or not args.json:
        for n, batch in enumerate(plan.batches, 1):
            log(f"{plan.label(n)}: {', '.join(batch)}")
        for name, why in plan.skipped.items():
            log(f"skipped: {escape(name)}: {escape(why)}")
    if args.dry:
        show(args.json, {"batches": [list(b) for b in plan.batches],
                         "serving": sorted(plan.serving), "skipped": dict(plan.skipped)})
        return 0 if plan.batches else 1
    if not plan.batches:  # run_command prints it as an error line, exit 1
        raise RuntimeError("reached no host: every host was skipped (unreachable or busy, "
                           "above); nothing ran")
    confirm(args, f"converge {sum(map(len, plan.batches))} host(s) in {len(plan.batches)} "
                  "batch(es) (driver installs, reboots, Docker restarts as the pins need)")
    with progress("rolling") as on_line:
        result = roll(plan, runner, args.max_failures, on_event=lambda m: log(escape(m)),
                      on_line=on_line, order=names)
    show(args.json, {"ok": result.ok, "stopped": result.stopped,
                     "seconds": round(result.seconds, 1), "logs": str(log_dir),
                     "hosts": [roll_record(h) for h in result.outcomes.values()]},
         roll_table(result))
    if not args.json:
        if result.stopped:
            console.print(f"[red]stopped:[/red] {escape(result.stopped)}")
        console.print(f"[dim]pyinfra logs: {escape(str(log_dir))}[/dim]")
    return 0 if result.ok else 1


def roll_table(result: Any) -> Table:
    """One line per host of a roll; why a host did not close a window as notes."""
    from rigfleet.bump.rollout import Status

    style = {Status.CONVERGED: "green", Status.MAINTAINED: "green", Status.FAILED: "red",
             Status.LOST: "red"}
    table = Table(f"rigfleet roll: {len(result.outcomes)} host(s) in {result.seconds:.0f}s",
                  ["host", "result", "batch", "serving", "gate", "s"])
    for h in result.outcomes.values():
        table.row(h.host, Text(str(h.status), style=style.get(h.status, "")), h.batch or "",
                  h.serving or "", h.gate, f"{h.seconds:.0f}")
        if h.reason and h.status is not Status.MAINTAINED:
            table.note(h.host, h.reason)
    return table


def _add_testbed(sub: Any) -> None:
    try:
        from rigfleet_testbed.cli import add_parser
    except ImportError:
        tb = sub.add_parser("testbed", help="the simulated fleet (needs the rigfleet-testbed "
                            "package)", description="The simulated fleet is a separate "
                            "package, not installed here: pip install -e ./testbed from a "
                            "checkout (make demo and make test install it).")
        tb.add_argument("rest", nargs=argparse.REMAINDER, help="testbed arguments")
        tb.set_defaults(func=_no_testbed)
        return
    add_parser(sub)


def _no_testbed(args: argparse.Namespace) -> int:
    raise UsageError("the simulated fleet is a separate package that is not installed here; "
                     "from a checkout: pip install -e ./testbed (make demo and make test "
                     "install it)")


def _add_pins(sub: Any) -> None:
    pins = sub.add_parser("pins", help="the fleet's pins file")
    pins_sub = pins.add_subparsers(dest="action", required=True)
    lock = pins_sub.add_parser("lock", parents=[fleet_options(
                                   inventory_default=None, timeout=10.0,
                                   timeout_help="with --inventory: seconds per source asked")],
                               help="resolve image digests and ids, and the model revision")
    lock.add_argument("--pins", default="pins.yaml")
    lock.add_argument("--registry", default="https://registry-1.docker.io")
    lock.add_argument("--hub", default="https://huggingface.co")
    lock.add_argument("--genesis-url", metavar="URL",
                      help="fetch the pinned Genesis commits from here (a mirror or a local "
                           "clone) instead of each pin's repository URL; the pins keep theirs")
    lock.add_argument("--hf-token-file", metavar="FILE",
                      help="the hub token (a gated model needs one; as host data "
                           "hf_token_file: read here, never shown). With --inventory, the pins "
                           "are checked at every source its hosts (or --limit's) use before "
                           "they are saved (`rigfleet check --online`), and its hf_token_file "
                           "is the token unless this says")
    lock.add_argument("--reach", action="append", default=[], metavar="FROM=TO",
                      help="with --inventory: this machine reaches URLs starting FROM at TO")
    lock.add_argument("--refresh", action="store_true",
                      help="re-resolve every digest from its tag (and its image id), and the "
                           "model revision, not only the unresolved ones")
    pins.set_defaults(func=cmd_pins)


def _add_verify(sub: Any) -> None:
    # main() hands everything after "verify" to the gate's own parser (hostside/verify/runner).
    sub.add_parser("verify", add_help=False,
                   help="run the verify-stress gate against any OpenAI-compatible endpoint")


def _add_roll(sub: Any) -> None:
    ro = sub.add_parser("roll", parents=[fleet_options(timeout=10.0,
                                                       timeout_help="seconds per SSH connect")],
                        help="converge the fleet with serving hosts disturbed one at a time "
                             "(driver changes, Docker restarts: docs/maintenance.md)",
                        description="Converge the fleet (pyinfra, deploy.py) one batch at a "
                                    "time: bare hosts first, together, then serving hosts "
                                    "--batch at a time. Asks before it starts unless --yes.")
    add_rollout(ro, "--batch", "serving hosts per pyinfra run (default 1; bare hosts go first, "
                "together)", canary=False)
    add_yes(ro, "start the roll")
    ro.set_defaults(func=cmd_roll)


def _add_endpoints(sub: Any) -> None:
    ep = sub.add_parser("endpoints", parents=[fleet_options(timeout=60.0,
                                                            timeout_help="seconds per answer")],
                        help="ask every host's front (and balancer) for a short answer")
    ep.set_defaults(func=cmd_endpoints)


def _commands() -> list[Callable[[Any], Any]]:
    from rigfleet import check, lockcmd, logs, rollback
    from rigfleet.bench import cli as bench_cli
    from rigfleet.bump import cli as bump_cli
    from rigfleet.doctor import cli as doctor_cli
    from rigfleet.images import cli as images_cli
    from rigfleet.status import cli as status_cli

    return [_add_testbed, check.add_parser, _add_pins, images_cli.add_parser, _add_verify,
            status_cli.add_parser, bump_cli.add_parser, bench_cli.add_parser,
            doctor_cli.add_parser, _add_roll, rollback.add_parser, logs.add_parser,
            lockcmd.add_parser, _add_endpoints]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rigfleet",
        description="Run a fleet of self-hosted LLM rigs: what pyinfra's own CLI does not do. "
                    "The converge itself is plain pyinfra: pyinfra inventory/home.py deploy.py",
        epilog="Fleet options, the same on every command that reaches hosts: --inventory FILE "
               "(default inventory/home.py), --limit HOST|GROUP (repeatable), --json, "
               "--timeout S. rigfleet COMMAND --help says the rest.")
    parser.add_argument("--version", action="version", version=f"rigfleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in _commands():
        add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["verify"]:
        from rigfleet.hostside.verify.runner import main as verify_main

        return verify_main(argv[1:], prog="rigfleet verify")
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
