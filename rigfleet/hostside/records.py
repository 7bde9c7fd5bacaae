"""The records rigfleet keeps on a host, and their readers: one contract for both sides.

The host-side tool writes these records; the control side (``rigfleet status``, the bump,
the deploy's facts) reads them only through the functions here, over the host probe
(``rigfleet-host.pyz probe``). Paths come from ``rigfleet.hostside.layout``. Stdlib only.

Records:

- ``state.json``: what serves now, the pins it runs (``TRACKED_KEYS``), ``gate`` (the last
  ``GateRecord``), ``last_swap`` (the last transaction's summary), other keys kept;
- ``ledger.jsonl``: one JSON object per change (``rigfleet.hostside.ledger.entry``);
- ``active/active.json``: ``rigfleet.hostside.plan.Active``;
- ``lock/holder.json``: who holds the host lock, with the liveness data (``holder_alive``): a
  process (pid, its start time, the boot), also for a maintenance window (the deploy's SSH
  session; across the reboot a driver change needs, a grace on the boot-time clock);
- ``maintenance/window.json`` (``read_window``), ``supervise/state.json``
  (``read_supervisor``), ``reports/verify-<ts>.json`` (schema ``rigfleet-verify/1``);
- ``throughput/history.jsonl``: one ``ThroughputRecord`` per verified gate or accepted
  baseline (the baseline the gate judges decode speed against); ``throughput/last.json``: the
  last gate's, passed or not (``read_throughput_history``, ``read_throughput_last``).

Example::

    holder = read_holder(HOST.lock_dir)           # None, or {..., "alive": bool}
    gate = GateRecord.from_dict(state.get("gate"))
    gate.result, gate.failed_checks               # 'fail', ('needles',)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .layout import ROUTE_MARK, Layout

# The pins a stack runs, as state.json and every ledger line record them; a difference in any
# of them is a ledger entry (roles/ledger.py) and drift (rigfleet status).
TRACKED_KEYS = (
    "stack", "image", "digest", "vllm_version", "genesis_commit", "model_repo",
    "model_revision", "driver_branch", "toolkit_version", "pins_serial",
)  # fmt: skip

VERIFY_SCHEMA = "rigfleet-verify/1"
# A lock directory without holder.json is being written; older than this it was abandoned.
HALF_WRITTEN_LOCK_S = 30.0


# --- plain files ------------------------------------------------------------------------------


def read_json(path: Path) -> tuple[Any, str | None]:
    """(data, None), or (None, why): ``missing``, or the error."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as e:
        return None, str(e)


def read_state(path: Path) -> dict[str, Any]:
    """``state.json`` as a dict ({} when missing or unreadable)."""
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
    try:
        first = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return first[len(ROUTE_MARK):].strip() if first.startswith(ROUTE_MARK) else None


# --- the lock holder: one liveness rule -------------------------------------------------------


