"""benchmarks/loadgen.py: its targets, how it classifies answers, its tally, its caps, and a
short run against a fake front on loopback (answers, 503s and streams cut mid-way)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from balancer_helpers import API_KEY, FakeFront

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from loadgen import (
    LoadConfig,
    Outcome,
    StreamScan,
    Tally,
    TargetRefused,
    check_target,
    classify,
    percentile,
    run,
    scan_sse,
)


@pytest.mark.parametrize("url", ["http://127.0.0.1:18450", "http://127.3.4.5/", "http://[::1]:80",
                                 "https://10.213.11.30:8080", "http://localhost:8000"])
def test_loopback_and_testbed_targets_are_accepted(url):
    assert check_target(url) == url.rstrip("/")


@pytest.mark.parametrize(("url", "why"), [
    ("http://192.168.1.41:8000", "is 192.168.1.41, not loopback or a testbed host"),
    ("http://10.213.17.2:8000", "is 10.213.17.2, not loopback"),
    ("http://8.8.8.8", "not loopback"),
    ("ftp://127.0.0.1", "is not valid"),
    ("http://rig-a.lan:8000", "does not resolve"),
])
def test_other_targets_are_refused(url, why):
    def resolve(host: str):
        raise OSError("Name or service not known")

    with pytest.raises(TargetRefused, match=why):
        check_target(url, resolve)


def test_a_name_must_resolve_only_to_allowed_addresses():
    assert check_target("http://host1:8000", lambda h: ["10.213.11.11"]) == "http://host1:8000"
    with pytest.raises(TargetRefused, match="is 203.0.113.5"):
        check_target("http://host1:8000", lambda h: ["10.213.11.11", "203.0.113.5"])


def test_scan_sse_reads_events_done_and_the_finish_reason():
    lines = [b'data: {"choices": [{"delta": {"content": "a"}}]}\n', b"\n", b": keep-alive\n",
             b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n', b"data: [DONE]\n"]
    assert scan_sse(lines) == StreamScan(2, True, "stop")
    assert scan_sse(lines[:2]) == StreamScan(1, False, None)


@pytest.mark.parametrize(("args", "result", "reason"), [
    ((None, "conn: refused", True, StreamScan(), None), "failed", "conn: refused"),
    ((503, None, True, StreamScan(), None), "failed", "503"),
    ((200, None, True, StreamScan(5, True, "length"), 0.1), "completed", ""),
    ((200, None, True, StreamScan(3, False, None), 0.1), "cut", "no finish_reason"),
    ((200, None, True, StreamScan(3, False, "stop"), 0.1), "cut", "no [DONE]"),
    ((200, "conn: reset", True, StreamScan(3, False, None), 0.1), "cut", "conn: reset"),
    ((200, None, True, StreamScan(), None), "failed", "empty stream"),
    ((200, None, False, b'{"choices": [{"finish_reason": "stop"}]}', 0.1), "completed", ""),
    ((200, None, False, b'{"choices": [{"finish', 0.1), "failed", "truncated or not JSON"),
])
def test_classify(args, result, reason):
    status, error, stream, body, first = args
    got = classify("k", status, error, stream, body, first, 1.0)
    assert (got.result, got.reason) == (result, reason)


def test_tally_counts_and_percentiles():
    t = Tally(sent=5)
    for i, s in enumerate((0.1, 0.2, 0.3)):
        t.add(Outcome("k", "completed", "", s / 10, s))
        assert i < 3
    t.add(Outcome("k", "failed", "503", None, 0.01))
    t.add(Outcome("k", "cut", "no [DONE]", 0.01, 0.5))
    r = t.report(3.0)
    assert (r.sent, r.completed, r.failed, r.cut) == (5, 3, {"503": 1}, 1)
    assert r.latency_s["total"] == {"p50": 0.2, "p90": 0.3, "p99": 0.3, "max": 0.3}
    assert percentile([], 50) is None
    assert r.lines()[0] == "sent 5  completed 3  failed 1 (503: 1)  cut 1 (no [DONE]: 1)  in 3 s"


@pytest.mark.parametrize(("field", "value", "named"), [
    ("rate", 500.0, "--rate 500"), ("duration_s", 3600.0, "--duration 3600"),
    ("requests", 10**6, "--requests 1000000"), ("max_inflight", 1000, "--max-inflight 1000")])
def test_caps_are_hard(field, value, named):
    cfg = LoadConfig("http://127.0.0.1:1", API_KEY, **{field: value})
    with pytest.raises(ValueError, match=named):
        cfg.checked()


def test_run_keeps_to_the_schedule_and_stops_by_itself():
    sent: list[float] = []
    start = time.monotonic()

    def send(cfg, i):
        sent.append(time.monotonic() - start)
        return Outcome("k", "completed", "", 0.0, 0.0)

    report = run(LoadConfig("http://127.0.0.1:1", API_KEY, rate=20, duration_s=0.5), send=send)
    assert report.sent == 10 and report.completed == 10
    assert sent == sorted(sent) and sent[-1] >= 0.4  # on schedule, not all at once
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    stopped = run(LoadConfig("http://127.0.0.1:1", API_KEY, rate=10, duration_s=5), stop,
                  send=send)
    assert 1 <= stopped.sent <= 4


def test_a_short_run_against_a_front_counts_answers_refusals_and_cut_streams():
    front = FakeFront("host1", "int8")
    try:
        url = f"http://127.0.0.1:{front.port}"
        cfg = LoadConfig(url, API_KEY, rate=40, duration_s=0.2, long_chars=2000)
        ok = run(cfg)
        assert (ok.sent, ok.completed, ok.failed, ok.cut) == (8, 8, {}, 0)
        assert {s["length"] > 2000 for s in front.seen} == {True, False}  # long and short
        front.cut_after = 2
        cut = run(cfg)
        assert cut.cut == 4 and cut.completed == 4  # the streams are cut, the rest complete
        front.cut_after, front.serving = None, False
        refused = run(cfg)
        assert refused.failed == {"503": 8} and refused.completed == 0
    finally:
        front.close()
