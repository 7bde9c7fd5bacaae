"""Drain: the requests the front accepted finish before the serving stack stops, judged from
the engine's gauges and nginx's old workers, one reading per poll (docs/swap.md, "Drain")::

    d = Drainer(timeout_s=600)
    while not d.observe(clock(), parse_load(metrics_text), front_workers):
        sleep(DRAIN_POLL_S)
    d.report().to_dict()   # {"result": "drained", "seconds": 4.2, "running": 2, ...}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .records import decode
from .verify.metrics import parse, total

DRAIN_POLL_S = 0.5
# Idle reads in a row that make a drain complete.
SETTLE_READS = 2
# The engine's token counters unchanged this long, with the front idle: its gauges are stale.
STALE_S = 5.0
# What nginx calls a worker of an earlier configuration that still serves requests.
NGINX_DRAINING_TITLE = "nginx: worker process is shutting down"

_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")


@dataclass(frozen=True)
class EngineLoad:
    """Requests running and waiting, and the token counters (None when not exported)."""

    running: int
    waiting: int
    tokens: float | None = None

    @property
    def busy(self) -> int:
        return self.running + self.waiting


def parse_load(text: str | None) -> EngineLoad | None:
    """The engine's load from its ``/metrics`` text; None without a request gauge."""
    samples = [s for s in parse(text or "") if s.value == s.value]  # a NaN says nothing
    running, waiting = (total(samples, name) for name in _GAUGES)
    if running is None and waiting is None:
        return None
    tokens = [found for name in _COUNTERS if (found := total(samples, name)) is not None]
    return EngineLoad(max(0, round(running or 0.0)), max(0, round(waiting or 0.0)),
                      sum(tokens) if tokens else None)


def draining_workers(proc: Path = Path("/proc")) -> int | None:
    """nginx workers of an earlier configuration still serving; None when unreadable."""
    try:
        pids = [entry for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return None
    return sum(cmdline(pid).startswith(NGINX_DRAINING_TITLE.encode()) for pid in pids)


def cmdline(pid: Path) -> bytes:
    """A process's command line (empty when it is gone meanwhile, or not ours to read)."""
    try:
        return (pid / "cmdline").read_bytes().replace(b"\0", b" ").strip()
    except OSError:
        return b""


@dataclass(frozen=True)
class DrainReport:
    """How a drain ended (the ledger's ``drain``; fields: docs/swap.md, "Drain"); running,
    waiting and front are as it started."""

    result: str
    seconds: float
    timeout_s: float
    running: int = 0
    waiting: int = 0
    front: int | None = None
    cut: int = 0

    @property
    def waited_for_requests(self) -> bool:
        return self.result in ("drained", "stale", "timeout")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 2)}

    def line(self) -> str:
        held = f"{self.running} running + {self.waiting} waiting"
        if self.front:
            held += f", {self.front} front worker(s) finishing"
        how = " (the engine's gauges were stale, vllm#29928)" if self.result == "stale" else ""
        return {
            "idle": f"nothing in flight ({self.seconds:.1f}s)",
            "unknown": "in-flight requests could not be read (no engine gauges, no front): not "
                       "waited",
            "interrupted": f"interrupted after {self.seconds:.1f}s ({held} at the start)",
            "timeout": f"timeout after {self.seconds:.1f}s: {self.cut} request(s) cut ({held} "
                       "at the start)",
        }.get(self.result, f"{held} finished in {self.seconds:.1f}s, none cut{how}")


Reading = tuple[float, EngineLoad | None, int | None]  # (when, the engine's load, front)


@dataclass
class Drainer:
    """The drain's decisions, fed one observation per poll."""

    timeout_s: float
    _first: Reading | None = None
    _last: Reading | None = None
    _idle: int = 0
    _busy_seen: bool = False
    _tokens: tuple[float, float] | None = None  # (the token counters, unchanged since)
    _result: str | None = None

    @property
    def latest(self) -> tuple[EngineLoad | None, int | None]:
        return self._last[1:] if self._last else (None, None)

    def observe(self, now: float, load: EngineLoad | None, front: int | None) -> bool:
        """Take one reading; True once the drain is over (``report`` says how)."""
        if self._result is None:
            self._last = (now, load, front)
            self._first = self._first or self._last
            self._result = self._decide(now, load, front)
        return self._result is not None

    def _decide(self, now: float, load: EngineLoad | None, front: int | None) -> str | None:
        if load is None and front is None:
            return "unknown"
        if (load is None or load.busy == 0) and not front:
            self._idle += 1
            if self._idle >= SETTLE_READS:
                return "drained" if self._busy_seen else "idle"
        else:
            self._idle, self._busy_seen = 0, True
        if self._stale(now, load, front):
            return "stale"
        assert self._first is not None
        return "timeout" if now - self._first[0] >= self.timeout_s else None

    def _stale(self, now: float, load: EngineLoad | None, front: int | None) -> bool:
        """The engine says it holds requests but makes no token while the front holds none."""
        if load is None or load.busy == 0 or front != 0 or load.tokens is None:
            self._tokens = None
            return False
        if self._tokens is None or self._tokens[0] != load.tokens:
            self._tokens = (load.tokens, now)
            return False
        return now - self._tokens[1] >= STALE_S

    def interrupt(self, now: float) -> None:
        self._last = (now, *self.latest)
        self._first = self._first or self._last
        self._result = self._result or "interrupted"

    def report(self) -> DrainReport:
        t0, start, start_front = self._first or (0.0, None, None)
        end, load, front = self._last or (t0, None, None)
        cut = 0
        if self._result == "timeout":
            cut = load.busy if load is not None and load.busy else max(front or 0, 0)
        return DrainReport(self._result or "unknown", max(0.0, end - t0), self.timeout_s,
                           start.running if start else 0, start.waiting if start else 0,
                           start_front, cut)


def drain_note(result: dict[str, Any]) -> str:
    """``; drain: ...; Retry-After Ns`` of a swap's or window's result, for the deploy's log."""
    note = ""
    if isinstance(data := result.get("drain"), dict):
        report = decode(DrainReport, data)
        note += f"; drain: {report.line() if report else data.get('result')}"
    if result.get("retry_after_s") is not None:
        note += f"; Retry-After {result['retry_after_s']}s"
    return note
