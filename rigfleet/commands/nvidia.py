"""NVIDIA commands: GPU queries, power limits, the container toolkit's docker hook.

Example::

    from rigfleet.commands import nvidia

    nvidia.set_power_limit(1, 250)   # '/usr/bin/nvidia-smi -i 1 -pl 250'
"""

from __future__ import annotations

import shlex

NVIDIA_SMI = "/usr/bin/nvidia-smi"

# Marks "nvidia-smi failed" in fact output (no driver loaded, no binary).
SMI_FAILED = "RIGFLEET-NVIDIA-SMI-FAILED"

# NVIDIA's .run installer installs this next to the driver; no distribution package ships it.
RUN_UNINSTALLER = "/usr/bin/nvidia-uninstall"

# DKMS signs the modules it builds with this key (made on first use, DER certificate
# mok.pub next to mok.key; dell/dkms, Debian 12+). Under Secure Boot the kernel loads them
# only once the certificate is enrolled as a machine owner key (MOK).
DKMS_MOK_CERT = "/var/lib/dkms/mok.pub"

# What the kernel and modprobe say when Secure Boot refuses a module: modprobe's strerror of
# EKEYREJECTED, and the kernel's "Loading of <reason> is rejected" (kernel/module/signing.c:
# "unsigned module", "module with unavailable key", ...).
KEY_REJECTED_PATTERN = "Key was rejected by service|Loading of .* is rejected"


def gpu_query(query_command: str) -> str:
    """Fact command: run the nvidia-smi query, or print the failure marker and its reason."""
    return (
        f"out=$({query_command} 2>&1) && printf '%s\\n' \"$out\" "
        f"|| {{ echo {SMI_FAILED}; printf '%s\\n' \"$out\" | tail -n 3; }}"
    )


def platform_report() -> str:
    """Fact command: ``key=value`` lines on init, architecture, Secure Boot and the driver's
    origin (``rigfleet.facts.Platform`` parses them). Every part succeeds when what it asks
    about is absent (no mokutil, no EFI, no nvidia-smi).

    + ``pid1``: PID 1's name (``systemd``); ``systemd``: ``yes`` when systemd booted the host
      (``/run/systemd/system`` exists, as sd_booted() checks)
    + ``arch``: ``dpkg --print-architecture``
    + ``sb``: ``mokutil --sb-state``'s lines (``SecureBoot enabled``/``disabled``, or why it
      cannot tell: "EFI variables are not supported on this system"); absent without mokutil
    + ``mok``: ``mokutil --test-key`` of DKMS's certificate, when the certificate exists
    + ``run_uninstaller``: ``yes`` when NVIDIA's .run uninstaller is there
    + ``smi``/``smi_owner``: nvidia-smi's path and the dpkg package that owns it (empty: none)
    """
    mok = shlex.quote(DKMS_MOK_CERT)
    return (
        'echo "pid1=$(cat /proc/1/comm 2>/dev/null)"; '
        "if [ -d /run/systemd/system ]; then echo systemd=yes; else echo systemd=no; fi; "
        'echo "arch=$(dpkg --print-architecture 2>/dev/null)"; '
        "if command -v mokutil >/dev/null 2>&1; then "
        "mokutil --sb-state 2>&1 | sed 's/^/sb=/'; "
        f"if [ -f {mok} ]; then echo mok_cert={mok}; "
        f"mokutil --test-key {mok} 2>&1 | sed 's/^/mok=/'; fi; "
        f"else [ -f {mok} ] && echo mok_cert={mok}; echo mokutil=missing; fi; "
        f"if [ -e {RUN_UNINSTALLER} ]; then echo run_uninstaller=yes; fi; "
        "if p=$(command -v nvidia-smi 2>/dev/null); then echo \"smi=$p\"; "
        "echo \"smi_owner=$(dpkg -S \"$(readlink -f \"$p\")\" \"$p\" 2>/dev/null "
        "| grep -v '^diversion' | head -n 1 | cut -d: -f1)\"; fi; true"
    )


# When this system started, in epoch seconds, where that is not the kernel's boot: a host that
# is a container running systemd (LXC, the testbed's) restarts without the kernel, so the
# kernel's boot id (``journalctl -b``) spans all its restarts. PID 1 starting over a minute
# after the kernel (/proc/1/stat field 22, in clock ticks) tells; on a machine it prints
# nothing (``-b`` is then exact, and immune to the clock being stepped after boot).
SYSTEM_START = ("awk -v hz=\"$(getconf CLK_TCK)\" 'FNR == NR { if ($1 == \"btime\") b = $2; "
                "next } $22 / hz > 60 { printf \"%d\", b + $22 / hz }' /proc/stat /proc/1/stat")


def module_rejections() -> str:
    """Fact command: the first lines of this boot's journal (or the kernel log) saying that
    Secure Boot refused a module; nothing when there are none. On a container host "this
    boot" starts when its PID 1 did (``SYSTEM_START``), so a rejection before the key was
    enrolled and the host restarted is not counted again."""
    pattern = shlex.quote(KEY_REJECTED_PATTERN)
    return (
        f"since=$({SYSTEM_START} 2>/dev/null); "
        f"{{ journalctl -b -q --no-pager ${{since:+--since @$since}} 2>/dev/null "
        f"|| dmesg 2>/dev/null; }} | grep -E {pattern} | head -n 3; true"
    )


def mok_enrol_steps(cert: str = DKMS_MOK_CERT) -> str:
    """How a person enrols DKMS's signing key (shim's MokManager asks at the next boot)."""
    return (
        f"  1. on the host: sudo mokutil --import {cert}   (choose a one-time password)\n"
        "  2. reboot it with a screen and keyboard attached; when the blue MOK manager asks, "
        "choose Enroll MOK, Continue, Yes, type the one-time password, then Reboot\n"
        "  3. run the deploy again (it will not reboot for you while the key is not "
        "enrolled: nobody would be at the console to confirm)\n"
        "  (or turn Secure Boot off in the firmware setup)"
    )


def set_power_limit(index: int, watts: int) -> str:
    """``nvidia-smi -i N -pl W``: what the power-caps unit runs for one card."""
    return f"{NVIDIA_SMI} -i {int(index)} -pl {int(watts)}"


def ctk_configure_docker() -> str:
    """Register the ``nvidia`` runtime in ``/etc/docker/daemon.json`` (the toolkit's way)."""
    return "nvidia-ctk runtime configure --runtime=docker"
