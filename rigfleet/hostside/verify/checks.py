"""The gate's checks (club-3090's "7/7" and more), in run order in :data:`CHECKS`; each fills
the result it is handed. Rules: docs/bench.md, "The verify-stress gate's rules"::

    ctx = Context(client, profile, progress)
    for check, title in CHECKS:
        result = check(ctx, CheckResult(check.__name__, title))   # .status, .details, .findings
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from ..bench.baseline import Baseline, Limits, judge, profile_baseline
from ..bench.measure import Bench, BenchSettings, Progress, ShapeResult, acceptance_between
from ..layout import THROUGHPUT_HISTORY_NAME
from ..records import ShapeFigures, ThroughputRecord, encode, read_throughput_history
from . import metrics, prompts
from .client import ChatResult, Client, max_model_len
from .health import Finding, scan
from .profiles import Profile
from .report import FAIL, PASS, SKIP, CheckResult


@dataclass
class Context:
    """The client, the profile, what preflight learned, what throughput measured."""

    client: Client
    profile: Profile
    progress: Progress = field(default_factory=Progress)
    model: str = ""
    version: str = ""
    max_model_len: int | None = None
    metrics_before: list[metrics.Sample] | None = None
    throughput_record: ThroughputRecord | None = None

    @cached_property
    def sizer(self) -> prompts.Sizer:
        """Sizes prompts in the server's own tokens; made on first use, after preflight."""
        return prompts.server_sizer(
            self.client, self.model, max(self.profile.preflight_timeout_s, 30.0),
            self.profile.needle_timeout_s, self.progress.note, self.profile.size_tolerance)

    def chat(self, messages: prompts.Messages, max_tokens: int, temperature: float,
             timeout: float, tools: prompts.Tools = None, tool_choice: Any = None,
             stream: bool = False) -> ChatResult:
        body = prompts.chat_body(self.model, messages, max_tokens, temperature, tools, tool_choice)
        return self.client.chat(body, timeout=timeout, stream=stream)


# Texts vLLM (and OpenAI-compatible servers) use when a prompt does not fit the context.
_OVER_CONTEXT = ("maximum context length", "max_model_len", "max-model-len", "context length",
                 "too long", "exceeds the model", "input tokens")


def _http_finding(res: ChatResult, where: str = "") -> Finding:
    if res.status == 0:
        return Finding("connection_error", f"no HTTP answer: {res.error}", where)
    if res.status == 200:
        return Finding("stream_error", res.error, where)
    name = "server_error" if res.status >= 500 else "http_error"
    return Finding(name, f"HTTP {res.status}: {res.error_message()[:300]}", where)


def _over_context(ctx: Context, res: ChatResult, prompt_tokens: int | None,
                  max_tokens: int) -> bool:
    """A 400 because the prompt (plus its answer budget) does not fit max-model-len."""
    too_big = bool(ctx.max_model_len and prompt_tokens
                   and prompt_tokens + max_tokens > ctx.max_model_len)
    msg = res.error_message().lower()
    return res.status == 400 and (too_big or any(s in msg for s in _OVER_CONTEXT))


def _failed(ctx: Context, out: CheckResult, res: ChatResult, where: str = "",
            prompt_tokens: int | None = None, max_tokens: int = 0) -> bool:
    """True if ``res`` fails or (over max-model-len) skips ``out``; else its findings go on it."""
    if max_tokens and _over_context(ctx, res, prompt_tokens, max_tokens):
        out.status = SKIP
        out.summary = f"prompt over max-model-len: {_excerpt(res.error_message(), 160)}"
        return True
    if not res.ok:
        out.findings.append(_http_finding(res, where))
        return True
    out.findings += _health(ctx, res, where)
    return False


def _health(ctx: Context, res: ChatResult, where: str = "") -> list[Finding]:
    found = scan(res.content, res.reasoning, res.tool_calls, res.finish_reason, ctx.profile)
    return [replace(f, where=f"{where} {f.where}".strip()) for f in found]


def _attempt(res: ChatResult) -> dict[str, Any]:
    return {"http_status": res.status, "seconds": round(res.seconds, 2),
            "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
            "finish_reason": res.finish_reason}


def _excerpt(text: str, n: int = 80) -> str:
    t = text.strip().replace("\n", " ")
    return t if len(t) <= n else t[: n - 1] + "…"


