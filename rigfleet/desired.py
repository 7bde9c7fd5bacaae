"""What a host should be (``DesiredHost``), built once per host from its data, the pins and the
stacks: what the roles stage, and what status, check and bump compare the host against::

    want = load_desired(host.name, host.data)          # validates data, reads the pins once
    want.stack, want.current.config_hash               # 'int8', '0a1b2c3d4e5f6789'
    want.stacks["tq3-mtp-genesis"].text                # that stack's compose file, as staged
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigfleet.bump.journal import BumpJournal, load_journal
from rigfleet.catalog import StackSpec
from rigfleet.compose import SERVICE, compose_document, render_document
from rigfleet.hostdata import HostSettings, validate_host
from rigfleet.hostside.layout import CONFIG_HASH_LABEL, HOST
from rigfleet.hostside.plan import StackRef
from rigfleet.hostside.records import TRACKED_KEYS
from rigfleet.hostside.verify.profiles import Profile, resolve
from rigfleet.pins import GenesisPin, ModelPin, Pins, PinsError, StackPins, load_pins
from rigfleet.resources import PROJECT_ROOT


@dataclass(frozen=True)
class DesiredStack:
    """One staged stack: its compose file (``text`` as written), ledger facts, swap ``ref``."""

    spec: StackSpec
    pins: StackPins
    document: Mapping[str, Any]
    text: str
    config_hash: str
    tracked: Mapping[str, Any]
    ref: StackRef
    gate_set: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class DesiredHost:
    """Everything the deploy makes of one host: ``stacks`` it stages, the desired among them."""

    name: str
    settings: HostSettings
    pins: Pins
    stacks: Mapping[str, DesiredStack] = field(default_factory=dict)

    @property
    def stack(self) -> str:
        return self.settings.stack

    @property
    def current(self) -> DesiredStack:
        return self.stacks[self.settings.stack]

    @property
    def spec(self) -> StackSpec:
        return self.current.spec

    @property
    def genesis(self) -> GenesisPin | None:
        """The Genesis checkout the deploy keeps: the desired stack's, else the first staged."""
        return self.current.pins.genesis or next(
            (s.pins.genesis for s in self.stacks.values() if s.pins.genesis), None)

    @property
    def model(self) -> ModelPin:
        """The pin of the model the desired stack serves (its stack file's ``model``)."""
        return self.pins.model_for(self.spec.model)

    @property
    def models(self) -> tuple[ModelPin, ...]:
        pins = {self.pins.model_for(s.spec.model) for s in self.stacks.values()}
        return tuple(sorted(pins, key=lambda m: m.repo))

    def weights_path(self, model: ModelPin) -> str:
        """A pinned model revision's own directory on the host."""
        return str(HOST.weights_dir(self.settings.model_dir, model.local_dir, model.revision))

    @property
    def model_path(self) -> str:
        """The desired stack's model revision's directory (what its compose file mounts)."""
        return self.weights_path(self.model)

    @property
    def other_containers(self) -> tuple[str, ...]:
        """The containers of the staged stacks that should not run."""
        return tuple(s.spec.container_name for n, s in self.stacks.items() if n != self.stack)

    @property
    def projects(self) -> tuple[tuple[str, str], ...]:
        """Every staged stack's (compose project, compose file), sorted by stack name."""
        return tuple((s.spec.compose_project, s.ref.compose_file)
                     for _, s in sorted(self.stacks.items()))


def desired_stack(spec: StackSpec, settings: HostSettings, pins: Pins) -> DesiredStack:
    doc = compose_document(spec, pins, settings)
    config_hash = str(doc["services"][SERVICE]["labels"][CONFIG_HASH_LABEL])
    pinned, model = pins.stacks[spec.name], pins.model_for(spec.model)
    tracked = {  # the facts the ledger tracks
        "stack": spec.name,
        "image": pinned.image,
        "digest": pinned.digest,
        "vllm_version": pinned.vllm_version,
        "genesis_commit": pinned.genesis.commit if pinned.genesis is not None else None,
        "model_repo": model.repo,
        "model_revision": model.revision,
        "driver_branch": pins.driver_branch,
        "toolkit_version": pins.toolkit_version,
        "pins_serial": pins.serial,
    }
    assert tuple(tracked) == TRACKED_KEYS
    ref = StackRef(
        stack=spec.name,
        project=spec.compose_project,
        container=spec.container_name,
        port=spec.port,
        compose_file=str(HOST.compose_file(spec.name)),
        config_hash=config_hash,
        image_ref=str(doc["services"][SERVICE]["image"]).replace("$$", "$"),
        served_model_name=spec.served_model_name,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        record=dict(tracked),
        boot_expect=tuple((b.pattern, b.title) for b in spec.boot_expect),
        boot_failures=tuple((b.kind, b.pattern, b.title, b.hint) for b in spec.boot_failures),
    )
    return DesiredStack(spec, pinned, doc, render_document(doc), config_hash, tracked, ref,
                        stack_gate_set(spec, settings))


def staged_stacks(settings: HostSettings, pins: Pins) -> list[StackSpec]:
    """The pinned catalog stacks the host may serve (``stacks``) and its GPUs run, in pins order."""
    allowed = settings.stacks
    names = [n for n in pins.stacks if n in settings.catalog and (allowed is None or n in allowed)]
    return [spec for spec in map(settings.catalog.get, names)
            if spec.gpu_count <= settings.gpu_count]


