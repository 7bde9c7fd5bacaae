"""rigfleet doctor: the host's evidence (nvidia-smi under load, engine log facts), the rules
(ranked causes, what is ruled out) and the verdict against baseline and fleet."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fakes import Pace, PacedServer
from doctor_fixtures import (
    BACKEND_FLASHINFER,
    BACKEND_TRITON,
    BATCHED,
    CACHE_DIR,
    CAPTURE_FULL,
    CAPTURE_PIECEWISE,
    COLD,
    COMPILE_MOUNT,
    DOWNGRADE,
    HIT,
    TOTAL,
    FakeRunner,
    row,
    section,
)

from rigfleet.catalog import builtin_catalog
from rigfleet.doctor.cli import Diagnosis, examine, judge_fleet, render
from rigfleet.doctor.evidence import parse_evidence, parse_sample
from rigfleet.doctor.rules import (
    CAUSE,
    INFO,
    RULED_OUT,
    Expect,
    diagnose,
    single_card_speed,
    verdict,
)
from rigfleet.hostprobe import HostProbe
from rigfleet.hostside.bench import evidence as host_evidence
from rigfleet.hostside.verify.client import Client

SINGLE = builtin_catalog().get("single-fp8-mtp")
FLOORS = SINGLE.throughput.floors if SINGLE.throughput else ()
SINGLE_EXPECT = Expect(tp=1, kv_cache_dtype="fp8_e5m2", floors=FLOORS,
                       acceptance_reference=(0.95, 0.84, 0.75),
                       gate_acceptance=(0.93, 0.866, 0.739))
DUAL_EXPECT = Expect(tp=2, kv_cache_dtype="turboquant_3bit_nc", floors=FLOORS,
                     acceptance_reference=(0.95, 0.84, 0.75),
                     gate_acceptance=(0.95, 0.84, 0.75))
PIECEWISE_LOG = [BACKEND_FLASHINFER, CACHE_DIR, HIT, DOWNGRADE, CAPTURE_PIECEWISE]
FULL_LOG = [CACHE_DIR, HIT, CAPTURE_FULL.replace("decode, FULL", "mixed prefill-decode, "
                                                 "PIECEWISE"), CAPTURE_FULL]


def by_id(causes):
    return {c.id: c for c in causes}


def single_card(cap: float, **kw):
    idle = [row(0, pstate="P8", util=0, draw=22.0, limit=cap, gen=1)]
    load = [[row(0, draw=cap, limit=cap, reasons=("sw_power_cap",))] for _ in range(3)]
    return parse_evidence("rig-1", section(idle, load, lines=kw.pop("lines", PIECEWISE_LOG),
                                           **kw))


def dual(cap: float = 230.0, gpu1: dict | None = None, **kw):
    idle = [row(0, pstate="P8", util=0, draw=20.0, limit=cap, gen=1),
            row(1, pstate="P8", util=0, draw=20.0, limit=cap, gen=1)]
    load = [[row(0, draw=220.0, limit=cap), row(1, draw=220.0, limit=cap, **(gpu1 or {}))]
            for _ in range(3)]
    return parse_evidence("rig-2", section(idle, load, lines=kw.pop("lines", FULL_LOG),
                                           stack="tq3-mtp-genesis", **kw))


def test_a_single_card_cap_is_blamed_first():
    causes = diagnose(single_card(230.0), SINGLE_EXPECT)
    assert causes[0].id == "power-cap" and causes[0].kind == CAUSE
    assert causes[0].impact == pytest.approx(1 - single_card_speed(230) /
                                             single_card_speed(350), abs=1e-6)
    assert 0.2 < causes[0].impact < 0.3  # seed 004: 43 -> 33 tok/s from 330 to 230 W
    assert "sw_power_cap active" in " ".join(causes[0].evidence)
    assert "290 W air, 330 W water" in causes[0].fix
    assert by_id(causes)["cuda-graphs"].kind == CAUSE
    assert by_id(causes)["mtp-acceptance"].kind == RULED_OUT  # 93/87/74 clears the floors


def test_seed_004s_host_in_order():
    """330 W single card, FlashInfer downgraded to PIECEWISE, compile cache not on a volume,
    max-num-batched-tokens warning, acceptance comparable to the reference's."""
    ev = single_card(330.0, lines=[BACKEND_FLASHINFER, BATCHED, CACHE_DIR, COLD, TOTAL,
                                   DOWNGRADE, CAPTURE_PIECEWISE])
    causes = diagnose(ev, SINGLE_EXPECT)
    ids = [(c.id, c.kind) for c in causes]
    assert ids[0] == ("cuda-graphs", CAUSE) and DOWNGRADE.split("] ")[1] in causes[0].evidence[0]
    assert ("power-cap", INFO) in ids  # 330 W binds but costs under 2% against a 350 W max
    cache = by_id(causes)["compile-cache"]
    assert cache.kind == INFO and "does not survive a restart" in cache.title
    assert "in the container layer" in " ".join(cache.evidence) and cache.impact == 0
    assert by_id(causes)["batched-tokens"].kind == INFO
    assert by_id(causes)["mtp-acceptance"].kind == RULED_OUT
    assert ids[-1][1] == RULED_OUT  # what was ruled out comes last


