"""The records rigfleet keeps on a host and their readers, for the host tool and the control
side (over ``rigfleet-host.pyz probe``); typed ones go through ``encode``/``decode``::

    holder = read_holder(HOST.lock_dir)           # None, or {..., "alive": bool}
    GateRecord.from_dict(state.get("gate")).failed_checks      # ('needles',)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from .layout import ROUTE_MARK, Layout

if TYPE_CHECKING:  # Python 3.11's; the host tool runs on 3.10 too (Ubuntu 22.04)
    from typing import Self  # novermin

# The pins a stack runs, as state.json and every ledger line record them.
TRACKED_KEYS = (
    "stack", "image", "digest", "vllm_version", "genesis_commit", "model_repo",
    "model_revision", "driver_branch", "toolkit_version", "pins_serial",
)  # fmt: skip

VERIFY_SCHEMA = "rigfleet-verify/1"
# A lock directory without holder.json is being written; older than this it was abandoned.
HALF_WRITTEN_LOCK_S = 30.0


def now_iso(at: float | None = None, suffix: str = "+00:00") -> str:
    """Seconds in ISO 8601, UTC, of ``at`` (epoch seconds; None: now); ``suffix`` "Z" for Zulu."""
    return datetime.fromtimestamp(time.time() if at is None else at, timezone.utc).isoformat(
        timespec="seconds").replace("+00:00", suffix)


def read_json(path: Path) -> tuple[Any, str | None]:
    """(data, None), or (None, why): ``missing``, or the error."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as e:
        return None, str(e)


def weights_mismatch(files: Any, stat: Callable[[str], tuple[int, float] | None]) -> str:
    """Why weights differ from their manifest's ``files`` (name -> size, mtime; "" when they
    match), without hashing; ``stat(name)``: (size, mtime), None when absent."""
    if not isinstance(files, dict) or not files:
        return "manifest lists no files"
    for name in sorted(files):
        meta = files[name] if isinstance(files[name], dict) else {}
        if (found := stat(name)) is None:
            return f"{name} is missing"
        if found[0] != meta.get("size"):
            return f"{name} has {found[0]} bytes, manifest says {meta.get('size')}"
        mtime = meta.get("mtime")
        if not isinstance(mtime, int | float) or abs(found[1] - mtime) > 0.001:
            return f"{name} was modified after it was verified"
    return ""


def read_text(path: Path) -> str | None:
    """The file's text; None when it cannot be read."""
    try:
        return path.read_text()
    except OSError:
        return None


def read_state(path: Path) -> dict[str, Any]:
    """``state.json`` (any JSON object file) as a dict ({} when missing or unreadable)."""
    data, _ = read_json(path)
    return data if isinstance(data, dict) else {}


def ledger_tail(path: Path, n: int = 10) -> tuple[list[dict[str, Any]], int, str | None]:
    """(the last ``n`` parseable lines oldest first, the number of lines, problem or None)."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return [], 0, "missing"
    except OSError as e:
        return [], 0, str(e)
    out: list[dict[str, Any]] = []
    problem = None
    for line in lines[-n:]:
        try:
            data = json.loads(line)
        except ValueError as e:
            problem = f"a line is not JSON ({e})"
            continue
        if isinstance(data, dict):
            out.append(data)
    if lines and not out:
        problem = problem or "no line is a JSON object"
    return out, len(lines), problem


def route(path: Path) -> str | None:
    """The front's current route id, from the first line of ``route.conf``."""
    first = (read_text(path) or "").partition("\n")[0]
    return first[len(ROUTE_MARK):].strip() if first.startswith(ROUTE_MARK) else None


R = TypeVar("R")


def encode(record: Any) -> Any:
    """A record as JSON data: a dataclass as a dict of its fields, tuples as lists."""
    if is_dataclass(record) and not isinstance(record, type):
        return {f.name: encode(getattr(record, f.name)) for f in fields(record)}
    if isinstance(record, tuple | list):
        return [encode(x) for x in record]
    if isinstance(record, dict):
        return {k: encode(v) for k, v in record.items()}
    return record


def decode(cls: type[R], data: Any) -> R | None:
    """``data`` as a ``cls``, leniently: a value of the wrong kind reads as its field's default,
    an item of the wrong kind is left out; None when a required field has no usable value."""
    try:
        return _decode(cls, data, None)
    except TypeError:
        return None