def _fail(out: CheckResult, finding: Finding, summary: str = "") -> CheckResult:
    out.findings.append(finding)
    out.summary = summary
    return _finish(out)


def _finish(out: CheckResult, ok_summary: str = "") -> CheckResult:
    out.status = SKIP if out.status == SKIP else FAIL if out.findings else PASS
    if not out.summary:
        out.summary = (", ".join(sorted({f.name for f in out.findings})) if len(out.findings) > 2
                       else "; ".join(f.message for f in out.findings) or ok_summary)
    return out


def preflight(ctx: Context, out: CheckResult) -> CheckResult:
    """/health (polled for health_wait_s), a model, /version, a token; a failure skips the rest."""
    p = ctx.profile
    deadline = time.monotonic() + p.health_wait_s
    while True:
        h = ctx.client.request("GET", "/health", timeout=p.preflight_timeout_s)
        if h.status == 200 or time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.05)))
    out.details["health"] = {"http_status": h.status, "error": h.error or None}
    if h.status != 200:
        why = h.error or f"HTTP {h.status}"
        return _fail(out, Finding("server_down", f"GET /health: {why}"),
                     f"server not healthy: {why}")
    cards, status, why = ctx.client.models(p.preflight_timeout_s)
    if not cards or not cards[0].get("id"):
        why = why or "no model listed"
        return _fail(out, Finding("no_model", f"GET /v1/models: HTTP {status}: {why}"),
                     f"/v1/models: {why}")
    ctx.model, ctx.max_model_len = str(cards[0]["id"]), max_model_len(cards[0])
    ctx.version = ctx.client.version(p.preflight_timeout_s)
    out.details.update(models=[str(c.get("id")) for c in cards if isinstance(c, dict)],
                       max_model_len=ctx.max_model_len, version=ctx.version or None)
    # Counters before any of the gate's own traffic (spec_decode measures the difference).
    ctx.metrics_before = metrics.scrape(ctx.client, p.preflight_timeout_s)
    # One token: a server that cannot generate is down; it also absorbs lazy compilation.
    warm = ctx.chat([{"role": "user", "content": "ping"}], 1, 0.0, p.warmup_timeout_s)
    out.details["warmup"] = _attempt(warm)
    if not warm.ok:
        found = _http_finding(warm, "warm-up")
        return _fail(out, found, f"warm-up completion failed: {found.message}")
    return _finish(out, f"model {ctx.model}, version {ctx.version or '?'}, max_model_len "
                        f"{ctx.max_model_len or '?'}")


def _needles(ctx: Context, out: CheckResult, depths: tuple[int, ...]) -> CheckResult:
    p = ctx.profile
    attempts: list[dict[str, Any]] = []
    for depth in depths:
        secret, salt = prompts.new_secret()
        position = round(random.SystemRandom().uniform(0.05, 0.95), 3)
        attempts.append(row := {"depth_tokens": depth, "needle_position": position,
                                "expected": secret})
        where = f"{depth} tok"
        try:
            sized = ctx.sizer.fit("needle", partial(prompts.needle_messages, secret, salt,
                                                    position=position), depth)
        except prompts.SizingError as exc:
            row.update(outcome="failed")
            out.findings.append(Finding("sizing_error", str(exc), where))
            continue
        row["prompt_tokens"] = sized.tokens
        ctx.progress.tick(".")
        res = ctx.chat(sized.messages, p.needle_max_tokens, 0.0, p.needle_timeout_s, stream=True)
        row.update(http_status=res.status, seconds=round(res.seconds, 2),
                   ttft=round(res.ttft, 2) if res.ttft is not None else None,
                   server_prompt_tokens=res.prompt_tokens)
        if _over_context(ctx, res, sized.tokens, p.needle_max_tokens):
            row.update(outcome="skipped", reason=_excerpt(res.error_message(), 160))
            continue
        if not res.ok:
            row.update(outcome="failed")
            out.findings.append(_http_finding(res, where))
            continue
        found = _health(ctx, res, where)
        ok = prompts.recalled(secret, res.content)
        empty = any(f.name == "empty" for f in found)  # silent-empty: the quietest collapse
        row["answer"] = _excerpt(res.content)
        if not ok and not empty:
            found.insert(0, Finding("recall_miss", f"needle not recalled (expected {secret!r})",
                                    where, _excerpt(res.content)))
        row["outcome"] = ("recalled" if ok and not found else "empty" if empty
                          else "unhealthy" if ok else "recall_miss")
        out.findings += found
    out.details["attempts"] = attempts
    skipped = [str(a["depth_tokens"]) for a in attempts if a["outcome"] == "skipped"]
    if len(skipped) == len(attempts):
        out.status = SKIP
        return _finish(out, f"all depths over max-model-len ({', '.join(skipped)} tokens)")
    desc = ", ".join(f"{a['depth_tokens']}: {a['outcome']}" for a in attempts)
    if out.findings:
        out.summary = "; ".join(
            f"{a['depth_tokens']} tok: {a['outcome']}"
            + (f" (answer {a['answer']!r})" if a.get("answer") is not None else "")
            for a in attempts if a["outcome"] not in ("recalled", "skipped"))
    return _finish(out, f"recalled at {desc}" + (f" (skipped {', '.join(skipped)})"
                                                 if skipped else ""))