def test_cards_keep_their_own_index_in_any_row_order():
    idle = [row(1, pstate="P8", util=0, draw=20.0), row(0, pstate="P8", util=0, draw=20.0)]
    ev = parse_evidence("rig-2", section(idle, [idle], lines=FULL_LOG))
    assert [c.index for c in ev.cards] == [1, 0]


def test_a_dual_card_cap_in_the_flat_range_is_never_blamed():
    for cap in (220.0, 230.0, 290.0, 330.0):
        c = by_id(diagnose(dual(cap), DUAL_EXPECT))["power-cap"]
        assert c.kind == RULED_OUT and "flat from 220 to 330 W" in " ".join(c.evidence)
    low = by_id(diagnose(dual(180.0), DUAL_EXPECT))["power-cap"]
    assert low.kind == CAUSE and "below the dual-card knee" in low.title


def test_a_slow_pcie_link_under_load_is_blamed_on_two_cards():
    ev = dual(gpu1={"gen": 3, "gen_max": 3, "width": 4, "width_max": 4, "util": 76})
    causes = diagnose(ev, DUAL_EXPECT)
    assert causes[0].id == "pcie-link" and causes[0].kind == CAUSE
    text = " ".join(causes[0].evidence)
    assert "gpu1: gen3 x4 under load" in text and "the card gen4 x16" in text
    assert "utilization asymmetry" in text and "Gen 3 costs 30-40%" in causes[0].basis
    # At idle the link is at gen1 (it drops), under load it trains to gen4: not a finding.
    assert by_id(diagnose(dual(), DUAL_EXPECT))["pcie-link"].kind == RULED_OUT
    # A link that trains below what the slot allows: reseat.
    down = diagnose(dual(gpu1={"gen": 3, "gen_max": 4}), DUAL_EXPECT)[0]
    assert down.id == "pcie-link" and "reseat" in down.fix


def test_graph_modes():
    eager = parse_evidence("r", section([row(0)], [[row(0)]], lines=[BACKEND_TRITON],
                                        args=["--enforce-eager"], stack="int8"))
    assert eager.graph_mode == "NONE"
    assert by_id(diagnose(eager, DUAL_EXPECT))["cuda-graphs"].title.startswith("no CUDA graphs")
    assert by_id(diagnose(dual(), DUAL_EXPECT))["cuda-graphs"].kind == RULED_OUT
    assert dual().graph_mode == "FULL_AND_PIECEWISE"


def test_compile_cache_on_a_volume_that_compiled_cold_is_a_first_start():
    ev = single_card(350.0, lines=[CACHE_DIR, COLD, TOTAL], mounts=[COMPILE_MOUNT])
    c = by_id(diagnose(ev, SINGLE_EXPECT))["compile-cache"]
    assert c.kind == INFO and "compiled cold" in c.title and "first start" in c.fix
    hit = by_id(diagnose(single_card(350.0, lines=[CACHE_DIR, HIT], mounts=[COMPILE_MOUNT]),
                         SINGLE_EXPECT))["compile-cache"]
    assert hit.kind == RULED_OUT and "3.912 s" in hit.evidence[0]


def test_low_acceptance_and_int8_depth_and_heat():
    bad = Expect(tp=2, floors=FLOORS, acceptance_reference=(0.95, 0.84, 0.75),
                 gate_acceptance=(0.9, 0.5, 0.3), kv_cache_dtype="int8_per_token_head")
    causes = by_id(diagnose(dual(), bad))
    assert causes["mtp-acceptance"].kind == CAUSE and causes["mtp-acceptance"].impact > 0.2
    assert causes["kv-dtype"].kind == INFO and "#594" in causes["kv-dtype"].basis
    hot = parse_evidence("r", section([row(0)], [[row(0, temp=86, reasons=(
        "hw_thermal_slowdown",))]], lines=[]))
    c = by_id(diagnose(hot, SINGLE_EXPECT))["clocks"]
    assert c.kind == CAUSE and c.impact == 0.5 and "86 °C" in c.evidence[0]


