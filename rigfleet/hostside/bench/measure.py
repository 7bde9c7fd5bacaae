"""The bench's measuring core: streamed requests in the bench's shapes and at context depths,
reduced to figures (definitions: docs/bench.md, "What is measured")::

    result = Bench(Client(url, key), BenchSettings(concurrency=2, depths=(16000,))).run()
    result.shapes["code"].decode_mean, result.shapes["code"].acceptance
    result.to_dict()                     # the JSON report's "bench" part
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..records import SHAPES, ShapeFigures, ThroughputRecord, encode, now_iso
from ..verify import metrics, prompts
from ..verify.client import ChatResult, Client, max_model_len, redact_url

WARMUP_MAX_TOKENS = 128


@dataclass(frozen=True)
class Shape:
    """One request shape: the user ``prompt``, its answer budget and sampling temperature."""

    name: str
    prompt: str
    max_tokens: int
    temperature: float = 0.6

    def messages(self) -> prompts.Messages:
        return [{"role": "user", "content": self.prompt}]


# Seed 004's bench, so a figure stands beside a stack file's reference.
NARRATIVE = Shape(
    "narrative",
    "Write an 800-word essay about the history of lighthouses: how they were built, how "
    "their lights were made to reach ships far out at sea, and the lives of the keepers who "
    "tended them through storms and long winters.",
    max_tokens=1000,
)
CODE = Shape(
    "code",
    "Implement quicksort in Python. Comment every step: how the pivot is chosen, how the "
    "list is partitioned around it, why the recursion ends, and what the running time is in "
    "the best and the worst case.",
    max_tokens=800,
)
BY_NAME = {s.name: s for s in (NARRATIVE, CODE)}

DEPTH_MAX_TOKENS = 256
DEPTH_INSTRUCTION = "Continue this history of computing in about 300 words."


def depth_messages(salt: str, units: int) -> prompts.Messages:
    """A fresh salt (no cached prefix stands in for the prefill), ``units`` filler, the ask."""
    text = f"SESSION-{salt}. {prompts.filler(units)}\n\n{DEPTH_INSTRUCTION}"
    return [{"role": "user", "content": text}]


class Progress:
    """Progress hooks of the bench (begin, step, note) and the gate (tick); this one is mute."""

    def tick(self, mark: str) -> None:
        pass

    def begin(self, total: int) -> None:
        pass

    def step(self, label: str) -> None:
        self.tick(".")

    def note(self, text: str) -> None:
        pass


@dataclass(frozen=True)
class BenchSettings:
    """How much the bench sends."""

    runs: int = 5
    warmup: int = 3  # unmeasured rounds of one request per shape
    timeout_s: float = 300.0  # per request
    concurrency: int = 0  # streams of the concurrency run; 0: none
    depths: tuple[int, ...] = ()
    shapes: tuple[str, ...] = SHAPES


@dataclass(frozen=True)
class RunResult:
    """One streamed request."""

    shape: str
    status: int
    seconds: float  # the whole request
    first_token_s: float | None  # seconds to the first generated token
    completion_tokens: int | None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str = ""
    first_tokens: int | None = None  # tokens the first chunk held (continuous usage)
    server_decode_s: float | None = None  # the engine's own decode time (/metrics)

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and bool(self.completion_tokens)

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first / the engine's decode time (a busy client reads chunks late),
        else the tokens after the first chunk's / the client's time from that chunk to the end."""
        if self.ok and self.server_decode_s and (self.completion_tokens or 0) > 1:
            return ((self.completion_tokens or 0) - 1) / self.server_decode_s
        if not self.ok or self.first_token_s is None or self.seconds <= self.first_token_s:
            return None
        tokens = (self.completion_tokens or 0) - (self.first_tokens or 0)
        return tokens / (self.seconds - self.first_token_s) if tokens > 0 else None

    @property
    def why(self) -> str:
        """What the run got instead of a measurement, as the gate words it."""
        if not self.status:
            return f"no HTTP answer: {self.error}"
        return f"HTTP {self.status}" + (f": {self.error}" if self.error else "")

    @property
    def wall_tok_s(self) -> float | None:
        return (self.completion_tokens or 0) / self.seconds if self.ok and self.seconds else None

    @classmethod
    def of(cls, shape: str, res: ChatResult, server_decode_s: float | None = None) -> RunResult:
        error = res.error_message()[:300] if not res.ok else (
            "" if res.completion_tokens else "the server reported no completion tokens "
            "(no usage in the stream)")
        return cls(shape, res.status, res.seconds, res.first_token, res.completion_tokens,
                   res.prompt_tokens, res.finish_reason, error, res.first_tokens,
                   server_decode_s)

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "http_status": self.status,
                "seconds": round(self.seconds, 4), "ttft_s": _r(self.first_token_s, 4),
                "completion_tokens": self.completion_tokens, "prompt_tokens": self.prompt_tokens,
                "finish_reason": self.finish_reason, "decode_tok_s": _r(self.decode_tok_s, 2),
                "server_decode_s": _r(self.server_decode_s, 4),
                "wall_tok_s": _r(self.wall_tok_s, 2), "error": self.error or None}


