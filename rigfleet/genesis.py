"""Whether a Genesis tree suits a stack: every Genesis decision of docs/genesis.md, the same on
the host (``roles/genesis.py``) and on the control side (``pins lock``, ``bump``)::

    report = TreeReport.from_json(json.loads(helper_stdout))
    pairing_problems(report, pin, stack="tq3-mtp-genesis", vllm_version="0.21.0",
                     use=StackUse.of(spec, "v12"))            # [] when the pairing is sound
    entries = read_entries(DirSource("/tmp/genesis"), "v12")
    decision_problems(spec, entries, "0.21.0", label="v12.1.0", generation="v12")  # []
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rigfleet.genesis_inspect import (
    GENERATIONS,
    KNOWN_GOOD,
    PENDING,
    REGISTRY,
    SCHEMA,
    Source,
    lifecycle,
    read_file,
    registry_literal,
    strings,
    switch_names,
)

if TYPE_CHECKING:
    from rigfleet.catalog import StackSpec
    from rigfleet.pins import GenesisPin

# How Genesis reads a switch's value (both generations): stripped, lower-cased, one of these.
TRUTHY = frozenset({"1", "true", "yes", "on"})
# A legacy patch's env_flag switches nothing: Genesis applies it on every run.
LEGACY_PREFIX = "GENESIS_LEGACY_"
# Genesis' categories for patches that fix wrong output or crashes (registry.py ``category``).
CORRECTNESS_CATEGORIES = ("correctness", "model_correctness", "stability")
RANGE_KEY = "vllm_version_range"
_ARCH_KEYS = ("model_arch", "architectures")
_SPEC_KEYS = ("spec_method", "spec_decode_method", "spec_method_any")
_PATCH_ID = re.compile(r"(G4_[0-9]+[A-Z]?|PN?[0-9]+[A-Z]?)(?:_|$)")
_PLAIN_RELEASE = re.compile(r"v?[0-9]+(?:\.[0-9]+)+")
_SHOWN = 6


@dataclass(frozen=True)
class Switch:
    """One patch a switch name turns on: its id, lifecycle, and ``env_flag`` or ``alias``."""

    patch: str
    lifecycle: str
    via: str


@dataclass(frozen=True)
class TreeReport:
    """What ``rigfleet-genesis-inspect.py`` reports about one Genesis tree (its JSON, typed);
    ``patch_flags``: patch id -> (env_flag, lifecycle, default_on)."""

    layout: str | None
    version: str | None = None
    allowlist_file: str | None = None
    known_good: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    registry_file: str | None = None
    patches: int = 0
    lifecycles: Mapping[str, int] = field(default_factory=dict)
    switch_prefixes: tuple[str, ...] = ()
    retired_skipped: bool = False
    switches: Mapping[str, tuple[Switch, ...]] = field(default_factory=dict)
    patch_flags: Mapping[str, tuple[str | None, str, bool]] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()
    errors: tuple[str, ...] = ()
    has_registry: bool = False

    @classmethod
    def from_json(cls, data: Any) -> TreeReport:
        """Parse the helper's JSON object; raises ``ValueError`` on another schema."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} report")
        allow = data.get("allowlist") or {}
        reg = data.get("registry") or {}
        return cls(
            layout=data.get("layout"),
            version=data.get("version"),
            allowlist_file=allow.get("file"),
            known_good=tuple(allow.get("known_good") or ()),
            pending=tuple(allow.get("pending") or ()),
            registry_file=reg.get("file"),
            patches=int(reg.get("patches") or 0),
            lifecycles=dict(reg.get("lifecycles") or {}),
            switch_prefixes=tuple(reg.get("switch_prefixes") or ()),
            retired_skipped=bool(reg.get("retired_skipped")),
            switches={k: tuple(Switch(*t) for t in v)
                      for k, v in (reg.get("switches") or {}).items()},
            patch_flags={k: (v[0], v[1], bool(v[2]))
                         for k, v in (reg.get("patch_flags") or {}).items()},
            flags=frozenset(data.get("flags") or ()),
            errors=tuple(data.get("errors") or ()),
            has_registry=bool(reg),
        )  # fmt: skip

    @property
    def allowed(self) -> tuple[str, ...]:
        """Every vLLM version Genesis accepts (both lists)."""
        return (*self.known_good, *self.pending)

    def lists(self, version: str) -> bool:
        """Genesis accepts vLLM ``version`` (exact membership, as Genesis checks it)."""
        return version in self.allowed

    def patch_id(self, name: str) -> str | None:
        """The registry's spelling of patch id ``name`` (``P60B`` -> ``P60b``), or None."""
        return next((p for p in self.patch_flags if p.upper() == name.upper()), None)

    def targets(self, name: str) -> tuple[Switch, ...]:
        """What variable ``name`` switches in this tree (none: not a switch it reads)."""
        prefix = next((p for p in self.switch_prefixes if name.startswith(p)), None)
        return () if prefix is None else self.switches.get(name[len(prefix):], ())