def test_floors_without_a_draft_position_are_not_cleared():
    """A server drafting 2 tokens for a stack with 3 floors: the gate fails it
    (``missing_acceptance``); the doctor said "clears the floors" and ruled the drafter out."""
    short = Expect(tp=2, floors=FLOORS, acceptance_reference=(0.95, 0.84, 0.75),
                   gate_acceptance=(0.95, 0.9))
    cause = by_id(diagnose(dual(), short))["mtp-acceptance"]
    assert len(FLOORS) == 3 and cause.kind == CAUSE
    assert cause.evidence == ("positions 3 not in /metrics (the engine drafts 2 token(s), the "
                              "stack has 3 floors)",)


def test_nvidia_smi_csv_parsing():
    s = {"rc": 0, "fields": ["index", "power.draw", "clocks_throttle_reasons.sw_power_cap",
                             "clocks_event_reasons.active", "pcie.link.gen.gpumax"],
         "stdout": "0, 229.87, Active, 0x0000000000000004, [N/A]\n1, [Not Supported], "
                   "Not Active, 0x0, 4\n"}
    a, b = parse_sample(s)
    assert a == {"index": 0.0, "power.draw": 229.87, "clocks_event_reasons.sw_power_cap": True,
                 "clocks_event_reasons.active": 4.0, "pcie.link.gen.gpumax": None}
    assert b["power.draw"] is None and b["clocks_event_reasons.sw_power_cap"] is False
    assert parse_sample({"rc": 9, "stdout": "x"}) == []


def test_query_falls_back_to_throttle_reasons_and_drops_unknown_fields():
    runner = FakeRunner(invalid=tuple(f for f in host_evidence.GPU_FIELDS
                                      if f.startswith("clocks_event_reasons."))
                        + ("pcie.link.gen.gpumax",))
    got = host_evidence.query_gpus(runner)
    assert got["rc"] == 0
    assert "clocks_throttle_reasons.sw_power_cap" in got["fields"]
    assert "pcie.link.gen.gpumax" not in got["fields"]


def test_container_facts_read_args_mounts_and_the_engine_log():
    runner = FakeRunner(logs="\n".join([BACKEND_FLASHINFER, CACHE_DIR, COLD, TOTAL, DOWNGRADE,
                                        CAPTURE_PIECEWISE, BATCHED]),
                        args=["--enforce-eager"], mounts=[COMPILE_MOUNT])
    facts = host_evidence.container_facts("rigfleet-x", runner)
    eng = facts["engine"]
    assert eng["backend"]["name"] == "FlashInfer" and eng["graph_mode"] == "PIECEWISE"
    assert eng["downgrade"]["requested"] == "FULL_AND_PIECEWISE"
    assert [c["kind"] for c in eng["compile"]] == ["cold", "total"]
    assert eng["cache_dirs"][0].endswith("rank_0_0/backbone")
    assert eng["warnings"]["batched_tokens"] == [BATCHED]
    assert facts["enforce_eager"] is True and facts["mounts"][0]["destination"].endswith(
        "torch_compile_cache")


def test_the_load_samples_while_it_runs():
    samples = []

    def sample():
        samples.append(1)
        return {"rc": 0, "fields": ["index"], "stdout": "0\n"}

    with PacedServer(Pace(step_rate=1000.0, prefill_s=0.001)) as srv:
        got = host_evidence.load(Client(srv.url), "qwen3.6-27b-autoround", 0.6, sample)
    assert got["gpu"]["idle"]["rc"] == 0 and len(got["gpu"]["load"]) >= 2
    assert got["load"]["decode_mean"] > 0 and got["load"]["acceptance"]["drafts"]


def test_verdict_against_baseline_and_fleet():
    v = verdict(48.0, 64.0, "history: median of 3 verified gate(s)", [48.0, 63.0, 64.0], 0.15)
    assert v.slow and len(v.reasons) == 2 and "25% below its baseline" in v.reasons[0]
    assert "fleet median 63.0 (3 hosts" in v.reasons[1]
    assert not verdict(60.0, 64.0, "x", [60.0], 0.15).slow  # one host: no fleet median
    assert verdict(60.0, 64.0, "x", [60.0], 0.15).fleet_median is None


