"""Stand-in ``nvidia-smi``: prints what the real one prints, from the simulated driver's state.

Installed as ``/usr/bin/nvidia-smi`` (a zipapp built by ``rigfleet_testbed.packages``) on the
simulated hosts. The formats follow real output of driver 580 (fixtures in
``shared/fixtures/nvidia-smi/``); so do the failures: no driver loaded (exit 9), a driver and
library of different versions after an upgrade without reboot (exit 18), a device cgroup that
no longer allows ``/dev/nvidiactl`` ("Failed to initialize NVML: Unknown Error", exit 255: a
container after a systemd daemon-reload, ``devnodes``), ``-pl`` out of range (exit 2) or without
root (exit 4). Argument errors go to stdout, as real.

Supported: the default table, ``-L``, ``--query-gpu=... --format=csv[,noheader][,nounits]``,
``-i``, ``-pl``, ``-pm``, ``-q [-d TYPES] [-x]``, ``topo -m``, ``--version``, ``-h``,
``--help-query-gpu``. Tests call :func:`main` directly::

    rc = main(["--query-gpu=index,power.limit", "--format=csv"], version="580.105.08")
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO
from xml.sax.saxutils import escape, quoteattr

if __package__:
    from . import devnodes
    from . import simstate as sim
else:  # inside the zipapp on a simulated host
    import devnodes  # type: ignore[no-redef]
    import simstate as sim  # type: ignore[no-redef]

# nvidia-smi return codes (nvidia-smi(1), "RETURN VALUE").
OK, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND = 0, 2, 3, 4, 6
DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH, OTHER_ERROR = 9, 18, 255

NOT_LOADED_TEXT = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
HELP_HINT = "Please run 'nvidia-smi -h' for help."
INVALID_COMBINATION = f"Invalid combination of input arguments. {HELP_HINT}\n"
NO_DEVICES = "No devices were found\n"
NA = "N/A"


class SmiExit(Exception):
    """Stop with ``text`` on stdout and exit code ``code``."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


# --- arguments -------------------------------------------------------------------------------

# option as typed -> (key, takes a value)
_OPTIONS: dict[str, tuple[str, bool]] = {
    "-h": ("help", False), "--help": ("help", False),
    "--version": ("version", False),
    "--help-query-gpu": ("help_query_gpu", False),
    "-L": ("list", False), "--list-gpus": ("list", False),
    "-q": ("query", False), "--query": ("query", False),
    "-d": ("display", True), "--display": ("display", True),
    "-x": ("xml", False), "--xml-format": ("xml", False),
    "-i": ("id", True), "--id": ("id", True),
    "--query-gpu": ("query_gpu", True),
    "--format": ("format", True),
    "-pl": ("power_limit", True), "--power-limit": ("power_limit", True),
    "-pm": ("persistence_mode", True), "--persistence-mode": ("persistence_mode", True),
}

# command -> options valid with it
_ALLOWED: dict[str, set[str]] = {
    "help": {"help"},
    "help_query_gpu": {"help_query_gpu"},
    "version": {"version"},
    "list": {"list", "id"},
    "query_gpu": {"query_gpu", "format", "id"},
    "query": {"query", "display", "xml", "id"},
    "set": {"power_limit", "persistence_mode", "id"},
    "table": {"id"},
}
_COMMAND_OF = {"list": "list", "query_gpu": "query_gpu", "query": "query",
               "power_limit": "set", "persistence_mode": "set"}


@dataclass
class Options:
    command: str = "table"
    values: dict[str, str] = field(default_factory=dict)
    order: list[tuple[str, str]] = field(default_factory=list)  # (key, as typed)
    topo_args: list[str] = field(default_factory=list)


def _err(text: str) -> SmiExit:
    return SmiExit(f"ERROR: {text} {HELP_HINT}\n\n", INVALID_ARGUMENT)


def parse_args(argv: Sequence[str]) -> Options:
    """Parse like nvidia-smi: unknown option, missing value, option not valid for the command."""
    opts = Options()
    if argv and argv[0] == "topo":
        opts.command = "topo"
        opts.topo_args = list(argv[1:])
        return opts
    i = 0
    while i < len(argv):
        arg = argv[i]
        typed, _, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if typed not in _OPTIONS:
            raise _err(f"Option {arg} is not recognized.")
        key, takes_value = _OPTIONS[typed]
        if takes_value:
            if inline:
                value = inline
            elif "=" not in arg and i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise _err(f"Option {typed} is missing its value.")
            opts.values[key] = value
        else:
            opts.values[key] = ""
        opts.order.append((key, typed))
        i += 1
    keys = [k for k, _ in opts.order]
    for special in ("help", "help_query_gpu", "version"):
        if special in keys:
            opts.command = special
            break
    else:
        opts.command = next((_COMMAND_OF[k] for k in keys if k in _COMMAND_OF), "table")
    allowed = _ALLOWED[opts.command]
    for key, typed in opts.order:
        if key not in allowed:
            raise _err(f"Option {typed} is not valid for this command.")
    if opts.command == "query_gpu" and "format" not in opts.values:
        raise SmiExit(INVALID_COMBINATION, INVALID_ARGUMENT)
    return opts


# --- driver context --------------------------------------------------------------------------


@dataclass
class Context:
    """The loaded driver as this nvidia-smi sees it."""

    paths: sim.SimPaths
    hw: sim.Hardware
    driver_version: str
    library_version: str

    @property
    def cuda(self) -> str:
        return sim.cuda_version(self.driver_version)

    def readings(self, ids: str | None = None) -> list[sim.Reading]:
        all_readings = sim.readings(self.paths, self.hw)
        if ids is None:
            return all_readings
        return [all_readings[pos] for pos in select_gpus(self.hw, ids)]


