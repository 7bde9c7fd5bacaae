"""The gate's checks against stand-in clients (no server): their judgements and their waits."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import pytest

from rigfleet.hostside.verify import checks
from rigfleet.hostside.verify.client import ChatResult
from rigfleet.hostside.verify.profiles import resolve
from rigfleet.hostside.verify.report import CheckResult


class StubClient:
    """Answers every chat with ``reply`` after ``delay_s``; ``on_first`` runs on the first."""

    def __init__(self, reply: ChatResult, delay_s: float = 0.0, on_first: Any = None):
        self.reply, self.delay_s, self.on_first = reply, delay_s, on_first
        self.calls = 0
        self._lock = threading.Lock()

    def chat(self, body: dict[str, Any], timeout: float, stream: bool = False) -> ChatResult:
        with self._lock:
            self.calls += 1
            first = self.calls == 1
        if first and self.on_first:
            self.on_first()
        time.sleep(self.delay_s)
        return self.reply


HEALTHY = ChatResult(200, content="Sure: the function returns the sum of both numbers.",
                     usage={"completion_tokens": 12, "prompt_tokens": 40}, finish_reason="stop",
                     ttft=0.01)


def test_ctrl_c_during_the_soak_stops_the_sessions_in_flight():
    """Ctrl-C in the soak: the sessions whose request was in flight went on sending their
    remaining turns in the background (up to soak_turns requests each, minutes apiece), and
    the process, "verify: interrupted" printed, could not exit before them; now each stops
    after the request it is waiting for."""
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread() is threading.main_thread()
    client = StubClient(HEALTHY, delay_s=0.25,
                        on_first=lambda: signal.pthread_kill(main, signal.SIGINT))
    prof = resolve("fast", ["soak_sessions=20", "soak_turns=5", "soak_concurrency=2"])
    ctx = checks.Context(client, prof)  # type: ignore[arg-type]
    # Ctrl-C as Python answers it (pytest-xdist's workers ignore SIGINT).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            checks.soak(ctx, CheckResult("soak", "Soak"))
    finally:
        signal.signal(signal.SIGINT, previous)
    time.sleep(1.0)  # the in-flight sessions' other turns would be sent by now
    assert client.calls <= prof.soak_concurrency


def test_a_repeated_line_finding_counts_the_repeats_it_saw():
    """A line 8 times in a row was reported as repeating "5 times" (the limit, not the run)."""
    from rigfleet.hostside.verify.health import detect_repeated_line

    found = detect_repeated_line("Intro.\n" + "I will check the file.\n" * 8 + "Done.",
                                 resolve("full"))
    assert found is not None
    assert found.message == "the line 'I will check the file.' repeats 8 times in a row"


def test_a_soak_turn_without_an_http_answer_says_so():
    """A soak turn that timed out or lost its connection was reported as "HTTP 0: timed out",
    a status no server sent; the other checks say "no HTTP answer"."""
    client = StubClient(ChatResult(0, error="timed out"))
    ctx = checks.Context(client, resolve("fast", ["soak_sessions=1", "soak_turns=2"]))  # type: ignore[arg-type]
    out = checks.soak(ctx, CheckResult("soak", "Soak"))
    assert out.status == "fail"
    assert [(f.name, f.message, f.where) for f in out.findings] == [
        ("turn_error", "no HTTP answer: timed out", "s1t1")]


def test_throughput_runs_without_an_http_answer_say_so():
    """Throughput runs that timed out read "(first: HTTP 0: timed out)" in the gate's finding
    and "a run measured nothing (HTTP 0: timed out)" in the bench's note."""
    from rigfleet.hostside.bench.measure import CODE, Bench, BenchSettings

    class Notes(checks.Progress):
        def __init__(self) -> None:
            self.notes: list[str] = []

        def note(self, text: str) -> None:
            self.notes.append(text)

    class NoMetrics(StubClient):
        base_url = "http://rig-a:8000"

        def request(self, *args: Any, **kwargs: Any) -> ChatResult:
            return ChatResult(404)

    progress = Notes()
    bench = Bench(NoMetrics(ChatResult(0, error="timed out")),  # type: ignore[arg-type]
                  BenchSettings(runs=2, warmup=0), progress)
    result = bench.shape(CODE)
    assert progress.notes == ["code: a run measured nothing (no HTTP answer: timed out)"]
    assert checks._failed_runs(result).message == (
        "code: 2/2 runs measured nothing (first: no HTTP answer: timed out)")


def test_a_soak_turn_the_engine_aborted_is_a_turn_error():
    """A turn streamed with healthy text but finish_reason "abort" counted as a good turn."""
    from test_verify_client import sse_server

    from rigfleet.hostside.verify.client import Client

    def body(w: Any) -> None:
        for event in ({"choices": [{"index": 0, "delta": {"content": HEALTHY.content}}]},
                      {"choices": [{"index": 0, "delta": {}, "finish_reason": "abort"}]},
                      {"choices": [], "usage": HEALTHY.usage}):
            w.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        w.write(b"data: [DONE]\n\n")
        w.flush()

    with sse_server(body) as url:
        ctx = checks.Context(Client(url), resolve("fast", ["soak_sessions=1", "soak_turns=2"]))
        out = checks.soak(ctx, CheckResult("soak", "Soak"))
    assert out.status == "fail" and out.details["turns_done"] == 1
    assert [(f.name, f.where) for f in out.findings] == [("turn_error", "s1t1")]
    assert 'finish_reason "abort"' in out.findings[0].message
