"""``rigfleet-host``: the host-side tool (shipped as ``/usr/local/lib/rigfleet/rigfleet-host.pyz``).

Every command, and ``swap``'s exit statuses: docs/swap.md ("The host-side CLI")::

    python3 rigfleet-host.pyz swap --plan /var/lib/rigfleet/swap/<id>/plan.json
    python3 rigfleet-host.pyz status [--id ID [--since N]] [--json]
    python3 rigfleet-host.pyz maintenance close [--plan F] [--force]  # recreate + gate + route
"""

from __future__ import annotations

import argparse
import functools
import getpass
import importlib
import json
import os
import signal
import socket
import sys
import syslog
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import metrics
from .active import load_active, record_pins, request_reset
from .argtypes import count, positive
from .ensure import Ensure, adopt, shutdown
from .front import Front
from .gate import run_gate
from .journal import Journal
from .layout import Layout
from .lock import HostLock, LockHeld, WindowHold
from .maintenance import Maintenance, plan_of, window_status
from .pkgready import NotReady, Readiness
from .plan import Plan, PlanError
from .probe import probe
from .records import describe, ledger_tail, read_holder, read_state, read_supervisor, route
from .stackctl import SystemOps, http_request, read_api_key, run_cmd
from .steps import EXIT_BAD_PLAN, EXIT_LOCKED, GateFn
from .supervise import POLICY_FLAGS, Policy, parse_backoff, status_line
from .supervisor import AlreadyRunning, Supervisor, single_instance
from .transaction import Transaction


def _stop() -> Callable[[], bool]:
    """SIGTERM/SIGINT turn into a flag the transaction polls (it then rolls back)."""
    requested = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: requested.set())
    return requested.is_set


def _parts(lay: Layout, front_port: int) -> tuple[SystemOps, Front]:
    key = read_api_key(lay.api_key_file, lay.vllm_env_file)
    return SystemOps(api_key=key), Front(lay, front_port, run_cmd, http_request, api_key=key)


def _gate_fn() -> GateFn:
    """The verify-stress gate as a child of this bundle (``sys.argv[0]`` in the zipapp)."""
    path = Path(sys.argv[0])
    bundle = path if path.suffix == ".pyz" and path.is_file() else None
    return lambda run, on_line, should_stop: run_gate(run, on_line, bundle, should_stop)


