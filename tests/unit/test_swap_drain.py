"""The drain: what a window lets finish before it stops the stack, how long it waits, what it
counts as cut, and the Retry-After it says (``rigfleet.hostside.drain``, ``steps``; the swap
transaction and the maintenance window with the fakes of ``swap_fakes``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from swap_fakes import FakeFront, FakeGate, FakeHost, journal, ledger_lines, make_plan, make_ref
from swap_fakes import serving as serving_host

from rigfleet.catalog import CatalogError, builtin_catalog, parse_stack
from rigfleet.hostside import steps
from rigfleet.hostside.drain import (
    Drainer,
    DrainReport,
    EngineLoad,
    drain_note,
    draining_workers,
    parse_load,
)
from rigfleet.hostside.journal import Journal
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.maintenance import Maintenance
from rigfleet.hostside.plan import DEFAULT_DRAIN_TIMEOUT_S
from rigfleet.hostside.steps import (
    DEFAULT_OVERHEAD_S,
    EXIT_FAILED,
    EXIT_PROMOTED,
    StackTimes,
    Timings,
    read_timings,
    record_swap,
    window_estimate,
)
from rigfleet.hostside.transaction import Transaction

# vLLM's /metrics as its Prometheus exposition writes it (labels per engine; two engines of
# one API server: the gauges add up).
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3.6-27b-autoround"} 2.0
vllm:num_requests_running{engine="1",model_name="qwen3.6-27b-autoround"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen3.6-27b-autoround"} 1.0
vllm:num_requests_waiting{engine="1",model_name="qwen3.6-27b-autoround"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen3.6-27b-autoround"} 1234.0
vllm:prompt_tokens_total{engine="0",model_name="qwen3.6-27b-autoround"} 766.0
vllm:num_requests_running_extra{engine="0"} 99.0
"""


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)


# --- the engine's gauges and the front's workers ------------------------------------------


def test_gauges_are_summed_over_engines_with_the_token_counters():
    assert parse_load(METRICS) == EngineLoad(running=3, waiting=1, tokens=2000.0)
    assert parse_load(METRICS).busy == 4


def test_no_answer_or_no_gauge_is_unknown_not_idle():
    assert parse_load(None) is None
    assert parse_load("") is None
    # --disable-log-stats: /metrics answers with process metrics only.
    assert parse_load("# HELP python_info x\npython_info{version=\"3.12\"} 1.0\n") is None
    nan = "vllm:num_requests_running{engine=\"0\"} NaN\nvllm:num_requests_waiting 0\n"
    assert parse_load(nan) == EngineLoad(0, 0, None)


