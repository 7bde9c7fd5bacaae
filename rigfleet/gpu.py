"""Parse what ``nvidia-smi --query-gpu`` prints into typed data; ``GpuParseError`` names the
offending line, ``DriverNotLoadedError`` says the driver is not loaded ("reboot needed")::

    cards = gpu.parse_query_gpu(stdout)        # [GpuInfo(index=0, name='NVIDIA GeForce ...')]
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from rigfleet.errors import RigfleetError

# What nvidia-smi prints instead of output when it cannot talk to the driver.
_DRIVER_FAILURES = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    "Failed to initialize NVML",
)
_UNIT_SUFFIX = re.compile(r"^(?P<num>-?\d+(?:\.\d+)?)\s*(?:W|MiB|MHz|%|C)?$")
_NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]",
                  "[Insufficient Permissions]", "[Requested functionality has been deprecated]"}


class GpuParseError(RigfleetError):
    """Output that does not look like what nvidia-smi or the driver print."""


class DriverNotLoadedError(GpuParseError):
    """nvidia-smi could not talk to the driver (not loaded yet, or a version mismatch)."""


def _queried(*names: str) -> Any:
    """A ``GpuInfo`` field, None unless asked: its ``--query-gpu`` name, then its aliases."""
    return field(default=None, metadata={"query": names})


@dataclass(frozen=True)
class GpuInfo:
    """One GPU from ``--query-gpu``; fields not queried or not available are None."""

    index: int = field(metadata={"query": ("index",)})
    name: str | None = _queried("name", "gpu_name")
    uuid: str | None = _queried("uuid", "gpu_uuid")
    pci_bus_id: str | None = _queried("pci.bus_id", "gpu_bus_id")
    driver_version: str | None = _queried("driver_version")
    power_limit_w: float | None = _queried("power.limit")
    power_default_limit_w: float | None = _queried("power.default_limit")
    power_min_limit_w: float | None = _queried("power.min_limit")
    power_max_limit_w: float | None = _queried("power.max_limit")
    enforced_power_limit_w: float | None = _queried("enforced.power.limit")
    persistence_mode: bool | None = _queried("persistence_mode")
    memory_total_mib: int | None = _queried("memory.total")
    memory_used_mib: int | None = _queried("memory.used")
    temperature_c: int | None = _queried("temperature.gpu")
    clocks_max_sm_mhz: int | None = _queried("clocks.max.sm")
    compute_cap: str | None = _queried("compute_cap")
    vbios_version: str | None = _queried("vbios_version")


QUERY_FIELDS: tuple[str, ...] = tuple(f.metadata["query"][0] for f in fields(GpuInfo))
# query field -> GpuInfo attribute; its value is converted to the attribute's type.
_FIELD_MAP = {name: f.name for f in fields(GpuInfo) for name in f.metadata["query"]}
_KINDS = {f.name: str(f.type).split()[0] for f in fields(GpuInfo)}  # "int", "str | None" ...


def query_command(fields: Sequence[str] = QUERY_FIELDS) -> str:
    """The shell command that asks nvidia-smi for ``fields`` (no header, no units)."""
    return shlex.join(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                       "--format=csv,noheader,nounits"])


def _convert(raw: str, field_name: str, line: str) -> object:
    kind = _KINDS[_FIELD_MAP[field_name]]
    value = raw.strip()
    if value in _NOT_AVAILABLE:
        return None
    if kind == "str":
        return value
    if kind == "bool" and value in ("Enabled", "Disabled"):
        return value == "Enabled"
    if kind != "bool" and (m := _UNIT_SUFFIX.match(value)):
        number = float(m.group("num"))
        return number if kind == "float" else int(number)
    raise GpuParseError(f"nvidia-smi query: field {field_name} has value {value!r} in line "
                        f"{line!r}")


def parse_query_gpu(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[GpuInfo]:
    """One ``GpuInfo`` per line of ``--query-gpu`` csv output (a header line skipped;
    nvidia-smi does not quote, so surplus cells are joined back into ``name``)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in map(str.strip, lines):
        if line.startswith(_DRIVER_FAILURES):
            raise DriverNotLoadedError(f"nvidia-smi cannot reach the driver: {line!r}")
        if line == "No devices were found":
            raise GpuParseError(f"nvidia-smi sees no GPU: {line!r}")
    fields = list(fields)
    if lines and [re.sub(r"\s*\[[^\]]*\]$", "", c.strip()) for c in lines[0].split(",")] == fields:
        lines = lines[1:]  # the header (units in brackets)
    name_at = next((i for i, f in enumerate(fields) if f in ("name", "gpu_name")), None)
    gpus = []
    for pos, line in enumerate(lines):
        cells = [c.strip() for c in line.split(", ")]
        extra = len(cells) - len(fields)
        if extra > 0 and name_at is not None:
            cells[name_at:name_at + extra + 1] = [", ".join(cells[name_at:name_at + extra + 1])]
        if len(cells) != len(fields):
            raise GpuParseError(f"nvidia-smi query: expected {len(fields)} values "
                                f"({', '.join(fields)}), got {len(cells)} in line {line!r}")
        values: dict[str, object] = {_FIELD_MAP[name]: _convert(raw, name, ", ".join(cells))
                                     for name, raw in zip(fields, cells, strict=True)
                                     if name in _FIELD_MAP}
        if values.get("index") is None:
            values["index"] = pos
        gpus.append(GpuInfo(**values))  # type: ignore[arg-type]
    return gpus
