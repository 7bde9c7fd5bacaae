"""Status rows for people (a table, one line per host, drift as notes) and for pipes (JSON).

    render_table(rows, "rigfleet status").print(Console())
    print(render_json(rows))
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from rich.text import Text

from rigfleet.balancer.status import BalancerRow
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


def render_json(rows: Sequence[StatusRow], balancers: Sequence[BalancerRow] = ()) -> str:
    """``--json``: ``{"hosts": [row, ...], "balancers": [row, ...], "ok": bool}`` with full
    digests and commits; a balancer row per stack it balances."""
    return json.dumps(
        {"hosts": [{**asdict(r), "ok": r.ok} for r in rows],
         "balancers": [{**asdict(b), "ok": b.ok} for b in balancers],
         "ok": all(r.ok for r in rows) and all(b.ok for b in balancers)},
        indent=2,
    )


def render_balancers(rows: Sequence[BalancerRow], title: str = "balancers") -> Table:
    """One line per balancer and stack: its URL, how many of the stack's hosts are in
    rotation and which; hosts out of rotation (and why) and errors follow as notes."""
    table = Table(title, ["balancer", "stack", "up", "in rotation", "url"],
                  keys=("balancer", "stack"))
    for r in rows:
        key = f"{r.balancer} {r.stack or ''}".strip()
        if r.error:
            table.note(key, Text(r.error, style="red"))
        for host, why in r.out:
            table.note(key, Text(f"{host} out of rotation: {why}", style="yellow"))
        total = len(r.up) + len(r.out)
        up = (Text("-") if not r.reachable or r.error
              else Text(f"{len(r.up)}/{total}", style="green" if r.up else "red"))
        table.row(r.balancer, r.stack or "-", up, " ".join(r.up) or "-", r.url)
    return table


def render_table(rows: Sequence[StatusRow], title: str = "rigfleet status") -> Table:
    """One line per host: stack (or why it cannot be read), pins (image digest / Genesis /
    model revision, short), last gate, how much drift; the drift lines and errors follow as
    notes."""
    table = Table(title, ["host", "stack", "image/genesis/model", "gate", "drift"],
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
        table.row(r.host, stack, pins if r.reachable else "-", gate, drift)
    return table