def needles(ctx: Context, out: CheckResult) -> CheckResult:
    """(1) needles at two depths (FULL ~10K and ~30K tokens)."""
    return _needles(ctx, out, ctx.profile.needle_depths)


def needles_deep(ctx: Context, out: CheckResult) -> CheckResult:
    """(7) needles at two deeper depths (FULL ~60K and ~90K tokens)."""
    return _needles(ctx, out, ctx.profile.needle_deep_depths)


def tool_prefill(ctx: Context, out: CheckResult) -> CheckResult:
    """A long tool result (FULL ~25K tokens of news), then a summary request: >= prefill_min_chars
    of healthy text (or a tool call) passes; empty: silent truncation; 500: OOM in prefill."""
    p = ctx.profile
    seed = random.SystemRandom().randrange(2**31)
    tools = [prompts.FETCH_NEWS_TOOL]
    try:
        sized = ctx.sizer.fit("prefill", lambda units: prompts.prefill_messages(
            seed, max(units, 1)), p.prefill_tokens, tools)
    except prompts.SizingError as exc:
        return _fail(out, Finding("sizing_error", str(exc)))
    out.details.update(target_tokens=p.prefill_tokens, prompt_tokens=sized.tokens,
                       articles=sized.units)
    res = ctx.chat(sized.messages, p.prefill_max_tokens, 0.6, p.prefill_timeout_s, tools, "auto")
    out.details.update(_attempt(res), prompt_tokens=res.prompt_tokens or sized.tokens)
    if _failed(ctx, out, res, "", sized.tokens, p.prefill_max_tokens):
        return _finish(out)
    text = res.content.strip()
    out.details["answer"] = _excerpt(text, 160)
    if not res.tool_calls and text and len(text) < p.prefill_min_chars:
        out.findings.append(Finding("too_short", f"only {len(text)} characters of answer "
                                                 f"(need {p.prefill_min_chars})", "content", text))
    return _finish(out, f"{sized.tokens} prompt tokens -> {len(text)} chars"
                        + (", tool call" if res.tool_calls else ""))


def ide_oneshot(ctx: Context, out: CheckResult) -> CheckResult:
    """~5K-char system preamble + 10 tool schemas + a refactor request, tool_choice none."""
    p = ctx.profile
    preamble = prompts.ide_preamble(p.ide_preamble_chars)
    tools = prompts.tools(p.ide_tools)
    msgs = [{"role": "system", "content": preamble},
            {"role": "user", "content": prompts.IDE_REQUEST}]
    res = ctx.chat(msgs, p.ide_max_tokens, 0.0, p.ide_timeout_s, tools, "none")
    out.details.update(preamble_chars=len(preamble), tools=len(tools), **_attempt(res))
    if _failed(ctx, out, res, max_tokens=p.ide_max_tokens):
        return _finish(out)
    if res.tool_calls:
        out.findings.append(Finding("unexpected_tool_call", "tool call despite tool_choice "
                                    f"'none': {', '.join(res.tool_names())}"))
    out.details["answer"] = _excerpt(res.content, 160)
    return _finish(out, f"{res.completion_tokens} tokens of answer")


