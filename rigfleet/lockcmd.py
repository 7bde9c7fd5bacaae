"""``rigfleet lock HOST``: who holds a host's lock (holder, since, why, alive?); release a
stale one.

    rigfleet lock host1
    rigfleet lock host1 --release --reason "deploy killed at 10:02, host rebooted since"

The host tool answers (``rigfleet-host.pyz lock``): liveness is the host's own rule
(``rigfleet.hostside.records.holder_alive``: the holder's process still runs in this boot, or
a maintenance window before its deadline). ``--release`` removes a stale lock through the host
tool, which refuses a live holder (exit 3) as the host's own lock does; the release, who and
why go to the host's system log. Exit status: 0 shown or released (or free), 1 refused (a live
holder) or the host could not answer.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from rigfleet.bump.output import refused
from rigfleet.cliargs import UsageError, host_command, one_host
from rigfleet.commands import hosttool
from rigfleet.hostside.records import describe, now_iso
from rigfleet.resources import deployed_by
from rigfleet.ssh import SshRemote


def holder_row(holder: dict[str, Any] | None) -> dict[str, Any]:
    """The holder as the table and ``--json`` show it."""
    if holder is None:
        return {"state": "free"}
    who = holder.get("window") and f"maintenance window {holder['window']}"
    until = holder.get("until")
    return {
        "state": "held" if holder.get("alive") else "stale",
        "holder": holder.get("who") or "unknown",
        "since": holder.get("since"),
        "why": holder.get("why"),
        "process": who or (f"pid {holder.get('pid')} on {holder.get('host') or '?'}"),
        "until": now_iso(until, suffix="Z") if isinstance(until, int | float) else None,
        "deploy_id": holder.get("deploy_id") or None,
        "alive": bool(holder.get("alive")),
    }


def read_lock(remote: Any, host: Any) -> dict[str, Any] | None:
    """The host's lock holder (``alive`` by the host's rule), None when free."""
    rc, out = remote.run(host, hosttool.lock_show(), timeout=60)
    if rc != 0:
        hint = " (no host tool there: run the deploy first)" if "No such file" in out else ""
        raise RuntimeError(f"{host.name}: `rigfleet-host.pyz lock` exited {rc}{hint}: "
                           f"{out.strip()[-300:]}")
    text = (out.strip().splitlines() or [""])[-1]
    try:
        data = json.loads(text)
    except ValueError:
        raise RuntimeError(f"{host.name}: the host tool's lock answer is not JSON: "
                           f"{text[:200]!r}") from None
    return data if isinstance(data, dict) else None


def add_parser(subparsers: Any) -> None:
    p = host_command(subparsers, "lock", "show a host's lock; release a stale one", __doc__)
    p.add_argument("--release", action="store_true",
                   help="remove the lock when its holder is gone (a live one is refused)")
    p.add_argument("--reason", default="", help="(with --release, required) why, for the "
                   "host's system log")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.release and not args.reason.strip():
        raise UsageError("--release: --reason: missing; allowed: a few words saying why the "
                         "holder is gone (they go to the host's system log)")
    if args.reason and not args.release:
        raise UsageError("--reason: given without --release; allowed: --release --reason TEXT")
    out = Console(highlight=False)  # the answer, on stdout (refusals: stderr)
    host = one_host(args)
    remote = SshRemote(args.timeout)
    holder = read_lock(remote, host)
    row = {"host": host.name, **holder_row(holder)}
    if not args.release or holder is None:
        if args.json:
            print(json.dumps({**row, "released": False} if args.release else row, indent=2))
        elif holder is None:
            out.print(f"{host.name}: lock free" + ("; nothing to release" if args.release else ""))
        else:
            out.print(f"{host.name}: {row['state']}: {escape(describe(holder))}")
        return 0
    if holder.get("alive"):
        return refused(f"{host.name}: the holder is alive: {escape(describe(holder))}; wait for "
                       "it to end (or stop it on the host), then look again")
    rc, out_text = remote.run(host, hosttool.lock_release(args.reason, deployed_by()), timeout=60)
    if rc != 0:
        return refused(f"{host.name}: {escape(out_text.strip()[-400:])}")
    said = (out_text.strip().splitlines() or [""])[-1]
    if args.json:
        print(json.dumps({**row, "released": True, "said": said}, indent=2))
    else:
        out.print(f"{host.name}: {escape(said)}")
    return 0
