"""The unit tests run in a clone of the project alone (`pip install -e '.[test]'`): no file here
imports the simulator package (rigfleet_testbed) or names a path outside the repository or
inside the twin (../shared, testbed/). Tests of the twin live in testbed/tests."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FILES = sorted(HERE.glob("*.py"))
TWIN = "rigfleet_testbed"
# Words of a path that leaves the project alone: the reference tree beside the repository
# (../shared), the twin's directory.
FORBIDDEN_PATHS = ("shared", "testbed")


def imports(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            names.append(str(node.args[0].value))
    return names


def path_words(tree: ast.AST) -> list[str]:
    """Strings used as path parts: the right of a ``/`` on a path, or a ``Path(...)`` argument;
    and ``parents[n]`` reaching above the repository (tests/unit/x.py: parents[2] is the root)."""
    found: list[str] = []
    for node in ast.walk(tree):
        parts: list[ast.expr] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = [node.right]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Path":
            parts = list(node.args)
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "parents" and isinstance(node.slice, ast.Constant)
              and isinstance(node.slice.value, int) and node.slice.value > 2):  # fmt: skip
            found.append(f"parents[{node.slice.value}]")
        for part in parts:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                words = part.value.replace("\\", "/").split("/")
                if any(w in FORBIDDEN_PATHS or w == TWIN for w in words):
                    found.append(part.value)
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_unit_test_file_needs_neither_the_twin_nor_shared(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    twin = [n for n in imports(tree) if n == TWIN or n.startswith(TWIN + ".")]
    assert not twin, f"{path.name} imports {twin}: move the test to testbed/tests"
    outside = path_words(tree)
    assert not outside, (f"{path.name} names {outside}: a unit test reads only the repository "
                         "(data in tests/unit/data or tests/fixtures)")


def test_the_guard_sees_what_it_forbids() -> None:
    bad = ast.parse("from rigfleet_testbed import layout\nimport rigfleet_testbed.cli\n"
                    "p = Path(__file__).parents[3] / 'shared' / 'upstream'\n"
                    "q = ROOT / 'testbed/rigfleet_testbed/images'\nr = Path('../shared/x')\n")
    assert imports(bad) == ["rigfleet_testbed", "rigfleet_testbed.cli"]
    assert sorted(path_words(bad)) == sorted(
        ["parents[3]", "shared", "testbed/rigfleet_testbed/images", "../shared/x"])
    assert path_words(ast.parse("p = ROOT / 'tests' / 'fixtures' / 'genesis'")) == []
