"""What each simulated host is: its OS, its administrator account and its hardware.

``rigfleet testbed up`` options, checked before anything is built::

    --os host3=debian12         Debian 12 (bookworm) instead of 13 (trixie)
    --sudo-user host2           log in as ``rig`` (key auth, passwordless sudo), not root
    --hardware host1:secure_boot=1

    specs = host_specs(3, hardware=[parse_override("host1:secure_boot=1")],
                       oses=[parse_os("host3=debian12")], sudo=["host2"])
    specs[2].os.codename        # 'bookworm'
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rigfleet_testbed import hardware, layout
from rigfleet_testbed.layout import HostOS, HostSlot

# Bump when what a host container is made of changes in a way that needs a new container.
CONFIG_VERSION = "2"


@dataclass(frozen=True)
class HostSpec:
    """One host of the fleet as ``up`` will make it."""

    slot: HostSlot
    os: HostOS
    sudo: bool
    profile: dict[str, Any]

    @property
    def name(self) -> str:
        return self.slot.name

    @property
    def ssh_user(self) -> str:
        return layout.SUDO_USER if self.sudo else "root"

    def config_hash(self, image_id: str, owner: str) -> str:
        """Changes whenever the container must be made anew (a new machine). ``owner`` names
        the control side it was made for (state directory and SSH key): a container left by
        another checkout, or from before the state directory was wiped, is a different
        machine, not one to log into with a key it never got."""
        return hashed({"v": CONFIG_VERSION, "image": image_id, "os": self.os.name,
                       "sudo": self.sudo, "hardware": self.profile, "owner": owner})

    def metadata(self) -> dict[str, Any]:
        """What tests read from ``.testbed/hosts/<host>/host.json``."""
        return {"name": self.name, "os": self.os.name, "codename": self.os.codename,
                "ssh_user": self.ssh_user, "sudo": self.sudo}


def hashed(what: dict[str, Any]) -> str:
    """A short hash of a container's make-up (its config label)."""
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def parse_os(spec: str) -> tuple[str, HostOS]:
    """``host3=debian12`` -> ("host3", HOST_OSES["debian12"])."""
    host, eq, name = spec.partition("=")
    if not eq or not host.strip():
        raise ValueError(f"--os {spec!r}: expected HOST=OS, e.g. host3=debian12")
    os_ = layout.HOST_OSES.get(name.strip())
    if os_ is None:
        raise ValueError(f"--os {spec!r}: unknown OS {name.strip()!r}; allowed: "
                         + ", ".join(layout.HOST_OSES))
    return host.strip(), os_


def _check_names(option: str, names: Iterable[str], slots: list[HostSlot]) -> None:
    known = {s.name for s in slots}
    for name in names:
        if name not in known:
            raise ValueError(f"{option} {name!r}: no such host (hosts: "
                             f"{', '.join(sorted(known, key=lambda n: int(n[4:])))})")


def host_specs(count: int, hardware_overrides: Iterable[dict[str, Any]] = (),
               oses: Iterable[tuple[str, HostOS]] = (),
               sudo: Iterable[str] = (),
               sim_speedup: float | None = hardware.DEFAULT_SIM_SPEEDUP) -> list[HostSpec]:
    """The fleet's hosts with every option applied (``sim_speedup``: the serving simulators'
    clock on every host, a host's own override wins); a bad host name is a ValueError."""
    slots = [HostSlot(i) for i in range(1, count + 1)]
    overrides = {o["host"]: o for o in hardware_overrides}
    os_by_host = dict(oses)
    sudo_hosts = set(sudo)
    _check_names("--hardware", overrides, slots)
    _check_names("--os", os_by_host, slots)
    _check_names("--sudo-user", sudo_hosts, slots)
    specs = []
    for slot in slots:
        opts = {"sim_speedup": sim_speedup,
                **{k: v for k, v in overrides.get(slot.name, {}).items() if k != "host"}}
        specs.append(HostSpec(slot, os_by_host.get(slot.name, layout.DEFAULT_OS),
                              slot.name in sudo_hosts,
                              hardware.hardware_profile(slot.name, **opts)))
    return specs
