"""Status rows for people (a table, one line per host, drift as notes) and for pipes (JSON).

    render_table(rows, "rigfleet status").print(Console())
    print(render_json(rows))
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

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
    """``--json``: ``{"hosts": [row, ...], "ok": bool}`` with full digests and commits."""
    return json.dumps(
        {"hosts": [{**asdict(r), "ok": r.ok} for r in rows], "ok": all(r.ok for r in rows)},
        indent=2,
    )


def tok_s(throughput: dict | None) -> Text:
    """``89/119`` (narrative/code decode tok/s of the last gate), red when its throughput
    check failed; ``-`` without a record."""
    if not throughput:
        return Text("-")

    def one(v: object) -> str:
        return f"{v:.0f}" if isinstance(v, int | float) else "-"

    text = f"{one(throughput.get('narrative'))}/{one(throughput.get('code'))}"
    return Text(text, style="red" if throughput.get("result") == "fail" else "")


def render_table(rows: Sequence[StatusRow], title: str = "rigfleet status") -> Table:
    """One line per host: stack (or why it cannot be read), pins (image digest / Genesis /
    model revision, short), last gate, the last gate's decode tok/s (narrative/code), how
    much drift; the drift lines and errors follow as notes."""
    table = Table(title, ["host", "stack", "image/genesis/model", "gate", "tok/s", "drift"],
                  keys=("host", "stack"))
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
        table.row(r.host, stack, pins if r.reachable else "-", gate, tok_s(r.throughput), drift)
    return table
