"""NVIDIA commands: GPU queries, power limits, the container toolkit's docker hook.

Example::

    from rigfleet.commands import nvidia

    nvidia.set_power_limit(1, 250)   # '/usr/bin/nvidia-smi -i 1 -pl 250'
"""

from __future__ import annotations

NVIDIA_SMI = "/usr/bin/nvidia-smi"

# Marks "nvidia-smi failed" in fact output (no driver loaded, no binary).
SMI_FAILED = "RIGFLEET-NVIDIA-SMI-FAILED"


def gpu_query(query_command: str) -> str:
    """Fact command: run the nvidia-smi query, or print the failure marker and its reason."""
    return (
        f"out=$({query_command} 2>&1) && printf '%s\\n' \"$out\" "
        f"|| {{ echo {SMI_FAILED}; printf '%s\\n' \"$out\" | tail -n 3; }}"
    )


def set_power_limit(index: int, watts: int) -> str:
    """``nvidia-smi -i N -pl W``: what the power-caps unit runs for one card."""
    return f"{NVIDIA_SMI} -i {int(index)} -pl {int(watts)}"


def ctk_configure_docker() -> str:
    """Register the ``nvidia`` runtime in ``/etc/docker/daemon.json`` (the toolkit's way)."""
    return "nvidia-ctk runtime configure --runtime=docker"