def decode_strict(cls: type[R], data: Any, where: str, error: type[Exception] = TypeError) -> R:
    """``data`` as a ``cls``, or ``error`` naming the first field that is missing or of the
    wrong kind (``where``: the record's name in that message, "" for none)."""
    try:
        return _decode(cls, data, where)
    except TypeError as e:
        raise error(str(e)) from None


_hints = functools.cache(get_type_hints)


def _decode(cls: Any, data: Any, where: str | None) -> Any:
    """Each field by its annotation, and by its ``check`` (metadata: the value -> what is wrong
    with it, or None). ``where`` None: lenient."""
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected an object, got {type(data).__name__}")
    values = {}
    for f in fields(cls):
        path, raw = f"{where}.{f.name}" if where else f.name, data.get(f.name)
        required = f.default is MISSING and f.default_factory is MISSING
        try:
            if raw is None:
                raise TypeError(f"{path}: missing")
            value = _value(_hints(cls)[f.name], raw, path, where is not None)
            if problem := f.metadata.get("check", lambda _: None)(value):
                raise TypeError(f"{path}: {problem}")
            values[f.name] = value
        except TypeError:
            if required or (where is not None and raw is not None):
                raise
    return cls(**values)


_KINDS = {tuple: "a list", dict: "an object", str: "a string", bool: "true or false",
          int: "a whole number >= 0", float: "a number >= 0"}


def _value(tp: Any, raw: Any, path: str, strict: bool) -> Any:
    """``raw`` as a ``tp``; TypeError when it is not one."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):  # ``X | None``: raw is not None here
        return _value(args[0], raw, path, strict)
    if tp is Any:
        return raw
    if is_dataclass(tp):
        return _decode(tp, raw, path if strict else None)
    if origin is tuple and isinstance(raw, list):
        if args[-1] is Ellipsis:
            return tuple(_items(args[0], enumerate(raw), path, strict).values())
        if len(raw) != len(args):
            raise TypeError(f"{path}: expected {len(args)} items, got {len(raw)}")
        return tuple(_value(a, x, path, strict) for a, x in zip(args, raw, strict=True))
    if origin is dict and isinstance(raw, dict):
        return dict(raw) if args[1] is Any else _items(args[1], raw.items(), path, strict)
    # Compared, not converted: a huge int is no number here (math.isfinite would overflow).
    number = isinstance(raw, int | float) and not isinstance(raw, bool) \
        and 0 <= raw <= sys.float_info.max
    if (tp is float and number) or (tp is int and number and isinstance(raw, int)):
        return tp(raw)
    if tp in (str, bool) and isinstance(raw, tp):
        return raw
    raise TypeError(f"{path}: expected {_KINDS.get(origin or tp, tp)}, got {type(raw).__name__}")


class Coded:
    """A typed record: ``to_dict`` with the class's ``schema``, and a lenient ``from_dict``."""

    schema: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, **encode(self)} if self.schema else encode(self)

    @classmethod
    def from_dict(cls, data: Any) -> Self | None:
        ours = not cls.schema or (isinstance(data, dict) and data.get("schema") == cls.schema)
        return decode(cls, data) if ours else None


def _items(tp: Any, pairs: Any, path: str, strict: bool) -> dict[Any, Any]:
    """The pairs whose value is a ``tp``, converted (strict: all of them)."""
    out = {}
    for key, raw in pairs:
        try:
            out[key] = _value(tp, raw, path, strict)
        except TypeError:
            if strict:
                raise
    return out


def boot_id() -> str:
    return (read_text(Path("/proc/sys/kernel/random/boot_id")) or "").strip()


def proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) of ``/proc/<pid>/stat``."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def pid_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time since boot): tells a reused pid apart."""
    stat = proc_stat(pid)
    try:
        return int(stat[1][19]) if stat else None
    except (IndexError, ValueError):
        return None