@dataclass(frozen=True)
class Acceptance:
    """MTP acceptance over some runs (the definitions: docs/bench.md, "What is measured")."""

    drafts: int
    length: float
    per_position: tuple[float, ...] = ()
    rate: float | None = None

    def __str__(self) -> str:
        positions = "/".join(f"{x:.0%}" for x in self.per_position)
        return f"{positions} (AL {self.length:.2f})" if positions else f"AL {self.length:.2f}"

    def to_dict(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "length": round(self.length, 3),
                "per_position": [round(x, 4) for x in self.per_position],
                "rate": _r(self.rate, 4)}


def decode_seconds_between(before: list[metrics.Sample] | None,
                           after: list[metrics.Sample] | None, model: str) -> float | None:
    """One request's decode seconds between two scrapes; None unless just one finished between."""
    c0, c1, s0, s1 = (metrics.total(samples, name, model_name=model)
                      for name in (metrics.DECODE_TIME_COUNT, metrics.DECODE_TIME_SUM)
                      for samples in (before, after))
    if None in (c0, c1, s0, s1) or (c1 or 0) - (c0 or 0) != 1:
        return None
    seconds = (s1 or 0) - (s0 or 0)
    return seconds if seconds > 0 else None


def acceptance_between(before: list[metrics.Sample] | None, after: list[metrics.Sample] | None,
                       model: str) -> tuple[Acceptance | None, str]:
    """(acceptance, "") from two ``/metrics`` scrapes, or (None, why it is unknown)."""
    if before is None or after is None:
        return None, "unknown: no /metrics"
    if metrics.total(after, metrics.SPEC_DRAFTS, model_name=model) is None:
        return None, f"unknown: no {metrics.SPEC_DRAFTS} in /metrics (MTP off, or stats off)"
    drafts = metrics.delta(before, after, metrics.SPEC_DRAFTS, model_name=model)
    if drafts <= 0:
        return None, "unknown: the spec-decode counters did not move during the runs"
    accepted = metrics.delta(before, after, metrics.SPEC_ACCEPTED, model_name=model)
    draft_tokens = metrics.delta(before, after, metrics.SPEC_DRAFT_TOKENS, model_name=model)
    pp0 = metrics.by_label(before, metrics.SPEC_ACCEPTED_PER_POS, "position", model_name=model)
    pp1 = metrics.by_label(after, metrics.SPEC_ACCEPTED_PER_POS, "position", model_name=model)
    positions = sorted(pp1, key=lambda k: int(k) if k.isdigit() else 0)
    per_pos = tuple((pp1[k] - pp0.get(k, 0.0)) / drafts for k in positions)
    rate = accepted / draft_tokens if draft_tokens > 0 else None
    return Acceptance(int(drafts), 1.0 + accepted / drafts, per_pos, rate), ""


@dataclass
class ShapeResult:
    """One shape's measured runs and the acceptance around them."""

    shape: str
    runs: list[RunResult] = field(default_factory=list)
    acceptance: Acceptance | None = None
    acceptance_note: str = ""

    @property
    def decode(self) -> list[float]:
        return [r.decode_tok_s for r in self.runs if r.decode_tok_s is not None]

    @property
    def decode_mean(self) -> float | None:
        return mean(self.decode)

    @property
    def decode_cv(self) -> float | None:
        """Sample standard deviation over the mean; None for fewer than two measured runs."""
        if len(decode := self.decode) < 2 or (m := statistics.fmean(decode)) <= 0:
            return None
        return statistics.stdev(decode) / m

    @property
    def wall_mean(self) -> float | None:
        return mean([r.wall_tok_s for r in self.runs if r.wall_tok_s is not None])

    @property
    def ttft_mean(self) -> float | None:
        return mean([r.first_token_s for r in self.runs if r.ok and r.first_token_s is not None])

    @property
    def failed(self) -> list[RunResult]:
        return [r for r in self.runs if r.decode_tok_s is None]

    def figures(self) -> ShapeFigures | None:
        """The record's figures (None when no run measured a decode speed)."""
        if (m := self.decode_mean) is None:
            return None
        return ShapeFigures(decode=round(m, 3), cv=_r(self.decode_cv, 4),
                            wall=_r(self.wall_mean, 3), ttft_s=_r(self.ttft_mean, 4),
                            runs=len(self.decode))

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "decode_mean": _r(self.decode_mean, 2),
                "decode_cv": _r(self.decode_cv, 4), "wall_mean": _r(self.wall_mean, 2),
                "ttft_mean_s": _r(self.ttft_mean, 4),
                "acceptance": self.acceptance.to_dict() if self.acceptance else None,
                "acceptance_note": self.acceptance_note or None,
                "runs": [r.to_dict() for r in self.runs]}


