"""Stand-in for loading the NVIDIA kernel module at boot (``nvidia-sim-kmod load``).

Shipped by the stand-in ``nvidia-kernel-open-dkms`` package as
``/usr/lib/nvidia-sim/nvidia-sim-kmod`` and run by ``nvidia-sim-kmod.service`` early at boot
(before ``sysinit.target``, where udev would load the real module). The package enables that unit
but never starts it: as with a freshly DKMS-built module, the driver loads after a reboot. A
module that is already loaded stays as it is (``modprobe`` of a loaded module does nothing), so an
upgrade without a reboot leaves the old version loaded and user space mismatched.

Loading means: with Secure Boot on, the module's signing key must be enrolled (below); the
hardware must be there and supported by this branch; then
``/run/nvidia-sim/{hardware.json,state.json,alloc/,version}`` are created and ``loaded`` is
written last, holding the version, so readers never see a half-loaded driver. The device nodes
and their /dev/char links follow, as nvidia-modprobe makes them (``devnodes``).

Secure Boot: the package's postinst stands in for DKMS, which signs the module it builds with
``/var/lib/dkms/mok.key`` (made on first use, certificate ``mok.pub``, CN "DKMS module signing
key"; dell/dkms). It records the certificate's SHA-1 in ``/var/lib/dkms/nvidia/<version>/
module-signer``. When the firmware says ``SecureBoot`` is on, the kernel accepts the module
only if that key is in the firmware's MOK list (``firmware/MokListRT``); otherwise it prints
"Loading of module with unavailable key is rejected" and modprobe fails with "Key was rejected
by service" (EKEYREJECTED, as seen on Debian with a DKMS module and an unenrolled key)::

    nvidia-sim-kmod load [--hardware /etc/nvidia-sim/hardware.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__:
    from . import devnodes
    from . import simstate as sim
else:  # inside the zipapp on a simulated host
    import devnodes  # type: ignore[no-redef]
    import simstate as sim  # type: ignore[no-redef]

MODULE_SIGNER = "module-signer"


def proc_version_text(version: str) -> str:
    """What /proc/driver/nvidia/version says for the open kernel module."""
    return (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
        "(rigfleet-testbed@)  \n"
        "GCC version:  gcc version 14.2.0 (Debian 14.2.0-19) \n"
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def signature_refusal(paths: sim.SimPaths, version: str) -> str | None:
    """Why a Secure Boot kernel refuses the module (None: SB off, or the key is enrolled)."""
    if _read(paths.firmware / "SecureBoot") != "1":
        return None
    signer = _read(paths.dkms / "nvidia" / version / MODULE_SIGNER)
    enrolled = {p.stem for p in (paths.firmware / "MokListRT").glob("*.der")}
    if signer and signer in enrolled:
        return None
    return "module with unavailable key" if signer else "unsigned module"


def load(paths: sim.SimPaths, source: Path, version: str, err=sys.stderr) -> int:
    """Load the simulated module; 0 when loaded (or already loaded), 1 when it cannot load."""
    current = sim.loaded_version(paths)
    if current is not None:
        print(f"nvidia-sim-kmod: module nvidia {current} already loaded", file=err)
        return 0
    refusal = signature_refusal(paths, version)
    if refusal is not None:
        # module_sig_check() under Secure Boot: -EKEYREJECTED, strerror "Key was rejected by
        # service"; the kernel logs the reason first.
        print(f"Loading of {refusal} is rejected", file=err)
        print("modprobe: ERROR: could not insert 'nvidia': Key was rejected by service",
              file=err)
        return 1
    try:
        hw = sim.load_hardware(source)
    except sim.SimError as exc:
        # What modprobe says on a machine without an NVIDIA GPU.
        print("modprobe: ERROR: could not insert 'nvidia': No such device", file=err)
        print(f"nvidia-sim-kmod: {exc}", file=err)
        return 1
    branch = sim.branch_of(version)
    if hw.driver_branch_supported and branch not in hw.driver_branch_supported:
        for g in hw.gpus:
            print(f"NVRM: The NVIDIA GPU {g.pci_bus_id[4:].lower()} installed in this system is "
                  f"not supported by the NVIDIA {version} driver release.", file=err)
        print("modprobe: ERROR: could not insert 'nvidia': No such device", file=err)
        return 1
    paths.root.mkdir(parents=True, exist_ok=True, mode=0o755)
    shutil.copyfile(source, paths.root / "hardware.json")
    os.chmod(paths.root / "hardware.json", 0o644)
    with sim.locked_state(paths, hw) as state:
        state.clear()
        state.update(sim.default_state(hw))  # module load resets power limits and persistence
    # Serving containers (any uid) create their allocation files here.
    paths.alloc_dir.mkdir(exist_ok=True)
    os.chmod(paths.alloc_dir, 0o1777)
    paths.proc_version.write_text(proc_version_text(version))
    tmp = paths.loaded.with_name(".loaded.tmp")
    tmp.write_text(version + "\n")
    os.replace(tmp, paths.loaded)
    print(f"nvidia-sim-kmod: loaded nvidia {version} for {len(hw.gpus)} GPU(s)", file=err)
    devnodes.create_host_nodes(paths.dev, hw, lambda m: print(m, file=err))
    return 0


def main(argv: Sequence[str] | None = None, *, version: str) -> int:
    """``version`` is the module version baked in at package build (e.g. 580.105.08)."""
    parser = argparse.ArgumentParser(prog="nvidia-sim-kmod")
    parser.add_argument("action", choices=["load", "status"])
    parser.add_argument("--hardware", default=sim.HARDWARE_SOURCE,
                        help="the machine's cards (default: %(default)s)")
    args = parser.parse_args(argv)
    paths = sim.SimPaths.from_env()
    if args.action == "status":
        current = sim.loaded_version(paths)
        print(f"loaded {current}" if current else "not loaded")
        return 0 if current else 3
    return load(paths, Path(args.hardware), version)
