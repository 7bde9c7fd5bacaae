"""The host's metric textfiles (rigfleet/hostside/metrics.py): nvidia-smi's csv to the GPU
textfile, the host's records to rigfleet's facts, and the simulated nvidia-smi answering the
exporter's query."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rigfleet.hostside import metrics
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.metrics import Facts, GateFacts, facts_textfile, gpu_textfile

# Two RTX 3090s as driver 580 answers GPU_QUERY (csv,noheader,nounits): card 0 capped at
# 290 W and power-capped under load, card 1 idle with its link trained down.
ROWS = (
    "0, GPU-3f1c2a10-0000-4000-8000-000000000001, 287.41, 290.00, 71, 1695, 22145, 24576, 97, "
    "Active, Not Active, Not Active, Not Active, Not Active, 4, 4, 16, 16\n"
    "1, GPU-3f1c2a10-0000-4000-8000-000000000002, 21.07, 290.00, 34, 210, 1, 24576, 0, "
    "Not Active, Not Active, Not Active, Not Active, Not Active, 1, 4, 16, 16\n"
)


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample line; every family has HELP and TYPE."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            assert line.split()[3] in ("gauge", "counter"), line
        elif not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    families = {re.split(r"[{ ]", k)[0] for k in out}
    for family in families:
        assert f"# HELP {family} " in text and f"# TYPE {family} " in text, family
    return out


def test_gpu_textfile_names_units_and_labels():
    s = samples(gpu_textfile(ROWS))
    g0 = 'gpu="0",uuid="GPU-3f1c2a10-0000-4000-8000-000000000001"'
    g1 = 'gpu="1",uuid="GPU-3f1c2a10-0000-4000-8000-000000000002"'
    assert s[f"rigfleet_gpu_power_watts{{{g0}}}"] == 287.41
    assert s[f"rigfleet_gpu_power_limit_watts{{{g0}}}"] == 290
    assert s[f"rigfleet_gpu_temperature_celsius{{{g0}}}"] == 71
    assert s[f"rigfleet_gpu_sm_clock_mhz{{{g1}}}"] == 210
    assert s[f"rigfleet_gpu_memory_used_bytes{{{g0}}}"] == 22145 * 2**20
    assert s[f"rigfleet_gpu_memory_total_bytes{{{g1}}}"] == 24576 * 2**20
    assert s[f"rigfleet_gpu_utilization_ratio{{{g0}}}"] == 0.97
    assert s[f'rigfleet_gpu_throttle{{reason="sw_power_cap",{g0}}}'] == 1
    assert s[f'rigfleet_gpu_throttle{{reason="hw_thermal",{g0}}}'] == 0
    assert s[f'rigfleet_gpu_throttle{{reason="sw_power_cap",{g1}}}'] == 0
    assert s[f'rigfleet_gpu_pcie_link_gen{{state="current",{g1}}}'] == 1
    assert s[f'rigfleet_gpu_pcie_link_gen{{state="max",{g1}}}'] == 4
    assert s[f'rigfleet_gpu_pcie_link_width{{state="current",{g0}}}'] == 16
    assert s["rigfleet_gpu_scrape_ok"] == 1
    # GeForce cards have no ECC: no ECC query answer, no ECC sample.
    assert not any(k.startswith("rigfleet_gpu_ecc_errors_total") for k in s)


def test_gpu_textfile_ecc_only_where_reported():
    s = samples(gpu_textfile(ROWS, "0, 3\n1, [N/A]\n"))
    ecc = {k: v for k, v in s.items() if k.startswith("rigfleet_gpu_ecc_errors_total")}
    assert ecc == {'rigfleet_gpu_ecc_errors_total{gpu="0",uuid="GPU-3f1c2a10-0000-4000-8000-'
                   '000000000001"}': 3}
    assert "# TYPE rigfleet_gpu_ecc_errors_total counter" in gpu_textfile(ROWS, "0, 3\n")


def test_gpu_textfile_says_when_nvidia_smi_did_not_answer():
    assert samples(gpu_textfile(None)) == {"rigfleet_gpu_scrape_ok": 0}
    # An answer of another shape (a driver that printed an error on stdout) is no answer.
    assert samples(gpu_textfile("Failed to initialize NVML: Unknown Error\n")) == {
        "rigfleet_gpu_scrape_ok": 0}


def test_gpu_textfile_skips_a_figure_the_card_does_not_report():
    row = ROWS.splitlines()[0].replace(", 71, ", ", [N/A], ") + "\n"
    s = samples(gpu_textfile(row))
    assert not any(k.startswith("rigfleet_gpu_temperature_celsius") for k in s)
    assert s["rigfleet_gpu_scrape_ok"] == 1


def test_facts_textfile_contract_names():
    f = Facts(now=1_800_000_000.0, serving={"stack": "int8", "image_digest": "sha256:ab",
                                            "model_revision": "r1", "genesis_commit": ""},
              ready=True, engine_up=True, swap_in_progress=True, swap_expected_s=42.0,
              window_open=True, window_opened_at=1_799_999_000.0,
              gate=GateFacts("int8", 80.5, 90.0, 0.15, False, 1_799_000_000.0, 0.6),
              recreations=2, gave_up=False, drain_s=3.5)
    s = samples(facts_textfile(f))
    assert s['rigfleet_serving_info{stack="int8",image_digest="sha256:ab",model_revision="r1",'
             'genesis_commit=""}'] == 1
    assert s["rigfleet_ready"] == 1 and s["rigfleet_engine_up"] == 1
    assert s["rigfleet_swap_in_progress"] == 1 and s["rigfleet_swap_expected_seconds"] == 42
    assert s["rigfleet_maintenance_window_open"] == 1
    assert s["rigfleet_maintenance_window_opened_timestamp_seconds"] == 1_799_999_000
    assert s['rigfleet_gate_tokens_per_second{stack="int8"}'] == 80.5
    assert s['rigfleet_gate_baseline_tokens_per_second{stack="int8"}'] == 90
    assert s['rigfleet_gate_margin_ratio{stack="int8"}'] == 0.15
    assert s['rigfleet_gate_passed{stack="int8"}'] == 0
    assert s['rigfleet_gate_timestamp_seconds{stack="int8"}'] == 1_799_000_000
    assert s['rigfleet_mtp_acceptance_floor{stack="int8"}'] == 0.6
    assert s["rigfleet_supervisor_recreations_total"] == 2
    assert s["rigfleet_supervisor_gave_up"] == 0
    assert s["rigfleet_drain_seconds"] == 3.5
    assert s["rigfleet_facts_timestamp_seconds"] == 1_800_000_000


def test_read_facts_from_records(tmp_path, monkeypatch):
    lay = Layout(tmp_path)
    lay.state_dir.mkdir(parents=True)
    lay.state_file.write_text(json.dumps({"stack": "int8", "digest": "sha256:cd",
                                          "model_revision": "abc", "genesis_commit": None}))
    lines = [{"event": "supervise", "result": "recreated"}, {"event": "swap"},
             {"event": "supervise", "result": "gave-up"},
             {"event": "supervise", "result": "recreated"}]
    lay.ledger_file.write_text("".join(json.dumps(x) + "\n" for x in lines) + "{torn\n")
    report = tmp_path / "verify.json"
    report.write_text(json.dumps({"checks": [{"name": "throughput", "details": {
        "limits": {"margin": 0.1, "cv_max": 0.2, "acceptance_floor": [0.8, 0.55]}}}]}))
    lay.throughput_dir.mkdir(parents=True)
    lay.throughput_last.write_text(json.dumps({
        "schema": "rigfleet-throughput/1", "stack": "int8", "at": "2026-12-01T10:00:00+00:00",
        "source": "gate", "result": "fail", "shapes": {"narrative": {"decode": 70.0}},
        "baseline": {"narrative": 100.0}, "report": str(report)}))
    calls = []
    monkeypatch.setattr(metrics, "engine_running", lambda stack: calls.append(stack) or True)
    monkeypatch.setattr(metrics, "front_ready", lambda port: port == 8000)
    f = metrics.read_facts(lay, 8000, now=1_800_000_000.0)
    assert calls == ["int8"]
    assert f.serving == {"stack": "int8", "image_digest": "sha256:cd", "model_revision": "abc",
                         "genesis_commit": ""}
    assert f.ready and f.engine_up and not f.swap_in_progress and not f.window_open
    assert f.recreations == 2
    assert f.gate == GateFacts("int8", 70.0, 100.0, 0.1, False, 1_796_119_200.0, 0.55)


def test_read_facts_on_a_bare_host(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "front_ready", lambda port: False)
    f = metrics.read_facts(Layout(tmp_path), None, now=5.0)
    assert f == Facts(now=5.0)
    s = samples(facts_textfile(f))
    assert "rigfleet_serving_info" not in "".join(s) and s["rigfleet_engine_up"] == 0


def test_run_writes_both_files_atomically(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "read_gpus", lambda query=metrics.GPU_QUERY: None)
    monkeypatch.setattr(metrics, "front_ready", lambda port: False)
    out = tmp_path / "textfiles"
    assert metrics.run(Layout(tmp_path / "root"), out, 8000) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([metrics.FACTS_FILE, metrics.GPU_FILE])
    assert (out / metrics.GPU_FILE).stat().st_mode & 0o777 == 0o644
    assert "rigfleet_gpu_scrape_ok 0" in (out / metrics.GPU_FILE).read_text()
    assert Path(out / metrics.FACTS_FILE).read_text().endswith("\n")


def test_refresh_after_a_swap_only_where_the_exporter_is(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "read_gpus", lambda query=metrics.GPU_QUERY: None)
    monkeypatch.setattr(metrics, "front_ready", lambda port: False)
    lay = Layout(tmp_path)
    metrics.refresh(lay, 8000)
    directory = tmp_path / metrics.TEXTFILE_DIR.lstrip("/")
    assert not directory.exists()                      # no node exporter: nothing written
    directory.mkdir(parents=True)
    metrics.refresh(lay, 8000)
    assert (directory / metrics.FACTS_FILE).is_file() and (directory / metrics.GPU_FILE).is_file()


def test_a_swap_holds_the_host_but_the_supervisor_recreating_a_dead_engine_does_not(
        tmp_path, monkeypatch):
    """``rigfleet_swap_in_progress`` excuses an engine that is down on purpose; a supervisor
    that holds the lock to recreate an engine that died must not hide "engine down"."""
    from rigfleet.hostside.lock import HostLock
    from rigfleet.hostside.supervise import WHO

    lay = Layout(tmp_path)
    lay.state_dir.mkdir(parents=True)
    lay.state_file.write_text(json.dumps({"stack": "int8", "digest": "sha256:cd"}))
    monkeypatch.setattr(metrics, "engine_running", lambda stack: False)
    monkeypatch.setattr(metrics, "front_ready", lambda port: False)
    for who, swapping in ((WHO, False), ("alice@laptop", True)):
        lock = HostLock(lay)
        assert lock.acquire(who, "recreate: its container exited" if who == WHO
                            else "swap tq3 -> int8", "" if who == WHO else "d-1") is None
        try:
            f = metrics.read_facts(lay, 8000, now=1_800_000_000.0)
            s = samples(facts_textfile(f))
            assert (f.swap_in_progress, s["rigfleet_swap_in_progress"]) == (
                swapping, float(swapping)), who
            assert s["rigfleet_engine_up"] == 0
            assert ("rigfleet_swap_expected_seconds" in s) is swapping, who
        finally:
            lock.release()
    assert not metrics.is_swap(None)


def test_a_running_swap_is_expected_to_take_its_desired_stacks_window(tmp_path, monkeypatch):
    """RigNotReady waits for the window the swap itself said (Retry-After): the desired
    stack's boot and gate, not the serving stack's."""
    from swap_fakes import make_plan, make_ref

    from rigfleet.hostside.lock import HostLock
    from rigfleet.hostside.steps import record_times

    lay = Layout(tmp_path)
    lay.state_dir.mkdir(parents=True)
    lay.state_file.write_text(json.dumps({"stack": "int8", "digest": "sha256:cd"}))
    record_times(lay, "int8", boot_s=20.0, gate_s=10.0, overhead_s=5.0)
    record_times(lay, "tq3-mtp-genesis", boot_s=300.0, gate_s=100.0)
    plan = make_plan(lay, make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd"))
    lay.plan_file(plan.id).parent.mkdir(parents=True, exist_ok=True)
    lay.plan_file(plan.id).write_text(plan.dumps())
    monkeypatch.setattr(metrics, "engine_running", lambda stack: False)
    monkeypatch.setattr(metrics, "front_ready", lambda port: False)
    lock = HostLock(lay)
    assert lock.acquire("alice@laptop", "swap int8 -> tq3-mtp-genesis", plan.id) is None
    try:
        f = metrics.read_facts(lay, 8000, now=1_800_000_000.0)
    finally:
        lock.release()
    assert f.swap_in_progress and f.swap_expected_s == 405.0
