"""A table of file keys (``rigfleet.pin_keys``, ``rigfleet.catalog_keys``), each described once:
validators take each section's keys, ``allowed:`` texts and defaults from it, docs a section::

    TABLE = KeyTable(KEYS, BEGIN, END)
    TABLE.keys_of("driver"), TABLE.allowed("driver.branch"), TABLE.reference()
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Key:
    """One key: ``path`` is dotted (``<name>`` marks named entries, ``[]`` a list's items);
    ``allowed`` is the text its messages end with, ``default`` as people write it."""

    path: str
    type: str
    doc: str
    allowed: str = ""
    default: str = ""
    required: bool = False

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]


def replace_section(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with ``begin`` ... ``end`` (markers included) replaced by ``body``."""
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"no generated section ({begin} ... {end})")
    return head + body + tail


class KeyTable:
    """The keys of one file format; ``escape_tags``: show ``<name>`` in the docs' cells."""

    def __init__(self, keys: Sequence[Key], begin: str, end: str, *,
                 escape_tags: bool = False) -> None:
        self.keys = tuple(keys)
        self.by_path = {k.path: k for k in self.keys}
        self.begin, self.end, self.escape_tags = begin, end, escape_tags
        self.sections = {p for k in self.keys for p in (k.path, k.parent)}
        named = sorted((p for p in self.sections if "<" in p), key=lambda p: -p.count("."))
        self._named = [(re.compile(re.sub(r"<[^>]+>", ".*", re.escape(p))), p) for p in named]

    def section(self, key: str) -> str:
        """The table path of a key as a message names it: ``boot.expect[2]`` ->
        ``boot.expect[]``, ``genesis.switches.v7.on`` -> ``genesis.switches.<gen>.on``."""
        if (path := re.sub(r"\[\d+\]", "[]", key)) in self.sections:
            return path
        return next((p for pattern, p in self._named if pattern.fullmatch(path)), path)

    def allowed(self, path: str) -> str:
        return self.by_path[path].allowed

    def default(self, path: str) -> str:
        return self.by_path[path].default

    def keys_of(self, section: str) -> tuple[str, ...]:
        """The keys section ``section`` (``""``: the top level) allows, in table order."""
        return tuple(k.name for k in self.keys if k.parent == section)

    def _cell(self, text: str) -> str:
        text = text.replace("|", "\\|")
        return text.replace("<", "&lt;").replace(">", "&gt;") if self.escape_tags else text

    def reference(self) -> str:
        lines = [self.begin, "", "| key | type | default | allowed | meaning |",
                 "|---|---|---|---|---|"]
        for k in self.keys:
            default = "required" if k.required else (f"`{k.default}`" if k.default else "-")
            cells = (f"`{k.path}`", k.type, default, self._cell(k.allowed) or "-",
                     self._cell(k.doc))
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join([*lines, "", self.end])

    def render_into(self, text: str) -> str:
        return replace_section(text, self.begin, self.end, self.reference())


def write_docs(argv: Sequence[str], usage: str, render_into: Callable[[str], str]) -> int:
    """``python -m <module> docs/<page>.md``: rewrite the page's generated sections."""
    if len(argv) != 2:
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    path = Path(argv[1])
    path.write_text(render_into(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0
