"""Boot-failure classification on real log output, and the gate run as the swap runs it.

The logs come from the serving simulator's real failing boots (it prints vLLM's lines and
tracebacks) and from the Genesis fixture's real ``apply_all`` pin gate; the gate runs as a
child process (``python -m rigfleet.hostside.verify``) against simulator servers, exactly as
``rigfleet.hostside.gate.run_gate`` starts it on a host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from genesis_helpers import apply, genesis_site
from verify_sim import GENESIS_WITHOUT_P67, INT8_MTP, TQ3_MTP, sim_server
from vllm_sim_helpers import MTP, SimServer, make_gpu_root, make_model, make_package

from rigfleet.catalog import builtin_catalog
from rigfleet.hostside.gate import GateRun, run_gate
from rigfleet.hostside.stackctl import classify_boot_failure

REPO = Path(__file__).resolve().parents[2]
NO_MTP = [a for a in INT8_MTP if a not in ("--speculative-config", MTP)]


def failed_boot(tmp_path: Path, args: list[str], env=None, sub: str = "a", root=None,
                **pkg) -> str:
    site = make_package(tmp_path / sub, **pkg)
    srv = SimServer(site, root or make_gpu_root(tmp_path), make_model(tmp_path), args,
                    env=env or {})
    assert srv.wait_exit() == 1
    return srv.output()


def test_the_dying_nightly_is_named_by_its_transformers_oserror(tmp_path):
    log = failed_boot(tmp_path, INT8_MTP, version="0.20.2rc1.dev129+g1acd67a79",
                      commit="1acd67a795ebccdf9b9db7697ae9082058301657",
                      regressions=("speculators-local-path-oserror",))
    found = classify_boot_failure(log)
    assert found.kind == "transformers-oserror"
    assert found.line.startswith("OSError: Repo id must be in the form 'repo_name'")


def test_kv_cache_too_small_is_named_not_the_engine_wrapper(tmp_path):
    args = [*NO_MTP, "--tensor-parallel-size", "1", "--kv-cache-dtype", "auto"]
    log = failed_boot(tmp_path, args)
    assert "Engine core initialization failed" in log
    found = classify_boot_failure(log)
    assert found.kind == "kv-cache-too-small"
    assert "To serve at least one request with the model's max seq len (262144)" in found.line
    assert not found.line.startswith("ERROR")


def test_the_missing_marlin_fix_is_named_not_the_kernel_selection_line(tmp_path):
    # TP=2 on AutoRound INT4, a build before v0.21.0 without the pad fix (the simulator's
    # vllm_builds rule): vLLM's reason is the line after "... WNA16 linear layer. Reasons:".
    i = NO_MTP.index("--kv-cache-dtype")
    args = [*NO_MTP[:i], *NO_MTP[i + 2:], "--kv-cache-dtype", "fp8_e5m2"]
    log = failed_boot(tmp_path, args, tag="v0.20.0")
    # The signature is the model's and the image's, so the stack file carries it (boot.failures)
    spec = builtin_catalog().get("tq3-mtp-genesis")
    found = classify_boot_failure(log, [(b.kind, b.pattern, b.title, b.hint)
                                        for b in spec.boot_failures])
    assert found.kind == "marlin-min-thread-n", found
    assert found.line == ("MarlinLinearKernel cannot implement due to: GPTQ_MARLIN_MIN_THREAD_N "
                          "(64) > out_features (48)")
    assert "pin vllm/vllm-openai:v0.21.0 or newer" in str(found)
    # Without it, the reason line is still what is reported (the last exception line).
    assert classify_boot_failure(log).kind == "unknown"


def test_turboquant_without_genesis(tmp_path):
    # A build before hybrid TurboQuant (vllm#39931) without Genesis P4.
    old = "nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
    found = classify_boot_failure(failed_boot(tmp_path, TQ3_MTP, tag=old))
    assert found.kind == "turboquant-unsupported"


def test_out_of_gpu_memory_when_the_cards_are_still_busy(tmp_path):
    root = make_gpu_root(tmp_path)
    site = make_package(tmp_path / "holder")
    with SimServer(site, root, make_model(tmp_path), INT8_MTP) as first:
        first.wait_ready()
        log = failed_boot(tmp_path, INT8_MTP, sub="b", root=root)
    found = classify_boot_failure(log)
    assert found.kind == "gpu-memory-busy"
    assert "less than desired GPU memory utilization" in found.line


def test_cuda_oom_at_boot(tmp_path):
    log = failed_boot(tmp_path, INT8_MTP, env={
        "SIM_FAULT_CRASH_AT_BOOT": "torch.OutOfMemoryError: CUDA out of memory. Tried to "
                                   "allocate 2.00 GiB"})
    assert classify_boot_failure(log).kind == "cuda-oom"


def test_genesis_pin_gate_strict_failure_from_apply_all(tmp_path):
    # The real apply_all of the Genesis fixture (v7.72.2, strict policy) against a simulator
    # build it does not list: what the tq3 entrypoint prints before it exits 2.
    site = genesis_site(tmp_path, "v7", upto=0)
    rc, out = apply(site, "v7", {"GENESIS_VLLM_PIN_POLICY": "strict"})
    assert rc == 2, out
    found = classify_boot_failure(out)
    assert found.kind == "genesis-pin-gate"
    assert found.line.startswith("[Genesis pin-gate] STRICT FAIL: UNKNOWN")


@pytest.mark.parametrize(("line", "kind"), [
    ("Genesis Results: 37 applied, 2 skipped, 1 failed", "genesis-patch-failed"),
    ("rigfleet: Genesis patches missing: /usr/local/lib/python3.12/dist-packages/vllm/_genesis"
     "/patches/apply_all.py not found", "genesis-missing"),
    ("RuntimeError: No CUDA GPUs are available", "no-gpu"),
])
def test_other_known_lines(line, kind):
    assert classify_boot_failure(f"INFO starting\n{line}\n").kind == kind


def test_unknown_failures_report_the_last_exception_and_healthy_logs_nothing():
    log = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
           "ValueError: something new\n"
           "RuntimeError: Engine core initialization failed. See root cause above. "
           "Failed core proc(s): {}\n")
    found = classify_boot_failure(log)
    assert (found.kind, found.line) == ("unknown", "ValueError: something new")
    assert classify_boot_failure("Genesis Results: 38 applied, 6 skipped, 0 failed\n"
                                 "INFO:     Application startup complete.\n") is None


# --- the gate as the swap runs it -----------------------------------------------------------


def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-key"
    path.write_text("rf-test-key-0123456789\n")
    return path


def test_run_gate_passes_a_healthy_stack_and_reads_the_report(tmp_path):
    lines: list[str] = []
    with sim_server(tmp_path, INT8_MTP) as srv:
        result = run_gate(GateRun(f"http://127.0.0.1:{srv.port}", key_file(tmp_path),
                                  "fast", tmp_path / "reports", timeout_s=300), lines.append)
    assert result.result == "pass" and result.exit_status == 0, result.summary
    assert result.failed_checks == ()
    assert Path(result.report).exists() and Path(result.report_md).exists()
    assert any(line.startswith("verify: reports ") for line in lines)
    record = result.record()
    assert record["report"] == result.report and record["profile"] == "fast"


def test_run_gate_names_the_long_needles_of_tq3_without_p67(tmp_path):
    with sim_server(tmp_path, TQ3_MTP, genesis_applied=GENESIS_WITHOUT_P67) as srv:
        result = run_gate(GateRun(f"http://127.0.0.1:{srv.port}", key_file(tmp_path),
                                  "fast", tmp_path / "reports", timeout_s=300))
    assert result.result == "fail"
    assert {"needles", "needles_deep"} <= set(result.failed_checks)
    assert result.exit_status == len(result.failed_checks)


def test_run_gate_usage_errors_and_timeouts_are_errors_not_passes(tmp_path):
    bad = run_gate(GateRun("http://127.0.0.1:9", tmp_path / "missing-key", "fast",
                           tmp_path / "r"))
    assert bad.result == "error" and bad.exit_status == 101
    assert "cannot read --api-key-file" in bad.summary  # the gate's own words
    with sim_server(tmp_path, INT8_MTP, env={"SIM_FAULT_HANG": "1"}) as srv:
        slow = run_gate(GateRun(f"http://127.0.0.1:{srv.port}", key_file(tmp_path), "fast",
                                tmp_path / "r", timeout_s=2))
    assert slow.result == "error" and "timed out" in slow.summary
