"""Carry a bump's plan out (``rigfleet bump``, ``rollback``) and record it, and finish an
unfinished one (``--abandon``: record it and stop); docs/bump.md tells the steps and the journal::

    rc = execute(opts, inputs, SshRemote(), plan, candidate, "0.21.0")
    rc = run_journal(args)     # None: no unfinished bump
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.markup import escape

from rigfleet.bump import images
from rigfleet.bump.candidate import Candidate, parse_image_arg
from rigfleet.bump.decide import BumpOptions, Inputs, load_fleet, load_inputs
from rigfleet.bump.images import MirrorRegistry, copy_image
from rigfleet.bump.journal import BumpJournal, JournalError, journal_path, load_journal
from rigfleet.bump.output import (
    EXIT_FAILED,
    EXIT_OK,
    confirm,
    error,
    exit_status,
    interrupted,
    log,
    print_journal,
    print_result,
    progress,
    refused,
)
from rigfleet.bump.plan import Plan
from rigfleet.bump.rollout import (
    HostOutcome,
    PyinfraRunner,
    Resume,
    RolloutResult,
    Status,
    StillRunning,
    outcome_of,
    pins_after,
    probe_of_record,
    rollout,
)
from rigfleet.cliargs import UsageError, select
from rigfleet.errors import RigfleetError
from rigfleet.hostside.records import now_iso
from rigfleet.inventory import InventoryHost
from rigfleet.pins import Pins, PinsError, dump_pins, save_pins, write_keeping_mode
from rigfleet.registry import RegistryError
from rigfleet.resources import PROJECT_ROOT, deployed_by
from rigfleet.ssh import HostUnreachable, Remote, SshRemote


def execute(opts: BumpOptions, inputs: Inputs, remote: Remote, plan: Plan,
            candidate: Candidate | None, version: str, journal: BumpJournal | None = None,
            history: dict[str, Any] | None = None) -> int:
    """Roll ``plan`` out and record it; ``history``: more fields for the pins history entry."""
    real = Path(plan.pins.path)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = PROJECT_ROOT / "reports" / "bumps" / stamp
    if journal is None:
        cand = None if candidate is None else {  # what a resume needs
            k: v for k, v in asdict(candidate).items() if k != "image_id"}
        journal = BumpJournal.start(plan, f"{stamp}-{os.getpid()}", deployed_by(), cand, version,
                                    history)
        log(f"journal {journal.path} (kept until the pins file records this bump)")
    cand_path = real.with_name(f".{real.name}.bump-{os.getpid()}.yaml")
    cand_path.write_text("# Candidate pins of a running `rigfleet bump`; removed when it ends.\n"
                         + dump_pins(plan.candidate_pins(str(cand_path))))
    runner = PyinfraRunner(opts.inventory, {h.name: h for h in inputs.hosts}, remote,
                           deploy_file=opts.deploy, log_dir=log_dir)
    try:
        with progress("starting the rollout") as on_line:
            result = rollout(plan, runner, cand_path, on_event=lambda m: log(escape(m)),
                             on_line=on_line, journal=journal, resume=resume_of(journal))
        # Ctrl-C in a long docker save or mirror copy: the pins file does not record it yet.
        kept = keep_images(opts, inputs, remote, plan, result, candidate, version)
    except (StillRunning, KeyboardInterrupt) as e:
        return interrupted(journal, e, opts.inventory)
    finally:
        cand_path.unlink(missing_ok=True)
    # journal.history: a rollback's action and serial, resumed or not
    extra = {**kept, "bump_id": journal.id, **journal.history}
    saved_pins = record_pins(plan, result, extra)
    end_journal(journal, result, saved_pins)
    restore(runner, result, real)
    what = str(journal.history.get("action") or "bump")  # a rollback's, resumed or not
    print_result(result, log_dir, what)
    summary = {"outcome": outcome_of(result), "stopped": result.stopped,
               "seconds": round(result.seconds, 1), "pins_file": plan.pins.path,
               "pins_serial": saved_pins.serial if saved_pins else plan.pins.serial,
               "hosts": {h: o.summary() for h, o in result.outcomes.items()}, **extra}
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if opts.json:
        print(json.dumps(summary, indent=2))
    return exit_status(result, what)


def resume_of(journal: BumpJournal) -> Resume:
    before = (journal.deploying or {}).get("before") or {}
    return Resume({h: HostOutcome.from_record(h, o) for h, o in journal.outcomes.items()},
                  {h: probe_of_record(before.get(h)) for h in journal.in_flight})


def end_journal(journal: BumpJournal, result: RolloutResult, saved: Pins | None) -> None:
    """Remove the journal once the pins file records the bump (or nothing promoted)."""
    if saved is None and outcome_of(result) != "failed":
        log(f"[yellow]kept {journal.path}[/yellow]: the pins file does not record this bump, "
             "so converges keep reading the journal (or refuse, now that the pins file moved "
             "on); merge the result, then `rigfleet bump --abandon` records it")  # fmt: skip
        return
    journal.path.unlink(missing_ok=True)


def keep_images(opts: BumpOptions, inputs: Inputs, remote: Remote, plan: Plan,
                result: RolloutResult, candidate: Candidate | None, version: str) -> dict[str, Any]:
    """Prune old images on promoted hosts; save the promoted image; copy it to the mirror."""
    if candidate is None:
        return {}
    by_name = {h.name: h for h in inputs.hosts}
    promoted = [o.host for o in result.by_status(Status.PROMOTED)]
    if not opts.no_prune:
        for name in promoted:
            keep = {p.digest for p in [*plan.old_for(name).values(), *plan.new_for(name).values()]}
            try:
                removed = images.prune(remote, by_name[name], candidate.repository, keep)
            except HostUnreachable as e:
                log(f"[yellow]{name}: image prune skipped[/yellow]: {e}")
                continue
            if removed:
                log(f"{name}: removed {len(removed)} older image(s): {', '.join(removed)}")
        # A host that rolled back does not need the candidate it refused (~30 GB each).
        for o in result.by_status(Status.FAILED):
            if o.runs_new is False:
                with contextlib.suppress(HostUnreachable):
                    images.remove_image(remote, by_name[o.host], candidate)
    source = plan.canary if plan.canary in promoted else (promoted[0] if promoted else None)
    if source is None:  # nothing promoted: nothing worth keeping
        return {}
    extra: dict[str, Any] = {}
    if opts.save_dir:
        try:
            saved = images.save_image(remote, by_name[source], candidate, opts.save_dir, version)
            extra["saved"] = saved.summary()
            log(f"saved {candidate.image} to {saved.path} ({saved.size / 1e9:.2f} GB)")
        except (images.ImageError, HostUnreachable, OSError) as e:
            log(f"[red]docker save failed[/red]: {e}")
            extra["saved"] = {"error": str(e)}
    if mirror := inputs.mirror:
        try:
            copied = copy_image(MirrorRegistry(inputs.registry), MirrorRegistry(mirror),
                                candidate.repository, candidate.tag, candidate.digest)  # fmt: skip
            extra["mirror"] = asdict(copied)
            log(f"mirrored {copied.ref} at {copied.digest} ({copied.blobs_copied} blob(s), "
                 f"{copied.bytes_copied / 1e9:.2f} GB copied)")  # fmt: skip
        except RegistryError as e:
            log(f"[red]copy to {mirror} failed[/red]: {e}")
            extra["mirror"] = {"error": str(e)}
    return extra


def restore(runner: PyinfraRunner, result: RolloutResult, pins_file: Path) -> None:
    """Converge hosts that rolled back on the pins file as now saved: the deploy had moved the
    rest of the host (Genesis checkout, other compose files) to the candidate pins."""
    hosts = [o.host for o in result.by_status(Status.FAILED) if o.runs_new is False]
    if not hosts:
        return
    log(f"re-converging {', '.join(hosts)} on {pins_file} (Genesis checkout, compose files)")
    with progress("re-converging rolled-back hosts") as on_line:
        done = runner.deploy(hosts, pins_file, "restore", on_line)
    if done.rc != 0:
        bad = ", ".join(sorted(done.failed_hosts or hosts))
        log(f"[yellow]warning:[/yellow] re-converge failed on {bad}; run the deploy for them "
             "(they still serve their old pins)")  # fmt: skip


def record_pins(plan: Plan, result: RolloutResult, extra: dict[str, Any]) -> Pins | None:
    new, entry = pins_after(plan, result, now_iso(suffix="Z"), deployed_by(), extra)
    if new is None:
        log(f"pins file unchanged: {plan.pins.path}")
        return None
    try:
        saved = save_pins(new, entry)
    except PinsError as e:
        # Saved by someone else meanwhile: this result goes beside it, to merge, as save_pins
        # would have written it (the next serial, in the entry too), atomically (its only record).
        aside = Path(f"{plan.pins.path}.bump-result.yaml")
        history = [*new.history, {**(entry or {}), "serial": new.serial + 1}]
        write_keeping_mode(aside, dump_pins(replace(new, serial=new.serial + 1, history=history)))
        log(f"[red]pins file not saved[/red]: {e}\n  this bump's result is in {aside}; the "
             "hosts run what it lists")  # fmt: skip
        return None
    log(f"pins file {plan.pins.path} saved at serial {saved.serial} "
        f"({entry['outcome'] if entry else ''})")
    for host, stacks in saved.hosts.items():
        log(f"  hosts.{host}: " + ", ".join(f"{s} {p.tag}" for s, p in stacks.items()))
    return saved


def run_journal(args: argparse.Namespace) -> int | None:
    """The exit status of handling an unfinished bump; None when there is none."""
    abandon = bool(getattr(args, "abandon", False))
    try:
        hosts, _, pins, first = load_fleet(args.inventory, args.deploy)
        journal = load_journal(pins, first.catalog)
    except JournalError as e:  # the deploy refuses every host over it: no bump can start
        return error(escape(str(e)))
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
        with contextlib.suppress(PermissionError):  # another user's process: alive
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
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
    try:
        journal.take_over()
    except JournalError as e:  # another resume or --abandon took it over since it was read
        return refused(escape(str(e)))
    return execute(opts, inputs, SshRemote(connect_timeout=args.timeout), journal.plan(inputs.pins),
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
    try:
        journal.take_over()
    except JournalError as e:  # another resume or --abandon took it over since it was read
        return refused(escape(str(e)))
    try:
        result = rollout(plan, runner, Path(pins.path), on_event=log, journal=journal, resume=stop)
    except StillRunning as e:
        return interrupted(journal, e, args.inventory)
    saved = record_pins(plan, result, {"bump_id": journal.id, "abandoned": True})
    print_journal(journal)
    end_journal(journal, result, saved)
    return EXIT_OK if saved is not None or outcome_of(result) == "failed" else EXIT_FAILED
