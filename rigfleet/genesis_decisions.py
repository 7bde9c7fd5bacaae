"""Which Genesis correctness patches a stack file must decide (docs/genesis.md, "Correctness
patches every Genesis stack decides"), read from Genesis' own ``PATCH_REGISTRY``::

    entries = read_entries(DirSource("/tmp/genesis"), "v12")
    decision_problems(get_stack("tq3-mtp-genesis"), entries, "0.21.0", label="v12.1.0")  # []
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rigfleet.genesis import LEGACY_PREFIX
from rigfleet.genesis_inspect import (
    GENERATIONS,
    REGISTRY,
    Source,
    lifecycle,
    read_file,
    registry_literal,
    strings,
    switch_names,
)

if TYPE_CHECKING:
    from rigfleet.catalog import StackSpec

# Genesis' categories for patches that fix wrong output or crashes (registry.py ``category``).
CORRECTNESS_CATEGORIES = ("correctness", "model_correctness", "stability")
RANGE_KEY = "vllm_version_range"
_ARCH_KEYS = ("model_arch", "architectures")
_SPEC_KEYS = ("spec_method", "spec_decode_method", "spec_method_any")


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

    @property
    def vllm_range(self) -> Any:
        return self.applies_to.get(RANGE_KEY)

    def shown_range(self) -> str:
        r = self.vllm_range
        if r is None:
            return "no vllm_version_range"
        return f"vllm_version_range {','.join(strings(r)) if not isinstance(r, str) else r}"


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
    if value is None or vllm_version is None:
        return True
    parts = [value] if isinstance(value, str) else strings(value)
    if not parts:
        return True
    try:
        spec = SpecifierSet(",".join(p.strip() for p in parts))
        version = Version(vllm_version)
    except (InvalidSpecifier, InvalidVersion):
        return True
    return spec.contains(version, prereleases=True)


def stack_profile(spec: StackSpec) -> dict[str, Any]:
    """What the stack says of the ``applies_to`` keys (a key left out is unknown)."""
    out: dict[str, Any] = {"kv_cache_dtype": spec.kv_cache_dtype,
                           "is_turboquant": spec.kv_cache_dtype.startswith("turboquant"),
                           "spec_method": spec.speculative_method or "none",
                           "platform": "cuda"}  # fmt: skip
    args = list(spec.args)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag == "--tool-call-parser":
            out["tool_call_parser"] = value if eq else (args[i + 1] if i + 1 < len(args) else "")
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
            if "*" in wanted or not have:
                continue
            if not any(a in wanted for a in ([have] if isinstance(have, str) else have)):
                return False
            continue
        actual = profile.get("spec_method" if key in _SPEC_KEYS else key)
        if actual is not None and actual not in wanted:
            return False
    return True


def in_scope(entry: PatchEntry, profile: Mapping[str, Any], vllm_version: str | None) -> bool:
    """The stack must decide ``entry``: a live correctness patch that concerns it."""
    return (entry.category in CORRECTNESS_CATEGORIES and entry.lifecycle != "retired"
            and meets(entry.applies_to, profile) and in_range(entry.vllm_range, vllm_version))


def decision_problems(spec: StackSpec, entries: Iterable[PatchEntry], vllm_version: str | None,
                      *, label: str, generation: str | None = None) -> list[str]:
    """Each patch the stack must decide and does not, or decides against its switch set
    ``generation`` (None: not compared)."""
    g = spec.genesis
    if g is None:
        return []
    profile = stack_profile(spec)
    on, off = g.switches.get(generation, ((), ())) if generation else ((), ())
    out = []
    for e in entries:
        if not in_scope(e, profile, vllm_version):
            continue
        key = f"{spec.source}: genesis.decisions.{e.pid}"
        what = (f"Genesis {label} patch {e.pid} ({e.title!r}; {e.category}, {e.shown_range()}, "
                f"default_on {e.default_on})")
        d = g.decisions.get(e.pid)
        if d is None:
            out.append(f"{key}: missing; {what} applies to this stack on vLLM "
                       f"{vllm_version or '(any)'}; allowed: {{decision: on|off|default, "
                       "reason: one line}")  # fmt: skip
            continue
        if generation is None:
            continue
        switched_on = [s for s in e.switches if s in on]
        switched_off = [s for s in e.switches if s in off]
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
        elif d.decision == "default" and switched_off:
            out.append(f"{key}: 'default', but {where}.off sets {', '.join(switched_off)} to 0; "
                       f"allowed: off, or remove it from {where}.off")
    return out
