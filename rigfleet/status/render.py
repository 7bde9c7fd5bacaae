"""Status rows for people (a table, one line per host, drift as notes) and for pipes (JSON).

    render_table(rows, "rigfleet status").print(Console())
    print(render_json(rows))
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from rich.text import Text

from rigfleet.status.rows import StatusRow
from rigfleet.tables import Table


def _hex(value: str | None, n: int = 8) -> str:
    """A digest or commit shortened for a table cell (``sha256:`` dropped)."""
    return value.removeprefix("sha256:")[:n] if value else "-"


def _when(iso: str | None) -> str:
    """``2026-11-29T16:45:02+00:00`` -> ``11-29 16:45`` for a table cell (UTC, as recorded;
    ``--json`` has the full time)."""
    if not iso:
        return ""
    return iso.replace("T", " ")[5:16] if len(iso) >= 16 and iso[10] == "T" else iso


def render_json(rows: Sequence[StatusRow]) -> str:
    """``--json``: ``{"hosts": [row, ...], "ok": bool, "bumps": [...]}`` with full digests and
    commits; ``bumps`` (``bump_summaries``) only while a bump is unfinished."""
    out: dict[str, Any] = {"hosts": [{**asdict(r), "ok": r.ok} for r in rows],
                           "ok": all(r.ok for r in rows)}
    bumps = bump_summaries(rows)
    if bumps:
        out["bumps"] = bumps
    return json.dumps(out, indent=2)


# The states of ``BumpJournal.host_view`` as a bump cell says them.
_BUMP_WORDS = {"candidate": "on candidate", "old": "old pins", "in flight": "in flight",
               "failed": "rolled back", "lost": "lost", "skipped": "skipped",
               "not attempted": "old pins", "up to date": "on candidate"}
_BUMP_STYLE = {"on candidate": "green", "old pins": "yellow", "in flight": "magenta",
               "rolled back": "red", "lost": "red", "skipped": "yellow"}


def bump_cell(view: Mapping[str, Any] | None) -> Text:
    """``on candidate 11-29 10:41``, ``old pins``, ``in flight 11-29 10:45 (runs candidate)``."""
    if not view:
        return Text("-")
    words = _BUMP_WORDS.get(str(view.get("state")), str(view.get("state")))
    text = f"{words} {_when(view.get('since'))}".strip()
    if view.get("runs"):
        text += f" (runs {view['runs']})"
    return Text(text, style=_BUMP_STYLE.get(words, ""))


def bump_summaries(rows: Sequence[StatusRow]) -> list[dict[str, Any]]:
    """One entry per unfinished bump the rows are in: its id, target, start, who, journal,
    and its hosts by where they stand (``candidate``, ``old``, ``in flight``, ...)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r.bump:
            continue
        entry = out.setdefault(str(r.bump["bump"]), {
            k: r.bump.get(k) for k in ("bump", "target", "started", "by", "journal")})
        entry.setdefault("hosts", {}).setdefault(str(r.bump.get("state")), []).append(r.host)
    return list(out.values())


def _bump_note(summary: Mapping[str, Any]) -> Text:
    hosts = summary.get("hosts") or {}
    parts = [f"{_BUMP_WORDS.get(state, state)}: {', '.join(names)}"
             for state, names in hosts.items()]
    return Text(f"{summary['bump']} ({summary['target']}), started {_when(summary['started'])} "
                f"by {summary['by']}: {'; '.join(parts)}. `rigfleet bump` finishes it, "
                f"`rigfleet bump --abandon` records it and stops (journal {summary['journal']})",
                style="magenta")


def render_table(rows: Sequence[StatusRow], title: str = "rigfleet status") -> Table:
    """One line per host: stack (or why it cannot be read), pins (image digest / Genesis /
    model revision, short), last gate, how much drift; the drift lines and errors follow as
    notes. While a ``rigfleet bump`` is unfinished the title says ``(mid-bump)``, a ``bump``
    column says where each host stands (on the candidate since when, on the old pins, in
    flight and what it runs) and a ``mid-bump`` note names the bump and what to do."""
    mid_bump = any(r.bump for r in rows)
    columns = ["host", "stack", "image/genesis/model", "gate", "drift"]
    table = Table(title + (" (mid-bump)" if mid_bump else ""),
                  [*columns, "bump"] if mid_bump else columns, keys=("host", "stack"))
    for summary in bump_summaries(rows):
        table.note("mid-bump", _bump_note(summary))
    for r in rows:
        if not r.reachable:
            stack, drift = Text("unreachable", style="red"), Text("-")
            table.note(r.host, Text(r.error or "unreachable", style="red"))
        else:
            stack = Text(r.stack or "-")
            if r.error:
                table.note(r.host, Text(r.error, style="red"))
            drift = (Text(str(len(r.drift)), style="yellow") if r.drift
                     else Text("none", style="green"))
            for line in r.drift:
                table.note(r.host, Text(line, style="yellow"))
        pins = "/".join((_hex(r.digest, 7), _hex(r.genesis, 7), _hex(r.model_revision, 7)))
        gate = "-" if r.gate is None else f"{r.gate} {_when(r.gate_time)}".strip()
        cells: list[Any] = [r.host, stack, pins if r.reachable else "-", gate, drift]
        if mid_bump:
            cells.append(bump_cell(r.bump))
        table.row(*cells)
    return table
