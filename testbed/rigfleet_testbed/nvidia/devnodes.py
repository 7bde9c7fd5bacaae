"""GPU device nodes of the simulated driver, and GPU access through the device cgroup.

The twin's "GPU access" is the kernel's own device-cgroup check, so a container loses it the way
real ones do (NVIDIA/nvidia-container-toolkit#48). Facts this follows:

- The NVIDIA character devices: major 195, ``nvidia<N>`` minor N, ``nvidiactl`` 255,
  ``nvidia-modeset`` 254; ``nvidia-uvm``/``nvidia-uvm-tools`` have a dynamic major (509 here,
  as on the host in nvidia-container-toolkit#1744), minors 0 and 1. nvidia-modprobe creates them
  with mode 0666 and, since the 470.199.02/525/535 drivers of mid-2023, also the ``/dev/char/M:m``
  symlinks runc looks for (release notes quoted in NixOS/nixpkgs#244170; runc#3708).
- The device cgroup decides at open(): EPERM when the container's cgroup does not allow the
  device ("cat /dev/nvidia0: Operation not permitted", Datura-ai/lium-io#1007). No driver stands
  behind the twin's nodes, so an allowed open fails with ENXIO: that is "allowed" here. An open
  file stays usable after a rule is removed; only new opens fail.
- ``docker run --gpus`` (and the runtime's legacy mode) has the prestart hook create the nodes in
  the container and allow them in its device cgroup itself, behind runc's back; runc tells
  systemd only about the devices in the OCI spec (``DeviceAllow=`` of the ``docker-<id>.scope``,
  as shown in nvidia-container-toolkit#1744). When systemd manages the container's cgroup, a
  ``systemctl daemon-reload`` re-applies that ``DeviceAllow=`` list and the hook's rules are gone:
  NVML then says "Failed to initialize NVML: Unknown Error" (#48, #251, #1227; NVIDIA Container
  Toolkit troubleshooting, "Containers losing access to GPUs").
- systemd manages it when Docker uses the systemd cgroup driver: Docker's default on cgroup v2
  (what Debian 12/13 boot with), cgroupfs on v1; ``exec-opts: ["native.cgroupdriver=..."]``
  overrides it (NVIDIA's first workaround is ``native.cgroupdriver=cgroupfs``).
- Devices that are in the OCI spec (CDI injection, ``--device /dev/nvidia0``) are in
  ``DeviceAllow=`` and survive, except that runc 1.1.3-1.1.6 leave out a device whose
  ``/dev/char/M:m`` (and ``/sys/dev/char/M:m``) path does not exist (runc CHANGELOG, 1.1.7).

The testbed's own machine boots cgroup v1 and its nested Docker really uses cgroupfs; the twin
models the host it stands for: :func:`systemd_managed` decides from the simulated machine's
``cgroup_version`` (hardware.json) and the cgroup driver the running dockerd was configured with.
The systemd side (re-applying ``DeviceAllow=`` at daemon-reload) is :mod:`reload_generator`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__:
    from . import simstate as sim
else:  # inside a zipapp on a simulated host
    import simstate as sim  # type: ignore[no-redef]

NVIDIA_MAJOR = 195
CTL_MINOR = 255
UVM_MAJOR = 509
NODE_MODE = 0o666
NVML_UNKNOWN = "Failed to initialize NVML: Unknown Error\n"
DOCKER_PID_FILES = ("/run/docker.pid", "/var/run/docker.pid")
DOCKER_CONFIG = "/etc/docker/daemon.json"
CGROUP_ROOT = Path("/sys/fs/cgroup")

Log = Callable[[str], None]


@dataclass(frozen=True)
class Node:
    """One character device: its name under /dev and its numbers."""

    name: str
    major: int
    minor: int

    @property
    def rule(self) -> str:
        """The device-cgroup v1 rule nvidia-container-cli writes for it."""
        return f"c {self.major}:{self.minor} rw"

    @property
    def char_link(self) -> str:
        return f"char/{self.major}:{self.minor}"


CONTROL_NODES = (
    Node("nvidiactl", NVIDIA_MAJOR, CTL_MINOR),
    Node("nvidia-uvm", UVM_MAJOR, 0),
    Node("nvidia-uvm-tools", UVM_MAJOR, 1),
)


def gpu_node(index: int) -> Node:
    return Node(f"nvidia{index}", NVIDIA_MAJOR, index)


def nodes_for(hw: sim.Hardware, indices: Iterable[int] | None = None) -> list[Node]:
    """Control nodes plus one node per GPU (all GPUs, or those with the given indices)."""
    wanted = None if indices is None else set(indices)
    return list(CONTROL_NODES) + [gpu_node(g.index) for g in hw.gpus
                                  if wanted is None or g.index in wanted]


def create_host_nodes(dev: Path, hw: sim.Hardware, log: Log) -> int:
    """What nvidia-modprobe does once the module is in: nodes (0666) and their /dev/char links.

    Returns how many nodes exist afterwards; without CAP_MKNOD (a unit test as a user) none are
    made and the driver still "loads", as a module whose nodes were never created.
    """
    made = 0
    for node in nodes_for(hw):
        path = dev / node.name
        try:
            if not path.exists():
                dev.mkdir(parents=True, exist_ok=True)
                os.mknod(path, stat.S_IFCHR | NODE_MODE, os.makedev(node.major, node.minor))
            os.chmod(path, NODE_MODE)
            link = dev / node.char_link
            link.parent.mkdir(exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(f"../{node.name}")
            made += 1
        except PermissionError as exc:
            log(f"nvidia-modprobe: failed to create {path}: {exc.strerror}")
            break
    return made


def access(dev: Path, name: str = "nvidiactl") -> str:
    """Can this process open a device node? ``ok``, ``denied`` (EPERM) or ``absent``.

    ``absent`` is a process that never got the nodes (an older twin, a unit test): it is left
    to the other checks (``/run/nvidia-sim/loaded``), as before device nodes existed.
    """
    try:
        fd = os.open(dev / name, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return "denied" if exc.errno in (errno.EPERM, errno.EACCES) else "ok"
    os.close(fd)
    return "ok"


def denied_gpus(dev: Path, hw: sim.Hardware) -> list[sim.Gpu]:
    """GPUs whose ``/dev/nvidia<N>`` this process may not open (their handle is lost)."""
    return [g for g in hw.gpus if access(dev, gpu_node(g.index).name) == "denied"]


# --- who manages the container's cgroup ------------------------------------------------------


def _dockerd_pid(pid_files: Sequence[str]) -> int | None:
    for name in pid_files:
        try:
            return int(Path(name).read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def _start_ticks(proc: Path, pid: int) -> int | None:
    """When a process started, in clock ticks after boot: /proc/<pid>/stat field 22."""
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _start_time(proc: Path, ticks: int) -> float | None:
    """Wall-clock time of ``ticks`` after boot, to 10 ms: now minus /proc/uptime (seconds since
    boot, two decimals) plus the ticks. (/proc/stat's btime is whole seconds: a daemon.json
    written in the second dockerd restarted would look newer than dockerd.)"""
    try:
        uptime = float((proc / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def _driver_opt(opts: Iterable[str]) -> str | None:
    found = None
    for opt in opts:
        key, _, value = str(opt).partition("=")
        if key.strip() == "native.cgroupdriver":
            found = value.strip()
    return found


def dockerd_cgroup_driver(proc: Path = Path("/proc"),
                          pid_files: Sequence[str] = DOCKER_PID_FILES,
                          snapshots: Path | None = None) -> str | None:
    """The cgroup driver the running dockerd was told to use, or None (its default, or no dockerd).

    From its command line (``--exec-opt native.cgroupdriver=...``) or the config file it read
    at start (``--config-file``, default /etc/docker/daemon.json, key ``exec-opts``). exec-opts
    are read only at start (a reload does not apply them): the first look at a dockerd whose
    file is older than the process records what the file said in ``snapshots``
    (``<pid>-<start ticks>.json``), and later looks use that record whatever the file says
    now; a file changed after dockerd started, with no record, is not in effect (None).
    """
    pid = _dockerd_pid(pid_files)
    if pid is None:
        return None
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    flags, config = [], DOCKER_CONFIG
    for i, arg in enumerate(argv):
        for name in ("--exec-opt", "--config-file"):
            value = None
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
            if value is not None:
                if name == "--exec-opt":
                    flags.append(value)
                else:
                    config = value
    if (flag := _driver_opt(flags)) is not None:
        return flag
    ticks = _start_ticks(proc, pid)
    record = snapshots / f"{pid}-{ticks}.json" if snapshots is not None and ticks else None
    if record is not None:
        try:
            return _driver_opt(json.loads(record.read_text())["exec-opts"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no record yet (or a torn one): read the file
    started = _start_time(proc, ticks) if ticks is not None else None
    path = Path(config)
    try:
        if path.exists() and (started is None or path.stat().st_mtime > started):
            return None
        opts = (json.loads(path.read_text() or "{}").get("exec-opts") or []
                if path.exists() else [])
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(opts, list):
        return None
    if record is not None and record.parent.parent.is_dir():  # a simulated host's /run/nvidia-sim
        with contextlib.suppress(OSError):  # best effort: the next look records it
            _write_json(record, {"pid": pid, "start_ticks": ticks, "config": config,
                                 "exec-opts": [str(o) for o in opts]})
    return _driver_opt(opts)


def remember_dockerd_config(paths: sim.SimPaths) -> None:
    """Record the running dockerd's exec-opts before its config file changes (see
    :func:`dockerd_cgroup_driver`); ``nvidia-ctk runtime configure`` calls it before it writes."""
    dockerd_cgroup_driver(snapshots=paths.dockerd)


def systemd_managed(hw: sim.Hardware, driver: str | None) -> bool:
    """Does systemd own the container's cgroup (so daemon-reload rewrites its device policy)?"""
    if driver is None:
        driver = "systemd" if hw.cgroup_version >= 2 else "cgroupfs"
    return driver == "systemd"


