"""The engine: turns a healthy answer into what this configuration really produces.

Everything version- or configuration-specific happens here, driven by the build info, the
Genesis markers, the serving arguments and the simulated hardware (never by what a client
asks):

- TurboQuant KV + MTP without Genesis P67 (its marker in turboquant_attn.py): vLLM verifies
  the K+1 draft tokens against the compressed cache with a single-query kernel; past a few
  thousand tokens of context the attention reads garbage and the output collapses (``!``
  floods, first-word repetition, or silent empty replies), while the drafter's tokens are all
  "accepted" (club-3090's patch-only TQ3+MTP path: 5/7 verify-stress, 34/100 silent-empty soak
  turns, bimodal acceptance). "Do not ship Genesis-free TQ+MTP" (club-3090 UPSTREAM.md).
  Short prompts keep their content but decode bimodally: every draft rubber-stamped, or most
  rejected (seed 000: 98.7 tok/s at CV 36%).
- vllm#50021 builds (GDN spec-decode wild write), with MTP and async scheduling: every verify
  step that rejects a draft while the next step is already scheduled writes GDN state out of
  bounds; after ``WILD_WRITE_REJECTIONS`` of them the engine core dies with an illegal memory
  access and the API server exits. ``--no-async-scheduling`` or no MTP: never.
- vllm#43559 builds (MTP x prefix caching corrupts GDN state), with MTP and prefix caching: a
  request that reuses a cached prefix (the next turn of a conversation) restores a corrupted
  recurrent state and its reply degenerates. ``--no-enable-prefix-caching``: never.
- ``spec-decode-acceptance-collapse`` builds: drafts are almost never accepted (mean
  acceptance length ~1.1) and generations stop early.
- Healthy MTP n=3: code accepts ~[0.95, 0.84, 0.75] per position (mean length ~3.5), prose
  ~[0.82, 0.52, 0.31] (~2.65), see ``perf``.
- Faults injected through the environment (``SIM_FAULT_*``) for the tool's failure paths.

Timing is paced by the wall clock: each engine step sleeps to a schedule computed by the
throughput model (``perf``) from the power limits and PCIe links of the cards in use, the
CUDA-graph mode, KV dtype and context depth, the build, and how many streams share the step;
one step takes the same time whatever it yields, so a collapsed acceptance rate really does
lower throughput. The testbed clock (``sim_speedup``) divides every duration.
``SIM_TOKENS_PER_SECOND`` / ``SIM_PREFILL_TOKENS_PER_SECOND`` replace the model with a fixed
pace (tests that only need answers fast).
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from vllm.sim import hardware, logs, perf, rig, startup, tokenizer, weights
from vllm.sim.args import ServeConfig
from vllm.sim.buildinfo import (
    REGRESSION_GDN_SPEC_WILD_WRITE,
    REGRESSION_MTP_PREFIX_CACHE_GDN,
    REGRESSION_SPEC_ACCEPTANCE_COLLAPSE,
    BuildInfo,
    GenesisState,
)
from vllm.sim.chat import render_tool_call
from vllm.sim.metrics import Metrics
from vllm.sim.responder import Reply, ToolCall

# Prompts shorter than this survive TQ+MTP without P67 (the patch-only path still passed the
# short verify-stress probes); longer contexts collapse.
TQ_MTP_COLLAPSE_MIN_PROMPT_TOKENS = 6000
# Unconditional per-position acceptance rates of healthy MTP n=3 drafts (code; prose and the
# rest are in perf.ACCEPTANCE). A fixed pace (SIM_TOKENS_PER_SECOND) is this many tokens/step.
HEALTHY_ACCEPTANCE = perf.ACCEPTANCE[perf.CODE]
# spec-decode-acceptance-collapse: mean acceptance length ~1.1.
REGRESSED_ACCEPTANCE = (0.075, 0.02, 0.005)
# spec-decode-acceptance-collapse: generations end (finish_reason "stop") around here.
EARLY_STOP_TOKENS = (140, 160)
# A silent-empty reply still takes this long (the soak test's definition needs >= 1 s).
SILENT_EMPTY_SECONDS = 1.2
PREFIX_BLOCK = 16
_PREFIX_CACHE_BLOCKS = 200_000
# vllm#50021: rejected-draft verify steps under async scheduling before the engine core dies.
# About 1,000 generated tokens of prose (at ~[0.82, 0.52, 0.31] 69% of the steps reject a draft,
# each step yields 2.65 tokens); code rejects in 1 step of 4 (~3,700 tokens). A short answer
# survives, a gate run (several thousand tokens) does not.
WILD_WRITE_REJECTIONS = 260
_PKG = "/usr/local/lib/python3.12/dist-packages"
# Without --max-num-batched-tokens, vLLM's chunked-prefill budget.
DEFAULT_CHUNK_TOKENS = 8192
# Reply kinds that decode like code (structured, predictable tokens).
_CODE_KINDS = ("code", "tool_call")


def _env_pos(name: str) -> float | None:
    """A positive number from the environment, or None when unset or unusable."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return None
    return max(value, 1e-3) if value > 0 else None


