"""NVIDIA driver: the pinned branch, open modules, held, loaded (rebooting only when needed),
verified (docs/converge.md: "NVIDIA driver", "Packages, holds and reboots")."""

from __future__ import annotations

import io
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta

from rigfleet.catalog import StackSpec
from rigfleet.commands import apt as apt_commands
from rigfleet.facts import DebPackage, DpkgState, GpuQuery, read_fact
from rigfleet.hostdata import check_gpus
from rigfleet.packages import OsInfo, driver_packages, version_prefix
from roles import maintenance
from roles.docker import add_apt_repo
from roles.ops import DeployError, apt_packages, changed, check, executing, root_put
from roles.preflight import HostContext, blocked_by_secure_boot, failing_command, loaded_as_pinned

PREFERENCES_FILE = f"{apt_commands.PREFERENCES_DIR}/rigfleet-nvidia-driver"

# Every package name NVIDIA's CUDA repository uses for driver parts (the toolkit's 1.x
# versions never match a "580.*" pin, so the toolkit is unaffected).
DRIVER_PACKAGE_GLOBS = ("*nvidia*", "libcuda*", "libnvcuvid*", "libnvidia*", "firmware-nvidia*")

# A marker in /run (a tmpfs) proves a reboot by its absence; pyinfra's server.reboot compares
# /proc/uptime, which in a container is the outer kernel's and never drops.
BOOT_MARKER = "/run/rigfleet/boot-marker"
REBOOT_DELAY_S = 10.0
REBOOT_INTERVAL_S = 2.0
REBOOT_TIMEOUT_S = 900.0
REBOOT_STEP = "reboot to load the NVIDIA driver"


# Debian kernel releases: 6.1.0-40-amd64, 6.12.48+deb13-amd64, 6.12.12+bpo-cloud-amd64.
_DEBIAN_KERNEL = re.compile(
    r"\d+\.\d+(?:\.\d+)?(?:-\d+)?(?:\+[a-z0-9.~]+)?-(?P<flavour>[a-z0-9][a-z0-9-]*)")


def debian_kernel_flavour(kernel: str, arch: str = "") -> str | None:
    """``6.12.48+deb13-cloud-amd64`` -> ``cloud-amd64``; else ``arch``, else None."""
    m = _DEBIAN_KERNEL.fullmatch(kernel)
    return m.group("flavour") if m else (arch or None)


def kernel_packages(os: OsInfo, branch: str, dpkg: dict[str, DebPackage],
                    arch: str = "") -> tuple[str, ...]:
    """Packages that tie the driver to the kernel: Ubuntu's prebuilt modules; Debian's headers for
    DKMS (when the running kernel is a Debian package: not in a container) and ``mokutil``."""
    image = dpkg.get(f"linux-image-{os.kernel}")
    own_kernel = bool(os.kernel) and image is not None and image.installed
    if os.id == "ubuntu":
        prefix = f"linux-modules-nvidia-{branch}-server-open-"
        # generic, or generic-hwe-<ver>: the flavour of the kernel metapackage installed
        hwe = (n.removeprefix("linux-image-") for n, p in sorted(dpkg.items())
               if p.installed and n.startswith("linux-image-generic-hwe-"))
        out = [prefix + next(hwe, "generic")]
        if own_kernel:
            out.append(prefix + os.kernel)
        return tuple(out)
    out = []
    if own_kernel:
        out.append(f"linux-headers-{os.kernel}")
        if flavour := debian_kernel_flavour(os.kernel, arch):
            out.append(f"linux-headers-{flavour}")
    out.append("mokutil")
    return tuple(out)


def _wait_for_reboot(state: Any, host: Any, token: str, delay: float, timeout: float) -> None:
    """Reconnect until the host answers without this boot's marker (it has restarted)."""
    time.sleep(delay)
    host.disconnect()
    deadline = time.monotonic() + timeout
    while True:
        host.connect(show_errors=False)
        if host.connected:
            ok, output = host.run_shell_command(StringCommand(f"cat {BOOT_MARKER} 2>/dev/null "
                                                              "|| true"))
            if ok and token not in output.stdout:
                return
            host.disconnect()
        if time.monotonic() > deadline:
            raise DeployError(f"{host.name}: did not come back from reboot within {timeout:g}s")
        time.sleep(REBOOT_INTERVAL_S)


