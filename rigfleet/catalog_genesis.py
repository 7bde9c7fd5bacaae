"""The ``genesis`` section of a stack file: what a stack needs of Genesis, and what it decided
(``decisions`` and ``model`` feed ``rigfleet.genesis_decisions``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rigfleet.catalog_keys import BY_PATH, allowed, keys_of
from rigfleet.genesis_layout import LAYOUTS
from rigfleet.validate import Problems, env_vars

_SWITCH = re.compile(r"[A-Z0-9][A-Z0-9_]*")
_PATCH_ID = re.compile(r"P[N]?[0-9]+[A-Za-z]?")
_PATCH_ID_ANY = re.compile(r"[A-Z][A-Z0-9]*_?[0-9]+[A-Za-z]?")
_PINNED_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*")
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class PatchDecision:
    """A stack file's decision on one Genesis patch (``on``, ``off``, ``default``) and why."""

    decision: str
    reason: str


@dataclass(frozen=True)
class GenesisSpec:
    """What a stack needs of Genesis; ``switches``: generation -> (set to 1, set to 0)."""

    needs: tuple[str, ...]
    switches: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
    params: Mapping[str, str]
    runtime_packages: tuple[str, ...] = ()
    decisions: Mapping[str, PatchDecision] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)

    def env(self, generation: str) -> dict[str, str]:
        """The ``GENESIS_*`` environment for ``generation`` (switches on, off, then params)."""
        on, off = self.switches[generation]
        return {
            **{f"GENESIS_ENABLE_{s}": "1" for s in on},
            **{f"GENESIS_ENABLE_{s}": "0" for s in off},
            **self.params,
        }


def parse_genesis(p: Problems, value: Any) -> GenesisSpec | None:
    """The ``genesis`` section (None when left out)."""
    if value is None:
        return None
    d = p.mapping("genesis", value) or {}
    needs = p.strings("genesis.needs", d.get("needs"), _PATCH_ID) or []
    switches: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    raw = d.get("switches")
    if not isinstance(raw, dict) or not raw:
        p.bad("genesis.switches", raw, f"{allowed('genesis.switches')} with generations "
              f"{', '.join(LAYOUTS)}")
    else:
        for gen, sets in raw.items():
            key = f"genesis.switches.{gen}"
            if gen not in LAYOUTS:
                p.bad(key, gen, ", ".join(LAYOUTS), "is not a Genesis generation rigfleet knows")
                continue
            s = p.mapping(key, sets) or {}
            on = p.strings(f"{key}.on", s.get("on"), _SWITCH) or []
            off = p.strings(f"{key}.off", s.get("off"), _SWITCH) or []
            both = sorted(set(on) & set(off))
            if both:
                p.bad(f"{key}.off", both, "each switch either on or off", "is also on")
            switches[str(gen)] = (tuple(on), tuple(off))
    params = env_vars(p, "genesis.params", d.get("params"), allowed("env"))
    for name in params:
        if not name.startswith("GENESIS_") or name.startswith("GENESIS_ENABLE_"):
            p.bad(f"genesis.params.{name}", name, allowed("genesis.params"))
    packages = p.strings("genesis.runtime_packages", d.get("runtime_packages"),
                         _PINNED_REQUIREMENT) or []
    return GenesisSpec(tuple(needs), MappingProxyType(switches), MappingProxyType(params),
                       tuple(packages), _decisions(p, d.get("decisions")),
                       _model(p, d.get("model")))


def _decisions(p: Problems, value: Any) -> Mapping[str, PatchDecision]:
    """``genesis.decisions`` (YAML's bare on/off, read as true/false, taken as on/off)."""
    out: dict[str, PatchDecision] = {}
    if value is not None and not isinstance(value, dict):
        p.bad("genesis.decisions", value, allowed("genesis.decisions"), "is not a mapping")
    for pid, entry in (value if isinstance(value, dict) else {}).items():
        key = f"genesis.decisions.{pid}"
        if not isinstance(pid, str) or not _PATCH_ID_ANY.fullmatch(pid):
            p.bad(key, pid, "a Genesis patch id such as PN346 or G4_26")
            continue
        e = p.mapping(key, entry) or {}
        raw = e.get("decision")
        raw = {True: "on", False: "off"}.get(raw, raw) if isinstance(raw, bool) else raw
        choice = p.choice(f"{key}.decision", raw, ("on", "off", "default"))
        reason = p.string(f"{key}.reason", e.get("reason"))
        if choice and reason:
            out[pid] = PatchDecision(choice, reason)
    return MappingProxyType(out)


def _model(p: Problems, value: Any) -> Mapping[str, Any]:
    """``genesis.model``: each key read as the table's type says."""
    d = p.mapping("genesis.model", value, required=False) or {}
    out: dict[str, Any] = {}
    for name in (n for n in keys_of("genesis.model") if n in d):
        key = f"genesis.model.{name}"
        kind = BY_PATH[key].type
        got = (p.boolean(key, d[name]) if kind == "boolean"
               else p.strings(key, d[name], _MODEL_ID, required=True) if kind == "list"
               else p.string(key, d[name], _MODEL_ID))
        if got is not None and got != []:
            out[name] = tuple(got) if isinstance(got, list) else got
    return MappingProxyType(out)