class BootClock:
    """Which boot this is (the boot id *and* PID 1's start: a restarted container host keeps
    the boot id) and seconds on ``CLOCK_BOOTTIME``, which no wall-clock step moves."""

    def boot(self) -> str:
        return f"{boot_id()}/{pid_start_ticks(1)}"

    def uptime(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def since_boot(self) -> float:
        return self.uptime() - (pid_start_ticks(1) or 0) / os.sysconf("SC_CLK_TCK")


BOOT_CLOCK = BootClock()


def process_id(pid: int) -> dict[str, Any]:
    """What tells process ``pid`` apart across pid reuse and reboots (``holder_alive``)."""
    return {"pid": pid, "pid_start": pid_start_ticks(pid), "boot_id": boot_id()}


def reboot_hold(reboot: Any, clock: BootClock = BOOT_CLOCK) -> bool:
    """A window's hold across its reboot (``{"boot", "at", "grace_s"}``): ``grace_s`` from
    ``at`` in the boot that asked for it, else from the start of the later boot."""
    if not isinstance(reboot, dict):
        return False
    grace, at = reboot.get("grace_s"), reboot.get("at")
    if not isinstance(grace, int | float) or not isinstance(at, int | float):
        return False
    if reboot.get("boot") == clock.boot():
        return clock.uptime() - at < grace
    return clock.since_boot() < grace


def holder_alive(holder: dict[str, Any], now: float | None = None,
                 clock: BootClock = BOOT_CLOCK) -> bool:
    """True while the process that took the lock runs (same boot, same pid start): for a
    window its ``anchor`` (the deploy's SSH session), also across its reboot; an older tool's
    window (no ``anchor``) until ``until``. docs/maintenance.md: why no wall clock is read."""
    if holder.get("window") and not holder.get("anchor"):
        until = holder.get("until")
        return isinstance(until, int | float) and (time.time() if now is None else now) < until
    pid, boot = holder.get("pid"), holder.get("boot_id")
    start = pid_start_ticks(pid) if isinstance(pid, int) and pid > 0 \
        and (not boot or boot == boot_id()) else None
    return (start is not None and holder.get("pid_start") in (None, start)) or \
        (bool(holder.get("window")) and reboot_hold(holder.get("reboot"), clock))


def read_holder(lock_dir: Path) -> dict[str, Any] | None:
    """The lock's ``holder.json`` plus ``alive``; None when the lock is free."""
    if not lock_dir.is_dir():
        return None
    holder, _ = read_json(lock_dir / "holder.json")
    if not isinstance(holder, dict):
        # An older tool between mkdir and holder.json, or killed right there.
        try:
            age = time.time() - lock_dir.stat().st_mtime
        except OSError:
            return None
        return {"who": "unknown", "why": "lock being taken", "since": None, "pid": None,
                # A time ahead of now: made before the clock stepped back, not just now.
                "alive": abs(age) < HALF_WRITTEN_LOCK_S, "half_written": True}
    return {**holder, "alive": holder_alive(holder)}


def describe(holder: dict[str, Any]) -> str:
    """One line about a holder, for refusals and takeovers."""
    if holder.get("window") and holder.get("anchor"):
        where = (f"maintenance window {holder['window']}, held while pid {holder.get('pid')} "
                 f"({holder.get('anchor')}) lives")
        if isinstance(holder.get("reboot"), dict):
            where += ", and across its reboot"
    elif holder.get("window"):
        until = holder.get("until")
        stamp = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
                 if isinstance(until, int | float) else "?")
        where = f"maintenance window {holder['window']}, open until {stamp}"
    else:
        where = f"pid {holder.get('pid')}"
    where += f" on {holder['host']}" if holder.get("host") else ""
    deploy = f", deploy {holder['deploy_id']}" if holder.get("deploy_id") and \
        holder.get("deploy_id") != holder.get("window") else ""
    line = (f"locked by {holder.get('who') or 'unknown'} since {holder.get('since') or '?'} "
            f"({where}{deploy}): {holder.get('why') or 'no reason given'}")
    if holder.get("window") and holder.get("alive", True):
        line += ("; the deploy that holds it closes it (stack recreated and gated); if that "
                 "deploy is gone, the host closes it by itself")
    return line


def live_holder(holder: Any) -> dict[str, Any] | None:
    return holder if isinstance(holder, dict) and holder.get("alive") else None


@dataclass(frozen=True)
class GateRecord(Coded):
    """The ``gate`` object of ``state.json`` and ledger lines (``GateResult.record()``)."""

    result: str
    failed_checks: tuple[str, ...] = ()
    report: str | None = None
    report_md: str | None = None
    at: str | None = None
    profile: str | None = None
    summary: str = ""
    seconds: float | None = None


@dataclass(frozen=True)
class ReportSummary(Coded):
    """A ``rigfleet-verify/1`` gate report (``file``: relative to the reports directory)."""

    file: str
    mtime: float = 0.0
    failed: tuple[str, ...] = ()
    total: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def text(self) -> str:
        if self.failed:
            return (f"fail: {len(self.failed)} of {self.total} checks failed "
                    f"({', '.join(self.failed)})")
        return f"pass {self.counts.get('pass', self.total)}/{self.total}"


