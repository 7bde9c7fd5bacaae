"""Should a registered patch apply? The switch, then its lifecycle, then its version range.

- a legacy patch (``env_flag`` ``GENESIS_LEGACY_<id>``: P4) is none of this: its own apply hook
  runs on every apply, outside these gates, so it applies even where its lifecycle is
  ``retired`` (its text patch skips itself where vLLM no longer needs it);
- switch: opt-in (truthy applies, unset skips, falsy switches it off), read for the
  ``env_flag`` and then each of its ``env_flag_aliases`` as ``SNDR_ENABLE_<name>`` or, when that
  is unset, ``GENESIS_ENABLE_<name>`` (``<name>``: the flag without either prefix); the first
  truthy one applies the patch;
- ``lifecycle: retired``: hard-skipped, whatever the switch says, unless
  ``GENESIS_ALLOW_RETIRED=1``;
- ``applies_to.vllm_version_range``: with ``GENESIS_ENFORCE_VERSION_RANGE=1`` a running vLLM
  outside the range skips the patch; without it (the default) the patch applies and the line
  says it is out of range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from sndr.dispatcher.registry import PATCH_REGISTRY
from sndr.kernel.orchestrate import (
    Decision,
    env_decision,
    is_legacy,
    legacy_decision,
    truthy,
    vllm_version,
)

ALLOW_RETIRED_ENV = "GENESIS_ALLOW_RETIRED"
ENFORCE_RANGE_ENV = "GENESIS_ENFORCE_VERSION_RANGE"
SWITCH_PREFIXES = ("SNDR_ENABLE_", "GENESIS_ENABLE_")  # SNDR_ENABLE_ wins when both are set
ENV_FLAGS: frozenset[str] = frozenset(
    str(flag) for e in PATCH_REGISTRY.values()
    for flag in (e["env_flag"], *(e.get("env_flag_aliases") or ())))


def bare(flag: str) -> str:
    """``flag`` without its ``SNDR_ENABLE_``/``GENESIS_ENABLE_`` prefix."""
    for prefix in SWITCH_PREFIXES:
        if flag.startswith(prefix):
            return flag[len(prefix):]
    return flag


def set_name(flag: str, env: Mapping[str, str]) -> str | None:
    """``SNDR_ENABLE_<bare>`` when set, else ``GENESIS_ENABLE_<bare>`` when set, else None."""
    return next((n for n in (f"{p}{bare(flag)}" for p in SWITCH_PREFIXES) if n in env), None)


def switch_name(meta: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """The variable that decides a patch: of its flags (``env_flag``, then its aliases) as
    :func:`set_name` reads them, the first truthy one, else the first set one, else
    ``env_flag`` (unset)."""
    flags = (str(meta["env_flag"]), *(str(a) for a in meta.get("env_flag_aliases") or ()))
    names = [n for n in (set_name(f, env) for f in flags) if n]
    return next((n for n in names if truthy(env, n)), names[0] if names else flags[0])


def version_range(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """``applies_to.vllm_version_range`` as specifiers (one string is one specifier)."""
    raw = (meta.get("applies_to") or {}).get("vllm_version_range") or ()
    return (raw,) if isinstance(raw, str) else tuple(raw)


def in_range(version: str | None, spec: tuple[str, ...]) -> bool:
    """``version`` satisfies every specifier of ``spec`` (pre-releases count as versions)."""
    try:
        return version is not None and SpecifierSet(",".join(spec)).contains(
            Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


def should_apply(patch_id: str, env: Mapping[str, str], version: str | None) -> Decision:
    meta = PATCH_REGISTRY[patch_id]
    lifecycle = str(meta.get("lifecycle") or "experimental")
    if is_legacy(str(meta["env_flag"])):
        return legacy_decision(patch_id, str(meta["title"]), str(meta["env_flag"]),
                               note=f" [lifecycle {lifecycle}]")
    d = env_decision(patch_id, str(meta["title"]), switch_name(meta, env), env)
    if not d.apply:
        return d
    if lifecycle == "retired" and not truthy(env, ALLOW_RETIRED_ENV):
        return Decision(patch_id, d.title, False, f"lifecycle retired: hard-skipped (set "
                        f"{ALLOW_RETIRED_ENV}=1 to force)", True, "SKIP")
    spec = version_range(meta)
    note = f" [lifecycle {lifecycle}]" if lifecycle in ("legacy", "research") else ""
    if spec and not in_range(version, spec):
        if truthy(env, ENFORCE_RANGE_ENV):
            return Decision(patch_id, d.title, False, f"vllm {version} outside "
                            f"vllm_version_range {','.join(spec)} ({ENFORCE_RANGE_ENV}=1)",
                            True, "SKIP")
        note += f" [vllm {version} outside vllm_version_range {','.join(spec)}; not enforced]"
    return Decision(patch_id, d.title, True, d.reason, True, note=note)


def decide_all(env: Mapping[str, str]) -> list[Decision]:
    version = vllm_version()
    return [should_apply(pid, env, version) for pid in PATCH_REGISTRY]
