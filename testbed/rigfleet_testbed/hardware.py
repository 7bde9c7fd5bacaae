"""Simulated GPU hardware of a testbed host, written to ``/etc/nvidia-sim/hardware.json``.

The testbed describes the hardware; nothing the deploy writes does. Overrides model the rigs our
users actually have besides the default (one card, 20 GB cards, NVLink bridges), and the
machine's firmware and boot: Secure Boot on, with or without the DKMS signing key enrolled as a
MOK (the live NVRAM is ``firmware/`` next to this file, see ``rigfleet_testbed.firmware``), and
the cgroup hierarchy it boots (2, Debian's default; 1 with systemd.unified_cgroup_hierarchy=0)::

    profile = hardware_profile("host1", cards=1, memory_mib=20480)
    profile = hardware_profile("host1", secure_boot=True, mok_enrolled=False)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

RTX_3090 = "NVIDIA GeForce RTX 3090"


def _uuid(host: str, index: int) -> str:
    h = hashlib.sha256(f"{host}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def hardware_profile(
    host: str,
    *,
    cards: int = 2,
    memory_mib: int = 24576,
    nvlink: bool = False,
    power_default_w: int = 350,
    power_min_w: int = 100,
    power_max_w: int = 350,
    secure_boot: bool = False,
    mok_enrolled: bool = False,
    cgroup: int = 2,
) -> dict[str, Any]:
    """The hardware of one simulated host: by default two RTX 3090s over PCIe, UEFI with
    Secure Boot off, booting the unified cgroup hierarchy."""
    if cards < 1:
        raise ValueError(f"cards must be at least 1, got {cards}")
    if cgroup not in (1, 2):
        raise ValueError(f"cgroup must be 1 or 2, got {cgroup}")
    if mok_enrolled and not secure_boot:
        raise ValueError("mok_enrolled=1 needs secure_boot=1")
    gpus = [
        {
            "index": i,
            "name": RTX_3090,
            "uuid": _uuid(host, i),
            # Two slots on one root complex, as on a typical X570/TRX board.
            "pci_bus_id": f"00000000:{0x01 + i * 0x20:02X}:00.0",
            "memory_total_mib": memory_mib,
            "power_default_w": power_default_w,
            "power_min_w": power_min_w,
            "power_max_w": power_max_w,
            "vbios": "94.02.42.40.2A",
            "compute_cap": "8.6",
        }
        for i in range(cards)
    ]
    return {"driver_branch_supported": ["580", "590"], "nvlink": nvlink, "gpus": gpus,
            "cgroup_version": cgroup,
            "secure_boot": {"enabled": secure_boot, "mok_enrolled": mok_enrolled}}


def parse_override(spec: str) -> dict[str, Any]:
    """Parse a ``--hardware host2:cards=1,memory_mib=20480,nvlink=1`` override value."""
    try:
        host, _, rest = spec.partition(":")
        options: dict[str, Any] = {"host": host}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            if key in _FLAGS:
                if value.lower() not in ("1", "true", "yes", "0", "false", "no"):
                    raise ValueError(f"{key}={value!r} is not 1/0")
                options[key] = value.lower() in ("1", "true", "yes")
            elif key in _NUMBERS:
                options[key] = int(value)
            else:
                raise ValueError(f"unknown key {key!r}")
        hardware_profile(host or "check", **{k: v for k, v in options.items() if k != "host"})
    except ValueError as exc:
        raise ValueError(
            f"bad hardware override {spec!r} ({exc}); expected HOST:key=value,... with keys "
            f"{', '.join(_NUMBERS + _FLAGS)}"
        ) from None
    if not host:
        raise ValueError(f"bad hardware override {spec!r}: missing host name before ':'")
    return options


_NUMBERS = ("cards", "memory_mib", "power_default_w", "power_min_w", "power_max_w", "cgroup")
_FLAGS = ("nvlink", "secure_boot", "mok_enrolled")


def render(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=2, sort_keys=True) + "\n"
