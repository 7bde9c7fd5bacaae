"""The one validator mechanism (rigfleet/validate.py): control characters, system directories,
paths that escape, strict YAML."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rigfleet.validate import (
    Problems,
    ValidationError,
    YamlError,
    escapes,
    has_control,
    is_system_dir,
    load_yaml,
    parse_yaml,
)

# (value, where the problem is, as the message names it)
CONTROL_CASES: list[tuple[Any, str]] = [
    ("http://mirror.lan:5000\r\nX-Evil: 1", "k"),
    ({"cuda": {"url": "https://x/\n", "suite": "/"}}, "k.cuda.url"),
    ({"int8": {"FOO": "1\x1b[2J"}}, "k.int8.FOO"),
    (["ok", "bad\x00"], "k[1]"),
    ({"a": [{"b": "c\x7f"}]}, "k.a[0].b"),
    ("next line\x85here", "k"),  # C1 NEL: a line break to some parsers
]


@pytest.mark.parametrize(("value", "where"), CONTROL_CASES,
                         ids=[w + f"-{i}" for i, (_, w) in enumerate(CONTROL_CASES)])
def test_control_characters_are_found_anywhere_and_named(value: Any, where: str) -> None:
    p = Problems("rig-a")
    assert p.control_chars("k", value)
    [line] = p.lines
    assert line.startswith(f"rig-a: {where}: ")
    assert "holds control characters; allowed: printable text" in line
    # The message itself carries no control character (values are shown escaped).
    assert not has_control(line)


def test_a_control_character_in_a_key_name_is_named() -> None:
    p = Problems("rig-a")
    assert p.control_chars("extra_env", {"int8\n": {"A": "1"}})
    assert p.lines == ["rig-a: extra_env: 'int8\\n' is a key holding control characters; "
                       "allowed: printable text (no line breaks, escapes or other control "
                       "characters)"]
    assert not has_control(p.lines[0])


def test_tabs_numbers_and_clean_text_pass() -> None:
    p = Problems("rig-a")
    assert not p.control_chars("k", {"a": "tab\tok", "n": 3, "l": [1.5, True, None, "x"]})
    assert p.lines == []


def test_string_refuses_c1_controls_too() -> None:
    p = Problems("pins.yaml")
    assert p.string("model.repo", "a/b\x9b", None, "a repo") is None
    assert p.lines == ["pins.yaml: model.repo: 'a/b\\x9b' holds control characters; "
                       "allowed: a repo"]


@pytest.mark.parametrize("path", ["/etc", "/etc/", "/var/lib/docker", "/usr/local/lib/rigfleet",
                                  "/var/lib/rigfleet/"])
def test_system_directories(path: str) -> None:
    assert is_system_dir(path)


@pytest.mark.parametrize("path", ["/srv/models", "/etc/rigfleet-extra", "/data"])
def test_not_system_directories(path: str) -> None:
    assert not is_system_dir(path)


def test_posix_path_refuses_system_dirs_and_unnormalised_paths() -> None:
    p = Problems("rig-a")
    assert p.posix_path("model_dir", "/var/lib") is None
    assert p.posix_path("model_dir", "/srv/../etc") is None
    assert p.posix_path("model_dir", "/srv/models") == "/srv/models"
    assert "is a system directory" in p.lines[0]
    assert "'/srv/../etc' is not an absolute, normalised path" in p.lines[1]


def test_entries_that_escape_their_directory(tmp_path: Path) -> None:
    root = tmp_path / "stacks"
    root.mkdir()
    (root / "mine.yaml").write_text("x: 1\n")
    (root / "inner").mkdir()
    (root / "alias.yaml").symlink_to(root / "mine.yaml")
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text("x: 1\n")
    (root / "evil.yaml").symlink_to(outside)
    (root / "dangling.yaml").symlink_to(tmp_path / "gone.yaml")
    (root / "up.yaml").symlink_to(Path("..") / "elsewhere.yaml")
    assert not escapes(root / "mine.yaml", root)
    assert not escapes(root / "alias.yaml", root)
    assert escapes(root / "evil.yaml", root)
    assert escapes(root / "up.yaml", root)
    assert escapes(root / "dangling.yaml", root)  # cannot tell where it leads: refused


# --- strict YAML ------------------------------------------------------------------------------


def test_a_duplicate_key_names_the_file_the_key_and_both_lines(tmp_path: Path) -> None:
    f = tmp_path / "pins.yaml"
    f.write_text("schema: rigfleet-pins/1\nserial: 1\nserial: 2\n")
    with pytest.raises(YamlError) as err:
        load_yaml(f, "the pins file")
    msg = str(err.value)
    assert msg.startswith(f"{f}: line 3: not valid YAML: found duplicate key 'serial' "
                          "(first at line 2)")


def test_a_nested_duplicate_key_is_found(tmp_path: Path) -> None:
    with pytest.raises(YamlError, match=r"x\.yaml: line 4: .*duplicate key 'digest'"):
        parse_yaml("stacks:\n  int8:\n    digest: a\n    digest: b\n", "x.yaml")



def test_a_key_given_beside_a_merge_overrides_it_as_yaml_says() -> None:
    # The merged keys were counted as the mapping's own: '<<: *int8' then 'digest: b' was
    # refused as "duplicate key 'digest' (first at line 3); a YAML mapping keeps only the
    # last value", though YAML lets the key beside the merge win
    text = ("stacks:\n  int8: &int8\n    digest: a\n    image: i\n  turbo:\n    <<: *int8\n"
            "    digest: b\n")
    assert parse_yaml(text, "x.yaml") == {"stacks": {"int8": {"digest": "a", "image": "i"},
                                                     "turbo": {"digest": "b", "image": "i"}}}
    with pytest.raises(YamlError, match=r"x\.yaml: line 8: .*duplicate key 'digest' \(first "
                                        r"at line 7\)"):
        parse_yaml(text + "    digest: c\n", "x.yaml")

def test_a_non_utf8_file_names_the_line_and_byte(tmp_path: Path) -> None:
    f = tmp_path / "int8.yaml"
    f.write_bytes("name: int8\nsummary: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(YamlError) as err:
        load_yaml(f, "a stack file")
    assert str(err.value) == (f"{f}: line 2: byte 0xe9 is not UTF-8; allowed: a UTF-8 text "
                              "file (re-save it as UTF-8)")


def test_a_missing_file_says_what_it_is_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(YamlError, match=r"nope\.yaml: no such file \(the pins file\); "
                                        r"create it"):
        load_yaml(tmp_path / "nope.yaml", "the pins file", "create it")


def test_validation_error_keeps_one_line_per_problem() -> None:
    err = ValidationError(["a: x: bad; allowed: y", "a: z: bad; allowed: w"])
    assert err.problems == ["a: x: bad; allowed: y", "a: z: bad; allowed: w"]
    assert re.fullmatch(r"a: x: .*\na: z: .*", str(err))
