"""Tests of the verify-stress gate (rigfleet/hostside/verify).

Units: the output-health detectors on crafted texts, profiles and ``--set`` validation, the
report and exit status, the client's SSE handling, metrics parsing, prompt sizing.
End to end: the gate (FAST profile) against the serving simulator on 127.0.0.1, in the stack
shapes the gate exists for (int8 + MTP; TurboQuant 3-bit + MTP with and without Genesis P67; a
build whose spec-decode acceptance collapses; a stack whose max-model-len is below the deep
needles).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from verify_sim import (
    GENESIS_WITH_P67,
    GENESIS_WITHOUT_P67,
    INT8_MTP,
    INT8_SHORT_NO_MTP,
    REGRESSED_BUILD,
    TQ3_MTP,
    sim_server,
)

from rigfleet.hostside.verify import health, metrics, prompts
from rigfleet.hostside.verify.client import Client, redact_url
from rigfleet.hostside.verify.profiles import FAST, FULL, ProfileError, resolve
from rigfleet.hostside.verify.report import (
    FAIL,
    PASS,
    SKIP,
    CheckResult,
    Report,
    write_pair,
)
from rigfleet.hostside.verify.runner import run

REPO = Path(__file__).resolve().parents[2]
HOSTSIDE = REPO / "rigfleet" / "hostside"
LIMITS = FULL

# ---------------------------------------------------------------------------------------------
# Output-health detectors
# ---------------------------------------------------------------------------------------------

ESSAY = (
    "Transformer attention lets every token look at every other token in the context and "
    "decide how much each one matters for the next prediction. Each position produces a "
    "query, a key and a value vector; the dot products of one query with all keys, scaled "
    "and passed through a softmax, become weights for averaging the values. Because this "
    "happens in parallel for many heads, the model can track syntax in one head and long "
    "range references in another.\n\n"
    "The cost is quadratic in sequence length, which is why long contexts strain memory. "
    "Serving systems cache the keys and values of earlier tokens so that generating a new "
    "token only needs one new query. Quantizing that cache saves memory but can hurt recall "
    "when the compression is too aggressive, and speculative decoding adds draft tokens that "
    "a verification step must check against the cached history before they are accepted.\n\n"
    "In practice, engineers balance context length, batch size and precision: a bigger pool "
    "of cached tokens allows more concurrent users, while careful kernels keep the accuracy "
    "of retrieval intact even at depths of tens of thousands of tokens."
)
CODE_ANSWER = '''GOAL: find the longest subarray summing to k.

```python
def max_subarray_len(nums: list[int], k: int) -> int:
    first = {0: -1}
    best = total = 0
    for i, x in enumerate(nums):
        total += x
        if total - k in first:
            best = max(best, i - first[total - k])
        first.setdefault(total, i)
    return best


assert max_subarray_len([1, -1, 5, -2, 3], 3) == 4
assert max_subarray_len([-2, -1, 2, 1], 1) == 2
```

This runs in O(n) time and O(n) space, because each prefix sum is stored once.'''
TABLE_ANSWER = ("Here are the first values:\n\n| n | n^3 | sum | sum^2 |\n|---|---|---|---|\n"
                "| 1 | 1 | 1 | 1 |\n| 2 | 8 | 3 | 9 |\n| 3 | 27 | 6 | 36 |\n| 4 | 64 | 10 | 100 |\n"
                "| 5 | 125 | 15 | 225 |\n\nThe cumulative cube sums match the squared sums in "
                "every row, which is exactly what the identity predicts.")
PROOF_ANSWER = r"""**Base case.** For $n = 1$: $$1^3 = 1 = \left(\frac{1 \cdot 2}{2}\right)^2.$$

**Inductive step.** Assume $\sum_{i=1}^{k} i^3 = \left(\frac{k(k+1)}{2}\right)^2$. Then
$$\sum_{i=1}^{k+1} i^3 = \left(\frac{k(k+1)}{2}\right)^2 + (k+1)^3
  = \frac{(k+1)^2 (k^2 + 4k + 4)}{4} = \left(\frac{(k+1)(k+2)}{2}\right)^2,$$
