"""The NVIDIA stand-in's nvidia-smi output read by the product's parser (rigfleet.gpu), as real
output is (tests/unit/test_gpu_facts.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rigfleet_testbed.hardware import hardware_profile
from rigfleet_testbed.nvidia import kmod, simstate, smi

from rigfleet import gpu

VERSION = "580.105.08"


@pytest.fixture
def sim_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A simulated host with two RTX 3090s and the 580 module loaded."""
    source = tmp_path / "etc-hardware.json"
    source.write_text(json.dumps(hardware_profile("host1")))
    root = tmp_path / "run-nvidia-sim"
    monkeypatch.setenv("NVIDIA_SIM_ROOT", str(root))
    monkeypatch.delenv("NVIDIA_SIM_HARDWARE", raising=False)
    assert kmod.load(simstate.SimPaths.from_env(), source, VERSION, err=io.StringIO()) == 0
    return root


def standin(*args: str) -> str:
    out = io.StringIO()
    rc = smi.main(list(args), version=VERSION, out=out)
    assert rc == 0, out.getvalue()
    return out.getvalue()


# --- the stand-in, through the same parser ---------------------------------------------------


def test_standin_query_gpu(sim_host: Path) -> None:
    cards = gpu.parse_query_gpu(standin(f"--query-gpu={','.join(gpu.QUERY_FIELDS)}",
                                        "--format=csv,noheader,nounits"))
    assert len(cards) == 2
    for i, card in enumerate(cards):
        assert card.index == i and card.name == "NVIDIA GeForce RTX 3090"
        assert card.memory_total_mib == 24576
        assert (card.power_limit_w, card.power_min_limit_w, card.power_max_limit_w) == (
            350.0, 100.0, 350.0)
        assert card.power_default_limit_w == card.enforced_power_limit_w == 350.0
        assert card.driver_version == VERSION and card.compute_cap == "8.6"
        assert card.persistence_mode is False and card.memory_used_mib == 1
    assert cards[0].uuid != cards[1].uuid


def test_standin_query_gpu_with_header_and_units(sim_host: Path) -> None:
    fields = ["index", "name", "power.limit"]
    cards = gpu.parse_query_gpu(standin("--query-gpu=" + ",".join(fields), "--format=csv"), fields)
    assert [(c.index, c.power_limit_w) for c in cards] == [(0, 350.0), (1, 350.0)]


def test_standin_not_loaded_is_recognised(sim_host: Path) -> None:
    (sim_host / "loaded").unlink()
    out = io.StringIO()
    assert smi.main(["--query-gpu=index", "--format=csv"], version=VERSION, out=out) == 9
    with pytest.raises(gpu.DriverNotLoadedError):
        gpu.parse_query_gpu(out.getvalue(), ["index"])