def open_driver(paths: sim.SimPaths, library_version: str | None) -> Context:
    """Talk to the "driver", failing like NVML does when it is absent or of another version."""
    loaded = sim.loaded_version(paths)
    if loaded is None:
        raise SmiExit(NOT_LOADED_TEXT, DRIVER_NOT_LOADED)
    if devnodes.access(paths.dev) == "denied":
        # open(/dev/nvidiactl) -> EPERM from the device cgroup (a container after a systemd
        # daemon-reload, nvidia-container-toolkit#48): NVML's message, exit 255.
        raise SmiExit(devnodes.NVML_UNKNOWN, OTHER_ERROR)
    if library_version and library_version != loaded:
        nvml = library_version.rsplit(".", 1)[0]
        raise SmiExit(
            "Failed to initialize NVML: Driver/library version mismatch\n"
            f"NVML library version: {nvml}\n",
            LIB_RM_VERSION_MISMATCH,
        )
    try:
        hw = sim.load_hardware(paths.hardware)
    except sim.SimError:
        raise SmiExit(NO_DEVICES, NOT_FOUND) from None
    if not hw.gpus:
        raise SmiExit(NO_DEVICES, NOT_FOUND)
    lost = devnodes.denied_gpus(paths.dev, hw)
    if lost:
        # nvmlDeviceGetHandle* needs /dev/nvidia<N> (nvidia-container-toolkit#69's message).
        raise SmiExit("".join(f"Unable to determine the device handle for GPU{g.pci_bus_id[4:]}"
                              ": Unknown Error\n" for g in lost), OTHER_ERROR)
    return Context(paths, hw, loaded, library_version or loaded)


def select_gpus(hw: sim.Hardware, ids: str) -> list[int]:
    """Positions in hw.gpus named by ``-i``: indices, UUIDs or PCI bus ids, comma-separated."""
    picked: list[int] = []
    for token in (t.strip() for t in ids.split(",")):
        pos = None
        for p, g in enumerate(hw.gpus):
            if token.isdigit() and int(token) == g.index or token.upper() in (
                g.uuid.upper(), g.pci_bus_id, g.pci_bus_id[4:]
            ):
                pos = p
        if pos is None:
            raise SmiExit(NO_DEVICES, NOT_FOUND)
        if pos not in picked:
            picked.append(pos)
    return picked


def _is_root() -> bool:
    return os.geteuid() == 0


# --- query-gpu fields ------------------------------------------------------------------------

Value = str | int | float | None  # None prints as [N/A]


@dataclass(frozen=True)
class QueryField:
    name: str
    unit: str | None  # "W", "MiB", "MHz", "%" or None
    get: Callable[[Context, sim.Reading], Value]
    aliases: tuple[str, ...] = ()


_PCI_DEVICE_IDS = {"NVIDIA GeForce RTX 3090": "0x220410DE",
                   "NVIDIA GeForce RTX 3090 Ti": "0x220310DE", "NVIDIA H200": "0x233510DE"}


def _geforce_na(r: sim.Reading, value: Value) -> Value:
    return None if r.gpu.brand == "GeForce" else value


def _mask(bits: int) -> str:
    return f"0x{bits:016X}"


def _active(flag: bool) -> str:
    return "Active" if flag else "Not Active"


def _reason(name: str) -> Callable[[Context, sim.Reading], Value]:
    return lambda c, r: _active(r.clock_event_reasons[name])


def _now_query() -> str:
    t = time.time()
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


