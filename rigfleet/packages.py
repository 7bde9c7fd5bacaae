"""The NVIDIA driver's and container toolkit's package names per OS and pin (roles and check)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OsInfo:
    id: str  # "debian" | "ubuntu"
    version_id: str  # "12", "13", "22.04", "24.04"
    codename: str
    kernel: str  # uname -r


# All four move together; mixing versions breaks the hook (NVIDIA's install guide).
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools", "libnvidia-container1")


def version_prefix(branch: str, version: str | None) -> str:
    """What installed driver package versions must start with: ``580.`` or ``580.105.08``."""
    return version if version else f"{branch}."


def driver_packages(os: OsInfo, branch: str) -> tuple[str, ...]:
    """Driver packages whose version follows the driver (checked against the branch)."""
    if os.id == "ubuntu":  # compute-utils holds nvidia-persistenced there
        return (f"nvidia-driver-{branch}-server-open", f"nvidia-utils-{branch}-server",
                f"nvidia-compute-utils-{branch}-server")
    return ("nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-smi", "nvidia-persistenced")
