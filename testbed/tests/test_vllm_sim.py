"""Tests of the vLLM serving simulator (testbed/rigfleet_testbed/images/vllm-sim).

Servers run as subprocesses on 127.0.0.1 with a temporary GPU root (``NVIDIA_SIM_ROOT``), a
fake model directory and a private copy of the package carrying the build info under test.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from rigfleet_testbed.nvidia import simstate

_HERE = Path(__file__).resolve().parent
# The helpers next to this file, and the simulator package itself (not installed anywhere).
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent / "rigfleet_testbed" / "images" / "vllm-sim"))

from vllm.sim import facts, kvcache, responder, textgen, tokenizer  # noqa: E402
from vllm.sim.args import parse_args  # noqa: E402
from vllm.sim.chat import normalise  # noqa: E402
from vllm_sim_helpers import (  # noqa: E402
    MTP,
    SimServer,
    free_port,
    make_gpu_root,
    make_model,
    make_package,
    metric,
    needle_prompt,
)

NAME = "qwen3.6-27b-autoround"
GOOD = "01d4d1ad375dc5854779c593eee093bcebb0cada"
DYING = "1acd67a795ebccdf9b9db7697ae9082058301657"
COMMON = ["--served-model-name", NAME, "--tensor-parallel-size", "2", "--max-model-len",
          "262144", "--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
          "--tool-call-parser", "qwen3_coder", "--default-chat-template-kwargs",
          '{"enable_thinking": false}', "--enable-prefix-caching", "--quantization",
          "auto_round", "--dtype", "float16", "--trust-remote-code", "--enable-chunked-prefill",
          "--disable-custom-all-reduce", "--max-num-seqs", "2"]
INT8 = COMMON + ["--kv-cache-dtype", "int8_per_token_head", "--gpu-memory-utilization", "0.92",
                 "--max-num-batched-tokens", "8192", "--speculative-config", MTP]
TQ3 = COMMON + ["--kv-cache-dtype", "turboquant_3bit_nc", "--gpu-memory-utilization", "0.85",
                "--max-num-batched-tokens", "4128", "--speculative-config", MTP]
GENESIS_WITH_P67 = ["P4", "P66_CUDAGRAPH_SIZE_FILTER", "P67_TQ_MULTI_QUERY_KERNEL", "PN14"]
GENESIS_WITHOUT_P67 = ["P4", "P66_CUDAGRAPH_SIZE_FILTER", "PN14"]
COLORS = ["blue", "crimson", "amber", "violet", "teal", "golden", "silver", "scarlet"]
ANIMALS = ["tiger", "falcon", "otter", "lynx", "heron", "panda", "wolf", "gecko"]


def boot_failure(tmp_path: Path, args: list[str], sub: str = "a", env=None,
                 model: Path | None = None, **pkg) -> tuple[int, str]:
    root = make_gpu_root(tmp_path) if not (env or {}).get("_no_root") else tmp_path / "none"
    site = make_package(tmp_path / sub, **pkg)
    srv = SimServer(site, root, model or make_model(tmp_path), args,
                    env={k: v for k, v in (env or {}).items() if not k.startswith("_")})
    rc = srv.wait_exit()
    return rc, srv.output()


def secret_and_prompt(seed: int, units: int = 180) -> tuple[str, str]:
    rng = random.Random(seed)
    secret = f"{rng.choice(COLORS)} {rng.choice(ANIMALS)} {rng.randint(10, 99)}"
    salt = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(32))
    return secret, needle_prompt(units, rng.uniform(0.05, 0.95), secret, salt)


def recalled(content: str, secret: str) -> bool:
    """verify-stress's rule: every word of the secret appears in the reply."""
    return all(w.lower() in content.lower() for w in secret.split())


# ---------------------------------------------------------------------------------------
# In-process units
# ---------------------------------------------------------------------------------------