def test_examine_judge_and_render_a_small_fleet(tmp_path):
    from test_swap_plan import host_data

    from rigfleet.hostdata import validate_host

    fast = section([row(0), row(1)], [[row(0), row(1)]], lines=FULL_LOG, decode=89.0,
                   stack="tq3-mtp-genesis")
    slow = section([row(0), row(1)], [[row(0), row(1, gen=3, gen_max=3, width=4,
                                                   width_max=4, util=76)]],
                   lines=FULL_LOG, decode=70.0, stack="tq3-mtp-genesis")
    state = {"stack": "tq3-mtp-genesis", "digest": "sha256:" + "a" * 64,
             "genesis_commit": "c" * 40, "model_revision": "r" * 40}
    probes = {"rig-a": HostProbe({"state": state, "doctor": fast}),
              "rig-b": HostProbe({"state": state, "doctor": slow}),
              "rig-c": HostProbe({"state": state, "doctor": {"error": "nothing verified"}})}
    settings = validate_host("rig-a", host_data(tmp_path))
    diagnoses = [examine(name, p, settings) for name, p in probes.items()]
    judge_fleet(diagnoses)
    a, b, c = diagnoses
    assert a.verdict and not a.verdict.slow
    assert b.verdict and b.verdict.slow and b.causes[0].id == "pcie-link"
    assert any("below its baseline 89.2 (reference 89.2 x 1)" in r for r in b.verdict.reasons)
    assert c.error == "nothing verified" and c.verdict is None
    out = io.StringIO()
    render(diagnoses, "rigfleet doctor").print(Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "rig-b: 1. PCIe link at" in text and "ruled out: power cap" in text
    assert "rig-c: nothing verified" in text
    assert Diagnosis("x", error="e").to_dict()["error"] == "e"
    # The margin (and baseline) are the host's gate's: its gate_set overrides count.
    tuned = validate_host("rig-b", {**host_data(tmp_path), "gate_set": ["throughput_margin=0.3"]})
    again = examine("rig-b", probes["rig-b"], tuned)
    assert again.verdict is not None and again.verdict.margin == 0.3
    assert b.verdict.margin == builtin_catalog().get("tq3-mtp-genesis").throughput.margin


def test_the_probe_s_doctor_section_end_to_end(tmp_path, monkeypatch):
    """``probe --full --doctor`` on a host: the active stack is loaded, nvidia-smi and docker
    (stand-ins on PATH) are read; the control side then finds the cause."""
    import json as _json
    import stat

    from test_bench_cli import activate

    from rigfleet.hostside.layout import Layout
    from rigfleet.hostside.probe import probe

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "smi.csv").write_text(", ".join(
        row(0, draw=230.0, limit=230.0, reasons=("sw_power_cap",))) + "\n")
    (tmp_path / "inspect.txt").write_text(
        _json.dumps(["--model", "m"]) + "\t" + _json.dumps([COMPILE_MOUNT]) + "\n")
    (tmp_path / "logs.txt").write_text("\n".join(
        [BACKEND_FLASHINFER, CACHE_DIR, HIT, DOWNGRADE, CAPTURE_PIECEWISE]) + "\n")
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat '{tmp_path}/smi.csv'\n")
    (bin_dir / "docker").write_text(
        "#!/bin/sh\ncase \"$1\" in\n"
        f"  inspect) cat '{tmp_path}/inspect.txt' ;;\n"
        f"  logs) cat '{tmp_path}/logs.txt' ;;\nesac\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    lay = Layout(tmp_path / "root")
    with PacedServer(Pace(step_rate=1000.0, prefill_s=0.001)) as srv:
        activate(lay, int(srv.url.rsplit(":", 1)[1]))
        raw = probe(lay, full=True, doctor_load_s=0.5)
    section = raw["doctor"]
    assert section["stack"] == "single-fp8-mtp" and section["load"]["decode_mean"] > 0
    assert section["engine"]["graph_mode"] == "PIECEWISE" and section["gpu"]["load"]
    ev = parse_evidence("rig-1", section)
    assert ev.cards[0].power_limit_w == 230.0 and "sw_power_cap" in ev.cards[0].reasons
    causes = diagnose(ev, SINGLE_EXPECT)
    assert [c.id for c in causes if c.kind == CAUSE] == ["power-cap", "cuda-graphs"]
    assert by_id(causes)["compile-cache"].kind == RULED_OUT  # on a volume, loaded from it


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_doctor_refuses_a_load_that_is_not_seconds(value, capsys):
    from rigfleet.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["doctor", "--load-s", value])
    assert exc.value.code == 2 and "--load-s" in capsys.readouterr().err
    assert build_parser().parse_args(["doctor", "--load-s", "2.5"]).load_s == 2.5


