"""Commands that read a host's logs (``rigfleet logs``): every output line starts with its
source's tag and a tab, so one stream carries them all::

    combined([engine(compose_file, since=T), supervisor(tail=200), ledger()], follow=True)
"""

from __future__ import annotations

import shlex

from rigfleet.hostside.layout import HOST, SUPERVISE_UNIT

SOURCES = ("engine", "supervisor", "ledger")
EXITED = "rigfleet-logs-exit:"


def _tagged(tag: str, command: str) -> str:
    # sed -u: line-buffered, so a followed stream shows each line as it comes. The pipe would
    # hide a failing source's exit status: its last line says it (EXITED and the status).
    script = "s/^/" + tag + "\t/"
    return (f"{{ {command} ; s=$? ; [ $s -eq 0 ] || echo {EXITED}$s ; }} 2>&1 | "
            f"sed -u {shlex.quote(script)}")


def _reader(tag: str, args: list[str], tail_flag: str, since: str | None, tail: int | None,
            follow: bool) -> str:
    if since:
        args += ["--since", since]
    if tail is not None:
        args += [tail_flag, str(tail)]
    if follow:
        args.append("--follow")
    return _tagged(tag, shlex.join(args))


def engine(compose_file: str, *, since: str | None = None, tail: int | None = None,
           follow: bool = False) -> str:
    """``docker compose logs`` of the serving project (``name:`` of ``compose_file``)."""
    return _reader("engine", ["docker", "compose", "-f", compose_file, "logs", "--no-color",
                              "--timestamps"], "--tail", since, tail, follow)


def supervisor(*, since: str | None = None, tail: int | None = None,
               follow: bool = False) -> str:
    return _reader("supervisor", ["journalctl", "-u", SUPERVISE_UNIT, "--no-pager", "-o",
                                  "short-iso-precise"], "-n", since, tail, follow)


def ledger(*, tail: int | None = None, follow: bool = False) -> str:
    """The ledger's JSON lines (the control side filters ``--since`` and pretty-prints)."""
    path = shlex.quote(str(HOST.ledger_file))
    if follow:
        command = f"tail -n {tail if tail is not None else '+1'} -F {path}"
    elif tail is not None:
        command = f"tail -n {tail} {path}"
    else:
        command = f"cat {path}"
    return _tagged("ledger", f"if test -e {path}; then {command}; fi")  # none yet: no lines


def combined(commands: list[str], follow: bool = False) -> str:
    """``commands`` one after another, or side by side (``follow``)."""
    if not follow:
        return " ; ".join(f"( {c} )" for c in commands)
    return " ".join(f"( {c} ) &" for c in commands) + " wait"