def truthy(value: str) -> bool:
    return value.strip().lower() in TRUTHY


@dataclass(frozen=True)
class StackUse:
    """Stack ``spec``'s use of Genesis: its env (the file's, then ``host_env`` from extra_env)."""

    spec: StackSpec
    generation: str
    env: Mapping[str, str]
    host_env: frozenset[str] = frozenset()
    switches_on: frozenset[str] = frozenset()
    needs: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: StackSpec, generation: str,
           host_env: Mapping[str, str] | None = None) -> StackUse:  # fmt: skip
        """``spec`` with switch set ``generation``; raises ``ValueError`` when it has none."""
        if spec.genesis is None:
            raise ValueError(f"stack {spec.name} does not use Genesis")
        if generation not in spec.genesis.switches:
            raise ValueError(f"stack {spec.name}: {spec.source}: genesis.switches has no "
                             f"{generation} set, but the pinned Genesis has the {generation} "
                             f"layout; allowed: add genesis.switches.{generation} (have: "
                             f"{', '.join(spec.genesis.switches)})")
        extra = dict(host_env or {})
        on = spec.genesis.switches[generation][0]
        file_env = spec.environment(generation)
        return cls(
            spec=spec,
            generation=generation,
            env={**file_env, **extra},
            host_env=frozenset(extra),
            switches_on=frozenset(f"GENESIS_ENABLE_{s}" for s in on),
            needs=spec.genesis.needs,
        )

    def fix(self, name: str) -> str:
        """Where ``name`` is set, as "remove it from ..."."""
        if name in self.host_env:
            return f"remove it from host data extra_env.{self.spec.name} (or set it to 0)"
        where = (f"the stack file's genesis.switches.{self.generation}.on"
                 if name in self.switches_on else "the stack file's env")
        return f"remove it from {where} ({self.spec.source})"

    @property
    def allows_retired(self) -> bool:
        return truthy(self.env.get("GENESIS_ALLOW_RETIRED", ""))


def allowlist_summary(report: TreeReport) -> str:
    """``guards.py: a, b`` or ``guards.py: 39 + 4 entries; releases among them: 0.21.0``."""
    entries = report.allowed
    where = report.allowlist_file or "its guards file"
    if len(entries) <= _SHOWN:
        return f"{where}: {', '.join(entries) or 'empty'}"
    counts = f"{len(report.known_good)}" + (f" + {len(report.pending)}" if report.pending else "")
    releases = [e for e in dict.fromkeys(entries) if re.fullmatch(r"[0-9.]+(rc[0-9]+)?", e)]
    return (f"{where}: {counts} entries; releases among them: {', '.join(releases)}"
            if releases else f"{where}: {counts} entries, none of them a release")


def allowlist_problem(report: TreeReport, version: str, *, label: str,
                      image_ref: str = "") -> str | None:
    """Why Genesis ``label`` refuses vLLM ``version`` (None: on one of its lists)."""
    if report.lists(version):
        return None
    both = report.layout == "v12" or bool(report.pending)
    lists = f"{KNOWN_GOOD} nor on its {PENDING}" if both else KNOWN_GOOD
    image = f" (image {image_ref})" if image_ref else ""
    return (f"vLLM {version}{image} is not on Genesis {label}'s {lists} "
            f"({allowlist_summary(report)})")


