"""The throughput baseline (history, accepted baselines, the reference x scale) and the
judgement: margin, CV bound, per-position acceptance floors (the seeds' figures)."""

from __future__ import annotations

import pytest

from rigfleet.catalog import ThroughputSpec
from rigfleet.hostside.bench.baseline import Limits, baseline_for, judge, since_accepted
from rigfleet.hostside.records import (
    SOURCE_ACCEPTED,
    ShapeFigures,
    ThroughputRecord,
    read_throughput_history,
)

SEED_000_REF = {"narrative": 89.2, "code": 119.1}
SEED_004_REF = {"narrative": 66.0, "code": 84.0}


def rec(stack: str, narrative: float, code: float | None = None, source: str = "gate",
        at: str = "2026-12-01T10:00:00Z") -> ThroughputRecord:
    shapes = {"narrative": ShapeFigures(narrative, 0.02, runs=5)}
    if code is not None:
        shapes["code"] = ShapeFigures(code, 0.01, runs=5)
    return ThroughputRecord(stack, at, source=source, shapes=shapes)


def figs(decode: float, cv: float | None = 0.02) -> ShapeFigures:
    return ShapeFigures(decode, cv, runs=5)


def test_without_history_the_reference_times_the_scale_is_the_baseline():
    base = baseline_for([], "tq3-mtp-genesis", SEED_000_REF, scale=40.0, n=5)
    assert base.figures == pytest.approx({"narrative": 3568.0, "code": 4764.0})
    assert base.sources["narrative"] == "reference 89.2 x 40"
    assert baseline_for([], "x", {"narrative": 67.0, "code": 0.0}, 1.0, 5).figures == {
        "narrative": 67.0}


def test_history_median_over_the_last_n_of_the_same_stack():
    history = [rec("int8", 200.0), rec("int8", 120.0, 170.0), rec("tq3-mtp-genesis", 10.0),
               rec("int8", 130.0, 175.0), rec("int8", 128.0, 172.0)]
    base = baseline_for(history, "int8", {"narrative": 130.8}, 1.0, n=3)
    assert base.figures["narrative"] == 128.0  # median of 120, 130, 128 (200 is out of the 3)
    assert base.figures["code"] == 172.0
    assert "median of 3 verified gate(s)" in base.sources["narrative"]



def test_one_or_two_gates_are_not_yet_a_baseline():
    # A busy machine's first gate (6048.5) must not make the next one (4966.7, 18% below it
    # and 5% below the reference) fail: until three gates the reference is the baseline.
    ref = {"narrative": 130.8}
    for n_gates in (1, 2):
        history = [rec("int8", 6048.5, 7000.0)] * n_gates
        base = baseline_for(history, "int8", ref, 40.0, 5)
        assert base.figures == {"narrative": pytest.approx(5232.0)}  # no code reference
        assert base.sources == {"narrative": "reference 130.8 x 40"}
        assert judge({"narrative": figs(4966.7)}, None, base, Limits()) == []
    base = baseline_for([rec("int8", 6048.5, 7000.0)] * 3, "int8", ref, 40.0, 5)
    assert base.figures == {"narrative": 6048.5, "code": 7000.0}
    assert base.sources["code"] == "history: median of 3 verified gate(s)"
    # min_records above n is capped at n; min_records=1 is the old rule
    assert baseline_for([rec("int8", 100.0)] * 2, "int8", ref, 1.0, 2,
                        min_records=9).figures == {"narrative": 100.0}
    assert baseline_for([rec("int8", 100.0)], "int8", ref, 1.0, 5,
                        min_records=1).figures == {"narrative": 100.0}


def test_an_accepted_baseline_counts_at_once():
    history = [rec("single-fp8-mtp", 60.0), rec("single-fp8-mtp", 44.0, 55.0,
                                                 source=SOURCE_ACCEPTED)]
    base = baseline_for(history, "single-fp8-mtp", SEED_004_REF, 1.0, 5)
    assert base.figures == {"narrative": 44.0, "code": 55.0}
    assert "since the accepted baseline" in base.sources["code"]

def test_an_accepted_baseline_restarts_the_history():
    history = [rec("single-fp8-mtp", 60.0), rec("single-fp8-mtp", 62.0),
               rec("single-fp8-mtp", 44.0, 55.0, source=SOURCE_ACCEPTED),
               rec("single-fp8-mtp", 45.0, 56.0)]
    assert [r.decode("narrative") for r in since_accepted(history, "single-fp8-mtp")] == [
        44.0, 45.0]
    base = baseline_for(history, "single-fp8-mtp", SEED_004_REF, 1.0, 5)
    assert base.figures["narrative"] == pytest.approx(44.5)
    assert "since the accepted baseline" in base.sources["narrative"]


