"""What ``rigfleet bump`` decides before any host changes: flags, inputs, bumped stacks, the
``--latest`` candidate, the Genesis commit to pair with it, the stack files' image rules, the plan::

    names = bumped_stacks(opts, inputs.pins, "vllm/vllm-openai")
    plan, genesis, probe = decide_plan(opts, inputs, names, candidate, probe, unreachable,
                                       provisional)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rigfleet.bump.candidate import (
    Candidate,
    LatestAsk,
    choose_latest,
    find_candidate,
    follows_nightlies,
    newest_nightly,
    newest_release,
)
from rigfleet.bump.genesis import (
    GenesisChoice,
    GenesisRefused,
    GenesisRepo,
    check_switches,
    choose_genesis,
    infer_version,
    refusal,
)
from rigfleet.bump.images import VersionProbe
from rigfleet.bump.output import log
from rigfleet.bump.plan import Plan, PlanHost, build_plan
from rigfleet.catalog import Catalog
from rigfleet.cliargs import UsageError
from rigfleet.desired import resolve_pins_path
from rigfleet.errors import RigfleetError
from rigfleet.genesis import StackUse
from rigfleet.hostdata import HostSettings, validate_host
from rigfleet.inventory import InventoryHost, gpu_hosts, host_kind, load_inventory
from rigfleet.pins import Pins, StackPins, load_pins, parse_pins
from rigfleet.registry import DOCKER_HUB, Registry
from rigfleet.validate import Problems


@dataclass(frozen=True)
class BumpOptions:
    """``rigfleet bump``'s flags (``rigfleet.bump.cli.add_parser``)."""

    inventory: str
    deploy: str
    image: str | None = None
    latest: bool = False
    genesis: str | None = None
    stacks: tuple[str, ...] = ()
    batch_size: int = 1
    max_failures: int = 1
    registry: str | None = None
    genesis_url: str | None = None
    push_mirror: str | None = None
    save_dir: Path | None = None
    no_prune: bool = False
    dry: bool = False
    yes: bool = False
    json: bool = False
    rollback_to: int | None = None  # ``rigfleet rollback``: the earlier pins serial it goes to

    def __post_init__(self) -> None:
        if self.rollback_to is None and not (self.image or self.latest or self.genesis):
            raise UsageError("give --image TAG, --latest or --genesis COMMIT")
        p = Problems("rigfleet bump")  # now: a --push-mirror without a scheme failed at the end
        p.url("--registry", self.registry)
        p.url("--push-mirror", self.push_mirror)
        if p.lines:
            raise UsageError("\n".join(p.lines))

    @classmethod
    def from_args(cls, args: argparse.Namespace, **given: Any) -> BumpOptions:
        """The flags of the same names, ``--stack`` as ``stacks``, and ``given``."""
        same = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        return cls(**{**same, "stacks": tuple(getattr(args, "stack", ())), **given})


class BumpError(RigfleetError, RuntimeError):
    """The bump cannot start (inputs)."""


class ImageRefused(RigfleetError, ValueError):
    """A bumped stack's stack file does not allow the candidate."""


@dataclass
class Inputs:
    hosts: list[InventoryHost]
    plan_hosts: list[PlanHost]
    pins: Pins
    registry: str
    genesis_url: str | None
    mirror: str | None
    catalog: Catalog
    outside: frozenset[str] = frozenset()  # hosts left out by --limit: they keep their pins
    caches: tuple[InventoryHost, ...] = ()  # the fleet caches the candidate goes into first
    genesis_repos: dict[str, GenesisRepo] = field(default_factory=dict)  # each synced once


def bumped_stacks(opts: BumpOptions, pins: Pins, repository: str | None) -> list[str]:
    """The stacks this bump changes (``--stack``, else by image repository / Genesis)."""
    if opts.stacks:
        for name in opts.stacks:
            pins.stack(name)  # raises PinsError naming the pinned stacks
        return list(dict.fromkeys(opts.stacks))
    names = [name for name, p in pins.stacks.items()
             if (repository is not None and p.repository == repository)
             or (opts.genesis and p.genesis is not None)]
    if not names:
        uses = " or ".join(w for w in (repository, "Genesis" if opts.genesis else None) if w)
        raise BumpError(f"no pinned stack uses {uses}; name one with --stack")
    return names


