"""The pins file after a rollout: what each host runs, and a history entry. Pure. The rules:
docs/bump.md, step 8 (a lost host is recorded on its old pins: its next converge goes through
its own swap gate either way)::

    new, entry = pins_after(plan, result, when="2026-05-20T10:00:00Z", by="ops@ctl")
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rigfleet.bump.plan_record import Plan
from rigfleet.bump.rollout import RolloutResult, Status
from rigfleet.pins import Pins, StackPins


def stack_summary(p: StackPins) -> dict[str, Any]:
    """A stack's pins in a history entry: enough for ``rigfleet rollback`` to rebuild them."""
    out: dict[str, Any] = {"image": p.image, "digest": p.digest, "vllm_version": p.vllm_version}
    out["image_id"] = p.image_id  # null: none pinned (absent: an entry older than this key)
    if p.genesis is not None:
        out["genesis"] = p.genesis.commit
        out["genesis_layout"] = p.genesis.layout
        if p.genesis.version:
            out["genesis_version"] = p.genesis.version
    return out


def outcome_of(result: RolloutResult) -> str:
    """``promoted`` | ``partial`` | ``failed`` (nothing moved)."""
    if result.promoted_everywhere:
        return "promoted"
    moved = [o for o in result.outcomes.values() if o.runs_new and o.status != Status.UP_TO_DATE]
    return "partial" if moved else "failed"


def pins_after(
    plan: Plan, result: RolloutResult, when: str, by: str, extra: dict[str, Any] | None = None
) -> tuple[Pins | None, dict[str, Any] | None]:
    """(pins to save, history entry), or (None, None) when the file must not change;
    ``extra``: more history fields."""
    outcome = outcome_of(result)
    if outcome == "failed":
        return None, None
    old = plan.pins
    top = {**old.stacks, **plan.new_stacks} if outcome == "promoted" else dict(old.stacks)
    known = {h.name for h in plan.hosts}
    hosts: dict[str, dict[str, StackPins]] = {
        name: dict(stacks) for name, stacks in old.hosts.items() if name not in known
    }
    for h in plan.hosts:
        o = result.outcomes.get(h.name)
        runs = plan.new_for(h.name) if o is not None and o.runs_new else plan.old_for(h.name)
        differs = {s: p for s, p in runs.items() if top.get(s) != p}
        if differs:
            hosts[h.name] = differs
    entry: dict[str, Any] = {
        "at": when,
        "by": by,
        "action": "bump",
        "outcome": outcome,
        "old": {s: stack_summary(old.stacks[s]) for s in plan.new_stacks},
        "new": {s: stack_summary(p) for s, p in plan.new_stacks.items()},
        "hosts": {name: o.summary() for name, o in result.outcomes.items()},
    }
    if extra:
        entry.update(extra)
    return replace(old, stacks=top, hosts=hosts), entry