@dataclass(frozen=True)
class EngineSettings:
    """Pace overrides and injected faults, from the environment.

    ``tokens_per_second`` / ``prefill_tokens_per_second`` (``SIM_TOKENS_PER_SECOND``,
    ``SIM_PREFILL_TOKENS_PER_SECOND``) fix the pace instead of the throughput model;
    ``speedup`` (``SIM_SPEEDUP``) overrides the hardware's ``sim_speedup`` clock.
    """

    tokens_per_second: float | None = None
    prefill_tokens_per_second: float | None = None
    speedup: float | None = None
    crash_past_tokens: int | None = None
    hang: bool = False

    @classmethod
    def from_env(cls) -> EngineSettings:
        crash = os.environ.get("SIM_FAULT_CRASH_PAST_TOKENS")
        return cls(
            tokens_per_second=_env_pos("SIM_TOKENS_PER_SECOND"),
            prefill_tokens_per_second=_env_pos("SIM_PREFILL_TOKENS_PER_SECOND"),
            speedup=_env_pos("SIM_SPEEDUP"),
            crash_past_tokens=int(crash) if crash and crash.strip().isdigit() else None,
            hang=os.environ.get("SIM_FAULT_HANG", "") not in ("", "0", "false", "no"),
        )


class EngineDeadError(RuntimeError):
    """The engine core died; every request fails until the server exits."""

    MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


@dataclass
class Delta:
    """A piece of output: ``channel`` is reasoning, content, tool_start or tool_args."""

    channel: str
    text: str = ""
    tool_index: int = 0
    tool: ToolCall | None = None
    tokens: int = 1  # generated tokens this piece carries (continuous usage counts these)


@dataclass
class Finished:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass
class GenRequest:
    prompt_ids: list[int]
    reply: Reply
    max_tokens: int
    seed: int
    thinking: bool = False
    stop: list[str] = field(default_factory=list)
    min_seconds: float = 0.0


@dataclass
class _Token:
    channel: str
    text: str
    tool_index: int = 0
    tool: ToolCall | None = None
    raw: str = ""  # for tool tokens: the model's raw text (shown if the call is cut short)