def new_stack_pins(catalog: Catalog, pins: Pins, names: list[str], candidate: Candidate | None,
                   version: str | None, genesis: dict[str, GenesisChoice]) -> dict[str, StackPins]:
    """The bumped stacks' new pins, validated like the file (a wrong version is refused)."""
    out: dict[str, StackPins] = {}
    for name in names:
        p = pins.stacks[name]
        if candidate is not None:
            p = replace(p, image=candidate.image, digest=candidate.digest,
                        image_id=candidate.image_id, vllm_version=version or p.vllm_version)
        if name in genesis and p.genesis is not None:
            p = replace(p, genesis=genesis[name].pin(p.genesis.repo))
        out[name] = p
    parse_pins(replace(pins, stacks={**pins.stacks, **out}).to_dict(), pins.path, catalog=catalog)
    return out


def refuse_image_rules(catalog: Catalog, names: list[str], candidate: Candidate,
                       version: str | None) -> None:
    """Refuse a candidate a bumped stack's ``image`` rule does not allow (None: tag alone)."""
    problems = [f"stacks.{n}: {candidate.image} {p} ({catalog.get(n).source}: image)"
                for n in names for p in catalog.get(n).image.problems(candidate.tag, version)]
    if problems:
        raise ImageRefused("\n".join(problems) + "\nnothing changed; allowed: an image every "
                        "bumped stack's file allows (`--stack` picks the stacks)")


def decide_plan(opts: BumpOptions, inputs: Inputs, names: list[str], candidate: Candidate | None,
                probe: VersionProbe, unreachable: dict[str, str | None],
                provisional: dict[str, StackPins]
                ) -> tuple[Plan, dict[str, GenesisChoice], VersionProbe]:
    """The Genesis pairs and the final plan (raises ``GenesisRefused``, ``PinsError``)."""
    pins = inputs.pins
    version = probe.version if candidate is not None else pins.stacks[names[0]].vllm_version
    inferred = False
    if candidate is not None and version is None and candidate.commit:
        # --dry, image not on the canary: a Genesis allowlist entry naming the tag's
        # commit says what it will report (and none means Genesis refuses it).
        version = _infer_version(inputs, names, candidate.commit)
        inferred = version is not None
        if inferred:
            log(f"candidate vLLM {version} (from the Genesis allowlist entry naming its "
                 "commit; read from the image when the bump runs)")  # fmt: skip
    if candidate is not None:
        refuse_image_rules(inputs.catalog, names, candidate, version)
    genesis = _genesis_choices(opts, inputs, names, version, candidate)
    if version is None:
        # --dry, no Genesis stack bumped, image not on the canary: version shown unknown.
        new = {n: replace(p, vllm_version="unknown") for n, p in provisional.items()}
    else:
        new = new_stack_pins(inputs.catalog, pins, names, candidate, version, genesis)
    probe = replace(probe, version=version, source="inferred" if inferred else probe.source)
    plan = build_plan(inputs.plan_hosts, unreachable, pins, new, opts.batch_size, opts.max_failures)
    return plan, genesis, probe


def latest_candidate(opts: BumpOptions, inputs: Inputs, reg: Registry, repository: str
                     ) -> tuple[Candidate | None, list[str]]:
    """``--latest``: one candidate for the bumped stacks (``choose_latest``), and those stacks."""
    names = bumped_stacks(opts, inputs.pins, repository)
    log(f"registry {inputs.registry}: listing the tags of {repository}")
    tags = reg.tags(repository)
    asks: dict[str, LatestAsk] = {}
    for name in names:
        p = inputs.pins.stacks[name]
        nightly, allowed = False, None
        if p.genesis is not None:
            commits = list(_repo(inputs, p.genesis.repo).lineage(p.genesis.commit))
            nightly = follows_nightlies(commits[0].tree.allowed)
            allowed = {v for c in commits for v in c.tree.allowed}
        target = None if nightly else newest_release(tags, p.vllm_version, allowed)
        asks[name] = LatestAsk(p.vllm_version, nightly, target)
    choice = choose_latest(asks)
    for name, why in choice.staying.items():
        log(f"{name}: {why}; not bumped")
    if choice.nightly:
        log(f"{', '.join(choice.stacks)}: the pinned Genesis lists only nightly builds; "
             f"resolving the newest nightly of {repository} (by build time)")
        return newest_nightly(reg, repository), list(choice.stacks)
    if choice.tag is None:
        return None, []
    log(f"{', '.join(choice.stacks)}: newest release above the pin: {choice.tag}")
    return find_candidate(reg, repository, choice.tag), list(choice.stacks)


