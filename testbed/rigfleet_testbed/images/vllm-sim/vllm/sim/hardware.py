"""Simulated GPUs: what is visible, and who holds their memory.

Contract (docs/architecture.md, "Simulated GPU hardware"):

- GPUs are visible when ``$NVIDIA_SIM_ROOT/loaded`` exists (the simulated kernel module is
  loaded) and a hardware description is found: ``$NVIDIA_SIM_ROOT/hardware.json``, else
  ``/etc/nvidia-sim/hardware.json`` (or ``$NVIDIA_SIM_HARDWARE``).
- Free memory = total - reserved (``memory_reserved_mib``, default 280 MiB, as the
  nvidia-smi stand-in reports) - live allocations.
- Memory held by serving processes lives in ``$NVIDIA_SIM_ROOT/alloc/<name>.json``
  (``{"gpus": {"0": MiB}, "pid", "container", "since"}``). The holder keeps an exclusive
  ``flock`` on its file for its whole life, so a file whose lock can be taken belongs to a
  dead process (SIGKILL, OOM kill, container removed): it is stale, ignored and removed.
- Check-and-allocate happens under ``$NVIDIA_SIM_ROOT/alloc.lock`` so two servers starting at
  once cannot both see the same free memory.
- Device nodes, when the container has them (``/dev/nvidiactl``, ``/dev/nvidia<N>``): CUDA sees
  the GPUs whose nodes are there (the container runtime's selection, by the hook or by CDI) and
  none at all when the device cgroup refuses ``/dev/nvidiactl`` (EPERM at open, as after a
  systemd daemon-reload dropped the hook's device rules, nvidia-container-toolkit#48). No driver
  stands behind the twin's nodes, so an allowed open fails with ENXIO.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = "/run/nvidia-sim"
FALLBACK_HARDWARE = "/etc/nvidia-sim/hardware.json"
MIB = 1024 * 1024
GIB_MIB = 1024.0


def sim_root() -> Path:
    return Path(os.environ.get("NVIDIA_SIM_ROOT") or DEFAULT_ROOT)


@dataclass(frozen=True)
class Gpu:
    """One visible GPU; ``index`` is the physical index (alloc files use it)."""

    index: int
    name: str
    uuid: str
    memory_total_mib: int
    # Held by the driver/firmware, never available to CUDA (nvidia-smi's "Reserved").
    memory_reserved_mib: int = 280


class NoGpuError(RuntimeError):
    """No CUDA device is visible to this process."""


@dataclass
class FreeMemoryError(Exception):
    """Not enough free memory on one device for the requested utilization."""

    device: int  # logical cuda:N
    free_mib: float
    total_mib: float
    utilization: float
    requested_mib: float

    def message(self) -> str:
        # vLLM's wording (vllm/v1/worker/utils.py request_memory).
        return (
            f"Free memory on device cuda:{self.device} ({self.free_mib / GIB_MIB:.2f}/"
            f"{self.total_mib / GIB_MIB:.2f} GiB) on startup is less than desired GPU memory "
            f"utilization ({self.utilization}, {self.requested_mib / GIB_MIB:.2f} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes."
        )


def _filter_visible(gpus: list[Gpu], spec: str | None) -> list[Gpu]:
    """Apply a ``CUDA_VISIBLE_DEVICES``-style list (indices or GPU UUIDs)."""
    if spec is None:
        return gpus
    spec = spec.strip()
    if spec.lower() in ("all", ""):
        return gpus if spec else []
    if spec.lower() in ("none", "void", "-1"):
        return []
    out: list[Gpu] = []
    for item in spec.split(","):
        item = item.strip()
        match = [g for g in gpus if str(g.index) == item or g.uuid.upper() == item.upper()]
        if not match:
            break  # CUDA stops at the first invalid entry
        out.extend(m for m in match if m not in out)
    return out


def _device_nodes(dev: Path) -> tuple[str, set[int]]:
    """("absent"|"ok"|"denied", GPU minors with a node) for this process's /dev."""
    try:
        fd = os.open(dev / "nvidiactl", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except FileNotFoundError:
        return "absent", set()
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES):
            return "denied", set()
    minors = set()
    for node in dev.glob("nvidia[0-9]*"):
        try:
            fd = os.open(node, os.O_RDWR | os.O_CLOEXEC)
            os.close(fd)
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EACCES, errno.ENOENT):
                continue  # the device cgroup refuses this GPU: CUDA does not see it
        try:
            minors.add(os.minor(node.stat().st_rdev))
        except OSError:
            continue
    return "ok", minors


