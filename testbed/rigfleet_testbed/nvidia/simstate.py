"""The simulated NVIDIA driver's state on one host, shared by every stand-in program.

Runs ON the simulated hosts (Debian 13 or 12: python3.13 or 3.11, stdlib only) inside each
stand-in's zipapp, and imports on the control side (3.11) for tests. The layout is the contract in
docs/architecture.md ("Simulated GPU hardware"):

    /etc/nvidia-sim/hardware.json    the cards, bind-mounted read-only by the testbed
    /run/nvidia-sim/loaded           exists while the "kernel module" is loaded: its version
    /run/nvidia-sim/hardware.json    what the module probed at load (a copy of the above)
    /run/nvidia-sim/state.json       power limit and persistence per GPU, under flock(state.lock)
    /run/nvidia-sim/alloc/<n>.json   one per process holding GPU memory, flock'ed by its holder
    /run/nvidia-sim/grants/<id>      device-cgroup grants the runtime hook made (``devnodes``)
    /dev/nvidia{ctl,-uvm,-uvm-tools,0..}  device nodes the "module" creates, /dev/char links
    /etc/nvidia-sim/firmware/        the host's simulated UEFI NVRAM (``firmware``), read-write
    /var/lib/dkms/                   where the DKMS stand-in keeps its signing key (mok.key/.pub)

``NVIDIA_SIM_ROOT`` moves ``/run/nvidia-sim`` and ``NVIDIA_SIM_HARDWARE`` the hardware file that
readers use (tests point both at a temporary directory); with a moved root the device nodes go
to ``<root>/dev`` unless ``NVIDIA_SIM_DEV`` says otherwise, so a test never touches ``/dev``.
``NVIDIA_SIM_FIRMWARE`` and ``NVIDIA_SIM_DKMS`` move the other two::

    paths = SimPaths.from_env()
    hw = load_hardware(paths.hardware)
    with locked_state(paths, hw) as state:
        state[0].power_limit_w = 250.0

Optional hardware keys beyond the contract (all defaulted to an RTX 3090 on PCIe):
``topology`` ("PHB", "NODE", ...) for the GPU-to-GPU link without NVLink; ``sim_speedup``
(the testbed clock, read by the serving simulator); per GPU ``fan_percent``,
``memory_reserved_mib``, ``clocks_max_{graphics,sm,memory,video}_mhz``,
``power_limit_settable`` (false: ``-pl`` is "not supported in current scope", as on laptops),
``pcie_gen_max``/``pcie_width_max`` (the link the slot gives the card: 4/16 by default;
``pcie_gen_gpu_max`` is what the card itself supports, 4 for a 3090).
An allocation file may carry ``"utilization": {"0": 95}`` to report a busy GPU. A holder may
also keep ``alloc/<name>.activity`` next to it (the serving simulator does)::

    {"phase": "decode", "gpus": {"0": {"utilization": 97, "power_demand_w": 220.0}}}

``phase`` idle/prefill/decode; the card then draws min(limit, demand), reports
``sw_power_cap`` when the limit binds, trains its PCIe link up only while working, and idles
in P8. A sidecar without a live holder is ignored and removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_ROOT = "/run/nvidia-sim"
HARDWARE_SOURCE = "/etc/nvidia-sim/hardware.json"
FIRMWARE_DIR = "/etc/nvidia-sim/firmware"
DKMS_DIR = "/var/lib/dkms"

# CUDA version the driver's libcuda reports, per branch (nvidia-smi prints it in its header).
# 595: 13.2 (club-3090's host with 595.58.03). 620's is in none of our sources: "N/A".
CUDA_BY_BRANCH = {
    "535": "12.2", "545": "12.3", "550": "12.4", "555": "12.5", "560": "12.6",
    "565": "12.7", "570": "12.8", "575": "12.9", "580": "13.0", "590": "13.1", "595": "13.2",
}

ARCH_BY_COMPUTE_CAP = {
    "7.5": "Turing", "8.0": "Ampere", "8.6": "Ampere", "8.7": "Ampere", "8.9": "Ada Lovelace",
    "9.0": "Hopper", "10.0": "Blackwell", "12.0": "Blackwell",
}


class SimError(Exception):
    """The simulated hardware or state is unusable (bad JSON, missing keys)."""


@dataclass(frozen=True)
class SimPaths:
    """Where the simulated driver keeps its files."""

    root: Path
    hardware: Path
    dev: Path = Path("/dev")
    firmware: Path = Path(FIRMWARE_DIR)
    dkms: Path = Path(DKMS_DIR)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> SimPaths:
        env = os.environ if environ is None else environ
        root = Path(env.get("NVIDIA_SIM_ROOT") or DEFAULT_ROOT)
        hardware = Path(env.get("NVIDIA_SIM_HARDWARE") or root / "hardware.json")
        moved = root != Path(DEFAULT_ROOT)
        dev = Path(env.get("NVIDIA_SIM_DEV") or (root / "dev" if moved else "/dev"))
        firmware = Path(env.get("NVIDIA_SIM_FIRMWARE") or
                        (root / "firmware" if moved else FIRMWARE_DIR))
        dkms = Path(env.get("NVIDIA_SIM_DKMS") or (root / "dkms" if moved else DKMS_DIR))
        return cls(root=root, hardware=hardware, dev=dev, firmware=firmware, dkms=dkms)

    @property
    def grants(self) -> Path:
        """Device-cgroup grants of running GPU containers (see ``devnodes``)."""
        return self.root / "grants"

    @property
    def dockerd(self) -> Path:
        """What each running dockerd read at start (see ``devnodes.dockerd_cgroup_driver``)."""
        return self.root / "dockerd"

    @property
    def loaded(self) -> Path:
        return self.root / "loaded"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def state_lock(self) -> Path:
        return self.root / "state.lock"

    @property
    def alloc_dir(self) -> Path:
        return self.root / "alloc"

    @property
    def proc_version(self) -> Path:
        """Stand-in for /proc/driver/nvidia/version (a container has no /proc of its own)."""
        return self.root / "version"


@dataclass(frozen=True)
class Gpu:
    """One card as described by hardware.json."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: int
    power_default_w: float
    power_min_w: float
    power_max_w: float
    vbios: str
    compute_cap: str
    fan_percent: int | None = 30
    memory_reserved_mib: int = 280
    clocks_max_graphics_mhz: int = 2100
    clocks_max_sm_mhz: int = 2100
    clocks_max_memory_mhz: int = 9751
    clocks_max_video_mhz: int = 1950
    power_limit_settable: bool = True
    pcie_gen_max: int = 4
    pcie_width_max: int = 16
    pcie_gen_gpu_max: int = 4

    @property
    def architecture(self) -> str:
        return ARCH_BY_COMPUTE_CAP.get(self.compute_cap, "N/A")

    @property
    def brand(self) -> str:
        if "GeForce" in self.name:
            return "GeForce"
        return "NVIDIA RTX" if "RTX" in self.name else "NVIDIA"

    @property
    def bus_number(self) -> int:
        return int(self.pci_bus_id.split(":")[1], 16)


