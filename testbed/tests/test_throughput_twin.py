"""The stack files' reference figures against the digital twin (the testbed's engine, its
throughput model from the same seeds): at the testbed clock, with throughput_scale =
sim_speedup, a healthy stack passes the gate's throughput check and a slower one fails it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_sim_throughput import DUAL_INT8, MITIGATED, RELEASE, SINGLE_FP8, SLOW, paced

from rigfleet.catalog import builtin_catalog
from rigfleet.hostside.verify.profiles import resolve
from rigfleet.hostside.verify.runner import run

# Slower than the testbed's 40: these runs share the machine with the rest of the suite, and
# the CV bound is not what this test is about (off); the twin's ratios do not change.
SPEEDUP = 20.0


def throughput(url: str, stack: str) -> tuple[str, list[str], str]:
    spec = builtin_catalog().get(stack)
    assert spec.throughput is not None
    sets = [f"throughput_stack={stack}", f"throughput_scale={SPEEDUP:g}",
            *spec.throughput.gate_set(), "throughput_cv_max=1", "throughput_runs=3"]
    rep, _ = run(url, resolve("fast", sets), only=["throughput"])
    check = rep.checks[-1]
    return check.status, [f.name for f in check.findings], check.summary


@pytest.mark.parametrize(("label", "args", "cards", "caps", "tag", "stack", "want"), [
    ("int8 on a release", [*DUAL_INT8, *MITIGATED], 2, None, RELEASE, "int8", []),
    ("int8 on the slow nightly", [*DUAL_INT8, *MITIGATED], 2, None, SLOW, "int8",
     ["slow_decode"]),
    ("one card capped at 230 W", [*SINGLE_FP8, *MITIGATED], 1, [230], RELEASE,
     "single-fp8-mtp", ["slow_decode", "slow_decode"]),
])
def test_the_twin_against_the_stack_references(tmp_path, label, args, cards, caps, tag, stack,
                                               want):
    with paced(tmp_path, args, SPEEDUP, cards=cards, caps=caps, tag=tag) as srv:
        status, found, summary = throughput(f"http://127.0.0.1:{srv.port}", stack)
        srv.stop()
    assert found == want, summary
    assert status == ("fail" if want else "pass")
