"""NVIDIA Container Toolkit: pinned packages, Docker's ``nvidia`` runtime, verified."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation

from rigfleet.commands import nvidia as nvidia_commands
from rigfleet.facts import DockerDaemonJson, DockerRuntimes, read_fact
from rigfleet.packages import TOOLKIT_PACKAGES
from roles import maintenance
from roles.docker import add_apt_repo
from roles.ops import apt_packages, check, on_change
from roles.preflight import HostContext


@operation()
def nvidia_runtime():
    """``nvidia-ctk runtime configure`` when daemon.json lacks ``runtimes.nvidia`` (one that is
    not JSON failed the host in ``roles.docker`` first)."""
    runtimes = read_fact(DockerDaemonJson).config.get("runtimes")
    if isinstance(runtimes, dict) and "nvidia" in runtimes:
        host.noop("daemon.json already has runtimes.nvidia")
        return
    yield nvidia_commands.CTK_CONFIGURE_DOCKER


def verify_runtime() -> str | None:
    """At execution time: ``docker info`` lists the ``nvidia`` runtime."""
    if "nvidia" not in (runtimes := read_fact(DockerRuntimes)):
        return f"docker info lists runtimes {runtimes or 'none'}; the nvidia runtime is missing"
    return None


@deploy("NVIDIA Container Toolkit")
def container_toolkit(ctx: HostContext) -> None:
    add_apt_repo("NVIDIA container toolkit repository", ctx.apt_repo("nvidia-container-toolkit"))
    version = ctx.want.pins.toolkit_version
    apt_packages(name=f"Install NVIDIA Container Toolkit {version}, held",
                 packages=[f"{p}={version}" for p in TOOLKIT_PACKAGES], hold=True)
    runtime = nvidia_runtime(name="Register the nvidia runtime with Docker")
    # nvidia-ctk adds only "runtimes", which dockerd reloads: a serving host's stack is not
    # disturbed. A bare host restarts (nothing runs there; dockerd reads the whole file).
    action = "reload" if maintenance.serves(ctx) else "restart"
    on_change(name=f"{action.capitalize()} Docker (nvidia runtime added)",
              commands=[f"systemctl {action} docker"], gates=[runtime],
              reason="runtime already registered")
    check(name="Verify docker info lists the nvidia runtime", verify=verify_runtime,
          what="runtime verification")
