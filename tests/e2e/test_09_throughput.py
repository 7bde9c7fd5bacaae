"""Issue 12 on the simulated fleet: throughput measured, gated on, and explained.

The twin's engine paces tokens by the clock at speeds that follow the simulated card's power
cap, PCIe link, graph mode and build (``sim_speedup`` x the real-rig figures), so these tests
measure the real product against a stand-in that is slow for the reasons a rig is slow:

1. ``rigfleet bench --url`` against a host's front prints figures with a progress bar and
   writes JSON, Markdown and a PNG plot; against a foreign OpenAI-compatible server without
   ``/metrics`` and ``/tokenize`` (a stub here) acceptance is reported ``unknown``, never 0;
2. on one fleet host, a user's stack file ``int8-edge`` (int8 allowing nightlies: the built-in
   int8 refuses them) pinned to the nightly that only slows decode by 30%: the gate fails on
   throughput alone and the host is rolled back to int8; the nightly with an unstable decode
   speed fails on its CV; the unchanged release passes five throughput gates in a row, its
   baseline moving from the stack file's reference to its own verified history;
3. ``rigfleet doctor``: the single-card host with its cap at the card's minimum names the cap
   first, with the figures; a dual-card host at 250 W is not blamed on its cap;
4. tq3-nomtp and turbo serve on a two-card host through the gate; the host goes back to int8.

Everything works on copies (inventory, pins, stack file) under the testbed's state directory,
and puts caps back by hand: the fleet is left on the inventory's stacks and pins.

    RIGFLEET_TESTBED_INSTANCE=6 RIGFLEET_TESTBED_HOSTS=1 RIGFLEET_TESTBED_EXTRAS=0 \
        RIGFLEET_KEEP_TESTBED=1 .venv/bin/python -m pytest tests/e2e/test_09_throughput.py -x -v
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_fleet import INVENTORY, REPO, STATE, last_ledger, run
from e2e_fleet import read_state as state
from rigfleet_testbed import layout
from rigfleet_testbed.fleet import TESTBED_CV_MAX

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
RIGFLEET = str(Path(sys.executable).with_name("rigfleet"))
API_KEY_FILE = STATE / "secrets" / "api-key"
WORK = STATE / "e2e-throughput"
# pyinfra reads group_data/ next to the inventory file: the copy sits beside the original.
EDGE_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-throughput.py")
EDGE_PINS = WORK / "pins.yaml"
EDGE = "int8-edge"
SLOWER = "nightly-f090c883507d730ae76900d4ae60b673430b4bbf"  # decode x0.70 (vllm_builds)
UNSTABLE = "nightly-90af5e72337defb8797b5f3e486906bb1411b336"  # per-request jitter, CV ~15%
REGISTRY = f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}"


def rigfleet(*args: str, check: bool = False, timeout: float = 600):
    proc = run([RIGFLEET, *args], check=check, timeout=timeout,
               env={**os.environ, "COLUMNS": "200"})
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    return proc


def deploy(inventory: Path, host, *args: str, check: bool = True):
    return run([PYINFRA, str(inventory), "deploy.py", "-y", "--limit", host.name, *args],
               check=check, timeout=900)


def gate_report(host, line: dict) -> str:
    """The gate's Markdown report of a ledger line (the deploy copies it to reports/)."""
    return (REPO / "reports" / host.name / Path(line["gate"]["report_md"]).name).read_text()


def caps(host) -> list[str]:
    rc, out = host.sh("nvidia-smi --query-gpu=power.limit --format=csv,noheader,nounits")
    assert rc == 0, out
    return [v.strip() for v in out.split()]


# --- a foreign OpenAI-compatible server: chat only, no /metrics, no /tokenize -------------------


