"""``rigfleet bump``: move the fleet's vLLM image (and Genesis) forward, canary first.

    rigfleet bump --inventory inventory/home.py --latest --dry
    rigfleet bump --inventory inventory/home.py --image nightly-<40-hex> --yes
    rigfleet bump --inventory inventory/home.py --image nightly-<40-hex> --genesis <commit>
    rigfleet bump ... --batch-size 2 --max-failures 1 --save-dir /srv/images \
        --push-mirror http://registry.lan:5000

Steps (docs/bump.md tells each): resolve the candidate in the registry, check who is
reachable, read the candidate's vLLM version on the canary, check it against Genesis (or
propose a newer Genesis commit, else refuse), print the plan, roll out batch by batch through
the deploy's swap gate, prune old images, write the pins file for what promoted. An
interrupted bump leaves its journal beside the pins file: any later ``rigfleet bump``
finishes it, ``rigfleet bump --abandon`` records it and stops.

Exit status: 0 every host promoted; 1 refused, or a host failed (canary, gate, lost);
2 promoted on every reachable host but some were unreachable (the pins file records them on
their old pins); 3 the inventory, the pins file or the registry could not be read;
130 interrupted (the journal says what it did). A bad flag is a usage error: 2, as argparse's.

Inventory data (group ``all``) may set ``bump_registry`` (registry v2 URL, default Docker
Hub), ``bump_genesis_url`` (where this machine fetches Genesis when the pinned URL is not
reachable from here, such as a mirror) and ``bump_mirror`` (``--push-mirror``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.markup import escape

from rigfleet.bump.candidate import Candidate, find_candidate, parse_image_arg
from rigfleet.bump.decide import (
    BumpError,
    BumpOptions,
    ImageRefused,
    Inputs,
    bumped_stacks,
    decide_plan,
    latest_candidate,
    load_inputs,
    refuse_image_rules,
)
from rigfleet.bump.execute import execute, run_journal
from rigfleet.bump.genesis import GenesisRefused
from rigfleet.bump.images import VersionProbe, prefetch, read_version, remove_image
from rigfleet.bump.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SKIPPED,
    OUTSIDE_LIMIT,
    confirm,
    error,
    log,
    print_plan,
    refused,
)
from rigfleet.bump.plan import Plan, build_plan
from rigfleet.check import Online, online_pass, verify_pins
from rigfleet.cliargs import UsageError, add_rollout, add_yes, run_command, select, ssh_command
from rigfleet.errors import RigfleetError
from rigfleet.fleetview import reachability
from rigfleet.inventory import InventoryHost
from rigfleet.registry import Registry, RegistryError
from rigfleet.ssh import Remote, SshRemote


def add_parser(subparsers: Any) -> None:
    p = ssh_command(subparsers, "bump", "roll a newer vLLM image / Genesis commit out, canary "
                    "first, gated", __doc__)
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
    add_rollout(p)
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
    add_yes(p, "roll out")
    p.add_argument("--abandon", action="store_true",
                   help="an unfinished bump's journal is beside the pins file: record what it "
                        "promoted in the pins file (as it is now), roll nothing more out, "
                        "remove the journal")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (unfinished := run_journal(args)) is not None:
        return unfinished
    try:
        opts = BumpOptions.from_args(args)
        inputs = load_inputs(opts)
        kept = {h.name for h in select(inputs.hosts, args.limit, args.inventory)}
        inputs.outside = frozenset(h.name for h in inputs.hosts if h.name not in kept)
    except UsageError:
        raise
    except (RigfleetError, ValueError, RuntimeError) as e:
        return error(escape(str(e)))
    try:
        return _bump(opts, inputs, SshRemote(connect_timeout=args.timeout))
    except (GenesisRefused, ImageRefused) as e:
        return refused(e)
    except RegistryError as e:  # most already name the registry ("registry URL: what: why")
        said = str(e) if str(e).startswith("registry ") else f"registry {inputs.registry}: {e}"
        return error(escape(said))
    except (RigfleetError, ValueError) as e:
        return error(e, EXIT_FAILED)


def _bump(opts: BumpOptions, inputs: Inputs, remote: Remote) -> int:
    pins = inputs.pins
    candidate: Candidate | None = None
    names: list[str] | None = None
    if opts.image or opts.latest:
        repos = {p.repository for p in pins.stacks.values()}
        default_repo = sorted(repos)[0] if len(repos) == 1 else "vllm/vllm-openai"
        repository, tag = parse_image_arg(opts.image or "", default_repo)
        reg = Registry(inputs.registry)
        if opts.latest:
            candidate, names = latest_candidate(opts, inputs, reg, repository)
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

    for name in inputs.outside:
        log(f"{name} is outside --limit and will be skipped (it keeps its pins)")
    unreachable = reachability(remote, [h for h in inputs.hosts if h.name not in inputs.outside])
    for name, reason in unreachable.items():
        if reason:
            log(f"[yellow]{name} is unreachable[/yellow] and will be skipped: {reason}")
    unreachable.update(dict.fromkeys(inputs.outside, OUTSIDE_LIMIT))

    # The canary reads the candidate's version; a provisional plan picks it (the version
    # changes nothing in who goes first).
    provisional = {n: replace(pins.stacks[n], image=candidate.image, digest=candidate.digest,
                              image_id=candidate.image_id) if candidate else pins.stacks[n]
                   for n in names}
    draft = build_plan(inputs.plan_hosts, unreachable, pins, provisional, opts.batch_size,
                       opts.max_failures)  # fmt: skip
    probe = VersionProbe(None, "unknown")
    probe_host: InventoryHost | None = None
    caches: tuple[str, ...] = ()
    if candidate is not None:
        reachable = [h for h in inputs.hosts if not unreachable[h.name]]
        if not reachable:
            raise BumpError("no host is reachable to read the candidate's vLLM version")
        probe_host = next((h for h in reachable if h.name == draft.canary), reachable[0])
        if not opts.dry:  # the fleet caches fetch it once; the canary pulls from them
            caches = prefetch(remote, inputs.caches, candidate, log)
        log(f"{probe_host.name}: reading vllm.__version__ from the candidate"
             f"{'' if opts.dry else ' (pulling it by digest if needed)'}")
        probe = read_version(remote, probe_host, candidate, pull=not opts.dry, caches=caches)
        log(f"candidate reports vLLM {probe.version or 'unknown (not pulled in --dry)'}")

    try:
        plan, genesis, probe = decide_plan(opts, inputs, names, candidate, probe, unreachable,
                                           provisional)
        if SOURCES is not None and not plan.empty:
            refuse_missing(inputs, plan, SOURCES())
    except BaseException:
        if probe.source == "pulled" and probe_host is not None and candidate is not None:
            remove_image(remote, probe_host, candidate, caches)  # the canary as it was found
        raise
    print_plan(plan, genesis, probe)
    if opts.dry:
        return EXIT_OK
    if plan.empty:
        log("every reachable host already runs these pins; nothing to do")
        return EXIT_SKIPPED if set(plan.skipped) - inputs.outside else EXIT_OK
    if not opts.yes and not confirm():
        log("not confirmed; nothing changed")
        return EXIT_FAILED
    return execute(opts, inputs, remote, plan, candidate, probe.version or "")


# How the plan's pins are asked of their sources (rigfleet/check.py; tests put None here).
SOURCES: Callable[[], Online] | None = partial(online_pass, images=True)


def refuse_missing(inputs: Inputs, plan: Plan, run: Online) -> None:
    """Refuse pins whose source lacks them (``rigfleet check --online``; unreached: warn)."""
    new = replace(inputs.pins, stacks={**inputs.pins.stacks, **plan.new_stacks})
    refusals, warnings = verify_pins(inputs.hosts, new, run)
    for line in warnings:
        log(f"[yellow]warning:[/yellow] {line}")
    if refusals:
        raise BumpError("\n".join(refusals) + "\nnothing changed; allowed: pins whose every "
                        "thing its source has (`rigfleet check --online`)")


if __name__ == "__main__":  # python -m rigfleet.bump.cli ARGS: rigfleet bump ARGS
    parser = argparse.ArgumentParser(prog="rigfleet")
    add_parser(parser.add_subparsers(dest="command", required=True))
    raise SystemExit(run_command(parser.parse_args(["bump", *sys.argv[1:]])))
