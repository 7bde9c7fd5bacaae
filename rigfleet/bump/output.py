"""What ``rigfleet bump`` (and ``rollback``, ``lock``) say: one console on stderr, timestamped
lines, who runs the command, the plan and result tables, and the exit status::

    log("registry https://registry-1.docker.io: listing the tags of vllm/vllm-openai")
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.markup import escape
from rich.text import Text

from rigfleet.bump.genesis import GenesisChoice
from rigfleet.bump.images import VersionProbe
from rigfleet.bump.journal import BumpJournal
from rigfleet.bump.plan import Plan, pin_text
from rigfleet.bump.rollout import BAD, RolloutResult, Status, StillRunning, outcome_of, step_label
from rigfleet.cliargs import console
from rigfleet.cliargs import log as log  # the bump modules log through here
from rigfleet.tables import Table

EXIT_OK, EXIT_FAILED, EXIT_SKIPPED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

# Why a host the bump leaves alone is skipped (its pins file entry keeps its old pins).
OUTSIDE_LIMIT = "outside --limit"


def error(message: object, code: int = EXIT_ERROR) -> int:
    console.print(f"[red]error:[/red] {message}")
    return code


def refused(message: object) -> int:
    console.print(f"[red]refused:[/red] {message}")
    return EXIT_FAILED


def confirm(verb: str = "Roll out",
            no_terminal: str = "[red]error:[/red] not a terminal: pass --yes to roll out",
            declined: str = "") -> bool:
    """Ask "``verb``? [y/N]"; print ``no_terminal`` without a terminal, ``declined`` at a no."""
    if not sys.stdin.isatty():
        console.print(no_terminal)
        return False
    if console.input(f"{verb}? [y/N] ").strip().lower() in ("y", "yes"):
        return True
    if declined:
        console.print(declined)
    return False


@contextmanager
def progress(title: str) -> Iterator[Callable[[str], None]]:
    """A spinner saying ``title``, then each line given (escaped, with the seconds so far)."""
    with console.status(title) as status:
        t0 = time.monotonic()
        yield lambda line: status.update(f"[{time.monotonic() - t0:5.0f}s] {escape(line[:110])}")


def print_plan(plan: Plan, genesis: dict[str, GenesisChoice], probe: VersionProbe) -> None:
    table = Table("rigfleet bump: pins", ["stack", "now", "bump to"], keys=("stack",))
    for name, p in plan.new_stacks.items():
        new = pin_text(p)
        if probe.source == "inferred":
            new += " (version from the Genesis allowlist; read from the image when it runs)"
        elif probe.version is None and plan.pins.stacks[name].digest != p.digest:
            new += " (read from the image when the canary pulls it)"
        table.row(name, pin_text(plan.pins.stacks[name]), new)
    table.print(console)
    for name, g in genesis.items():
        if g.proposed:
            also = "" if g.rollback_safe else ", but not the one running now"
            than = "newer" if g.newer else "older"  # --genesis may name an older commit
            console.print(f"Genesis for {name}: {g.label} ({than} than the pin; it lists the "
                          f"candidate's vLLM{also})")  # fmt: skip
    print_steps(plan, "rollout")
    for note in plan.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


def print_steps(plan: Plan, what: str) -> None:
    """The plan's canary, batches, skipped and up-to-date hosts, and its stop rule."""
    hosts = Table(what, ["step", "hosts"], keys=("step",))
    for i, batch in enumerate(plan.batches):
        hosts.row(step_label(i), ", ".join(f"{h} ({plan.host(h).stack})" for h in batch))
    for name, reason in plan.skipped.items():
        hosts.row(Text("skipped", style="yellow"), f"{name}: {reason}" if "--limit" in reason
                  else f"{name}: unreachable ({reason})")
    for name in plan.up_to_date:
        hosts.row("done", f"{name}: already runs these pins")
    hosts.print(console)
    console.print(f"batch size {plan.batch_size}; stop after {plan.max_failures} failed "
                  f"host(s); a failed canary always stops the {what}")


def print_result(result: RolloutResult, log_dir: Path, what: str = "bump") -> None:
    table = Table(f"rigfleet {what}: {outcome_of(result)} in {result.seconds:.0f}s",
                  ["host", "result", "gate", "reason"])
    colors = {Status.PROMOTED: "green", Status.UP_TO_DATE: "green", Status.FAILED: "red",
              Status.LOST: "red", Status.SKIPPED: "yellow", Status.NOT_ATTEMPTED: "yellow"}
    for o in result.outcomes.values():
        table.row(o.host, Text(str(o.status), style=colors[o.status]), o.gate or "-",
                  o.reason or "-")
    table.print(console)
    if result.stopped:
        console.print(f"[red]stopped:[/red] {result.stopped}")
    console.print(f"[dim]pyinfra logs: {log_dir}[/dim]")


def exit_status(result: RolloutResult, what: str = "bump") -> int:
    if bad := result.by_status(*BAD):
        parts = [f"{o.host} {o.status}" + (f" (failed checks: {', '.join(o.failed_checks)})"
                                           if o.failed_checks else "") for o in bad]
        console.print(f"[red]{what} failed:[/red] {'; '.join(parts)}")
        return EXIT_FAILED
    if skipped := [o for o in result.by_status(Status.SKIPPED) if OUTSIDE_LIMIT not in o.reason]:
        names = ", ".join(f"{o.host} ({o.reason or 'unreachable'})" for o in skipped)
        said = "promoted, but" if result.by_status(Status.PROMOTED) else "nothing promoted;"
        console.print(f"[yellow]{said} skipped host(s): {names}[/yellow]")
        return EXIT_SKIPPED
    return EXIT_OK


def interrupted(journal: BumpJournal, error: BaseException, inventory: str) -> int:
    """The rollout stopped early (Ctrl-C, a swap that still runs): say what the journal keeps."""
    again = f"`rigfleet bump --inventory {inventory}`"
    if isinstance(error, StillRunning):
        console.print(f"[yellow]not yet:[/yellow] {error}; {journal.path} is kept: run {again} "
                      "again once it ended")
        return EXIT_FAILED
    moved = ", ".join(journal.promoted) or "none"
    console.print(f"[red]interrupted[/red]: {journal.path} records this bump (on the candidate: "
                  f"{moved}); converges keep those hosts there. {again} finishes it; add "
                  "--abandon to record it and stop")
    return EXIT_INTERRUPTED


def print_journal(journal: BumpJournal) -> None:
    """Where each host of an unfinished bump stands."""
    table = Table(f"unfinished bump {journal.id}: {journal.target()}",
                  ["host", "step", "state", "since"])
    steps = {h: step_label(i) for i, batch in enumerate(journal.planned.batches) for h in batch}
    for h in journal.planned.hosts:
        view = journal.host_view(h.name) or {}
        table.row(h.name, steps.get(h.name, "-"), str(view.get("state", "-")),
                  str(view.get("since") or "-"))
    table.print(console)
