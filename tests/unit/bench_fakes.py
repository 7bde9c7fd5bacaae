"""A paced OpenAI-compatible server for the bench's tests (and benchmarks/bench_overhead.py).

It streams like an MTP engine: each step verifies drafts (accepted per draft position with
the configured unconditional rates, a run stops at the first rejection), sleeps to a deadline
so a slow client cannot stretch it, and emits ``1 + accepted`` tokens in one SSE chunk;
``/metrics`` carries vLLM's spec-decode counters::

    with PacedServer(Pace(step_rate=100.0)) as srv:
        Client(srv.url).chat({...}, timeout=30, stream=True)

A request whose prompt mentions ``quicksort`` decodes with the code acceptance, else the
narrative one (as seed 000/004's figures differ by content). ``speeds`` gives per-request
speed factors in turn (a deterministic spread for the CV tests).
"""

from __future__ import annotations

import itertools
import json
import random
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "qwen3.6-27b-autoround"
CODE_ACCEPTANCE = (0.95, 0.84, 0.75)
NARRATIVE_ACCEPTANCE = (0.82, 0.52, 0.31)


@dataclass
class Pace:
    """How the fake serves: engine steps per second, MTP drafts per step (0: no MTP),
    acceptance per shape, prefill seconds, per-request speed factors, what it exposes."""

    step_rate: float = 200.0
    k: int = 3
    code: tuple[float, ...] = CODE_ACCEPTANCE
    narrative: tuple[float, ...] = NARRATIVE_ACCEPTANCE
    prefill_s: float = 0.005
    speeds: tuple[float, ...] = (1.0,)
    metrics: bool = True
    spec_counters: bool = True
    decode_time: bool = True  # vLLM's request_decode_time_seconds histogram
    tokenize: bool = True
    max_model_len: int = 262144
    version: str = "0.27.1"
    seed: int = 7
    fail_requests: tuple[int, ...] = ()  # these chat requests (1, 2, ...) answer 503
    abort_requests: tuple[int, ...] = ()  # these decode, then finish "abort" (vLLM's abort)


@dataclass
class _State:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)
    requests: int = 0
    decode_s: float = 0.0
    decoded: int = 0


def _conditional(rates: tuple[float, ...]) -> list[float]:
    out, prev = [], 1.0
    for r in rates:
        out.append(min(1.0, r / prev) if prev > 0 else 0.0)
        prev = r
    return out


class PacedServer:
    """A ``ThreadingHTTPServer`` on 127.0.0.1 with an ephemeral port (``url``)."""

    def __init__(self, pace: Pace, tls: ssl.SSLContext | None = None):
        self.pace = pace
        self.state = _State(per_pos=[0] * pace.k)
        self.lock = threading.Lock()
        self.rng = random.Random(pace.seed)
        self.speeds = itertools.cycle(pace.speeds)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, data: Any) -> None:
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                p = server.pace
                if self.path == "/health":
                    self._json(200, {})
                elif self.path == "/v1/models":
                    self._json(200, {"data": [{"id": MODEL, "max_model_len": p.max_model_len}]})
                elif self.path == "/version":
                    self._json(200, {"version": p.version})
                elif self.path == "/metrics" and p.metrics:
                    body = server.render_metrics().encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                data = json.loads(self.rfile.read(length) or b"{}")
                text = " ".join(str(m.get("content") or "") for m in data.get("messages") or [])
                prompt = max(1, len(text.split()))
                if self.path == "/tokenize":
                    if server.pace.tokenize:
                        self._json(200, {"count": prompt})
                    else:
                        self._json(404, {"detail": "Not Found"})
                elif self.path == "/v1/chat/completions":
                    server.chat(self, data, text, prompt)
                else:
                    self._json(404, {"detail": "Not Found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        scheme = "http"
        if tls is not None:  # an https:// front (``tls``: a server context with its cert)
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> PacedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def render_metrics(self) -> str:
        s, p = self.state, self.pace
        lab = f'engine="0",model_name="{MODEL}"'
        lines = [f"vllm:generation_tokens_total{{{lab}}} 0"]
        if p.decode_time:
            lines += [f"vllm:request_decode_time_seconds_sum{{{lab}}} {s.decode_s}",
                      f"vllm:request_decode_time_seconds_count{{{lab}}} {s.decoded}"]
        if p.spec_counters and p.k:
            lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {s.drafts}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {s.draft_tokens}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {s.accepted}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}}'
                      f" {c}" for i, c in enumerate(s.per_pos)]
        return "\n".join(lines) + "\n"

    def chat(self, h: BaseHTTPRequestHandler, data: dict[str, Any], text: str,
             prompt: int) -> None:
        p = self.pace
        max_tokens = int(data.get("max_tokens") or 16)
        rates = p.code if "quicksort" in text.lower() else p.narrative
        cond = _conditional(rates[: p.k])
        with self.lock:
            speed = next(self.speeds)
            self.state.requests += 1
            failing = self.state.requests in p.fail_requests
            finish = "abort" if self.state.requests in p.abort_requests else "length"
        if failing:
            h._json(503, {"error": {"message": "engine overloaded"}})  # type: ignore[attr-defined]
            return
        step_s = 1.0 / (p.step_rate * speed)
        time.sleep(p.prefill_s)
        if not data.get("stream"):
            n = max_tokens
            body = {"choices": [{"message": {"role": "assistant", "content": "word " * n},
                                 "finish_reason": finish}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": n}}
            h._json(200, body)  # type: ignore[attr-defined]
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        sent, deadline = 0, time.monotonic()

        def event(obj: dict[str, Any]) -> None:
            h.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            h.wfile.flush()

        first = deadline  # when the first token was due: the engine's own step clock
        while sent < max_tokens:
            a = 0
            with self.lock:
                while a < len(cond) and self.rng.random() < cond[a]:
                    a += 1
                if p.k:
                    self.state.drafts += 1
                    self.state.draft_tokens += p.k
                    self.state.accepted += a
                    for i in range(a):
                        self.state.per_pos[i] += 1
            n = min(1 + a, max_tokens - sent)
            deadline += step_s
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            event({"choices": [{"index": 0, "delta": {"content": " tok" * n}}]})
            first = deadline if sent == 0 else first
            sent += n
        with self.lock:
            # The engine times a request by its steps, as vLLM's histogram does: a stall of
            # this test process (a loaded CI machine) is not the engine's decode time.
            self.state.decode_s += deadline - first
            self.state.decoded += 1
        event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        event({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": sent}})
        h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()
        h.close_connection = True


def expected_tok_s(pace: Pace, shape: str) -> float:
    """The decode tok/s the fake paces a shape at (steps/s x mean acceptance length)."""
    rates = pace.code if shape == "code" else pace.narrative
    return pace.step_rate * (1 + sum(rates[: pace.k]))
