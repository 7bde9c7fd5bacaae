"""Stand-in ``nvidia-container-runtime-hook``: the OCI prestart hook giving a container its GPUs.

Docker registers its ``nvidia`` device driver when this program is on PATH and, for a container
started with ``--gpus`` (or compose GPU reservations), has runc call it as
``nvidia-container-runtime-hook prestart`` with the container state JSON on stdin (pid, bundle).
Like the real hook (through ``nvidia-container-cli``) it reads ``NVIDIA_VISIBLE_DEVICES`` from
the bundle's config.json, fails when the driver is not loaded, and otherwise enters the
container's mount namespace (``nsenter --target PID --mount``) before pivot_root and bind-mounts
the driver into the rootfs: here ``/run/nvidia-sim`` (the simulated GPUs, read-write so serving
processes can record allocations) and, with the ``utility`` capability, ``nvidia-smi`` read-only.
It also creates the device nodes (``/dev/nvidiactl``, ``/dev/nvidia-uvm{,-tools}``, one
``/dev/nvidia<N>`` per requested GPU) and allows them in the container's device cgroup itself, as
nvidia-container-cli does on cgroup v1: behind runc's back, so systemd does not know of them
(``devnodes``; NVIDIA/nvidia-container-toolkit#48). What it allowed, and whether systemd would
own this container's cgroup on the simulated host, goes to ``/run/nvidia-sim/grants/<id>.json``.

Failures print ``nvidia-container-cli: ...`` on stderr and exit 1; Docker then refuses to start
the container with that text in its error, as with the real toolkit.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

if __package__:
    from . import devnodes
    from . import simstate as sim
else:  # inside the zipapp on a simulated host
    import devnodes  # type: ignore[no-redef]
    import simstate as sim  # type: ignore[no-redef]

CLI = "nvidia-container-cli"
CONTAINER_SIM_DIR = "/run/nvidia-sim"
DEFAULT_CAPABILITIES = ("utility", "compute")

Runner = Callable[[list[str]], None]


class HookError(Exception):
    """Printed as ``nvidia-container-cli: <message>`` and exit 1."""


@dataclass(frozen=True)
class Request:
    """What the container asked for, from its OCI config."""

    pid: int
    rootfs: Path
    devices: str | None  # NVIDIA_VISIBLE_DEVICES; None: not a GPU container
    capabilities: tuple[str, ...]
    container: str = ""
    config: dict[str, Any] = field(default_factory=dict, compare=False)


def _env(config: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in config.get("process", {}).get("env", []) or []:
        key, _, value = item.partition("=")
        env[key] = value
    return env


def read_request(state: dict[str, Any]) -> Request:
    """Container state (stdin) + bundle config.json -> Request."""
    bundle = Path(state.get("bundle") or state.get("bundlePath") or ".")
    try:
        config = json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise HookError(f"failed to load container config: {exc}") from exc
    root = Path(config.get("root", {}).get("path", "rootfs"))
    env = _env(config)
    devices = env.get("NVIDIA_VISIBLE_DEVICES")
    if devices is None and "CUDA_VERSION" in env:
        devices = "all"  # legacy CUDA images get every GPU, as with the real hook
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES", "")
    capabilities = tuple(c.strip() for c in caps.split(",") if c.strip()) or DEFAULT_CAPABILITIES
    return Request(pid=int(state["pid"]), rootfs=root if root.is_absolute() else bundle / root,
                   devices=devices, capabilities=capabilities,
                   container=str(state.get("id") or bundle.name), config=config)


def check_devices(hw: sim.Hardware, devices: str) -> list[int]:
    """Every requested device must exist (an index or a UUID, or 'all'/'none'); their indices."""
    if devices == "all":
        return [g.index for g in hw.gpus]
    if devices == "none":
        return []
    picked: list[int] = []
    for token in (t.strip() for t in devices.split(",") if t.strip()):
        match = [g.index for g in hw.gpus
                 if token == str(g.index) or token.upper() == g.uuid.upper()]
        if not match:
            raise HookError(f"device error: {token}: unknown device")
        picked += [i for i in match if i not in picked]
    return picked


def mount_commands(req: Request, host_sim_dir: Path, smi: Path | None) -> list[list[str]]:
    """The nsenter+mount commands that put the driver into the container's rootfs."""
    enter = ["nsenter", "--target", str(req.pid), "--mount", "--"]
    target = str(req.rootfs) + CONTAINER_SIM_DIR
    cmds = [enter + ["mount", "--bind", str(host_sim_dir), target]]
    if smi is not None and ({"utility", "all"} & set(req.capabilities)):
        smi_target = str(req.rootfs) + "/usr/bin/nvidia-smi"
        cmds += [enter + ["mount", "--bind", str(smi), smi_target],
                 enter + ["mount", "-o", "remount,bind,ro", smi_target]]
    return cmds


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        kind = "mount error" if "mount" in cmd else "container error"
        raise HookError(f"{kind}: {' '.join(cmd[5:])}: {proc.stderr.strip()}")


