"""``rigfleet status``: the hosts' rows (a table, drift as notes; or JSON), the balancers' rotation;
the exit status is the worst found. ``--html FILE``: a page instead (docs/monitoring-rules.md)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.text import Text

from rigfleet.balancer.status import BalancerRow, balancer_rows
from rigfleet.cliargs import UsageError, console, fleet_options, select
from rigfleet.inventory import balancers, gpu_hosts
from rigfleet.ssh import SshRemote
from rigfleet.status.rows import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    PINS_ERROR,
    StatusRow,
    exit_status,
    fleet_status,
)
from rigfleet.tables import Table, show


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

    try:
        monitor = monitor_host(hosts, args.inventory)
        now = time.time()
        answers = fetch(SshRemote(connect_timeout=args.timeout), monitor, now=now,
                        hours=args.hours, timeout=args.timeout)
    except MonitorError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")
        return EXIT_ERROR
    serving = [h.name for h in gpu_hosts(hosts) if h.name in chosen]
    page = render(PageInput(hosts=serving, monitor=monitor.name, now=now, hours=args.hours,
                            answers=answers,
                            others=[h.name for h in hosts if h.name not in serving]))
    try:
        Path(args.html).write_text(page, encoding="utf-8")
    except OSError as e:
        console.print(f"[red]error:[/red] --html: {escape(args.html)}: "
                      f"{escape(e.strerror or str(e))}")
        return EXIT_ERROR
    alerts = len(answers.alerts.get("data", {}).get("alerts", []))
    print(f"wrote {args.html}: {len(serving)} host(s), {alerts} alert(s), "
          f"last {args.hours:g} h, from Prometheus on {monitor.name}")
    return EXIT_OK


def balancer_exit(rows: Sequence[Any]) -> int:
    """An unreadable balancer, or a stack with no host in rotation, counts as unreachable."""
    return EXIT_OK if all(r.ok for r in rows) else EXIT_UNREACHABLE


def _when(iso: str | None) -> str:
    """``2026-11-29T16:45:02+00:00`` -> ``11-29 16:45`` for a table cell."""
    if iso and len(iso) >= 16 and iso[10] == "T":
        return iso.replace("T", " ")[5:16]
    return iso or ""


def as_json(rows: Sequence[StatusRow], balancers: Sequence[BalancerRow] = ()) -> dict[str, Any]:
    """``--json``: hosts, ok, and the unfinished bumps and the balancers when there are any."""
    out: dict[str, Any] = {"hosts": [{**asdict(r), "ok": r.ok} for r in rows],
                           "ok": all(r.ok for r in rows) and all(b.ok for b in balancers)}
    if bumps := bump_summaries(rows):
        out["bumps"] = bumps
    if balancers:
        out["balancers"] = [{**asdict(b), "ok": b.ok} for b in balancers]
    return out


# The states of ``BumpJournal.host_view`` as a bump cell says them, and its style.
_BUMP_WORDS = {"candidate": ("on candidate", "green"), "old": ("old pins", "yellow"),
               "in flight": ("in flight", "magenta"), "failed": ("rolled back", "red"),
               "lost": ("lost", "red"), "skipped": ("skipped", "yellow"),
               "not attempted": ("old pins", "yellow"), "up to date": ("on candidate", "green")}


def bump_cell(view: Mapping[str, Any] | None) -> Text:
    """``on candidate 11-29 10:41``, ``old pins``, ``in flight 11-29 10:45 (runs candidate)``."""
    if not view:
        return Text("-")
    words, style = _BUMP_WORDS.get(str(view.get("state")), (str(view.get("state")), ""))
    text = f"{words} {_when(view.get('since'))}".strip()
    if view.get("runs"):
        text += f" (runs {view['runs']})"
    return Text(text, style=style)


def bump_summaries(rows: Sequence[StatusRow]) -> list[dict[str, Any]]:
    """One entry per unfinished bump the rows are in, its hosts by where they stand."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.bump:
            entry = out.setdefault(str(r.bump["bump"]), {
                k: r.bump.get(k) for k in ("bump", "target", "started", "by", "journal")})
            entry.setdefault("hosts", {}).setdefault(str(r.bump.get("state")), []).append(r.host)
    return list(out.values())


def render_balancers(rows: Sequence[BalancerRow]) -> Table:
    """One line per balancer and stack: which hosts are in rotation; the rest as notes."""
    table = Table("balancers", ["balancer", "stack", "up", "in rotation", "url"],
                  keys=("balancer", "stack"))
    for r in rows:
        key = f"{r.balancer} {r.stack or ''}".strip()
        if r.error:
            table.note(key, Text(r.error, style="red"))
        for host, why in r.out:
            table.note(key, Text(f"{host} out of rotation: {why}", style="yellow"))
        up = (Text("-") if not r.reachable or r.error
              else Text(f"{len(r.up)}/{len(r.up) + len(r.out)}", style="green" if r.up else "red"))
        table.row(r.balancer, r.stack or "-", up, " ".join(r.up) or "-", r.url)
    return table


def tok_s(throughput: dict | None) -> Text:
    """``89/119`` (narrative/code decode tok/s of the last gate), red when it failed."""
    if not throughput:
        return Text("-")
    text = "/".join(f"{v:.0f}" if isinstance(v, int | float) else "-"
                    for v in (throughput.get("narrative"), throughput.get("code")))
    return Text(text, style="red" if throughput.get("result") == "fail" else "")


def render_table(rows: Sequence[StatusRow], title: str = "rigfleet status") -> Table:
    """One line per host, drift and errors as notes; mid-bump, a ``bump`` column and a note."""
    mid_bump = any(r.bump for r in rows)
    columns = ["host", "stack", "image/genesis/model", "gate", "tok/s", "drift"]
    table = Table(title + (" (mid-bump)" if mid_bump else ""),
                  [*columns, "bump"] if mid_bump else columns, keys=("host", "stack"))
    for b in bump_summaries(rows):
        hosts = "; ".join(f"{_BUMP_WORDS.get(state, (state,))[0]}: {', '.join(names)}"
                          for state, names in (b.get("hosts") or {}).items())
        table.note("mid-bump", Text(
            f"{b['bump']} ({b['target']}), started {_when(b['started'])} by {b['by']}: {hosts}. "
            f"`rigfleet bump` finishes it, `rigfleet bump --abandon` records it and stops "
            f"(journal {b['journal']})", style="magenta"))
    for r in rows:
        if r.error or not r.reachable:
            table.note(r.host, Text(r.error or "unreachable", style="red"))
        for line in r.drift:  # an unreachable host has none
            table.note(r.host, Text(line, style="yellow"))
        if not r.reachable:
            said = "not probed" if (r.error or "").startswith(PINS_ERROR) else "unreachable"
            stack, pins, drift = Text(said, style="red"), "-", Text("-")
        else:
            stack = Text(r.stack or "-")
            pins = "/".join(v.removeprefix("sha256:")[:7] if v else "-"
                            for v in (r.digest, r.genesis, r.model_revision))
            drift = (Text(str(len(r.drift)), style="yellow") if r.drift
                     else Text("-") if r.error else Text("none", style="green"))
        gate = "-" if r.gate is None else f"{r.gate} {_when(r.gate_time)}".strip()
        table.row(r.host, stack, pins, gate, tok_s(r.throughput), drift,
                  *([bump_cell(r.bump)] if mid_bump else []))
    return table