def test_seed_004_slow_first_run_is_flagged_not_recorded_as_normal():
    # 43 narrative / 54 code at 330 W against the 66/84 the reference setup claims.
    base = baseline_for([], "single-fp8-mtp", SEED_004_REF, 1.0, 5)
    found = judge({"narrative": figs(43.0), "code": figs(54.0)}, (0.93, 0.866, 0.739), base,
                  Limits(0.15, 0.10, ThroughputSpec(acceptance=(0.95, 0.84, 0.75)).floors))
    assert [f.name for f in found] == ["slow_decode", "slow_decode"]
    assert "35% below the baseline 66.0" in found[0].message


def test_within_the_margin_passes_and_the_230w_cap_fails_against_history():
    history = [rec("single-fp8-mtp", 43.0, 54.0, source=SOURCE_ACCEPTED)]
    base = baseline_for(history, "single-fp8-mtp", SEED_004_REF, 1.0, 5)
    assert judge({"narrative": figs(40.0), "code": figs(50.0)}, None, base, Limits()) == []
    # seed 004 at 230 W: ~33 / ~40.
    found = judge({"narrative": figs(33.0), "code": figs(40.0)}, None, base, Limits())
    assert {f.where for f in found if f.name == "slow_decode"} == {"narrative", "code"}


def test_cv_bound_flags_the_broken_path_not_the_healthy_one():
    base = baseline_for([], "tq3-mtp-genesis", SEED_000_REF, 1.0, 5)
    healthy = judge({"narrative": figs(89.2, 0.04), "code": figs(119.1, 0.01)}, None, base,
                    Limits())
    broken = judge({"narrative": figs(98.7, 0.36), "code": figs(104.5, 0.27)}, None, base,
                   Limits())
    assert healthy == []
    assert [f.name for f in broken] == ["unstable_decode", "unstable_decode"]
    assert "36.0%" in broken[0].message


def test_acceptance_floors_derived_from_seed_000_pass_seed_004_figures():
    floors = ThroughputSpec(acceptance=(0.95, 0.84, 0.75)).floors
    assert floors == pytest.approx((0.76, 0.672, 0.6))
    base = baseline_for([], "s", {}, 1.0, 5)
    for measured in ((0.92, 0.81, 0.64), (0.93, 0.866, 0.739), (0.95, 0.84, 0.75)):
        assert judge({}, measured, base, Limits(acceptance_floor=floors)) == []
    low = judge({}, (0.95, 0.60, 0.40), base, Limits(acceptance_floor=floors))
    assert [f.where for f in low] == ["position 2", "position 3"]
    # Unknown acceptance (no /metrics) is not judged.
    assert judge({}, None, base, Limits(acceptance_floor=floors)) == []


def test_a_floor_without_its_draft_position_in_metrics_fails():
    """/metrics showing fewer draft positions than the stack has floors (a server drafting 2
    tokens for a stack of 3) skipped the last floors silently and the gate passed."""
    floors = (0.76, 0.672, 0.6)
    base = baseline_for([], "s", {}, 1.0, 5)
    found = judge({}, (0.92, 0.81), base, Limits(acceptance_floor=floors))
    assert [(f.name, f.where) for f in found] == [("missing_acceptance", "position 3")]
    assert "shows 2 position(s)" in found[0].message and "floor 60%" in found[0].message
    # No per-position counters at all is unknown, as before.
    assert judge({}, (), base, Limits(acceptance_floor=floors)) == []


def test_no_measurement_fails():
    found = judge({"narrative": None}, None, baseline_for([], "s", {}, 1.0, 5), Limits())
    assert [f.name for f in found] == ["no_measurement"]


def test_records_round_trip_and_bad_lines_are_skipped(tmp_path):
    path = tmp_path / "history.jsonl"
    good = rec("int8", 130.0, 170.0)
    path.write_text("not json\n" + '{"schema": "other"}\n'
                    + __import__("json").dumps(good.to_dict()) + "\n\n")
    [back] = read_throughput_history(path)
    assert back == good and back.decode("code") == 170.0 and back.decode("x") is None
    assert read_throughput_history(tmp_path / "missing") == []
    unknown = ThroughputRecord.from_dict({**good.to_dict(), "acceptance": None})
    assert unknown is not None and unknown.acceptance is None  # unknown stays unknown