def test_a_load_that_measured_nothing_is_not_an_ok_host(tmp_path):
    """A server that answers /v1/models but decodes nothing is not "ok": the host could not be
    examined (exit 2), and the report says why."""
    from test_swap_plan import host_data

    from rigfleet.hostdata import validate_host

    broken = section([row(0)], [[row(0)]], lines=PIECEWISE_LOG, decode=None)
    broken["load"]["runs"] = [{"http_status": 500, "error": "CUDA out of memory"}]
    settings = validate_host("rig-a", host_data(tmp_path))
    d = examine("rig-a", HostProbe({"state": {"stack": "single-fp8-mtp"}, "doctor": broken}),
                settings)
    judge_fleet([d])
    assert d.error == ("the load measured no decode speed (first run: HTTP 500: CUDA out of "
                       "memory)")
    out = io.StringIO()
    render([d], "rigfleet doctor").print(Console(file=out, width=200, color_system=None))
    assert "ok" not in out.getvalue().split("rig-a", 1)[1].splitlines()[0]
    broken["load"]["runs"] = [{"http_status": 0, "error": "timed out"}]
    assert parse_evidence("rig-a", broken).error == (
        "the load measured no decode speed (first run: no HTTP answer: timed out)")


def test_a_pcie_field_the_driver_reports_as_n_a_is_a_question_mark_not_a_crash():
    """nvidia-smi's "[N/A]" for the slot's PCIe generation (a VM, a riser, an older driver)
    ended the whole doctor in "error: Unknown format code 'f' for object of type 'str'"."""
    from rigfleet.hostside.bench.evidence import GPU_FIELDS

    def na(r: list[str]) -> list[str]:
        r[GPU_FIELDS.index("pcie.link.gen.max")] = "[N/A]"
        r[GPU_FIELDS.index("pcie.link.width.max")] = "[N/A]"
        return r

    ev = parse_evidence("rig-2", section([na(row(0, gen=1)), na(row(1, gen=1))],
                                         [[na(row(0, gen=3)), na(row(1, gen=3))]],
                                         lines=FULL_LOG, stack="tq3-mtp-genesis"))
    assert ev.cards[0].gen_max is None and ev.cards[0].gen_load == 3.0
    link = by_id(diagnose(ev, DUAL_EXPECT))["pcie-link"]
    assert link.kind == CAUSE and "slot allows gen? x?" in link.evidence[0]


def test_thermal_slowdown_without_a_max_clock_is_judged_not_a_crash():
    """sw_thermal_slowdown on a card whose clocks.max.sm is [N/A]: min() of no ratio ended the
    whole doctor in "error: min() arg is an empty sequence"."""
    from rigfleet.hostside.bench.evidence import GPU_FIELDS

    hot = row(0, temp=86, reasons=("sw_thermal_slowdown",))
    hot[GPU_FIELDS.index("clocks.max.sm")] = "[N/A]"
    ev = parse_evidence("rig-1", section([row(0, pstate="P8")], [[hot]], lines=FULL_LOG))
    assert ev.cards[0].clocks_max_sm is None
    thermal = by_id(diagnose(ev, SINGLE_EXPECT))["thermal"]
    assert "gpu0: up to 86 °C, sw_thermal_slowdown" in thermal.evidence


def test_clock_evidence_without_a_temperature_or_clocks_says_unknown_not_zero():
    """A card in HW slowdown whose temperature and clocks nvidia-smi reports as [N/A] read
    "0 °C; SM 0/0 MHz" in the evidence, figures the card never showed."""
    from rigfleet.hostside.bench.evidence import GPU_FIELDS

    slow = row(0, reasons=("hw_slowdown",))
    for f in ("temperature.gpu", "clocks.sm", "clocks.max.sm"):
        slow[GPU_FIELDS.index(f)] = "[N/A]"
    ev = parse_evidence("rig-1", section([row(0, pstate="P8")], [[slow]], lines=FULL_LOG))
    clocks = by_id(diagnose(ev, SINGLE_EXPECT))["clocks"]
    assert clocks.evidence == ("gpu0: hw_slowdown; ? °C; SM ?/? MHz",)