def unpinned_stacks(settings: HostSettings, pins: Pins) -> list[str]:
    """Host data ``stack`` and ``stacks`` may name only pinned stacks: one line per other name."""
    return [f"{settings.name}: {key}: {name!r} is not pinned in {pins.path} (it has no "
            f"stacks.{name} entry); allowed: a pinned stack "
            f"({', '.join(pins.stacks) or 'none pinned'}): pin it there (docs/stacks.md) and "
            f"run `rigfleet pins lock`{', or leave it out of stacks' * (key == 'stacks')}"
            for key, names in (("stack", (settings.stack,)), ("stacks", settings.stacks or ()))
            for name in names if name not in pins.stacks]


def stack_gate_set(spec: StackSpec, settings: HostSettings) -> tuple[str, ...]:
    """The gate profile overrides for ``spec`` on this host, in the order the gate applies
    them: the stack's (``gate.set``, the throughput check's), then host data ``gate_set``,
    which wins."""
    out = [*spec.gate_set, f"throughput_stack={spec.name}",
           f"throughput_history_dir={HOST.throughput_dir}",
           f"throughput_scale={settings.throughput_scale:g}"]
    if spec.throughput is not None:
        out += spec.throughput.gate_set()
    return (*out, *settings.swap.gate_set)


def gate_profile(settings: HostSettings, spec: StackSpec) -> Profile:
    """The profile the gate judges ``spec`` by on this host (the plan's gate settings)."""
    return resolve(settings.swap.gate_profile, stack_gate_set(spec, settings))


def check_pinned(settings: HostSettings, pins: Pins) -> list[str]:
    """The desired stack must be pinned, and nothing pinned may be ``unresolved``."""
    problems = unpinned_stacks(settings, pins)
    if unresolved := pins.unresolved():
        problems.append(f"{settings.name}: {pins.path}: {', '.join(unresolved)}: 'unresolved'; "
                        "allowed: a resolved value (run `rigfleet pins lock`)")
    return problems


def check_switch_sets(settings: HostSettings, pins: Pins, staged: list[StackSpec]) -> list[str]:
    """Each staged Genesis stack's file must have a switch set for its pinned layout."""
    return [
        f"{settings.name}: stack {spec.name}: {spec.source}: genesis.switches has no "
        f"{genesis.layout!r} set, but {pins.path} pins Genesis {genesis.label} with "
        f"the {genesis.layout} layout; allowed: add genesis.switches.{genesis.layout} "
        f"to the stack file (have: {', '.join(spec.genesis.switches) or 'none'}), or "
        "pin a Genesis commit with a layout it has"
        for spec in staged if spec.genesis is not None
        and (genesis := pins.stacks[spec.name].genesis) is not None
        and genesis.layout not in spec.genesis.switches]


def check_image_rules(settings: HostSettings, pins: Pins, staged: list[StackSpec]) -> list[str]:
    """Each staged stack's pinned image must be one its stack file's ``image`` rule allows."""
    return [
        f"{settings.name}: {pins.path}: stacks.{spec.name}: image {pinned.image} "
        f"{problem} ({spec.source}: image); allowed: an image the stack file allows "
        f"(`rigfleet bump --latest --stack {spec.name} --dry` proposes one)"
        for spec in staged for pinned in [pins.stacks[spec.name]]
        for problem in spec.image.problems(pinned.tag, pinned.vllm_version)]


def build_desired(settings: HostSettings, pins: Pins) -> DesiredHost:
    """The host's model from validated settings and its pins; raises ``PinsError``."""
    if problems := check_pinned(settings, pins):
        raise PinsError(problems)
    staged = staged_stacks(settings, pins)
    for problems in (check_switch_sets(settings, pins, staged),
                     check_image_rules(settings, pins, staged)):
        if problems:
            raise PinsError(problems)
    stacks = {spec.name: desired_stack(spec, settings, pins) for spec in staged}
    return DesiredHost(settings.name, settings, pins, stacks)


def resolve_pins_path(pins_file: str, base: Path | None = None) -> Path:
    """Host data's pins file, relative to ``base`` (default: the working dir, else the repo)."""
    path = Path(os.path.expanduser(pins_file))  # absolute: every join below gives it back
    if base is not None:
        return base / path
    cwd = Path.cwd() / path
    try:
        return cwd if cwd.exists() else PROJECT_ROOT / path
    except OSError:  # a name too long, a parent it may not search: reading it will say so
        return cwd


_PINS: dict[tuple[str, tuple[str, ...]], tuple[Pins, BumpJournal | None]] = {}


def fleet_pins(settings: HostSettings, base: Path | None = None) -> tuple[Pins, BumpJournal | None]:
    """The host's ``pins_file`` and an unfinished bump's journal beside it, read once."""
    path = resolve_pins_path(settings.pins_file, base)
    key = (str(path.absolute()), settings.catalog.sources)
    if key not in _PINS:
        try:
            pins = load_pins(path, catalog=settings.catalog)
            _PINS[key] = (pins, load_journal(pins, settings.catalog))
        except PinsError as e:
            raise PinsError([f"{settings.name}: pins_file: {line}" for line in e.problems]) \
                from None
    return _PINS[key]


def pins_for(settings: HostSettings, base: Path | None = None) -> Pins:
    """The host's pins: an unfinished bump's journal's say, else its ``pins_file``'s ``hosts``."""
    pins, journal = fleet_pins(settings, base)
    return journal.pins_for(pins, settings.name) if journal else pins.for_host(settings.name)


def load_desired(name: str, data: Mapping[str, Any] | Any, base: Path | None = None) -> DesiredHost:
    """The host's model from ``data`` and its pins; raises ``RigfleetError`` (the deploy's)."""
    settings = validate_host(name, data)
    return build_desired(settings, pins_for(settings, base))