def agent_multiturn(ctx: Context, out: CheckResult) -> CheckResult:
    """Turn 1 must call read_file with JSON arguments; given its result, turn 2 healthy text."""
    p = ctx.profile
    tools = prompts.tools(p.agent_tools)
    msgs: prompts.Messages = [{"role": "system", "content": prompts.AGENT_SYSTEM},
                              {"role": "user", "content": prompts.AGENT_REQUEST}]
    first = ctx.chat(msgs, p.agent_max_tokens, 0.6, p.agent_timeout_s, tools, "auto")
    out.details["turn1"] = _attempt(first)
    if _failed(ctx, out, first, "turn 1"):
        return _finish(out)
    names = first.tool_names()
    out.details["turn1"]["tool_calls"] = names
    if not first.tool_calls:
        return _fail(out, Finding("no_tool_call", f"turn 1 answered without calling "
                                  f"{prompts.AGENT_TOOL}", "turn 1", _excerpt(first.content)))
    # Parallel calls are fine if one is the right tool; only that one is answered.
    call = next((c for c in first.tool_calls
                 if (c.get("function") or {}).get("name") == prompts.AGENT_TOOL), None)
    if call is None:
        return _fail(out, Finding("wrong_tool", f"turn 1 called {', '.join(names)}, expected "
                                                f"{prompts.AGENT_TOOL!r}", "turn 1"))
    fn = call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
        if not isinstance(args, dict):
            raise ValueError("not an object")
    except ValueError:
        return _fail(out, Finding("bad_tool_arguments", "tool call arguments are not a JSON "
                                  "object", "turn 1", str(fn.get("arguments"))[:80]))
    out.details["turn1"]["arguments"] = args
    call_id = str(call.get("id") or "call_0")
    msgs = msgs + [
        {"role": "assistant", "content": first.content or None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": prompts.AGENT_TOOL, "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": call_id, "name": prompts.AGENT_TOOL,
         "content": prompts.agent_file_text(p.agent_tool_reply_chars)},
    ]
    second = ctx.chat(msgs, p.agent_max_tokens, 0.6, p.agent_timeout_s, tools, "auto")
    out.details["turn2"] = _attempt(second)
    if _failed(ctx, out, second, "turn 2"):
        return _finish(out)
    out.details["turn2"]["answer"] = _excerpt(second.content, 160)
    if second.tool_calls and not second.content.strip():
        out.findings.append(Finding("no_text_follow_up", "turn 2 called "
                                    f"{', '.join(second.tool_names())} instead of answering",
                                    "turn 2"))
    return _finish(out, f"{prompts.AGENT_TOOL}({json.dumps(args)[:60]}) -> "
                        f"{len(second.content.strip())} chars")


def coding(ctx: Context, out: CheckResult) -> CheckResult:
    """A LeetCode-shape request with a GOAL/STATE/ALGO/EDGE/VERIFY plan: healthy code."""
    p = ctx.profile
    msgs = [{"role": "user", "content": prompts.CODING_REQUEST}]
    res = ctx.chat(msgs, p.coding_max_tokens, 0.0, p.coding_timeout_s)
    out.details.update(_attempt(res))
    if _failed(ctx, out, res):
        return _finish(out)
    out.details["answer"] = _excerpt(res.content, 160)
    if res.content.strip() and not any(m in res.content for m in ("```", "def ", "return ")):
        out.findings.append(Finding("no_code", "the answer contains no code", "content",
                                    _excerpt(res.content)))
    return _finish(out, f"{res.completion_tokens} tokens, finish {res.finish_reason}")


def reasoning(ctx: Context, out: CheckResult) -> CheckResult:
    """An induction proof: under reasoning_min_tokens tokens is an AL collapse or an early stop."""
    p = ctx.profile
    msgs = [{"role": "user", "content": prompts.REASONING_REQUEST}]
    res = ctx.chat(msgs, p.reasoning_max_tokens, 0.0, p.reasoning_timeout_s)
    out.details.update(_attempt(res), min_tokens=p.reasoning_min_tokens)
    if _failed(ctx, out, res):
        return _finish(out)
    out.details["answer"] = _excerpt(res.content, 160)
    if (n := res.completion_tokens) is None:
        out.findings.append(Finding("no_usage", "the server reported no completion tokens"))
    elif n < p.reasoning_min_tokens:
        out.findings.append(Finding(
            "too_few_tokens", f"{n} completion tokens (need >= {p.reasoning_min_tokens}; "
                              f"finish {res.finish_reason}): spec-decode AL collapse or early "
                              "stop", "content", _excerpt(res.content[-120:])))
    return _finish(out, f"{n} completion tokens, finish {res.finish_reason}")


