"""The bench's picture (rigfleet/bench/plot.py): nothing measured draws nothing and says so;
the axis spans the figures so that a few percent show; depth and concurrency get panels."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigfleet.bench.plot import NOTHING, axis_range, plot
from rigfleet.hostside.bench.measure import (
    BenchResult,
    ConcurrencyResult,
    DepthResult,
    RunResult,
    ShapeResult,
)
from rigfleet.hostside.bench.report import Entry


def _run(shape: str, tok_s: float) -> RunResult:
    return RunResult(shape, 200, 0.5 + 1000 / tok_s, 0.5, 1000)


def _entry(host: str, narrative: float, code: float, **kw) -> Entry:
    shapes = {"narrative": ShapeResult("narrative", [_run("narrative", narrative)]),
              "code": ShapeResult("code", [_run("code", code)])}
    return Entry(host, "int8", BenchResult("http://x", shapes=shapes, **kw),
                 reference={"narrative": 89.2, "code": 119.1})


def test_nothing_measured_draws_nothing(tmp_path):
    down = Entry("rig-a", None, BenchResult("http://x", error="connection refused"))
    assert plot([down], tmp_path / "b.png") == (None, NOTHING)
    assert plot([], tmp_path / "b.png") == (None, NOTHING)
    assert not (tmp_path / "b.png").exists()


def test_the_axis_shows_a_small_gap():
    lo, hi = axis_range([86.3, 89.2, 88.0])
    assert 80 < lo < 86.3 and 89.2 < hi < 95  # 3 % of the figure is a visible share of it
    assert axis_range([0.0, 5.0])[0] == 0.0  # never below zero


def test_a_picture_with_depth_and_concurrency(tmp_path):
    pytest.importorskip("matplotlib")
    conc = ConcurrencyResult(2, [_run("narrative", 70), _run("narrative", 71)], seconds=15.0)
    depths = [DepthResult(16000, run=_run("narrative", 80)), DepthResult(32000)]
    entries = [_entry("rig-a", 88.9, 118.0, concurrency=conc, depths=depths),
               _entry("rig-b", 86.1, 115.2),
               Entry("rig-c", "int8", BenchResult("http://x", error="down"))]
    path, problem = plot(entries, tmp_path / "b.png")
    assert problem is None and path == Path(tmp_path / "b.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
