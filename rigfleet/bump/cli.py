"""``rigfleet bump``: move the fleet's vLLM image (and Genesis) forward, canary first.

    rigfleet bump --inventory inventory/home.py --latest --dry
    rigfleet bump --inventory inventory/home.py --image nightly-<40-hex> --yes
    rigfleet bump --inventory inventory/home.py --image nightly-<40-hex> --genesis <commit>
    rigfleet bump ... --batch-size 2 --max-failures 1 --save-dir /srv/images \
        --push-mirror registry.lan:5000

Steps: resolve the candidate in the registry (tag -> digest; ``--latest``: the newest release
tag ``vX.Y.Z`` above the pinned version, by version order; only a Genesis stack whose pinned
Genesis allowlist lists nothing but nightly builds follows the newest nightly, by build
time), check who is reachable, read the candidate's vLLM version on the canary, check
it against Genesis' allowlist (or find a newer Genesis commit that lists it, else refuse
before any host changes), print the plan, then roll out batch by batch through the deploy's
swap gate, prune old images, keep a copy of the promoted one if asked, and write the pins
file for what actually promoted.

An interrupted bump (Ctrl-C, the control machine gone) leaves its journal beside the pins
file (``rigfleet/bump/journal.py``, docs/bump.md): converges keep the hosts it promoted there,
any later ``rigfleet bump`` finishes it, ``rigfleet bump --abandon`` records it and stops.

Exit status: 0 every host promoted; 1 refused, or a host failed (canary, gate, lost);
2 promoted on every reachable host but some were unreachable (the pins file records them on
their old pins); 3 the inventory, the pins file or the registry could not be read;
130 interrupted (the journal says what it did).

Inventory data (group ``all``) may set ``bump_registry`` (registry v2 URL, default Docker
Hub), ``bump_genesis_url`` (where this machine fetches Genesis when the pinned URL is not
reachable from here, such as a mirror) and ``bump_mirror`` (``--push-mirror``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.text import Text

from rigfleet.bump import images
from rigfleet.bump.candidate import (
    Candidate,
    ImageRegistry,
    find_candidate,
    parse_image_arg,
)
from rigfleet.bump.decide import (
    BumpError,
    ImageRefused,
    Inputs,
    bumped_stacks,
    candidate_changes,
    decide_plan,
    latest_candidate,
    refuse_image_rules,
)
from rigfleet.bump.genesis import (
    GenesisChoice,
    GenesisRefused,
    GenesisRepo,
)
from rigfleet.bump.journal import BumpJournal, journal_path, load_journal
from rigfleet.bump.mirror import MirrorRegistry, copy_image
from rigfleet.bump.options import BumpOptions
from rigfleet.bump.output import by, console, log
from rigfleet.bump.plan import build_plan, pairs
from rigfleet.bump.plan_record import Plan, PlanHost
from rigfleet.bump.prefetch import prefetch
from rigfleet.bump.record import outcome_of, pins_after
from rigfleet.bump.resume import end_journal, resume_of, start_journal
from rigfleet.bump.rollout import (
    HostOutcome,
    PyinfraRunner,
    Resume,
    RolloutResult,
    Status,
    StillRunning,
    rollout,
)
from rigfleet.bump.version import VersionProbe, read_version, remove_image
from rigfleet.check import Online, deploy_online, verify_pins
from rigfleet.cliargs import UsageError, add_yes, fleet_options, select
from rigfleet.desired import resolve_pins_path
from rigfleet.errors import RigfleetError
from rigfleet.fleetview import reachability
from rigfleet.hostdata import HostSettings, validate_host
from rigfleet.inventory import InventoryHost, gpu_hosts, load_inventory
from rigfleet.pins import (
    Pins,
    PinsError,
    dump_pins,
    load_pins,
    save_pins,
)
from rigfleet.registry import DOCKER_HUB, RegistryError
from rigfleet.resources import PROJECT_ROOT
from rigfleet.ssh import HostUnreachable, Remote, SshRemote
from rigfleet.tables import Table

EXIT_OK, EXIT_FAILED, EXIT_SKIPPED, EXIT_ERROR = 0, 1, 2, 3
# Why a host the bump leaves alone is skipped (its pins file entry keeps its old pins).
OUTSIDE_LIMIT = "outside --limit"
REPO_ROOT = PROJECT_ROOT

def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``rigfleet bump`` on the CLI's subparsers (``rigfleet/cli.py`` calls this)."""
    p = subparsers.add_parser(
        "bump", parents=[fleet_options(timeout=10.0, timeout_help="seconds per SSH connect")],
        help="roll a newer vLLM image / Genesis commit out, canary first, gated",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--image", metavar="TAG",
                       help="tag to bump to: nightly-<40-hex>, <40-hex> or <repo>:<tag>")
    which.add_argument("--latest", action="store_true",
                       help="the newest vX.Y.Z release above the pinned one (by version; for a "
                            "Genesis stack one its Genesis lists); a Genesis stack whose "
                            "allowlist lists only nightlies: the newest nightly (by build time)")
    p.add_argument("--genesis", metavar="COMMIT",
                   help="pin this Genesis commit (default: keep the pin, or propose a newer "
                        "commit when the pin does not list the candidate's vLLM)")
    p.add_argument("--stack", action="append", default=[], metavar="NAME",
                   help="bump only this stack (repeatable; default: every stack on the image's "
                        "repository, plus the Genesis stacks for --genesis)")
    p.add_argument("--batch-size", type=int, default=1, help="hosts per batch after the canary")
    p.add_argument("--max-failures", type=int, default=1,
                   help="stop after this many failed hosts (a failed canary always stops)")
    p.add_argument("--registry", help="registry v2 URL (default: inventory data bump_registry, "
                                      "else Docker Hub)")
    p.add_argument("--genesis-url",
                   help="fetch Genesis from here (default: inventory data bump_genesis_url, "
                        "else the pinned repo URL)")
    p.add_argument("--save-dir", type=Path,
                   help="docker save the promoted image into this directory (on this machine)")
    p.add_argument("--push-mirror", metavar="URL",
                   help="copy the promoted image (same digest) into this registry v2 URL, "
                        "e.g. http://registry.lan:5000 (default: inventory data bump_mirror)")
    p.add_argument("--no-prune", action="store_true",
                   help="keep every vllm image on the hosts (default: keep new + previous)")
    p.add_argument("--deploy", default=str(REPO_ROOT / "deploy.py"),
                   help="the deploy file (default: this checkout's deploy.py)")
    p.add_argument("--dry", action="store_true", help="print the plan; change nothing")
    add_yes(p, "roll out")
    add_journal_arguments(p)
    p.set_defaults(func=run)
    return p


