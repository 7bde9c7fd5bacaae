"""``rigfleet check``: every problem of the hosts' data, pins and stack files at once; with
``--online``, each pinned thing asked of its source (docs/operations.md)::

    rigfleet check --inventory inventory/home.py [--online] [--json]
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property, partial
from typing import Any, TypeVar, cast

from rigfleet.aptindex import AptIndex, AptIndexError, AptUnreachable, read_index
from rigfleet.aptrepos import SUPPORTED_OS, AptRepo, os_named
from rigfleet.balancer.plan import validate_balancer_host
from rigfleet.bump.genesis import GenesisError, GenesisRepo
from rigfleet.catalog import load_catalog
from rigfleet.desired import (
    check_image_rules,
    check_switch_sets,
    resolve_pins_path,
    staged_stacks,
    unpinned_stacks,
)
from rigfleet.fleetcache import validate_cache_host
from rigfleet.hostdata import HostSettings, validate_host, validate_monitor
from rigfleet.hub import Hub, HubMissing, HubUnreachable
from rigfleet.image_sources import NO_CHECK, ImageSource
from rigfleet.images.checks import SourceChecker, check_url
from rigfleet.images.hoststate import HostImageState
from rigfleet.images.plan import WantedImage, wanted_images
from rigfleet.packages import TOOLKIT_PACKAGES, OsInfo, driver_packages, version_prefix
from rigfleet.pins import LOCK_HINT, UNRESOLVED, GenesisPin, ModelPin, Pins, PinsError, load_pins
from rigfleet.registry import Registry, RegistryError, registry_of
from rigfleet.validate import ValidationError

FOUND, CHANGED, MISSING, UNREACHABLE, UNCHECKED = (
    "found", "changed", "missing", "unreachable", "unchecked")
# (ID, VERSION_ID, codename) the roles provision (rigfleet.aptrepos.SUPPORTED_OS).
OsKey = tuple[str, str, str]
T = TypeVar("T")
E = TypeVar("E", bound=Exception)


@dataclass(frozen=True)
class Finding:
    thing: str
    source: str
    status: str
    todo: str = ""
    hosts: tuple[str, ...] = ()


def host_os(value: Any) -> list[OsKey]:
    """The OSes host data ``os`` names; every supported one when it names none (None)."""
    named = None if value is None else os_named(value)
    return [named] if named else [(i, v, c) for (i, v), c in SUPPORTED_OS.items()]


def os_disagrees(name: str, value: Any, os_key: OsKey) -> str | None:
    """The deploy's refusal when host data ``os`` names another OS than the host runs."""
    if value is None or host_os(value) == [os_key]:
        return None
    return (f"{name}: os: {value!r}, but the host runs {os_key[0]} {os_key[1]} "
            f"({os_key[2]}); allowed: the OS the host runs (or no os key)")


@dataclass
class Checked:
    problems: list[str] = field(default_factory=list)
    hosts: dict[str, tuple[HostSettings, Pins, list[OsKey]]] = field(default_factory=dict)

    def add(self, problems: Iterable[str]) -> None:
        """Add the ``problems`` not listed yet."""
        self.problems += [p for p in problems if p not in self.problems]


def offline(hosts: Sequence[Any]) -> Checked:
    """Every problem of the hosts, their pins files and stack files, listed at once."""
    out = Checked()
    pins_by_file: dict[tuple[str, object], Pins | None] = {}  # per catalog, as the deploy reads
    for h in hosts:
        for wanted, check in (
                (h.kind.balancer, partial(validate_balancer_host, h.name, h.groups, h.data)),
                (h.kind.monitor, partial(validate_monitor, h.name, h.data)),
                (h.kind.cache, partial(validate_cache_host, h.name, h.groups, h.data))):
            if wanted:
                try:
                    check()
                except ValidationError as e:
                    out.problems += e.problems
        if not h.kind.gpu:
            continue
        settings: HostSettings | None = None
        try:
            settings = validate_host(h.name, h.data)
        except ValidationError as e:
            out.add(e.problems)
        raw = h.data.get("pins_file") or "pins.yaml"
        path = str(resolve_pins_path(settings.pins_file if settings else str(raw)).absolute())
        key = (path, settings.catalog.sources if settings else str(h.data.get("stacks_dir")))
        if key not in pins_by_file:
            pins_by_file[key] = _pins(path, settings, h.data, out)
        if (pins := pins_by_file[key]) is None or settings is None:
            continue
        mine = pins.for_host(h.name)
        out.add(dict.fromkeys(_agree(settings, mine)))
        out.hosts[h.name] = (settings, mine, host_os(h.data.get("os")))
    return out