def summarise_report(data: Any, file: str, mtime: float) -> ReportSummary | None:
    """The summary of a parsed report; None when it is not a ``rigfleet-verify/1`` report."""
    if not isinstance(data, dict) or data.get("schema") != VERIFY_SCHEMA:
        return None
    checks = [c for c in data.get("checks") or [] if isinstance(c, dict)]
    raw = data.get("summary")
    counts = {str(k): v for k, v in raw.items() if isinstance(v, int)} \
        if isinstance(raw, dict) else {}
    failed = tuple(str(c.get("name")) for c in checks if c.get("status") == "fail")
    return ReportSummary(file, mtime, failed, sum(counts.values()) or len(checks), counts)


def reports(directory: Path, newest: int = 20) -> tuple[list[str], ReportSummary | None]:
    """(report files oldest first, relative to ``directory``; the newest gate report)."""
    try:
        found = sorted((p for p in directory.rglob("*.json") if p.is_file()),
                       key=lambda p: p.stat().st_mtime)
    except OSError:
        return [], None
    summaries = (summarise_report(read_json(p)[0], os.path.relpath(p, directory), p.stat().st_mtime)
                 for p in reversed(found[-newest:]))
    return [os.path.relpath(p, directory) for p in found], next(filter(None, summaries), None)


SUPERVISE_SCHEMA = "rigfleet-supervise/1"


def read_supervisor(path: Path, now: float | None = None) -> dict[str, Any] | None:
    """The supervisor's ``state.json`` plus ``alive``, ``recreations`` (within its window) and
    ``now`` (this host's clock); None when it never ran, ``{"error": ...}`` when unreadable."""
    data, err = read_json(path)
    if err == "missing":
        return None
    if not isinstance(data, dict) or data.get("schema") != SUPERVISE_SCHEMA:
        return {"error": err or f"not a {SUPERVISE_SCHEMA} record", "alive": False}
    now = time.time() if now is None else now
    policy = data.get("policy")
    window = policy.get("window_s") if isinstance(policy, dict) else None
    since = now - (float(window) if isinstance(window, int | float) else 0.0)
    recent = [a for a in data.get("attempts") or () if isinstance(a, dict)
              and isinstance(a.get("at"), int | float) and a["at"] >= since]
    return {**data, "alive": holder_alive(data), "recreations": len(recent), "now": now}


# Where a record comes from: a gate, or ``rigfleet bench --accept-baseline`` (a new baseline).
SOURCE_GATE, SOURCE_ACCEPTED = "gate", "accepted"
SHAPES = ("narrative", "code")


@dataclass(frozen=True)
class ShapeFigures(Coded):
    """One shape's runs, reduced: mean decode tok/s (after the first token), its coefficient
    of variation, mean wall tok/s (whole request), mean time to first token."""

    decode: float
    cv: float | None = None
    wall: float | None = None
    ttft_s: float | None = None
    runs: int = 0


@dataclass(frozen=True)
class ThroughputRecord(Coded):
    """One throughput measurement of a stack on this host (history holds only passed and
    accepted ones). ``acceptance_length``/``acceptance``: MTP acceptance of the code runs,
    None when unknown (never 0); ``baseline``: what it was judged against."""

    stack: str
    at: str = ""
    source: str = SOURCE_GATE
    result: str = "pass"
    shapes: dict[str, ShapeFigures] = field(default_factory=dict)
    acceptance_length: float | None = None
    acceptance: tuple[float, ...] | None = None
    scale: float = 1.0
    baseline: dict[str, Any] = field(default_factory=dict)
    version: str = ""
    model: str = ""
    report: str | None = None
    schema: ClassVar[str] = "rigfleet-throughput/1"

    def decode(self, shape: str) -> float | None:
        fig = self.shapes.get(shape)
        return fig.decode if fig else None


def read_throughput_history(path: Path, stack: str | None = None) -> list[ThroughputRecord]:
    """The history's records oldest first (only ``stack``'s when given)."""
    found = (ThroughputRecord.from_dict(line) for line in ledger_tail(path, 10**9)[0])
    return [rec for rec in found if rec is not None and stack in (None, rec.stack)]


def loaded_images(lay: Layout) -> dict[str, list[str]]:
    """Image id -> the pinned digests a checked load stands for (``Layout.loaded_images_dir``)."""
    found: dict[str, list[str]] = {}
    try:
        entries = sorted(lay.loaded_images_dir.iterdir())
    except OSError:
        return found
    for entry in entries:
        with contextlib.suppress(OSError):
            image_id = entry.read_text(encoding="utf-8").strip()
            found.setdefault(image_id, []).append(f"sha256:{entry.name}")
    return found