def _repo(inputs: Inputs, url: str) -> GenesisRepo:
    repos = inputs.genesis_repos
    if url not in repos:
        repos[url] = GenesisRepo(url, inputs.genesis_url)
        log(f"Genesis: fetching {inputs.genesis_url or url}")
        repos[url].sync()
    return repos[url]


def _infer_version(inputs: Inputs, names: list[str], commit: str) -> str | None:
    pinned = [g for n in names if (g := inputs.pins.stacks[n].genesis) is not None]
    for g in pinned:
        if found := infer_version(_repo(inputs, g.repo), g.commit, commit):
            return found
    if pinned:  # a nightly's version always names its commit: nothing lists this one
        checked = list(_repo(inputs, pinned[0].repo).lineage(pinned[0].commit))
        raise GenesisRefused(refusal(f"<any build of {commit[:9]}> (not pulled in --dry)",
                                     checked))  # fmt: skip
    return None


def _genesis_choices(opts: BumpOptions, inputs: Inputs, names: list[str], version: str | None,
                     candidate: Candidate | None) -> dict[str, GenesisChoice]:
    out: dict[str, GenesisChoice] = {}
    for name in names:
        p = inputs.pins.stacks[name]
        want = version if candidate is not None else p.vllm_version
        if (g := p.genesis) is None or want is None:
            continue
        repo = _repo(inputs, g.repo)
        choice = choose_genesis(repo, g.commit, want, p.vllm_version, opts.genesis)
        if choice.proposed:
            log(f"Genesis {choice.label} lists vLLM {want}; proposing it for {name} "
                 f"(pinned {g.commit[:12]} does not)" if not opts.genesis else
                 f"Genesis {choice.label} (--genesis) lists vLLM {want}")  # fmt: skip
        if not choice.rollback_safe:
            log(f"[yellow]warning:[/yellow] Genesis {choice.label} does not list the vLLM "
                 f"the fleet runs now ({p.vllm_version}); a host that rolls back runs it "
                 "against the new checkout")  # fmt: skip
        check_switches(repo, choice.pin(g.repo), _genesis_uses(inputs, name, choice),
                       stack=name, spec=inputs.catalog.get(name), vllm_version=want)  # fmt: skip
        out[name] = choice
    return out


def _genesis_uses(inputs: Inputs, stack: str, choice: GenesisChoice) -> dict[str, StackUse]:
    """The stack's Genesis use per its stack file (key ``""``) and per host that adds to it."""
    spec = inputs.catalog.get(stack)
    try:
        uses = {"": StackUse.of(spec, choice.layout)}
        for h in inputs.hosts:
            if extra := validate_host(h.name, h.data).env_for(stack):
                uses[h.name] = StackUse.of(spec, choice.layout, extra)
    except ValueError as e:
        raise GenesisRefused(f"{e}; refusing before any host changes") from None
    return uses


def load_fleet(inventory: str, deploy: str, every: list[InventoryHost] | None = None) -> \
        tuple[list[InventoryHost], list[PlanHost], Pins, HostSettings]:
    """GPU hosts, their plan view, the one pins file they share and the first's settings."""
    hosts = gpu_hosts(every if every is not None else load_inventory(inventory))
    if not hosts:
        raise BumpError(f"{inventory}: no GPU hosts")
    settings = [validate_host(h.name, h.data) for h in hosts]
    paths: dict[str, list[str]] = {}
    for h, s in zip(hosts, settings, strict=True):
        path = str(resolve_pins_path(s.pins_file, Path(deploy).resolve().parent))
        paths.setdefault(path, []).append(h.name)
    if len(paths) != 1:
        listed = "; ".join(f"{p}: {', '.join(n)}" for p, n in paths.items())
        raise BumpError(f"hosts name different pins files ({listed}); bump one fleet at a time")
    plan_hosts = [PlanHost(h.name, s.stack, tuple(h.groups))
                  for h, s in zip(hosts, settings, strict=True)]
    pins = load_pins(next(iter(paths)), catalog=settings[0].catalog)
    return hosts, plan_hosts, pins, settings[0]


def load_inputs(opts: BumpOptions) -> Inputs:
    """Inventory, every host's data, the one pins file they share."""
    every = load_inventory(opts.inventory)
    hosts, plan_hosts, pins, first = load_fleet(opts.inventory, opts.deploy, every)
    return Inputs(hosts, plan_hosts, pins, str(opts.registry or first.bump_registry or DOCKER_HUB),
                  opts.genesis_url or first.bump_genesis_url,
                  opts.push_mirror or first.bump_mirror, first.catalog,
                  caches=tuple(h for h in every if host_kind(h.groups).cache))
