"""The host's ledger: ``state.json`` (what serves now) and ``ledger.jsonl`` (every change).

``ledger.jsonl`` is append-only, one JSON object per line; ``state.json`` is rewritten
atomically and keeps keys it does not know (``rigfleet status`` and ``roles/ledger.py`` read
and write it too). Every activation, swap, rollback, adoption and boot-time recreation is a
line, and so is every recreation, failed recreation and give-up of the supervisor
(``rigfleet.hostside.supervise``). A line's top-level stack keys always describe what serves
*after* the event (so the last line agrees with ``state.json``, as
``tests/hosts/test_ledger_state.py`` checks); the stack a transaction tried is under
``attempted``, the one before under ``previous``::

    {"time": "2026-11-29T10:17:02+00:00", "event": "swap", "result": "rolled-back",
     "host": "host1", "by": "alice@laptop", "deploy_id": "...", "stack": "int8",
     "image": "...", "digest": "sha256:...", "genesis_commit": null, "model_revision": "...",
     "config_hash": "...", "attempted": {"stack": "tq3-mtp-genesis", ...},
     "gate": {"result": "fail", "failed_checks": ["needles"], "report": "...", ...},
     "reason": "gate failed 1 check(s): needles (...)"}

Example::

    append(lay, entry("swap", "promoted", plan.desired, by=plan.by, deploy_id=plan.id,
                      gate=gate.record(), previous=old))
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .atomic import append_line, move_aside, write_atomic
from .layout import Layout
from .plan import StackRef
from .records import TRACKED_KEYS, ledger_tail, read_json
from .records import read_state as _read_state_file


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` so a reader (or a crash) sees the old file or the new one, never half
    (``rigfleet.hostside.atomic.write_atomic``: temp file, fsync, rename, fsync the dir)."""
    write_atomic(path, text, mode)


def read_state(lay: Layout) -> dict[str, Any]:
    """``state.json`` as a dict ({} when missing or unreadable)."""
    return _read_state_file(lay.state_file)


def write_state(lay: Layout, state: dict[str, Any]) -> None:
    atomic_write(lay.state_file, json.dumps(state, indent=2, sort_keys=True) + "\n")


def rebuilt_state(lay: Layout) -> dict[str, Any]:
    """What ``state.json`` says, rebuilt from the ledger when the file is damaged: its last
    line's stack keys are what serves (the ledger's rule), its gate the active stack's."""
    lines = tail(lay, 1)
    if not lines:
        return {}
    last = lines[-1]
    keep = (*TRACKED_KEYS, "config_hash")
    rebuilt: dict[str, Any] = {k: last.get(k) for k in keep}
    if last.get("stack"):
        rebuilt["gate"] = last.get("gate")
    rebuilt.update(since=last.get("time"), by=last.get("by"), deploy_id=last.get("deploy_id"),
                   rebuilt_from=f"{lay.ledger_file} (state.json was damaged)")
    return rebuilt


def update_state(lay: Layout, **changes: Any) -> dict[str, Any]:
    """Merge ``changes`` into ``state.json`` (other keys kept); returns the new state. A
    damaged ``state.json`` (empty, truncated, not an object) is kept aside and rebuilt from
    the ledger first (``rebuilt_state``), so no key is lost silently."""
    data, err = read_json(lay.state_file)
    if err == "missing":
        base: dict[str, Any] = {}
    elif isinstance(data, dict):
        base = data
    else:
        move_aside(lay.state_file)
        base = rebuilt_state(lay)
    state = {**base, **changes}
    write_state(lay, state)
    return state


def stack_fields(ref: StackRef | None) -> dict[str, Any]:
    """The tracked keys of a stack (``stack`` + its pins) and its config hash."""
    if ref is None:
        return {k: None for k in (*TRACKED_KEYS, "config_hash")}
    return {**{k: ref.record.get(k) for k in TRACKED_KEYS}, "stack": ref.stack,
            "config_hash": ref.config_hash}


def entry(event: str, result: str, serving: StackRef | None, *,
          attempted: StackRef | None = None, host: str = "", by: str = "",
          deploy_id: str = "", gate: dict[str, Any] | None = None,
          previous: StackRef | None = None, reason: str = "",
          extra: dict[str, Any] | None = None, active: bool = False) -> dict[str, Any]:
    """One ledger line (see the module docstring).

    + event: ``activate``, ``swap``, ``update`` (same stack, new pins), ``adopt``, ``ensure``
      (boot-time recreation), ``supervise`` (the supervisor, after the engine died),
      ``interrupted``
    + result: ``promoted``, ``rolled-back``, ``failed``, ``recreated``, ``gave-up``, ...
    + serving: what serves after the event (None: nothing verified serves)
    + attempted: the stack a transaction tried (a rolled-back or failed one)
    + gate: ``GateResult.record()``; previous: what served before
    + active: this event wrote ``active.json`` (a promotion, an adoption, pins recorded): the
      line carries the whole record as ``ref``, so a damaged ``active.json`` is rebuilt from
      the ledger (``rigfleet.hostside.active.recover_active``)
    """
    line: dict[str, Any] = {"time": now_iso(), "event": event, "result": result, "host": host,
                            "by": by, "deploy_id": deploy_id, **stack_fields(serving)}
    line["gate"] = gate or {"result": "not-run"}
    if attempted is not None:
        line["attempted"] = stack_fields(attempted)
    if previous is not None:
        line["previous"] = stack_fields(previous)
    if reason:
        line["reason"] = reason
    if extra:
        line.update(extra)
    if active and serving is not None:
        line["ref"] = serving.to_dict()
    return line


def append(lay: Layout, line: dict[str, Any]) -> None:
    """Append one line (O_APPEND, fsync): concurrent writers never interleave a line."""
    append_line(lay.ledger_file, json.dumps(line, sort_keys=True))


def tail(lay: Layout, n: int = 10) -> list[dict[str, Any]]:
    """The last ``n`` parseable lines, oldest first."""
    return ledger_tail(lay.ledger_file, n)[0]
