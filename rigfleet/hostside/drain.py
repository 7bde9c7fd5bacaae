"""Drain: let the requests the front accepted finish before the serving stack stops.

When a swap or a maintenance window opens, the front answers every new request with 503 +
Retry-After at once (``front.Front.maintenance``). nginx reloads gracefully: the workers of
the configuration before it stop accepting and keep proxying the requests they hold, streams
included, until each has ended (nginx's own "worker process is shutting down"). The stack
keeps running until those requests are done, judged from two sources:

- the engine's own gauges on its loopback ``/metrics`` (no key): ``vllm:num_requests_running``
  and ``vllm:num_requests_waiting``, summed over engines;
- the front's connections: an nginx worker of an earlier configuration exists only while it
  still holds a request it accepted (its idle keep-alive connections are closed at once).

It is *drained* once both read idle on two polls in a row (a request the old worker accepted
a moment before the switch is on its way to the engine for a few milliseconds). The engine's
gauges can stay up after every request was aborted (vllm#29928: they are refreshed only by
the next engine step): when the front holds nothing and the engine's token counters did not
move for ``stale_s`` seconds, it is drained too. Past the timeout the stack is stopped anyway
and what was still in flight is *cut* (the ledger and the swap report say how many)::

    d = Drainer(timeout_s=600)
    while not d.observe(clock(), parse_load(metrics_text), front_workers):
        sleep(DRAIN_POLL_S)
    d.report().to_dict()   # {"result": "drained", "seconds": 4.2, "running": 2, ...}

Stdlib only: it ships inside the host-side bundle.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DRAIN_POLL_S = 0.5
# Idle reads in a row that make a drain complete.
SETTLE_READS = 2
# The engine's token counters unchanged this long, with the front idle: its gauges are stale.
STALE_S = 5.0
# What nginx calls a worker of an earlier configuration that still serves requests.
NGINX_DRAINING_TITLE = "nginx: worker process is shutting down"

_SAMPLE = re.compile(r"^(vllm:[A-Za-z0-9_]+)(?:\{[^}]*\})?\s+([-+0-9.eEinfNa]+)\s*$")
_GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}
_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")


@dataclass(frozen=True)
class EngineLoad:
    """What the engine says it holds: requests running and waiting, and its token counters
    (prompt + generated, None when it exports none): they move while it works."""

    running: int
    waiting: int
    tokens: float | None = None

    @property
    def busy(self) -> int:
        return self.running + self.waiting


def parse_load(text: str | None) -> EngineLoad | None:
    """The engine's load from its ``/metrics`` text (Prometheus exposition format); None when
    there is no answer or no request gauge (``--disable-log-stats`` empties ``/metrics``)."""
    if not text:
        return None
    found: dict[str, float] = {}
    tokens: float | None = None
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        name = m.group(1)
        if name in _GAUGES:
            found[_GAUGES[name]] = found.get(_GAUGES[name], 0.0) + value
        elif name in _COUNTERS:
            tokens = (tokens or 0.0) + value
    if not found:
        return None
    return EngineLoad(max(0, round(found.get("running", 0.0))),
                      max(0, round(found.get("waiting", 0.0))), tokens)


def draining_workers(proc: Path = Path("/proc")) -> int | None:
    """nginx workers of an earlier configuration still serving what they accepted (their
    process title, ``NGINX_DRAINING_TITLE``); None when ``proc`` cannot be read."""
    try:
        entries = list(proc.iterdir())
    except OSError:
        return None
    count = 0
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if title.replace(b"\0", b" ").strip().startswith(NGINX_DRAINING_TITLE.encode()):
            count += 1
    return count


@dataclass(frozen=True)
class DrainReport:
    """How a drain ended (the ledger's ``drain``, the swap's result).

    + result: ``idle`` (nothing was in flight), ``drained`` (what was in flight finished),
      ``stale`` (the front held nothing and the engine made no token for ``STALE_S``: its
      gauges were stale), ``timeout`` (stopped with requests in flight: ``cut``),
      ``unknown`` (neither the engine's gauges nor the front could be read: not waited),
      ``interrupted`` (the transaction was asked to stop while draining)
    + seconds: how long it waited; timeout_s: its limit
    + running, waiting: the engine's requests when it started; front: the front's workers
      of the earlier configuration then (None: not readable)
    + cut: requests still in flight when it ended (0 unless ``timeout``)
    """

    result: str
    seconds: float
    timeout_s: float
    running: int = 0
    waiting: int = 0
    front: int | None = None
    cut: int = 0

    @property
    def waited_for_requests(self) -> bool:
        """Something was in flight when it started (its time says how long requests last)."""
        return self.result in ("drained", "stale", "timeout")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 2)
        return data

    def line(self) -> str:
        """One line for people (journal, deploy log)."""
        held = f"{self.running} running + {self.waiting} waiting"
        if self.front:
            held += f", {self.front} front worker(s) finishing"
        if self.result == "idle":
            return f"nothing in flight ({self.seconds:.1f}s)"
        if self.result == "unknown":
            return "in-flight requests could not be read (no engine gauges, no front): not " \
                "waited"
        if self.result == "interrupted":
            return f"interrupted after {self.seconds:.1f}s ({held} at the start)"
        if self.result == "timeout":
            return f"timeout after {self.seconds:.1f}s: {self.cut} request(s) cut ({held} at " \
                "the start)"
        how = " (the engine's gauges were stale, vllm#29928)" if self.result == "stale" else ""
        return f"{held} finished in {self.seconds:.1f}s, none cut{how}"


@dataclass
class Drainer:
    """The drain's decisions, fed one observation per poll (pure; see the module docstring).

    + timeout_s: stop waiting after this long (then what is in flight is cut)
    """

    timeout_s: float
    settle: int = SETTLE_READS
    stale_s: float = STALE_S
    _t0: float | None = None
    _last: float = 0.0
    _start: tuple[EngineLoad | None, int | None] = (None, None)
    _now: tuple[EngineLoad | None, int | None] = (None, None)
    _idle: int = 0
    _busy_seen: bool = False
    _tokens: float | None = None
    _tokens_since: float = 0.0
    _result: str | None = field(default=None)

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def latest(self) -> tuple[EngineLoad | None, int | None]:
        """The last reading: (engine load, front workers)."""
        return self._now

    def observe(self, now: float, load: EngineLoad | None, front: int | None) -> bool:
        """Take one reading (``load``: ``parse_load``; ``front``: ``draining_workers``);
        True once the drain is over (``report`` says how)."""
        if self._result is not None:
            return True
        if self._t0 is None:
            self._t0, self._start = now, (load, front)
        self._last, self._now = now, (load, front)
        if load is None and front is None:
            self._result = "unknown"
            return True
        engine_idle = load is None or load.busy == 0
        front_idle = front is None or front == 0
        if engine_idle and front_idle:
            self._idle += 1
            if self._idle >= self.settle:
                self._result = "drained" if self._busy_seen else "idle"
                return True
        else:
            self._idle, self._busy_seen = 0, True
        if self._stale(now, load, front):
            self._result = "stale"
            return True
        if now - self._t0 >= self.timeout_s:
            self._result = "timeout"
            return True
        return False

    def _stale(self, now: float, load: EngineLoad | None, front: int | None) -> bool:
        """The engine says it holds requests but makes no token while the front holds none."""
        if load is None or load.busy == 0 or front != 0 or load.tokens is None:
            self._tokens = None
            return False
        if self._tokens != load.tokens:
            self._tokens, self._tokens_since = load.tokens, now
            return False
        return now - self._tokens_since >= self.stale_s

    def interrupt(self, now: float) -> None:
        """The transaction was asked to stop: the drain ends here."""
        if self._t0 is None:
            self._t0 = now
        self._last = now
        self._result = self._result or "interrupted"

    def report(self) -> DrainReport:
        start_load, start_front = self._start
        load, front = self._now
        cut = 0
        if self._result == "timeout":
            cut = load.busy if load is not None and load.busy else max(front or 0, 0)
        return DrainReport(
            result=self._result or "unknown",
            seconds=max(0.0, self._last - (self._t0 if self._t0 is not None else self._last)),
            timeout_s=self.timeout_s,
            running=start_load.running if start_load else 0,
            waiting=start_load.waiting if start_load else 0,
            front=start_front, cut=cut)


def drain_note(result: dict[str, Any]) -> str:
    """What a swap's or window's result (``drain``, ``retry_after_s``) says about its drain,
    for the deploy's log; "" when it has neither::

        drain_note({"drain": {"result": "idle", "seconds": 0.5, "timeout_s": 600},
                    "retry_after_s": 21})   # "; drain: nothing in flight (0.5s); ..."
    """
    parts = []
    data = result.get("drain")
    if isinstance(data, dict):
        try:
            report = DrainReport(**{k: data[k] for k in DRAIN_KEYS if k in data})
            parts.append(f"drain: {report.line()}")
        except TypeError:
            parts.append(f"drain: {data.get('result')}")
    if result.get("retry_after_s") is not None:
        parts.append(f"Retry-After {result['retry_after_s']}s")
    return "".join(f"; {p}" for p in parts)


DRAIN_KEYS = ("result", "seconds", "timeout_s", "running", "waiting", "front", "cut")

__all__ = ["DRAIN_KEYS", "DRAIN_POLL_S", "DrainReport", "Drainer",
           "EngineLoad", "drain_note", "draining_workers", "parse_load"]
