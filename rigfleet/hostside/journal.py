"""A transaction's progress on disk (``events.jsonl``, then ``result.json``); the deploy
follows it with ``rigfleet-host status --id ID --since N --json``::

    j = Journal(lay.swap_dir(plan.id))
    j.event("stop-old", "docker compose down rigfleet-int8")
    j.finish({"result": "promoted", "exit": 0, ...})
    Journal.read(lay.swap_dir(plan.id), since=0)   # {"events": [...], "next": 2, "state": "done"}
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from .atomic import append_line, write_json
from .records import holder_alive, now_iso, process_id, read_state, read_text

# Without any event for this long after the plan was written, the transaction never started.
START_GRACE_S = 60.0


class Journal:
    """Appends events (and echoes them, for journald) and writes the final result."""

    def __init__(self, directory: Path, echo: TextIO | None = sys.stdout) -> None:
        self.dir = directory
        self.echo = echo
        self.t0 = time.monotonic()
        self.problem: str | None = None  # why the journal cannot be written (``_try``)
        self.seq = len((read_text(self.dir / "events.jsonl") or "").splitlines())
        self._try(lambda: write_json(self.dir / "pid.json", process_id(os.getpid())))

    def event(self, phase: str, message: str, level: str = "info") -> None:
        self.seq += 1
        item = {"seq": self.seq, "time": now_iso(),
                "elapsed": round(time.monotonic() - self.t0, 2), "phase": phase, "level": level,
                "message": message}
        # One write per event (O_APPEND): a kill can only cut the last line, which read skips.
        self._try(lambda: append_line(self.dir / "events.jsonl",
                                      json.dumps(item, sort_keys=True), sync=False))
        if self.echo is not None:
            self.echo.write(f"[{item['elapsed']:8.2f}s] {phase}: {message}\n")
            self.echo.flush()

    def finish(self, result: dict[str, Any]) -> None:
        self._try(lambda: write_json(self.dir / "result.json",
                                     {**result, "elapsed": round(time.monotonic() - self.t0, 2)}))

    def _try(self, write: Callable[[], object]) -> None:
        """``write()``; an ``OSError`` (a full disk) is said once on the echo, not raised."""
        try:
            write()  # each writer makes the directory
        except OSError as e:
            problem = f"cannot write the journal {self.dir}: {e.strerror or e}"
            if problem != self.problem and self.echo is not None:
                self.echo.write(f"journal: {problem}; events go to this log only\n")
                self.echo.flush()
            self.problem = problem
        else:
            self.problem = None

    @staticmethod
    def read(directory: Path, since: int = 0) -> dict[str, Any]:
        """Events after ``since``, the next offset, the result, and the state: ``starting``,
        ``running``, ``done``, or ``died`` (gone without a result: killed, rebooted)."""
        text = read_text(directory / "events.jsonl") or ""
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            lines.pop()  # a line being written: not counted in ``next``, read again next time
        events = []
        for line in lines[since:]:
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        result = read_state(directory / "result.json") or None
        if result is not None:
            state = "done"
        elif pid := read_state(directory / "pid.json"):
            state = "running" if holder_alive(pid) else "died"
        else:
            plan = directory / "plan.json"
            age = time.time() - plan.stat().st_mtime if plan.exists() else 0.0
            state = "died" if age > START_GRACE_S else "starting"
        return {"events": events, "next": len(lines), "result": result, "state": state}
