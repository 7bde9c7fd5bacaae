"""The scripts that drive the twin (they import rigfleet_testbed) answer ``--help`` as every
other script does (tests/unit/test_scripts_help.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_scripts_help import TWIN_PYTHON, answers_help


@pytest.mark.parametrize("script", TWIN_PYTHON, ids=lambda p: p.name)
def test_twin_scripts_answer_help(script: Path) -> None:
    answers_help(script)