which is the statement for $k + 1$, so the identity holds for every positive integer."""
TEST_HEAVY_CODE = "Tests:\n\n```python\n" + "\n".join(
    f"assert max_subarray_len([1, -1, 5, -2, 3], {k}) == {k % 4}" for k in range(40)) + "\n```"
HEALTHY = {
    "essay": ESSAY,
    "proof": PROOF_ANSWER,
    "tests": TEST_HEAVY_CODE,
    "code": CODE_ANSWER,
    "table": TABLE_ANSWER,
    "count": "\n".join(str(i) for i in range(1, 81)),
    "needle": "crimson otter 42",
    "paris": "The capital of France is Paris.",
    "list": "\n".join(f"{i}. Step {i}: check the {w} before moving on." for i, w in
                      enumerate(["inputs", "config", "cache", "logs", "metrics", "outputs"], 1)),
    "markdown": "## Summary\n\n---\n\n* **Rates** held steady.\n* **Bonds** slipped.\n\n"
                "> Markets stayed cautious ahead of the data.\n\n---\n",
}
PATHOLOGIES = {
    health.detect_punctuation_flood: [
        "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
        "The answer is!!!! clear",
        "! ! ! ! ! ! ! ! ! ! ! ! ! ! ! !",
        " ".join(f"{chr(97 + i % 26)}{p}" for i, p in enumerate(",.;:" * 12)),
    ],
    health.detect_first_word_repetition: [
        "The The The The quick brown fox",
        "blue blue blue blue blue blue blue blue",
        "cat dog cat bird cat fish cat cow cat ant cat owl",
    ],
    health.detect_repeated_line: [
        "Let me answer.\n" + "I will now answer.\n" * 5 + "Done.",
        "x = 1\n" * 6,
    ],
    health.detect_low_variety: [
        " ".join(["alpha beta gamma delta epsilon zeta eta theta iota kappa"] * 6),
    ],
}


@pytest.mark.parametrize("detector,texts", list(PATHOLOGIES.items()),
                         ids=lambda v: getattr(v, "__name__", ""))
def test_each_detector_fires_on_its_pathology(detector, texts):
    for text in texts:
        finding = detector(text, LIMITS)
        assert finding is not None, (detector.__name__, text)
        assert finding.name and finding.message


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_no_detector_fires_on_healthy_text(name):
    text = HEALTHY[name]
    for detector in PATHOLOGIES:
        assert detector(text, LIMITS) is None, (detector.__name__, name)
    assert health.detect_tool_call_leak(text) is None
    assert health.detect_empty(text) is None
    assert health.scan(text, "", [], "stop", LIMITS) == []


def test_empty_and_tool_call_leak_and_scan():
    assert health.detect_empty("").name == "empty"
    assert health.detect_empty("  \n ").name == "empty"
    assert health.detect_empty("", tool_calls=[{"function": {"name": "read_file"}}]) is None
    # Still thinking at the budget: not empty (verify-full allows it).
    assert health.detect_empty("", reasoning="Let me think", finish_reason="length") is None
    assert health.detect_empty("", reasoning="Let me think", finish_reason="stop") is not None
    leak = health.detect_tool_call_leak("Sure.\n<tool_call>\n<function=read_file>\n")
    assert leak is not None and leak.name == "tool_call_in_content"
    found = health.scan("", "!!!!!!!!!!!!", [], "stop", LIMITS)
    assert {(f.name, f.where) for f in found} == {("empty", "content"),
                                                   ("punctuation_flood", "reasoning")}
    found = health.scan("The The The The", "", [], "stop", LIMITS)
    assert [f.name for f in found] == ["first_word_repetition"]
    # Thresholds come from the profile.
    strict = resolve("full", ["health_first_word_repeats=2"])
    assert health.detect_first_word_repetition("Yes yes, indeed.", strict) is not None


# ---------------------------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------------------------

def test_profile_values():
    assert FULL.needle_depths == (10_000, 30_000)
    assert FULL.needle_deep_depths == (60_000, 90_000)
    assert FULL.prefill_tokens == 25_000 and FULL.ide_preamble_chars == 5_000
    assert FULL.ide_tools == 10 and FULL.reasoning_min_tokens == 500
    assert (FULL.soak_sessions, FULL.soak_turns) == (20, 5)
    assert FULL.spec_min_acceptance_length == 2.0 and FULL.soak_fail_rate == 0.05
    assert FULL.needle_timeout_s == 300 and FULL.reasoning_timeout_s == 600
    assert FAST.needle_depths == (8_000, 12_000)
    assert FAST.needle_deep_depths == (16_000, 24_000)
    assert FAST.prefill_tokens == 10_000 and FAST.reasoning_min_tokens == 500
    assert (FAST.soak_sessions, FAST.soak_turns, FAST.soak_concurrency) == (6, 4, 3)
    assert FAST.needle_timeout_s < FULL.needle_timeout_s


def test_profile_overrides_and_errors():
    p = resolve("fast", ["needle_depths=4000,6000", "soak_sessions=2", "soak_fail_rate=0.5"])
    assert p.needle_depths == (4000, 6000) and p.soak_sessions == 2
    assert p.soak_fail_rate == 0.5 and p.overrides["soak_sessions"] == 2
    assert resolve("full").overrides == {}
    with pytest.raises(ProfileError, match="unknown profile 'slow'; allowed: full, fast"):
        resolve("slow")
    with pytest.raises(ProfileError) as exc:
        resolve("fast", ["needle_dept=1"])
    assert "unknown key 'needle_dept'" in str(exc.value) and "needle_depths" in str(exc.value)
    with pytest.raises(ProfileError) as exc:
        resolve("fast", ["soak_sessions=many"])
    msg = str(exc.value)
    assert "soak_sessions" in msg and "'many'" in msg and "allowed: an integer > 0" in msg
    with pytest.raises(ProfileError, match="soak_fail_rate.*'1.5'.*between|at most 1"):
        resolve("fast", ["soak_fail_rate=1.5"])
    with pytest.raises(ProfileError, match="needle_depths.*comma-separated"):
        resolve("fast", ["needle_depths=8k"])
    with pytest.raises(ProfileError, match="expected key=value"):
        resolve("fast", ["needle_depths"])
    with pytest.raises(ProfileError, match="soak_turn_min_tokens=500 is above"):
        resolve("fast", ["soak_turn_min_tokens=500"])


# ---------------------------------------------------------------------------------------------
# Report and exit status
# ---------------------------------------------------------------------------------------------

def _report(statuses: list[str]) -> Report:
    rep = Report(url="http://127.0.0.1:8001", profile="fast", model="m", version="v")
    for i, s in enumerate(statuses):
        chk = CheckResult(f"c{i}", f"Check {i}", s, 0.5, summary=f"summary {i}")
        if s == FAIL:
            chk.findings.append(health.Finding("recall_miss", "needle not recalled", "8000 tok",
                                               "emer emer"))
            chk.details["attempts"] = [{"depth_tokens": 8000, "outcome": "recall_miss"}]
        rep.checks.append(chk)
    return rep


def test_report_exit_status_json_and_markdown(tmp_path):
    assert _report([PASS, SKIP, PASS]).exit_status() == 0
    rep = _report([PASS, FAIL, SKIP, FAIL, FAIL])
    assert rep.exit_status() == 3
    assert _report([FAIL] * 150).exit_status() == 100
    data = rep.as_dict()
    assert data["schema"] == "rigfleet-verify/1"
    assert data["summary"] == {"pass": 1, "fail": 3, "skip": 1} and data["exit_status"] == 3
    check = data["checks"][1]
    assert set(check) >= {"name", "status", "seconds", "details", "findings"}
    assert check["findings"][0] == {"name": "recall_miss", "message": "needle not recalled",
                                    "where": "8000 tok", "evidence": "emer emer"}
    md = rep.markdown()
    assert "FAIL (3 failed)" in md and "## Failed checks" in md and "### Check 1 (`c1`)" in md
    assert "**recall_miss** [8000 tok]" in md and "| 8000 | recall_miss |" in md
    first = write_pair(tmp_path / "r", "verify", json.dumps(data), md)
    second = write_pair(tmp_path / "r", "verify", json.dumps(data), md)
    assert first != second and all(p.exists() for p in first + second)
    assert first[0].name.startswith("verify-") and first[0].suffix == ".json"
    assert json.loads(first[0].read_text())["exit_status"] == 3
    assert first[1].read_text() == md


# ---------------------------------------------------------------------------------------------
# Client, metrics, prompts
# ---------------------------------------------------------------------------------------------

class _FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen_auth: list[str] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        _FakeHandler.seen_auth.append(self.headers.get("authorization") or "")
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "500":
            body = b'{"error": {"message": "CUDA out of memory", "code": 500}}'
            self.send_response(500)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                  {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
                  {"choices": [{"index": 0, "delta": {"tool_calls": [{
                      "index": 0, "id": "c1", "function": {"name": "read_file",
                                                           "arguments": '{"pa'}}]}}]},
                  {"choices": [{"index": 0, "delta": {"tool_calls": [{
                      "index": 0, "function": {"arguments": 'th": "a"}'}}]},
                                "finish_reason": "tool_calls"}]}]
        for ev in events:
            self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
        if mode == "ok":
            usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


@pytest.fixture
def fake_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_client_streaming_errors_and_key_handling(fake_server):
    url = f"http://127.0.0.1:{fake_server.server_address[1]}"
    client = Client(url + "/v1/", api_key="s3cret-key")
    assert "s3cret" not in repr(client) and client.base_url == url
    fake_server.mode = "ok"
    res = client.chat({"model": "m", "messages": []}, timeout=5, stream=True)
    assert res.ok and res.content == "Hello" and res.finish_reason == "tool_calls"
    assert res.tool_calls[0]["function"] == {"name": "read_file", "arguments": '{"path": "a"}'}
    assert res.completion_tokens == 3 and res.ttft is not None
    assert _FakeHandler.seen_auth[-1] == "Bearer s3cret-key"
    fake_server.mode = "drop"  # no [DONE]: the connection just ends
    res = client.chat({"model": "m", "messages": []}, timeout=5, stream=True)
    assert res.status == 200 and not res.ok and "without [DONE]" in res.error
    fake_server.mode = "500"
    res = client.chat({"model": "m", "messages": []}, timeout=5)
    assert res.status == 500 and res.error_message() == "CUDA out of memory"
    dead = Client("http://127.0.0.1:9", api_key="s3cret-key").request("GET", "/health", None, 2)
    assert dead.status == 0 and dead.error and "s3cret" not in dead.error
    assert redact_url("http://user:pw@host:8000/x") == "http://host:8000/x"
    # The host as written: brackets of an IPv6 address, a name's case.
    assert redact_url("http://u:p@[fd00::41]:8000/x") == "http://[fd00::41]:8000/x"
    assert redact_url("https://u@Rig-A.lan/v1") == "https://Rig-A.lan/v1"


def test_metrics_parsing_sums_engines_and_filters_models():
    text = (
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{model_name="a",engine="0"} 10.0\n'
        'vllm:spec_decode_num_drafts_total{model_name="a",engine="1"} 5.0\n'
        'vllm:spec_decode_num_drafts_total{model_name="b",engine="0"} 99.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="a",position="0"} 9\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="a",position="1"} 7\n'
        "process_start_time_seconds 1.7e9\n")
    samples = metrics.parse(text)
    assert metrics.total(samples, metrics.SPEC_DRAFTS, model_name="a") == 15.0
    assert metrics.total(samples, metrics.SPEC_ACCEPTED, model_name="a") is None
    assert metrics.by_label(samples, metrics.SPEC_ACCEPTED_PER_POS, "position",
                            model_name="a") == {"0": 9.0, "1": 7.0}


def test_needle_secrets_and_sizing():
    seen = {prompts.new_secret()[0] for _ in range(30)}
    assert len(seen) > 20  # fresh every time
    secret, salt = prompts.new_secret()
    color, animal, num = secret.split()
    assert color in prompts.COLORS and animal in prompts.ANIMALS and 10 <= int(num) <= 99
    assert len(salt) == 32
    assert prompts.recalled(secret, f"The phrase is '{secret.upper()}'.")
    assert not prompts.recalled(secret, f"{color} {animal}")
    for word in prompts.COLORS + prompts.ANIMALS:
        assert word not in " ".join(prompts.FILLER).lower()
    text = prompts.needle_messages(secret, salt, 40, 0.25)[0]["content"]
    assert text.startswith(f"SESSION-{salt}.") and text.endswith(prompts.NEEDLE_QUESTION)
    assert 0.15 < text.index(secret) / len(text) < 0.35

    def count(msgs, tools):  # ~4 chars per token, plus a template overhead
        return 12 + sum(len(m["content"] or "") for m in msgs) // 4

    sizer = prompts.Sizer(count, tolerance=0.02)
    sized = sizer.fit("needle", lambda n: prompts.needle_messages(secret, salt, n, 0.5), 9000)
    assert abs(sized.tokens - 9000) <= 180 and sized.tokens == count(sized.messages, None)
    assert len(prompts.ide_preamble(5000)) in range(4500, 5001)
    assert len(prompts.tools(10)) == 10 and prompts.tools(4)[0]["function"]["name"] == "read_file"


def test_hostside_is_stdlib_only():
    """Shipped to hosts as a zipapp: nothing outside the standard library may be imported."""
    for path in [HOSTSIDE / "__init__.py", *(HOSTSIDE / "verify").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            for root in roots:
                assert root in sys.stdlib_module_names or root == "__future__", (path, root)


# ---------------------------------------------------------------------------------------------
# End to end against the simulator
# ---------------------------------------------------------------------------------------------

def _statuses(rep: Report) -> dict[str, str]:
    return {c.name: c.status for c in rep.checks}


def test_cli_int8_mtp_passes_everything(tmp_path):
    key = "sk-rigfleet-test-4b1d"
    with sim_server(tmp_path, [*INT8_MTP, "--api-key", key]) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        # -S: no site-packages at all, as on a bare host running the zipapp.
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, "-S", "-m", "rigfleet.hostside.verify", "--url", url,
             "--api-key-file", "-", "--profile", "fast", "--report-dir", str(tmp_path / "r"),
             "--set", "soak_sessions=4"],
            input=key + "\n", capture_output=True, text=True, cwd=tmp_path, env=env,
            timeout=120)
        # The same server, spec_decode alone: too few drafts of its own, so it probes.
        rep, _ = run(url, resolve("fast"), api_key=key, only=["spec_decode"])
        srv.stop()
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "[ 1/11] preflight: Preflight ..." in err and "[10/11] spec_decode: PASS" in err
    assert "[11/11] throughput: PASS" in err and "not judged: no stack" in err
    assert "soak: PASS" in err and "........" in err
    reports = sorted((tmp_path / "r").iterdir())
    assert [p.suffix for p in reports] == [".json", ".md"]
    data = json.loads(reports[0].read_text())
    assert data["schema"] == "rigfleet-verify/1" and data["exit_status"] == 0
    assert data["model"] == "qwen3.6-27b-autoround" and data["version"] == "0.24.0"
    assert data["profile"]["overrides"] == {"soak_sessions": 4}
    assert {c["name"]: c["status"] for c in data["checks"]} == {
        n: "pass" for n in ("preflight", "needles", "tool_prefill", "ide_oneshot",
                            "agent_multiturn", "coding", "reasoning", "needles_deep", "soak",
                            "spec_decode", "throughput")}
    needles = next(c for c in data["checks"] if c["name"] == "needles")["details"]["attempts"]
    assert [a["depth_tokens"] for a in needles] == [8000, 12000]
    assert all(abs(a["prompt_tokens"] - a["depth_tokens"]) <= 0.02 * a["depth_tokens"]
               for a in needles)
    assert len({a["expected"] for a in needles}) == 2
    spec = next(c for c in data["checks"] if c["name"] == "spec_decode")["details"]
    # The gate's traffic is mostly prose (~2.65) with some code and tool calls (~3.5).
    assert spec["mean_acceptance_length"] > 2.5
    for text in (proc.stdout, proc.stderr, reports[0].read_text(), reports[1].read_text()):
        assert key not in text
    assert _statuses(rep) == {"preflight": PASS, "spec_decode": PASS}
    assert rep.checks[1].details["probed"] is True


def test_tq3_mtp_without_p67_fails_the_needles(tmp_path):
    with sim_server(tmp_path, TQ3_MTP, genesis_applied=GENESIS_WITHOUT_P67) as srv:
        rep, paths = run(f"http://127.0.0.1:{srv.port}", resolve("fast"),
                         report_dir=tmp_path / "r")
    st = _statuses(rep)
    assert st["needles"] == FAIL and st["needles_deep"] == FAIL
    # Short prompts stay healthy on this stack: that is what makes the bug silent.
    for name in ("preflight", "ide_oneshot", "agent_multiturn", "coding", "reasoning"):
        assert st[name] == PASS, (name, rep.checks)
    # The ~10K-token tool result collapses too (every reply goes through the detectors).
    assert st["tool_prefill"] == FAIL
    assert rep.exit_status() == len(rep.failed()) >= 2
    needles = next(c for c in rep.checks if c.name == "needles")
    assert {a["outcome"] for a in needles.details["attempts"]} <= {
        "recall_miss", "empty", "unhealthy"}
    assert {f.name for f in needles.findings} & {"recall_miss", "empty", "punctuation_flood",
                                                  "first_word_repetition"}
    md = paths[1].read_text()
    assert "### Needles (1) (`needles`)" in md and "### Deep needles (7) (`needles_deep`)" in md


def test_tq3_mtp_with_p67_passes(tmp_path):
    with sim_server(tmp_path, TQ3_MTP, genesis_applied=GENESIS_WITH_P67) as srv:
        rep, _ = run(f"http://127.0.0.1:{srv.port}", resolve("fast", ["soak_sessions=3"]))
    assert rep.exit_status() == 0, [(c.name, c.summary) for c in rep.failed()]
    assert set(_statuses(rep).values()) == {PASS}


def test_acceptance_collapse_build_fails_spec_decode_and_reasoning(tmp_path):
    with sim_server(tmp_path, INT8_MTP, **REGRESSED_BUILD) as srv:
        rep, _ = run(f"http://127.0.0.1:{srv.port}", resolve("fast", ["soak_sessions=3"]))
    assert {c.name for c in rep.failed()} == {"spec_decode", "reasoning"}
    assert rep.exit_status() == 2
    spec = next(c for c in rep.checks if c.name == "spec_decode")
    assert spec.details["mean_acceptance_length"] < 1.5
    assert [f.name for f in spec.findings] == ["low_acceptance"]
    reasoning = next(c for c in rep.checks if c.name == "reasoning")
    assert reasoning.details["completion_tokens"] < 500
    assert reasoning.findings[0].name == "too_few_tokens"
    assert rep.version == "0.20.2rc1.dev240+gb7e4d1c9a"


def test_deep_needles_over_max_model_len_skip(tmp_path):
    with sim_server(tmp_path, INT8_SHORT_NO_MTP) as srv:
        rep, _ = run(f"http://127.0.0.1:{srv.port}", resolve("fast", ["soak_sessions=3"]))
    st = _statuses(rep)
    assert st["needles_deep"] == SKIP and st["needles"] == PASS and st["tool_prefill"] == PASS
    deep = next(c for c in rep.checks if c.name == "needles_deep")
    assert [a["http_status"] for a in deep.details["attempts"]] == [400, 400]
    assert {a["outcome"] for a in deep.details["attempts"]} == {"skipped"}
    # No MTP: no spec-decode counters, nothing to judge.
    assert st["spec_decode"] == SKIP
    assert rep.max_model_len == 14000 and rep.exit_status() == 0


def test_engine_death_is_a_failure_not_a_skip(tmp_path):
    # The engine dies of OOM on prompts past 10K tokens: the 12K needle gets a 500 (or a
    # dropped connection), and everything after it finds the server gone.
    with sim_server(tmp_path, INT8_MTP, env={"SIM_FAULT_CRASH_PAST_TOKENS": "10000"}) as srv:
        rep, _ = run(f"http://127.0.0.1:{srv.port}", resolve("fast"),
                     only=["needles", "coding"])
    st = _statuses(rep)
    assert st == {"preflight": PASS, "needles": FAIL, "coding": FAIL}
    needles = next(c for c in rep.checks if c.name == "needles")
    outcomes = [a["outcome"] for a in needles.details["attempts"]]
    assert outcomes == ["recalled", "failed"]
    assert {f.name for f in needles.findings} <= {"server_error", "connection_error",
                                                  "stream_error"}
    coding = next(c for c in rep.checks if c.name == "coding")
    # A dead engine answers 500 until the process is gone, then connections are refused.
    assert coding.findings[0].name in ("server_error", "connection_error")
    assert rep.exit_status() == 2


def test_server_down_fails_preflight_and_skips_the_rest(tmp_path):
    rep, _ = run("http://127.0.0.1:9", resolve("fast", ["health_wait_s=0"]),
                 only=["needles", "soak"])
    assert [(c.name, c.status) for c in rep.checks] == [
        ("preflight", FAIL), ("needles", SKIP), ("soak", SKIP)]
    assert rep.exit_status() == 1


def test_cli_usage_errors_exit_101(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    base = [sys.executable, "-S", "-m", "rigfleet.hostside.verify", "--url", "http://127.0.0.1:9"]
    for extra, needle in ((["--set", "soak_sessions=0"], "soak_sessions"),
                          (["--only", "needles,bogus"], "bogus"),
                          (["--api-key-file", str(tmp_path / "missing")], "missing")):
        proc = subprocess.run(base + extra, capture_output=True, text=True, env=env, timeout=30)
        assert proc.returncode == 101 and needle in proc.stderr, proc.stderr
