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
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .layout import Layout
from .plan import StackRef
from .records import TRACKED_KEYS, ledger_tail
from .records import read_state as _read_state_file


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` so a reader (or a crash) sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(lay: Layout) -> dict[str, Any]:
    """``state.json`` as a dict ({} when missing or unreadable)."""
    return _read_state_file(lay.state_file)


def write_state(lay: Layout, state: dict[str, Any]) -> None:
    atomic_write(lay.state_file, json.dumps(state, indent=2, sort_keys=True) + "\n")


def update_state(lay: Layout, **changes: Any) -> dict[str, Any]:
    """Merge ``changes`` into ``state.json`` (other keys kept); returns the new state."""
    state = {**read_state(lay), **changes}
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
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ledger line (see the module docstring).

    + event: ``activate``, ``swap``, ``update`` (same stack, new pins), ``adopt``, ``ensure``
      (boot-time recreation), ``supervise`` (the supervisor, after the engine died),
      ``interrupted``
    + result: ``promoted``, ``rolled-back``, ``failed``, ``recreated``, ``gave-up``, ...
    + serving: what serves after the event (None: nothing verified serves)
    + attempted: the stack a transaction tried (a rolled-back or failed one)
    + gate: ``GateResult.record()``; previous: what served before
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
    return line


def append(lay: Layout, line: dict[str, Any]) -> None:
    """Append one line (O_APPEND, fsync): concurrent writers never interleave a line."""
    lay.ledger_file.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    fd = os.open(lay.ledger_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def tail(lay: Layout, n: int = 10) -> list[dict[str, Any]]:
    """The last ``n`` parseable lines, oldest first."""
    return ledger_tail(lay.ledger_file, n)[0]