@dataclass
class _Turn:
    where: str  # s<session>t<turn>, 1-based
    res: ChatResult
    silent_empty: bool
    findings: list[Finding]


def soak(ctx: Context, out: CheckResult) -> CheckResult:
    """Concurrent multi-turn sessions of growing context (club-3090 soak-test); fails on a turn
    error, turns unsent by soak_timeout_s, or silent-empty/unhealthy turns >= soak_fail_rate."""
    p = ctx.profile
    deadline = time.monotonic() + p.soak_timeout_s
    turns: list[_Turn] = []
    base_seed = random.SystemRandom().randrange(2**31)
    stop = threading.Event()  # Ctrl-C: no session sends another turn

    def session(idx: int) -> None:
        rng = random.Random(base_seed + idx)
        msgs: prompts.Messages = [{"role": "system", "content": "You are a helpful, concise "
                                   "assistant for software engineers."}]
        for t in range(p.soak_turns):
            if time.monotonic() >= deadline or stop.is_set():
                return
            msgs.append({"role": "user", "content": prompts.soak_turn(rng, idx, t)})
            max_tokens = rng.randint(p.soak_turn_min_tokens, p.soak_turn_max_tokens)
            timeout = max(1.0, min(p.soak_request_timeout_s, deadline - time.monotonic()))
            res = ctx.chat(msgs, max_tokens, 0.7, timeout, stream=True)
            # No usage in the stream: only "nothing at all came back" counts as 0 tokens.
            zero = (res.completion_tokens == 0 if res.completion_tokens is not None
                    else not (res.content or res.reasoning or res.tool_calls))
            silent = res.ok and zero and res.seconds >= p.soak_silent_empty_min_s
            where = f"s{idx + 1}t{t + 1}"
            found = _health(ctx, res, where) if res.ok else []
            turns.append(_Turn(where, res, silent, found))  # list.append is atomic
            ctx.progress.tick("x" if not res.ok else "E" if silent else "!" if found else ".")
            if not res.ok:
                return  # the session's context is broken; other sessions carry on
            msgs.append({"role": "assistant", "content": res.content})

    with ThreadPoolExecutor(max_workers=p.soak_concurrency, thread_name_prefix="soak") as pool:
        try:
            list(pool.map(session, range(p.soak_sessions)))
        finally:
            stop.set()

    planned = p.soak_sessions * p.soak_turns
    n = len(turns)
    errors = [t for t in turns if not t.res.ok]
    silent = [t for t in turns if t.silent_empty]
    unhealthy = [t for t in turns if t.findings and not t.silent_empty]
    ttfts = [t.res.ttft for t in turns if t.res.ttft is not None]
    contexts = [t.res.prompt_tokens for t in turns if t.res.prompt_tokens is not None]
    rate_silent = len(silent) / n if n else 0.0
    rate_unhealthy = len(unhealthy) / n if n else 0.0
    out.details.update(
        sessions=p.soak_sessions, turns_per_session=p.soak_turns, concurrency=p.soak_concurrency,
        turns_planned=planned, turns_done=n, errors=len(errors), silent_empty=len(silent),
        silent_empty_rate=round(rate_silent, 4), unhealthy=len(unhealthy),
        unhealthy_rate=round(rate_unhealthy, 4), fail_rate=p.soak_fail_rate,
        median_ttft_s=round(statistics.median(ttfts), 3) if ttfts else None,
        median_turn_s=round(statistics.median(t.res.seconds for t in turns), 3) if turns else None,
        max_prompt_tokens=max(contexts) if contexts else None,
        reference_levels={"warn": "1-49% silent-empty", "fail": ">=50% silent-empty"},
    )
    out.findings += [replace(_http_finding(t.res, t.where), name="turn_error")
                     for t in errors[:5]]
    if len(errors) > 5:
        out.findings.append(Finding("turn_error", f"... and {len(errors) - 5} more failed turns"))
    if n and rate_silent >= p.soak_fail_rate:
        out.findings.append(Finding(
            "silent_empty", f"{len(silent)}/{n} turns silent-empty ({rate_silent:.0%}, fail at "
                            f">= {p.soak_fail_rate:.0%})"))
    if n and rate_unhealthy >= p.soak_fail_rate:
        names = sorted({f.name for t in unhealthy for f in t.findings})
        out.findings.append(Finding(
            "unhealthy_turns", f"{len(unhealthy)}/{n} turns unhealthy ({rate_unhealthy:.0%}): "
                               + ", ".join(names), evidence=unhealthy[0].findings[0].evidence))
    if n < planned and not errors:
        out.findings.append(Finding("soak_timeout", f"only {n}/{planned} turns done within "
                                                    f"{p.soak_timeout_s:.0f}s"))
    warnings = []
    if silent and rate_silent < p.soak_fail_rate and rate_silent > p.soak_warn_rate:
        warnings.append(f"{len(silent)} silent-empty turn(s) below the fail rate")
    if unhealthy and rate_unhealthy < p.soak_fail_rate:
        warnings.append(f"{len(unhealthy)} unhealthy turn(s) below the fail rate")
    if warnings:
        out.details["warnings"] = warnings
    return _finish(out, f"{n} turns, {len(silent)} silent-empty, {len(unhealthy)} unhealthy"
                        + (f" (warning: {'; '.join(warnings)})" if warnings else ""))


