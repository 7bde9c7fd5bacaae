"""The stack-file key table (rigfleet/catalog_keys.py): docs/stacks.md holds what it renders,
and every key a shipped stack file uses is described in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet.catalog import BUILTIN_DIR
from rigfleet.catalog_keys import BY_PATH, KEYS, keys_of
from rigfleet.stack_docs import render_into

DOC = Path(__file__).resolve().parents[2] / "docs" / "stacks.md"


def test_docs_stacks_md_holds_the_generated_reference() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text == render_into(text), (
        "docs/stacks.md differs from the key table: run "
        "`.venv/bin/python -m rigfleet.stack_docs docs/stacks.md`")
    for key in KEYS:
        assert f"| `{key.path}` |" in text


def _paths(node: Any, prefix: str) -> list[str]:
    """Table paths of a parsed stack file (named entries as ``<gen>``/``<id>``, list items
    ``[]``; ``env``, ``params`` and ``gate.set`` hold free names)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if prefix == "genesis.switches":
                name = "<gen>"
            elif prefix == "genesis.decisions":
                name = "<id>"
            else:
                name = str(k)
            path = f"{prefix}.{name}" if prefix else name
            out.append(path)
            if path not in ("env", "genesis.params", "gate.set"):
                out += _paths(v, path)
    elif isinstance(node, list) and prefix in ("boot.expect", "boot.failures", "caveats"):
        for item in node:
            out += _paths(item, f"{prefix}[]")
    return out


@pytest.mark.parametrize("path", sorted(BUILTIN_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_key_of_a_shipped_file_is_in_the_table(path: Path) -> None:
    used = set(_paths(yaml.safe_load(path.read_text()), ""))
    assert used - set(BY_PATH) == set()


def test_each_section_allows_exactly_the_table_keys() -> None:
    assert keys_of("")[:3] == ("schema", "name", "summary")
    assert set(keys_of("genesis")) == {"needs", "switches", "params", "runtime_packages",
                                       "model", "decisions"}
    assert keys_of("genesis.decisions.<id>") == ("decision", "reason")