class ChatOnlyServer:
    """Streams ``max_tokens`` one-word tokens at ``tok_s``; answers 404 to everything but
    ``/v1/models`` and ``/v1/chat/completions`` (a server behind a front that hides the rest,
    or a non-vLLM engine). ``usage`` counts prompt tokens as words, as a tokenizer would count
    something."""

    def __init__(self, tok_s: float = 4000.0) -> None:
        delay = 1.0 / tok_s

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": "foreign-model", "object": "model"}]}).encode())
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self) -> None:
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions":
                    self._send(404, b'{"error": "not found"}')
                    return
                prompt = sum(len(str(m.get("content", "")).split()) for m in data["messages"])
                n = int(data.get("max_tokens") or 16)
                usage = {"prompt_tokens": prompt, "completion_tokens": n,
                         "total_tokens": prompt + n}
                if not data.get("stream"):
                    self._send(200, json.dumps({"choices": [{
                        "index": 0, "finish_reason": "length",
                        "message": {"role": "assistant", "content": "word " * n}}],
                        "usage": usage}).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                start = time.monotonic()
                for i in range(n):
                    wait = start + (i + 1) * delay - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    chunk = {"choices": [{"index": 0, "delta": {"content": "word "},
                                          "finish_reason": "length" if i == n - 1 else None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                                 "data: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ChatOnlyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --- fixtures -----------------------------------------------------------------------------------


def pin_edge(tag: str) -> str:
    """``int8-edge`` next to the inventory copy (its ``stacks_dir``): the built-in int8 with
    nightlies allowed, pinned in the copy of the pins to ``tag`` (digest from the registry's
    manifest, version from the build, as ``rigfleet pins lock`` would). Returns the digest."""
    from rigfleet_testbed import vllm_builds

    from rigfleet.catalog import BUILTIN_DIR
    from rigfleet.registry import Registry

    doc = yaml.safe_load((BUILTIN_DIR / "int8.yaml").read_text())
    doc.update(name=EDGE, port=8021, summary="int8 on nightlies (a user's canary stack)")
    doc["image"] = {"kinds": ["release", "nightly"], "min_version": "0.22.0"}
    (WORK / "stacks").mkdir(parents=True, exist_ok=True)
    (WORK / "stacks" / f"{EDGE}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    digest = Registry(REGISTRY).digest("vllm/vllm-openai", tag)
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    pins["stacks"][EDGE] = {"image": f"vllm/vllm-openai:{tag}", "digest": digest,
                            "vllm_version": vllm_builds.by_tag(tag).version}
    EDGE_PINS.write_text(yaml.safe_dump(pins, sort_keys=False))
    return digest


@pytest.fixture(scope="module")
def edge(testbed, converged):
    """The inventory copy (int8-edge in its ``stacks_dir``, its own pins file); removed, and
    the host's staged copy of int8-edge with it, by a converge of the real inventory."""
    WORK.mkdir(parents=True, exist_ok=True)
    EDGE_INVENTORY.write_text(
        f'''"""Testbed {layout.INSTANCE} for tests/e2e/test_09_throughput.py."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
gpu_hosts = (_hosts, {{**_data, "pins_file": {str(EDGE_PINS)!r},
                       "stacks_dir": {str(WORK / "stacks")!r}}})
''')
    yield testbed
    host = testbed.fleet[0]
    if state(host).get("stack") != "int8":  # a test failed before putting it back
        deploy(INVENTORY, host, check=False)
    # What staging int8-edge left on the canary (a converge never removes a stack it no longer
    # stages): its compose directory, its cache, and the nightlies it pulled.
    images = " ".join(f"vllm/vllm-openai:{t}" for t in (SLOWER, UNSTABLE))
    host.sh(f"rm -rf /opt/rigfleet/stacks/{EDGE} /var/cache/rigfleet/{EDGE}; "
            f"docker image rm {images} >/dev/null 2>&1; true")
    EDGE_INVENTORY.unlink(missing_ok=True)


# --- 1. rigfleet bench --------------------------------------------------------------------------


def test_bench_a_host_front_prints_figures_and_writes_json_markdown_and_png(testbed, converged,
                                                                           tmp_path):
    host = testbed.fleet[0]
    proc = rigfleet("bench", "--url", host.front_url, "--api-key-file", str(API_KEY_FILE),
                    "--stack", "int8", "--scale", "40", "--runs", "3", "--warmup", "1",
                    "--depths", "16000", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rigfleet bench: decode tok/s" in proc.stdout and "int8" in proc.stdout
    # The progress bar's last state: every request of the plan done (2 x (1 + 3) + 2 + 1).
    assert "11/11" in proc.stderr, proc.stderr[-2000:]
    assert "2 streams:" in proc.stdout and "depth: 16K" in proc.stdout
    reports = {p.suffix: p for p in tmp_path.iterdir()}
    data = json.loads(reports[".json"].read_text())
    assert data["schema"] == "rigfleet-bench/1"
    (entry,) = data["entries"]
    bench = entry["bench"]
    assert entry["stack"] == "int8" and entry["reference"]["narrative"] == pytest.approx(5232)
    narrative = bench["shapes"]["narrative"]
    # Paced at 130.8 tok/s x 40 on a release: within the gate's margin of the reference.
    assert 0.85 * 5232 < narrative["decode_mean"] < 1.15 * 5232, narrative
    acc = bench["shapes"]["code"]["acceptance"]
    assert acc and len(acc["per_position"]) == 3 and all(0 < x < 1 for x in acc["per_position"])
    assert bench["concurrency"]["streams"] == 2
    assert bench["depths"][0]["prompt_tokens"] >= 15000 and bench["depths"][0]["run"]
    md = reports[".md"].read_text()
    assert "| narrative |" in md and "Concurrency: 2 streams" in md
    if importlib.util.find_spec("matplotlib") is None:  # the optional extra rigfleet[plot]
        assert "no PNG: matplotlib is not installed" in " ".join(proc.stderr.split())
        assert sorted(reports) == [".json", ".md"], reports
        pytest.skip("the PNG needs matplotlib (pip install 'rigfleet[plot]'); JSON and "
                    "Markdown checked")
    assert sorted(reports) == [".json", ".md", ".png"], reports
    assert reports[".png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_without_metrics_or_tokenize_reports_acceptance_unknown(tmp_path):
    with ChatOnlyServer(tok_s=4000) as srv:
        proc = rigfleet("bench", "--url", srv.url, "--runs", "2", "--warmup", "1",
                        "--depths", "2000", "--no-plot", "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = json.loads(proc.stdout)["entries"][0]
    for shape in ("narrative", "code"):
        s = entry["bench"]["shapes"][shape]
        assert s["acceptance"] is None, s  # unknown, not 0
        assert s["acceptance_note"] == "unknown: no /metrics"
        assert 2000 < s["decode_mean"] < 6000  # it still measured the decode speed
    assert "/tokenize unavailable; counting with 1-token completions" in entry["bench"]["notes"]
    depth = entry["bench"]["depths"][0]
    assert depth["prompt_tokens"] and abs(depth["prompt_tokens"] - 2000) < 200, depth
    # The human report says "unknown" too.
    md = next(tmp_path.glob("*.md")).read_text()
    assert "| unknown: no /metrics |" in md


# --- 2. the throughput gate ---------------------------------------------------------------------


def swap_to_edge(host) -> dict:
    proc = deploy(EDGE_INVENTORY, host, "--data", f"stack={EDGE}", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"swap to {EDGE} rolled back (gate failed)" in out, out[-3000:]
    line = last_ledger(host)
    assert (line["result"], line["stack"], line["attempted"]["stack"]) == (
        "rolled-back", "int8", EDGE)
    # Throughput is the only check that failed: every correctness check passed this build.
    assert line["gate"]["failed_checks"] == ["throughput"], line["gate"]
    return line


def test_a_nightly_that_only_slows_decode_fails_the_gate_on_throughput_and_rolls_back(edge):
    host = edge.fleet[0]
    before = state(host)
    pin_edge(SLOWER)
    line = swap_to_edge(host)
    summary = line["gate"]["summary"]
    # A first gate of the stack on this host: judged against the stack file's reference.
    assert "narrative: decode" in summary and "below the baseline 5232.0 (reference 130.8 x 40)" \
        in summary, summary
    assert "slow_decode" in gate_report(host, line)
    after = state(host)
    assert (after["stack"], after["digest"]) == (before["stack"], before["digest"])
    assert after["last_swap"]["result"] == "rolled-back"


def test_a_nightly_with_unstable_decode_fails_the_gate_on_its_cv(edge):
    host = edge.fleet[0]
    pin_edge(UNSTABLE)
    line = swap_to_edge(host)
    summary = line["gate"]["summary"]
    # The testbed's bound (its inventory's gate_set: the shared machine's own noise is below).
    assert "decode CV" in summary and f"is above {TESTBED_CV_MAX:.0%}" in summary, summary
    assert "unstable_decode" in gate_report(host, line)
    assert state(host)["stack"] == "int8"


def test_an_unchanged_image_passes_five_gates_in_a_row(edge, tmp_path):
    """Five gates' throughput checks against the host's int8 (the image it serves), with the
    stack's settings as a swap plans them and a history of its own: the first three are
    judged against the reference, the next ones against their own verified history."""
    from rigfleet.catalog import builtin_catalog

    host = edge.fleet[0]
    spec = builtin_catalog().get("int8")
    history = tmp_path / "throughput"
    settings = [f"throughput_stack={spec.name}", f"throughput_history_dir={history}",
                "throughput_scale=40", *spec.throughput.gate_set(),
                f"throughput_cv_max={TESTBED_CV_MAX:g}"]  # as the testbed inventory sets it
    sources = []
    for i in range(5):
        proc = rigfleet("verify", "--url", host.front_url, "--api-key-file", str(API_KEY_FILE),
                        "--profile", "fast", "--only", "throughput",
                        "--report-dir", str(tmp_path / f"gate{i}"), "--set", *settings)
        assert proc.returncode == 0, f"gate {i + 1} of 5 failed:\n{proc.stderr[-3000:]}"
        (report,) = (tmp_path / f"gate{i}").glob("verify-*.json")
        check = next(c for c in json.loads(report.read_text())["checks"]
                     if c["name"] == "throughput")
        assert check["details"]["judged"]
        sources.append(check["details"]["baseline"]["source"]["narrative"])
    assert sources[:3] == ["reference 130.8 x 40"] * 3  # no baseline from one or two gates
    assert sources[3:] == [f"history: median of {n} verified gate(s)" for n in (3, 4)]
    lines = (history / "history.jsonl").read_text().splitlines()
    assert len(lines) == 5 and all(json.loads(x)["result"] == "pass" for x in lines)


# --- 3. rigfleet doctor ---------------------------------------------------------------------------

DUAL_CAP_W = 250  # inside 220-330 W, where two cards' decode is flat (bandwidth-bound)


def set_caps(host, watts: list[str]) -> None:
    """``nvidia-smi -i N -pl W`` per card, as an operator trying a cap would."""
    for i, w in enumerate(watts):
        rc, out = host.sh(f"nvidia-smi -i {i} -pl {float(w):g}")
        assert rc == 0, out


@pytest.fixture(scope="module")
def doctored(testbed, converged):
    """One doctor run over the first fleet host at 250 W per card and, with the extras, the
    single-card host at its card's minimum cap; the caps are put back afterwards."""
    dual, single = testbed.fleet[0], testbed.single
    hosts = [h for h in (dual, single) if h is not None]
    before = {h.name: caps(h) for h in hosts}
    minimum = None
    try:
        set_caps(dual, [str(DUAL_CAP_W)] * len(before[dual.name]))
        if single is not None:
            rc, out = single.sh("nvidia-smi --query-gpu=power.min_limit "
                                "--format=csv,noheader,nounits")
            assert rc == 0, out
            minimum = float(out.split()[0])
            set_caps(single, [f"{minimum:g}"])
        proc = rigfleet("doctor", "--inventory", str(INVENTORY), "--load-s", "10", "--json",
                        *(a for h in hosts for a in ("--limit", h.name)))
    finally:
        for h in hosts:
            set_caps(h, before[h.name])
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a host is slow
    found = {d["host"]: d for d in json.loads(proc.stdout)["hosts"]}
    return found, minimum


def causes(diagnosis: dict, kind: str = "cause") -> list[dict]:
    return [c for c in diagnosis["causes"] if c["kind"] == kind]


def test_doctor_does_not_blame_a_dual_card_cap_between_220_and_330_w(testbed, doctored):
    found, _ = doctored
    d = found[testbed.fleet[0].name]
    assert d["error"] is None and not d["verdict"]["slow"], d["verdict"]
    assert all(c["id"] != "power-cap" for c in causes(d)), d["causes"]
    (cleared,) = [c for c in causes(d, "ruled-out") if c["id"] == "power-cap"]
    assert f"{DUAL_CAP_W} W" in cleared["title"] and "flat" in " ".join(cleared["evidence"])
    assert all(card["power_limit_w"] == DUAL_CAP_W for card in d["cards"]), d["cards"]


def test_doctor_names_a_single_cards_minimum_cap_first_with_the_figures(testbed, doctored):
    if testbed.single is None:
        pytest.skip("needs the single-card host (RIGFLEET_TESTBED_EXTRAS=1)")
    found, minimum = doctored
    d = found[testbed.single.name]
    v = d["verdict"]
    assert d["error"] is None and v["slow"], v
    assert v["now"] < 0.85 * v["baseline"], v  # the figures that make it slow
    top = causes(d)[0]
    assert top["id"] == "power-cap", d["causes"]
    assert top["title"].startswith(f"power cap {minimum:.0f} W binds"), top
    assert f"cap {minimum:.0f} W, drawing up to" in top["evidence"][0], top
    assert top["impact"] > 0.3 and "raise power_caps_w" in top["fix"], top
    # The one-card stack's fp8 KV (FlashInfer) falls back to PIECEWISE graphs with MTP: named
    # by the engine's own log line, not by a guess from the captures.
    (graphs,) = [c for c in causes(d) if c["id"] == "cuda-graphs"]
    assert graphs["title"] == "CUDA graphs downgraded to PIECEWISE", graphs
    assert graphs["evidence"][0].startswith("WARNING ") and "PIECEWISE" in graphs["evidence"][0]


# --- 4. the seeds' other dual-card stacks ---------------------------------------------------------


@pytest.mark.parametrize("stack", ["tq3-nomtp", "turbo"])
def test_tq3_nomtp_and_turbo_serve_on_a_two_card_host_through_the_gate(edge, stack):
    host = edge.fleet[0]
    proc = deploy(INVENTORY, host, "--data", f"stack={stack}")
    out = proc.stdout + proc.stderr
    assert "swap gate: pass" in out and "swap promote:" in out, out[-3000:]
    line = last_ledger(host)
    assert (line["result"], line["stack"]) == ("promoted", stack)
    assert state(host)["stack"] == stack
    report = gate_report(host, line)
    assert "verify-stress gate: PASS" in report and "Throughput" in report, report[-2000:]


def test_back_on_int8(edge):
    host = edge.fleet[0]
    proc = deploy(INVENTORY, host)
    assert "swap promote:" in proc.stdout + proc.stderr
    assert state(host)["stack"] == "int8"
