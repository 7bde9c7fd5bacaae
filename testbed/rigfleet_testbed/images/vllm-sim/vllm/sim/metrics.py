"""Prometheus metrics in vLLM's names, and the periodic stats log lines.

Counters are exposed the way prometheus_client does it (``# TYPE vllm:x counter`` then
``vllm:x_total{...}``), labelled ``model_name`` and ``engine="0"``. With
``--disable-log-stats`` vLLM creates no stat loggers: ``/metrics`` still answers but holds no
``vllm:`` series, and no stats lines are logged (vLLM issue #11987).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from vllm.sim import logs

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)


def _buckets_1_2_5(limit: int) -> tuple[float, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to ``limit``."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > limit:
                return tuple(out)
            out.append(float(v))
        exp += 1


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, v: float) -> None:
        self.total += v
        self.n += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1


class Metrics:
    """All engine counters; thread-safe."""

    def __init__(self, model_name: str, num_spec_tokens: int, kv_tokens: int,
                 cache_info: dict[str, str], enabled: bool = True,
                 max_model_len: int = 262144):
        self.model_name = model_name
        self.k = num_spec_tokens
        self.kv_tokens = max(kv_tokens, 1)
        self.cache_info = cache_info
        self.enabled = enabled
        self.lock = threading.Lock()
        self.start_time = time.time()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.running = 0
        self.waiting = 0
        self.kv_used_tokens = 0
        self.preemptions = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.accepted_per_pos = [0] * max(num_spec_tokens, 0)
        self.ttft = Histogram(_TTFT_BUCKETS)
        self.e2e = Histogram(_E2E_BUCKETS)
        self.queue_time = Histogram(_E2E_BUCKETS)
        self.prefill_time = Histogram(_E2E_BUCKETS)
        self.decode_time = Histogram(_E2E_BUCKETS)
        self.inference_time = Histogram(_E2E_BUCKETS)
        self.itl = Histogram(_ITL_BUCKETS)
        self.prompt_hist = Histogram(_buckets_1_2_5(max_model_len))
        self.generation_hist = Histogram(_buckets_1_2_5(max_model_len))
        # Snapshot for the periodic log line.
        self._last_log = (time.monotonic(), 0, 0, 0, 0, 0, [0] * max(num_spec_tokens, 0), 0, 0)

    # -- updates ---------------------------------------------------------------------------
    def prefilled(self, prompt: int, queue_s: float, prefill_s: float) -> None:
        """A request's prompt went through the model (counted then, as vLLM does)."""
        with self.lock:
            self.prompt_tokens += prompt
            self.prompt_hist.observe(prompt)
            self.queue_time.observe(queue_s)
            self.prefill_time.observe(prefill_s)

    def decode_step(self, tokens: int, accepted: int | None, itl_s: float) -> None:
        """One engine step of one request: tokens out; with MTP one draft, ``accepted`` kept."""
        with self.lock:
            self.generation_tokens += tokens
            self.itl.observe(itl_s)
            if accepted is not None and self.k > 0:
                self.drafts += 1
                self.draft_tokens += self.k
                self.accepted += accepted
                for i in range(min(accepted, self.k)):
                    self.accepted_per_pos[i] += 1

    def finish(self, generated: int, reason: str, ttft: float, e2e: float, decode_s: float,
               inference_s: float) -> None:
        with self.lock:
            key = reason if reason in ("stop", "length") else ("stop" if reason == "tool_calls"
                                                               else "abort")
            self.success[key] = self.success.get(key, 0) + 1
            self.ttft.observe(ttft)
            self.e2e.observe(e2e)
            self.decode_time.observe(decode_s)
            self.inference_time.observe(inference_s)
            self.generation_hist.observe(generated)

    def prefix(self, queries: int, hits: int) -> None:
        with self.lock:
            self.prefix_queries += queries
            self.prefix_hits += hits

    def gauge(self, running: int = 0, waiting: int = 0, kv_tokens: int = 0) -> None:
        with self.lock:
            self.running += running
            self.waiting += waiting
            self.kv_used_tokens += kv_tokens

    # -- exposition ------------------------------------------------------------------------
    def render(self) -> str:
        out: list[str] = []
        out.append("# HELP python_info Python platform information")
        out.append("# TYPE python_info gauge")
        out.append('python_info{implementation="CPython",major="3",minor="12",patchlevel="3",'
                   'version="3.12.3"} 1.0')
        out.append("# HELP process_start_time_seconds Start time of the process since unix "
                   "epoch in seconds.")
        out.append("# TYPE process_start_time_seconds gauge")
        out.append(f"process_start_time_seconds {self.start_time:.2f}")
        if not self.enabled:
            return "\n".join(out) + "\n"
        lab = f'model_name="{self.model_name}",engine="0"'
        with self.lock:
            def gauge(name: str, help_: str, value: float, labels: str = lab) -> None:
                out.append(f"# HELP vllm:{name} {help_}")
                out.append(f"# TYPE vllm:{name} gauge")
                out.append(f"vllm:{name}{{{labels}}} {float(value)}")

            def counter(name: str, help_: str, values: list[tuple[str, float]]) -> None:
                out.append(f"# HELP vllm:{name}_total {help_}")
                out.append(f"# TYPE vllm:{name}_total counter")
                for labels, v in values:
                    out.append(f"vllm:{name}_total{{{labels}}} {float(v)}")

            def hist(name: str, help_: str, h: Histogram) -> None:
                out.append(f"# HELP vllm:{name} {help_}")
                out.append(f"# TYPE vllm:{name} histogram")
                for b, c in zip(h.buckets, h.counts, strict=False):
                    out.append(f'vllm:{name}_bucket{{{lab},le="{b}"}} {float(c)}')
                out.append(f'vllm:{name}_bucket{{{lab},le="+Inf"}} {float(h.n)}')
                out.append(f"vllm:{name}_count{{{lab}}} {float(h.n)}")
                out.append(f"vllm:{name}_sum{{{lab}}} {h.total}")

            gauge("num_requests_running", "Number of requests in model execution batches.",
                  self.running)
            gauge("num_requests_waiting", "Number of requests waiting to be processed.",
                  self.waiting)
            gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                  min(1.0, self.kv_used_tokens / self.kv_tokens))
            counter("prefix_cache_queries", "Prefix cache queries, in terms of number of "
                    "queried tokens.", [(lab, self.prefix_queries)])
            counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                    "tokens.", [(lab, self.prefix_hits)])
            counter("num_preemptions", "Cumulative number of preemption from the engine.",
                    [(lab, self.preemptions)])
            counter("prompt_tokens", "Number of prefill tokens processed.",
                    [(lab, self.prompt_tokens)])
            counter("generation_tokens", "Number of generation tokens processed.",
                    [(lab, self.generation_tokens)])
            counter("request_success", "Count of successfully processed requests.",
                    [(f'{lab},finished_reason="{r}"', v) for r, v in sorted(self.success.items())])
            hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                 self.ttft)
            hist("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                 self.e2e)
            hist("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                 self.itl)
            hist("request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
                 "request.", self.queue_time)
            hist("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for "
                 "request.", self.prefill_time)
            hist("request_decode_time_seconds", "Histogram of time spent in DECODE phase for "
                 "request.", self.decode_time)
            hist("request_inference_time_seconds", "Histogram of time spent in RUNNING phase "
                 "for request.", self.inference_time)
            hist("request_prompt_tokens", "Number of prefill tokens processed.",
                 self.prompt_hist)
            hist("request_generation_tokens", "Number of generation tokens processed.",
                 self.generation_hist)
            info_labels = ",".join(f'{k}="{v}"' for k, v in sorted(self.cache_info.items()))
            out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
            out.append("# TYPE vllm:cache_config_info gauge")
            out.append(f"vllm:cache_config_info{{engine=\"0\",{info_labels}}} 1.0")
            if self.k > 0:
                counter("spec_decode_num_drafts", "Number of spec decoding drafts.",
                        [(lab, self.drafts)])
                counter("spec_decode_num_draft_tokens", "Number of draft tokens.",
                        [(lab, self.draft_tokens)])
                counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                        [(lab, self.accepted)])
                counter("spec_decode_num_accepted_tokens_per_pos",
                        "Accepted tokens per draft position.",
                        [(f'{lab},position="{i}"', v) for i, v in enumerate(self.accepted_per_pos)])
        return "\n".join(out) + "\n"

    # -- periodic log ----------------------------------------------------------------------
    def log_stats(self) -> None:
        """vLLM's LoggingStatLogger lines, when anything happened since the last ones."""
        with self.lock:
            now = time.monotonic()
            (t0, p0, g0, d0, dt0, a0, pp0, q0, h0) = self._last_log
            dt = max(now - t0, 1e-6)
            snap = (now, self.prompt_tokens, self.generation_tokens, self.drafts,
                    self.draft_tokens, self.accepted, list(self.accepted_per_pos),
                    self.prefix_queries, self.prefix_hits)
            active = self.running or self.waiting or self.prompt_tokens != p0 \
                or self.generation_tokens != g0
            self._last_log = snap
            running, waiting = self.running, self.waiting
            usage = min(1.0, self.kv_used_tokens / self.kv_tokens)
            drafts, dtoks, acc = self.drafts - d0, self.draft_tokens - dt0, self.accepted - a0
            per_pos = [a - b for a, b in zip(self.accepted_per_pos, pp0, strict=False)]
            queries, hits = self.prefix_queries - q0, self.prefix_hits - h0
            prompt_tp, gen_tp = (self.prompt_tokens - p0) / dt, (self.generation_tokens - g0) / dt
        if not active:
            return
        hit_rate = 100.0 * hits / queries if queries else 0.0
        logs.info("loggers.py:236",
                  f"Engine 000: Avg prompt throughput: {prompt_tp:.1f} tokens/s, Avg generation "
                  f"throughput: {gen_tp:.1f} tokens/s, Running: {running} reqs, Waiting: "
                  f"{waiting} reqs, GPU KV cache usage: {usage * 100:.1f}%, Prefix cache hit "
                  f"rate: {hit_rate:.1f}%")
        if self.k > 0 and drafts > 0:
            rates = ", ".join(f"{c / drafts:.3f}" for c in per_pos)
            logs.info("metrics.py:100",
                      f"SpecDecoding metrics: Mean acceptance length: {1 + acc / drafts:.2f}, "
                      f"Accepted throughput: {acc / dt:.2f} tokens/s, Drafted throughput: "
                      f"{dtoks / dt:.2f} tokens/s, Accepted: {acc} tokens, Drafted: {dtoks} "
                      f"tokens, Per-position acceptance rate: {rates}, Avg Draft acceptance "
                      f"rate: {100.0 * acc / max(dtoks, 1):.1f}%")
