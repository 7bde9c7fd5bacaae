"""GPUs: the pinned driver branch loaded, persistence on, each card at its inventory power cap,
and the unit that re-applies the caps at boot enabled with the same caps.

    pytest tests/hosts/test_gpus.py --inventory inventory/home.py
"""

from __future__ import annotations

from typing import Any

import pytest

from rigfleet import gpu
from rigfleet.commands import nvidia as nvidia_commands
from rigfleet.hostside.probe import GPU_FIELDS, POWER_CAPS_UNIT
from rigfleet.status.drift import CAP_TOLERANCE_W

# Where roles/power.py installs the unit (the roles are not imported here, see below).
UNIT_DIR = "/etc/systemd/system"


def query(host: Any, rig: Any) -> list[gpu.GpuInfo]:
    result = host.run(gpu.query_command(GPU_FIELDS))
    if result.rc != 0:
        why = (result.stdout + result.stderr).strip().splitlines()
        pytest.fail(
            f"{rig.name}: nvidia-smi fails (exit {result.rc}): {why[-1] if why else ''}; "
            "the driver is not loaded (reboot pending?) or not installed",
            pytrace=False,
        )
    try:
        return gpu.parse_query_gpu(result.stdout, GPU_FIELDS)
    except gpu.GpuParseError as e:
        pytest.fail(f"{rig.name}: {e}", pytrace=False)


def test_driver_loaded_on_pinned_branch(host, rig, fail_if):
    pins, settings = rig.want.pins, rig.want.settings
    cards = query(host, rig)
    problems = []
    for card in cards:
        version = card.driver_version or "unknown"
        if not version.startswith(f"{pins.driver_branch}."):
            problems.append(
                f"card {card.index}: driver {version} loaded, pins driver.branch is "
                f"{pins.driver_branch} (from {pins.path})"
            )
        elif pins.driver_version and version != pins.driver_version:
            problems.append(
                f"card {card.index}: driver {version} loaded, pins driver.version is "
                f"{pins.driver_version}"
            )
    if len(cards) != settings.gpu_count:
        problems.append(
            f"nvidia-smi lists {len(cards)} GPU(s), inventory gpu_count is {settings.gpu_count}"
        )
    fail_if("NVIDIA driver", problems)


def driver_packages(os_id: str, branch: str) -> tuple[str, ...]:
    """The driver packages the deploy installs and holds (``roles.nvidia_driver``; a unit test
    keeps the two equal: the roles are not imported here, so a role being edited cannot break
    the host checks)."""
    if os_id == "ubuntu":
        return (
            f"nvidia-driver-{branch}-server-open",
            f"nvidia-utils-{branch}-server",
            f"nvidia-compute-utils-{branch}-server",
        )
    return ("nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-smi", "nvidia-persistenced")


def test_driver_packages_on_branch_and_held(host, rig, fail_if):
    # Held, so an unattended upgrade cannot move user space away from the loaded module.
    pins = rig.want.pins
    expected = driver_packages(host.system_info.distribution, pins.driver_branch)
    problems = []
    for name in expected:
        pkg = host.run(f"dpkg-query -W -f '${{Version}}\\t${{Status}}' {name}")
        version, _, status = pkg.stdout.partition("\t")
        if pkg.rc != 0 or not status.endswith(" installed"):
            problems.append(f"{name} is not installed")
            continue
        if not version.startswith(f"{pins.driver_version or pins.driver_branch + '.'}"):
            problems.append(f"{name} is {version}, pins driver branch {pins.driver_branch}")
        if not status.startswith("hold "):
            problems.append(f"{name} is not held (dpkg status '{status}')")
    fail_if("driver packages", problems)


def test_persistence_mode_on(host, rig, fail_if):
    problems = [
        f"card {card.index}: persistence mode is "
        f"{'Disabled' if card.persistence_mode is False else 'unknown'}, expected Enabled"
        for card in query(host, rig)
        if card.persistence_mode is not True
    ]
    daemon = host.service("nvidia-persistenced")
    if not daemon.is_running:
        problems.append("nvidia-persistenced is not running")
    if not daemon.is_enabled:
        problems.append("nvidia-persistenced is not enabled at boot")
    fail_if("persistence mode", problems)


def test_power_caps_equal_inventory(host, rig, fail_if):
    caps = rig.want.settings.power_caps_w
    cards = {card.index: card for card in query(host, rig)}
    problems = []
    for index, want in enumerate(caps):
        card = cards.get(index)
        have = card.power_limit_w if card is not None else None
        if card is None:
            problems.append(
                f"card {index}: not present, inventory power_caps_w[{index}] is {want} W"
            )
        elif have is None or abs(have - want) > CAP_TOLERANCE_W:
            shown = "unknown" if have is None else f"{have:g} W"
            problems.append(
                f"card {index}: power limit is {shown}, inventory power_caps_w[{index}] is {want} W"
            )
    fail_if("power caps differ from the inventory", problems)


def test_power_caps_unit_enabled_with_inventory_caps(host, rig, fail_if):
    unit = host.service(POWER_CAPS_UNIT)
    problems = []
    if not unit.is_enabled:
        problems.append(f"{POWER_CAPS_UNIT} is not enabled: caps are lost at the next boot")
    unit_path = f"{UNIT_DIR}/{POWER_CAPS_UNIT}"
    unit_file = host.file(unit_path)
    if not unit_file.exists:
        problems.append(f"{unit_path} is missing")
    else:
        have = [
            line.partition("=")[2].strip()
            for line in unit_file.content_string.splitlines()
            if line.startswith("ExecStart=")
        ]
        caps = rig.want.settings.power_caps_w
        want = [nvidia_commands.set_power_limit(i, w) for i, w in enumerate(caps)]
        if have != want:
            problems.append(f"the unit runs {have}, inventory caps need {want}")
    fail_if("power caps unit", problems)