def switch_problems(report: TreeReport, use: StackUse, *, label: str) -> list[str]:
    """Switches set to 1 that Genesis ``label`` does not know, or would skip as retired."""
    problems: list[str] = []
    for name, value in use.env.items():
        prefix = next((p for p in ("GENESIS_ENABLE_", "SNDR_ENABLE_") if name.startswith(p)), None)
        if prefix is None or not truthy(value):
            continue
        suffix = name[len(prefix):]
        head = f"stack {use.spec.name}: {name}={value}: "
        if not (targets := report.targets(name)):
            if prefix not in report.switch_prefixes or suffix not in report.flags:
                problems.append(head + _unknown(report, prefix, suffix, label) + "; "
                                + use.fix(name))  # fmt: skip
        elif (report.retired_skipped and not use.allows_retired
              and all(t.lifecycle == "retired" for t in targets)):
            ids = ", ".join(dict.fromkeys(t.patch for t in targets))
            what = (f"it is an alias of patch {ids}, which is retired"
                    if all(t.via == "alias" for t in targets) else f"patch {ids} is retired")
            problems.append(f"{head}{what} in Genesis {label}; {use.fix(name)}")
    return problems


def _unknown(report: TreeReport, prefix: str, suffix: str, label: str) -> str:
    if prefix not in report.switch_prefixes:
        return f"Genesis {label} reads no {prefix}* switches"
    m = _PATCH_ID.match(suffix)
    pid = report.patch_id(m.group(1)) if m else None
    if pid is not None:
        flag, state, _ = report.patch_flags[pid]
        why = f"its patch {pid} ({state}) has " + (f"env_flag {flag}" if flag else "no env_flag")
    else:
        why = (f"no env_flag or env_flag_alias in {report.registry_file} is named so"
               + (f", and it has no patch {m.group(1)}" if m else ""))
    # Suggest only a switch of the same patch (P4 is not a typo of P94).
    same = [s for s in report.switches
            if m and (n := _PATCH_ID.match(s)) and n.group(1).upper() == m.group(1).upper()]
    close = difflib.get_close_matches(suffix, same if m else list(report.switches), n=1,
                                      cutoff=0.6 if m else 0.85)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    return f"Genesis {label} has no such switch ({why}{hint})"


def needs_problems(report: TreeReport, use: StackUse, *, label: str) -> list[str]:
    """Needed patches Genesis ``label`` lacks, skips as retired, or the stack file leaves off."""
    problems = []
    on = {t.patch for name, value in use.spec.environment(use.generation).items() if truthy(value)
          for t in report.targets(name)}  # fmt: skip
    for need in use.needs:
        head = f"stack {use.spec.name}: needs Genesis patch {need}"
        if (pid := report.patch_id(need)) is None:
            problems.append(f"{head}, which Genesis {label} does not have (not in "
                            f"{report.registry_file}); pin a Genesis commit that has it")
            continue
        flag, state, default_on = report.patch_flags[pid]
        if flag and flag.startswith(LEGACY_PREFIX):
            continue  # applied on every run, in both generations, whatever its lifecycle
        if state == "retired" and report.retired_skipped and not use.allows_retired:
            problems.append(f"{head}, which is retired in Genesis {label} (Genesis skips it); "
                            "pin a Genesis commit where it is live")
        elif pid not in on and not default_on:
            names = sorted(f"GENESIS_ENABLE_{s}" for s, ts in report.switches.items()
                           if any(t.patch == pid for t in ts))  # fmt: skip
            problems.append(f"{head}, but no switch that turns it on is set to 1 (Genesis {label} "
                            f"switches it with {', '.join(names) or flag}); add it to the stack "
                            f"file's genesis.switches.{use.generation}.on ({use.spec.source})")
    return problems


def layout_problem(what: str, found: str | None, pin: GenesisPin) -> str | None:
    """Why checkout or tree ``what``, whose files mark layout ``found``, does not suit ``pin``."""
    if found == pin.layout:
        return None
    if found is None:
        return (f"{what} lacks {GENERATIONS[pin.layout].check_file} (the {pin.layout} layout the "
                "pins say), and marks no other layout rigfleet knows (wrong repository?)")
    return (f"{what} has the {found} layout ({GENERATIONS[found].check_file}), but the pins say "
            f"layout {pin.layout} for Genesis {pin.label}; fix the pins' genesis.layout (`rigfleet "
            "pins lock` records it from the tree)")


