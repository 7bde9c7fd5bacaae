"""pins.yaml: validation messages, the unresolved -> lock flow, atomic save."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet.pins import (
    UNRESOLVED,
    PinsError,
    dump_pins,
    load_pins,
    parse_pins,
    save_pins,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SHA_01D = "01d4d1ad375dc5854779c593eee093bcebb0cada"
GENESIS_COMMIT = "7b9fd3194ee6efa1644973383cd44ee5604a5d85"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
REVISION = "0123456789abcdef0123456789abcdef01234567"


def good() -> dict[str, Any]:
    return {
        "schema": "rigfleet-pins/1",
        "serial": 3,
        "driver": {"branch": "580", "version": "580.105.08"},
        "container_toolkit": {"version": "1.17.8-1"},
        "huggingface_hub": {"version": "2.4.0"},
        "model": {
            "repo": "Lorbus/Qwen3.6-27B-int4-AutoRound",
            "revision": REVISION,
            "local_dir": "qwen3.6-27b-autoround-int4",
        },
        "stacks": {
            "int8": {
                "image": f"vllm/vllm-openai:nightly-{SHA_01D}",
                "digest": DIGEST_A,
                "vllm_version": "0.20.2rc1.dev9+g01d4d1ad3",
            },
            "tq3-mtp-genesis": {
                "image": f"vllm/vllm-openai:nightly-{SHA_01D}",
                "digest": DIGEST_B,
                "vllm_version": "0.20.2rc1.dev9+g01d4d1ad3",
                "genesis": {
                    "repo": "https://github.com/Sandermage/genesis-vllm-patches.git",
                    "commit": GENESIS_COMMIT,
                },
            },
        },
        "history": [],
    }


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "pins.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_good_file_loads(tmp_path: Path) -> None:
    pins = load_pins(write(tmp_path, good()))
    assert pins.serial == 3
    assert pins.driver_branch == "580" and pins.driver_version == "580.105.08"
    assert pins.toolkit_version == "1.17.8-1" and pins.hf_hub_version == "2.4.0"
    assert pins.model.local_dir == "qwen3.6-27b-autoround-int4"
    assert set(pins.stacks) == {"int8", "tq3-mtp-genesis"}
    tq3 = pins.stacks["tq3-mtp-genesis"]
    assert tq3.genesis is not None and tq3.genesis.commit == GENESIS_COMMIT
    assert pins.stacks["int8"].genesis is None
    assert tq3.image_ref == f"vllm/vllm-openai:nightly-{SHA_01D}@{DIGEST_B}"
    assert (tq3.repository, tq3.tag) == ("vllm/vllm-openai", f"nightly-{SHA_01D}")
    assert pins.unresolved() == []


def test_accepted_variants() -> None:
    data = good()
    data["driver"] = {"branch": 580}  # unquoted YAML int means the same branch
    data["stacks"]["int8"]["image"] = "vllm/vllm-openai:v0.27.1"
    data["stacks"]["int8"]["vllm_version"] = "0.27.1"
    data["stacks"]["tq3-mtp-genesis"]["image"] = (
        f"registry.lan:5000/vllm/vllm-openai:nightly-{SHA_01D}"
    )
    data["stacks"]["tq3-mtp-genesis"]["genesis"]["repo"] = (
        "http://git.rigfleet.test:8090/genesis-vllm-patches.git"
    )
    data.pop("history")
    pins = parse_pins(data)
    assert pins.driver_branch == "580" and pins.driver_version is None
    assert pins.history == []
    assert pins.stacks["tq3-mtp-genesis"].repository == "registry.lan:5000/vllm/vllm-openai"


def test_repository_pins_file_is_valid_but_needs_lock() -> None:
    # The shipped pins.yaml carries no invented digest/revision: lock must fill them in.
    path = REPO_ROOT / "pins.yaml"
    with pytest.raises(PinsError) as err:
        load_pins(path)
    msg = str(err.value)
    assert "stacks.int8.digest" in msg and "stacks.tq3-mtp-genesis.digest" in msg
    assert "model.revision" in msg and "rigfleet pins lock" in msg
    pins = load_pins(path, allow_unresolved=True)
    # Images a real host can pull today: release tags stay on Docker Hub, nightly tags are
    # purged after about two weeks (upstream-2026.md §4.1).
    int8, tq3 = pins.stacks["int8"], pins.stacks["tq3-mtp-genesis"]
    assert (int8.image, int8.vllm_version) == ("vllm/vllm-openai:v0.27.1", "0.27.1")
    assert (tq3.image, tq3.vllm_version) == ("vllm/vllm-openai:v0.21.0", "0.21.0")
    # Genesis v12.1.0 (sndr layout), whose allowlist names 0.21.0.
    assert tq3.genesis is not None and tq3.genesis.layout == "v12"
    assert tq3.genesis.commit == "66e37841a18f35a113ce10f831808faa4c858ced"
    assert tq3.genesis.repo == "https://github.com/Sandermage/sndr_core_engine.git"
    # 595: in NVIDIA's repository of every distribution (debian13 has no 580; docs/converge.md).
    assert pins.driver_branch == "595" and pins.toolkit_version == "1.17.8-1"
    assert sorted(pins.unresolved()) == sorted(
        ["model.revision", *(f"stacks.{s}.digest" for s in (
            "int8", "tq3-mtp-genesis", "tq3-nomtp", "turbo", "single-fp8-mtp"))]
    )
    # Every stack the catalog ships is pinned, on an image its stack file allows.
    from rigfleet.catalog import builtin_catalog

    catalog = builtin_catalog()
    assert set(pins.stacks) == set(catalog.names)
    for name, stack in pins.stacks.items():
        assert catalog.get(name).image.problems(stack.tag, stack.vllm_version) == [], name


def _set(data: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value


_DELETE = object()
TQ3 = "stacks.tq3-mtp-genesis"

# (key to change, new value, strings the message must contain: key path, value, allowed)
BAD_PINS = [
    ("schema", "rigfleet-pins/2", ["schema", "'rigfleet-pins/2'", "'rigfleet-pins/1'"]),
    ("serial", 0, ["serial", "0", "integer >= 1"]),
    ("serial", True, ["serial", "True", "integer >= 1"]),
    ("models", {"": {"revision": "0" * 40}},  # an empty name: this was a KeyError traceback
     ["models.: '' is not valid; allowed: a hub repo id '<owner>/<name>'"]),
    (f"{TQ3}.genesis.layout", ["v7"],  # a list is unhashable: this was a TypeError traceback
     [f"{TQ3}.genesis.layout: ['v7'] is not a Genesis layout rigfleet knows; allowed: v7"]),
    ("serial", 10**400, ["serial: 1000000000", "is not valid", "integer >= 1"]),  # no traceback
    (f"{TQ3}.digest", "sha256:abc", [f"{TQ3}.digest", "'sha256:abc'", "64 lowercase hex"]),
    (f"{TQ3}.digest", "A" * 64, [f"{TQ3}.digest", "'" + "A" * 64 + "'", "'sha256:'"]),
    (
        "model.revision",
        "7b9fd319",
        ["model.revision", "'7b9fd319'", "short hash (8 characters)", "full 40-character"],
    ),
    (
        f"{TQ3}.genesis.commit",
        "7b9fd3194",
        [f"{TQ3}.genesis.commit", "'7b9fd3194'", "short hash", "full 40-character"],
    ),
    (
        f"{TQ3}.genesis.commit",
        UNRESOLVED,
        [f"{TQ3}.genesis.commit", "'unresolved'", "full 40-character"],
    ),
    (
        "stacks.int8.image",
        "vllm/vllm-openai:latest",
        ["stacks.int8.image", "'vllm/vllm-openai:latest'", "moving tag 'latest'", "nightly-<40"],
    ),
    (
        "stacks.int8.image",
        "vllm/vllm-openai:nightly",
        ["stacks.int8.image", "'vllm/vllm-openai:nightly'", "moving tag 'nightly'"],
    ),
    ("stacks.int8.image", "vllm/vllm-openai:cu130-nightly", ["moving tag 'cu130-nightly'"]),
    ("stacks.int8.image", "vllm/vllm-openai", ["'vllm/vllm-openai'", "'<repository>:<tag>'"]),
    (
        "stacks.int8.image",
        f"vllm/vllm-openai@{DIGEST_A}",
        ["stacks.int8.image", "the digest goes in 'digest'"],
    ),
    (
        "stacks.int8.vllm_version",
        "0.20.2rc1.dev129+g1acd67a79",
        [
            "stacks.int8.vllm_version",
            "'0.20.2rc1.dev129+g1acd67a79'",
            "copy-paste",
            "'+g01d4d1ad3'",
        ],
    ),
    (
        "stacks.int8.vllm_version",
        "0.20.2rc1.dev9",
        ["stacks.int8.vllm_version", "'0.20.2rc1.dev9'", "no '+g<commit>' part", "+g01d4d1ad3"],
    ),
    ("stacks.int8.vllm_version", "v0.20", ["stacks.int8.vllm_version", "'v0.20'", "vllm.__ver"]),
    ("driver.branch", "r580", ["driver.branch", "'r580'", "branch digits, e.g. '580'"]),
    ("driver.version", "590.44.01", ["driver.version", "'590.44.01'", "not on branch 580"]),
    (
        "container_toolkit.version",
        "1.17.8",
        ["container_toolkit.version", "'1.17.8'", "'1.17.8-1'"],
    ),
    ("huggingface_hub.version", "latest", ["huggingface_hub.version", "'latest'", "PEP 440"]),
    ("model.repo", "Qwen3.6-27B", ["model.repo", "'Qwen3.6-27B'", "'<owner>/<name>'"]),
    ("model.local_dir", "../models", ["model.local_dir", "'../models'", "one directory name"]),
    (
        "stacks.fp8",
        {"image": "x:y", "digest": DIGEST_A, "vllm_version": "0.1"},
        ["stacks.fp8", "'fp8'", "not a stack in the catalog",
         "int8, single-fp8-mtp, tq3-mtp-genesis, tq3-nomtp, turbo"],
    ),
    ("stacks", {}, ["stacks: {}", "one entry per stack the fleet serves", "int8"]),
    (f"{TQ3}.genesis", _DELETE, [f"{TQ3}.genesis", "missing", "needs Genesis"]),
    (
        "stacks.int8.genesis",
        {"repo": "https://x/y.git", "commit": GENESIS_COMMIT},
        ["stacks.int8.genesis", "does not use Genesis"],
    ),
    (f"{TQ3}.genesis.repo", "github.com/x", [f"{TQ3}.genesis.repo", "'github.com/x'", "git URL"]),
    ("stacks.int8.tag", "x", ["stacks.int8.tag", "unknown key", "image, digest, vllm_version"]),
    ("registry", "docker.io", ["registry", "unknown key", "schema, serial"]),
    ("history", {"a": 1}, ["history", "{'a': 1}", "list of mappings"]),
    ("model", _DELETE, ["model", "missing", "repo, revision, local_dir"]),
    # Paths that would escape <model_dir>, and control characters anywhere
    ("model.local_dir", "..", ["model.local_dir: '..' is not valid", "one directory name"]),
    ("model.local_dir", "a/../b", ["model.local_dir: 'a/../b'", "no '/'"]),
    ("model.local_dir", ".hidden", ["model.local_dir: '.hidden'", "one directory name"]),
    ("model.repo", "Lorbus/Qwen\n", ["model.repo: 'Lorbus/Qwen\\n' holds control characters"]),
    ("stacks.int8.image", "vllm/vllm-openai:v0.20.1\r",
     ["stacks.int8.image: 'vllm/vllm-openai:v0.20.1\\r' holds control characters"]),
    (f"{TQ3}.genesis.repo", "https://x/y.git\x1b[2J",
     [f"{TQ3}.genesis.repo: 'https://x/y.git\\x1b[2J' holds control characters", "git URL"]),
    # A password in the URL would reach git's command line: refused, and never shown
    (f"{TQ3}.genesis.repo", "https://me:ghp_s3cr3t@github.com/me/fork.git",
     [f"{TQ3}.genesis.repo: 'https://***@github.com/me/fork.git' carries a password",
      "credential helper"]),
    (f"{TQ3}.genesis.version", "v12.1.0\n",
     [f"{TQ3}.genesis.version: 'v12.1.0\\n' holds control characters"]),
    ("hosts", {"rig-a\n": {"stacks": {}}},
     ["hosts: 'rig-a\\n' is a key holding control characters", "printable text"]),
    ("history", [{"serial": 2, "why": "bump\x07"}],
     ["history[0].why: 'bump\\x07' holds control characters"]),
]


@pytest.mark.parametrize(("key", "value", "expected"), BAD_PINS, ids=[b[0] for b in BAD_PINS])
def test_bad_pins_are_refused_with_a_precise_message(
    tmp_path: Path, key: str, value: Any, expected: list[str]
) -> None:
    data = good()
    _set(data, key, value)
    path = write(tmp_path, data)
    with pytest.raises(PinsError) as err:
        load_pins(path)
    msg = str(err.value)
    assert msg.startswith(str(path) + ": "), msg
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"
    assert "s3cr3t" not in msg


@pytest.mark.parametrize(("key", "text", "shown"), [
    ("driver", "{branch: '440', version: 440.100}", "440.1"),
    ("huggingface_hub", "{version: 1.0}", "1.0"),
    ("container_toolkit", "{version: 1.17}", "1.17"),
])
def test_an_unquoted_version_yaml_reads_as_a_number_is_named_as_such(
        tmp_path: Path, key: str, text: str, shown: str) -> None:
    # YAML reads 440.100 as the number 440.1: the message said "440.1 is not valid; allowed:
    # a full driver version ..., e.g. '580.105.08'", as if the version written were wrong
    path = write(tmp_path, good())
    lines = path.read_text().splitlines()
    start = lines.index(f"{key}:")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    path.write_text("\n".join([*lines[:start], f"{key}: {text}", *lines[end:]]) + "\n")
    with pytest.raises(PinsError) as err:
        load_pins(path)
    assert err.value.problems[0].startswith(
        f"{path}: {key}.version: {shown} is an unquoted number (YAML reads 440.100 as 440.1); "
        "allowed: ")
    assert err.value.problems[0].endswith(", quoted")


def test_release_tag_must_match_version() -> None:
    data = good()
    data["stacks"]["int8"]["image"] = "vllm/vllm-openai:v0.20.1"
    data["stacks"]["int8"]["vllm_version"] = "0.20.2"
    with pytest.raises(PinsError, match=r"'0.20.2' does not match the release tag 'v0.20.1'"):
        parse_pins(data)


def test_all_problems_reported_at_once() -> None:
    data = good()
    data["stacks"]["int8"]["digest"] = "sha256:short"
    data["model"]["revision"] = "abc1234"
    data["driver"]["branch"] = "x"
    with pytest.raises(PinsError) as err:
        parse_pins(data, "p.yaml")
    assert len(err.value.problems) == 3
    assert all(line.startswith("p.yaml: ") for line in err.value.problems)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(PinsError, match="no such file"):
        load_pins(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: [unclosed\n")
    with pytest.raises(PinsError, match="not valid YAML"):
        load_pins(bad)
    bad.write_text("")
    with pytest.raises(PinsError, match="top level: missing"):
        load_pins(bad)


def test_unresolved_refused_unless_allowed(tmp_path: Path) -> None:
    data = good()
    data["stacks"]["tq3-mtp-genesis"]["digest"] = UNRESOLVED
    path = write(tmp_path, data)
    with pytest.raises(PinsError) as err:
        load_pins(path)
    assert str(err.value) == (
        f"{path}: stacks.tq3-mtp-genesis.digest: is 'unresolved'; "
        "run `rigfleet pins lock` to resolve it from the registry / hub"
    )
    pins = load_pins(path, allow_unresolved=True)
    assert pins.unresolved() == ["stacks.tq3-mtp-genesis.digest"]


def test_save_pins_atomic_serial_history_roundtrip(tmp_path: Path) -> None:
    data = good()
    data["stacks"]["int8"]["digest"] = UNRESOLVED
    data["model"]["revision"] = UNRESOLVED
    path = write(tmp_path, data)
    os.chmod(path, 0o640)
    pins = load_pins(path, allow_unresolved=True)

    resolved = replace(pins, model=replace(pins.model, revision=REVISION),
                       stacks={**pins.stacks,
                               "int8": replace(pins.stacks["int8"], digest=DIGEST_A)})
    saved = save_pins(resolved, {"action": "lock"})

    assert saved.serial == 4
    assert saved.history == [{"action": "lock", "serial": 4}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pins.yaml"]  # no temp file left
    assert os.stat(path).st_mode & 0o777 == 0o640  # mode kept
    loaded = load_pins(path)  # strict: nothing unresolved any more
    assert loaded == saved
    assert path.read_text() == dump_pins(saved)
    assert "#" not in path.read_text()
    # Key order is the documented file order.
    assert list(yaml.safe_load(path.read_text())) == [
        "schema", "serial", "driver", "container_toolkit", "huggingface_hub", "model", "stacks",
        "history",
    ]  # fmt: skip
    assert yaml.safe_load(path.read_text())["driver"]["branch"] == "580"  # stays a string

    # A second save from the same (now stale) object is refused: someone saved in between.
    with pytest.raises(PinsError, match="serial 4 but these pins were loaded at 3"):
        save_pins(pins, {"action": "stale"})
    assert load_pins(path) == saved

    again = save_pins(loaded)
    assert again.serial == 5 and again.history == saved.history



def test_pins_of_a_users_stack_are_saved_with_the_catalog_they_were_read_with(
        tmp_path: Path) -> None:
    # save_pins checked what it writes against the built-in stacks only: a bump of a fleet
    # serving a stack of its stacks_dir was "not saved" ('mine' is not a stack in the catalog)
    from rigfleet.catalog import BUILTIN_DIR, load_catalog

    stacks = tmp_path / "stacks"
    stacks.mkdir()
    text = (BUILTIN_DIR / "int8.yaml").read_text().replace("name: int8", "name: mine")
    (stacks / "mine.yaml").write_text(text.replace("port: 8011", "port: 8099"))
    data = good()
    data["stacks"]["mine"] = dict(data["stacks"]["int8"])
    path = write(tmp_path, data)
    pins = load_pins(path, catalog=load_catalog([stacks]))
    saved = save_pins(pins, {"action": "bump"})
    assert saved.serial == 4 and "mine" in load_pins(path, catalog=load_catalog([stacks])).stacks
    # Pins that carry their catalog still copy deeply (the twin copies pins it fills in).
    import copy

    assert copy.deepcopy(pins) == pins and copy.deepcopy(pins).catalog is pins.catalog


def test_save_pins_refuses_invalid_content(tmp_path: Path) -> None:
    from dataclasses import replace

    pins = load_pins(write(tmp_path, good()))
    broken = replace(pins, toolkit_version="1.17")
    with pytest.raises(PinsError, match="container_toolkit.version: '1.17'"):
        save_pins(broken)
    assert load_pins(tmp_path / "pins.yaml") == pins


def test_a_duplicate_key_in_the_pins_file_names_file_key_and_line(tmp_path: Path) -> None:
    path = tmp_path / "pins.yaml"
    text = yaml.safe_dump(good(), sort_keys=False)
    path.write_text(text.replace("serial: 3\n", "serial: 3\nserial: 4\n", 1))
    line = text.splitlines().index("serial: 3") + 2
    with pytest.raises(PinsError) as err:
        load_pins(path)
    assert str(err.value).startswith(f"{path}: line {line}: not valid YAML: found duplicate "
                                     f"key 'serial' (first at line {line - 1})")


def test_a_pins_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "pins.yaml"
    text = yaml.safe_dump(good(), sort_keys=False) + "# caf\u00e9\n"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(PinsError, match=rf"pins.yaml: line {text.count(chr(10))}: byte 0xe9 is "
                                        r"not UTF-8; allowed: a UTF-8 text file"):
        load_pins(path)


def test_two_saves_at_once_one_is_refused_and_no_change_is_lost(tmp_path, monkeypatch) -> None:
    # Both read serial 3 before either wrote: both were "saved", the later write dropping the
    # earlier one's change (a bump's new pin gone while its journal said it was recorded).
    import threading
    from contextlib import suppress

    import rigfleet.pins as pins_module

    path = write(tmp_path, good())
    pins = load_pins(path)
    both_checked = threading.Barrier(2, timeout=1)
    real_write = pins_module.write_keeping_mode

    def write_once_both_checked(p: Path, text: str) -> None:
        with suppress(threading.BrokenBarrierError):  # under the lock the other one waits
            both_checked.wait()
        real_write(p, text)

    monkeypatch.setattr(pins_module, "write_keeping_mode", write_once_both_checked)
    outcomes: dict[str, Any] = {}

    def save(name: str, digest: str) -> None:
        new = replace(pins, stacks={**pins.stacks, "int8": replace(pins.stacks["int8"],
                                                                   digest=digest)})
        try:
            outcomes[name] = save_pins(new, {"action": name})
        except PinsError as e:
            outcomes[name] = e

    threads = [threading.Thread(target=save, args=("bump", DIGEST_B)),
               threading.Thread(target=save, args=("lock", "sha256:" + "c" * 64))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    saved = [o for o in outcomes.values() if not isinstance(o, PinsError)]
    refused = [str(o) for o in outcomes.values() if isinstance(o, PinsError)]
    assert len(saved) == 1, outcomes
    assert refused == [f"{path}: serial: file is at serial 4 but these pins were loaded at 3; "
                       "someone saved in between. Reload, re-apply, save again"]
    assert load_pins(path) == saved[0]  # the one told "saved" is what the file holds


def test_a_save_waits_a_bounded_time_for_another_ones_lock(tmp_path, monkeypatch) -> None:
    import fcntl

    import rigfleet.pins as pins_module

    path = write(tmp_path, good())
    pins = load_pins(path)
    monkeypatch.setattr(pins_module, "SAVE_WAIT", 0.2)
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process, saving
        with pytest.raises(PinsError) as e:
            save_pins(pins, {"action": "lock"})
    finally:
        os.close(fd)
    assert str(e.value) == (f"{path}: not saved: another rigfleet process held the lock of "
                            f"{tmp_path} for 0.2s; allowed: run again when it ends")
    assert load_pins(path) == pins
    assert save_pins(pins).serial == 4  # once it is free
