"""Tables for people: one way every ``rigfleet`` command prints rows. Key columns are printed
whole, others wrap; when even that does not fit, the right-most columns leave the table and
their cells follow it as notes, so no text is cut (``--json`` never cuts anything)::

    t = Table("rigfleet status", ["host", "up", "stack"])
    t.row("rig-a", Text("yes", style="green"), "int8")
    t.note("rig-a", "card 0 power limit 200 W, inventory 290 W")
    t.print(Console())
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

SHORT = 5  # cells this short are never wrapped
MIN_WRAP = 12  # a column that wraps is never narrower (unless its text is)
KEY_NAMES = ("host", "status", "result", "state", "verdict")


@dataclass
class Table:
    """Rows and notes (printed under them); ``keys``: columns printed whole."""

    title: str
    columns: Sequence[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    notes: list[tuple[str, Text | str]] = field(default_factory=list)
    keys: Sequence[str] = ("host",)

    def row(self, *cells: Any) -> None:
        self.rows.append(tuple(cells))

    def note(self, key: str, text: Text | str) -> None:
        self.notes.append((key, text))

    def _kept(self, i: int) -> bool:
        return self.columns[i] in self.keys or self.columns[i] in KEY_NAMES

    def _width(self, i: int, rows: list[list[Text]]) -> tuple[int, bool]:
        """Column ``i``'s least width, and whether it is printed whole (never wrapped)."""
        longest = max([len(self.columns[i]), *(r[i].cell_len for r in rows if i < len(r))])
        whole = self._kept(i) or longest <= SHORT
        return (longest if whole else min(longest, MIN_WRAP)), whole

    def print(self, console: Console) -> None:
        rows = [[c if isinstance(c, Text) else Text(str(c)) for c in cells]
                for cells in self.rows]
        widths = [self._width(i, rows) for i in range(len(self.columns))]
        shown = list(range(len(self.columns)))  # the others move to notes
        movable = [i for i in shown if not self._kept(i)]
        # each column: its text, one space of padding and one of the box's divider
        while movable and sum(widths[i][0] + 2 for i in shown) - 1 > console.width:
            shown.remove(movable.pop())
        table = RichTable(title=self.title, title_justify="left", box=box.SIMPLE_HEAD,
                          show_edge=False, padding=(0, 1, 0, 0))
        for i in shown:
            width, whole = widths[i]
            table.add_column(self.columns[i], no_wrap=whole, min_width=width,
                             overflow="ellipsis" if whole else "fold")
        for cells in rows:
            table.add_row(*[cells[i] if i < len(cells) else Text("") for i in shown])
        console.print(table)
        key = next((i for i in shown if self._kept(i)), 0)
        for cells in rows:
            for i in range(len(self.columns)):
                if i not in shown and i < len(cells) and cells[i].plain.strip() not in ("", "-"):
                    head = cells[key].plain if key < len(cells) else ""
                    console.print(Text.assemble(f"{head}: {self.columns[i]}: ", cells[i]))
        for name, text in self.notes:
            # wraps between words; folds only a word wider than a line
            console.print(Text.assemble(f"{name}: ", text))


def ratio(value: float | None, against: float | None, green_from: float = 0.95) -> Text:
    """``value / against`` as a percentage cell: red under 85%, green from ``green_from``."""
    if value is None or not against:
        return Text("-")
    r = value / against
    return Text(f"{r:.0%}", style="red" if r < 0.85 else "green" if r >= green_from else "yellow")


def show(as_json: bool, data: Any, *tables: Table) -> None:
    """``--json``: ``data`` as JSON on stdout; otherwise the tables, for people."""
    if as_json:
        print(json.dumps(data, indent=2, default=str))
        return
    console = Console()
    for table in tables:
        table.print(console)