def _pins(path: str, settings: HostSettings | None, data: Any, out: Checked) -> Pins | None:
    catalog = settings.catalog if settings else None
    if catalog is None and isinstance(data.get("stacks_dir"), str):
        with suppress(ValidationError):  # named by the host data's own check
            catalog = load_catalog([data["stacks_dir"]])
    try:
        pins = load_pins(path, allow_unresolved=True, catalog=catalog)
    except PinsError as e:
        out.add(e.problems)
        return None
    out.problems += [f"{path}: {key}: {UNRESOLVED!r}; allowed: a resolved value ({LOCK_HINT})"
                     for key in pins.unresolved()
                     if not any(key in p and path in p for p in out.problems)]
    return pins


def _agree(settings: HostSettings, pins: Pins) -> list[str]:
    """What the host's data and its pins must agree on."""
    staged = staged_stacks(settings, pins)
    return (unpinned_stacks(settings, pins) + check_switch_sets(settings, pins, staged)
            + check_image_rules(settings, pins, staged))


def reacher(pairs: Iterable[str], env: str = "") -> Callable[[str], str]:
    """``url -> url`` with each ``FROM=TO`` prefix rewritten: ``env``'s (``RIGFLEET_REACH``,
    space-separated), then ``pairs`` (--reach); a bad one is named where it was given."""
    table: list[tuple[str, str]] = []
    for where, value, pair in [*(("RIGFLEET_REACH", env, p) for p in env.split()),
                               *(("--reach", p, p) for p in pairs)]:
        src, sep, dst = pair.partition("=")
        if not sep or not src or not dst:
            raise ValueError(f"{where}: {value!r}{f': {pair!r}' if pair != value else ''} is not "
                             "FROM=TO; allowed: FROM=TO URL prefixes (RIGFLEET_REACH: several, "
                             "space-separated), e.g. "
                             "http://hub.rigfleet.test:8080=http://127.0.0.1:18080")
        table.append((src.rstrip("/"), dst.rstrip("/")))

    def reach(url: str) -> str:
        for src, dst in table:
            if url == src or url.startswith(src + "/"):
                return dst + url[len(src):]
        return url

    return reach