# --- what runc registered with systemd ---------------------------------------------------------


def runc_version(runner: Callable[[list[str]], str] | None = None) -> tuple[int, int, int] | None:
    """``runc --version`` -> (1, 1, 5); None when it cannot be run."""
    def _default(cmd: list[str]) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout

    try:
        out = (runner or _default)(["runc", "--version"])
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"runc version (\d+)\.(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def skips_missing_char_paths(version: tuple[int, int, int] | None) -> bool:
    """runc 1.1.3 to 1.1.6 drop DeviceAllow entries without a /dev/char path (fixed in 1.1.7)."""
    return version is not None and (1, 1, 3) <= version <= (1, 1, 6)


def spec_rules(config: dict[str, Any], dev: Path = Path("/dev"),
               sys_dev: Path = Path("/sys/dev"), skip_missing: bool = False) -> list[str]:
    """Allow rules of the OCI spec's ``linux.resources.devices`` (what runc hands to systemd).

    Only specific char devices are listed (wildcards and the deny-all entry are not GPU
    grants); ``skip_missing`` applies runc 1.1.3-1.1.6's rule.
    """
    rules = []
    for d in ((config.get("linux") or {}).get("resources") or {}).get("devices") or []:
        if not isinstance(d, dict) or not d.get("allow") or d.get("type") != "c":
            continue
        major, minor = d.get("major"), d.get("minor")
        if not isinstance(major, int) or not isinstance(minor, int) or minor < 0 or major < 0:
            continue
        if skip_missing and not (dev / f"char/{major}:{minor}").exists() \
                and not (sys_dev / f"char/{major}:{minor}").exists():
            continue
        access_ = "".join(c for c in "rw" if c in str(d.get("access", "rwm")))
        rule = f"c {major}:{minor} {access_}"
        if rule not in rules:
            rules.append(rule)
    return rules