def pairing_problems(report: TreeReport, pin: GenesisPin, *, stack: str,
                     vllm_version: str | None, use: StackUse | None, image_ref: str = "",
                     where: str = "") -> list[str]:
    """Why Genesis ``pin`` is unfit for ``stack`` (``vllm_version``/``use`` None: not checked)."""
    at = f" at {where}" if where else ""
    label = pin.label
    if report.errors:
        return [f"stack {stack}: cannot read Genesis {label}{at}: {'; '.join(report.errors)}"]
    if report.layout != pin.layout:
        check = GENERATIONS[report.layout].check_file if report.layout in GENERATIONS else "?"
        return [f"stack {stack}: Genesis {label}{at} has the {report.layout} layout ({check}), "
                f"but the pins say layout {pin.layout}; fix stacks.{stack}.genesis.layout in the "
                "pins file (`rigfleet pins lock` records it from the tree)"]  # fmt: skip
    problems = []
    if (pin.version and report.version and _PLAIN_RELEASE.fullmatch(pin.version)
            and _PLAIN_RELEASE.fullmatch(report.version)
            and pin.version.lstrip("v") != report.version.lstrip("v")):  # fmt: skip
        problems.append(f"stack {stack}: the pins say Genesis {pin.version}, but the tree of "
                        f"{pin.commit[:12]}{at} declares {report.version}; fix "
                        f"stacks.{stack}.genesis.version in the pins file")  # fmt: skip
    why = None if vllm_version is None else allowlist_problem(
        report, vllm_version, label=label, image_ref=image_ref)
    if why is not None:
        problems.append(f"stack {stack}: {why}; refusing it (pin an image Genesis lists, or a "
                        f"Genesis commit that lists vLLM {vllm_version})")  # fmt: skip
    if use is not None:
        if not report.has_registry:
            problems.append(f"stack {stack}: Genesis {label}{at}: its patch registry was not "
                            "read; cannot check the stack's switches")  # fmt: skip
        else:
            problems += switch_problems(report, use, label=label)
            problems += needs_problems(report, use, label=label)
    return problems


@dataclass(frozen=True)
class PatchEntry:
    """One ``PATCH_REGISTRY`` entry; ``switches``: the suffixes that turn it on (legacy: none)."""

    pid: str
    title: str
    category: str
    lifecycle: str
    default_on: bool
    applies_to: Mapping[str, Any] = field(default_factory=dict)
    switches: tuple[str, ...] = ()


def entries_from_literal(registry: Mapping[str, Mapping[str, Any]],
                         generation: str) -> list[PatchEntry]:  # fmt: skip
    """The entries of a ``PATCH_REGISTRY`` literal of Genesis ``generation`` (``v7``/``v12``)."""
    files = GENERATIONS[generation]
    out = []
    for pid, meta in registry.items():
        legacy = str(meta.get("env_flag")).startswith(LEGACY_PREFIX)
        suffixes = [s for s, via in switch_names(meta, files) if not (legacy and via == "env_flag")]
        applies = meta.get("applies_to")
        out.append(PatchEntry(
            pid=pid, title=str(meta.get("title") or ""), category=str(meta.get("category") or ""),
            lifecycle=lifecycle(meta), default_on=bool(meta.get("default_on")),
            applies_to=dict(applies) if isinstance(applies, dict) else {},
            switches=tuple(dict.fromkeys(suffixes))))  # fmt: skip
    return out


def read_entries(source: Source, generation: str) -> list[PatchEntry]:
    """The registry entries of the tree ``source``; raises ``InspectError``."""
    rel = GENERATIONS[generation].registry_file
    text = read_file(source, rel, generation, REGISTRY)
    return entries_from_literal(registry_literal(text, rel), generation)