# --- inputs ----------------------------------------------------------------------------------


def load_fleet(inventory: str, deploy: str) -> tuple[list[InventoryHost], list[PlanHost],
                                                   str, HostSettings]:
    """Inventory hosts, their plan view, the one pins file they share, the first's settings."""
    hosts = gpu_hosts(load_inventory(inventory))  # a balancer-only host serves no stack
    if not hosts:
        raise BumpError(f"{inventory}: no GPU hosts")
    plan_hosts: list[PlanHost] = []
    paths: dict[str, list[str]] = {}
    first = None
    for h in hosts:
        settings = validate_host(h.name, h.data)
        first = first or settings
        plan_hosts.append(PlanHost(h.name, settings.stack, tuple(h.groups)))
        path = str(resolve_pins_path(settings.pins_file, Path(deploy).resolve().parent))
        paths.setdefault(path, []).append(h.name)
    if len(paths) != 1:
        listed = "; ".join(f"{p}: {', '.join(n)}" for p, n in paths.items())
        raise BumpError(f"hosts name different pins files ({listed}); bump one fleet at a time")
    assert first is not None
    return hosts, plan_hosts, next(iter(paths)), first


def load_inputs(opts: BumpOptions) -> Inputs:
    """Inventory, every host's data, the one pins file they share."""
    hosts, plan_hosts, path, first = load_fleet(opts.inventory, opts.deploy)
    pins = load_pins(path, catalog=first.catalog)
    registry = opts.registry or first.bump.registry or DOCKER_HUB
    genesis_url = opts.genesis_url or first.bump.genesis_url
    mirror = opts.push_mirror or first.bump.mirror
    return Inputs(hosts, plan_hosts, pins, str(registry), genesis_url, mirror, first.catalog)