@dataclass
class ConcurrencyResult:
    """``streams`` narrative requests at once; the aggregate is over the batch's wall time."""

    streams: int
    runs: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def per_stream_decode(self) -> float | None:
        return mean([r.decode_tok_s for r in self.runs if r.decode_tok_s is not None])

    @property
    def aggregate_tok_s(self) -> float | None:
        tokens = sum(r.completion_tokens or 0 for r in self.runs if r.ok)
        return tokens / self.seconds if tokens and self.seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"streams": self.streams, "seconds": round(self.seconds, 3),
                "per_stream_decode": _r(self.per_stream_decode, 2),
                "aggregate_tok_s": _r(self.aggregate_tok_s, 2),
                "runs": [r.to_dict() for r in self.runs]}


@dataclass
class DepthResult:
    """Decode speed with ``depth`` tokens of context (or why it was not measured)."""

    depth: int
    prompt_tokens: int | None = None
    run: RunResult | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"depth": self.depth, "prompt_tokens": self.prompt_tokens,
                "decode_tok_s": _r(self.run.decode_tok_s, 2) if self.run else None,
                "ttft_s": _r(self.run.first_token_s, 3) if self.run else None,
                "run": self.run.to_dict() if self.run else None, "note": self.note or None}


@dataclass
class BenchResult:
    """Everything one bench measured (``to_dict``: the JSON report's ``bench`` part)."""

    url: str
    model: str = ""
    version: str = ""
    max_model_len: int | None = None
    settings: BenchSettings = field(default_factory=BenchSettings)
    shapes: dict[str, ShapeResult] = field(default_factory=dict)
    concurrency: ConcurrencyResult | None = None
    depths: list[DepthResult] = field(default_factory=list)
    seconds: float = 0.0
    request_seconds: float = 0.0  # time spent inside requests (the rest is the bench's own)
    notes: list[str] = field(default_factory=list)
    error: str = ""  # the server could not be benched at all

    @property
    def overhead_s(self) -> float:
        """Wall time outside the requests: scrapes, sizing, the bench's own work."""
        return max(self.seconds - self.request_seconds, 0.0)

    def record(self, stack: str, **fields: Any) -> ThroughputRecord:
        """The shapes' figures and the code shape's MTP acceptance as a record of ``stack``
        (``fields``: the rest; ``acceptance`` defaults to the per-position figures)."""
        acc = self.shapes["code"].acceptance if "code" in self.shapes else None
        fields.setdefault("acceptance", acc.per_position if acc else None)
        return ThroughputRecord(
            stack=stack, at=now_iso(suffix="Z"), model=self.model,
            shapes={k: f for k, v in self.shapes.items() if (f := v.figures()) is not None},
            acceptance_length=acc.length if acc else None, **fields)

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model, "version": self.version,
                "max_model_len": self.max_model_len, "settings": encode(self.settings),
                "shapes": {k: v.to_dict() for k, v in self.shapes.items()},
                "concurrency": self.concurrency.to_dict() if self.concurrency else None,
                "depths": [d.to_dict() for d in self.depths],
                "seconds": round(self.seconds, 3), "overhead_s": round(self.overhead_s, 3),
                "notes": list(self.notes), "error": self.error or None}


