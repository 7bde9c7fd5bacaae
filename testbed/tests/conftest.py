"""Fixtures of the twin's own tests (the stand-ins, the vLLM simulator, the hub, the Genesis
fixture) and of the product tests that run against the twin's servers in-process.

The product's unit-test helpers (tests/unit: bump_helpers, genesis_trees, bench_fakes...) are
importable here; the reverse never holds (tests/unit/test_unit_isolation.py).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rigfleet_testbed.hardware import hardware_profile
from rigfleet_testbed.nvidia import kmod
from rigfleet_testbed.nvidia import simstate as sim

sys.path.append(str(Path(__file__).resolve().parents[2] / "tests" / "unit"))

DRIVER = "580.105.08"


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> sim.SimPaths:
    """A booted simulated host: two RTX 3090s, module 580 loaded, every path under tmp_path
    (device nodes, firmware and the DKMS directory included)."""
    source = tmp_path / "etc-hardware.json"
    source.write_text(json.dumps(hardware_profile("host1")))
    monkeypatch.setenv("NVIDIA_SIM_ROOT", str(tmp_path / "run"))
    for var in ("NVIDIA_SIM_HARDWARE", "NVIDIA_SIM_DEV", "NVIDIA_SIM_FIRMWARE", "NVIDIA_SIM_DKMS"):
        monkeypatch.delenv(var, raising=False)
    p = sim.SimPaths.from_env()
    assert kmod.load(p, source, DRIVER, err=io.StringIO()) == 0
    return p


@pytest.fixture(autouse=True)
def _no_source_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in tests/unit: the deploy's preflight never asks the real sources from here."""
    import rigfleet.bump.cli
    import roles.preflight

    monkeypatch.setattr(roles.preflight, "SOURCES", None)
    monkeypatch.setattr(rigfleet.bump.cli, "SOURCES", None)