def test_old_nginx_workers_are_counted_from_their_process_title(tmp_path: Path):
    proc = tmp_path / "proc"
    for pid, title in ((10, b"nginx: master process /usr/sbin/nginx"),
                       (11, b"nginx: worker process"),
                       (12, b"nginx: worker process is shutting down"),
                       (13, b"nginx: worker process is shutting down\0"),
                       (14, b"python3\0-m\0nginx: worker process is shutting down")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(title)
    (proc / "self").mkdir()
    assert draining_workers(proc) == 2
    assert draining_workers(tmp_path / "missing") is None


# --- the drain's decisions ------------------------------------------------------------------


def test_nothing_in_flight_is_idle_after_two_reads():
    d = Drainer(timeout_s=600)
    assert not d.observe(0.0, EngineLoad(0, 0), 0)
    assert d.observe(0.5, EngineLoad(0, 0), 0)
    r = d.report()
    assert (r.result, r.seconds, r.cut, r.waited_for_requests) == ("idle", 0.5, 0, False)


def test_requests_in_flight_are_waited_for_until_engine_and_front_are_idle():
    d = Drainer(timeout_s=600)
    assert not d.observe(0.0, EngineLoad(2, 1, 10.0), 1)
    assert not d.observe(20.0, EngineLoad(1, 0, 500.0), 1)
    # The engine is done but the front's old worker still sends the answer's end.
    assert not d.observe(30.0, EngineLoad(0, 0, 900.0), 1)
    assert not d.observe(30.5, EngineLoad(0, 0, 900.0), 0)
    assert d.observe(31.0, EngineLoad(0, 0, 900.0), 0)
    r = d.report()
    assert (r.result, r.seconds, r.running, r.waiting, r.front, r.cut) == (
        "drained", 31.0, 2, 1, 1, 0)
    assert r.line() == "2 running + 1 waiting, 1 front worker(s) finishing finished in 31.0s, " \
        "none cut"


def test_past_the_timeout_what_still_runs_is_cut_and_counted():
    d = Drainer(timeout_s=10)
    assert not d.observe(0.0, EngineLoad(2, 1, 0.0), 1)
    assert not d.observe(9.5, EngineLoad(2, 0, 100.0), 1)
    assert d.observe(10.0, EngineLoad(1, 1, 200.0), 1)
    r = d.report()
    assert (r.result, r.cut, r.timeout_s) == ("timeout", 2, 10)
    assert "2 request(s) cut" in r.line()
    # A front that holds requests while the engine cannot be read: its workers are the count.
    d = Drainer(timeout_s=1)
    d.observe(0.0, None, 3)
    d.observe(1.0, None, 2)
    assert (d.report().result, d.report().cut) == ("timeout", 2)


def test_a_zero_timeout_stops_at_once_and_counts_what_it_cuts():
    d = Drainer(timeout_s=0)
    assert d.observe(0.0, EngineLoad(1, 0, 5.0), 1)
    assert (d.report().result, d.report().cut) == ("timeout", 1)
    d = Drainer(timeout_s=0)
    d.observe(0.0, EngineLoad(0, 0), 0)
    assert d.report().result == "timeout" and d.report().cut == 0


def test_stale_gauges_with_an_idle_front_do_not_hold_the_window(tmp_path: Path):
    # vllm#29928: after aborted requests the gauges stay up until the next engine step.
    d = Drainer(timeout_s=600)
    t = 0.0
    while not d.observe(t, EngineLoad(1, 0, 777.0), 0):
        t += 0.5
    r = d.report()
    assert (r.result, r.cut) == ("stale", 0) and 5.0 <= r.seconds <= 5.5
    # Tokens that still move are real work, whatever the front says.
    d = Drainer(timeout_s=8)
    t = 0.0
    while not d.observe(t, EngineLoad(1, 0, 100.0 + t), 0):
        t += 0.5
    assert d.report().result == "timeout"


def test_unreadable_engine_and_front_are_not_waited_for():
    d = Drainer(timeout_s=600)
    assert d.observe(0.0, None, None)
    assert (d.report().result, d.report().cut) == ("unknown", 0)
    assert "could not be read" in d.report().line()


def test_the_deploy_log_line_of_a_result():
    r = DrainReport("timeout", 600.04, 600.0, running=2, waiting=1, front=1, cut=1)
    assert r.to_dict()["seconds"] == 600.04
    note = drain_note({"drain": r.to_dict(), "retry_after_s": 21})
    assert note == ("; drain: timeout after 600.0s: 1 request(s) cut (2 running + 1 waiting, "
                    "1 front worker(s) finishing at the start); Retry-After 21s")
    assert drain_note({}) == ""


# --- the drain timeout: stack file, host data ----------------------------------------------


def test_the_stack_file_drain_timeout_defaults_and_is_checked():
    cat = builtin_catalog()
    assert cat.stacks["int8"].drain_timeout_s == DEFAULT_DRAIN_TIMEOUT_S == 600.0
    data = json.loads(json.dumps(_stack_data()))
    data["drain"] = {"timeout_s": 45}
    assert parse_stack(data, "stacks/int8.yaml").drain_timeout_s == 45.0
    data["drain"] = {"timeout_s": -1}
    with pytest.raises(CatalogError, match=r"stacks/int8.yaml.*drain.timeout_s.*-1.*seconds in "
                       r"\[0, 7200\]"):
        parse_stack(data, "stacks/int8.yaml")
    data["drain"] = {"timeout": 45}
    with pytest.raises(CatalogError, match=r"drain.*timeout"):
        parse_stack(data, "stacks/int8.yaml")


def _stack_data() -> dict:
    import yaml

    from rigfleet.resources import project_file

    return yaml.safe_load(project_file("rigfleet/stacks/int8.yaml").read_text())


# --- Retry-After from this host's measured windows ----------------------------------------


def test_retry_after_without_history_is_the_plan_default_and_says_so():
    e = window_estimate(Timings(), "int8", busy=True, fallback_s=30)
    assert e.seconds == 30 and "no window measured" in e.basis


def test_retry_after_is_boot_gate_and_overhead_plus_the_drain_when_busy():
    t = Timings({"int8": StackTimes(boot_s=40.2, gate_s=12.0, at=1.0)}, overhead_s=3.5,
                drain_s=20.0)
    assert window_estimate(t, "int8", busy=False, fallback_s=30).seconds == 56  # ceil(55.7)
    busy = window_estimate(t, "int8", busy=True, fallback_s=30)
    assert busy.seconds == 76 and busy.basis.startswith("drain (last measured) 20.0s + boot")
    # A stack never measured here borrows the newest measured one's times.
    t2 = Timings({"int8": StackTimes(40.0, 12.0, at=1.0), "turbo": StackTimes(90.0, 30.0, 2.0)})
    other = window_estimate(t2, "tq3-mtp-genesis", busy=False, fallback_s=30)
    assert other.seconds == 90 + 30 + int(DEFAULT_OVERHEAD_S)
    assert "of turbo: tq3-mtp-genesis not measured here" in other.basis
    # A maintenance window adds its last steps' time.
    t3 = Timings({"int8": StackTimes(40.0, 12.0)}, overhead_s=3.0, steps_s=60.0)
    assert window_estimate(t3, "int8", False, 30, steps=True).seconds == 115
    assert window_estimate(t3, "int8", False, 30).seconds == 55
    assert window_estimate(t3, None, False, 30, steps=True).seconds == 30


def test_record_swap_keeps_the_overhead_net_of_drain_boot_and_gate(lay, monkeypatch):
    drained = DrainReport("drained", 20.0, 600.0, running=2, waiting=1, front=1)
    monkeypatch.setattr(steps.time, "time", lambda: 5.0)
    record_swap(lay, "int8", boot_s=40.0, gate_s=12.0, window_s=75.5, drain=drained)
    t = read_timings(lay)
    assert t.stacks["int8"] == StackTimes(40.0, 12.0, 5.0)
    assert (t.overhead_s, t.drain_s) == (3.5, None)  # the drain's own: drain_requests writes it
    lay.timings_file.write_text("{not json")
    assert read_timings(lay) == Timings()


def test_an_idle_drain_leaves_the_last_measured_drain_as_it_was(lay):
    tx = _swap(lay)[2]
    lay.timings_file.write_text(json.dumps({"schema": Timings.schema, "drain_s": 20.0}))
    out = tx.run()
    assert out.result == "promoted" and out.drain["result"] == "idle"
    assert read_timings(lay).drain_s == 20.0


# --- the swap transaction drains first -----------------------------------------------------


def _swap(lay: Layout, **plan_kw) -> tuple[FakeHost, FakeFront, Transaction]:
    host, front, old = serving_host(lay)
    new = make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd")
    plan = make_plan(lay, new, **plan_kw)
    return host, front, Transaction(plan, lay, host, front, FakeGate(), journal(lay, plan))


def _down_at(host: FakeHost, project: str) -> float:
    return next(float(c.rsplit("t=", 1)[1]) for c in host.calls
                if c.startswith(f"down {project}"))


def test_a_swap_lets_streams_and_the_waiting_request_finish_before_the_old_stack_stops(lay):
    host, front, tx = _swap(lay)
    t0 = host.t
    host.hold("rigfleet-int8", 30.0, 40.0, 55.0)  # max_seqs 2: two stream, one waits
    out = tx.run()
    assert (out.result, out.exit) == ("promoted", EXIT_PROMOTED)
    assert host.cut == []  # nothing in flight when the old stack went down
    assert _down_at(host, "rigfleet-int8") >= t0 + 55.0
    assert front.routes[-3:-1] == ["maintenance", "maintenance"]  # 503 at once, then the rest
    assert out.drain["result"] == "drained" and out.drain["cut"] == 0
    assert (out.drain["running"], out.drain["waiting"]) == (2, 1)
    assert 55.0 <= out.drain["seconds"] <= 56.5
    line = ledger_lines(lay)[-1]
    assert line["result"] == "promoted" and line["drain"] == out.drain
    assert line["retry_after_s"] == out.retry_after_s == front.retry_after[0]
    assert json.loads(lay.state_file.read_text())["last_swap"]["drain"] == out.drain
    # The window's measured times are what the next swap's Retry-After says.
    assert read_timings(lay).drain_s == out.drain["seconds"]


def test_a_drain_past_its_timeout_cuts_and_counts_the_requests(lay):
    host, front, tx = _swap(lay, drain_timeouts={"int8": 10.0})
    t0 = host.t
    host.hold("rigfleet-int8", 300.0, 300.0, 300.0)
    out = tx.run()
    assert out.result == "promoted"
    assert out.drain["result"] == "timeout" and out.drain["cut"] == 3
    assert len(host.cut) == 3 and 10.0 <= _down_at(host, "rigfleet-int8") - t0 <= 12.0
    assert ledger_lines(lay)[-1]["drain"]["cut"] == 3


def test_retry_after_comes_from_this_hosts_last_window(lay):
    host, front, tx = _swap(lay)
    assert tx.run().result == "promoted"
    assert front.retry_after[0] == 30  # nothing measured yet: the plan's retry_after_s
    measured = read_timings(lay)
    assert "tq3-mtp-genesis" in measured.stacks
    # Back to int8: tq3's times stand in for int8's (not measured here yet).
    new = make_ref(lay, "int8", "5555eeee6666ffff")
    plan = make_plan(lay, new, plan_id="20261129T110000Z-bbbbbb")
    out = Transaction(plan, lay, host, front, FakeGate(), journal(lay, plan)).run()
    expected = window_estimate(measured, "int8", busy=False, fallback_s=30).seconds
    assert out.result == "promoted" and front.retry_after[-1] == expected == out.retry_after_s
    assert expected != 30 and abs(expected - tx.timings["window_s"]) <= 1.5


def test_a_drain_is_measured_even_when_the_swap_then_fails(lay):
    host, front, tx = _swap(lay)
    host.behaviour["tq3-mtp-genesis"] = ("die", "CUDA out of memory")
    host.hold("rigfleet-int8", 12.0)
    out = tx.run()
    assert out.result == "rolled-back" and out.drain["result"] == "drained"
    assert read_timings(lay).drain_s == out.drain["seconds"]
    assert ledger_lines(lay)[-1]["drain"] == out.drain


def test_a_stop_request_while_draining_gives_the_old_stack_back(lay):
    host, front, tx = _swap(lay)
    host.hold("rigfleet-int8", 100.0)
    calls = iter(range(1000))
    tx.interrupted = lambda: next(calls) >= 5  # type: ignore[method-assign]
    out = tx.run()
    assert (out.result, out.phase) == ("refused", "drain")
    assert front.current() == "int8/1111aaaa2222bbbb" and host.cut == []
    assert not any(c.startswith("down") for c in host.calls)
    assert out.drain["result"] == "interrupted"


def test_a_maintenance_window_drains_before_its_steps_run(lay):
    host, front, ref = serving_host(lay)
    host.hold("rigfleet-int8", 25.0)
    plan = make_plan(lay, make_ref(lay, "int8", "1111aaaa2222bbbb"),
                     plan_id="maint-20261201T100000Z-aaaaaa", gate_profile="fast")
    t0 = host.t
    out = Maintenance(lay, host, front, Journal(lay.swap_dir("j-1"), echo=None), plan).open(
        "Docker restart")
    assert out.result == "open" and host.t - t0 >= 25.0
    assert out.drain["result"] == "drained" and out.drain["cut"] == 0
    opened = ledger_lines(lay)[-1]
    assert (opened["event"], opened["result"]) == ("maintenance", "opened")
    assert opened["drain"] == out.drain


def test_a_long_drain_does_not_abandon_the_window(lay):
    from rigfleet.hostside.maintenance import window_status
    from rigfleet.hostside.records import read_holder

    host, front, ref = serving_host(lay)
    host.hold("rigfleet-int8", 500.0)
    plan = make_plan(lay, make_ref(lay, "int8", "1111aaaa2222bbbb"),
                     plan_id="maint-20261201T100000Z-bbbbbb", gate_profile="fast")
    opened_at = host.wall()
    out = Maintenance(lay, host, front, Journal(lay.swap_dir("j-2"), echo=None), plan).open(
        "Docker restart")
    assert out.drain["result"] == "drained" and host.wall() - opened_at >= 500
    # Held by the process the steps run in, however long the drain took.
    assert window_status(lay)[1] == "held"
    assert read_holder(lay.lock_dir)["alive"]


def test_a_drain_time_that_cannot_be_recorded_does_not_leave_the_front_at_503(lay, monkeypatch):
    host, front, tx = _swap(lay)
    host.hold("rigfleet-int8", 12.0)

    def full_disk(path, data, indent=2):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr("rigfleet.hostside.steps.write_json", full_disk)
    out = tx.run()
    assert (out.result, out.exit) == ("promoted", EXIT_PROMOTED)
    assert out.drain["result"] == "drained"
    assert front.current() == "tq3-mtp-genesis/3333cccc4444dddd"


def test_a_stop_request_while_draining_that_cannot_route_back_says_nothing_serves(lay):
    host, front, tx = _swap(lay)
    host.hold("rigfleet-int8", 100.0)
    calls = iter(range(1000))
    tx.interrupted = lambda: next(calls) >= 5  # type: ignore[method-assign]
    front.fail_on = "int8"                     # nginx refuses the route back
    out = tx.run()
    assert (out.result, out.phase, out.serving) == ("refused", "drain", "maintenance")
    assert out.exit == EXIT_FAILED and "could not be routed back" in out.reason
    assert "serves again" not in (lay.swap_dir(tx.plan.id) / "events.jsonl").read_text()


def test_a_503_that_cannot_be_rewritten_after_the_drain_does_not_stop_the_swap(lay):
    host, front, tx = _swap(lay)
    host.hold("rigfleet-int8", 12.0)
    said = front.maintenance

    def full_etc(message: str, retry_after_s: int, wait: bool = True) -> None:
        if not wait:  # the rest of the window, once drained: the route file on a full disk
            raise OSError(28, "No space left on device", str(lay.front_route))
        said(message, retry_after_s, wait)

    front.maintenance = full_etc  # type: ignore[method-assign]
    out = tx.run()
    assert (out.result, out.exit) == ("promoted", EXIT_PROMOTED)
    assert out.drain["result"] == "drained"


def test_a_stop_request_while_draining_on_a_full_disk_says_the_front_stays_at_503(lay):
    host, front, tx = _swap(lay)
    host.hold("rigfleet-int8", 100.0)
    calls = iter(range(1000))
    tx.interrupted = lambda: next(calls) >= 5  # type: ignore[method-assign]

    def full_etc(ref, wait: bool = True) -> None:
        raise OSError(28, "No space left on device", str(lay.front_route))

    front.serve = full_etc  # type: ignore[method-assign]
    out = tx.run()
    assert (out.result, out.phase, out.exit, out.serving) == (
        "refused", "drain", EXIT_FAILED, "maintenance")
    assert "No space left on device" in out.reason