def test_tokenizer_is_lossless_and_about_four_chars_per_token():
    text = "Hello, world! The hidden phrase is 'blue tiger 42'.\n\n\tnaïve 東京 🎉 x___y"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert all(i < 2**53 for i in tokenizer.encode(text))
    prose = ("The history of computing stretches from mechanical calculators through vacuum "
             "tubes and transistors to the microprocessors of today. ") * 20
    ratio = len(prose) / tokenizer.count(prose)
    assert 3.3 < ratio < 4.6
    assert tokenizer.count("<|im_start|>user\nhi<|im_end|>") == 5


def test_kv_pool_matches_club3090_measurements():
    int8 = kvcache.plan(24.0, 0.92, 2, "int8_per_token_head", True, 262144)
    tq3 = kvcache.plan(24.0, 0.85, 2, "turboquant_3bit_nc", True, 262144)
    assert abs(int8.num_tokens - 605_495) < 6000
    assert abs(tq3.num_tokens - 1_220_000) < 15000
    assert round(int8.max_concurrency, 2) == 2.31
    with pytest.raises(kvcache.KvCacheError, match="max seq len \\(262144\\)"):
        kvcache.plan(24.0, 0.9, 1, "auto", False, 262144)


def test_args_accept_stack_flags_and_reject_unknown(capsys):
    cfg = parse_args(["--model", "/m", *INT8])
    assert cfg.mtp_tokens == 3 and cfg.served_model_names == [NAME]
    assert cfg.default_chat_template_kwargs == {"enable_thinking": False}
    assert parse_args(["/m2", "--max_model_len", "4096"]).model == "/m2"
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model", "/m", "--no-such-flag"])
    assert exc.value.code == 2
    assert "vllm serve: error: unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_recall_finds_a_fact_at_any_depth():
    for depth in (0.0, 0.37, 0.99):
        secret, prompt = secret_and_prompt(int(depth * 100), units=300)
        prompt = needle_prompt(300, depth, secret, "salt")
        q = facts.find_question(prompt)
        fact = facts.best_fact(q, facts.extract_facts(prompt))
        assert fact is not None and fact.value == secret and q.value_only


def test_essay_text_is_varied_and_not_degenerate():
    msgs = normalise([{"role": "user", "content": "Write a detailed 1500-word essay explaining "
                       "how transformer attention works in large language models."}])
    reply = responder.respond(responder.ChatTask(msgs, seed=7))
    words = reply.content.split()
    assert tokenizer.count(reply.content) >= 1000
    assert len(set(words[:200])) / 200 > 0.3
    lines = [ln for ln in reply.content.splitlines() if ln.strip()]
    assert all(lines[i:i + 5] != [lines[i]] * 5 for i in range(len(lines)))
    assert "!!!" not in reply.content and "<tool_call>" not in reply.content


def test_code_request_produces_code():
    msgs = normalise([{"role": "user", "content": "Implement a Python function that returns the "
                       "length of the longest subarray whose sum equals k."}])
    reply = responder.respond(responder.ChatTask(msgs, seed=3))
    assert "```python" in reply.content and "def " in reply.content and "return" in reply.content


def test_tool_fit_and_arguments():
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "units": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}}
    msgs = normalise([{"role": "user", "content": "What's the weather like in Tokyo, in "
                       "celsius?"}])
    reply = responder.respond(responder.ChatTask(msgs, [weather], "auto", seed=1))
    assert reply.tool_calls[0].name == "get_weather"
    assert reply.tool_calls[0].arguments == {"city": "Tokyo", "units": "celsius"}
    msgs = normalise([{"role": "user", "content": "Tell me a joke about databases."}])
    assert not responder.respond(responder.ChatTask(msgs, [weather], "auto", seed=1)).tool_calls
    assert responder.respond(responder.ChatTask(msgs, [weather], "required", seed=1)).tool_calls
    assert textgen.topic_words("weather weather in Paris today")[0] == "weather"


# ---------------------------------------------------------------------------------------
# Boot failures
# ---------------------------------------------------------------------------------------

