"""``rigfleet logs HOST``: the serving stack's engine log, the supervisor's, and the ledger.

Over rigfleet's SSH (``rigfleet.ssh``: the inventory's login, ssh_config, ``sudo -n`` for
``_sudo`` hosts); the commands are built in ``rigfleet.commands.logs``::

    rigfleet logs host1                          # the last 100 lines of each
    rigfleet logs host1 --since 30m --source engine
    rigfleet logs host1 --stack tq3-mtp-genesis --follow

The engine log is ``docker compose logs`` of the active stack's project (``--stack S``: that
staged stack's project), the supervisor's is ``journalctl -u rigfleet-supervise.service``, the
ledger is one line per event (time, event, result, stack, image, gate, who, why). ``--since``
takes a duration (``30s``, ``10m``, ``2h``, ``1d``) or a UTC time (``2026-12-03T10:00:00Z``);
a duration counts back from this machine's clock. ``--follow`` streams all three until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO, cast

from rigfleet.cliargs import UsageError, host_command, one_host
from rigfleet.commands import logs as cmds
from rigfleet.hostside.layout import HOST

_DURATION = re.compile(r"(\d+)(s|m|h|d)")
# Terminal control sequences (docker compose clears its progress line even with --no-color).
_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
SINCE_ALLOWED = "a duration (30s, 10m, 2h, 1d) or a UTC time (2026-12-03T10:00:00Z)"
NOT_STAGED = 3  # the remote command's exit status when --stack's compose file is not there


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """``--since``'s value as a UTC time; ``UsageError`` names the flag and what is allowed."""
    text = value.strip()
    try:
        if m := _DURATION.fullmatch(text):
            now = now or datetime.now(UTC)
            return now - timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):  # not a time, or one before year 1
        raise UsageError(f"--since: {value!r}; allowed: {SINCE_ALLOWED}") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def build(stack: str | None, sources: list[str], since: datetime | None, lines: int | None,
          follow: bool) -> str:
    compose = str(HOST.compose_file(stack)) if stack else str(HOST.active_compose)
    docker_since = since.strftime("%Y-%m-%dT%H:%M:%SZ") if since else None
    journal_since = since.strftime("%Y-%m-%d %H:%M:%S UTC") if since else None
    made = {"engine": cmds.engine(compose, since=docker_since, tail=lines, follow=follow),
            "supervisor": cmds.supervisor(since=journal_since, tail=lines, follow=follow),
            "ledger": cmds.ledger(tail=lines, follow=follow)}  # then filtered by since here
    combined = cmds.combined([made[source] for source in sources], follow)
    if stack and "engine" in sources:  # a stack not staged: say so, not docker compose's error
        return f"test -e {shlex.quote(compose)} || exit {NOT_STAGED}; {combined}"
    return combined


def ledger_line(text: str, since: datetime | None = None) -> str | None:
    """One ledger record as one readable line; None when older than ``since``."""
    try:
        rec = json.loads(text)
    except ValueError:
        return f"(not JSON: {text[:200]})"
    if not isinstance(rec, dict):
        return f"(not a record: {text[:200]})"
    stamp = str(rec.get("time") or "?")
    with suppress(ValueError):
        if since is not None and datetime.fromisoformat(stamp.replace("Z", "+00:00")) < since:
            return None
    image = str(rec.get("image") or "")
    parts = [stamp, str(rec.get("event") or "?"), str(rec.get("result") or "?"),
             str(rec.get("stack") or "-"), image.rsplit(":", 1)[-1] if image else "-"]
    gate = rec.get("gate")
    if isinstance(gate, dict) and gate.get("result") not in (None, "not-run"):
        parts.append(f"gate {gate.get('result')}")
    if rec.get("by"):
        parts.append(f"by {rec['by']}")
    return " ".join(parts) + (f": {rec['reason']}" if rec.get("reason") else "")


@dataclass
class Printer:
    """Splits the tagged stream into lines and prints them, the ledger's made readable."""

    since: datetime | None
    out: Any = field(default_factory=lambda: sys.stdout)
    prefix: bool = True
    as_json: bool = False
    buf: bytes = b""
    failed: list[str] = field(default_factory=list)  # the sources whose command failed

    def write(self, data: bytes) -> int:
        self.buf += data
        *done, self.buf = self.buf.split(b"\n")
        for raw in done:
            self.line(raw.decode(errors="replace"))
        return len(data)

    def flush(self) -> None:
        if self.buf:
            self.line(self.buf.decode(errors="replace"))
            self.buf = b""

    def line(self, text: str) -> None:
        tag, sep, rest = _CSI.sub("", text).partition("\t")
        if not sep:
            tag, rest = "?", text
        if rest.startswith(cmds.EXITED):
            self.failed.append(tag)
            rest = f"(its command exited {rest[len(cmds.EXITED):]}; what it said is above)"
        elif tag == "ledger":
            shown = ledger_line(rest, self.since)
            if shown is None:
                return
            rest = shown
        if self.as_json:
            self.out.write(json.dumps({"source": tag, "line": rest}) + "\n")
        else:
            self.out.write((f"{tag:<10} | {rest}" if self.prefix else rest) + "\n")
        self.out.flush()


def add_parser(subparsers: Any) -> None:
    p = host_command(subparsers, "logs", "a host's engine log, supervisor log and ledger", __doc__)
    p.add_argument("--stack", metavar="S", help="this staged stack's engine (default: the one "
                   "that serves)")
    p.add_argument("--source", action="append", choices=cmds.SOURCES, default=[],
                   help="only this log (repeatable; default all three)")
    p.add_argument("--since", metavar="T", help=SINCE_ALLOWED)
    p.add_argument("-n", "--lines", type=int, metavar="N",
                   help="the last N lines of each log (default 100 without --since)")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming new lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rigfleet.ssh import SshRemote

    since = parse_since(args.since) if args.since else None
    if args.lines is not None and args.lines < 0:
        raise UsageError(f"--lines: {args.lines}; allowed: 0 or more")
    if args.stack is not None and not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", args.stack):
        raise UsageError(f"--stack: {args.stack!r}; allowed: a stack name (int8, ...)")
    lines = args.lines if args.lines is not None else (None if since else 100)
    host = one_host(args)
    sources = list(dict.fromkeys(args.source)) or list(cmds.SOURCES)
    command = build(args.stack, sources, since, lines, args.follow)
    printer = Printer(since, prefix=len(sources) > 1, as_json=args.json)
    try:
        rc, err = SshRemote(args.timeout).stream_out(host, command, cast(BinaryIO, printer),
                                                    timeout=24 * 3600 if args.follow else 300)
    finally:
        printer.flush()
    if err.strip():
        sys.stderr.write(err)
    if rc == NOT_STAGED and args.stack and "engine" in sources:
        raise UsageError(f"{host.name}: --stack {args.stack}: not staged there (no "
                         f"{HOST.compose_file(args.stack)}); allowed: a stack staged on "
                         f"{host.name}")
    return 0 if rc == 0 and not printer.failed else 1
