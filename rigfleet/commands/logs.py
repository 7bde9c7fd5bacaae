"""Commands that read a host's logs (``rigfleet logs``): built here, run over ``rigfleet.ssh``.

Three sources, each a shell command whose every output line starts with its tag (``engine``,
``supervisor``, ``ledger``) and a tab, so one stream can carry them all (``--follow``)::

    engine("/var/lib/rigfleet/active/compose.yaml", since="2026-12-03T10:00:00Z", tail=200)
    supervisor(since="2026-12-03T10:00:00Z", follow=True)
    combined([engine(...), supervisor(...), ledger(...)], follow=True)
"""

from __future__ import annotations

import shlex

from rigfleet.hostside.layout import HOST, SUPERVISE_UNIT

SOURCES = ("engine", "supervisor", "ledger")


def _tagged(tag: str, command: str) -> str:
    # sed -u: line-buffered, so a followed stream shows each line as it comes.
    script = "s/^/" + tag + "\t/"
    return f"{{ {command} ; }} 2>&1 | sed -u {shlex.quote(script)}"


def engine(compose_file: str, *, since: str | None = None, tail: int | None = None,
           follow: bool = False) -> str:
    """``docker compose logs`` of the serving project (``name:`` of ``compose_file``)."""
    args = ["docker", "compose", "-f", compose_file, "logs", "--no-color", "--timestamps"]
    if since:
        args += ["--since", since]
    if tail is not None:
        args += ["--tail", str(tail)]
    if follow:
        args.append("--follow")
    return _tagged("engine", " ".join(shlex.quote(a) for a in args))


def supervisor(*, since: str | None = None, tail: int | None = None,
               follow: bool = False) -> str:
    """The supervisor unit's journal (``journalctl -u rigfleet-supervise.service``)."""
    args = ["journalctl", "-u", SUPERVISE_UNIT, "--no-pager", "-o", "short-iso-precise"]
    if since:
        args += ["--since", since]
    if tail is not None:
        args += ["-n", str(tail)]
    if follow:
        args.append("--follow")
    return _tagged("supervisor", " ".join(shlex.quote(a) for a in args))


def ledger(*, tail: int | None = None, follow: bool = False) -> str:
    """The ledger's JSON lines (the control side filters ``--since`` and pretty-prints)."""
    path = shlex.quote(str(HOST.ledger_file))
    if follow:
        command = f"tail -n {tail if tail is not None else '+1'} -F {path}"
    elif tail is not None:
        command = f"tail -n {tail} {path}"
    else:
        command = f"cat {path}"
    return _tagged("ledger", f"test -e {path} && {command}")


def combined(commands: list[str], follow: bool = False) -> str:
    """One command running ``commands`` one after another, or side by side (``follow``;
    ends when they all do, or when the SSH session closes)."""
    if not follow:
        return " ; ".join(f"( {c} )" for c in commands)
    return " ".join(f"( {c} ) &" for c in commands) + " wait"