def boot_id() -> str:
    """The kernel's boot id: a pid from another boot is never alive."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time since boot): tells a reused pid apart."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class BootClock:
    """Time no wall-clock step moves: which boot this is, and seconds on the kernel's boot-time
    clock (``CLOCK_BOOTTIME``). A container host restarted keeps the kernel's boot id, so a
    boot is the boot id *and* PID 1's start. Tests pass their own."""

    def boot(self) -> str:
        return f"{boot_id()}/{pid_start_ticks(1)}"

    def uptime(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def since_boot(self) -> float:
        """Seconds since this boot's PID 1 started."""
        return self.uptime() - (pid_start_ticks(1) or 0) / os.sysconf("SC_CLK_TCK")


BOOT_CLOCK = BootClock()


def process_alive(holder: dict[str, Any]) -> bool:
    """The recorded process (``pid``, ``pid_start``, ``boot_id``) still runs."""
    if holder.get("boot_id") and holder.get("boot_id") != boot_id():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    start = pid_start_ticks(pid)
    if start is None:
        return False
    return holder.get("pid_start") in (None, start)


def reboot_hold(reboot: Any, clock: BootClock = BOOT_CLOCK) -> bool:
    """A window's hold across its reboot (``{"boot", "at", "grace_s"}``, written before the
    reboot): in the boot that asked for it, ``grace_s`` from ``at`` (boot-time clock); in a
    later boot, ``grace_s`` from that boot's start (the deploy reconnects meanwhile)."""
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
    """True while the lock's holder lives: the process that took it still runs (same boot,
    same pid start). A maintenance window (``"window"``: its id) is held by a process too
    (``anchor``: the deploy's SSH session, in which every step runs), and across the reboot
    of a driver change by ``reboot`` (``reboot_hold``); no wall clock is read, so a clock
    stepped forwards or backwards abandons nothing. A window written by an older host tool
    (no ``anchor``) lives until its deadline (``until``, epoch seconds). A window whose
    holder is gone was abandoned: whoever takes the lock then closes it (recreate + gate)."""
    if holder.get("window") and not holder.get("anchor"):
        until = holder.get("until")
        return isinstance(until, int | float) and (time.time() if now is None else now) < until
    if process_alive(holder):
        return True
    return bool(holder.get("window")) and reboot_hold(holder.get("reboot"), clock)


def read_holder(lock_dir: Path) -> dict[str, Any] | None:
    """The lock's ``holder.json`` plus ``alive``; None when nobody holds the lock."""
    if not lock_dir.is_dir():
        return None
    try:
        holder = json.loads((lock_dir / "holder.json").read_text())
        if not isinstance(holder, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        # Between mkdir and writing holder.json, or a holder killed right there.
        try:
            age = time.time() - lock_dir.stat().st_mtime
        except OSError:
            return None
        return {"who": "unknown", "why": "lock being taken", "since": None, "pid": None,
                "alive": age < HALF_WRITTEN_LOCK_S, "half_written": True}
    holder["alive"] = holder_alive(holder)
    return holder


def describe(holder: dict[str, Any]) -> str:
    """One line about a holder, for refusals and takeovers (never suggesting to take a lock
    from a holder that lives)."""
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
    """``holder`` when a live process holds the lock, else None (free, or stale)."""
    return holder if isinstance(holder, dict) and holder.get("alive") else None


# --- the maintenance window -------------------------------------------------------------------

MAINTENANCE_SCHEMA = "rigfleet-maintenance/1"
# A window's states: open (the serving path may be disturbed; the front answers 503), closed
# (the stack was recreated and passed the gate), failed (it did not: nothing serves).
WINDOW_STATES = ("open", "closed", "failed")


def read_window(path: Path) -> dict[str, Any] | None:
    """``maintenance/window.json`` (None when no window was ever opened here); a damaged one
    is ``{"state": "damaged", "error": ...}``: readers treat it as a failed window (nothing is
    known to serve; the next deploy or ``maintenance close`` closes it again)."""
    data, err = read_json(path)
    if err == "missing":
        return None
    if not isinstance(data, dict) or data.get("schema") != MAINTENANCE_SCHEMA \
            or data.get("state") not in WINDOW_STATES:
        what = err or f"not a {MAINTENANCE_SCHEMA} record"
        return {"state": "damaged", "error": f"{path}: {what}"}
    return data


# --- gate results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRecord:
    """The ``gate`` object of ``state.json`` and ledger lines (``GateResult.record()``).

    + result: ``pass``, ``fail``, ``error`` or ``not-run``
    + failed_checks: names of the failed checks
    + report, report_md: the report files on the host
    + at: when it ran; profile: the gate profile; summary: one line
    """

    result: str = "not-run"
    failed_checks: tuple[str, ...] = ()
    report: str | None = None
    report_md: str | None = None
    at: str | None = None
    profile: str | None = None
    summary: str = ""
    seconds: float | None = None

    @classmethod
    def from_dict(cls, data: Any) -> GateRecord | None:
        """The record in ``data``; None when ``data`` is not a gate record."""
        if not isinstance(data, dict) or not isinstance(data.get("result"), str):
            return None
        failed = data.get("failed_checks")
        seconds = data.get("seconds")
        return cls(
            result=str(data["result"]),
            failed_checks=tuple(str(x) for x in failed) if isinstance(failed, list) else (),
            report=_opt_str(data.get("report")),
            report_md=_opt_str(data.get("report_md")),
            at=_opt_str(data.get("at")),
            profile=_opt_str(data.get("profile")),
            summary=str(data.get("summary") or ""),
            seconds=float(seconds) if isinstance(seconds, int | float) else None,
        )

    def text(self) -> str:
        """``pass``, ``fail (needles, soak): ...`` for a table or a message."""
        out = self.result + (f" ({', '.join(self.failed_checks)})" if self.failed_checks else "")
        return out + (f": {self.summary}" if self.summary and self.result != "pass" else "")


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class ReportSummary:
    """A ``rigfleet-verify/1`` gate report, as the control side shows it.

    + file: the report's path relative to the reports directory
    + mtime: its modification time
    + failed: names of the failed checks; total: how many checks ran
    """

    file: str
    mtime: float
    failed: tuple[str, ...] = ()
    total: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def text(self) -> str:
        if self.failed:
            return (f"fail: {len(self.failed)} of {self.total} checks failed "
                    f"({', '.join(self.failed)})")
        return f"pass {self.counts.get('pass', self.total)}/{self.total}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "mtime": self.mtime, "failed": list(self.failed),
                "total": self.total, "counts": dict(self.counts)}

    @classmethod
    def from_dict(cls, data: Any) -> ReportSummary | None:
        if not isinstance(data, dict) or not isinstance(data.get("file"), str):
            return None
        raw = data.get("counts")
        counts: dict[Any, Any] = raw if isinstance(raw, dict) else {}
        return cls(file=str(data["file"]), mtime=float(data.get("mtime") or 0.0),
                   failed=tuple(str(x) for x in data.get("failed") or ()),
                   total=int(data.get("total") or 0),
                   counts={str(k): int(v) for k, v in counts.items() if isinstance(v, int)})


def summarise_report(data: Any, file: str, mtime: float) -> ReportSummary | None:
    """The summary of a parsed report; None when it is not a ``rigfleet-verify/1`` report."""
    if not isinstance(data, dict) or data.get("schema") != VERIFY_SCHEMA:
        return None
    checks = [c for c in data.get("checks") or [] if isinstance(c, dict)]
    raw = data.get("summary")
    counts = {str(k): int(v) for k, v in (raw if isinstance(raw, dict) else {}).items()
              if isinstance(v, int)}
    failed = tuple(str(c.get("name")) for c in checks if c.get("status") == "fail")
    total = sum(counts.values()) or len(checks)
    return ReportSummary(file, mtime, failed, total, counts)


def reports(directory: Path, newest: int = 20) -> tuple[list[str], ReportSummary | None]:
    """(report files oldest first, relative to ``directory``; the newest gate report)."""
    try:
        found = sorted((p for p in directory.rglob("*.json") if p.is_file()),
                       key=lambda p: p.stat().st_mtime)
    except OSError:
        return [], None
    names = [os.path.relpath(p, directory) for p in found]
    for path in reversed(found[-newest:]):
        data, _ = read_json(path)
        summary = summarise_report(data, os.path.relpath(path, directory), path.stat().st_mtime)
        if summary is not None:
            return names, summary
    return names, None


# --- the supervisor ---------------------------------------------------------------------------

SUPERVISE_SCHEMA = "rigfleet-supervise/1"


def recent_attempts(attempts: Any, now: float, window_s: float) -> list[dict[str, Any]]:
    """The recreation attempts (``{"at": epoch seconds, ...}``) of the last ``window_s``."""
    return [a for a in attempts or () if isinstance(a, dict)
            and isinstance(a.get("at"), int | float) and a["at"] >= now - window_s]


def read_supervisor(path: Path, now: float | None = None) -> dict[str, Any] | None:
    """The supervisor's ``state.json`` plus ``alive`` (its process runs: the lock's liveness
    rule), ``recreations`` (attempts within its window, as of ``now``) and ``now`` (this
    host's clock, so a reader elsewhere can tell ages); None when there is none (never ran),
    ``{"error": ...}`` when unreadable."""
    data, err = read_json(path)
    if err == "missing":
        return None
    if not isinstance(data, dict) or data.get("schema") != SUPERVISE_SCHEMA:
        return {"error": err or f"not a {SUPERVISE_SCHEMA} record", "alive": False}
    now = time.time() if now is None else now
    raw = data.get("policy")
    policy: dict[str, Any] = raw if isinstance(raw, dict) else {}
    window = policy.get("window_s")
    recent = recent_attempts(data.get("attempts"), now,
                             float(window) if isinstance(window, int | float) else 0.0)
    return {**data, "alive": holder_alive(data), "recreations": len(recent), "now": now}


# --- throughput -------------------------------------------------------------------------------

THROUGHPUT_SCHEMA = "rigfleet-throughput/1"
# Where a record comes from: a gate's throughput check, or ``rigfleet bench --accept-baseline``
# (a person's "this is normal now": the baseline restarts from it).
SOURCE_GATE, SOURCE_ACCEPTED = "gate", "accepted"
SHAPES = ("narrative", "code")


@dataclass(frozen=True)
class ShapeFigures:
    """One shape's runs, reduced: mean decode tok/s (completion tokens / (end - first token)),
    its coefficient of variation, mean wall tok/s (completion tokens / whole request), mean
    time to first token, and the number of runs."""

    decode: float
    cv: float | None = None
    wall: float | None = None
    ttft_s: float | None = None
    runs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"decode": self.decode, "cv": self.cv, "wall": self.wall, "ttft_s": self.ttft_s,
                "runs": self.runs}

    @classmethod
    def from_dict(cls, data: Any) -> ShapeFigures | None:
        if not isinstance(data, dict) or not _num(data.get("decode")):
            return None
        return cls(decode=float(data["decode"]), cv=_num(data.get("cv")),
                   wall=_num(data.get("wall")), ttft_s=_num(data.get("ttft_s")),
                   runs=int(data.get("runs") or 0))


