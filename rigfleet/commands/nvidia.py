"""NVIDIA commands and paths: power limits, Secure Boot (the facts read it), the docker hook."""

from __future__ import annotations

# Only NVIDIA's .run installer installs this.
RUN_UNINSTALLER = "/usr/bin/nvidia-uninstall"

# DKMS signs its modules with this key; Secure Boot loads them once it is enrolled (MOK).
DKMS_MOK_CERT = "/var/lib/dkms/mok.pub"

# Registers the ``nvidia`` runtime in ``/etc/docker/daemon.json`` (the toolkit's way).
CTK_CONFIGURE_DOCKER = "nvidia-ctk runtime configure --runtime=docker"

# When a container host's systemd started (epoch seconds; PID 1 over a minute after the
# kernel): its restarts keep the kernel's boot id. Prints nothing on a machine.
SYSTEM_START = ("awk -v hz=\"$(getconf CLK_TCK)\" 'FNR == NR { if ($1 == \"btime\") b = $2; "
                "next } $22 / hz > 60 { printf \"%d\", b + $22 / hz }' /proc/stat /proc/1/stat")

# This boot's log lines of Secure Boot refusing a kernel module (modprobe's and the kernel's).
MODULE_REJECTIONS = (f"since=$({SYSTEM_START} 2>/dev/null); {{ journalctl -b -q --no-pager "
                     "${since:+--since @$since} 2>/dev/null || dmesg 2>/dev/null; } | grep -E "
                     "'Key was rejected by service|Loading of .* is rejected' | head -n 3; true")

# The Platform fact: key=value lines on init, arch, Secure Boot, driver origin; tools may be absent.
PLATFORM_REPORT = ('echo "pid1=$(cat /proc/1/comm 2>/dev/null)"; '
                   "if [ -d /run/systemd/system ]; then echo systemd=yes; else echo systemd=no; "
                   'fi; echo "arch=$(dpkg --print-architecture 2>/dev/null)"; '
                   "if command -v mokutil >/dev/null 2>&1; then "
                   "mokutil --sb-state 2>&1 | sed 's/^/sb=/'; "
                   f"if [ -f {DKMS_MOK_CERT} ]; then echo mok_cert={DKMS_MOK_CERT}; "
                   f"mokutil --test-key {DKMS_MOK_CERT} 2>&1 | sed 's/^/mok=/'; fi; "
                   f"else [ -f {DKMS_MOK_CERT} ] && echo mok_cert={DKMS_MOK_CERT}; "
                   "echo mokutil=missing; fi; "
                   f"if [ -e {RUN_UNINSTALLER} ]; then echo run_uninstaller=yes; fi; "
                   "if p=$(command -v nvidia-smi 2>/dev/null); then echo \"smi=$p\"; "
                   "echo \"smi_owner=$(dpkg -S \"$(readlink -f \"$p\")\" \"$p\" 2>/dev/null "
                   "| grep -v '^diversion' | head -n 1 | cut -d: -f1)\"; fi; true")


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
    return f"/usr/bin/nvidia-smi -i {int(index)} -pl {int(watts)}"
