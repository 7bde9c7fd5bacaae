"""Run the verify-stress gate (``rigfleet.hostside.verify``), a child process from the same
bundle, against a freshly started stack; its lines are passed on as they come::

    result = run_gate(GateRun(url="http://127.0.0.1:8015", key_file=lay.api_key_file,
                              profile="full", report_dir=lay.reports_dir), on_line=print)
    result.result, result.failed_checks      # 'fail', ['needles', 'needles_deep']
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .records import GateRecord, encode, now_iso

_REPORTS_LINE = re.compile(r"^verify: reports (\S+\.json) (\S+\.md)\s*$")
EXIT_USAGE = 101  # and above: the gate itself broke (verify.runner)


@dataclass(frozen=True)
class GateRun:
    url: str
    key_file: Path
    profile: str
    report_dir: Path
    sets: tuple[str, ...] = ()
    timeout_s: float = 7200.0


@dataclass(frozen=True)
class GateResult(GateRecord):
    """What the gate decided (``pass``, ``fail``, or ``error``: it broke) and its exit status."""

    exit_status: int = -1

    @property
    def passed(self) -> bool:
        return self.result == "pass"

    def record(self) -> dict[str, Any]:
        return {**encode(self), "seconds": round(self.seconds or 0.0, 1)}


def read_report(path: Path) -> tuple[list[str], str]:
    """(failed check names, one-line summary) of a ``rigfleet-verify/1`` report."""
    data = json.loads(path.read_text())
    failing = [c for c in data.get("checks") or [] if c.get("status") == "fail"]
    counts = data.get("summary") or {}
    details = "; ".join(f"{c.get('name')}: {c.get('summary') or 'failed'}" for c in failing)
    line = (f"{counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, "
            f"{counts.get('skip', 0)} skipped" + (f" ({details})" if details else ""))
    return [str(c.get("name")) for c in failing], line[:1500]


def _newest_report(directory: Path, since: float) -> Path | None:
    try:
        found = [p for p in directory.glob("verify-*.json") if p.stat().st_mtime >= since - 1]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_gate(run: GateRun, on_line: Callable[[str], None] = lambda _: None,
             bundle: Path | None = None,
             should_stop: Callable[[], bool] = lambda: False) -> GateResult:
    """Run the gate as a child process (from ``bundle``, else ``sys.path``); never raises."""
    started, t0, at = time.time(), time.monotonic(), now_iso()
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=str(bundle) if bundle else os.pathsep.join(p for p in sys.path if p))
    run.report_dir.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    last: list[str] = []  # the gate's last lines: its own words when it breaks
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rigfleet.hostside.verify", "--url", run.url,
                                 "--api-key-file", str(run.key_file), "--profile", run.profile,
                                 "--report-dir", str(run.report_dir),
                                 *(arg for item in run.sets for arg in ("--set", item))],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)
    except OSError as e:
        return GateResult("error", profile=run.profile, at=at, seconds=0.0,
                          summary=f"cannot start the gate: {e}")

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            if m := _REPORTS_LINE.match(line):
                paths[:] = [m.group(1), m.group(2)]
            if line.strip():
                last[:] = [*last[-4:], line.strip()]
            on_line(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    why = ""  # set when it is ended here
    while proc.poll() is None and not why:
        why = (f"timed out after {run.timeout_s:g}s" if time.monotonic() - t0 > run.timeout_s
               else "stopped (the transaction was interrupted)" if should_stop() else "")
        time.sleep(0.2)
    if why:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    reader.join(5)
    status = proc.returncode
    seconds = time.monotonic() - t0
    found = Path(paths[0]) if paths else _newest_report(run.report_dir, started)
    report = str(found) if found else None
    md = paths[1] if paths else (str(found.with_suffix(".md")) if found else None)
    if why or status is None or status < 0 or status >= EXIT_USAGE:
        why = why or (f"exited with status {status} (usage error, report not written or "
                      "interrupted)")
        said = f"; it said: {' | '.join(last)}" if last else ""
        return GateResult("error", report=report, report_md=md, at=at, profile=run.profile,
                          summary=f"the gate {why}{said}"[:1500], seconds=seconds,
                          exit_status=status if status is not None else -1)
    failed: list[str] = []
    summary = f"exit status {status}"
    if found is not None:
        try:
            failed, summary = read_report(found)
        except (OSError, ValueError) as e:
            summary = f"exit status {status}; report {found} unreadable ({e})"
    if status and not failed:
        failed = [f"{status} check(s)"]
    return GateResult("pass" if status == 0 else "fail", tuple(failed), report, md, at,
                      run.profile, summary, seconds, exit_status=status)