FIELDS: tuple[QueryField, ...] = (
    QueryField("timestamp", None, lambda c, r: _now_query()),
    QueryField("driver_version", None, lambda c, r: c.driver_version),
    QueryField("count", None, lambda c, r: len(c.hw.gpus)),
    QueryField("name", None, lambda c, r: r.gpu.name, ("gpu_name",)),
    QueryField("serial", None, lambda c, r: None, ("gpu_serial",)),
    QueryField("uuid", None, lambda c, r: r.gpu.uuid, ("gpu_uuid",)),
    QueryField("pci.bus_id", None, lambda c, r: r.gpu.pci_bus_id, ("gpu_bus_id",)),
    QueryField("pci.domain", None, lambda c, r: "0x" + r.gpu.pci_bus_id.split(":")[0][-4:]),
    QueryField("pci.bus", None, lambda c, r: f"0x{r.gpu.bus_number:02X}"),
    QueryField("pci.device", None, lambda c, r: "0x" + r.gpu.pci_bus_id.split(":")[2][:2]),
    QueryField("pci.device_id", None, lambda c, r: _PCI_DEVICE_IDS.get(r.gpu.name)),
    # The link trains down at idle and up under load: an idle reading says little.
    QueryField("pcie.link.gen.current", None, lambda c, r: r.pcie_gen_current),
    QueryField("pcie.link.gen.gpucurrent", None, lambda c, r: r.pcie_gen_current),
    QueryField("pcie.link.gen.max", None, lambda c, r: r.pcie_gen_max),
    QueryField("pcie.link.gen.gpumax", None, lambda c, r: r.gpu.pcie_gen_gpu_max),
    QueryField("pcie.link.gen.hostmax", None, lambda c, r: r.gpu.pcie_gen_max),
    QueryField("pcie.link.width.current", None, lambda c, r: r.gpu.pcie_width_max),
    QueryField("pcie.link.width.max", None, lambda c, r: r.gpu.pcie_width_max),
    QueryField("index", None, lambda c, r: r.gpu.index),
    QueryField("display_attached", None, lambda c, r: "No"),
    QueryField("display_active", None, lambda c, r: "Disabled"),
    QueryField("persistence_mode", None,
               lambda c, r: "Enabled" if r.state.persistence else "Disabled"),
    QueryField("accounting.mode", None, lambda c, r: "Disabled"),
    QueryField("accounting.buffer_size", None, lambda c, r: 4000),
    QueryField("driver_model.current", None, lambda c, r: None),
    QueryField("driver_model.pending", None, lambda c, r: None),
    QueryField("vbios_version", None, lambda c, r: r.gpu.vbios),
    QueryField("fan.speed", "%", lambda c, r: r.gpu.fan_percent),
    QueryField("pstate", None, lambda c, r: r.pstate),
    QueryField("memory.total", "MiB", lambda c, r: r.gpu.memory_total_mib),
    QueryField("memory.reserved", "MiB", lambda c, r: r.gpu.memory_reserved_mib),
    QueryField("memory.used", "MiB", lambda c, r: r.memory_used_mib),
    QueryField("memory.free", "MiB", lambda c, r: r.memory_free_mib),
    QueryField("compute_mode", None, lambda c, r: "Default"),
    QueryField("compute_cap", None, lambda c, r: r.gpu.compute_cap),
    QueryField("utilization.gpu", "%", lambda c, r: r.utilization_pct),
    QueryField("utilization.memory", "%", lambda c, r: r.utilization_pct * 6 // 10),
    QueryField("utilization.encoder", "%", lambda c, r: 0),
    QueryField("utilization.decoder", "%", lambda c, r: 0),
    QueryField("ecc.mode.current", None, lambda c, r: _geforce_na(r, "Enabled")),
    QueryField("ecc.mode.pending", None, lambda c, r: _geforce_na(r, "Enabled")),
    # A card without ECC (GeForce) answers [N/A] (nvidia-smi -q: "ECC Errors ... N/A"); an ECC
    # card counts since the driver loaded (volatile) and over its life (aggregate).
    *(QueryField(f"ecc.errors.{kind}.{span}.total", None,
                 lambda c, r: _geforce_na(r, 0))
      for kind in ("corrected", "uncorrected") for span in ("volatile", "aggregate")),
    QueryField("temperature.gpu", None, lambda c, r: r.temperature_c),
    QueryField("temperature.memory", None, lambda c, r: None),
    QueryField("power.draw", "W", lambda c, r: r.power_draw_w),
    QueryField("power.draw.average", "W", lambda c, r: r.power_draw_w,
               ("gpu.power.draw.average",)),
    QueryField("power.draw.instant", "W", lambda c, r: r.power_draw_w, ("gpu.power.draw.instant",)),
    QueryField("power.limit", "W", lambda c, r: r.state.power_limit_w,
               ("gpu.power.requested_limit",)),
    QueryField("enforced.power.limit", "W", lambda c, r: r.state.power_limit_w,
               ("gpu.power.current_limit",)),
    QueryField("power.default_limit", "W", lambda c, r: r.gpu.power_default_w,
               ("gpu.power.default_limit",)),
    QueryField("power.min_limit", "W", lambda c, r: r.gpu.power_min_w, ("gpu.power.min_limit",)),
    QueryField("power.max_limit", "W", lambda c, r: r.gpu.power_max_w, ("gpu.power.max_limit",)),
    QueryField("clocks.current.graphics", "MHz", lambda c, r: r.clocks_mhz["graphics"],
               ("clocks.gr",)),
    QueryField("clocks.current.sm", "MHz", lambda c, r: r.clocks_mhz["sm"], ("clocks.sm",)),
    QueryField("clocks.current.memory", "MHz", lambda c, r: r.clocks_mhz["memory"],
               ("clocks.mem",)),
    QueryField("clocks.current.video", "MHz", lambda c, r: r.clocks_mhz["video"],
               ("clocks.video",)),
    QueryField("clocks.applications.graphics", "MHz", lambda c, r: None,
               ("clocks.applications.gr",)),
    QueryField("clocks.applications.memory", "MHz", lambda c, r: None,
               ("clocks.applications.mem",)),
    QueryField("clocks.max.graphics", "MHz", lambda c, r: r.gpu.clocks_max_graphics_mhz,
               ("clocks.max.gr",)),
    QueryField("clocks.max.sm", "MHz", lambda c, r: r.gpu.clocks_max_sm_mhz),
    QueryField("clocks.max.memory", "MHz", lambda c, r: r.gpu.clocks_max_memory_mhz,
               ("clocks.max.mem",)),
    QueryField("mig.mode.current", None, lambda c, r: None),
    QueryField("mig.mode.pending", None, lambda c, r: None),
    QueryField("clocks_event_reasons.supported", None,
               lambda c, r: _mask(sum(sim.CLOCK_EVENT_BITS.values())),
               ("clocks_throttle_reasons.supported",)),
    QueryField("clocks_event_reasons.active", None, lambda c, r: _mask(r.clock_event_mask),
               ("clocks_throttle_reasons.active",)),
    *(QueryField(f"clocks_event_reasons.{name}", None, _reason(name),
                 (f"clocks_throttle_reasons.{name}",))
      for name in sim.CLOCK_EVENT_BITS if name != "display_clocks_setting"),
)
_FIELD_BY_NAME = {n: f for f in FIELDS for n in (f.name, *f.aliases)}


def _fmt_number(value: int | float, unit: str | None) -> str:
    if unit == "W":
        return f"{float(value):.2f}"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def render_query(ctx: Context, readings: list[sim.Reading], query: str, fmt: str) -> str:
    """``--query-gpu`` output: one csv line per GPU, values joined by ', ' (no quoting, as real)."""
    flags = [f.strip() for f in fmt.split(",")]
    if not flags or flags[0] != "csv" or any(f not in ("noheader", "nounits") for f in flags[1:]):
        raise SmiExit(INVALID_COMBINATION, INVALID_ARGUMENT)
    names = [n.strip() for n in query.split(",") if n.strip()]
    fields = []
    for n in names:
        if n not in _FIELD_BY_NAME:
            raise SmiExit(f'Field "{n}" is not a valid field to query.\n\n', INVALID_ARGUMENT)
        fields.append(_FIELD_BY_NAME[n])
    lines = []
    if "noheader" not in flags:
        lines.append(", ".join(f.name + (f" [{f.unit}]" if f.unit else "") for f in fields))
    for r in readings:
        cells = []
        for f in fields:
            v = f.get(ctx, r)
            if v is None:
                cells.append(f"[{NA}]")
            elif isinstance(v, (int, float)):
                num = _fmt_number(v, f.unit)
                cells.append(num if "nounits" in flags or not f.unit else f"{num} {f.unit}")
            else:
                cells.append(str(v))
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


# --- default table ---------------------------------------------------------------------------

_RULE = "+" + "-" * 89 + "+"
_GPU_RULE = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"


def _ctime(t: float) -> str:
    lt = time.localtime(t)
    return time.strftime("%a %b ", lt) + f"{lt.tm_mday:>2}" + time.strftime(" %H:%M:%S %Y", lt)


def _short(name: str, width: int, tail: bool = False) -> str:
    if len(name) <= width:
        return name
    return "..." + name[-(width - 3):] if tail else name[: width - 3] + "..."


def render_table(ctx: Context, readings: list[sim.Reading], now: float) -> str:
    lines = [
        _ctime(now) + "       ",
        _RULE,
        f"| NVIDIA-SMI {ctx.library_version:<23}Driver Version: {ctx.driver_version:<15}"
        f"CUDA Version: {ctx.cuda:<9}|",
        _GPU_RULE,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A "
        "| Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage "
        "| GPU-Util  Compute M. |",
        "|                                         |                        "
        "|               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for r in readings:
        g = r.gpu
        pm = "On" if r.state.persistence else "Off"
        ecc = NA if g.brand == "GeForce" else "0"
        fan = f"{g.fan_percent}%" if g.fan_percent is not None else NA
        lines += [
            f"|{g.index:>4}  {_short(g.name, 27):<31}{pm:<3} |   {g.pci_bus_id} {'Off':>3} |"
            f"{ecc:>21} |",
            f"|{fan:>4}{f'{r.temperature_c}C':>6}{r.pstate:>6}{f'{round(r.power_draw_w)}W':>16} / "
            f"{f'{round(r.state.power_limit_w)}W':>5} |{f'{r.memory_used_mib}MiB':>11} / "
            f"{f'{g.memory_total_mib}MiB':>9} |{f'{r.utilization_pct}%':>8}{'Default':>13} |",
            "|" + " " * 41 + "|" + " " * 24 + "|" + f"{NA:>21} |",
            _GPU_RULE,
        ]
    lines += [
        "",
        _RULE,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        "
        "GPU Memory |",
        "|        ID   ID                                                               "
        "Usage      |",
        "|" + "=" * 89 + "|",
    ]
    procs = [(r.gpu.index, a, mib) for r in readings for a, mib in r.processes]
    if not procs:
        lines.append("|  No running processes found" + " " * 61 + "|")
    for index, a, mib in procs:
        pid = str(a.pid) if a.pid is not None else NA
        lines.append(f"|{index:>5}   {NA:<3}  {NA:<3}{pid:>16}{'C':>7}   "
                     f"{_short(_process_name(a), 32, tail=True):<32}{f'{mib}MiB':>14} |")
    lines.append(_RULE)
    return "\n".join(lines) + "\n"


def _process_name(a: sim.Allocation) -> str:
    return a.process_name or a.container or a.name


# --- -q text and -q -x -----------------------------------------------------------------------

# A -q document: (label, value) where value is text, a nested list, or None (a bare heading).
Node = tuple[str, "str | list[Node] | None"]


def _w(value: float) -> str:
    return f"{value:.2f} W"


def _q_sections(ctx: Context, r: sim.Reading) -> dict[str, list[Node]]:
    """-q sections by display type (-d); "" holds those shown only without -d."""
    g, st = r.gpu, r.state
    clocks = r.clocks_mhz
    draw = r.power_draw_w
    procs: list[Node] = []
    for a, mib in r.processes:
        procs += [
            ("GPU instance ID", NA), ("Compute instance ID", NA),
            ("Process ID", str(a.pid) if a.pid is not None else NA), ("Type", "C"),
            ("Name", _process_name(a)), ("Used GPU Memory", f"{mib} MiB"),
        ]
    why = r.clock_event_reasons
    reasons: list[Node] = [
        (label, _active(why[name])) for label, name in (
            ("Idle", "gpu_idle"), ("Applications Clocks Setting", "applications_clocks_setting"),
            ("SW Power Cap", "sw_power_cap"), ("HW Slowdown", "hw_slowdown"),
            ("HW Thermal Slowdown", "hw_thermal_slowdown"),
            ("HW Power Brake Slowdown", "hw_power_brake_slowdown"), ("Sync Boost", "sync_boost"),
            ("SW Thermal Slowdown", "sw_thermal_slowdown"),
            ("Display Clock Setting", "display_clocks_setting"))
    ]
    gen_now, gen_max, width = str(r.pcie_gen_current), str(r.pcie_gen_max), f"{g.pcie_width_max}x"
    return {
        "": [
            ("Product Name", g.name), ("Product Brand", g.brand),
            ("Product Architecture", g.architecture),
            ("Display Mode", "Requested functionality has been deprecated"),
            ("Display Attached", "No"), ("Display Active", "Disabled"),
            ("Persistence Mode", "Enabled" if st.persistence else "Disabled"),
            ("Addressing Mode", "None"),
            ("MIG Mode", [("Current", NA), ("Pending", NA)]),
            ("Accounting Mode", "Disabled"), ("Accounting Mode Buffer Size", "4000"),
            ("Driver Model", [("Current", NA), ("Pending", NA)]),
            ("Serial Number", NA), ("GPU UUID", g.uuid), ("Minor Number", str(g.index)),
            ("VBIOS Version", g.vbios), ("MultiGPU Board", "No"),
            ("Board ID", f"0x{g.bus_number:x}00"),
            ("GPU Operation Mode", [("Current", NA), ("Pending", NA)]),
            ("GSP Firmware Version", ctx.driver_version),
            ("PCI", [
                ("Bus", f"0x{g.bus_number:02X}"),
                ("Device", "0x" + g.pci_bus_id.split(":")[2][:2]),
                ("Domain", "0x" + g.pci_bus_id.split(":")[0][-4:]),
                ("Device Id", (_PCI_DEVICE_IDS.get(g.name) or NA)),
                ("Bus Id", g.pci_bus_id),
                ("GPU Link Info", [
                    ("PCIe Generation", [("Max", gen_max), ("Current", gen_now),
                                         ("Device Current", gen_now),
                                         ("Device Max", str(g.pcie_gen_gpu_max)),
                                         ("Host Max", str(g.pcie_gen_max))]),
                    ("Link Width", [("Max", width), ("Current", width)]),
                ]),
            ]),
            ("Fan Speed", f"{g.fan_percent} %" if g.fan_percent is not None else NA),
        ],
        "PERFORMANCE": [("Performance State", r.pstate), ("Clocks Event Reasons", reasons)],
        "MEMORY": [
            ("FB Memory Usage", [
                ("Total", f"{g.memory_total_mib} MiB"),
                ("Reserved", f"{g.memory_reserved_mib} MiB"),
                ("Used", f"{r.memory_used_mib} MiB"), ("Free", f"{r.memory_free_mib} MiB"),
            ]),
            ("BAR1 Memory Usage", [("Total", "256 MiB"), ("Used", "1 MiB"), ("Free", "255 MiB")]),
        ],
        "COMPUTE": [("Compute Mode", "Default")],
        "UTILIZATION": [("Utilization", [
            ("GPU", f"{r.utilization_pct} %"), ("Memory", f"{r.utilization_pct * 6 // 10} %"),
            ("Encoder", "0 %"), ("Decoder", "0 %"), ("JPEG", "0 %"), ("OFA", "0 %"),
        ])],
        "ECC": [("ECC Mode", [("Current", NA), ("Pending", NA)])],
        "TEMPERATURE": [("Temperature", [
            ("GPU Current Temp", f"{r.temperature_c} C"), ("GPU T.Limit Temp", NA),
            ("GPU Shutdown Temp", "98 C"), ("GPU Slowdown Temp", "95 C"),
            ("GPU Max Operating Temp", "93 C"), ("GPU Target Temperature", "83 C"),
            ("Memory Current Temp", NA), ("Memory Max Operating Temp", NA),
        ])],
        "POWER": [
            ("GPU Power Readings", [
                ("Average Power Draw", _w(draw)), ("Instantaneous Power Draw", _w(draw)),
                ("Current Power Limit", _w(st.power_limit_w)),
                ("Requested Power Limit", _w(st.power_limit_w)),
                ("Default Power Limit", _w(g.power_default_w)),
                ("Min Power Limit", _w(g.power_min_w)), ("Max Power Limit", _w(g.power_max_w)),
            ]),
            ("Power Samples", [
                ("Duration", "2.37 sec"), ("Number of Samples", "119"),
                ("Max", _w(draw * 1.08)), ("Min", _w(draw * 0.96)), ("Avg", _w(draw)),
            ]),
            # The trailing space after this heading is in real output too.
            ("GPU Memory Power Readings ", [("Average Power Draw", NA),
                                            ("Instantaneous Power Draw", NA)]),
            ("Module Power Readings", [
                (label, NA) for label in (
                    "Average Power Draw", "Instantaneous Power Draw", "Current Power Limit",
                    "Requested Power Limit", "Default Power Limit", "Min Power Limit",
                    "Max Power Limit")
            ]),
        ],
        "CLOCK": [
            ("Clocks", [("Graphics", f"{clocks['graphics']} MHz"), ("SM", f"{clocks['sm']} MHz"),
                        ("Memory", f"{clocks['memory']} MHz"),
                        ("Video", f"{clocks['video']} MHz")]),
            ("Applications Clocks", [("Graphics", NA), ("Memory", NA)]),
            ("Default Applications Clocks", [("Graphics", NA), ("Memory", NA)]),
            ("Max Clocks", [("Graphics", f"{g.clocks_max_graphics_mhz} MHz"),
                            ("SM", f"{g.clocks_max_sm_mhz} MHz"),
                            ("Memory", f"{g.clocks_max_memory_mhz} MHz"),
                            ("Video", f"{g.clocks_max_video_mhz} MHz")]),
            ("Max Customer Boost Clocks", [("Graphics", NA)]),
            ("Clock Policy", [("Auto Boost", NA), ("Auto Boost Default", NA)]),
        ],
        "PIDS": [("Processes", procs if procs else "None")],
    }


# Order of sections in a full -q (the order real nvidia-smi prints them).
_Q_ORDER = ("", "PERFORMANCE", "MEMORY", "COMPUTE", "UTILIZATION", "ECC", "TEMPERATURE", "POWER",
            "CLOCK", "PIDS")
DISPLAY_TYPES = frozenset(_Q_ORDER[1:])


def _render_nodes(nodes: list[Node], depth: int, out: list[str]) -> None:
    pad = "    " * depth
    for label, value in nodes:
        if isinstance(value, list):
            out.append(pad + label)
            _render_nodes(value, depth + 1, out)
        elif value is None:
            out.append(pad + label)
        else:
            out.append(f"{(pad + label):<55}: {value}")


def render_q(ctx: Context, readings: list[sim.Reading], display: str | None, now: float) -> str:
    if display is None:
        types = list(_Q_ORDER)
    else:
        wanted = {t.strip().upper() for t in display.split(",") if t.strip()}
        if not wanted or not wanted <= DISPLAY_TYPES:
            raise SmiExit(INVALID_COMBINATION, INVALID_ARGUMENT)
        types = [t for t in _Q_ORDER if t in wanted]
    out = ["", "==============NVSMI LOG==============", ""]
    _render_nodes([("Timestamp", _ctime(now)), ("Driver Version", ctx.driver_version),
                   ("CUDA Version", ctx.cuda)], 0, out)
    out.append("")
    _render_nodes([("Attached GPUs", str(len(ctx.hw.gpus)))], 0, out)
    for n, r in enumerate(readings):
        if n:
            out.append("")
        out.append(f"GPU {r.gpu.pci_bus_id}")
        sections = _q_sections(ctx, r)
        for t in types:
            _render_nodes(sections[t], 1, out)
    out.append("")
    return "\n".join(out) + "\n"


def _xml_gpu(ctx: Context, r: sim.Reading) -> list[tuple[str, object]]:
    g, st, clocks, draw = r.gpu, r.state, r.clocks_mhz, r.power_draw_w
    procs = [
        ("process_info", [
            ("gpu_instance_id", NA), ("compute_instance_id", NA),
            ("pid", str(a.pid) if a.pid is not None else NA), ("type", "C"),
            ("process_name", _process_name(a)), ("used_memory", f"{mib} MiB"),
        ])
        for a, mib in r.processes
    ]
    return [
        ("product_name", g.name), ("product_brand", g.brand),
        ("product_architecture", g.architecture),
        ("display_mode", "Requested functionality has been deprecated"),
        ("display_attached", "No"), ("display_active", "Disabled"),
        ("persistence_mode", "Enabled" if st.persistence else "Disabled"),
        ("addressing_mode", "None"),
        ("mig_mode", [("current_mig", NA), ("pending_mig", NA)]),
        ("mig_devices", "None"),
        ("accounting_mode", "Disabled"), ("accounting_mode_buffer_size", "4000"),
        ("driver_model", [("current_dm", NA), ("pending_dm", NA)]),
        ("serial", NA), ("uuid", g.uuid), ("minor_number", str(g.index)),
        ("vbios_version", g.vbios), ("multigpu_board", "No"),
        ("board_id", f"0x{g.bus_number:x}00"),
        ("gsp_firmware_version", ctx.driver_version),
        ("pci", [
            ("pci_bus", f"{g.bus_number:02X}"), ("pci_device", g.pci_bus_id.split(":")[2][:2]),
            ("pci_domain", g.pci_bus_id.split(":")[0][-4:]),
            ("pci_device_id", (_PCI_DEVICE_IDS.get(g.name) or NA).removeprefix("0x")),
            ("pci_bus_id", g.pci_bus_id),
            ("pci_gpu_link_info", [
                ("pcie_gen", [("max_link_gen", str(r.pcie_gen_max)),
                              ("current_link_gen", str(r.pcie_gen_current)),
                              ("device_current_link_gen", str(r.pcie_gen_current)),
                              ("max_device_link_gen", str(g.pcie_gen_gpu_max)),
                              ("max_host_link_gen", str(g.pcie_gen_max))]),
                ("link_widths", [("max_link_width", f"{g.pcie_width_max}x"),
                                 ("current_link_width", f"{g.pcie_width_max}x")]),
            ]),
        ]),
        ("fan_speed", f"{g.fan_percent} %" if g.fan_percent is not None else NA),
        ("performance_state", r.pstate),
        ("clocks_event_reasons", [(f"clocks_event_reason_{name}", _active(on))
                                  for name, on in r.clock_event_reasons.items()]),
        ("fb_memory_usage", [("total", f"{g.memory_total_mib} MiB"),
                             ("reserved", f"{g.memory_reserved_mib} MiB"),
                             ("used", f"{r.memory_used_mib} MiB"),
                             ("free", f"{r.memory_free_mib} MiB")]),
        ("bar1_memory_usage", [("total", "256 MiB"), ("used", "1 MiB"), ("free", "255 MiB")]),
        ("compute_mode", "Default"),
        ("utilization", [("gpu_util", f"{r.utilization_pct} %"),
                         ("memory_util", f"{r.utilization_pct * 6 // 10} %"),
                         ("encoder_util", "0 %"), ("decoder_util", "0 %"),
                         ("jpeg_util", "0 %"), ("ofa_util", "0 %")]),
        ("ecc_mode", [("current_ecc", NA), ("pending_ecc", NA)]),
        ("temperature", [("gpu_temp", f"{r.temperature_c} C"), ("gpu_temp_tlimit", NA),
                         ("gpu_temp_max_threshold", "98 C"), ("gpu_temp_slow_threshold", "95 C"),
                         ("gpu_temp_max_gpu_threshold", "93 C"),
                         ("gpu_target_temperature", "83 C"), ("memory_temp", NA)]),
        ("gpu_power_readings", [
            ("power_state", r.pstate), ("average_power_draw", _w(draw)),
            ("instant_power_draw", _w(draw)), ("current_power_limit", _w(st.power_limit_w)),
            ("requested_power_limit", _w(st.power_limit_w)),
            ("default_power_limit", _w(g.power_default_w)),
            ("min_power_limit", _w(g.power_min_w)), ("max_power_limit", _w(g.power_max_w)),
        ]),
        ("gpu_memory_power_readings", [("average_power_draw", NA), ("instant_power_draw", NA)]),
        ("clocks", [("graphics_clock", f"{clocks['graphics']} MHz"),
                    ("sm_clock", f"{clocks['sm']} MHz"),
                    ("mem_clock", f"{clocks['memory']} MHz"),
                    ("video_clock", f"{clocks['video']} MHz")]),
        ("applications_clocks", [("graphics_clock", NA), ("mem_clock", NA)]),
        ("default_applications_clocks", [("graphics_clock", NA), ("mem_clock", NA)]),
        ("max_clocks", [("graphics_clock", f"{g.clocks_max_graphics_mhz} MHz"),
                        ("sm_clock", f"{g.clocks_max_sm_mhz} MHz"),
                        ("mem_clock", f"{g.clocks_max_memory_mhz} MHz"),
                        ("video_clock", f"{g.clocks_max_video_mhz} MHz")]),
        ("processes", procs),
        ("accounted_processes", []),
    ]


def _xml_nodes(nodes: list[tuple[str, object]], depth: int, out: list[str]) -> None:
    pad = "\t" * depth
    for tag, value in nodes:
        if isinstance(value, list):
            out.append(f"{pad}<{tag}>")
            _xml_nodes(value, depth + 1, out)
            out.append(f"{pad}</{tag}>")
        elif tag == "mig_devices":  # a text-only container, printed on its own line as real
            out += [f"{pad}<{tag}>", f"{pad}\t{escape(str(value))}", f"{pad}</{tag}>"]
        else:
            out.append(f"{pad}<{tag}>{escape(str(value))}</{tag}>")


def render_xml(ctx: Context, readings: list[sim.Reading], now: float) -> str:
    out = ['<?xml version="1.0" ?>',
           '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">', "<nvidia_smi_log>"]
    _xml_nodes([("timestamp", _ctime(now)), ("driver_version", ctx.driver_version),
                ("cuda_version", ctx.cuda), ("attached_gpus", str(len(ctx.hw.gpus)))], 1, out)
    for r in readings:
        out.append(f"\t<gpu id={quoteattr(r.gpu.pci_bus_id)}>")
        _xml_nodes(_xml_gpu(ctx, r), 2, out)
        out += ["\t</gpu>", ""]
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


# --- topo -m ---------------------------------------------------------------------------------

_TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def render_topo(hw: sim.Hardware) -> str:
    """Tab-separated matrix with the ANSI-underlined header, as real prints even into a pipe."""
    n = len(hw.gpus)
    cpus = os.cpu_count() or 1
    link = "NV4" if hw.nvlink else hw.topology  # an RTX 3090 NVLink bridge bonds 4 links
    head = "\t\x1b[4m" + "\t".join(f"GPU{i}" for i in range(n))
    head += "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    rows = [head]
    for i in range(n):
        cells = [" X " if i == j else link for j in range(n)]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + f"\t0-{cpus - 1}\t0\t\tN/A")
    return "\n".join(rows) + "\n" + _TOPO_LEGEND


# --- setting things --------------------------------------------------------------------------


def set_power_limit(ctx: Context, positions: list[int], raw: str) -> tuple[str, int]:
    try:
        watts = float(raw)
    except ValueError:
        return INVALID_COMBINATION, INVALID_ARGUMENT
    out: list[str] = []
    gpus = [ctx.hw.gpus[p] for p in positions]
    for g in gpus:
        if not g.power_limit_settable:
            out.append("Changing power management limit is not supported in current scope "
                       f"for GPU: {g.pci_bus_id}.")
            continue
        if not g.power_min_w <= watts <= g.power_max_w:
            out += [f"Provided power limit {watts:.2f} W is not a valid power limit which should "
                    f"be between {g.power_min_w:.2f} W and {g.power_max_w:.2f} W for GPU "
                    f"{g.pci_bus_id}", "Terminating early due to previous errors."]
            return "\n".join(out) + "\n", INVALID_ARGUMENT
        if not _is_root():
            out += [f"Failed to set power management limit for GPU {g.pci_bus_id}: "
                    "Insufficient Permissions", "Terminating early due to previous errors."]
            return "\n".join(out) + "\n", NO_PERMISSION
        with sim.locked_state(ctx.paths, ctx.hw) as state:
            before = state[g.index].power_limit_w
            state[g.index].power_limit_w = watts
        out.append(f"Power limit for GPU {g.pci_bus_id} was set to {watts:.2f} W from "
                   f"{before:.2f} W.")
    out.append("All done.")
    return "\n".join(out) + "\n", OK


def set_persistence(ctx: Context, positions: list[int], raw: str) -> tuple[str, int]:
    mode = {"0": False, "DISABLED": False, "1": True, "ENABLED": True}.get(raw.strip().upper())
    if mode is None:
        return INVALID_COMBINATION, INVALID_ARGUMENT
    word = "Enabled" if mode else "Disabled"
    out: list[str] = []
    for p in positions:
        g = ctx.hw.gpus[p]
        if not _is_root():
            out += [f"Unable to set persistence mode for GPU {g.pci_bus_id}: "
                    "Insufficient Permissions", "Terminating early due to previous errors."]
            return "\n".join(out) + "\n", NO_PERMISSION
        with sim.locked_state(ctx.paths, ctx.hw) as state:
            already = state[g.index].persistence == mode
            state[g.index].persistence = mode
        out.append(f"Persistence mode is already {word} for GPU {g.pci_bus_id}." if already
                   else f"{word} persistence mode for GPU {g.pci_bus_id}.")
    out.append("All done.")
    return "\n".join(out) + "\n", OK


# --- help ------------------------------------------------------------------------------------

_USAGE = """NVIDIA System Management Interface -- testbed stand-in (rigfleet)

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
          --version             Print version information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -q,   --query               Display GPU or Unit info.
    -x,   --xml-format          Produce XML output (with -q).
    -d,   --display=            Display only selected information (with -q):
                                MEMORY, UTILIZATION, ECC, TEMPERATURE, POWER, CLOCK,
                                COMPUTE, PIDS, PERFORMANCE.
    -i,   --id=                 Target a specific GPU: index, UUID or PCI bus id.
          --query-gpu=          Information about GPU; see --help-query-gpu.
          --format=             csv, with optional noheader and nounits.
    -pm,  --persistence-mode=   Set persistence mode: 0/DISABLED, 1/ENABLED.
    -pl,  --power-limit=        Specifies maximum power management limit in watts.
    topo -m                     Display the GPUDirect communication matrix.
"""


def _help_query_gpu() -> str:
    lines = ['List of valid properties to query for the switch "--query-gpu":', ""]
    for f in FIELDS:
        names = " or ".join(f'"{n}"' for n in (f.name, *f.aliases))
        lines += [names + (f"  (unit: {f.unit})" if f.unit else ""), ""]
    return "\n".join(lines)


# --- entry point -----------------------------------------------------------------------------


def run(argv: Sequence[str], version: str | None, out: TextIO, now: float | None = None) -> int:
    now = time.time() if now is None else now
    opts = parse_args(argv)
    if opts.command == "help":
        out.write(_USAGE)
        return OK
    if opts.command == "help_query_gpu":
        out.write(_help_query_gpu())
        return OK
    if opts.command == "topo" and opts.topo_args not in (["-m"], ["--matrix"]):
        out.write("Usage: nvidia-smi topo -m\n\n    -m, --matrix    Display the GPUDirect "
                  "communication matrix for the system.\n")
        return OK if not opts.topo_args else INVALID_ARGUMENT
    ctx = open_driver(sim.SimPaths.from_env(), version)
    if opts.command == "version":
        out.write(f"NVIDIA-SMI version  : {ctx.library_version}\n"
                  f"NVML version        : {ctx.library_version.rsplit('.', 1)[0]}\n"
                  f"DRIVER version      : {ctx.driver_version}\n"
                  f"CUDA Version        : {ctx.cuda}\n")
        return OK
    if opts.command == "topo":
        out.write(render_topo(ctx.hw))
        return OK
    ids = opts.values.get("id")
    readings = ctx.readings(ids)
    if opts.command == "list":
        out.write("".join(f"GPU {r.gpu.index}: {r.gpu.name} (UUID: {r.gpu.uuid})\n"
                          for r in readings))
        return OK
    if opts.command == "query_gpu":
        out.write(render_query(ctx, readings, opts.values["query_gpu"], opts.values["format"]))
        return OK
    if opts.command == "query":
        if "xml" in opts.values:
            out.write(render_xml(ctx, readings, now))
        else:
            out.write(render_q(ctx, readings, opts.values.get("display"), now))
        return OK
    if opts.command == "set":
        positions = select_gpus(ctx.hw, ids) if ids else list(range(len(ctx.hw.gpus)))
        rc = OK
        for key, _ in opts.order:
            if key == "power_limit":
                text, rc = set_power_limit(ctx, positions, opts.values[key])
            elif key == "persistence_mode":
                text, rc = set_persistence(ctx, positions, opts.values[key])
            else:
                continue
            out.write(text)
            if rc != OK:
                break
        return rc
    out.write(render_table(ctx, readings, now))
    return OK


def main(argv: Sequence[str] | None = None, *, version: str | None = None,
         out: TextIO | None = None) -> int:
    """Run nvidia-smi; ``version`` is the "library" version the package was built for."""
    stream = out or sys.stdout
    try:
        return run(sys.argv[1:] if argv is None else argv, version, stream)
    except SmiExit as stop:
        stream.write(stop.text)
        return stop.code
