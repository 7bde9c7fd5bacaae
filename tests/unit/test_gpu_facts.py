"""rigfleet.gpu parses real nvidia-smi output (the stand-in's, through the same parser:
testbed/tests/test_smi_standin_parsed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigfleet import gpu

# Captured on a real NVIDIA host (copied from shared/fixtures: data, not code).
H200 = (Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
        / "h200-ubuntu2404-580.159.04")
# What nvidia-smi prints when no module is loaded (the stand-in prints the same).
NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.\n\n")


def fixture(name: str) -> str:
    return (H200 / name).read_text()


# --- real output -----------------------------------------------------------------------------


def test_query_command_uses_the_field_list() -> None:
    cmd = gpu.query_command()
    assert cmd == ("nvidia-smi --query-gpu=" + ",".join(gpu.QUERY_FIELDS)
                   + " --format=csv,noheader,nounits")
    assert gpu.query_command(["index", "name"]) == (
        "nvidia-smi --query-gpu=index,name --format=csv,noheader,nounits")


def test_real_query_gpu() -> None:
    (card,) = gpu.parse_query_gpu(fixture("query-gpu.csv"))
    assert card == gpu.GpuInfo(
        index=0, name="NVIDIA H200", uuid="GPU-1de1b78b-5c80-3900-48f1-79097cba20b4",
        pci_bus_id="00000000:00:06.0", driver_version="580.159.04", power_limit_w=700.0,
        power_default_limit_w=700.0, power_min_limit_w=200.0, power_max_limit_w=700.0,
        enforced_power_limit_w=700.0, persistence_mode=True, memory_total_mib=143771,
        memory_used_mib=0, temperature_c=34, clocks_max_sm_mhz=1980, compute_cap="9.0",
        vbios_version="96.00.A5.00.1A",
    )


def test_real_query_gpu_with_header_and_units() -> None:
    (card,) = gpu.parse_query_gpu(fixture("query-gpu-header.csv"), ["index", "name", "power.limit"])
    assert (card.index, card.name, card.power_limit_w) == (0, "NVIDIA H200", 700.0)
    assert card.memory_total_mib is None


# --- bad and degraded output -----------------------------------------------------------------


def test_not_available_values_become_none() -> None:
    line = ("0, NVIDIA GeForce RTX 3090, GPU-x, 00000000:01:00.0, 580.105.08, [N/A], 350.00, "
            "100.00, 350.00, [Not Supported], Disabled, 24576, N/A, 40, 2100, 8.6, 94.02.42.40.2A")
    (card,) = gpu.parse_query_gpu(line)
    assert card.power_limit_w is None and card.enforced_power_limit_w is None
    assert card.memory_used_mib is None and card.persistence_mode is False


def test_comma_in_name_is_rejoined() -> None:
    (card,) = gpu.parse_query_gpu("3, NVIDIA RTX A6000, Ada Generation", ["index", "name"])
    assert card.name == "NVIDIA RTX A6000, Ada Generation"


def test_bad_line_is_named() -> None:
    with pytest.raises(gpu.GpuParseError, match=r"'0, NVIDIA H200, 700.00'"):
        gpu.parse_query_gpu("0, NVIDIA H200, 700.00")
    with pytest.raises(gpu.GpuParseError, match="power.limit has value 'lots'"):
        gpu.parse_query_gpu("0, X, lots", ["index", "name", "power.limit"])


def test_driver_not_loaded_is_its_own_error() -> None:
    with pytest.raises(gpu.DriverNotLoadedError):
        gpu.parse_query_gpu(NOT_LOADED)
    with pytest.raises(gpu.DriverNotLoadedError):
        gpu.parse_query_gpu("Failed to initialize NVML: Driver/library version mismatch\n"
                              "NVML library version: 590.44\n")
