"""The pins key table (rigfleet/pin_keys.py): docs/pins.md holds what it renders, every key
of a shipped pins file is described in it, and the validator allows exactly its keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet.pin_keys import BY_PATH, KEYS, keys_of, render_into
from rigfleet.pins import PinsError, parse_pins

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pins.md"


def test_docs_pins_md_holds_the_generated_reference() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text == render_into(text), (
        "docs/pins.md differs from the key table: run "
        "`.venv/bin/python -m rigfleet.pin_keys docs/pins.md`")
    for key in KEYS:
        assert f"| `{key.path}` |" in text


def _paths(node: Any, prefix: str) -> list[str]:
    """Table paths of parsed pins data (stacks as ``<stack>``, hosts as ``<host>``; history
    entries are free)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            name = {"stacks": "<stack>", "hosts": "<host>"}.get(prefix.rpartition(".")[2], str(k))
            path = f"{prefix}.{name}" if prefix else name
            out.append(path.replace("hosts.<host>.stacks.<stack>", "stacks.<stack>"))
            if path != "history":
                out += _paths(v, path)
    return out


def test_every_key_of_the_shipped_pins_is_in_the_table() -> None:
    used = set(_paths(yaml.safe_load((ROOT / "pins.yaml").read_text()), ""))
    assert "stacks.<stack>.genesis.layout" in used
    assert used - set(BY_PATH) == set()


SECTIONS = {
    "": lambda d: d,
    "driver": lambda d: d["driver"],
    "container_toolkit": lambda d: d["container_toolkit"],
    "huggingface_hub": lambda d: d["huggingface_hub"],
    "model": lambda d: d["model"],
    "stacks.<stack>": lambda d: d["stacks"]["tq3-mtp-genesis"],
    "stacks.<stack>.genesis": lambda d: d["stacks"]["tq3-mtp-genesis"]["genesis"],
}


@pytest.mark.parametrize("section", list(SECTIONS))
def test_a_typo_in_each_section_names_the_tables_keys(section: str) -> None:
    data = yaml.safe_load((ROOT / "pins.yaml").read_text())
    first = keys_of(section)[0]
    SECTIONS[section](data)[first + "x"] = "1"
    with pytest.raises(PinsError) as e:
        parse_pins(data, "pins.yaml", allow_unresolved=True)
    assert f"is an unknown key (did you mean {first!r}?); allowed: {', '.join(keys_of(section))}" \
        in str(e.value)


def test_sections_and_defaults() -> None:
    assert keys_of("") == ("schema", "serial", "driver", "container_toolkit", "huggingface_hub",
                           "model", "models", "stacks", "hosts", "history")
    assert keys_of("stacks.<stack>") == ("image", "digest", "vllm_version", "image_id",
                                         "genesis")
    assert keys_of("hosts.<host>") == ("stacks",)
    assert BY_PATH["stacks.<stack>.genesis.layout"].default == "v7"