def in_range(value: Any, vllm_version: str | None) -> bool:
    """``vllm_version`` is inside ``value`` (specifiers); anything unknown or unparsable is."""
    if vllm_version is None:
        return True
    parts = [value] if isinstance(value, str) else strings(value)  # None, []: no specifier
    try:
        spec = SpecifierSet(",".join(p.strip() for p in parts))
        return spec.contains(Version(vllm_version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True


def stack_profile(spec: StackSpec) -> dict[str, Any]:
    """What the stack says of the ``applies_to`` keys (a key left out is unknown)."""
    out: dict[str, Any] = {"kv_cache_dtype": spec.kv_cache_dtype,
                           "is_turboquant": spec.kv_cache_dtype.startswith("turboquant"),
                           "spec_method": spec.speculative_method or "none",
                           "platform": "cuda"}  # fmt: skip
    for i, arg in enumerate(spec.args):
        flag, eq, value = arg.partition("=")
        if flag == "--tool-call-parser":
            out["tool_call_parser"] = value if eq else next(iter(spec.args[i + 1:]), "")
    if spec.genesis is not None:
        out.update(spec.genesis.model)
    return out


def meets(applies_to: Mapping[str, Any], profile: Mapping[str, Any]) -> bool:
    """``profile`` meets every condition of ``applies_to``; an unknown one counts as met."""
    for key, allowed in applies_to.items():
        if key == RANGE_KEY:
            continue
        wanted = list(allowed) if isinstance(allowed, list | tuple | set) else [allowed]
        if key in _ARCH_KEYS:
            have = profile.get("model_arch")
            if have and "*" not in wanted and not any(
                    a in wanted for a in ([have] if isinstance(have, str) else have)):
                return False
            continue
        actual = profile.get("spec_method" if key in _SPEC_KEYS else key)
        if actual is not None and actual not in wanted:
            return False
    return True


def in_scope(entry: PatchEntry, profile: Mapping[str, Any], vllm_version: str | None) -> bool:
    """The stack must decide ``entry``: a live correctness patch that concerns it."""
    return (entry.category in CORRECTNESS_CATEGORIES and entry.lifecycle != "retired"
            and meets(entry.applies_to, profile)
            and in_range(entry.applies_to.get(RANGE_KEY), vllm_version))


def decision_problems(spec: StackSpec, entries: Iterable[PatchEntry], vllm_version: str | None,
                      *, label: str, generation: str) -> list[str]:
    """Each patch the stack must decide and leaves undecided or at odds with ``generation``."""
    if (g := spec.genesis) is None:
        return []
    profile = stack_profile(spec)
    on, off = g.switches.get(generation, ((), ()))
    out = []
    for e in (entry for entry in entries if in_scope(entry, profile, vllm_version)):
        key = f"{spec.source}: genesis.decisions.{e.pid}"
        r = e.applies_to.get(RANGE_KEY)
        shown = ("no vllm_version_range" if r is None else
                 f"vllm_version_range {r if isinstance(r, str) else ','.join(strings(r))}")
        what = (f"Genesis {label} patch {e.pid} ({e.title!r}; {e.category}, {shown}, "
                f"default_on {e.default_on})")
        if (d := g.decisions.get(e.pid)) is None:
            out.append(f"{key}: missing; {what} applies to this stack on vLLM "
                       f"{vllm_version or '(any)'}; allowed: {{decision: on|off|default, "
                       "reason: one line}")  # fmt: skip
            continue
        switched_on = [s for s in e.switches if s in on]
        names = ", ".join(f"GENESIS_ENABLE_{s}" for s in e.switches)
        where = f"genesis.switches.{generation}"
        if not e.switches and d.decision != "default":
            out.append(f"{key}: {d.decision!r} is not possible; {what} has no switch (Genesis "
                       "applies it by its own hook); allowed: default")
        elif d.decision == "on" and not switched_on:
            out.append(f"{key}: 'on', but none of its switches ({names}) is in {where}.on; "
                       f"allowed: add one there, or decide off/default")
        elif d.decision != "on" and switched_on:
            out.append(f"{key}: {d.decision!r}, but {where}.on sets "
                       f"{', '.join(switched_on)}; allowed: on, or remove it from {where}.on")
        elif d.decision == "default" and (switched_off := [s for s in e.switches if s in off]):
            out.append(f"{key}: 'default', but {where}.off sets {', '.join(switched_off)} to 0; "
                       f"allowed: off, or remove it from {where}.off")
    return out
