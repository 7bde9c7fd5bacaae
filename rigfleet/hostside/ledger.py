"""The host's ledger: ``state.json`` (what serves now) and the append-only ``ledger.jsonl``
(every change; docs/swap.md, "Ledger and state")::

    append(lay, "swap", "promoted", plan.desired, by=plan.by, deploy_id=plan.id,
           gate=gate.record(), previous=old)
"""

from __future__ import annotations

import json
from typing import Any

from .atomic import append_line, move_aside, write_json
from .layout import Layout
from .plan import StackRef
from .records import TRACKED_KEYS, ledger_tail, now_iso, read_json


def rebuilt_state(lay: Layout) -> dict[str, Any]:
    """``state.json`` rebuilt from the ledger's last line (what serves after it)."""
    lines = ledger_tail(lay.ledger_file, 1)[0]
    if not lines:
        return {}
    last = lines[-1]
    rebuilt: dict[str, Any] = {k: last.get(k) for k in (*TRACKED_KEYS, "config_hash")}
    if last.get("stack"):
        rebuilt["gate"] = last.get("gate")
    rebuilt.update(since=last.get("time"), by=last.get("by"), deploy_id=last.get("deploy_id"),
                   rebuilt_from=f"{lay.ledger_file} (state.json was damaged)")
    return rebuilt


def update_state(lay: Layout, **changes: Any) -> dict[str, Any]:
    """Merge ``changes`` into ``state.json``; a damaged one: set aside, rebuilt from the ledger."""
    data, err = read_json(lay.state_file)
    if err != "missing" and not isinstance(data, dict):
        move_aside(lay.state_file)
        data = rebuilt_state(lay)
    state = {**(data or {}), **changes}
    write_json(lay.state_file, state)
    return state


def stack_fields(ref: StackRef | None) -> dict[str, Any]:
    """The tracked keys of a stack (``stack`` + its pins) and its config hash."""
    if ref is None:
        return {k: None for k in (*TRACKED_KEYS, "config_hash")}
    return {**{k: ref.record.get(k) for k in TRACKED_KEYS}, "stack": ref.stack,
            "config_hash": ref.config_hash}


def append(lay: Layout, event: str, result: str, serving: StackRef | None, *,
           attempted: StackRef | None = None, host: str = "", by: str = "",
           deploy_id: str = "", gate: dict[str, Any] | None = None,
           previous: StackRef | None = None, reason: str = "",
           extra: dict[str, Any] | None = None, active: bool = False) -> None:
    """Append one ledger line; ``serving``: what serves after the event (None: nothing
    verified). With ``active`` (the event wrote ``active.json``) it carries the whole record as
    ``ref``, from which a damaged ``active.json`` is rebuilt."""
    line: dict[str, Any] = {
        "time": now_iso(), "event": event, "result": result, "host": host, "by": by,
        "deploy_id": deploy_id, **stack_fields(serving), "gate": gate or {"result": "not-run"},
        **{key: stack_fields(ref) for key, ref in (("attempted", attempted),
                                                    ("previous", previous)) if ref is not None},
        **({"reason": reason} if reason else {}), **(extra or {}),
        **({"ref": serving.to_dict()} if active and serving is not None else {})}
    append_line(lay.ledger_file, json.dumps(line, sort_keys=True))