class Engine:
    """One engine core (``engine="0"``)."""

    def __init__(self, cfg: ServeConfig, build: BuildInfo, genesis: GenesisState | None,
                 kv_tokens: int, max_model_len: int, metrics: Metrics,
                 on_fatal: Callable[[], None], settings: EngineSettings | None = None,
                 alloc: hardware.GpuAllocation | None = None):
        self.cfg = cfg
        self.build = build
        self.genesis = genesis
        self.kv_tokens = kv_tokens
        self.max_model_len = max_model_len
        self.metrics = metrics
        self.on_fatal = on_fatal
        self.settings = settings or EngineSettings.from_env()
        self.k = cfg.mtp_tokens
        self.dead = False
        self._slots = threading.Semaphore(cfg.max_num_seqs)
        self._prefix: OrderedDict[int, None] = OrderedDict()
        self._prefix_lock = threading.Lock()
        self._die_lock = threading.Lock()
        self._wild_writes = 0
        # Pacing: the cards in use, what they are doing, and the throughput model's inputs.
        self.gpus = sorted(alloc.gpus) if alloc is not None else list(
            range(cfg.tensor_parallel_size))
        self.activity = rig.Activity(alloc.path if alloc is not None else None, self.gpus)
        self.activity.publish("idle", {}, {})  # booted, nothing to do yet
        self.graphs = startup.plan_for(cfg)
        self._load_lock = threading.Lock()
        self._prefilling = 0
        self._decoding = 0
        self._prefill_until = 0.0  # monotonic time the latest in-flight prefill ends

    # -- configuration-driven behaviour ----------------------------------------------------
    @property
    def turboquant_without_p67(self) -> bool:
        """TQ KV + MTP without Genesis' multi-query verify kernel (P67) in turboquant_attn.py."""
        return (self.cfg.kv_cache_dtype.startswith("turboquant") and self.k > 0
                and not (self.genesis is not None and self.genesis.has_patch("P67")))

    @property
    def wild_write_live(self) -> bool:
        """vllm#50021: MTP + async scheduling on a build that carries it."""
        return self.k > 0 and self.cfg.async_scheduling and self.build.has(
            REGRESSION_GDN_SPEC_WILD_WRITE)

    @property
    def prefix_state_corrupts(self) -> bool:
        """vllm#43559: MTP + prefix caching on a build that carries it."""
        return self.k > 0 and self.cfg.enable_prefix_caching and self.build.has(
            REGRESSION_MTP_PREFIX_CACHE_GDN)

    @property
    def acceptance_regressed(self) -> bool:
        return self.k > 0 and self.build.has(REGRESSION_SPEC_ACCEPTANCE_COLLAPSE)

    # -- pacing ----------------------------------------------------------------------------
    def conditions(self) -> tuple[perf.Conditions, rig.Rig]:
        """The throughput model's inputs now (power limits can change while serving)."""
        hw = rig.read_rig(self.gpus)
        p2p_off = os.environ.get("NCCL_P2P_DISABLE", "0").lower() in ("1", "true", "yes")
        factor, swing = perf.build_adjustments(self.build.regressions)
        cond = perf.Conditions(
            era=perf.era_of(self.build.version), backend=self.graphs.backend,
            graph_mode=self.graphs.mode, tp=self.cfg.tensor_parallel_size,
            spec_tokens=self.k, cards=hw.cards, nvlink_p2p=hw.nvlink and not p2p_off,
            decode_factor=factor, swing=swing)
        return cond, hw

    def speedup(self, hw: rig.Rig) -> float:
        return self.settings.speedup or hw.speedup

    def _publish(self, cond: perf.Conditions, hw: rig.Rig) -> None:
        """Tell nvidia-smi what the cards do now (call with _load_lock held)."""
        if self._prefilling:
            phase = "prefill"
            util = {i: 100 for i in self.gpus}
            demand = {i: hw.power_max_w[n] for n, i in enumerate(self.gpus)}
        elif self._decoding:
            phase = "decode"
            util = {i: perf.decode_utilization(cond.tp, hw.cards[n].pcie_gen,
                                               hw.cards[n].pcie_width)
                    for n, i in enumerate(self.gpus)}
            demand = {i: perf.decode_demand_w(cond.tp) * util[i] / 97 for i in self.gpus}
        else:
            phase, util, demand = "idle", {}, {}
        self.activity.publish(phase, util, demand)

    def _load(self, cond: perf.Conditions, hw: rig.Rig, prefilling: int = 0,
              decoding: int = 0, prefill_until: float | None = None) -> None:
        with self._load_lock:
            self._prefilling += prefilling
            self._decoding += decoding
            if prefill_until is not None:
                self._prefill_until = max(self._prefill_until, prefill_until)
            self._publish(cond, hw)

    def _prefill_seconds(self, tokens: int, cond: perf.Conditions, speedup: float) -> float:
        fixed = self.settings.prefill_tokens_per_second
        if fixed is None and self.settings.tokens_per_second is not None:
            fixed = 200000.0  # a fixed decode pace keeps the old fixed prefill pace
        rate = fixed if fixed is not None else perf.prefill_tok_s(cond) * speedup
        return max(tokens, 0) / rate

    def _step_seconds(self, stream: perf.Stream, speedup: float, context: int,
                      chunk_s: float) -> float:
        """One engine step of this stream, now (other streams and prefills share it)."""
        fixed = self.settings.tokens_per_second
        if fixed is not None:
            return perf.mean_length(HEALTHY_ACCEPTANCE, self.k) / fixed
        with self._load_lock:
            streams = max(self._decoding, 1)
            prefill_left = self._prefill_until - time.monotonic()
        step = stream.step_seconds(context, streams) / speedup
        if prefill_left > 0:
            # Chunked prefill: another request's chunk rides in this step (DUAL_CARD.md: a
            # long prefill starves the decode streams beside it).
            step += min(chunk_s, prefill_left)
        return step

    # -- prefix cache ----------------------------------------------------------------------
    def _prefix_lookup(self, ids: list[int]) -> int:
        if not self.cfg.enable_prefix_caching:
            return 0
        hits = 0
        h = hashlib.sha256()
        keys = []
        for start in range(0, len(ids) - len(ids) % PREFIX_BLOCK, PREFIX_BLOCK):
            h.update(repr(ids[start:start + PREFIX_BLOCK]).encode())
            keys.append(int.from_bytes(h.copy().digest()[:8], "big"))
        with self._prefix_lock:
            matching = True
            for key in keys:
                if matching and key in self._prefix:
                    hits += PREFIX_BLOCK
                    self._prefix.move_to_end(key)
                else:
                    matching = False
                    self._prefix[key] = None
            while len(self._prefix) > _PREFIX_CACHE_BLOCKS:
                self._prefix.popitem(last=False)
        # vLLM always recomputes the last token, so a full hit still leaves one to prefill.
        return min(hits, max(len(ids) - 1, 0))

    # -- failure ---------------------------------------------------------------------------
    def _die(self, exc_line: str, frames: list[logs.Frame]) -> None:
        """The engine core dies: its traceback, the front end's EngineDeadError, the exit."""
        with self._die_lock:
            if self.dead:
                raise EngineDeadError(EngineDeadError.MESSAGE)
            self.dead = True
        logs.error("core.py:1050", "EngineCore encountered a fatal error.")
        logs.error_traceback("core.py:1050", [
            (f"{_PKG}/vllm/v1/engine/core.py", 1041, "run_engine_core",
             "engine_core.run_busy_loop()"),
            (f"{_PKG}/vllm/v1/engine/core.py", 1068, "run_busy_loop",
             "self._process_engine_step()"),
            (f"{_PKG}/vllm/v1/worker/gpu_model_runner.py", 2874, "execute_model",
             "model_output = self.model(...)"),
            *frames,
        ], exc_line)
        logs.error("async_llm.py:480", "AsyncLLM output_handler failed.")
        logs.error("async_llm.py:480", "vllm.v1.engine.exceptions.EngineDeadError: "
                   + EngineDeadError.MESSAGE)
        self.on_fatal()
        raise EngineDeadError(EngineDeadError.MESSAGE)

    def die_oom(self, prompt_tokens: int) -> None:
        """The engine core runs out of memory mid-prefill and dies (fault injection)."""
        mib = max(64, prompt_tokens * 5 // 1024)
        self._die(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {mib / 1024:.2f} GiB. "
            f"GPU 0 has a total capacity of 23.56 GiB of which {mib / 2048:.2f} GiB is free. "
            "Including non-PyTorch memory, this process has 22.31 GiB memory in use. Of the "
            "allocated memory 20.87 GiB is allocated by PyTorch, and 0.96 GiB is reserved by "
            "PyTorch but unallocated.",
            [(f"{_PKG}/torch/nn/modules/module.py", 1784, "_call_impl",
              "return forward_call(*args, **kwargs)")])

    def _wild_write(self) -> None:
        """One rejected draft under async scheduling (vllm#50021); the last one is fatal."""
        with self._die_lock:
            self._wild_writes += 1
            fatal = self._wild_writes >= WILD_WRITE_REJECTIONS
        if not fatal:
            return
        # PyTorch's text for an asynchronous CUDA fault, raised at the next synchronisation.
        self._die(
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect.\nFor debugging consider passing "
            "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
            "assertions.",
            [(f"{_PKG}/vllm/v1/worker/gpu_model_runner.py", 2990, "_sample",
              "valid_sampled_token_ids = sampler_output.sampled_token_ids.tolist()")])

    # -- generation ------------------------------------------------------------------------
    def _tokens_for(self, req: GenRequest) -> tuple[list[_Token], bool]:
        """The healthy output as tokens on channels; True if a stop string cut it."""
        reply = req.reply
        out: list[_Token] = []
        if req.thinking and reply.reasoning:
            if self.cfg.reasoning_parser:
                out += [_Token("reasoning", p) for p in tokenizer.pieces(reply.reasoning)]
                out += [_Token("none", p) for p in tokenizer.pieces("\n</think>\n\n")]
            else:
                raw = f"<think>\n{reply.reasoning}\n</think>\n\n"
                out += [_Token("content", p) for p in tokenizer.pieces(raw)]
        content, stopped = reply.content, False
        for s in req.stop:
            if s and s in content:
                content, stopped = content[: content.index(s)], True
        out += [_Token("content", p) for p in tokenizer.pieces(content)]
        # A stop string ends generation: nothing after it (no tool call) is produced.
        for idx, call in enumerate([] if stopped else reply.tool_calls):
            raw = ("\n\n" if out or idx else "") + render_tool_call(call.name, call.arguments)
            ps = tokenizer.pieces(raw)
            args = call.arguments_json
            # Spread the JSON arguments over the call's tokens (first token opens the call).
            n = max(len(ps) - 1, 1)
            cuts = [round(i * len(args) / n) for i in range(n + 1)]
            out.append(_Token("tool_start", "", idx, call, raw=ps[0]))
            for i, p in enumerate(ps[1:]):
                out.append(_Token("tool_args", args[cuts[i]:cuts[i + 1]], idx, call, raw=p))
        return out, stopped

    def _collapse(self, req: GenRequest, rng: random.Random) -> tuple[list[_Token], str]:
        """What a corrupted KV read turns the reply into: flood, repetition or nothing."""
        mode = rng.choices(["flood", "repeat", "empty"], weights=[35, 35, 30])[0]
        if mode == "empty":
            return [], "empty"
        channel = "reasoning" if (req.thinking and self.cfg.reasoning_parser) else "content"
        budget = req.max_tokens
        if mode == "flood":
            return [_Token(channel, "!!!!") for _ in range(budget)], mode
        words = (req.reply.content or req.reply.reasoning or "The").split()
        first = words[0] if words else "The"
        first_piece = tokenizer.pieces(first)[0]
        toks = [_Token(channel, first_piece)]
        toks += [_Token(channel, " " + first_piece.strip()) for _ in range(budget - 1)]
        return toks, mode

    def _degenerate(self, req: GenRequest, rng: random.Random) -> list[_Token]:
        """What a corrupted restored GDN state produces: a loop on a fragment of the reply."""
        channel = "reasoning" if (req.thinking and self.cfg.reasoning_parser) else "content"
        words = (req.reply.content or req.reply.reasoning or "the the").split()
        start = rng.randrange(max(len(words) - 3, 1))
        loop = tokenizer.pieces(" " + " ".join(words[start:start + rng.randint(1, 3)]))
        return [_Token(channel, loop[i % len(loop)]) for i in range(req.max_tokens)]

    def generate(self, req: GenRequest) -> Iterator[Delta | Finished]:
        """Run one request: yields Deltas as engine steps complete, then Finished."""
        if self.dead:
            raise EngineDeadError(EngineDeadError.MESSAGE)
        t0 = time.monotonic()
        n_prompt = len(req.prompt_ids)
        req.reply = weights.recall_reply(req.reply, n_prompt, req.seed)  # what these weights know
        self.metrics.gauge(waiting=1)
        self._slots.acquire()
        self.metrics.gauge(waiting=-1, running=1, kv_tokens=n_prompt)
        queued = time.monotonic() - t0
        generated = 0
        counted = ""  # the load this request is counted in: "", "prefill" or "decode"
        cond, hw = self.conditions()
        speedup = self.speedup(hw)
        noise = random.Random()  # run-to-run variation, not seeded by the prompt
        try:
            hits = self._prefix_lookup(req.prompt_ids)
            self.metrics.prefix(n_prompt, hits)
            prefill = self._prefill_seconds(n_prompt - hits, cond, speedup)
            self._load(cond, hw, prefilling=1, prefill_until=time.monotonic() + prefill)
            counted = "prefill"
            crash = self.settings.crash_past_tokens
            if crash is not None and n_prompt > crash:
                time.sleep(prefill / 2)
                self.die_oom(n_prompt)
            time.sleep(prefill)
            self.metrics.prefilled(n_prompt, queued, time.monotonic() - t0 - queued)
            self._load(cond, hw, prefilling=-1, decoding=1)
            counted = "decode"
            rng = random.Random(req.seed)
            tokens, stopped = self._tokens_for(req)
            finish = "stop"
            kind = perf.CODE if req.reply.kind in _CODE_KINDS else perf.NARRATIVE
            broken = self.turboquant_without_p67
            accept: tuple[float, ...] | None = None  # None: the model's, by content
            if broken and n_prompt >= TQ_MTP_COLLAPSE_MIN_PROMPT_TOKENS:
                tokens, mode = self._collapse(req, rng)
                accept = (1.0,) * max(self.k, 1)  # the drafter is "always right"
                if mode == "empty":
                    time.sleep(max(0.0, SILENT_EMPTY_SECONDS - (time.monotonic() - t0)))
            elif self.prefix_state_corrupts and hits > 0:
                tokens, finish = self._degenerate(req, rng), "length"
            elif self.acceptance_regressed:
                accept = REGRESSED_ACCEPTANCE
                limit = rng.randint(*EARLY_STOP_TOKENS)
                if len(tokens) > limit and limit < req.max_tokens:
                    tokens, stopped = _leak_truncated_tool_calls(tokens[:limit]), True
            if len(tokens) > req.max_tokens:
                tokens, finish = tokens[: req.max_tokens], "length"
                tokens = _leak_truncated_tool_calls(tokens)
            elif any(t.channel == "tool_start" for t in tokens) and not stopped:
                finish = "tool_calls"
            ttft = None
            stream = perf.Stream(cond, kind, broken, noise, acceptance=accept)
            chunk_s = self._prefill_seconds(
                self.cfg.max_num_batched_tokens or DEFAULT_CHUNK_TOKENS, cond, speedup)
            last = deadline = time.monotonic()
            first_at: float | None = None  # the first token's step, on the modelled clock
            i = 0
            pending: list[_Token] = []
            # The modelled pace only (a fixed SIM_TOKENS_PER_SECOND pace streams every step).
            merge_late = self.settings.tokens_per_second is None
            while i < len(tokens):
                accepted = stream.draw()
                if accepted < self.k and self.wild_write_live:
                    self._wild_write()
                chunk = tokens[i:i + 1 + accepted]
                i += len(chunk)
                deadline += self._step_seconds(stream, speedup, n_prompt + generated, chunk_s)
                first_at = deadline if first_at is None else first_at
                generated += len(chunk)
                pending += chunk
                delay = deadline - time.monotonic()
                if delay > 0.0005:
                    time.sleep(delay)
                now = time.monotonic()
                self.metrics.decode_step(len(chunk), accepted if self.k else None,
                                         max(now, deadline) - last)
                last = max(now, deadline)
                if delay <= 0.0 and i < len(tokens) and merge_late:
                    # Behind the engine's pace (this machine's CPU is busy): the next step's
                    # tokens are due too, so they go out together, as vLLM's output collector
                    # merges the deltas a slow consumer has not taken yet.
                    continue
                if ttft is None:
                    ttft = now - t0
                yield from _deltas(pending)
                pending = []
            remaining = req.min_seconds - (time.monotonic() - t0)
            if remaining > 0:
                time.sleep(remaining)
            end = time.monotonic()
            # vLLM's decode time is last_token_ts - first_token_ts on the engine's clock: here
            # the modelled steps', not when this busy machine got to write them out.
            decode_s = deadline - first_at if first_at is not None else 0.0
            self.metrics.finish(generated, finish, ttft or (end - t0), end - t0, decode_s,
                                end - t0 - queued)
            yield Finished(finish, n_prompt, generated, hits)
        finally:
            self.metrics.gauge(running=-1, kv_tokens=-n_prompt)
            if counted:
                self._load(cond, hw, prefilling=-1 if counted == "prefill" else 0,
                           decoding=-1 if counted == "decode" else 0)
            self._slots.release()


def _leak_truncated_tool_calls(tokens: list[_Token]) -> list[_Token]:
    """A tool call cut by max_tokens cannot be parsed: its raw text ends up in content."""
    out = []
    for t in tokens:
        if t.channel in ("tool_start", "tool_args"):
            out.append(_Token("content", t.raw))
        else:
            out.append(t)
    return out


def _deltas(chunk: list[_Token]) -> Iterator[Delta]:
    """Merge one step's tokens into deltas per channel; each delta counts the tokens it
    carries, silent ones (``none``) included in the next piece out, or the last."""
    cur: Delta | None = None
    silent = 0
    for t in chunk:
        if t.channel == "none":
            silent += 1
            continue
        if t.channel == "tool_start":
            if cur is not None:
                yield cur
            cur = None
            yield Delta("tool_start", "", t.tool_index, t.tool, tokens=1 + silent)
            silent = 0
            continue
        if cur is not None and cur.channel == t.channel and cur.tool_index == t.tool_index:
            cur.text += t.text
            cur.tokens += 1 + silent
        else:
            if cur is not None:
                yield cur
            cur = Delta(t.channel, t.text, t.tool_index, tokens=1 + silent)
        silent = 0
    if cur is not None:
        cur.tokens += silent
        yield cur
