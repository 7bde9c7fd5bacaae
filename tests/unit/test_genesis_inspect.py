"""The Genesis tree helper (``rigfleet/genesis_inspect.py``, on hosts
``rigfleet-genesis-inspect.py``): layout detection, both allowlists, the patch registry and how
each generation reads its switches, the declared version, and the command line as the hosts run
it, against small trees of both layouts (``genesis_trees.py``).

Run: ``.venv/bin/python -m pytest tests/unit/test_genesis_inspect.py -q``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from genesis_trees import (
    V7_KNOWN,
    V12_KNOWN,
    V12_PENDING,
    v7_files,
    v12_files,
    write_tree,
)

from rigfleet import genesis_inspect as gi
from rigfleet.genesis import TreeReport

HELPER = Path(gi.__file__)


@pytest.fixture
def v7(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "v7", v7_files(V7_KNOWN))


@pytest.fixture
def v12(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "v12", v12_files(V12_KNOWN, V12_PENDING))


def run_helper(tree: Path) -> tuple[int, dict, str]:
    run = subprocess.run([sys.executable, str(HELPER), str(tree)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    return run.returncode, json.loads(run.stdout) if run.stdout else {}, run.stderr


def test_layout_is_detected_from_the_marker_files() -> None:
    v7, v12 = gi.GENERATIONS["v7"].check_file, gi.GENERATIONS["v12"].check_file
    assert gi.detect_layout(frozenset({v7})) == ("v7", None)
    assert gi.detect_layout(frozenset({v12})) == ("v12", None)
    layout, why = gi.detect_layout(frozenset())
    assert layout is None and v7 in why and v12 in why
    layout, why = gi.detect_layout(frozenset({v7, "vllm/sndr_core"}))
    assert layout is None and "v8-v11" in why and "does not mount" in why
    assert gi.detect_layout(frozenset({v12, "vllm/sndr_core"})) == ("v12", None)
    layout, why = gi.detect_layout(frozenset({v7, v12}))
    assert layout is None and "marker files of several layouts" in why


def test_the_layouts_rigfleet_mounts_are_the_ones_the_helper_detects() -> None:
    # One table: the container side (rigfleet.catalog.entrypoint_script) reads the helper's.
    for layout in gi.GENERATIONS.values():
        assert layout.check_file in gi.MARKERS


def test_v7_tree_report(v7: Path) -> None:
    rc, report, err = run_helper(v7)
    assert rc == 0, err
    assert report["schema"] == gi.SCHEMA and report["errors"] == []
    assert report["layout"] == "v7" and report["markers"] == ["vllm/_genesis/patches/apply_all.py"]
    assert report["version"] == "v7.63.x"  # what v7 trees declare, stale or not
    assert report["allowlist"] == {"file": "vllm/_genesis/guards.py", "known_good": V7_KNOWN,
                                   "pending": []}  # fmt: skip
    reg = report["registry"]
    assert reg["file"] == "vllm/_genesis/dispatcher.py" and reg["patches"] == 8
    # Genesis' own rule: no lifecycle -> "stable", `deprecated: True` -> "deprecated".
    assert reg["lifecycles"] == {"deprecated": 1, "legacy": 1, "retired": 1, "stable": 5}
    assert reg["switch_prefixes"] == ["GENESIS_ENABLE_"] and reg["retired_skipped"] is False
    # v7 reads env_flag literally: the legacy P4's GENESIS_LEGACY_P4 is no ENABLE switch.
    assert "P4" not in reg["switches"] and "GENESIS_LEGACY_P4" not in reg["switches"]
    assert reg["patch_flags"]["P4"] == ["GENESIS_LEGACY_P4", "legacy", True]
    assert reg["switches"]["P67_TQ_MULTI_QUERY_KERNEL"] == [
        ["P67", "stable", "env_flag"], ["P67b", "stable", "env_flag"]]
    assert report["flags"] == []


def test_v12_tree_report(v12: Path) -> None:
    rc, report, err = run_helper(v12)
    assert rc == 0, err
    assert report["layout"] == "v12" and report["version"] == "v12.1.0"  # [project], not [tool]
    assert report["allowlist"]["known_good"] == V12_KNOWN
    assert report["allowlist"]["pending"] == V12_PENDING
    reg = report["registry"]
    assert reg["patches"] == 11
    assert reg["lifecycles"] == {"experimental": 6, "legacy": 1, "research": 1, "retired": 2,
                                 "stable": 1}  # fmt: skip
    assert reg["switch_prefixes"] == ["GENESIS_ENABLE_", "SNDR_ENABLE_"]
    assert reg["retired_skipped"] is True
    sw = reg["switches"]
    assert sw["P64_QWEN3CODER_MTP_STREAMING"] == [["P64", "retired", "env_flag"]]
    assert sw["P61C_QWEN3CODER_DEFERRED_COMMIT"] == [["P64", "retired", "alias"]]
    assert sw["P59_QWEN3_TOOL_RECOVERY"] == [["P61b", "experimental", "alias"]]
    # v12 strips SNDR_ENABLE_ too: the flag answers to GENESIS_ENABLE_<suffix> as well.
    assert sw["SPEC_DECODE_ACCEPTANCE_METRIC"] == [["PN282", "stable", "env_flag"]]
    assert "P4" not in sw  # switched by GENESIS_LEGACY_P4, not GENESIS_ENABLE_P4
    # Flags no patch owns; the legacy id P4 is not one of them.
    assert report["flags"] == ["BUNDLE_REASONING_QWEN3", "NO_PATCH_CACHE"]


def test_report_parses_into_the_typed_view(v12: Path) -> None:
    report = TreeReport.from_json(run_helper(v12)[1])
    assert report.layout == "v12" and report.has_registry
    assert report.allowed == (*V12_KNOWN, *V12_PENDING)
    assert report.lists("0.21.0") and not report.lists("0.27.1")
    assert report.patch_id("p60b") is None and report.patch_id("pn26B") == "PN26b"
    with pytest.raises(ValueError, match="not a rigfleet-genesis-inspect/1 report"):
        TreeReport.from_json({"known_good": []})


def test_nothing_in_the_tree_is_executed_and_only_literals_count() -> None:
    text = ("import os\nraise SystemExit('must not run')\n"
            "KNOWN_GOOD_VLLM_PINS: tuple[str, ...] = ('0.1', '0.2')  # comment\n"
            "PROMOTION_PENDING_VLLM_PINS = tuple(load())\n")  # fmt: skip
    assert gi.parse_allowlist(text, "g.py") == (["0.1", "0.2"], [])
    with pytest.raises(gi.InspectError, match="g.py: no literal KNOWN_GOOD_VLLM_PINS"):
        gi.parse_allowlist("KNOWN_GOOD_VLLM_PINS = load()\n", "g.py")
    with pytest.raises(gi.InspectError, match="g.py: not valid Python"):
        gi.parse_allowlist("def (:\n", "g.py")
    with pytest.raises(gi.InspectError, match="no literal PATCH_REGISTRY dict"):
        gi.parse_registry("PATCH_REGISTRY = build()\n", "r.py", gi.GENERATIONS["v7"])


def test_trees_rigfleet_cannot_use_are_errors_with_exit_1(tmp_path: Path, v7: Path) -> None:
    rc, report, err = run_helper(write_tree(tmp_path / "empty", {"README.md": "x"}))
    assert rc == 1 and report["layout"] is None
    assert "no Genesis layout rigfleet knows: it has none of" in report["errors"][0]
    assert "no Genesis layout rigfleet knows" in err
    (v7 / "vllm/_genesis/dispatcher.py").write_text("PATCH_REGISTRY = make()\n")
    (v7 / "vllm/_genesis/guards.py").unlink()
    rc, report, err = run_helper(v7)
    assert rc == 1 and report["layout"] == "v7"
    assert report["errors"] == [
        "vllm/_genesis/guards.py: missing (where the v7 layout keeps KNOWN_GOOD_VLLM_PINS)",
        "vllm/_genesis/dispatcher.py: no literal PATCH_REGISTRY dict",
    ]


def test_command_line_usage(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(HELPER)], capture_output=True, text=True)
    assert run.returncode == 2 and "usage: rigfleet-genesis-inspect.py" in run.stderr
    run = subprocess.run([sys.executable, str(HELPER), str(tmp_path / "nope")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1 and "not a directory" in run.stderr


def test_the_helper_is_stdlib_only() -> None:
    # It runs on hosts as a single file: nothing of rigfleet may be imported.
    run = subprocess.run([sys.executable, "-I", "-c", "import ast, sys; "
                          f"t = ast.parse(open({str(HELPER)!r}).read()); "
                          "mods = {a.name.split('.')[0] for n in ast.walk(t) "
                          "if isinstance(n, ast.Import) for a in n.names} | "
                          "{n.module.split('.')[0] for n in ast.walk(t) "
                          "if isinstance(n, ast.ImportFrom) and n.module}; "
                          "print(sorted(m for m in mods if m not in sys.stdlib_module_names))"],
                         capture_output=True, text=True)  # fmt: skip
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


@pytest.mark.parametrize("text, version", [
    ('[project]\nname = "x"\nversion = "12.1.0"  # release\n', "v12.1.0"),
    ('[tool.x]\nversion = "1.0"\n[project]\nname = "x"\n', None),
    ("VERSION = 'v7.72.2'\n", "v7.72.2"),
    ("__version__ = compute()\n", None),
])  # fmt: skip
def test_declared_version(text: str, version: str | None) -> None:
    files = gi.GENERATIONS["v12" if text.startswith("[") else "v7"]
    assert gi.parse_version(text, files) == version


def test_layout_facts_read_the_same_markers(tmp_path: Path, v7: Path, v12: Path) -> None:
    # The deploy's facts list the marker files in shell and decide with detect_layout.
    from rigfleet.facts import GenesisHead, GenesisTrees

    trees = tmp_path / "trees"
    for name, tree in (("7" * 40, v7), ("c" * 40, v12), ("0" * 40, tmp_path / "bare")):
        tree.mkdir(exist_ok=True)
        (trees).mkdir(exist_ok=True)
        (trees / name).symlink_to(tree)
    fact = GenesisTrees()
    out = subprocess.run(["sh", "-c", fact.command(str(trees))], capture_output=True,
                         text=True, check=True).stdout.splitlines()  # fmt: skip
    state = fact.process(out)
    assert {c: layout for c, (_, layout) in state.trees.items()} == {
        "7" * 40: "v7", "c" * 40: "v12", "0" * 40: None}
    head = GenesisHead()
    out = subprocess.run(["sh", "-c", head.command(str(v12))], capture_output=True,
                         text=True, check=True).stdout.splitlines()  # fmt: skip
    assert head.process(out).layout == "v12" and head.process(out).head is None
