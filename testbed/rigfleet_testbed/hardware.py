"""Simulated GPU hardware of a testbed host, written to ``/etc/nvidia-sim/hardware.json``.

The testbed describes the hardware; nothing the deploy writes does. Overrides model the rigs our
users actually have besides the default (one card, 20 GB cards, NVLink bridges, a card in a
slow slot), the testbed clock, and the machine's firmware and boot: Secure Boot on, with or
without the DKMS signing key enrolled as a MOK (the live NVRAM is ``firmware/`` next to this
file, see ``rigfleet_testbed.firmware``), and the cgroup hierarchy it boots (2, Debian's
default; 1 with systemd.unified_cgroup_hierarchy=0)::

    profile = hardware_profile("host1", cards=1, memory_mib=20480)
    profile = hardware_profile("host2", card_pcie={1: (3, 4)})   # card 1 at x4 gen3
    profile = hardware_profile("host1", secure_boot=True, mok_enrolled=False)
    parse_override("host2:gpu1_pcie_gen_max=3,gpu1_pcie_width_max=4,sim_speedup=1")

``sim_speedup`` is how much faster than real time the serving simulator runs (its decode and
prefill pacing divide by it; 1 = the modelled real-rig figures). ``testbed up`` writes
``DEFAULT_SIM_SPEEDUP`` unless told otherwise, so a gate's worth of traffic stays seconds.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

RTX_3090 = "NVIDIA GeForce RTX 3090"
# ~3500 tok/s for the int8 stack, close to the simulator's old fixed 4000 tok/s: the e2e suite
# keeps its duration. Use 1 (per host or for the fleet) to measure real-rig figures.
DEFAULT_SIM_SPEEDUP = 40.0
PCIE_GENS = (1, 2, 3, 4, 5)
PCIE_WIDTHS = (1, 2, 4, 8, 16)


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
    pcie_gen_max: int = 4,
    pcie_width_max: int = 16,
    card_pcie: dict[int, tuple[int, int]] | None = None,
    sim_speedup: float | None = None,
    secure_boot: bool = False,
    mok_enrolled: bool = False,
    cgroup: int = 2,
) -> dict[str, Any]:
    """The hardware of one simulated host: by default two RTX 3090s over PCIe x16 gen4, UEFI
    with Secure Boot off, booting the unified cgroup hierarchy.

    + pcie_gen_max, pcie_width_max: the link every slot gives its card
    + card_pcie: per card index, ``(gen, width)`` overriding that
    + sim_speedup: the testbed clock (omitted: the simulator runs in real time)
    + secure_boot, mok_enrolled: the firmware's Secure Boot state and the DKMS key's enrolment
    + cgroup: 2 (unified) or 1 (legacy hierarchy)
    """
    if cards < 1:
        raise ValueError(f"cards must be at least 1, got {cards}")
    if cgroup not in (1, 2):
        raise ValueError(f"cgroup must be 1 or 2, got {cgroup}")
    if mok_enrolled and not secure_boot:
        raise ValueError("mok_enrolled=1 needs secure_boot=1")
    links = {i: (pcie_gen_max, pcie_width_max) for i in range(cards)}
    for idx, link in (card_pcie or {}).items():
        if idx not in links:
            raise ValueError(f"{host}: card_pcie: no card {idx} (cards 0..{cards - 1})")
        links[idx] = link
    for idx, (gen, width) in links.items():
        if gen not in PCIE_GENS or width not in PCIE_WIDTHS:
            raise ValueError(f"{host}: card {idx}: PCIe gen {gen} x{width}; allowed gen "
                             f"{PCIE_GENS}, width {PCIE_WIDTHS}")
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
            "pcie_gen_max": links[i][0],
            "pcie_width_max": links[i][1],
        }
        for i in range(cards)
    ]
    out: dict[str, Any] = {"driver_branch_supported": ["580", "595", "620"], "nvlink": nvlink,
                           "gpus": gpus, "cgroup_version": cgroup,
                           "secure_boot": {"enabled": secure_boot, "mok_enrolled": mok_enrolled}}
    if sim_speedup is not None:
        if not sim_speedup > 0:
            raise ValueError(f"{host}: sim_speedup must be above 0, got {sim_speedup}")
        out["sim_speedup"] = sim_speedup
    return out


_INT_KEYS = ("cards", "memory_mib", "power_default_w", "power_min_w", "power_max_w",
             "pcie_gen_max", "pcie_width_max", "cgroup")
_FLAGS = ("nvlink", "secure_boot", "mok_enrolled")
_CARD_KEY = re.compile(r"gpu(\d+)_(pcie_gen_max|pcie_width_max)$")
_KEYS_HELP = ", ".join((*_INT_KEYS, *_FLAGS, "gpu<N>_pcie_gen_max", "gpu<N>_pcie_width_max",
                        "sim_speedup"))


def parse_override(spec: str) -> dict[str, Any]:
    """Parse a ``--hardware host2:cards=1,memory_mib=20480,nvlink=1`` override value.

    Per-card links: ``gpu1_pcie_gen_max=3,gpu1_pcie_width_max=4`` (card 1 at x4 gen3); the
    result then carries ``card_pcie={1: (3, 4)}`` for :func:`hardware_profile`.
    """
    card_links: dict[int, dict[str, int]] = {}
    try:
        host, _, rest = spec.partition(":")
        options: dict[str, Any] = {"host": host}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            card = _CARD_KEY.match(key)
            if key in _FLAGS:
                if value.lower() not in ("1", "true", "yes", "0", "false", "no"):
                    raise ValueError(f"{key}={value!r} is not 1/0")
                options[key] = value.lower() in ("1", "true", "yes")
            elif key in _INT_KEYS:
                options[key] = int(value)
            elif key == "sim_speedup":
                options[key] = float(value)
            elif card:
                card_links.setdefault(int(card.group(1)), {})[card.group(2)] = int(value)
            else:
                raise ValueError(f"unknown key {key!r}")
        hardware_profile(host or "check", **{k: v for k, v in options.items() if k != "host"})
    except ValueError as exc:
        raise ValueError(
            f"bad hardware override {spec!r} ({exc}); expected HOST:key=value,... with keys "
            + _KEYS_HELP
        ) from None
    if not host:
        raise ValueError(f"bad hardware override {spec!r}: missing host name before ':'")
    if card_links:
        gen, width = options.get("pcie_gen_max", 4), options.get("pcie_width_max", 16)
        options["card_pcie"] = {i: (v.get("pcie_gen_max", gen), v.get("pcie_width_max", width))
                                for i, v in sorted(card_links.items())}
    return options


def render(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=2, sort_keys=True) + "\n"