# --- grants ------------------------------------------------------------------------------------


@dataclass
class Grant:
    """Device rules the hook added to one container's cgroup, and which systemd knows about."""

    container: str
    pid: int
    cgroup: str
    systemd: bool
    rules: list[str]
    kept: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)

    def at_risk(self) -> list[str]:
        """Rules a daemon-reload drops: added behind systemd's back, on a systemd scope."""
        if not self.systemd:
            return []
        return [r for r in self.rules if r not in self.kept and r not in self.revoked]


def devices_cgroup(pid: int, proc: Path = Path("/proc"),
                   root: Path = CGROUP_ROOT) -> Path | None:
    """The v1 ``devices`` cgroup directory of a process, or None (cgroup v2 only, no process)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "devices" in parts[1].split(","):
            path = root / "devices" / parts[2].lstrip("/")
            return path if path.is_dir() else None
    return None


def grant_path(paths: sim.SimPaths, container: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", container)[:128] or "unnamed"
    return paths.grants / f"{safe}.json"


def _write_json(target: Path, data: Any) -> Path:
    """Write a record whole (temp file, rename): readers never see half of one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, target)
    return target


def write_grant(paths: sim.SimPaths, grant: Grant) -> Path:
    return _write_json(grant_path(paths, grant.container), asdict(grant))


def read_grants(paths: sim.SimPaths) -> list[tuple[Path, Grant]]:
    found = []
    for path in sorted(paths.grants.glob("*.json")) if paths.grants.is_dir() else []:
        try:
            found.append((path, Grant(**json.loads(path.read_text()))))
        except (OSError, ValueError, TypeError):
            continue
    return found


def reapply_device_policy(paths: sim.SimPaths, proc: Path = Path("/proc"),
                          log: Log = lambda _m: None) -> int:
    """What systemd's daemon-reload does to every GPU container: returns the rules it dropped.

    Systemd-managed scopes get their ``DeviceAllow=`` list back, so each rule the hook added
    that is not in it is denied again (cgroup v1 ``devices.deny``). Grants of containers that
    are gone are removed.
    """
    dropped = 0
    for path, grant in read_grants(paths):
        cgroup = Path(grant.cgroup)
        if not (proc / str(grant.pid)).exists() or not cgroup.is_dir():
            path.unlink(missing_ok=True)
            continue
        lost = grant.at_risk()
        for rule in lost:
            try:
                (cgroup / "devices.deny").write_text(rule + "\n")
            except OSError as exc:
                log(f"{grant.container[:12]}: cannot write {rule!r} to devices.deny: {exc}")
                continue
            grant.revoked.append(rule)
            dropped += 1
        if lost:
            write_grant(paths, grant)
            log(f"container {grant.container[:12]}: device policy re-applied, dropped "
                + ", ".join(lost))
    return dropped