@dataclass
class Online:
    """One online pass: every source asked once, whatever the number of hosts."""

    reach: Callable[[str], str] = field(default=lambda url: url)
    timeout: float = 15.0
    images: bool = True
    registry: Callable[[str, float], Registry] = Registry
    findings: dict[tuple[str, str], Finding] = field(default_factory=dict)
    _memo: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def add(self, f: Finding, host: str) -> None:
        old = self.findings.get((f.thing, f.source))
        self.findings[f.thing, f.source] = replace(f, hosts=(*old.hosts, host) if old else (host,))

    def host(self, settings: HostSettings, pins: Pins, oses: Sequence[OsKey]) -> None:
        """Every check for one host (findings shared across hosts)."""
        name = settings.name
        specs = staged_stacks(settings, pins)
        staged = {s.name: pins.stacks[s.name] for s in specs}
        if self.images:
            for w in (w for w in wanted_images(staged)[0] if w.digest != UNRESOLVED):
                key = ("image", w, settings.image_sources, settings.bump_registry)
                self.add(self.memo(key, partial(self.image, w, settings)), name)
        for m in (pins.model_for(repo) for repo in sorted({s.model for s in specs}, key=str)):
            if m.revision != UNRESOLVED:
                self.add(self.memo(("model", m, settings.hf_endpoint, settings.hf_token_file),
                                   partial(self.model, settings, m)), name)
        for g in filter(None, (staged[stack].genesis for stack in sorted(staged))):
            self.add(self.genesis(g, settings.bump_genesis_url), name)
        for os_key in oses:
            for f in self.apt(settings, pins, os_key):
                self.add(f, name)

    def memo(self, key: tuple[Any, ...], ask: Callable[[], T],
             error: type[E] | tuple[()] = ()) -> T | E:
        """``ask()`` once per ``key``; an ``error`` it raises is the answer kept."""
        if key not in self._memo:
            try:
                self._memo[key] = ask()
            except error as e:
                self._memo[key] = e
        return cast(T | E, self._memo[key])

    @cached_property
    def checker(self) -> SourceChecker:
        return SourceChecker(lambda url: self.registry(self.reach(url), self.timeout))

    def image(self, w: WantedImage, settings: HostSettings) -> Finding:
        thing = f"image {w.image}@{w.digest[:19]}"
        tried: list[str] = []
        unreachable = False
        for i, source in enumerate(settings.image_sources):
            if source.kind == "host-archive":
                tried.append(f"{source.label}: on the host (checked by the deploy)")
                continue
            if (r := self.checker.check(i, source, w, settings, HostImageState())).ok:
                if source.kind == "hub" and (moved := self.tag_moved(source, w, settings)):
                    return Finding(thing, source.label, CHANGED, moved)
                return Finding(thing, source.label, FOUND, "" if not tried else
                               "earlier sources: " + "; ".join(tried))
            unreachable |= "unreachable" in r.reason
            tried.append(f"{source.label}: {r.reason}")
        if any(s.kind == "host-archive" for s in settings.image_sources) and not unreachable:
            return Finding(thing, "; ".join(tried), UNCHECKED, "the host's archives are read "
                           "by the deploy's preflight")
        return Finding(thing, "; ".join(tried), UNREACHABLE if unreachable else MISSING,
                       "pin a digest a source has (`rigfleet pins lock --refresh`), or add a "
                       "source that holds it (image_sources: an archive, a registry)")

    def tag_moved(self, source: ImageSource, w: WantedImage, settings: HostSettings) -> str | None:
        """What the pinned tag names now, when another digest."""
        if (url := check_url(source, w, settings)) == NO_CHECK:
            return None
        name, tag = w.image.rsplit(":", 1)
        try:
            now = self.checker.client(url).digest(registry_of(name)[1], tag)
        except RegistryError:
            return None  # a digest-pinned image whose tag is gone is still there
        if now == w.digest:
            return None
        return (f"the tag {tag} names {now[:19]} now; the pin still pulls its digest "
                "(`rigfleet pins lock --refresh` follows the tag)")

    def model(self, settings: HostSettings, m: ModelPin) -> Finding:
        endpoint = settings.hf_endpoint or "https://huggingface.co"
        hub = Hub(self.reach(endpoint), settings.hf_token_file, self.timeout)
        thing = f"model {m.repo}@{m.revision[:12]}"
        try:
            files = hub.files(m.repo, m.revision)
        except HubMissing as e:
            return Finding(thing, endpoint, MISSING, f"{e}; pin a revision the hub has "
                           "(`rigfleet pins lock --refresh` takes main's)")
        except HubUnreachable as e:
            return Finding(thing, endpoint, UNREACHABLE, str(e))
        except Exception as e:  # HubError and the rest: an answer we cannot use
            return Finding(thing, endpoint, MISSING, str(e))
        if not any(f.endswith(".safetensors") for f in files):
            return Finding(thing, endpoint, MISSING, f"the revision holds no *.safetensors "
                           f"({len(files)} files)")
        main = m.revision
        with suppress(Exception):
            main = hub.revision(m.repo, "main")
        if main != m.revision:
            return Finding(thing, endpoint, CHANGED, f"main is at {main[:12]} now; the pin "
                           "stays (verify that revision before moving: `rigfleet bump`)")
        return Finding(thing, endpoint, FOUND, f"{len(files)} files")

    def genesis(self, pin: GenesisPin, fetch: str | None) -> Finding:
        fetch_url = self.reach(fetch or pin.repo)
        thing = f"genesis {pin.label}"
        repo = self.memo(("genesis", fetch_url), GenesisRepo(pin.repo, fetch_url).sync,
                         GenesisError)
        if isinstance(repo, GenesisError):
            return Finding(thing, fetch_url, UNREACHABLE, str(repo)[:300])
        if (refs := repo.reached_by(pin.commit)) is None:
            return Finding(thing, fetch_url, MISSING, f"commit {pin.commit} is not in the "
                           "repository; pin one it has (`rigfleet bump --genesis REF`)")
        if not refs:
            return Finding(thing, fetch_url, CHANGED, "no branch or tag reaches the commit "
                           "any more (history rewritten?): it may be collected; move the pin")
        return Finding(thing, fetch_url, FOUND, f"on {', '.join(refs[:3])}")

    def index(self, repo: AptRepo, policy: str) -> AptIndex | AptIndexError:
        reached = replace(repo, url=self.reach(repo.url), key_url=self.reach(repo.key_url))
        read = partial(read_index, reached, policy, self.timeout)
        return self.memo(("apt", reached, policy), read, AptIndexError)

    def apt(self, settings: HostSettings, pins: Pins, os_key: OsKey) -> list[Finding]:
        os_id, version, codename = os_key
        out = []
        for name, pkgs, want, what in (  # repo, packages, the version prefix each must have
                ("cuda", driver_packages(OsInfo(os_id, version, codename, ""), pins.driver_branch),
                 version_prefix(pins.driver_branch, pins.driver_version),
                 f"driver {pins.driver_version or pins.driver_branch}"),
                ("nvidia-container-toolkit", TOOLKIT_PACKAGES, pins.toolkit_version,
                 f"container toolkit {pins.toolkit_version}")):
            repo = settings.apt_repos[name].expand(os_id=os_id, version_id=version,
                                                   codename=codename)
            source = f"{name} {repo.url} {repo.suite}".strip()
            thing = f"{what} ({os_id} {version})"
            if name == "cuda" and os_id == "ubuntu":
                # The deploy installs Ubuntu's own -server driver packages (its archive).
                out.append(Finding(thing, "Ubuntu's archive", UNCHECKED, ", ".join(pkgs)))
                continue
            index = self.index(repo, "sqv" if (os_id, version) == ("debian", "13") else "gpgv")
            if isinstance(index, AptIndexError):
                status = UNREACHABLE if isinstance(index, AptUnreachable) else MISSING
                out.append(Finding(thing, source, status, str(index)[:300]))
                continue
            found, lacking = [], []
            for pkg in pkgs:
                # A pinned driver version is upstream only ("580.105.08"): the deploy takes
                # any Debian revision of it ("580.105.08-1", its apt pin "580.105.08-*").
                match = [v for v in index.versions(pkg) if v == want or v.startswith(
                    want if want.endswith(".") else f"{want}-")]
                if match:
                    found.append(f"{pkg} {max(match, key=_version_order)}")
                else:
                    has = ", ".join(sorted(set(index.versions(pkg)), key=_version_order)[-4:])
                    lacking.append(f"{pkg} (it has {has or 'no version'})")
            if lacking:
                out.append(Finding(thing, source, MISSING, f"no {want.rstrip('.')}"
                                   f"{'.*' if want.endswith('.') else ''} of {'; '.join(lacking)} "
                                   f"for {os_id} {version}; pin what it carries, or configure the "
                                   f"repository that has it (apt_repos.{name})"))
            else:
                out.append(Finding(thing, source, FOUND, f"{', '.join(found)} ({index.verifier})"))
        return out