def node_commands(req: Request, nodes: list[devnodes.Node]) -> list[list[str]]:
    """mknod of each device node missing from the container's /dev (its mount namespace, before
    pivot_root; a node CDI or ``--device`` put there already is left as it is)."""
    enter = ["nsenter", "--target", str(req.pid), "--mount", "--"]
    cmds = []
    for n in nodes:
        target = shlex.quote(f"{req.rootfs}/dev/{n.name}")
        cmds.append(enter + ["sh", "-c", f"[ -e {target} ] || "
                             f"mknod -m 666 {target} c {n.major} {n.minor}"])
    return cmds


def grant_devices(req: Request, hw: sim.Hardware, indices: list[int], paths: sim.SimPaths,
                  run: Runner, proc: Path = Path("/proc"),
                  cgroup_root: Path = devnodes.CGROUP_ROOT) -> devnodes.Grant | None:
    """Nodes in the container plus allow rules in its device cgroup; the grant is recorded.

    Nothing happens when the host has no nodes (driver loaded without them) or the container
    has no v1 devices cgroup (the hook would need BPF there; the twin then keeps the older,
    node-less behaviour).
    """
    nodes = [n for n in devnodes.nodes_for(hw, indices) if (paths.dev / n.name).exists()]
    cgroup = devnodes.devices_cgroup(req.pid, proc, cgroup_root)
    if not nodes or cgroup is None:
        return None
    for cmd in node_commands(req, nodes):
        run(cmd)
    for node in nodes:
        try:
            (cgroup / "devices.allow").write_text(node.rule + "\n")
        except OSError as exc:
            raise HookError(f"container error: cgroup: {node.rule}: {exc.strerror}") from exc
    systemd = devnodes.systemd_managed(hw, devnodes.dockerd_cgroup_driver(
        proc, snapshots=paths.dockerd))
    kept = devnodes.spec_rules(
        req.config, paths.dev,
        skip_missing=devnodes.skips_missing_char_paths(devnodes.runc_version()),
    ) if systemd else []
    grant = devnodes.Grant(container=req.container, pid=req.pid, cgroup=str(cgroup),
                           systemd=systemd, rules=[n.rule for n in nodes], kept=kept)
    devnodes.write_grant(paths, grant)
    return grant


def prestart(state: dict[str, Any], paths: sim.SimPaths, run: Runner = _run,
             smi: Path | None = None) -> None:
    req = read_request(state)
    if req.devices in (None, "", "void"):
        return  # not a GPU container: nothing to do
    if sim.loaded_version(paths) is None:
        raise HookError("initialization error: nvml error: driver not loaded")
    try:
        hw = sim.load_hardware(paths.hardware)
    except sim.SimError as exc:
        raise HookError("initialization error: nvml error: unknown error") from exc
    indices = check_devices(hw, req.devices)
    # Mount points must exist in the rootfs; creating them from here (the host's namespace)
    # is what libnvidia-container does too, before entering the container's namespace.
    (req.rootfs / CONTAINER_SIM_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    if smi is not None:
        target = req.rootfs / "usr/bin/nvidia-smi"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.touch(mode=0o755)
    for cmd in mount_commands(req, paths.root, smi):
        run(cmd)
    grant_devices(req, hw, indices, paths, run)


def main(argv: Sequence[str] | None = None, *, stdin: TextIO | None = None,
         err: TextIO | None = None) -> int:
    args = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    stream_err = err or sys.stderr
    if not args or args[0] != "prestart":
        return 0  # poststart/poststop: nothing to undo, the namespace goes with the container
    try:
        state = json.load(stdin or sys.stdin)
        found = shutil.which("nvidia-smi")
        prestart(state, sim.SimPaths.from_env(), smi=Path(found).resolve() if found else None)
    except HookError as exc:
        print(f"{CLI}: {exc}", file=stream_err)
        return 1
    except (ValueError, KeyError) as exc:
        print(f"{CLI}: invalid container state: {exc}", file=stream_err)
        return 1
    return 0
