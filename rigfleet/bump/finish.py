"""An unfinished bump (its journal beside the pins file, docs/bump.md): any ``rigfleet bump``
finishes it (unless it asks for another candidate: refused), ``--abandon`` records it and
stops, one still running is left alone::

    rc = run_journal(args)     # None: no unfinished bump
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from rigfleet.bump.candidate import Candidate, parse_image_arg
from rigfleet.bump.decide import BumpOptions, load_fleet, load_inputs
from rigfleet.bump.execute import end_journal, execute, record_pins, resume_of
from rigfleet.bump.journal import BumpJournal, journal_path, load_journal
from rigfleet.bump.output import (
    EXIT_FAILED,
    EXIT_OK,
    confirm,
    error,
    interrupted,
    log,
    print_journal,
    refused,
)
from rigfleet.bump.rollout import (
    HostOutcome,
    PyinfraRunner,
    Resume,
    Status,
    StillRunning,
    outcome_of,
    rollout,
)
from rigfleet.cliargs import UsageError, select
from rigfleet.errors import RigfleetError
from rigfleet.inventory import InventoryHost
from rigfleet.pins import Pins
from rigfleet.resources import deployed_by
from rigfleet.ssh import SshRemote


def run_journal(args: argparse.Namespace) -> int | None:
    """The exit status of handling an unfinished bump; None when there is none."""
    abandon = bool(getattr(args, "abandon", False))
    try:
        hosts, _, pins, first = load_fleet(args.inventory, args.deploy)
        journal = load_journal(pins, first.catalog)
    except (RigfleetError, ValueError, RuntimeError) as e:
        return error(e) if abandon else None  # else the bump's own input checks say what is wrong
    if journal is None or journal.state == "finished":
        if journal is not None and not args.dry:
            journal.path.unlink(missing_ok=True)
            log(f"removed {journal.path}: {journal.id} had finished (pins serial {pins.serial})")
        return error(f"--abandon: no unfinished bump ({journal_path(pins.path)} does not "
                     "exist)") if abandon else None
    pid = journal.owner.get("pid")
    if journal.owner.get("host") == socket.gethostname() and isinstance(pid, int) \
            and pid != os.getpid() and _alive(pid):
        return refused(f"{journal.describe()} is running now (pid {pid}); wait for it to end")
    if abandon:
        return _abandon(args, journal, pins, hosts)
    if journal.state == "stale":
        return refused(f"{pins.path} is at serial {pins.serial}, but {journal.describe()} "
                       f"started from serial {journal.base_serial}: it cannot be finished over "
                       f"another pins file. Run `rigfleet bump --inventory {args.inventory} "
                       "--abandon` to record what it promoted")
    if other := other_target(args, journal):
        return refused(f"{journal.describe()} is unfinished; {other}. Run `rigfleet bump "
                       f"--inventory {args.inventory}` to finish it, or add --abandon to record "
                       "what it promoted and stop; then bump again")
    if limit := getattr(args, "limit", None):  # the resume deploys the journal's plan
        picked = {h.name for h in select(hosts, limit, args.inventory)}
        if outside := [h for batch in journal.planned.batches for h in batch
                       if h not in journal.outcomes and h not in picked]:
            return refused(f"{journal.describe()} is unfinished and would still deploy "
                           f"{', '.join(outside)}, outside --limit {' '.join(limit)}; nothing "
                           "changed. Run it without --limit to finish it, or add --abandon "
                           "to record what it promoted and stop")
    return _resume(args, journal)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def other_target(args: argparse.Namespace, journal: BumpJournal) -> str | None:
    """Why the command line asks for another bump than the journal's, or None."""
    cand, new = journal.candidate, journal.planned.new_stacks
    if args.image:
        default = cand["repository"] if cand else "vllm/vllm-openai"
        repository, tag = parse_image_arg(args.image, default)
        if cand is None or (repository, tag) != (cand["repository"], cand["tag"]):
            had = f"{cand['repository']}:{cand['tag']}" if cand else "no image"
            return f"--image {args.image} is not its candidate ({had})"
    if args.genesis:
        commits = {p.genesis.commit for p in new.values() if p.genesis}
        if not any(c.startswith(args.genesis) for c in commits):
            return f"--genesis {args.genesis} is not its Genesis ({', '.join(sorted(commits))})"
    if args.stack and set(args.stack) != set(new):
        return f"--stack {' '.join(args.stack)} are not its stacks ({', '.join(new)})"
    if args.latest:
        log(f"--latest: finishing {journal.describe()} first (not resolved again)")
    return None


def _resume(args: argparse.Namespace, journal: BumpJournal) -> int:
    """Finish the journal's plan: its outcomes stand, in-flight hosts are read, the rest runs."""
    cand, plan = journal.candidate, journal.planned
    genesis = next((p.genesis.commit for p in plan.new_stacks.values() if p.genesis), None)
    try:
        opts = BumpOptions.from_args(
            args, image=f"{cand['repository']}:{cand['tag']}" if cand else None, latest=False,
            genesis=None if cand else genesis, stacks=tuple(plan.new_stacks),
            batch_size=plan.batch_size, max_failures=plan.max_failures,
            rollback_to=journal.base_serial if not (cand or genesis) else None)  # a rollback's
        inputs = load_inputs(opts)
    except UsageError:
        raise
    except (RigfleetError, ValueError, RuntimeError) as e:
        return error(e)
    known = {h.name for h in inputs.hosts}
    if missing := [h.name for h in plan.hosts if h.name not in known]:
        return refused(f"{journal.describe()} covers {', '.join(missing)}, which "
                       f"{opts.inventory} no longer lists; add them back, or --abandon")
    log(f"resuming {journal.describe()}")
    print_journal(journal)
    if opts.dry:
        return EXIT_OK
    if not opts.yes and not confirm():
        log(f"not confirmed; nothing changed ({journal.path} is kept)")
        return EXIT_FAILED
    journal.take_over()
    remote = SshRemote(connect_timeout=args.timeout)
    return execute(opts, inputs, remote, journal.plan(inputs.pins),
                   Candidate(**cand) if cand else None, journal.version, journal=journal)


def _abandon(args: argparse.Namespace, journal: BumpJournal, pins: Pins,
             hosts: list[InventoryHost]) -> int:
    """Record what the journal's bump did into the pins file as it is now; start nothing."""
    if args.dry:
        print_journal(journal)
        log(f"--dry: nothing recorded; without --dry, --abandon records what {journal.id} "
            f"promoted in {pins.path} and removes {journal.path}")
        return EXIT_OK
    by_name = {h.name: h for h in hosts}
    plan = journal.plan(pins)
    remote = SshRemote(connect_timeout=args.timeout)
    runner = PyinfraRunner(args.inventory, by_name, remote, deploy_file=args.deploy)
    resume = resume_of(journal)
    in_flight = {h: f for h, f in resume.in_flight.items() if h in by_name}
    lost = {h: HostOutcome(h, Status.LOST, None, None, "not in the inventory any more")
            for h in resume.in_flight if h not in by_name}
    stop = Resume({**resume.done, **lost}, in_flight, f"abandoned by {deployed_by()}")
    journal.take_over()
    try:
        result = rollout(plan, runner, Path(pins.path), on_event=log, journal=journal, resume=stop)
    except StillRunning as e:
        return interrupted(journal, e, args.inventory)
    saved = record_pins(plan, result, {"bump_id": journal.id, "abandoned": True})
    print_journal(journal)
    end_journal(journal, result, saved)
    return EXIT_OK if saved is not None or outcome_of(result) == "failed" else EXIT_FAILED