@operation(is_idempotent=False)
def reboot_for_driver(gates: Sequence[OperationMeta], ctx: HostContext):
    """Reboot (in a window) when the driver changed or is not loaded; Secure Boot may forbid it."""
    pins = ctx.want.pins
    gpu = read_fact(GpuQuery)
    if gpu.loaded and not changed(gates) and loaded_as_pinned(
            gpu.driver_version, pins.driver_branch, pins.driver_version):
        host.noop(f"driver {gpu.driver_version} loaded, packages unchanged")
        return
    if executing() and (blocked := blocked_by_secure_boot(ctx.os)):
        yield failing_command(blocked)  # the steps, and no reboot
        return
    yield from maintenance.enter(ctx, REBOOT_STEP, reboot_grace_s=REBOOT_TIMEOUT_S
                                 + maintenance.REBOOT_GRACE_MARGIN_S)
    token = uuid.uuid4().hex
    yield f"mkdir -p /run/rigfleet && echo {token} > {BOOT_MARKER}"
    # Detached, so the SSH session ends cleanly before the machine goes down.
    yield "( sleep 2 && (systemctl reboot || reboot) ) </dev/null >/dev/null 2>&1 &"
    yield FunctionCommand(_wait_for_reboot, (token, REBOOT_DELAY_S, REBOOT_TIMEOUT_S), {})
    yield from maintenance.back_from_reboot(ctx)


def verify_driver(branch: str, version: str | None, gpu_count: int, spec: StackSpec,
                  os: OsInfo | None = None) -> str | None:
    """At execution time: nvidia-smi answers as pinned, with every GPU as needed."""
    gpu = read_fact(GpuQuery)
    if not gpu.loaded:
        why = f"nvidia-smi fails after the driver install ({gpu.error or 'no output'})"
        blocked = blocked_by_secure_boot(os) if os is not None else None
        return f"{why}\n{blocked}" if blocked else why
    loaded = gpu.driver_version or ""
    if not loaded.startswith(f"{branch}."):
        return f"driver {loaded!r} is loaded; pinned branch is {branch} (reboot pending?)"
    if version and loaded != version:
        return f"driver {loaded!r} is loaded; pinned version is {version}"
    problems = check_gpus(host.name, gpu_count, spec, gpu.gpus)
    return "; ".join(p.removeprefix(f"{host.name}: ") for p in problems) or None


def _offered_then_window(ctx: HostContext, step: str, prefix: str,
                         inputs: Sequence[str]) -> Iterator[Any]:
    """The install's ``before``: the indexes, whether they offer the pinned driver (NVIDIA's
    debian13 has no 580), then (on a serving host) the download and the window."""
    update, *download = inputs
    offered = []
    if ctx.os.id == "debian":
        pins = ctx.want.pins
        pinned = pins.driver_version or pins.driver_branch
        key = "driver.version" if pins.driver_version else "driver.branch"
        message = (f"{ctx.want.name}: {key}: {pinned} is not in apt_repos.cuda "
                   f"({ctx.apt_repo('cuda').url}); allowed: a driver that repository carries "
                   "(pins file)")
        offered.append(apt_commands.require_candidate("nvidia-driver-cuda", prefix, message))
    return maintenance.enter(ctx, step, [update, *offered, *download], [update, *offered])


@deploy("NVIDIA driver")
def nvidia_driver(ctx: HostContext) -> None:
    branch, version = ctx.want.pins.driver_branch, ctx.want.pins.driver_version
    gpu_count = ctx.want.settings.gpu_count
    if ctx.driver_adopted:  # a .run-installed driver kept (preflight): it must answer as pinned
        check(name=f"Verify the kept driver: branch {branch}, {gpu_count} GPUs",
              verify=lambda: verify_driver(branch, version, gpu_count, ctx.want.spec),
              what="driver verification")
        return
    dpkg = read_fact(DpkgState)  # the kernel flavour does not change during the run
    if ctx.os.id == "debian":
        add_apt_repo("NVIDIA CUDA repository", ctx.apt_repo("cuda"), also=[PREFERENCES_FILE])
        glob = f"{version}-*" if version else f"{branch}.*"
        root_put(name=f"Pin NVIDIA packages to driver {version or branch}",
                  src=io.StringIO(apt_commands.branch_preferences(glob, DRIVER_PACKAGE_GLOBS)),
                  dest=PREFERENCES_FILE)
    # Ubuntu's prebuilt modules are built for one driver version: held with the driver.
    kernel = apt_packages(name="Kernel glue for the NVIDIA module",
                          packages=list(kernel_packages(ctx.os, branch, dpkg, ctx.platform.arch)),
                          hold=ctx.os.id == "ubuntu")
    install_step = f"NVIDIA driver {version or branch} install"
    prefix = version_prefix(branch, version)
    install = apt_packages(
        name=f"Install NVIDIA driver {version or branch} (open modules), held",
        packages=list(driver_packages(ctx.os, branch)), hold=True, version_prefix=prefix,
        before=lambda inputs: _offered_then_window(ctx, install_step, prefix, inputs))
    maintenance.plan_step(ctx, install_step, install, apt=True)
    reboot = reboot_for_driver(name="Reboot to load the NVIDIA driver (only when needed)",
                               gates=[kernel, install], ctx=ctx)
    maintenance.plan_step(ctx, REBOOT_STEP, reboot)
    check(name=f"Verify nvidia-smi: branch {branch}, {gpu_count} GPUs",
          verify=lambda: verify_driver(branch, version, gpu_count, ctx.want.spec, ctx.os),
          what="driver verification")
