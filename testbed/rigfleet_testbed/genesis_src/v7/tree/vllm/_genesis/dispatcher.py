"""Patch registry and the apply/skip decision.

``PATCH_REGISTRY`` maps a patch id to its metadata; every patch is opt-in through its
``env_flag`` (exact name; there are no short aliases for the long ones): a truthy value (``1``,
``true``, ``yes``, ``on``) applies it, unset skips it, a falsy value (``0``, ``false``, ``no``,
``off``, empty) switches it off. The exception is a legacy patch (P4): its ``env_flag`` is
``GENESIS_LEGACY_<id>``, no switch, and it applies on every apply (its text patch skips itself
where vLLM no longer needs it). The typo guard compares every ``GENESIS_ENABLE_*`` variable
in the environment with the registered flags and names the closest one
(``GENESIS_TYPO_GUARD_STRICT=1`` turns the warning into a setup error).

    from vllm._genesis.dispatcher import decide_all
    for d in decide_all(os.environ):
        print(d.patch_id, d.apply, d.reason)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm._genesis.kernel.orchestrate import Decision, env_decision, is_legacy, legacy_decision

PATCH_REGISTRY: dict[str, dict[str, Any]] = {}  # genesis-fixture: registry

ENV_FLAGS: frozenset[str] = frozenset(str(e["env_flag"]) for e in PATCH_REGISTRY.values())

def should_apply(patch_id: str, env: Mapping[str, str]) -> Decision:
    meta = PATCH_REGISTRY[patch_id]
    title, flag = str(meta["title"]), str(meta["env_flag"])
    if is_legacy(flag):
        return legacy_decision(patch_id, title, flag)
    return env_decision(patch_id, title, flag, env)

def decide_all(env: Mapping[str, str]) -> list[Decision]:
    return [should_apply(pid, env) for pid in PATCH_REGISTRY]