def hardware_data(root: Path | None = None) -> dict | None:
    """The hardware description (``hardware.json``) as parsed JSON, or None."""
    root = root or sim_root()
    candidates = [os.environ.get("NVIDIA_SIM_HARDWARE"), str(root / "hardware.json"),
                  FALLBACK_HARDWARE]
    for cand in candidates:
        if not cand:
            continue
        try:
            data = json.loads(Path(cand).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        return data if isinstance(data, dict) else None
    return None


def visible_gpus(root: Path | None = None, dev: Path = Path("/dev")) -> list[Gpu]:
    """GPUs this process can use, in CUDA order; empty when none are visible."""
    root = root or sim_root()
    if not (root / "loaded").exists():
        return []
    nodes, minors = _device_nodes(dev)
    if nodes == "denied":
        return []
    data = hardware_data(root)
    if data is None:
        return []
    gpus = [
        Gpu(index=int(g.get("index", i)), name=str(g.get("name", "NVIDIA GeForce RTX 3090")),
            uuid=str(g.get("uuid", f"GPU-{i}")),
            memory_total_mib=int(g.get("memory_total_mib", 24576)),
            memory_reserved_mib=int(g.get("memory_reserved_mib", 280)))
        for i, g in enumerate(data.get("gpus") or [])
    ]
    # The container runtime's selection: the device nodes it created, or (a twin without
    # nodes) NVIDIA_VISIBLE_DEVICES; CUDA_VISIBLE_DEVICES is the process's own. Both narrow it.
    if nodes == "ok":
        gpus = [g for g in gpus if g.index in minors]
    else:
        gpus = _filter_visible(gpus, os.environ.get("NVIDIA_VISIBLE_DEVICES"))
    return _filter_visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def used_mib(root: Path | None = None, exclude: Path | None = None) -> dict[int, int]:
    """MiB held per physical GPU index by live allocations; stale files are removed.

    Call with ``alloc.lock`` held when the result feeds an allocation decision.
    """
    root = root or sim_root()
    used: dict[int, int] = {}
    alloc_dir = root / "alloc"
    if not alloc_dir.is_dir():
        return used
    for path in sorted(alloc_dir.glob("*.json")):
        if exclude is not None and path == exclude:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # vanished meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # held: live allocation
            else:
                # Nobody holds it: the process died without cleaning up. Ignore and remove
                # (only if the name still points at the file we locked).
                try:
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        path.unlink()
                except OSError:
                    pass
                continue
            try:
                data = json.loads(os.read(fd, 1 << 20).decode("utf-8") or "{}")
            except (OSError, ValueError):
                continue
            for key, mib in (data.get("gpus") or {}).items():
                try:
                    used[int(key)] = used.get(int(key), 0) + int(mib)
                except (TypeError, ValueError):
                    continue
        finally:
            os.close(fd)
    return used


class GpuAllocation:
    """GPU memory held by this process; the flock on the file is the proof of life."""

    def __init__(self, path: Path, fd: int, gpus: dict[int, int]):
        self.path = path
        self._fd: int | None = fd
        self.gpus = gpus

    def release(self) -> None:
        """Give the memory back: remove the file, then drop the lock."""
        if self._fd is None:
            return
        for path in (self.path.with_suffix(".activity"), self.path):
            with contextlib.suppress(OSError):
                path.unlink()  # the activity sidecar first: it means nothing without us
        with contextlib.suppress(OSError):
            os.close(self._fd)  # closing drops the flock
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def allocate(gpus: list[Gpu], utilization: float, root: Path | None = None) -> GpuAllocation:
    """Reserve ``utilization × memory_total`` on each of ``gpus`` or raise FreeMemoryError.

    vLLM checks free memory per device at worker start-up and refuses to start when another
    process holds too much; the reservation then lasts until the process exits.
    """
    root = root or sim_root()
    alloc_dir = root / "alloc"
    alloc_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(root / "alloc.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        used = used_mib(root)
        want: dict[int, int] = {}
        for logical, gpu in enumerate(gpus):
            requested = utilization * gpu.memory_total_mib
            free = gpu.memory_total_mib - gpu.memory_reserved_mib - used.get(gpu.index, 0)
            if free < requested:
                raise FreeMemoryError(device=logical, free_mib=max(free, 0.0),
                                      total_mib=float(gpu.memory_total_mib),
                                      utilization=utilization, requested_mib=requested)
            want[gpu.index] = int(round(requested))
        host = socket.gethostname()
        name = f"vllm-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path = alloc_dir / f"{name}.json"
        # Lock under a name readers do not scan, then rename: a reader that does not take
        # alloc.lock (nvidia-smi) must never catch the file unlocked and call it stale.
        tmp = alloc_dir / f".{name}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        record = {
            "gpus": {str(k): v for k, v in want.items()},
            "pid": os.getpid(),
            "container": host,
            "process_name": "VLLM::EngineCore",
            "since": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        os.write(fd, (json.dumps(record) + "\n").encode("utf-8"))
        os.fsync(fd)
        os.rename(tmp, path)
        return GpuAllocation(path, fd, want)
    finally:
        os.close(lock_fd)


def release_slowly(alloc: GpuAllocation | None, seconds: float) -> None:
    """CUDA teardown is not instant: the memory stays held for a moment after shutdown."""
    if alloc is None or not alloc.held:
        return
    if seconds > 0:
        time.sleep(seconds)
    alloc.release()
