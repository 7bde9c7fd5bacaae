"""The gate's throughput check: against the reference on a host's first gate, against its
verified history after that, CV and acceptance floors; what it records on the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fakes import Pace, PacedServer, expected_tok_s

from rigfleet.hostside.layout import Layout
from rigfleet.hostside.records import ThroughputRecord, read_json, read_throughput_history
from rigfleet.hostside.verify.profiles import ProfileError, resolve
from rigfleet.hostside.verify.runner import run

REPO = Path(__file__).resolve().parents[2]
FAST = Pace(step_rate=1000.0, prefill_s=0.001)


def gate(url: str, tmp: Path, *sets: str):
    prof = resolve("fast", ["throughput_runs=3", *sets])
    rep, paths = run(url, prof, only=["throughput"], report_dir=tmp / "reports")
    check = next(c for c in rep.checks if c.name == "throughput")
    return rep, check


def host_sets(tmp: Path, narrative: float, code: float, stack: str = "tq3-mtp-genesis",
              scale: float = 1.0, cv_max: float = 1.0, margin: float = 0.4) -> list[str]:
    """What a swap plan carries for the stack (rigfleet.desired.stack_gate_set). The CV
    bound is off (1.0) and the margin wide (0.4) unless a test is about them: runs of a
    fraction of a second on a test machine shared with other tests pick up scheduling noise
    (benchmarks/bench_overhead.py); the slow cases below are far slower than that."""
    return [f"throughput_stack={stack}", f"throughput_history_dir={Layout(tmp).throughput_dir}",
            f"throughput_scale={scale:g}", f"throughput_reference_narrative={narrative:g}",
            f"throughput_reference_code={code:g}", f"throughput_margin={margin:g}",
            f"throughput_cv_max={cv_max:g}", "throughput_acceptance_floor=0.76,0.672,0.6"]


def test_first_gate_against_the_reference_then_against_the_history(tmp_path):
    lay = Layout(tmp_path)
    n, c = expected_tok_s(FAST, "narrative"), expected_tok_s(FAST, "code")
    with PacedServer(FAST) as srv:
        # The stack file's reference (x scale 40) is 2.5x what this host does: a host slow
        # on its first gate is flagged, and its figures are not history.
        rep, check = gate(srv.url, tmp_path, *host_sets(tmp_path, n / 40 * 2.5, c / 40 * 2.5,
                                                        scale=40))
        assert check.status == "fail" and rep.exit_status() == 1
        assert {f.name for f in check.findings} == {"slow_decode"}
        assert "reference" in check.findings[0].message and "x 40" in check.findings[0].message
        assert read_throughput_history(lay.throughput_history) == []
        last = ThroughputRecord.from_dict(read_json(lay.throughput_last)[0])
        assert last is not None and last.result == "fail" and last.stack == "tq3-mtp-genesis"
        assert last.scale == 40 and last.report and last.report.endswith(".json")
        # A healthy host: the reference matches, the gate passes and the figures are history;
        # the history is the baseline once it holds three gates.
        for i in range(3):
            rep, check = gate(srv.url, tmp_path, *host_sets(tmp_path, n, c))
            assert check.status == "pass", check.summary
            # before three gates: the reference (0, 1 and 2 records of history)
            assert check.details["baseline"]["source"]["narrative"].startswith(
                "reference"), (i, check.details["baseline"])
        history = read_throughput_history(lay.throughput_history, "tq3-mtp-genesis")
        assert len(history) == 3 and history[0].source == "gate"
        assert history[0].decode("narrative") == pytest.approx(n, rel=0.08)
        assert history[0].acceptance == pytest.approx((0.95, 0.84, 0.75), abs=0.08)
    # The same stack on a slower image: judged against the history, not the reference (which
    # it would still pass).
    with PacedServer(Pace(step_rate=400.0, prefill_s=0.001)) as slow:
        rep, check = gate(slow.url, tmp_path, *host_sets(tmp_path, n * 0.5, c * 0.5))
    assert check.status == "fail" and "history: median of 3" in check.findings[0].message
    assert len(read_throughput_history(lay.throughput_history)) == 3


def test_unstable_decode_and_low_acceptance_fail(tmp_path):
    unstable = Pace(step_rate=1000.0, prefill_s=0.001, speeds=(1.0, 1.3, 0.75, 1.25, 0.7))
    with PacedServer(unstable) as srv:
        _, check = gate(srv.url, tmp_path, "throughput_runs=5",
                        *host_sets(tmp_path, 1.0, 1.0, cv_max=0.1))
    assert "unstable_decode" in {f.name for f in check.findings}
    assert check.details["shapes"]["narrative"]["decode_cv"] > 0.10
    drafter = Pace(step_rate=1000.0, prefill_s=0.001, code=(0.6, 0.4, 0.2))
    with PacedServer(drafter) as srv:
        _, check = gate(srv.url, tmp_path, *host_sets(tmp_path, 1.0, 1.0))
    assert [f.name for f in check.findings] == ["low_acceptance"] * 3


def test_not_judged_without_a_stack_and_unknown_acceptance_is_not_zero(tmp_path):
    with PacedServer(Pace(step_rate=1000.0, prefill_s=0.001, metrics=False)) as srv:
        rep, check = gate(srv.url, tmp_path)
    assert check.status == "pass" and "not judged" in check.summary
    assert "acceptance unknown" in check.summary
    assert check.details["shapes"]["code"]["acceptance"] is None
    # Nothing is written without a stack and a history directory.
    assert not Layout(tmp_path).throughput_dir.exists()


def test_a_record_that_cannot_be_written_is_a_note_not_a_failure(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with PacedServer(FAST) as srv:
        sets = [s for s in host_sets(tmp_path, 1.0, 1.0) if "history_dir" not in s]
        rep, check = gate(srv.url, tmp_path, *sets, f"throughput_history_dir={blocker}/sub")
    assert check.status == "pass" and rep.exit_status() == 0


def test_profile_keys_parse_and_refuse_bad_values():
    prof = resolve("full", ["throughput_stack=int8", "throughput_acceptance_floor=0.75,0.66",
                            "throughput_scale=40", "throughput_reference_code=0"])
    assert prof.throughput_stack == "int8" and prof.throughput_acceptance_floor == (0.75, 0.66)
    assert prof.throughput_scale == 40.0 and prof.throughput_reference_code == 0.0
    assert resolve("full").throughput_runs == 5 and resolve("full").throughput_warmup == 3
    for bad, allowed in (("throughput_margin=1.5", "above 0 and at most 1"),
                         ("throughput_acceptance_floor=0.9,x", "comma-separated numbers"),
                         ("throughput_scale=0", "> 0"),
                         ("throughput_stack=a\x07b", "without control characters")):
        with pytest.raises(ProfileError, match=allowed):
            resolve("fast", [bad])


def test_the_gate_cli_records_on_the_host(tmp_path):
    lay = Layout(tmp_path)
    n, c = expected_tok_s(FAST, "narrative"), expected_tok_s(FAST, "code")
    with PacedServer(FAST) as srv:
        sets = [x for s in ["throughput_runs=3", *host_sets(tmp_path, n, c)] for x in ("--set", s)]
        proc = subprocess.run(
            [sys.executable, "-S", "-m", "rigfleet.hostside.verify", "--url", srv.url,
             "--profile", "fast", "--only", "throughput", "--report-dir",
             str(tmp_path / "r"), *sets], capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert "[ 2/2] throughput: PASS" in proc.stderr and "verify: reports " in proc.stderr
    assert "throughput recorded in" in proc.stderr
    report = json.loads(next((tmp_path / "r").glob("*.json")).read_text())
    assert report["checks"][1]["details"]["stack"] == "tq3-mtp-genesis"
    [h] = read_throughput_history(lay.throughput_history)
    assert h.report and Path(h.report).parent == tmp_path / "r"


def test_runs_that_fail_fail_the_gate_even_when_one_run_measured(tmp_path):
    """The gate-wide rule (5xx, connection errors, timeouts fail) holds for the throughput
    runs too: with 2 of 3 narrative runs answered 503 the shape passed on its one good run
    (no CV of one value, the decode on target), stack or no stack."""
    with PacedServer(FAST) as srv:
        paced, seen = srv.chat, []

        def flaky(h, data, text, prompt):
            if data.get("max_tokens") == 1000 and len(seen) < 2:  # narrative, not a warm-up
                seen.append(1)
                h._json(503, {"error": {"message": "engine overloaded"}})
                return
            paced(h, data, text, prompt)

        srv.chat = flaky  # type: ignore[method-assign]
        n, c = expected_tok_s(FAST, "narrative"), expected_tok_s(FAST, "code")
        for sets in (host_sets(tmp_path, n, c), []):
            seen.clear()
            rep, check = gate(srv.url, tmp_path, *sets)
            assert check.status == "fail" and rep.exit_status() == 1, check.summary
            assert [f.name for f in check.findings] == ["failed_runs"]
            msg = check.findings[0].message
            assert "narrative: 2/3 runs" in msg and "HTTP 503: engine overloaded" in msg
            assert check.details["shapes"]["narrative"]["decode_mean"]
    assert read_throughput_history(Layout(tmp_path).throughput_history) == []


def test_floors_left_unchecked_for_want_of_per_position_counters_say_so(tmp_path):
    """A vLLM with spec-decode counters but none per draft position: the acceptance floors are
    not judged (unknown is not 0), and the report says so as it does without /metrics; it
    said nothing, and the summary read "acceptance  (AL 2.53)"."""
    with PacedServer(FAST) as srv:
        full = srv.render_metrics

        def no_positions() -> str:
            return "".join(ln + "\n" for ln in full().splitlines() if "per_pos" not in ln)

        srv.render_metrics = no_positions  # type: ignore[method-assign]
        n, c = expected_tok_s(FAST, "narrative"), expected_tok_s(FAST, "code")
        rep, check = gate(srv.url, tmp_path, *host_sets(tmp_path, n, c))
    assert check.status == "pass", check.summary
    assert check.details["acceptance_note"] == (
        "floors not checked: no per-position acceptance in /metrics")
    assert "acceptance  (" not in check.summary and "acceptance AL " in check.summary