def spec_decode(ctx: Context, out: CheckResult) -> CheckResult:
    """Mean acceptance length 1 + Δaccepted/Δdrafts since preflight's scrape; skipped without
    spec-decode counters (MTP off, or --disable-log-stats)."""
    p = ctx.profile

    def delta(name: str) -> float:
        return metrics.delta(ctx.metrics_before, after, name, model_name=ctx.model)

    time.sleep(p.spec_settle_s)
    after = metrics.scrape(ctx.client, p.preflight_timeout_s)
    if after is None or metrics.total(after, metrics.SPEC_DRAFTS, model_name=ctx.model) is None:
        out.status = SKIP
        return _finish(out, "no /metrics" if after is None else
                       f"no {metrics.SPEC_DRAFTS} in /metrics (MTP off or --disable-log-stats)")
    if probed := (delta(metrics.SPEC_DRAFTS) < p.spec_min_drafts):
        # Too little of our own traffic (e.g. --only spec_decode): verify-full's probe.
        msgs = [{"role": "user", "content": prompts.SPEC_PROBE_REQUEST}]
        res = ctx.chat(msgs, p.spec_probe_max_tokens, 0.0, p.spec_probe_timeout_s)
        out.details["probe"] = _attempt(res)
        _failed(ctx, out, res, "probe")
        time.sleep(p.spec_settle_s)
        after = metrics.scrape(ctx.client, p.preflight_timeout_s) or after
    drafts, accepted = delta(metrics.SPEC_DRAFTS), delta(metrics.SPEC_ACCEPTED)
    out.details.update(drafts=int(drafts), accepted_tokens=int(accepted), probed=probed,
                       min_acceptance_length=p.spec_min_acceptance_length,
                       baseline_scraped=ctx.metrics_before is not None)
    acc = acceptance_between(ctx.metrics_before or [], after, ctx.model)[0]
    if acc is None:  # drafts <= 0
        return _fail(out, Finding("no_drafts", "spec-decode counters exist but did not move "
                                               "during the gate's traffic"))
    out.details["mean_acceptance_length"] = round(acc.length, 3)
    if acc.rate is not None:
        out.details["acceptance_rate"] = round(acc.rate, 4)
        if acc.rate >= 0.995:
            # club-3090: "MTP acceptance hit 100% but outputs collapsed" (broken K+1 verify).
            out.details["warnings"] = ["acceptance ~100%: the verify step may accept anything "
                                       "(see the needle checks)"]
    if acc.per_position:
        out.details["per_position"] = [round(x, 3) for x in acc.per_position]
    if acc.length < p.spec_min_acceptance_length:
        out.findings.append(Finding(
            "low_acceptance", f"mean acceptance length {acc.length:.2f} < "
                              f"{p.spec_min_acceptance_length:.2f} over {int(drafts)} drafts"))
    return _finish(out, f"mean acceptance length {acc.length:.2f} over {int(drafts)} drafts")