def _plan(path: str, verb: str) -> Plan:
    """The plan file; a bad one is said and exits ``EXIT_BAD_PLAN``."""
    try:
        return Plan.load(Path(path))
    except PlanError as e:
        print(f"rigfleet-host {verb}: {e}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_PLAN) from None


def cmd_swap(args: argparse.Namespace, lay: Layout) -> int:
    plan = _plan(args.plan, "swap")
    ops, front = _parts(lay, plan.front_port)
    journal = Journal(lay.swap_dir(plan.id))
    # The textfiles say "swap in progress" before the engine stops, and its outcome after it.
    outcome = Transaction(plan, lay, ops, front, _gate_fn(), journal, interrupted=_stop(),
                          on_locked=lambda: metrics.refresh(lay, plan.front_port)).run()
    metrics.refresh(lay, plan.front_port)
    return outcome.exit


def cmd_maintenance(args: argparse.Namespace, lay: Layout) -> int:
    window, status, why = window_status(lay)
    if args.action == "status":
        data = {"status": status, "why": why, "window": window.to_dict() if window else None}
        print(json.dumps(data, sort_keys=True) if args.json else f"maintenance: {status}"
              + (f": {why}" if why else ""))
        return 0
    if args.action == "ready":
        return _ready(args, lay)
    plan = _plan(args.plan, "maintenance") if args.plan else None
    plan = (plan or plan_of(window, lay)) if args.action == "close" else plan
    if plan is None and args.action == "close" and status == "none":  # as Maintenance.close
        print("rigfleet-host maintenance: no maintenance window to close")
        return 0
    if plan is None:
        print("rigfleet-host maintenance: " + (f"--plan is required to {args.action} a window"
              if args.action != "close" else f"no plan to close with ({status}: "
              f"{why or 'none'}); pass --plan with the deploy's plan file"), file=sys.stderr)
        return EXIT_BAD_PLAN
    if args.action == "close" and status == "held" and args.force and not args.own \
            and not _confirm_takeover(lay):
        return EXIT_LOCKED
    ops, front = _parts(lay, plan.front_port)
    if args.action in ("open", "hold"):
        journal = Journal(lay.maintenance_dir / "journal" / plan.id, echo=sys.stdout)
        window_ = Maintenance(lay, ops, front, journal, plan)
        hold = WindowHold.here(plan.id, args.reboot_grace_s)
        outcome = window_.open(args.step, hold) if args.action == "open" else window_.hold(hold)
    else:
        journal = Journal(lay.swap_dir(args.journal_id), echo=sys.stdout) \
            if args.journal_id else _journal(lay, "close")
        outcome = Maintenance(lay, ops, front, journal, plan, gate=_gate_fn(),
                              interrupted=_stop()).close(own=args.own, force=args.force,
                                                         cause=args.cause or "")
    journal.finish(outcome.to_dict())
    print(f"rigfleet-host maintenance {args.action}: {outcome.result}: "
          f"{outcome.reason or outcome.serving}", file=sys.stderr if outcome.exit else sys.stdout)
    return outcome.exit


def _ready(args: argparse.Namespace, lay: Layout) -> int:
    """``maintenance ready``: can the window's work start? Exit 1 when not."""
    who = socket.gethostname()
    try:
        done = Readiness(root=lay.root, say=lambda line: print(f"{who}: {line}", flush=True)) \
            .check(args.packages, args.lock_wait_s, args.min_free_mib)
    except NotReady as e:
        print(f"{who}: not opening the maintenance window: {e}. Nothing was disturbed: the "
              "stack still serves.", file=sys.stderr)
        return 1
    print(f"{who}: ready for maintenance" + (f" ({'; '.join(done)})" if done else ""))
    return 0


def _confirm_takeover(lay: Layout) -> bool:
    """``maintenance close --force`` on a live holder: name it; ask only at a terminal."""
    holder = read_holder(lay.lock_dir) or {}
    print(f"rigfleet-host maintenance close --force: {describe(holder)}", file=sys.stderr)
    if not sys.stdin.isatty():
        return True
    answer = input("Take the window from this live holder (its deploy will fail)? [y/N] ")
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("rigfleet-host maintenance close: not taken; nothing changed", file=sys.stderr)
    return False


def cmd_adopt(args: argparse.Namespace, lay: Layout) -> int:
    plan = _plan(args.plan, "adopt")
    ops, front = _parts(lay, plan.front_port)
    journal = Journal(lay.swap_dir(plan.id))
    outcome = adopt(plan, lay, ops, front, journal)
    journal.finish(outcome.to_dict())
    if outcome.exit:
        print(f"rigfleet-host adopt: {outcome.reason}", file=sys.stderr)
    return outcome.exit


def _journal(lay: Layout, what: str) -> Journal:
    return Journal(lay.swaps_dir / f"{what}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                   f"-{os.getpid()}", echo=sys.stdout)


def cmd_ensure(args: argparse.Namespace, lay: Layout) -> int:
    ops, front = _parts(lay, args.front_port)
    journal = _journal(lay, "ensure")
    outcome = Ensure(lay, ops, front, journal, who=args.who, why=args.why,
                     gate=_gate_fn(), lock_wait_s=args.lock_wait_s,
                     leave_held=args.leave_held).run()
    journal.finish(outcome.to_dict())
    print(f"rigfleet-host ensure: {outcome.result}: {outcome.reason or outcome.serving}",
          file=sys.stderr if outcome.exit else sys.stdout)
    return outcome.exit


def cmd_shutdown(args: argparse.Namespace, lay: Layout) -> int:
    ops, front = _parts(lay, args.front_port)
    journal = _journal(lay, "shutdown")

    def going_down() -> bool:  # the machine stops (or reboots), not only the unit
        return run_cmd(["systemctl", "is-system-running"], 10.0)[1].strip() == "stopping"

    result = shutdown(lay, ops, front, journal, lock_wait_s=args.lock_wait_s,
                      going_down=going_down, who=args.who)
    journal.finish({"result": result, "exit": 0})
    if result == "left-alone":
        print("rigfleet-host shutdown: left alone: a transaction holds the host lock (see "
              "`rigfleet-host.pyz status`); nothing was stopped", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace, lay: Layout) -> int:
    if args.id:
        data = Journal.read(lay.swap_dir(args.id), since=args.since)
        if args.json:
            print(json.dumps(data, sort_keys=True))
        else:
            for e in data["events"]:
                print(f"[{e.get('elapsed', 0):8.2f}s] {e.get('phase')}: {e.get('message')}")
            print(f"state: {data['state']}"
                  + (f"; result: {json.dumps(data['result'])}" if data["result"] else ""))
        return 0
    holder = read_holder(lay.lock_dir)
    try:
        active, problem = load_active(lay), ""
    except PlanError as e:
        active, problem = None, str(e)
    state = read_state(lay.state_file)
    window, window_state, window_why = window_status(lay)
    summary: dict[str, Any] = {
        "lock": holder, "active": active.to_dict() if active else None,
        "route": route(lay.front_route), "gate": state.get("gate"),
        "last_swap": state.get("last_swap"), "ledger": ledger_tail(lay.ledger_file, 5)[0],
        "problem": problem or None, "supervisor": read_supervisor(lay.supervise_state),
        "maintenance": {"status": window_state, "why": window_why,
                        "window": window.to_dict() if window else None},
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    print(f"lock:    {describe(holder) if holder else 'free'}"
          + ("" if not holder or holder.get('alive') else " [stale: holder gone]"))
    print(f"active:  {active.ref.route_id if active else 'nothing verified'}"
          + (f" since {active.since} by {active.by}" if active else ""))
    print(f"route:   {summary['route']}")
    print(f"gate:    {json.dumps(summary['gate'])}")
    print(f"last:    {json.dumps(summary['last_swap'])}")
    print(f"watch:   {status_line(summary['supervisor'])}")
    print(f"maint:   {window_state}" + (f": {window_why}" if window_why else ""))
    if problem:
        print(f"problem: {problem}")
    for line in summary["ledger"]:
        print(f"ledger:  {line.get('time')} {line.get('event')} {line.get('result')} "
              f"{line.get('stack')} gate={(line.get('gate') or {}).get('result')}"
              + (f" reason={line['reason']}" if line.get("reason") else ""))
    return 0


def cmd_record(args: argparse.Namespace, lay: Layout) -> int:
    try:
        tracked = json.loads(args.json)
        what = record_pins(lay, tracked, args.config_hash, args.by, args.deploy_id, args.host)
    except (ValueError, PlanError, LockHeld, OSError) as e:  # OSError: a full disk
        print(f"rigfleet-host record: {e}", file=sys.stderr)
        return 1
    print(f"rigfleet-host record: {what}")
    return 0


def cmd_lock(args: argparse.Namespace, lay: Layout) -> int:
    """Who holds the lock; ``--release --reason TEXT`` removes a stale one (stdout, syslog)."""
    if not args.release:
        holder = read_holder(lay.lock_dir)
        if args.json:
            print(json.dumps(holder, sort_keys=True))
        else:
            print(describe(holder) + ("" if holder.get("alive") else " [stale]") if holder
                  else "free")
        return 0
    if not args.reason.strip():
        print("rigfleet-host lock: --release: --reason: ''; allowed: a few words saying why",
              file=sys.stderr)
        return 2
    try:
        holder = HostLock(lay).release_stale()
    except LockHeld as held:
        print(f"rigfleet-host lock: refused: {held} [alive]", file=sys.stderr)
        return EXIT_LOCKED
    if holder is None:
        print("rigfleet-host lock: free; nothing to release")
        return 0
    line = (f"released a stale lock ({describe(holder)}) by {args.by or 'unknown'}: "
            f"{args.reason}")
    syslog.openlog("rigfleet-host")
    syslog.syslog(syslog.LOG_NOTICE, line)
    print(f"rigfleet-host lock: {line}")
    return 0


def cmd_probe(args: argparse.Namespace, lay: Layout) -> int:
    print(json.dumps(probe(lay, full=args.full, model_path=args.model_path,
                           front_port=args.front_port,
                           doctor_load_s=args.load_s if args.doctor else None), sort_keys=True))
    return 0


def cmd_supervise(args: argparse.Namespace, lay: Layout) -> int:
    if args.reset:
        who = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
        request_reset(lay, who, args.why)
        print(f"rigfleet-host supervise: reset requested by {who} ({args.why}); the supervisor "
              "counts recreations from zero at its next look")
        return 0
    policy = Policy(**{name: getattr(args, name) for name in POLICY_FLAGS})
    ops, front = _parts(lay, args.front_port)

    def refresh() -> None:  # a deploy may rotate the API key while this runs for weeks
        ops.api_key = front.api_key = read_api_key(lay.api_key_file, lay.vllm_env_file)

    supervisor = Supervisor(lay, ops, front, policy, stop=_stop(), refresh=refresh, gate=_gate_fn())
    try:
        with single_instance(lay):
            return supervisor.run()
    except AlreadyRunning as e:
        print(f"rigfleet-host supervise: {e}", file=sys.stderr)
        return EXIT_LOCKED


# The host tool's refusals name what the value is not.
_seconds = functools.partial(positive, refused=" is not a number of seconds;")
_count = functools.partial(count, refused=" is not a count;")


def _backoff(text: str) -> tuple[float, ...]:
    try:
        return parse_backoff(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rigfleet-host", description=__doc__.splitlines()[0])
    p.add_argument("--root", default="/", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, func: Callable[..., int], text: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=text)
        parser.set_defaults(func=func)
        return parser

    for name, func, text in (
            ("swap", cmd_swap, "run a swap transaction from a plan file"),
            ("adopt", cmd_adopt, "record the stack that already serves as active")):
        command(name, func, text).add_argument("--plan", required=True)
    for name, func, text in (("ensure", cmd_ensure, "the active stack serves (boot, reroute)"),
                             ("shutdown", cmd_shutdown, "front to 503, every stack down")):
        e = command(name, func, text)
        e.add_argument("--front-port", type=int, default=8000)
        e.add_argument("--who", default="rigfleet-stack.service")
        e.add_argument("--why", default="boot: recreate the active stack")
        e.add_argument("--lock-wait-s", type=float, default=0.0,
                       help="wait this long for a transaction that holds the host lock")
        if name == "ensure":
            e.add_argument("--leave-held", action="store_true",
                           help="after the wait, leave a transaction that holds the host lock "
                           "alone (exit 0; the stack unit's start) instead of exit 3")
    st = command("status", cmd_status, "a transaction's progress, or the host's swap state")
    st.add_argument("--id")
    st.add_argument("--since", type=int, default=0)
    st.add_argument("--json", action="store_true")
    rec = command("record", cmd_record, "record pins that changed without a swap")
    rec.add_argument("--json", required=True, help="the tracked keys, as a JSON object")
    rec.add_argument("--config-hash", required=True)
    for flag in ("--by", "--deploy-id", "--host"):
        rec.add_argument(flag, default="")
    lk = command("lock", cmd_lock, "who holds the host lock")
    lk.add_argument("--json", action="store_true")
    lk.add_argument("--release", action="store_true",
                    help="remove the lock when its holder is gone (stale); a live one is "
                         "refused (exit 3)")
    lk.add_argument("--reason", default="", help="(--release) why, for the system log")
    lk.add_argument("--by", default="", help="(--release) who, for the system log")
    pr = command("probe", cmd_probe, "the host's state as one JSON object (the deploy's facts, "
                 "rigfleet status, the bump)")
    pr.add_argument("--json", action="store_true", help="(the default; kept for readability)")
    pr.add_argument("--full", action="store_true",
                    help="add ledger, reports, GPUs, Genesis, weights and front sections")
    pr.add_argument("--model-path", help="the weights directory to check (--full)")
    pr.add_argument("--front-port", type=int, help="the front's port to ask (--full)")
    pr.add_argument("--doctor", action="store_true",
                    help="(--full) add the doctor's evidence: the cards under a short load "
                         "of the active stack, its engine's log facts")
    pr.add_argument("--load-s", type=_seconds, default=15.0,
                    help="(--doctor) how long the load runs (default 15)")
    sv = command("supervise", cmd_supervise, "recreate the active stack when its engine dies "
                 "(backoff, limit; then 503 with the reason)")
    sv.add_argument("--reset", action="store_true",
                    help="forget the recreations counted so far and a give-up (after fixing)")
    sv.add_argument("--why", default="reset by hand", help="(--reset) for the ledger of resets")
    sv.add_argument("--by", default="", help="(--reset) who asks (default: user@host)")
    sv.add_argument("--front-port", type=int, default=8000)
    parse: dict[type, Callable[[str], Any]] = {tuple: _backoff, int: _count, float: _seconds}
    for name, (flag, hint) in POLICY_FLAGS.items():
        default = getattr(Policy(), name)
        sv.add_argument(flag, type=parse[type(default)], default=default, help=hint, dest=name,
                        metavar=flag[2:].upper().replace("-", "_"))
    mt = command("maintenance", cmd_maintenance, "the maintenance window around disturbing steps "
                 "(driver, Docker restart, daemon-reload)")
    mt.add_argument("action", choices=("ready", "open", "hold", "close", "status"))
    mt.add_argument("--packages", action="store_true",
                    help="(ready) the steps use apt: wait for its locks, repair dpkg")
    mt.add_argument("--lock-wait-s", type=_seconds, default=120.0,
                    help="(ready) how long to wait for apt's and dpkg's locks (default 120)")
    mt.add_argument("--min-free-mib", type=_count, default=1024,
                    help="(ready) free space the steps need (default 1024 MiB)")
    mt.add_argument("--plan", help="the deploy's plan (gate profile, time limits, who)")
    mt.add_argument("--step", default="maintenance", help="(open) the disturbing step")
    mt.add_argument("--reboot-grace-s", type=_seconds, default=None,
                    help="(open) the step reboots the host: the window stays held this long "
                    "after the reboot request and after the next boot (boot-time clock) until "
                    "the deploy is back (`maintenance hold`)")
    mt.add_argument("--journal-id", help="(close) the journal's id (status --id)")
    mt.add_argument("--own", action="store_true",
                    help="(close) the caller is the deploy that holds the plan's window")
    mt.add_argument("--force", action="store_true",
                    help="(close) take the window from a holder that lives (names it; asks at "
                    "a terminal); without it such a window is refused")
    mt.add_argument("--cause", help="(close) why it is closed now, for the ledger")
    mt.add_argument("--json", action="store_true", help="(status) as JSON")
    me = command("metrics", lambda args, lay: metrics.run(lay, Path(args.dir), args.front_port),
                 "write the node exporter's textfiles: the cards (rigfleet-gpu.prom) and "
                 "rigfleet's facts (rigfleet.prom)")
    me.add_argument("--dir", default=metrics.TEXTFILE_DIR,
                    help=f"the textfile collector's directory (default {metrics.TEXTFILE_DIR})")
    me.add_argument("--front-port", type=int, help="the front's port (readiness)")
    sub.add_parser("verify", add_help=False, help="the verify-stress gate (its own --help)")
    sub.add_parser("bench", add_help=False, help="the bench against the active stack, or "
                   "--accept-baseline (its own --help)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The gate and the bench have their own argument parsers (imported only when run).
    if own := {"verify": ".verify.runner", "bench": ".bench.cli"}.get(argv[0] if argv else ""):
        return int(importlib.import_module(own, __package__).main(argv[1:]))
    args = build_parser().parse_args(argv)
    return int(args.func(args, Layout(Path(args.root))) or 0)


if __name__ == "__main__":
    sys.exit(main())