def test_no_gpus(tmp_path):
    rc, out = boot_failure(tmp_path, INT8, env={"_no_root": "1"})
    assert rc == 1
    assert "RuntimeError: No CUDA GPUs are available" in out
    assert "RuntimeError: Engine core initialization failed. See root cause above." in out


def test_tensor_parallel_above_gpu_count(tmp_path):
    rc, out = boot_failure(tmp_path, [*INT8, "--tensor-parallel-size", "4"])
    assert rc == 1
    assert "World size (4) is larger than the number of available GPUs (2)" in out


def test_model_dir_problems(tmp_path):
    missing = tmp_path / "nope" / "qwen3.6-27b-autoround-int4"
    rc, out = boot_failure(tmp_path, INT8, model=missing)
    assert rc == 1
    assert (f"OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
            f"'{missing}'. Use `repo_type` argument if needed.") in out
    model = make_model(tmp_path)
    (model / "model-00003-of-00004.safetensors").unlink()
    rc, out = boot_failure(tmp_path, INT8, sub="b", model=model)
    assert rc == 1 and "FileNotFoundError" in out and "model-00003-of-00004.safetensors" in out
    # A released GPU allocation: the failed boot must not leave memory held.
    assert not list((tmp_path / "nvidia-sim" / "alloc").glob("*.json"))
    (model / "model-00003-of-00004.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    rc, out = boot_failure(tmp_path, INT8, sub="c", model=model)
    assert rc == 1
    assert "safetensors_rust.SafetensorError: Error while deserializing header:" in out


def test_speculators_regression_build_dies_at_boot_with_mtp(tmp_path):
    rc, out = boot_failure(tmp_path, TQ3, tag=f"nightly-{DYING}")
    model = tmp_path / "qwen3.6-27b-autoround-int4"
    assert rc == 1
    assert "maybe_override_with_speculators" in out
    assert (f"OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
            f"'{model}'") in out
    assert "vLLM API server version 0.20.2rc1.dev129+g1acd67a79" in out
    # Without MTP the same build boots.
    no_mtp = [a for a in TQ3 if a not in ("--speculative-config", MTP)]
    # (with the Marlin pad fix: 0.20.2 cannot run this model's TP=2 shards without it)
    srv = SimServer(make_package(tmp_path / "b", f"nightly-{DYING}", genesis_applied=["P87"]),
                    make_gpu_root(tmp_path), model, no_mtp)
    with srv:
        srv.wait_ready()


def test_turboquant_on_hybrid_needs_vllm_39931_or_genesis_p4(tmp_path):
    # 0.20.2rc1.dev9 predates hybrid TurboQuant (vllm#39931, dev60): refused without Genesis P4.
    rc, out = boot_failure(tmp_path, TQ3, tag=f"nightly-{GOOD}")
    assert rc == 1
    assert "NotImplementedError: TurboQuant KV cache is not supported for hybrid" in out
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    for sub, tag, genesis in (("p4", f"nightly-{GOOD}", ["P4", "P87"]), ("rel", "v0.24.0", None)):
        with SimServer(make_package(tmp_path / sub, tag, genesis_applied=genesis), root, model,
                       TQ3) as srv:
            srv.wait_ready()
            srv.stop()


def test_kv_cache_too_small_and_crash_at_boot(tmp_path):
    args = [a for a in INT8 if a not in ("--speculative-config", MTP)]
    args = args + ["--tensor-parallel-size", "1", "--kv-cache-dtype", "auto"]
    rc, out = boot_failure(tmp_path, args)
    assert rc == 1
    assert "ValueError: To serve at least one request with the model's max seq len (262144)" in out
    assert "estimated maximum model length is" in out
    rc, out = boot_failure(tmp_path, INT8, sub="b",
                           env={"SIM_FAULT_CRASH_AT_BOOT": "CUDA error: an illegal memory access"})
    assert rc == 1 and "RuntimeError: CUDA error: an illegal memory access" in out
    assert not list((tmp_path / "nvidia-sim" / "alloc").glob("*.json"))


def test_gpu_memory_is_held_until_exit_and_stale_holders_are_ignored(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    site = make_package(tmp_path / "pkg")
    alloc = root / "alloc"
    first = SimServer(site, root, model, INT8).wait_ready()
    try:
        held = [json.loads(p.read_text()) for p in alloc.glob("*.json")]
        assert len(held) == 1 and held[0]["gpus"] == {"0": 22610, "1": 22610}
        assert held[0]["pid"] == first.proc.pid
        # The nvidia-smi stand-in reads the same files the same way.
        live = simstate.live_allocations(simstate.SimPaths(root, root / "hardware.json"))
        assert [(a.pid, a.gpus) for a in live] == [(first.proc.pid, {0: 22610, 1: 22610})]
        second = SimServer(site, root, model, INT8)
        assert second.wait_exit() == 1
        out = second.output()
        assert ("ValueError: Free memory on device cuda:0 (1.65/24.00 GiB) on startup is less "
                "than desired GPU memory utilization (0.92, 22.08 GiB).") in out
        assert "Failed core proc(s): {}" in out
    finally:
        assert first.stop() == 0
    assert not list(alloc.glob("*.json"))
    third = SimServer(site, root, model, INT8).wait_ready()
    third.stop(signal.SIGKILL)  # dies without cleaning up: its file stays behind, unlocked
    assert len(list(alloc.glob("*.json"))) == 1
    with SimServer(site, root, model, INT8) as fourth:
        fourth.wait_ready()
        live = [json.loads(p.read_text()) for p in alloc.glob("*.json")]
        assert [a["pid"] for a in live] == [fourth.proc.pid]
        fourth.stop()


def test_port_refuses_connections_until_boot_is_done(tmp_path):
    port = free_port()
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    srv = SimServer(make_package(tmp_path), root, model, INT8, port=port,
                    env={"SIM_BOOT_SECONDS": "1.0"})
    with srv:
        time.sleep(0.4)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        srv.wait_ready()
        assert srv.request("GET", "/health").status == 200
        srv.stop()


# ---------------------------------------------------------------------------------------
# Serving
# ---------------------------------------------------------------------------------------

def test_api_basics_auth_and_errors(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    with SimServer(make_package(tmp_path), root, model, [*INT8, "--api-key", "s3cret"]) as srv:
        srv.wait_ready()
        auth = {"authorization": "Bearer s3cret"}
        assert srv.request("GET", "/health").status == 200
        assert srv.request("GET", "/version").json() == {"version": "0.24.0"}
        r = srv.request("GET", "/v1/models")
        assert r.status == 401 and r.json() == {"error": "Unauthorized"}
        card = srv.request("GET", "/v1/models", headers=auth).json()["data"][0]
        assert (card["id"], card["root"], card["max_model_len"], card["owned_by"]) == (
            NAME, str(model), 262144, "vllm")
        msgs = [{"role": "user", "content": "What is the capital of France? Reply in one "
                 "short sentence."}]
        assert srv.chat(msgs, max_tokens=30).status == 401
        r = srv.chat(msgs, max_tokens=30, temperature=0.6, headers=auth)
        assert r.status == 200 and "paris" in r.json()["choices"][0]["message"]["content"].lower()
        r = srv.request("POST", "/v1/chat/completions", raw=b"{not json", headers=auth)
        assert r.status == 400 and r.json()["error"]["code"] == 400
        tok = srv.request("POST", "/tokenize", {"prompt": "the cat sat"}).json()
        assert tok["count"] == 3 and tok["max_model_len"] == 262144
        assert srv.request("POST", "/detokenize", {"tokens": tok["tokens"]}).json() == {
            "prompt": "the cat sat"}
        chat_tok = srv.request("POST", "/tokenize", {"messages": msgs}).json()
        assert chat_tok["count"] > tokenizer.count(msgs[0]["content"])
        r = srv.request("POST", "/v1/completions",
                        {"model": NAME, "prompt": "The capital of France is", "max_tokens": 8},
                        headers=auth)
        assert r.status == 200 and r.json()["usage"]["completion_tokens"] <= 8
        srv.stop()


def test_over_length_prompt_is_a_400(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    with SimServer(make_package(tmp_path), root, model,
                   [*INT8, "--max-model-len", "4096", "--disable-log-stats"]) as srv:
        srv.wait_ready()
        assert srv.request("GET", "/v1/models").json()["data"][0]["max_model_len"] == 4096
        # --disable-log-stats: /metrics answers but carries no vllm: series (vLLM #11987).
        assert not any(k.startswith("vllm:") for k in srv.metrics())
        _, prompt = secret_and_prompt(1, units=120)
        r = srv.chat([{"role": "user", "content": prompt}], max_tokens=30)
        assert r.status == 400
        msg = r.json()["error"]["message"]
        assert msg.startswith("This model's maximum context length is 4096 tokens. However, "
                              "your request has ")
        assert "Please reduce the length of the input messages." in msg
        r = srv.chat([{"role": "user", "content": "hi"}], max_tokens=5000)
        assert r.status == 400 and "max_tokens" in r.json()["error"]["message"]
        srv.stop()


def _ask_needle(srv: SimServer, seed: int, units: int = 180, stream: bool = False):
    secret, prompt = secret_and_prompt(seed, units)
    msgs = [{"role": "user", "content": prompt}]
    kw = dict(max_tokens=30, temperature=0.0, chat_template_kwargs={"enable_thinking": False})
    if stream:
        events = srv.stream_chat(msgs, stream_options={"include_usage": True}, **kw)
        content = "".join(e["choices"][0]["delta"].get("content") or ""
                          for e in events if isinstance(e, dict) and e["choices"])
        usage = events[-2]["usage"]
    else:
        body = srv.chat(msgs, **kw).json()
        content = body["choices"][0]["message"]["content"] or ""
        usage = body["usage"]
    return secret, content, usage


def test_needle_recall_int8_vs_tq3_with_and_without_p67(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    cases = [
        ("int8", INT8, None, True),
        ("tq3-p67", TQ3, GENESIS_WITH_P67, True),
        ("tq3-no-p67", TQ3, GENESIS_WITHOUT_P67, False),
    ]
    for name, args, genesis, expect in cases:
        site = make_package(tmp_path / name, genesis_applied=genesis)
        with SimServer(site, root, model, args) as srv:
            srv.wait_ready()
            # Short prompts are fine in every configuration.
            short = srv.chat([{"role": "user", "content": "Remember: the vault code is "
                               "'4471'. What is the vault code? Reply with only the code."}],
                             max_tokens=30).json()
            assert short["choices"][0]["message"]["content"].strip() == "4471", name
            for seed in (11, 12):
                secret, content, usage = _ask_needle(srv, seed, stream=(seed == 12))
                assert usage["prompt_tokens"] > 10_000, usage
                assert recalled(content, secret) is expect, (name, secret, content[:80])
            srv.stop()


def test_tq3_without_p67_collapse_is_deterministic_and_bimodal(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    site = make_package(tmp_path, genesis_applied=GENESIS_WITHOUT_P67)
    with SimServer(site, root, model, TQ3) as srv:
        srv.wait_ready()
        seen = set()
        for seed in (20, 21, 23, 24):
            secret, prompt = secret_and_prompt(seed, units=120)
            msgs = [{"role": "user", "content": prompt}]
            t0 = time.monotonic()
            a = srv.chat(msgs, max_tokens=40).json()
            took = time.monotonic() - t0
            ca = a["choices"][0]["message"]["content"]
            assert not recalled(ca, secret)
            if a["usage"]["completion_tokens"]:
                # Same prompt, same collapse (seeded by the prompt, not by chance).
                again = srv.chat(msgs, max_tokens=40).json()
                assert again["choices"][0]["message"]["content"] == ca
            if a["usage"]["completion_tokens"] == 0:
                assert ca == "" and took >= 1.0
                seen.add("empty")
            elif "!!!!" in ca:
                seen.add("flood")
            else:
                words = ca.split()
                assert len(set(words)) == 1 and len(words) > 10
                seen.add("repeat")
        assert len(seen) >= 2
        m = srv.metrics()
        drafts = metric(m, "vllm:spec_decode_num_drafts_total")
        accepted = metric(m, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafts and accepted / drafts > 2.9  # collapsed replies "accept" every draft
        srv.stop()


def test_metrics_move_and_healthy_acceptance(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    with SimServer(make_package(tmp_path), root, model, INT8) as srv:
        srv.wait_ready()
        before = srv.metrics()
        assert metric(before, "vllm:prompt_tokens_total") == 0
        msgs = [{"role": "user", "content": "Explain step by step how a hash map works."}]
        body = srv.chat(msgs, max_tokens=1500).json()
        usage = body["usage"]
        assert usage["completion_tokens"] == 1500
        assert body["choices"][0]["finish_reason"] == "length"
        srv.chat(msgs, max_tokens=1500)  # same prompt again: a prefix cache hit
        m = srv.metrics()
        assert metric(m, "vllm:prompt_tokens_total", model_name=NAME, engine="0") == \
            2 * usage["prompt_tokens"]
        assert metric(m, "vllm:generation_tokens_total") == 3000
        assert metric(m, "vllm:prefix_cache_queries_total") == 2 * usage["prompt_tokens"]
        assert metric(m, "vllm:prefix_cache_hits_total") > 0
        assert metric(m, "vllm:num_requests_running") == 0
        assert "vllm:kv_cache_usage_perc" in "".join(m)
        drafts = metric(m, "vllm:spec_decode_num_drafts_total")
        al = 1 + metric(m, "vllm:spec_decode_num_accepted_tokens_total") / drafts
        # Prose: MTP n=3 accepts ~[0.82, 0.52, 0.31] (mean length ~2.65).
        assert 2.4 < al < 2.9
        assert metric(m, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
        per_pos = [metric(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                          position=str(i)) / drafts for i in range(3)]
        assert per_pos[0] > per_pos[1] > per_pos[2]
        assert abs(per_pos[0] - 0.82) < 0.05 and abs(per_pos[2] - 0.31) < 0.07
        # Code accepts more: ~[0.95, 0.84, 0.75] (seed 004's 93/87/74%), length ~3.5.
        code = srv.chat([{"role": "user", "content": "Implement quicksort in Python with "
                          "comments."}], max_tokens=1500).json()
        assert code["usage"]["completion_tokens"] > 800
        m2 = srv.metrics()
        d2 = metric(m2, "vllm:spec_decode_num_drafts_total") - drafts
        pp2 = [(metric(m2, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                       position=str(i)) - per_pos[i] * drafts) / d2 for i in range(3)]
        assert abs(pp2[0] - 0.95) < 0.05 and abs(pp2[2] - 0.75) < 0.08
        assert 3.2 < 1 + sum(pp2) < 3.9
        srv.stop()


def test_regressed_build_collapses_acceptance_and_stops_early(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    site = make_package(tmp_path, version="0.20.2rc1.dev240+gb7e4d1c9a",
                        commit="b7e4d1c9a2f5e8b3d6c0a9f2e5b8d1c4a7f0e3b6",
                        regressions=("spec-decode-acceptance-collapse",))
    with SimServer(site, root, model, INT8) as srv:
        srv.wait_ready()
        for prompt in ("Prove by induction that the sum of the first n cubes equals the square "
                       "of the sum of the first n integers.",
                       "Write a detailed 1500-word essay explaining transformer attention."):
            body = srv.chat([{"role": "user", "content": prompt}], max_tokens=8192).json()
            assert body["choices"][0]["finish_reason"] == "stop"
            assert 100 < body["usage"]["completion_tokens"] <= 160
        m = srv.metrics()
        drafts = metric(m, "vllm:spec_decode_num_drafts_total")
        al = 1 + metric(m, "vllm:spec_decode_num_accepted_tokens_total") / drafts
        assert 1.0 < al < 1.25
        srv.stop()


def test_streaming_with_usage_thinking_and_tools(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    with SimServer(make_package(tmp_path), root, model, INT8) as srv:
        srv.wait_ready()
        events = srv.stream_chat(
            [{"role": "user", "content": "Write a three-sentence haiku about debugging."}],
            max_tokens=120, stream_options={"include_usage": True})
        assert events[-1] == "[DONE]"
        usage = events[-2]["usage"]
        assert events[-2]["choices"] == []
        chunks = [e for e in events[:-2] if e["choices"][0]["delta"].get("content")]
        text = "".join(e["choices"][0]["delta"]["content"] for e in chunks)
        assert len(chunks) >= 5 and len(text) >= 20
        assert usage["completion_tokens"] == tokenizer.count(text)
        assert events[-3]["choices"][0]["finish_reason"] == "stop"
        # Thinking on: reasoning comes separately (reasoning parser set).
        body = srv.chat([{"role": "user", "content": "What is 2+2?"}], max_tokens=4000,
                        chat_template_kwargs={"enable_thinking": True}).json()
        msg = body["choices"][0]["message"]
        assert "4" in msg["content"] and len(msg["reasoning_content"]) >= 50
        # Streaming tool call with thinking on.
        weather = {"type": "function", "function": {
            "name": "get_weather", "description": "Get the current weather for a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "units": {"type": "string"}},
                "required": ["city"]}}}
        events = srv.stream_chat([{"role": "user", "content": "What's the weather in Paris?"}],
                                 tools=[weather], tool_choice="auto", max_tokens=256,
                                 chat_template_kwargs={"enable_thinking": True})
        deltas = [e["choices"][0]["delta"] for e in events if isinstance(e, dict) and e["choices"]]
        calls = [c for d in deltas for c in d.get("tool_calls") or []]
        assert calls[0]["function"]["name"] == "get_weather"
        args = json.loads("".join(c["function"].get("arguments") or "" for c in calls))
        assert args == {"city": "Paris"}
        assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
        assert not any("<tool_call>" in (d.get("content") or "") for d in deltas)
        # The tool's answer is summarised in text.
        body = srv.chat([
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1",
             "content": '{"temperature": 18, "conditions": "light rain", "wind": "12 km/h"}'},
        ], tools=[weather], max_tokens=300).json()
        assert body["choices"][0]["finish_reason"] == "stop"
        assert len(body["choices"][0]["message"]["content"]) >= 50
        body = srv.chat([{"role": "user", "content": "What's the weather in Paris?"}],
                        tools=[weather], tool_choice="none", max_tokens=100).json()
        assert body["choices"][0]["message"]["tool_calls"] == []
        srv.stop()


def test_fault_crash_past_tokens_kills_the_engine(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    with SimServer(make_package(tmp_path), root, model, INT8,
                   env={"SIM_FAULT_CRASH_PAST_TOKENS": "2000"}) as srv:
        srv.wait_ready()
        ok = srv.chat([{"role": "user", "content": "Say hello."}], max_tokens=10)
        assert ok.status == 200
        _, prompt = secret_and_prompt(5, units=60)
        try:
            status = srv.chat([{"role": "user", "content": prompt}], max_tokens=10).status
        except (ConnectionError, OSError):
            status = None  # a dropped connection is fine too
        assert status in (500, None)
        assert srv.wait_exit() != 0
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in srv.output()
    assert not list((root / "alloc").glob("*.json"))


def test_fault_hang_accepts_but_never_answers(tmp_path):
    root, model = make_gpu_root(tmp_path), make_model(tmp_path)
    with SimServer(make_package(tmp_path), root, model, INT8,
                   env={"SIM_FAULT_HANG": "1"}) as srv:
        srv.wait_ready()
        with pytest.raises(TimeoutError):
            srv.request("GET", "/v1/models", timeout=0.5)
        assert srv.stop() == 0
