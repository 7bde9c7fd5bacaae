"""Should a registered patch apply? The switch, then its lifecycle, then its version range.

- switch: opt-in ``GENESIS_ENABLE_*`` (truthy applies, unset skips, falsy switches it off);
- ``lifecycle: retired``: hard-skipped, whatever the switch says, unless
  ``GENESIS_ALLOW_RETIRED=1``;
- ``applies_to.vllm_version_range``: with ``GENESIS_ENFORCE_VERSION_RANGE=1`` a running vLLM
  outside the range skips the patch; without it (the default) the patch applies and the line
  says it is out of range.
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from sndr.dispatcher.registry import PATCH_REGISTRY
from sndr.kernel.orchestrate import Decision, env_decision, truthy, vllm_version

ALLOW_RETIRED_ENV = "GENESIS_ALLOW_RETIRED"
ENFORCE_RANGE_ENV = "GENESIS_ENFORCE_VERSION_RANGE"
ENV_FLAGS: frozenset[str] = frozenset(str(e["env_flag"]) for e in PATCH_REGISTRY.values())


def in_range(version: str | None, spec: tuple[str, ...]) -> bool:
    """``version`` satisfies every specifier of ``spec`` (pre-releases count as versions)."""
    try:
        return version is not None and SpecifierSet(",".join(spec)).contains(
            Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


def should_apply(patch_id: str, env: Mapping[str, str], version: str | None) -> Decision:
    meta = PATCH_REGISTRY[patch_id]
    d = env_decision(patch_id, str(meta["title"]), str(meta["env_flag"]), env)
    if not d.apply:
        return d
    lifecycle = str(meta.get("lifecycle") or "experimental")
    if lifecycle == "retired" and not truthy(env, ALLOW_RETIRED_ENV):
        return Decision(patch_id, d.title, False, f"lifecycle retired: hard-skipped (set "
                        f"{ALLOW_RETIRED_ENV}=1 to force)", True, "SKIP")
    spec = tuple((meta.get("applies_to") or {}).get("vllm_version_range") or ())
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
