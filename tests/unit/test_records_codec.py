"""One codec for the host's typed records: today's records round-trip as the same sorted JSON,
old ones (fields added later left out) still read, damaged ones read leniently or name the field."""

from __future__ import annotations

import json

import pytest

from rigfleet.hostside.maintenance import Window
from rigfleet.hostside.plan import Active, Plan, PlanError, StackRef
from rigfleet.hostside.records import (
    GateRecord,
    ReportSummary,
    ShapeFigures,
    ThroughputRecord,
    decode,
    decode_strict,
    encode,
)
from rigfleet.hostside.steps import StackTimes, Timings
from rigfleet.hostside.supervise import Attempt, Record

REF = StackRef("int8", "rigfleet-int8", "rigfleet-int8", 8001, "/x/c.yaml", "abcd1234",
               "img@sha256:1", "m", 0.9, {"digest": "sha256:1"}, (("a", "b"),),
               (("k", "p", "t", "h"),), "sha256:ii")
PLAN = Plan("D1", "me", "why", "h1", REF, (("p1", "f1"),), 8000, "quick", ("x=1",),
            drain_timeouts={"int8": 300.0})
RECORDS = [
    REF, PLAN, Active(REF, "2026", "D1", "me", {"result": "pass"}),
    ReportSummary("x/r.json", 5.5, ("a",), 2, {"pass": 1, "fail": 1}),
    ThroughputRecord("int8", "t", shapes={"code": ShapeFigures(10.5, 0.01, 9.0, 0.2, 5)},
                     acceptance_length=2.5, acceptance=(0.9, 0.5), baseline={"a": [1]}),
    Record("backoff", "r", 1.0, "int8/x", "e", "t",
           (Attempt(1.0, "r", "failed", "d", 3.5, "j", "k", True), Attempt(2.0, "r2")),
           5.0, "death", {"kind": "oom", "line": ""}, "s", 6.0, 7.0, None),
    Window("W1", "open", "me", "h", 1.0, 0.0, ({"what": "x", "at": 1.0},), PLAN.to_dict(),
           "int8/x", "r", {"result": "pass"}, 3.0, {"seconds": 2}),
    Timings({"int8": StackTimes(1.5, 2.0, 3.0)}, 0.5, None, 33.3),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_round_trips_as_the_same_sorted_json(record):
    text = json.dumps(encode(record), sort_keys=True)
    back = decode(type(record), json.loads(text))
    assert back == record and json.dumps(encode(back), sort_keys=True) == text


def test_the_json_is_what_the_hand_written_writers_wrote():
    assert encode(REF)["boot_expect"] == [["a", "b"]]
    assert PLAN.to_dict()["schema"] == "rigfleet-swap-plan/1"
    assert Active(REF).to_dict()["ref"]["port"] == 8001
    assert ThroughputRecord("s").to_dict()["acceptance"] is None


def test_an_old_plan_without_later_fields_still_reads():
    data = json.loads(PLAN.dumps())
    del data["drain_timeouts"], data["drain_timeout_s"], data["desired"]["image_id"]
    del data["desired"]["boot_expect"], data["desired"]["boot_failures"]
    plan = Plan.from_dict(data)
    assert plan.desired.image_id == "" and plan.drain_timeouts == {} and plan.desired.port == 8001


def test_lenient_records_drop_what_is_of_the_wrong_kind():
    assert GateRecord.from_dict({"result": "fail", "failed_checks": "ab", "seconds": "x"}) == \
        GateRecord("fail")
    assert GateRecord.from_dict({"failed_checks": []}) is None
    rec = ThroughputRecord.from_dict({"schema": "rigfleet-throughput/1", "stack": "s",
                                      "shapes": {"a": {"decode": 1}, "b": {}, "c": 3},
                                      "acceptance": [1, "x", float("nan")], "scale": -1})
    assert rec is not None and set(rec.shapes) == {"a"} and rec.acceptance == (1.0,)
    assert rec.scale == 1.0
    assert decode(Timings, {"stacks": {"a": {"boot_s": -1, "gate_s": 2}, "b": {"boot_s": 1}},
                            "drain_s": True}) == Timings()


def test_strict_records_name_the_field():
    data = json.loads(PLAN.dumps())
    with pytest.raises(PlanError, match=r"^desired\.port: missing$"):
        Plan.from_dict({**data, "desired": {k: v for k, v in data["desired"].items()
                                            if k != "port"}})
    with pytest.raises(PlanError, match=r"^desired\.gpu_memory_utilization: 1\.5 is not in"):
        Plan.from_dict({**data, "desired": {**data["desired"], "gpu_memory_utilization": 1.5}})
    with pytest.raises(PlanError, match=r"^active\.ref\.boot_expect: expected 2 items, got 1$"):
        Active.from_dict({"ref": {**REF.to_dict(), "boot_expect": [["a"]]}})
    with pytest.raises(TypeError, match=r"^attempts: expected a list, got int$"):
        Record.from_dict({"schema": "rigfleet-supervise/1", "attempts": 7})
    with pytest.raises(TypeError, match=r"^x\.front_port: expected a whole number >= 0"):
        decode_strict(Plan, {**data, "front_port": "80"}, "x")
    with pytest.raises(TypeError, match=r"^x\.front_port: expected a whole number >= 0"):
        decode_strict(Plan, {**data, "front_port": 10**400}, "x")  # compared, not converted


def test_a_plan_file_json_cannot_read_is_a_plan_error(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(PLAN.dumps().replace('"front_port": ', '"front_port": 1' + "0" * 5000 + ", "
                                         '"x": ', 1))
    with pytest.raises(PlanError, match=r"plan\.json: not JSON \(.*4300"):
        Plan.load(path)
