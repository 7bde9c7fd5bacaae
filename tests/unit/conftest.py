"""Fixtures shared by the product's unit tests (the twin's own live in testbed/tests)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_source_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deploy's preflight asks the pinned things' sources from the control machine
    (rigfleet/check.py); unit tests never reach out: the tests of that check set a fake."""
    import rigfleet.bump.cli
    import roles.preflight

    monkeypatch.setattr(roles.preflight, "SOURCES", None)
    monkeypatch.setattr(rigfleet.bump.cli, "SOURCES", None)
