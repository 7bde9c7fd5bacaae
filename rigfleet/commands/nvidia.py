"""NVIDIA commands and paths: power limits, Secure Boot (the facts read it), the docker hook."""

from __future__ import annotations

NVIDIA_SMI = "/usr/bin/nvidia-smi"

# Only NVIDIA's .run installer installs this.
RUN_UNINSTALLER = "/usr/bin/nvidia-uninstall"

# DKMS signs its modules with this key; Secure Boot loads them once it is enrolled (MOK).
DKMS_MOK_CERT = "/var/lib/dkms/mok.pub"

# modprobe's EKEYREJECTED and the kernel's "Loading of <reason> is rejected" (Secure Boot).
KEY_REJECTED_PATTERN = "Key was rejected by service|Loading of .* is rejected"

# When a container host's systemd started (epoch seconds; PID 1 over a minute after the
# kernel): its restarts keep the kernel's boot id. Prints nothing on a machine.
SYSTEM_START = ("awk -v hz=\"$(getconf CLK_TCK)\" 'FNR == NR { if ($1 == \"btime\") b = $2; "
                "next } $22 / hz > 60 { printf \"%d\", b + $22 / hz }' /proc/stat /proc/1/stat")


def mok_enrol_steps(cert: str = DKMS_MOK_CERT) -> str:
    """How a person enrols DKMS's signing key (shim's MokManager asks at the next boot)."""
    return (f"  1. on the host: sudo mokutil --import {cert}   (choose a one-time password)\n"
            "  2. reboot it with a screen and keyboard attached; when the blue MOK manager asks, "
            "choose Enroll MOK, Continue, Yes, type the one-time password, then Reboot\n"
            "  3. run the deploy again (it will not reboot for you while the key is not "
            "enrolled: nobody would be at the console to confirm)\n"
            "  (or turn Secure Boot off in the firmware setup)")


def set_power_limit(index: int, watts: int) -> str:
    """What the power-caps unit runs for one card."""
    return f"{NVIDIA_SMI} -i {int(index)} -pl {int(watts)}"


def ctk_configure_docker() -> str:
    """Register the ``nvidia`` runtime in ``/etc/docker/daemon.json`` (the toolkit's way)."""
    return "nvidia-ctk runtime configure --runtime=docker"