@dataclass(frozen=True)
class Hardware:
    """The cards of one host and how they are linked."""

    gpus: tuple[Gpu, ...]
    nvlink: bool = False
    topology: str = "PHB"
    driver_branch_supported: tuple[str, ...] = ()
    # The cgroup hierarchy the machine boots with: 2 (unified) is what Debian 12/13 boot by
    # default, and there Docker's default cgroup driver is systemd (see devnodes).
    cgroup_version: int = 2


def load_hardware(path: Path) -> Hardware:
    """Read hardware.json; raise SimError naming the file and the problem."""
    try:
        raw = json.loads(Path(path).read_text())
        gpus = tuple(
            Gpu(
                index=int(g["index"]),
                name=str(g["name"]),
                uuid=str(g["uuid"]),
                pci_bus_id=str(g["pci_bus_id"]).upper(),
                memory_total_mib=int(g["memory_total_mib"]),
                power_default_w=float(g["power_default_w"]),
                power_min_w=float(g["power_min_w"]),
                power_max_w=float(g["power_max_w"]),
                vbios=str(g["vbios"]),
                compute_cap=str(g["compute_cap"]),
                **{k: g[k] for k in _OPTIONAL_GPU_KEYS if k in g},
            )
            for g in raw["gpus"]
        )
        return Hardware(
            gpus=tuple(sorted(gpus, key=lambda g: g.index)),
            nvlink=bool(raw.get("nvlink", False)),
            topology=str(raw.get("topology", "PHB")),
            driver_branch_supported=tuple(str(b) for b in raw.get("driver_branch_supported", [])),
            cgroup_version=int(raw.get("cgroup_version", 2)),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SimError(f"{path}: unusable simulated hardware description ({exc!r})") from exc


_OPTIONAL_GPU_KEYS = (
    "fan_percent", "memory_reserved_mib", "clocks_max_graphics_mhz", "clocks_max_sm_mhz",
    "clocks_max_memory_mhz", "clocks_max_video_mhz", "power_limit_settable", "pcie_gen_max",
    "pcie_width_max", "pcie_gen_gpu_max",
)


def loaded_version(paths: SimPaths) -> str | None:
    """The version of the loaded simulated kernel module, or None when it is not loaded."""
    try:
        return paths.loaded.read_text().strip() or None
    except FileNotFoundError:
        return None


def upstream_version(deb_version: str) -> str:
    """'580.105.08-1' -> '580.105.08' (the driver reports its version without the revision)."""
    return deb_version.split(":", 1)[-1].rsplit("-", 1)[0]


def branch_of(version: str) -> str:
    return version.split(".", 1)[0]


def cuda_version(driver_version: str) -> str:
    return CUDA_BY_BRANCH.get(branch_of(driver_version), "N/A")


# --- mutable state ---------------------------------------------------------------------------


@dataclass
class GpuState:
    """What nvidia-smi can change; lost at reboot like the real settings."""

    power_limit_w: float
    persistence: bool = False

    def to_json(self) -> dict[str, Any]:
        limit = self.power_limit_w
        return {"power_limit_w": int(limit) if limit == int(limit) else limit,
                "persistence": self.persistence}


def default_state(hw: Hardware) -> dict[int, GpuState]:
    """State right after the driver loads: default power limits, persistence off."""
    return {g.index: GpuState(power_limit_w=g.power_default_w) for g in hw.gpus}


def _parse_state(text: str, hw: Hardware) -> dict[int, GpuState]:
    state = default_state(hw)
    if not text.strip():
        return state
    raw = json.loads(text).get("gpus", {})
    for key, value in raw.items():
        idx = int(key)
        if idx in state:
            state[idx] = GpuState(
                power_limit_w=float(value.get("power_limit_w", state[idx].power_limit_w)),
                persistence=bool(value.get("persistence", False)),
            )
    return state


def read_state(paths: SimPaths, hw: Hardware) -> dict[int, GpuState]:
    """Current state (defaults for anything not written yet)."""
    try:
        return _parse_state(paths.state.read_text(), hw)
    except FileNotFoundError:
        return default_state(hw)
    except ValueError as exc:
        raise SimError(f"{paths.state}: corrupt simulated GPU state ({exc})") from exc


def write_state(paths: SimPaths, state: dict[int, GpuState]) -> None:
    """Replace state.json atomically (readers never see half a file). Caller holds the lock."""
    body = {"gpus": {str(i): s.to_json() for i, s in sorted(state.items())}}
    _atomic_write(paths.state, json.dumps(body, indent=2, sort_keys=True) + "\n", 0o644)


@contextlib.contextmanager
def locked_state(paths: SimPaths, hw: Hardware) -> Iterator[dict[int, GpuState]]:
    """Read-modify-write the state under flock(state.lock); written back on clean exit."""
    paths.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.state_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        state = read_state(paths, hw)
        yield state
        write_state(paths, state)
    finally:
        os.close(fd)  # closing drops the flock


def _atomic_write(path: Path, text: str, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# --- memory allocations ----------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """GPU memory held by one live process (one file under alloc/)."""

    name: str
    gpus: dict[int, int]
    pid: int | None = None
    container: str | None = None
    process_name: str | None = None
    utilization: dict[int, int] = field(default_factory=dict)
    phase: str | None = None  # from the activity sidecar: idle, prefill or decode
    demand_w: dict[int, float] = field(default_factory=dict)


def _holder_alive(fd: int) -> bool:
    """True while another process holds the file's flock (the contract's liveness signal)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    return False


def _activity(path: Path) -> tuple[str | None, dict[int, int], dict[int, float]]:
    """A holder's activity sidecar: (phase, utilization, power demand); None without one."""
    try:
        raw = json.loads(path.read_text())
        gpus = raw.get("gpus") or {}
        util = {int(k): int(v.get("utilization", 0)) for k, v in gpus.items()}
        demand = {int(k): float(v.get("power_demand_w", 0.0)) for k, v in gpus.items()}
        return str(raw.get("phase") or "idle"), util, demand
    except (OSError, ValueError, TypeError, AttributeError):
        return None, {}, {}


def _remove_orphan_activity(paths: SimPaths) -> None:
    """Sidecars whose allocation file is gone (a holder that died mid-update)."""
    try:
        sidecars = list(paths.alloc_dir.glob("*.activity"))
    except OSError:
        return
    for side in sidecars:
        if not side.with_suffix(".json").exists():
            with contextlib.suppress(OSError):
                side.unlink()


def live_allocations(paths: SimPaths) -> list[Allocation]:
    """Allocations whose holder still runs. Files of dead holders are removed (best effort).

    The holder keeps LOCK_EX on its file for its lifetime, so taking the lock ourselves proves
    it is gone; we unlink while holding the lock, and only if the path still names that file.
    """
    found: list[Allocation] = []
    try:
        entries = sorted(paths.alloc_dir.glob("*.json"))
    except OSError:
        return found
    for path in entries:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # vanished between glob and open
        try:
            if not _holder_alive(fd):
                with contextlib.suppress(OSError):
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        os.unlink(path)
                        path.with_suffix(".activity").unlink()
                continue
            with os.fdopen(os.dup(fd)) as f:
                raw = json.load(f)
            phase, act_util, demand = _activity(path.with_suffix(".activity"))
            util = {int(k): int(v) for k, v in raw.get("utilization", {}).items()}
            for k, v in act_util.items():
                util[k] = max(util.get(k, 0), v)
            found.append(
                Allocation(
                    name=path.stem,
                    gpus={int(k): int(v) for k, v in raw.get("gpus", {}).items()},
                    pid=int(raw["pid"]) if raw.get("pid") is not None else None,
                    container=raw.get("container"),
                    process_name=raw.get("process_name") or raw.get("name"),
                    utilization=util,
                    phase=phase,
                    demand_w=demand,
                )
            )
        except (ValueError, TypeError, AttributeError):
            continue  # a live holder still writing its file: count it next time
        finally:
            os.close(fd)
    _remove_orphan_activity(paths)
    return found


# --- what the cards report -------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """Everything nvidia-smi prints about one GPU at one moment."""

    gpu: Gpu
    state: GpuState
    memory_used_mib: int
    utilization_pct: int
    processes: tuple[tuple[Allocation, int], ...]  # (holder, MiB on this GPU)

    @property
    def busy(self) -> bool:
        """A process holds memory on this card (a CUDA context exists)."""
        return bool(self.processes)

    @property
    def legacy(self) -> bool:
        """A holder that reports no activity: counted as working whenever it is there."""
        return any(a.phase is None for a, _ in self.processes)

    @property
    def active(self) -> bool:
        """The card is working now (prefill or decode), not just holding a context."""
        return self.legacy or any(a.phase in ("prefill", "decode") for a, _ in self.processes)

    @property
    def demand_w(self) -> float | None:
        """What the work would draw uncapped, as its holders report it (None: unknown)."""
        idx = self.gpu.index
        vals = [a.demand_w.get(idx, 0.0) for a, _ in self.processes
                if a.phase in ("prefill", "decode")]
        return max(vals) if vals else None

    @property
    def power_capped(self) -> bool:
        """The power limit binds: the SW power cap is pulling the clocks down."""
        demand = self.demand_w
        return self.active and demand is not None and demand > self.state.power_limit_w + 0.5

    @property
    def memory_free_mib(self) -> int:
        g = self.gpu
        return max(0, g.memory_total_mib - g.memory_reserved_mib - self.memory_used_mib)

    @property
    def pstate(self) -> str:
        # GeForce cards drop to P8 when idle and run CUDA work in P2.
        return "P2" if self.active else "P8"

    @property
    def power_draw_w(self) -> float:
        limit = self.state.power_limit_w
        idle = round(self.gpu.power_default_w * 0.065, 2)
        if not self.busy:
            return min(idle, limit)
        if self.legacy:
            context = self.gpu.power_default_w * 0.3
            span = max(0.0, limit - context)
            return round(min(limit, context + span * self.utilization_pct / 100), 2)
        if not self.active:
            return min(round(self.gpu.power_default_w * 0.08, 2), limit)
        demand = self.demand_w
        return round(min(limit, demand if demand is not None else limit), 2)

    @property
    def temperature_c(self) -> int:
        if not self.busy or self.legacy:
            return 35 + (8 if self.busy else 0) + self.utilization_pct * 30 // 100
        return 33 + int(self.power_draw_w * 0.13)

    @property
    def clocks_mhz(self) -> dict[str, int]:
        g = self.gpu
        if not self.active:
            return {"graphics": 210, "sm": 210, "memory": 405, "video": 555}
        if self.legacy:
            return {"graphics": int(g.clocks_max_graphics_mhz * 0.8),
                    "sm": int(g.clocks_max_sm_mhz * 0.8),
                    "memory": g.clocks_max_memory_mhz - 250,
                    "video": int(g.clocks_max_video_mhz * 0.8)}
        demand = self.demand_w or self.state.power_limit_w
        ratio = (self.state.power_limit_w / demand) ** 0.5 if self.power_capped else 1.0
        return {"graphics": int(g.clocks_max_graphics_mhz * 0.9 * ratio),
                "sm": int(g.clocks_max_sm_mhz * 0.9 * ratio),
                # Memory stays at its full rate (9501 MHz on a 3090, club-3090 HARDWARE.md).
                "memory": g.clocks_max_memory_mhz - 250,
                "video": int(g.clocks_max_video_mhz * 0.9 * ratio)}

    @property
    def pcie_gen_max(self) -> int:
        return min(self.gpu.pcie_gen_max, self.gpu.pcie_gen_gpu_max)

    @property
    def pcie_gen_current(self) -> int:
        """The link trains down to gen 1 at idle and up to its max under load."""
        return self.pcie_gen_max if self.active else 1

    @property
    def clock_event_reasons(self) -> dict[str, bool]:
        """Active clock event ("throttle") reasons, by nvidia-smi's field suffix."""
        return {
            "gpu_idle": not self.active,
            "applications_clocks_setting": False,
            "sw_power_cap": self.power_capped,
            "hw_slowdown": False,
            "hw_thermal_slowdown": False,
            "hw_power_brake_slowdown": False,
            "sync_boost": False,
            "sw_thermal_slowdown": False,
            "display_clocks_setting": False,
        }

    @property
    def clock_event_mask(self) -> int:
        """NVML's clocksEventReasons bitmask of the active reasons."""
        return sum(bit for name, bit in CLOCK_EVENT_BITS.items()
                   if self.clock_event_reasons[name])


# nvml.h: nvmlClocksEventReason* bits.
CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
    "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}


# Memory a driver context shows on an idle card with no display (nvidia-smi prints "1MiB").
IDLE_USED_MIB = 1


def readings(paths: SimPaths, hw: Hardware) -> list[Reading]:
    """One Reading per GPU, from state and live allocations."""
    state = read_state(paths, hw)
    allocs = live_allocations(paths)
    out = []
    for g in hw.gpus:
        procs = tuple((a, a.gpus[g.index]) for a in allocs if a.gpus.get(g.index, 0) > 0)
        util = max((a.utilization.get(g.index, 0) for a, _ in procs), default=0)
        used = IDLE_USED_MIB + sum(mib for _, mib in procs)
        out.append(Reading(g, state[g.index], used, min(100, max(0, util)), procs))
    return out