def _version_order(version: str) -> list[str | int]:
    """A sort key by a version's numbers, as ``sort -V`` (580.95.05-1 before 580.105.08-1)."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", version))]


def problems_of(findings: Iterable[Finding]) -> list[Finding]:
    """The findings that fail a check: missing and unreachable."""
    return [f for f in findings if f.status in (MISSING, UNREACHABLE)]


def online_pass(images: bool = False, reach: Sequence[str] = (), timeout: float = 10.0) -> Online:
    """An online pass (check, the deploy's preflight, pins lock, bump): ``RIGFLEET_REACH``'s
    pairs, then ``reach`` (--reach)."""
    return Online(reach=reacher(reach, os.environ.get("RIGFLEET_REACH", "")),
                  timeout=timeout, images=images)


def verify_pins(hosts: Sequence[Any], pins: Pins, run: Online) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of ``pins`` (about to be locked, or a bump's) for the GPU hosts."""
    for h in (gpu for gpu in hosts if gpu.kind.gpu):
        try:
            settings = validate_host(h.name, h.data)
        except ValidationError:
            continue  # the caller refuses bad host data itself
        run.host(settings, pins.for_host(h.name), host_os(h.data.get("os")))
    found = list(run.findings.values())
    refusals = [f"{f.thing}: missing at {f.source}: {f.todo} (hosts: {', '.join(f.hosts)})"
                for f in found if f.status == MISSING]
    warnings = [f"{f.thing}: not checked from this machine ({f.todo})"
                for f in found if f.status == UNREACHABLE]
    return refusals, warnings


def deploy_verdict(settings: HostSettings, pins: Pins, os_key: OsKey,
                   run: Online) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of the deploy's preflight for one host of a known OS."""
    before = dict(run.findings)
    run.host(settings, pins, [os_key])
    mine = [f for k, f in run.findings.items() if settings.name in f.hosts or k not in before]
    refusals = [f"{settings.name}: {f.thing}: missing at {f.source}: {f.todo}"
                for f in mine if f.status == MISSING]
    warnings = [f"{settings.name}: {f.thing}: not checked from this machine ({f.todo}); the "
                "host's own step will tell" for f in mine if f.status == UNREACHABLE]
    return refusals, warnings


def add_parser(sub: Any) -> None:
    from rigfleet.cliargs import fleet_options

    p = sub.add_parser("check", parents=[fleet_options(timeout=10.0,
                                                       timeout_help="seconds per source asked")],
                       help="check the inventory, pins and stack files (offline), "
                       "and with --online every pinned thing against its source")
    p.add_argument("--online", action="store_true",
                   help="also ask each pinned thing's source (registries, hub, Genesis, apt)")
    p.add_argument("--reach", action="append", default=[], metavar="FROM=TO",
                   help="this machine reaches URLs starting FROM at TO (repeatable; "
                   "added to RIGFLEET_REACH's pairs)")
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from rich.console import Console

    from rigfleet.cliargs import fleet_hosts
    from rigfleet.tables import show

    checked = offline(fleet_hosts(args))
    run = online_pass(images=True, reach=args.reach, timeout=args.timeout)
    if args.online:
        for settings, pins, oses in checked.hosts.values():
            run.host(settings, pins, oses)
    findings = list(run.findings.values())
    failed = bool(checked.problems) or bool(problems_of(findings))
    show(args.json, {"ok": not failed, "problems": checked.problems,
                     "findings": [asdict(f) for f in findings]},
         render(args.inventory, checked.problems, findings, args.online, Console().width))
    return 1 if failed else 0


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(1, width - 1)] + "…"


