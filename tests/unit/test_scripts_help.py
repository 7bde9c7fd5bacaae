"""Every script in benchmarks/ and scripts/ answers ``--help`` (exit 0, a usage text) without
doing anything else: Python scripts through argparse, shell scripts through their header."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALL_PYTHON = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")])


def imports_the_twin(script: Path) -> bool:
    """The script imports rigfleet_testbed as it starts (not only in a function)."""
    for node in ast.parse(script.read_text()).body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n.split(".")[0] == "rigfleet_testbed" for n in names):
            return True
    return False


# Scripts that drive the twin need its package: testbed/tests/test_twin_scripts_help.py.
TWIN_PYTHON = [p for p in ALL_PYTHON if imports_the_twin(p)]
PYTHON = [p for p in ALL_PYTHON if p not in TWIN_PYTHON]
SHELL = sorted(ROOT.glob("scripts/*.sh"))


def test_there_are_scripts():
    assert len(PYTHON) >= 5 and len(TWIN_PYTHON) >= 1 and len(SHELL) >= 3


def answers_help(script: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: ") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("script", PYTHON, ids=lambda p: p.name)
def test_python_scripts_answer_help(script):
    answers_help(script)


@pytest.mark.parametrize("script", SHELL, ids=lambda p: p.name)
def test_shell_scripts_answer_help(script):
    text = script.read_text()
    # --help is handled before the script does anything (it must not run to find out).
    assert text.index("-h|--help)") < text.index("set -euo pipefail") + 200
    proc = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True,
                          timeout=30, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) >= 2 and not proc.stderr
    bad = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True,
                         timeout=30, cwd=ROOT)
    assert bad.returncode == 2 and "allowed: --help" in bad.stderr
