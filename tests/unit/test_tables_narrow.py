"""Every ``rigfleet`` table at 80 columns with no terminal (a pipe, COLUMNS=80): each host's
name and its status or result are printed whole, no cell is cut ("…"), and long text ends
up wrapped or in the notes under the table, never lost; rich markup in text stays literal."""

from __future__ import annotations

import io
import re

import pytest
from bump_helpers import NEWER, bumped, hosts, write_pins
from rich.console import Console
from rich.text import Text

import rigfleet.bump.output as bump_output
from rigfleet.balancer.status import BalancerRow
from rigfleet.bench.cli import render as bench_table
from rigfleet.bump.images import VersionProbe
from rigfleet.bump.plan import build_plan
from rigfleet.bump.rollout import HostOutcome, RolloutResult, Status
from rigfleet.cli import endpoints_table, roll_table
from rigfleet.doctor.cli import Diagnosis
from rigfleet.doctor.cli import render as doctor_table
from rigfleet.doctor.evidence import Evidence
from rigfleet.doctor.rules import Verdict
from rigfleet.endpoints import EndpointCheck
from rigfleet.hostside.bench.measure import BenchResult, RunResult, ShapeResult
from rigfleet.hostside.bench.report import Entry
from rigfleet.status.cli import render_balancers, render_table
from rigfleet.status.rows import StatusRow
from rigfleet.tables import Table

LONG = "rig-livingroom-left-x670e"  # a long host name
ERROR = ("ssh: connect to host 192.168.1.41 port 22: Connection timed out after 20 s "
         "(is the host up? [check] its address in the inventory)")


def narrow(table: Table, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    buf = io.StringIO()
    console = Console(file=buf)  # not a terminal: rich's width comes from COLUMNS
    assert console.width == 80 and not console.is_terminal
    table.print(console)
    text = buf.getvalue()
    assert "…" not in text, text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    return text


def whole(text: str, *words: str) -> None:
    """Each word on one line of ``text`` (not folded)."""
    for w in words:
        assert re.search(rf"(^|\s){re.escape(w)}(\s|:|$)", text, re.M), (w, text)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_endpoints(monkeypatch):
    rows = [EndpointCheck(LONG, "https://rig-livingroom-left-x670e.lan:8000", 200,
                          "qwen3.6-27b-autoround", "The capital of France is Paris. " * 3, 0.42),
            EndpointCheck("rig-b", "http://192.168.1.42:8000", "down", "", ERROR, 20.0)]
    text = narrow(endpoints_table(rows, "serving endpoints (inventory/home.py)"), monkeypatch)
    whole(text, LONG, "rig-b", "200", "down")
    assert "(is the host up? [check] its address" in flat(text)  # literal, not markup


def test_roll(monkeypatch):
    result = RolloutResult({
        LONG: HostOutcome(LONG, Status.MAINTAINED, 1, gate="pass", reason="recreated and "
                          "verified after: NVIDIA driver 590 install; reboot", seconds=124.0,
                          serving="int8/1942196a21dd6552"),
        "rig-b": HostOutcome("rig-b", Status.NOT_ATTEMPTED, 2,
                             reason="1 host(s) failed (--max-failures 1)")}, None, 130.0)
    text = narrow(roll_table(result), monkeypatch)
    whole(text, LONG, "rig-b", "maintained", "not attempted")
    assert "rig-b: 1 host(s) failed (--max-failures 1)" in flat(text)


def test_status_and_balancers(monkeypatch):
    rows = [StatusRow(LONG, True, "tq3-mtp-genesis", "sha256:" + "a" * 64, "c" * 40, "r" * 40,
                      "pass", "2026-12-01T10:00:00+00:00",
                      drift=["card 0 power limit 200 W, inventory 290 W"],
                      throughput={"narrative": 89.4, "code": 119.0, "result": "pass"}),
            StatusRow("rig-b", False, error=ERROR)]
    text = narrow(render_table(rows), monkeypatch)
    whole(text, LONG, "rig-b", "tq3-mtp-genesis", "unreachable")
    assert ERROR in flat(text)
    lbs = [BalancerRow("lb1-basement", "http://192.168.1.50:8080", "tq3-mtp-genesis", [LONG],
                       [("rig-b", "L4 timeout")])]
    text = narrow(render_balancers(lbs), monkeypatch)
    whole(text, "lb1-basement", "tq3-mtp-genesis", "1/2")


def test_doctor(monkeypatch):
    ok = Diagnosis(LONG, "tq3-mtp-genesis", evidence=Evidence(LONG, "tq3-mtp-genesis"),
                   verdict=Verdict(70.0, 89.2, "baseline", 88.0, 2,
                                   reasons=["70.0 tok/s is below its baseline 89.2"]))
    text = narrow(doctor_table([ok, Diagnosis("rig-b", error=ERROR)], "rigfleet doctor"),
                  monkeypatch)
    whole(text, LONG, "rig-b", "slow", "error")
    assert ERROR in flat(text)


def _run(tok_s: float) -> RunResult:
    return RunResult("narrative", 200, 0.5 + 1000 / tok_s, 0.5, 1000)


def test_bench(monkeypatch):
    shapes = {"narrative": ShapeResult("narrative", [_run(88.0)]),
              "code": ShapeResult("code", [_run(118.0)])}
    entries = [Entry(LONG, "tq3-mtp-genesis", BenchResult("http://x", shapes=shapes),
                     reference={"narrative": 89.2, "code": 119.1}),
               Entry("rig-b", "tq3-mtp-genesis", BenchResult("http://y"), error=ERROR)]
    text = narrow(bench_table(entries), monkeypatch)
    whole(text, LONG, "rig-b")
    assert ERROR in flat(text)


def test_bump_tables(monkeypatch, tmp_path):
    buf = io.StringIO()
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(bump_output, "console", Console(file=buf))
    pins = write_pins(tmp_path)
    fleet = hosts("int8", "int8", "tq3-mtp-genesis", canary="host2")
    plan = build_plan(fleet, {"host3": ERROR}, pins, bumped(pins, NEWER), batch_size=1,
                      max_failures=1)
    bump_output.print_plan(plan, {}, VersionProbe(None, "unknown"))
    result = RolloutResult({
        "host1": HostOutcome("host1", Status.PROMOTED, 1, True, gate="pass 8/8"),
        "host2": HostOutcome("host2", Status.FAILED, 0, False, reason=ERROR,
                             gate="fail: 2 of 8 checks failed"),
        "host3": HostOutcome("host3", Status.SKIPPED, None, False, reason=ERROR)}, None, 300.0)
    bump_output.print_result(result, tmp_path / "logs")
    text = buf.getvalue()
    assert "…" not in text and max(len(x.rstrip()) for x in text.splitlines()) <= 80, text
    whole(text, "canary", "host1", "host2", "host3", "promoted", "failed", "skipped")
    assert ERROR in flat(text)


def test_keys_stay_whole_when_nothing_else_fits(monkeypatch):
    t = Table("t", ["host", "status", *"abcdef"])
    t.row(LONG, Text("[red]x[/red]"), *(ch * 40 for ch in "qwjkyz"))
    text = narrow(t, monkeypatch)
    whole(text, LONG)
    assert "[red]x[/red]" in text  # markup in a cell is text
    for ch in "qwjkyz":  # every character of every cell is printed: wrapped, or in a note
        assert text.count(ch) == 40, (ch, text)
    assert f"{LONG}: f: " in text  # the right-most columns moved under the table