def render(inventory: str, problems: Sequence[str], findings: Sequence[Finding],
           online: bool, width: int = 160) -> Any:
    """The table, cells cut to one line of ``width`` (the notes say it in full)."""
    from rich.text import Text

    from rigfleet.tables import Table

    style = {FOUND: "green", CHANGED: "yellow", MISSING: "red", UNREACHABLE: "red",
             UNCHECKED: "dim"}
    title = (f"rigfleet check ({inventory}): {len(problems)} problem(s) offline"
             + (f", {len(problems_of(findings))} online" if online else ", online not asked"))
    table = Table(title, ["thing", "status", "source", "what to do"], keys=("thing", "status"))
    # Rich shrinks columns of a table wider than the console, even to nothing.
    room = max(40, width - 11 - 4)
    thing_w, source_w = room * 2 // 5, room // 4
    for p in problems:
        where, _, rest = p.partition(": ")
        table.row(_cut(rest.partition(": ")[0], thing_w), Text("invalid", style="red"),
                  _cut(where, source_w), "see below")
        table.note(where, rest)
    for f in findings:
        table.row(_cut(f.thing, thing_w), Text(f.status, style=style.get(f.status, "")),
                  _cut(f.source, source_w), _cut(f.todo, room - thing_w - source_w))
        if f.status in (MISSING, UNREACHABLE, CHANGED):
            table.note(f.thing, f"{f.status} at {f.source}: {f.todo} (hosts: {', '.join(f.hosts)})")
    return table
