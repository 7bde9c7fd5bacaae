"""The testinfra suite (tests/hosts) runs only against a fleet, so the unit run at least loads
each of its modules: a name it imports from rigfleet that is gone fails here, not on a host."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HOSTS = Path(__file__).resolve().parents[1] / "hosts"


@pytest.mark.parametrize("path", sorted(HOSTS.glob("*.py")), ids=lambda p: p.name)
def test_each_host_check_module_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HOSTS))
    name = f"_hosts_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