def throughput(ctx: Context, out: CheckResult) -> CheckResult:
    """Decode speed, CV and MTP acceptance against the baseline; sets ``ctx.throughput_record``."""
    p = ctx.profile
    bench = Bench(ctx.client, BenchSettings(runs=p.throughput_runs, warmup=p.throughput_warmup,
                                            timeout_s=p.throughput_timeout_s),
                  progress=ctx.progress, model=ctx.model)
    results = bench.shapes()
    measured = {name: r.figures() for name, r in results.items()}
    code = results["code"]
    # No per-position counters (an older vLLM): unknown, not "nothing accepted".
    acceptance = (code.acceptance.per_position or None) if code.acceptance else None
    history = (read_throughput_history(Path(p.throughput_history_dir)
                                       / THROUGHPUT_HISTORY_NAME, p.throughput_stack)
               if p.throughput_stack and p.throughput_history_dir else [])
    base = profile_baseline(history, p)
    limits = Limits(p.throughput_margin, p.throughput_cv_max, p.throughput_acceptance_floor)
    judged = bool(p.throughput_stack) or bool(base.figures)  # no stack, no history: references
    out.findings = judge(measured, acceptance, base, limits)
    if not judged:
        out.findings = [f for f in out.findings if f.name == "no_measurement"]
    # The gate-wide rule: 5xx, connection errors and timeouts fail, a measured run or not.
    out.findings += [_failed_runs(r) for name, r in results.items()
                     if r.failed and measured[name] is not None]
    out.status = FAIL if out.findings else PASS
    out.details = {"stack": p.throughput_stack or None, "judged": judged,
                   "baseline": base.to_dict(), "history_records": len(history),
                   "limits": encode(limits),
                   "shapes": {k: v.to_dict() for k, v in results.items()}}
    if acceptance is None and limits.acceptance_floor:
        out.details["acceptance_note"] = "floors not checked: " + (
            code.acceptance_note or "no per-position acceptance in /metrics")
    ctx.throughput_record = bench.result.record(
        p.throughput_stack or ctx.model, result=out.status, acceptance=acceptance,
        scale=p.throughput_scale, baseline=base.to_dict(), version=ctx.version)
    out.summary = _summary(measured, base, code, out.findings, judged)
    return out


def _failed_runs(res: ShapeResult) -> Finding:
    return Finding("failed_runs", f"{res.shape}: {len(res.failed)}/{len(res.runs)} runs "
                                  f"measured nothing (first: {res.failed[0].why})", res.shape)


def _summary(measured: dict[str, ShapeFigures | None], base: Baseline, code: ShapeResult,
             findings: list[Finding], judged: bool) -> str:
    parts = []
    for shape, figs in measured.items():
        if figs is None:
            parts.append(f"{shape} -")
            continue
        want = base.figures.get(shape)
        vs = f" ({figs.decode / want:.0%} of {want:.1f})" if want and judged else ""
        cv = f" CV {figs.cv:.1%}" if figs.cv is not None else ""
        parts.append(f"{shape} {figs.decode:.1f} tok/s{vs}{cv}")
    parts.append(f"acceptance {code.acceptance or 'unknown'}")
    text = "; ".join(parts)
    if findings:
        return "; ".join(f.message for f in findings[:2]) + f" [{text}]"
    return text + ("" if judged else " (not judged: no stack and no reference)")


CHECKS: tuple[tuple[Callable[[Context, CheckResult], CheckResult], str], ...] = (
    (preflight, "Preflight"),
    (needles, "Needles (1)"),
    (tool_prefill, "Tool-response prefill (2)"),
    (ide_oneshot, "IDE-agent one-shot (3)"),
    (agent_multiturn, "Multi-turn agent (4)"),
    (coding, "LeetCode-shape coding (5)"),
    (reasoning, "Reasoning-heavy (6)"),
    (needles_deep, "Deep needles (7)"),
    (soak, "Soak"),
    (spec_decode, "Spec-decode acceptance"),
    (throughput, "Throughput"),
)
CHECK_NAMES: tuple[str, ...] = tuple(check.__name__ for check, _ in CHECKS)
