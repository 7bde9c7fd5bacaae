"""The ``rigfleet`` command: what pyinfra's own CLI does not do.

    rigfleet testbed up [--hosts N] [--hardware host2:cards=1]
    rigfleet testbed status
    rigfleet testbed down
    rigfleet pins lock [--pins pins.yaml] [--registry URL] [--hub URL] [--genesis-url URL]
                       [--refresh]
    rigfleet images status|export|import ...   (pinned images on hosts, saved copies)
    rigfleet verify --url URL [--api-key-file F] [--profile full|fast]   (the verify-stress gate)
    rigfleet endpoints --inventory inventory/home.py
    rigfleet status --inventory inventory/home.py [--json]
    rigfleet bump --inventory inventory/home.py [--image TAG|--latest] [--genesis C] [--dry]
    rigfleet bench --url URL | --inventory inventory/home.py [--limit H] [--accept-baseline H]
    rigfleet doctor --inventory inventory/home.py [--limit HOST] [--json]
    rigfleet roll --inventory inventory/home.py [--batch N] [--max-failures K] [--dry]
    rigfleet rollback --inventory inventory/home.py [--limit H] [--to N] [--dry] [--yes]
    rigfleet logs HOST [--stack S] [--source engine|supervisor|ledger] [--since T] [--follow]
    rigfleet lock HOST [--release --reason TEXT]

The converge itself is plain pyinfra: ``pyinfra inventory/home.py deploy.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console

console = Console(stderr=True, highlight=False)


def _log(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


def cmd_pins(args: argparse.Namespace) -> int:
    from rigfleet.pinlock import lock

    changes = lock(args.pins, registry_url=args.registry, hub_url=args.hub,
                   refresh=args.refresh, genesis_url=args.genesis_url)
    for line in changes or ["pins already locked; nothing to do"]:
        _log(line)
    return 0


def cmd_endpoints(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rigfleet.endpoints import check, check_balancer
    from rigfleet.inventory import balancers, gpu_hosts, load_inventory
    from rigfleet.tables import Table

    hosts = load_inventory(args.inventory)
    rows = [check(host) for host in gpu_hosts(hosts)]
    rows += [row for lb in balancers(hosts) for row in check_balancer(lb, hosts)]
    failed = sum(row.status != 200 for row in rows)
    if args.json:
        print(json.dumps({"hosts": [asdict(r) for r in rows], "ok": not failed}, indent=2))
        return 1 if failed else 0
    table = Table(f"serving endpoints ({args.inventory})",
                  ["host", "url", "status", "model", "answer", "s"])
    for row in rows:
        table.row(row.host, row.url, row.status, row.model, row.answer, f"{row.seconds:.2f}")
    table.print(Console())
    return 1 if failed else 0


def cmd_roll(args: argparse.Namespace) -> int:
    """``rigfleet roll``: the converge, one serving host (or ``--batch``) at a time."""
    from concurrent.futures import ThreadPoolExecutor
    from datetime import UTC, datetime
    from pathlib import Path

    from rich.text import Text

    from rigfleet.bump.rollout import PyinfraRunner
    from rigfleet.inventory import load_inventory
    from rigfleet.resources import PROJECT_ROOT
    from rigfleet.roll import BATCH_ENV, PyinfraRoller, RollStatus, plan_batches, probe_or_why, roll
    from rigfleet.ssh import SshRemote
    from rigfleet.tables import Table

    if args.batch < 1 or args.max_failures < 1:
        raise ValueError(f"--batch {args.batch} / --max-failures {args.max_failures}: allowed: "
                         "integers >= 1")
    hosts = load_inventory(args.inventory)
    names = [h.name for h in hosts]
    unknown = sorted(set(args.limit) - set(names))
    if unknown:
        raise ValueError(f"--limit: {', '.join(unknown)} not in {args.inventory}; allowed: "
                         f"{', '.join(names)}")
    if args.limit:
        names = [n for n in names if n in args.limit]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = PROJECT_ROOT / "reports" / "rolls" / stamp
    runner = PyinfraRunner(args.inventory, {h.name: h for h in hosts}, SshRemote(),
                           deploy=args.deploy, cwd=Path(args.deploy).resolve().parent,
                           log_dir=log_dir, env={BATCH_ENV: str(args.batch)})
    roller = PyinfraRoller(runner)
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(names)))) as pool:
        probes = dict(zip(names, pool.map(lambda n: probe_or_why(roller, n), names),
                          strict=True))
    plan = plan_batches(names, probes, args.batch)
    if args.dry or not args.json:
        for i, batch in enumerate(plan.batches):
            _log(f"{plan.label(i)}: {', '.join(batch)}")
        for name, why in plan.skipped.items():
            _log(f"skipped: {name}: {why}")
    if args.dry:
        if args.json:
            print(json.dumps({"batches": [list(b) for b in plan.batches],
                              "serving": sorted(plan.serving), "skipped": dict(plan.skipped)},
                             indent=2))
        return 0
    with console.status("rolling") as status:
        t0 = time.monotonic()

        def on_line(line: str) -> None:
            status.update(f"[{time.monotonic() - t0:5.0f}s] {line[:110]}")

        result = roll(plan, roller, args.max_failures, on_event=_log, on_line=on_line,
                      order=names)
    if args.json:
        print(json.dumps({"ok": result.ok, "stopped": result.stopped,
                          "seconds": round(result.seconds, 1), "logs": str(log_dir),
                          "hosts": [h.to_dict() for h in result.hosts.values()]}, indent=2))
        return 0 if result.ok else 1
    style = {RollStatus.CONVERGED: "green", RollStatus.MAINTAINED: "green",
             RollStatus.FAILED: "red", RollStatus.LOST: "red"}
    table = Table(f"rigfleet roll: {len(result.hosts)} host(s) in {result.seconds:.0f}s",
                  ["host", "batch", "result", "serving", "gate", "s"])
    for h in result.hosts.values():
        table.row(h.host, h.batch or "", Text(str(h.status), style=style.get(h.status, "")),
                  h.serving or "", h.gate, f"{h.seconds:.0f}")
        if h.reason and h.status is not RollStatus.MAINTAINED:
            table.note(h.host, h.reason)
    table.print(Console())
    if result.stopped:
        console.print(f"[red]stopped:[/red] {result.stopped}")
    console.print(f"[dim]pyinfra logs: {log_dir}[/dim]")
    return 0 if result.ok else 1


def _add_testbed(sub: Any) -> None:
    """``rigfleet testbed``: from the separate testbed package when it is installed."""
    try:
        from rigfleet_testbed.cli import add_parser
    except ImportError:
        tb = sub.add_parser("testbed", help="the simulated fleet (needs the rigfleet-testbed "
                            "package)", add_help=False)
        tb.add_argument("rest", nargs=argparse.REMAINDER)
        tb.set_defaults(func=_no_testbed)
        return
    add_parser(sub)


def _no_testbed(args: argparse.Namespace) -> int:
    console.print("[red]error:[/red] the simulated fleet is a separate package that is not "
                  "installed here; from a checkout: pip install -e ./testbed "
                  "(make demo and make test install it)")
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rigfleet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    _add_testbed(sub)

    pins = sub.add_parser("pins", help="the fleet's pins file")
    pins_sub = pins.add_subparsers(dest="action", required=True)
    lock = pins_sub.add_parser("lock", help="resolve image digests and ids, and the model "
                               "revision")
    lock.add_argument("--pins", default="pins.yaml")
    lock.add_argument("--registry", default="https://registry-1.docker.io")
    lock.add_argument("--hub", default="https://huggingface.co")
    lock.add_argument("--genesis-url", metavar="URL",
                      help="fetch the pinned Genesis commits from here (a mirror or a local "
                           "clone) instead of each pin's repository URL; the pins keep theirs")
    lock.add_argument("--refresh", action="store_true",
                      help="re-resolve every digest from its tag (and its image id), and the "
                           "model revision, not only the unresolved ones")
    pins.set_defaults(func=cmd_pins)

    from rigfleet.images import cli as images_cli

    images_cli.add_parser(sub)

    # The gate's own parser (rigfleet/hostside/verify/runner.py) handles the arguments; it is
    # the same program the hosts run during a swap.
    sub.add_parser("verify", add_help=False,
                   help="run the verify-stress gate against any OpenAI-compatible endpoint")

    from rigfleet.bump import cli as bump_cli
    from rigfleet.status import cli as status_cli

    status_cli.add_parser(sub)
    bump_cli.add_parser(sub)

    from rigfleet.bench import cli as bench_cli
    from rigfleet.doctor import cli as doctor_cli

    bench_cli.add_parser(sub)
    doctor_cli.add_parser(sub)

    from rigfleet import lockcmd, logs, rollback

    rollback.add_parser(sub)
    logs.add_parser(sub)
    lockcmd.add_parser(sub)

    from rigfleet.resources import PROJECT_ROOT

    ro = sub.add_parser("roll", help="converge the fleet with serving hosts disturbed one at "
                        "a time (driver changes, Docker restarts: docs/maintenance.md)")
    ro.add_argument("--inventory", default="inventory/home.py")
    ro.add_argument("--batch", type=int, default=1,
                    help="serving hosts per pyinfra run (default 1; bare hosts go first, "
                         "together)")
    ro.add_argument("--max-failures", type=int, default=1,
                    help="stop after this many failed hosts (default 1)")
    ro.add_argument("--limit", action="append", default=[], metavar="HOST",
                    help="only these hosts (repeatable)")
    ro.add_argument("--deploy", default=str(PROJECT_ROOT / "deploy.py"),
                    help="the deploy file (default: this checkout's deploy.py)")
    ro.add_argument("--dry", action="store_true", help="print the batches; run nothing")
    ro.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    ro.set_defaults(func=cmd_roll)

    ep = sub.add_parser("endpoints", help="ask every host's front for a short answer")
    ep.add_argument("--inventory", default="inventory/home.py")
    ep.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ep.set_defaults(func=cmd_endpoints)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["verify"]:
        from rigfleet.hostside.verify.runner import main as verify_main

        return verify_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # every expected failure carries a message that says what to do
        if isinstance(exc, ValueError | RuntimeError):
            console.print(f"[red]error:[/red] {exc}")
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