# --- the command -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """``rigfleet bump``; returns the exit status (see the module docstring)."""
    unfinished = run_journal(args)
    if unfinished is not None:
        return unfinished
    try:
        opts = BumpOptions.from_args(args)
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        return EXIT_ERROR
    try:
        inputs = load_inputs(opts)
        if args.limit:
            kept = {h.name for h in select(inputs.hosts, args.limit, args.inventory)}
            if not kept:
                raise BumpError(f"{args.inventory}: --limit {', '.join(args.limit)}: no GPU "
                                "host; allowed: hosts that serve")
            inputs.outside = frozenset(h.name for h in inputs.hosts if h.name not in kept)
    except UsageError:
        raise
    except (RigfleetError, ValueError, RuntimeError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")
        return EXIT_ERROR
    remote = SshRemote(connect_timeout=args.timeout)
    try:
        return _bump(opts, inputs, remote)
    except (GenesisRefused, ImageRefused) as e:
        console.print(f"[red]refused:[/red] {e}")
        return EXIT_FAILED
    except RegistryError as e:
        console.print(f"[red]error:[/red] registry {inputs.registry}: {e}")
        return EXIT_ERROR
    except (RigfleetError, ValueError) as e:
        console.print(f"[red]error:[/red] {e}")
        return EXIT_FAILED


def _bump(opts: BumpOptions, inputs: Inputs, remote: Remote) -> int:
    pins = inputs.pins
    candidate: Candidate | None = None
    names: list[str] | None = None
    genesis_repos: dict[str, GenesisRepo] = {}
    if opts.image or opts.latest:
        repos = {p.repository for p in pins.stacks.values()}
        default_repo = sorted(repos)[0] if len(repos) == 1 else "vllm/vllm-openai"
        repository, tag = parse_image_arg(opts.image or "", default_repo)
        reg = ImageRegistry(inputs.registry)
        if opts.latest:
            candidate, names = latest_candidate(opts, inputs, pins, reg, repository, genesis_repos)
            if candidate is None:
                log("every bumped stack is on the newest release it may take; nothing to do")
                return EXIT_OK
        else:
            log(f"registry {inputs.registry}: resolving {repository}:{tag}")
            candidate = find_candidate(reg, repository, tag)
        log(f"candidate {candidate.image} {candidate.digest} built {candidate.created or '?'}")
    if names is None:
        names = bumped_stacks(opts, pins, candidate.repository if candidate else None)
    if candidate is not None:
        refuse_image_rules(inputs.catalog, names, candidate, None)  # before anything is pulled

    unreachable = reachability(remote, [h for h in inputs.hosts if h.name not in inputs.outside])
    for name in inputs.outside:
        log(f"{name} is outside --limit and will be skipped (it keeps its pins)")
        unreachable[name] = OUTSIDE_LIMIT
    for name, reason in unreachable.items():
        if reason and name not in inputs.outside:
            log(f"[yellow]{name} is unreachable[/yellow] and will be skipped: {reason}")
    by_name = {h.name: h for h in inputs.hosts}

    # The canary reads the candidate's version; a provisional plan picks it (the version
    # changes nothing in who goes first).
    provisional = {
        n: replace(pins.stacks[n], image=candidate.image, digest=candidate.digest,
                   image_id=candidate.image_id)
        if candidate else pins.stacks[n]
        for n in names
    }
    draft = build_plan(inputs.plan_hosts, unreachable, pins, provisional, opts.batch_size,
                       opts.max_failures)  # fmt: skip
    probe = VersionProbe(None, "unknown")
    probe_host: InventoryHost | None = None
    caches: tuple[str, ...] = ()
    if candidate is not None:
        reachable = [h.name for h in inputs.hosts if not unreachable[h.name]]
        target = draft.canary or (reachable[0] if reachable else None)
        if target is None:
            raise BumpError("no host is reachable to read the candidate's vLLM version")
        probe_host = by_name[target]
        if not opts.dry:  # the fleet caches fetch it once; the canary pulls from them
            caches = prefetch(remote, load_inventory(opts.inventory), candidate, log)
        log(f"{probe_host.name}: reading vllm.__version__ from the candidate"
             f"{'' if opts.dry else ' (pulling it by digest if needed)'}")
        probe = read_version(remote, probe_host, candidate, pull=not opts.dry, caches=caches)
        log(f"candidate reports vLLM {probe.version or 'unknown (not pulled in --dry)'}")

    try:
        plan, genesis, probe = decide_plan(opts, inputs, pins, names, candidate, probe, unreachable,
                                       provisional, genesis_repos)  # fmt: skip
        if SOURCES is not None and not plan.empty:
            refuse_missing(inputs, plan, SOURCES())
    except BaseException:
        if probe.pulled and probe_host is not None and candidate is not None:
            remove_image(remote, probe_host, candidate, caches)  # the canary as it was found
        raise
    _print_plan(plan, genesis, probe)
    if opts.dry:
        return EXIT_OK
    if plan.empty:
        log("every reachable host already runs these pins; nothing to do")
        return EXIT_SKIPPED if set(plan.skipped) - inputs.outside else EXIT_OK
    if not opts.yes and not _confirm():
        log("not confirmed; nothing changed")
        return EXIT_FAILED
    return _execute(opts, inputs, remote, plan, candidate, probe.version or "", genesis)


# How the plan's pins are asked of their sources (rigfleet/check.py; tests put None here).
SOURCES: Callable[[], Online] | None = partial(deploy_online, images=True)


def refuse_missing(inputs: Inputs, plan: Plan, run: Online) -> None:
    """``rigfleet check``'s online checks of the plan's pins for every host: a pinned thing
    its source no longer has refuses the bump before any host changes (unreachable: logged)."""
    new = replace(inputs.pins, stacks={**inputs.pins.stacks, **plan.new_stacks})
    refusals, warnings = verify_pins(inputs.hosts, new, run)
    for line in warnings:
        log(f"[yellow]warning:[/yellow] {line}")
    if refusals:
        raise BumpError("\n".join(refusals) + "\nnothing changed; allowed: pins whose every "
                        "thing its source has (`rigfleet check --online`)")


def _confirm() -> bool:
    if not sys.stdin.isatty():
        console.print("[red]error:[/red] not a terminal: pass --yes to roll out")
        return False
    return console.input("Roll out? [y/N] ").strip().lower() in ("y", "yes")


def _print_plan(plan: Plan, genesis: dict[str, GenesisChoice], probe: VersionProbe) -> None:
    table = Table("rigfleet bump: pins", ["stack", "now", "bump to"], keys=("stack",))
    for name, old, new in pairs(plan):
        if probe.source == "inferred":
            new += " (version from the Genesis allowlist; read from the image when it runs)"
        elif probe.version is None and candidate_changes(plan, name):
            new += " (read from the image when the canary pulls it)"
        table.row(name, old, new)
    table.print(console)
    for name, g in genesis.items():
        if g.proposed:
            also = "" if g.rollback_safe else ", but not the one running now"
            console.print(f"Genesis for {name}: {g.label} (newer than the pin; it lists the "
                          f"candidate's vLLM{also})")  # fmt: skip
    hosts = Table("rollout", ["step", "hosts"], keys=("step",))
    for i, batch in enumerate(plan.batches):
        hosts.row("canary" if i == 0 else f"batch {i}",
                      ", ".join(f"{h} ({plan.host(h).stack})" for h in batch))  # fmt: skip
    for name, reason in plan.skipped.items():
        hosts.row(Text("skipped", style="yellow"), f"{name}: unreachable ({reason})"
                  if reason != OUTSIDE_LIMIT else f"{name}: {reason}")
    for name in plan.up_to_date:
        hosts.row("done", f"{name}: already runs these pins")
    hosts.print(console)
    console.print(f"batch size {plan.batch_size}; stop after {plan.max_failures} failed "
                  "host(s); a failed canary always stops the rollout")  # fmt: skip
    for note in plan.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


def _execute(
    opts: BumpOptions,
    inputs: Inputs,
    remote: Remote,
    plan: Plan,
    candidate: Candidate | None,
    version: str,
    genesis: dict[str, GenesisChoice],
    journal: BumpJournal | None = None,
    history: dict[str, Any] | None = None,
) -> int:
    """Roll ``plan`` out and record it; ``history``: more fields for the pins history entry
    (a rollback's ``action`` and target serial)."""
    real = Path(plan.pins.path)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = REPO_ROOT / "reports" / "bumps" / stamp
    journal = journal or start_journal(plan, candidate, version, f"{stamp}-{os.getpid()}")
    cand_path = real.with_name(f".{real.name}.bump-{os.getpid()}.yaml")
    cand_path.write_text(
        "# Candidate pins of a running `rigfleet bump`; removed when it ends.\n"
        + dump_pins(plan.candidate_pins(str(cand_path)))
    )
    by_name = {h.name: h for h in inputs.hosts}
    runner = PyinfraRunner(opts.inventory, by_name, remote, deploy=opts.deploy,
                           cwd=Path(opts.deploy).resolve().parent, log_dir=log_dir)  # fmt: skip
    try:
        with console.status("starting the rollout") as status:
            t0 = time.monotonic()

            def on_line(line: str) -> None:
                status.update(f"[{time.monotonic() - t0:5.0f}s] {line[:110]}")

            result = rollout(plan, runner, cand_path, on_event=log, on_line=on_line,
                             journal=journal, resume=resume_of(journal))
    except (StillRunning, KeyboardInterrupt) as e:
        return interrupted(journal, e, opts.inventory)
    finally:
        cand_path.unlink(missing_ok=True)
    extra = _keep_images(opts, remote, by_name, plan, result, candidate, version,
                         inputs.registry, inputs.mirror)
    extra["bump_id"] = journal.id
    extra.update(history or {})
    saved_pins = _record(plan, result, extra)
    end_journal(journal, result, saved_pins)
    _restore(runner, result, Path(plan.pins.path))
    _print_result(result, log_dir)
    summary = {
        "outcome": outcome_of(result),
        "stopped": result.stopped,
        "seconds": round(result.seconds, 1),
        "pins_file": plan.pins.path,
        "pins_serial": saved_pins.serial if saved_pins else plan.pins.serial,
        "hosts": {h: o.summary() for h, o in result.outcomes.items()},
        **extra,
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if opts.json:
        print(json.dumps(summary, indent=2))
    return _exit_status(result)


def _keep_images(
    opts: BumpOptions,
    remote: Remote,
    by_name: dict[str, InventoryHost],
    plan: Plan,
    result: RolloutResult,
    candidate: Candidate | None,
    version: str,
    registry: str,
    mirror: str | None,
) -> dict[str, Any]:
    """Prune old images on promoted hosts; save the promoted image from the canary; copy it
    into the mirror registry."""
    extra: dict[str, Any] = {}
    if candidate is None:
        return extra
    promoted = [o.host for o in result.by_status(Status.PROMOTED)]
    if not opts.no_prune:
        for name in promoted:
            keep = {p.digest for p in plan.old_for(name).values()}
            keep |= {p.digest for p in plan.new_for(name).values()}
            try:
                removed = images.prune(remote, by_name[name], candidate.repository, keep)
            except HostUnreachable as e:
                log(f"[yellow]{name}: image prune skipped[/yellow]: {e}")
                continue
            if removed:
                log(f"{name}: removed {len(removed)} older image(s): {', '.join(removed)}")
    if not opts.no_prune:
        # A host that rolled back does not need the candidate it refused (~30 GB each).
        for o in result.by_status(Status.FAILED):
            if o.runs_new is False:
                with contextlib.suppress(HostUnreachable):
                    remove_image(remote, by_name[o.host], candidate)
    source = plan.canary if plan.canary in promoted else (promoted[0] if promoted else None)
    if source is None:  # nothing promoted: nothing worth keeping
        return extra
    if opts.save_dir:
        try:
            saved = images.save_image(remote, by_name[source], candidate, opts.save_dir, version)
            extra["saved"] = saved.summary()
            log(f"saved {candidate.image} to {saved.path} ({saved.size / 1e9:.2f} GB)")
        except (images.ImageError, HostUnreachable, OSError) as e:
            log(f"[red]docker save failed[/red]: {e}")
            extra["saved"] = {"error": str(e)}
    if mirror:
        try:
            copied = copy_image(MirrorRegistry(registry), MirrorRegistry(mirror),
                                candidate.repository, candidate.tag, candidate.digest)  # fmt: skip
            extra["mirror"] = copied.summary()
            log(f"mirrored {copied.ref} at {copied.digest} ({copied.blobs} blob(s), "
                 f"{copied.bytes / 1e9:.2f} GB copied)")  # fmt: skip
        except RegistryError as e:
            log(f"[red]copy to {mirror} failed[/red]: {e}")
            extra["mirror"] = {"error": str(e)}
    return extra


def _restore(runner: PyinfraRunner, result: RolloutResult, pins_file: Path) -> None:
    """Converge hosts that rolled back on the pins file as now saved.

    The swap rolls the serving stack back, but the deploy had already moved the rest of the
    host to the candidate pins (the Genesis checkout, the other stack's compose file); one more
    converge on the file (which says these hosts run their old pins) puts those back too. Their
    serving stack is already what the file says, so no swap runs.
    """
    hosts = [o.host for o in result.by_status(Status.FAILED) if o.runs_new is False]
    if not hosts:
        return
    log(f"re-converging {', '.join(hosts)} on {pins_file} (Genesis checkout, compose files)")
    with console.status("re-converging rolled-back hosts") as status:
        done = runner.deploy(hosts, pins_file, "restore",
                             lambda line: status.update(line[:110]))  # fmt: skip
    if done.rc != 0:
        bad = ", ".join(sorted(done.failed_hosts or hosts))
        log(f"[yellow]warning:[/yellow] re-converge failed on {bad}; run the deploy for them "
             "(they still serve their old pins)")  # fmt: skip


def _record(plan: Plan, result: RolloutResult, extra: dict[str, Any]) -> Pins | None:
    when = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    new, entry = pins_after(plan, result, when, by(), extra)
    if new is None:
        log(f"pins file unchanged: {plan.pins.path}")
        return None
    try:
        saved = save_pins(new, entry)
    except PinsError as e:
        # Someone saved the file while the rollout ran: never overwrite their change. Keep
        # what this bump would have written next to it, for a person to merge.
        aside = Path(plan.pins.path).with_name(Path(plan.pins.path).name + ".bump-result.yaml")
        aside.write_text(dump_pins(replace(new, history=[*new.history, entry or {}])))
        log(f"[red]pins file not saved[/red]: {e}\n  this bump's result is in {aside}; the "
             "hosts run what it lists")  # fmt: skip
        return None
    outcome = entry["outcome"] if entry else ""
    log(f"pins file {plan.pins.path} saved at serial {saved.serial} ({outcome})")
    if saved.hosts:
        for host, stacks in saved.hosts.items():
            log(f"  hosts.{host}: " + ", ".join(f"{s} {p.tag}" for s, p in stacks.items()))
    return saved


def _print_result(result: RolloutResult, log_dir: Path) -> None:
    table = Table(f"rigfleet bump: {outcome_of(result)} in {result.seconds:.0f}s",
                  ["host", "result", "gate", "reason"])
    colors = {
        Status.PROMOTED: "green", Status.UP_TO_DATE: "green", Status.FAILED: "red",
        Status.LOST: "red", Status.SKIPPED: "yellow", Status.NOT_ATTEMPTED: "yellow",
    }  # fmt: skip
    for o in result.outcomes.values():
        table.row(o.host, Text(str(o.status), style=colors[o.status]), o.gate or "-",
                  o.reason or "-")
    table.print(console)
    if result.stopped:
        console.print(f"[red]stopped:[/red] {result.stopped}")
    console.print(f"[dim]pyinfra logs: {log_dir}[/dim]")


def _exit_status(result: RolloutResult) -> int:
    bad = result.by_status(Status.FAILED, Status.LOST, Status.NOT_ATTEMPTED)
    if bad:
        parts = []
        for o in bad:
            text = f"{o.host} {o.status}"
            if o.failed_checks:
                text += f" (failed checks: {', '.join(o.failed_checks)})"
            parts.append(text)
        console.print(f"[red]bump failed:[/red] {'; '.join(parts)}")
        return EXIT_FAILED
    skipped = [o for o in result.by_status(Status.SKIPPED) if OUTSIDE_LIMIT not in o.reason]
    if skipped:
        names = ", ".join(f"{o.host} ({o.reason or 'unreachable'})" for o in skipped)
        console.print(f"[yellow]promoted, but skipped host(s): {names}[/yellow]")
        return EXIT_SKIPPED
    return EXIT_OK


# --- interrupted bumps (the journal: rigfleet/bump/journal.py) ------------------------------

EXIT_INTERRUPTED = 130


def add_journal_arguments(p: argparse.ArgumentParser) -> None:
    """The flags about an unfinished bump (``add_parser`` calls this)."""
    p.add_argument("--abandon", action="store_true",
                   help="an unfinished bump's journal is beside the pins file: record what it "
                        "promoted in the pins file (as it is now), roll nothing more out, "
                        "remove the journal")


def run_journal(args: argparse.Namespace) -> int | None:
    """An unfinished bump beside the pins file: finish it (any ``rigfleet bump`` does, unless it
    asks for another candidate: refused), ``--abandon`` it, or wait for the one that runs; None
    when there is none (a finished bump's left-over journal is removed first)."""
    abandon = bool(getattr(args, "abandon", False))
    try:
        hosts, _, path, first = load_fleet(args.inventory, args.deploy)
        pins = load_pins(path, catalog=first.catalog)
        journal = load_journal(pins, first.catalog)
    except (RigfleetError, ValueError, RuntimeError) as e:
        if not abandon:
            return None  # the bump's own input checks say what is wrong
        console.print(f"[red]error:[/red] {e}")
        return EXIT_ERROR
    if journal is None or journal.state == "finished":
        if journal is not None:
            journal.remove()
            log(f"removed {journal.path}: {journal.id} had finished (pins serial {pins.serial})")
        if abandon:
            console.print(f"[red]error:[/red] --abandon: no unfinished bump "
                          f"({journal_path(path)} does not exist)")
            return EXIT_ERROR
        return None
    pid = journal.owner.get("pid")
    if journal.owner.get("host") == socket.gethostname() and isinstance(pid, int) \
            and pid != os.getpid() and _alive(pid):
        console.print(f"[red]refused:[/red] {journal.describe()} is running now (pid {pid}); "
                      "wait for it to end")
        return EXIT_FAILED
    if abandon:
        return _abandon(args, journal, pins, hosts)
    if journal.state == "stale":
        console.print(f"[red]refused:[/red] {pins.path} is at serial {pins.serial}, but "
                      f"{journal.describe()} started from serial {journal.base_serial}: it "
                      f"cannot be finished over another pins file. Run `rigfleet bump "
                      f"--inventory {args.inventory} --abandon` to record what it promoted")
        return EXIT_FAILED
    other = _other_target(args, journal)
    if other:
        console.print(f"[red]refused:[/red] {journal.describe()} is unfinished; {other}. Run "
                      f"`rigfleet bump --inventory {args.inventory}` to finish it, or add "
                      "--abandon to record what it promoted and stop; then bump again")
        return EXIT_FAILED
    return _resume(args, journal)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _other_target(args: argparse.Namespace, journal: BumpJournal) -> str | None:
    """Why the command line asks for another bump than the journal's, or None."""
    cand = journal.candidate
    if args.image:
        default = cand["repository"] if cand else "vllm/vllm-openai"
        repository, tag = parse_image_arg(args.image, default)
        if cand is None or (repository, tag) != (cand["repository"], cand["tag"]):
            had = f"{cand['repository']}:{cand['tag']}" if cand else "no image"
            return f"--image {args.image} is not its candidate ({had})"
    if args.genesis:
        commits = {p.genesis.commit for p in journal.new_stacks.values() if p.genesis}
        if not any(c.startswith(args.genesis) for c in commits):
            return f"--genesis {args.genesis} is not its Genesis ({', '.join(sorted(commits))})"
    if args.stack and set(args.stack) != set(journal.new_stacks):
        return f"--stack {' '.join(args.stack)} are not its stacks ({', '.join(journal.new_stacks)})"
    if args.latest:
        log(f"--latest: finishing {journal.describe()} first (not resolved again)")
    return None


def _resume_options(args: argparse.Namespace, journal: BumpJournal) -> BumpOptions:
    cand = journal.candidate
    genesis = next((p.genesis.commit for p in journal.new_stacks.values() if p.genesis), None)
    return BumpOptions(
        inventory=args.inventory, deploy=args.deploy,
        image=f"{cand['repository']}:{cand['tag']}" if cand else None,
        genesis=None if cand else genesis, stacks=tuple(journal.new_stacks),
        batch_size=journal.batch_size, max_failures=journal.max_failures,
        registry=args.registry, genesis_url=args.genesis_url, push_mirror=args.push_mirror,
        save_dir=args.save_dir, no_prune=args.no_prune, dry=args.dry, yes=args.yes,
        json=args.json,
        rollback_to=journal.base_serial if not (cand or genesis) else None,  # a rollback's
    )  # fmt: skip


def _resume(args: argparse.Namespace, journal: BumpJournal) -> int:
    """Finish the journal's plan: its outcomes stand, what was deploying is read from the hosts,
    the remaining batches run; then the pins file is written and the journal removed."""
    try:
        opts = _resume_options(args, journal)
        inputs = load_inputs(opts)
    except (RigfleetError, ValueError, RuntimeError) as e:
        console.print(f"[red]error:[/red] {e}")
        return EXIT_ERROR
    known = {h.name for h in inputs.hosts}
    missing = [h.name for h in journal.hosts if h.name not in known]
    if missing:
        console.print(f"[red]refused:[/red] {journal.describe()} covers {', '.join(missing)}, "
                      f"which {opts.inventory} no longer lists; add them back, or --abandon")
        return EXIT_FAILED
    log(f"resuming {journal.describe()}")
    print_journal(journal)
    if opts.dry:
        return EXIT_OK
    if not opts.yes and not _confirm():
        log(f"not confirmed; nothing changed ({journal.path} is kept)")
        return EXIT_FAILED
    journal.take_over()
    cand = journal.candidate
    candidate = Candidate(cand["repository"], cand["tag"], cand["digest"],
                          cand.get("created")) if cand else None  # fmt: skip
    return _execute(opts, inputs, SshRemote(), journal.plan(inputs.pins), candidate,
                    journal.version, {}, journal=journal)


def _abandon(args: argparse.Namespace, journal: BumpJournal, pins: Pins,
             hosts: list[InventoryHost]) -> int:
    """Record what the journal's bump did (what was deploying read from the hosts) into the
    pins file as it is now, start nothing, remove the journal."""
    by_name = {h.name: h for h in hosts}
    plan = journal.plan(pins)
    runner = PyinfraRunner(args.inventory, by_name, SshRemote(), deploy=args.deploy)
    resume = resume_of(journal)
    lost = {h: f for h, f in resume.in_flight.items() if h not in by_name}
    in_flight = {h: f for h, f in resume.in_flight.items() if h in by_name}
    done = {**resume.done, **{h: HostOutcome(h, Status.LOST, None, None, "not in the "
                                             "inventory any more") for h in lost}}
    journal.take_over()
    try:
        result = rollout(plan, runner, Path(pins.path), on_event=log, journal=journal,
                         resume=Resume(done, in_flight, stop=f"abandoned by {by()}"))
    except StillRunning as e:
        return interrupted(journal, e, args.inventory)
    saved = _record(plan, result, {"bump_id": journal.id, "abandoned": True})
    print_journal(journal)
    end_journal(journal, result, saved)
    return EXIT_OK if saved is not None or outcome_of(result) == "failed" else EXIT_FAILED


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
    steps = {h: ("canary" if i == 0 else f"batch {i}")
             for i, batch in enumerate(journal.batches) for h in batch}
    for h in journal.hosts:
        view = journal.host_view(h.name) or {}
        table.row(h.name, steps.get(h.name, "-"), str(view.get("state", "-")),
                  str(view.get("since") or "-"))
    table.print(console)


def main(argv: list[str] | None = None) -> int:
    """``python -m rigfleet.bump.cli ...``: the command without ``rigfleet/cli.py``."""
    parser = argparse.ArgumentParser(prog="rigfleet")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bump", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
