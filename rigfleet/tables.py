"""Tables for people, JSON for pipes: one way every ``rigfleet`` command prints rows.

A table has one line per row, whatever the terminal's width: cells never wrap (a cell too
long for its column ends in an ellipsis), and what does not fit in a cell (drift lines,
reasons) is printed under the table as notes, wrapped between words. Every command that
prints a table also takes ``--json``::

    t = Table("rigfleet status", ["host", "up", "stack"])
    t.row("rig-a", Text("yes", style="green"), "int8")
    t.note("rig-a", "card 0 power limit 200 W, inventory 290 W")
    t.print(Console())
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

# Cells this short are never cut (``yes``, ``none``, counts); longer ones may end in "…".
SHORT = 5


@dataclass
class Table:
    """Rows (one line each) and notes (printed under them).

    + title: printed above; columns: their headers
    + keys: columns whose cells are never cut (the host's name: a row must say whose it is)
    """

    title: str
    columns: Sequence[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    notes: list[tuple[str, Text | str]] = field(default_factory=list)
    keys: Sequence[str] = ("host",)

    def row(self, *cells: Any) -> None:
        self.rows.append(tuple(cells))

    def note(self, key: str, text: Text | str) -> None:
        self.notes.append((key, text))

    def render(self) -> RichTable:
        table = RichTable(title=self.title, title_justify="left", box=box.SIMPLE_HEAD,
                          show_edge=False, padding=(0, 1, 0, 0))
        rows = [[c if isinstance(c, Text) else Text(str(c)) for c in cells] for cells in self.rows]
        for i, name in enumerate(self.columns):
            longest = max([len(name), *(len(r[i]) for r in rows if i < len(r))])
            keep = name in self.keys or longest <= SHORT
            table.add_column(name, no_wrap=True, overflow="ellipsis",
                             min_width=longest if keep else None)
        for cells in rows:
            table.add_row(*cells)
        return table

    def print(self, console: Console) -> None:
        console.print(self.render())
        for key, text in self.notes:
            line = Text(f"{key}: ")
            line.append(text if isinstance(text, Text) else Text(str(text)))
            console.print(line)  # wraps between words; folds only a word wider than a line