@dataclass(frozen=True)
class ThroughputRecord:
    """One throughput measurement of a stack on this host (schema ``rigfleet-throughput/1``).

    + stack: the stack measured (the history is kept per stack)
    + at: when (ISO 8601, UTC); source: ``gate`` or ``accepted``; result: the gate's verdict
      on throughput (``pass``/``fail``; history holds only passed and accepted records)
    + shapes: ``narrative`` / ``code`` -> ``ShapeFigures``
    + acceptance_length, acceptance: MTP mean acceptance length and per-position acceptance
      of the code runs; None when unknown (no /metrics, no spec-decode counters), never 0
    + scale: the host's ``throughput_scale`` when measured
    + baseline: what it was judged against (``{"narrative": x, "code": y, "source": ...}``)
    + version, model, report: the server's version and model id, the gate report's path

    Example::

        rec = read_throughput_last(HOST.throughput_last)
        rec.decode("narrative"), rec.acceptance        # 89.4, (0.951, 0.842, 0.751)
    """

    stack: str
    at: str
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

    def decode(self, shape: str) -> float | None:
        """Mean decode tok/s of ``shape``, None when it was not measured."""
        fig = self.shapes.get(shape)
        return fig.decode if fig else None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": THROUGHPUT_SCHEMA, "stack": self.stack, "at": self.at,
                "source": self.source, "result": self.result,
                "shapes": {k: v.to_dict() for k, v in self.shapes.items()},
                "acceptance_length": self.acceptance_length,
                "acceptance": list(self.acceptance) if self.acceptance is not None else None,
                "scale": self.scale, "baseline": dict(self.baseline), "version": self.version,
                "model": self.model, "report": self.report}

    @classmethod
    def from_dict(cls, data: Any) -> ThroughputRecord | None:
        """The record in ``data``; None when ``data`` is not one."""
        if not isinstance(data, dict) or data.get("schema") != THROUGHPUT_SCHEMA \
                or not isinstance(data.get("stack"), str):
            return None
        raw = data.get("shapes")
        shapes = {k: f for k, f in ((str(k), ShapeFigures.from_dict(v))
                                    for k, v in (raw.items() if isinstance(raw, dict) else ()))
                  if f is not None}
        acc = data.get("acceptance")
        acceptance = (tuple(float(x) for x in acc if _num(x) is not None)
                      if isinstance(acc, list) else None)
        base = data.get("baseline")
        return cls(stack=str(data["stack"]), at=str(data.get("at") or ""),
                   source=str(data.get("source") or SOURCE_GATE),
                   result=str(data.get("result") or "pass"), shapes=shapes,
                   acceptance_length=_num(data.get("acceptance_length")),
                   acceptance=acceptance, scale=_num(data.get("scale")) or 1.0,
                   baseline=dict(base) if isinstance(base, dict) else {},
                   version=str(data.get("version") or ""), model=str(data.get("model") or ""),
                   report=_opt_str(data.get("report")))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value else None


def read_throughput_history(path: Path, stack: str | None = None) -> list[ThroughputRecord]:
    """The history's records oldest first (lines that are not records are skipped), only
    ``stack``'s when given; [] when there is no history."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = ThroughputRecord.from_dict(json.loads(line)) if line.strip() else None
        except ValueError:
            rec = None
        if rec is not None and (stack is None or rec.stack == stack):
            out.append(rec)
    return out


def read_throughput_last(path: Path) -> ThroughputRecord | None:
    """The last gate's throughput record; None when there is none."""
    data, _ = read_json(path)
    return ThroughputRecord.from_dict(data)


def loaded_images(lay: Layout) -> dict[str, list[str]]:
    """Image id -> the pinned digests a checked load stands for (``Layout.loaded_images_dir``)."""
    found: dict[str, list[str]] = {}
    try:
        entries = sorted(lay.loaded_images_dir.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            image_id = entry.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        found.setdefault(image_id, []).append(f"sha256:{entry.name}")
    return found