class Bench:
    """Runs the bench against one server; ``model`` defaults to the first of ``/v1/models``."""

    def __init__(self, client: Client, settings: BenchSettings,
                 progress: Progress | None = None, model: str = ""):
        self.client = client
        self.settings = settings
        self.progress = progress or Progress()
        self.result = BenchResult(url=redact_url(client.base_url), model=model,
                                  settings=settings)

    def note(self, text: str) -> None:
        self.result.notes.append(text)
        self.progress.note(text)

    def scrape_after(self, before: list[metrics.Sample] | None) -> list[metrics.Sample] | None:
        """A scrape once the request just streamed is in the decode histogram (a second at most)."""
        n0 = metrics.total(before, metrics.DECODE_TIME_COUNT, model_name=self.result.model)
        for _ in range(50):
            now = metrics.scrape(self.client, 30)
            n1 = metrics.total(now, metrics.DECODE_TIME_COUNT, model_name=self.result.model)
            if n0 is None or n1 is None or n1 > n0:
                return now
            time.sleep(0.02)
        return now

    def _chat(self, messages: prompts.Messages, max_tokens: int, temperature: float,
              label: str, timed: bool = True) -> ChatResult:
        """One streamed request (``timed``: its seconds count as time inside requests)."""
        body = prompts.chat_body(self.result.model, messages, max_tokens, temperature)
        res = self.client.chat(body, timeout=self.settings.timeout_s, stream=True)
        if timed:
            self.result.request_seconds += res.seconds
        self.progress.step(label)
        return res

    def prepare(self) -> bool:
        """Learn the model, max-model-len and version; False (``error`` set) without a model."""
        cards, status, why = self.client.models(30)
        if not cards:
            self.result.error = f"GET /v1/models: HTTP {status}: {why}"
            return False
        self.result.model = self.result.model or str(cards[0].get("id") or "")
        self.result.max_model_len = max_model_len(cards[0])
        self.result.version = self.client.version(30) or self.result.version
        return True

    def shapes(self) -> dict[str, ShapeResult]:
        """The warm-up rounds, then each of the settings' shapes (``shape``), kept in the result."""
        for _ in range(self.settings.warmup):
            for name in self.settings.shapes:
                shape = BY_NAME[name]
                self._chat(shape.messages(), min(shape.max_tokens, WARMUP_MAX_TOKENS),
                           shape.temperature, f"warm-up {name}")
        self.result.shapes = {name: self.shape(BY_NAME[name]) for name in self.settings.shapes}
        return self.result.shapes

    def shape(self, shape: Shape) -> ShapeResult:
        """``runs`` requests of ``shape``, one after the other, with /metrics around them."""
        out = ShapeResult(shape.name)
        before = last = metrics.scrape(self.client, 30)
        for _ in range(self.settings.runs):
            res = self._chat(shape.messages(), shape.max_tokens, shape.temperature, shape.name)
            now = self.scrape_after(last)
            out.runs.append(RunResult.of(shape.name, res,
                                         decode_seconds_between(last, now, self.result.model)))
            last = now
        out.acceptance, out.acceptance_note = acceptance_between(before, last, self.result.model)
        for r in out.failed[:1]:
            self.note(f"{shape.name}: a run measured nothing ({r.why})")
        return out

    def concurrency(self, streams: int) -> ConcurrencyResult:
        out = ConcurrencyResult(streams)
        barrier = threading.Barrier(streams)

        def one(_: int) -> RunResult:
            barrier.wait(timeout=30)
            res = self._chat(NARRATIVE.messages(), NARRATIVE.max_tokens, NARRATIVE.temperature,
                             f"{streams} streams", timed=False)
            return RunResult.of("concurrency", res)

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=streams, thread_name_prefix="bench") as pool:
            out.runs = list(pool.map(one, range(streams)))
        out.seconds = time.monotonic() - t0
        self.result.request_seconds += out.seconds
        return out

    def depths(self, depths: Sequence[int]) -> list[DepthResult]:
        """One request per depth, its prompt sized to ``depth`` tokens by the server's count."""
        sizer = prompts.server_sizer(self.client, self.result.model, 60, self.settings.timeout_s,
                                     self.note)
        out = []
        for depth in depths:
            out.append(row := DepthResult(depth))
            try:
                if (mml := self.result.max_model_len) and depth + DEPTH_MAX_TOKENS > mml:
                    raise prompts.SizingError(f"over max-model-len {mml}")
                sized = sizer.fit("depth", partial(depth_messages, prompts.new_salt()), depth)
            except prompts.SizingError as e:
                row.note = f"skipped: {e}"
                self.progress.step(f"depth {depth}")
                continue
            row.prompt_tokens = sized.tokens
            res = self._chat(sized.messages, DEPTH_MAX_TOKENS, 0.6, f"depth {depth}")
            row.run = RunResult.of("depth", res)
            if not row.run.ok:
                row.note = f"failed: {row.run.why}"[:300]
        return out

    def run(self) -> BenchResult:
        """Everything the settings ask for; never raises for a server problem."""
        t0 = time.monotonic()
        s = self.settings
        self.progress.begin(len(s.shapes) * (s.warmup + s.runs) + s.concurrency + len(s.depths))
        if self.prepare():
            self.shapes()
            if s.concurrency > 0:
                self.result.concurrency = self.concurrency(s.concurrency)
            self.result.depths = self.depths(s.depths)
        self.result.seconds = time.monotonic() - t0
        return self.result


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _r(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
