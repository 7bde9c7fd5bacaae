"""``rigfleet status --html``: the monitor's Prometheus asked over SSH (a fake remote with
canned API answers), the page rendered from them (hosts, tokens/s lines, alerts, nothing
outside the file), the CLI's errors, and the page opened in headless Chromium."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from monitor_tools import Dom, chromium_open

from rigfleet.inventory import InventoryHost
from rigfleet.monitor import query
from rigfleet.monitor.page import PageInput, matrix, render
from rigfleet.monitor.query import Answers, MonitorError, fetch, monitor_host
from rigfleet.ssh import HostUnreachable
from rigfleet.status import cli as status_cli

NOW = 1_796_000_000.0
HOURS = 2.0
RIG1 = InventoryHost("rig1", ("gpu_hosts",), {})
RIG2 = InventoryHost("rig2", ("gpu_hosts",), {})
MON = InventoryHost("lb1", ("balancers", "monitors"), {})


def ok(data: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": data}


def points(start: float, values: list[float], step: float = 60) -> list[list[Any]]:
    return [[start + i * step, str(v)] for i, v in enumerate(values)]


T0 = NOW - HOURS * 3600
GATE = ok({"resultType": "matrix", "result": [
    {"metric": {"instance": "rig1", "stack": "int8"},
     "values": points(T0, [41.5] * 60 + [35.0] * 60)},
    {"metric": {"instance": "rig2", "stack": "tq3-mtp-genesis"},
     "values": points(T0 + 1800, [52.0] * 90)},
]})
ENGINE = ok({"resultType": "matrix", "result": [
    {"metric": {"instance": "rig1"}, "values": points(T0, [30.0 + (i % 7) for i in range(120)])},
    {"metric": {"instance": "rig9"}, "values": points(T0, [10.0, "NaN", 12.0])},  # type: ignore[list-item]
]})
UP = ok({"resultType": "vector", "result": [
    {"metric": {"instance": "rig1", "job": "node"}, "value": [NOW, "1"]},
    {"metric": {"instance": "rig1", "job": "vllm"}, "value": [NOW, "1"]},
    {"metric": {"instance": "rig2", "job": "node"}, "value": [NOW, "1"]},
    {"metric": {"instance": "rig2", "job": "vllm"}, "value": [NOW, "0"]},
    {"metric": {"instance": "lb1", "job": "balancer"}, "value": [NOW, "1"]},
]})
ALERTS = ok({"alerts": [
    {"labels": {"alertname": "RigThroughputBelowBaseline", "instance": "rig1", "stack": "int8",
                "severity": "warning"},
     "annotations": {"summary": "rig1 (int8): throughput 16% below baseline"},
     "state": "firing", "activeAt": "2026-12-03T22:10:00.123Z", "value": "1.6e-01"},
    {"labels": {"alertname": "RigEngineDown", "instance": "rig2", "severity": "critical",
                "signal": "metrics"},
     "annotations": {"summary": "rig2: the engine's /metrics does not answer <b>"},
     "state": "pending", "activeAt": "2026-12-03T23:50:00Z", "value": "0e+00"},
]})
ANSWERS = Answers(gate=GATE, engine=ENGINE, up=UP, alerts=ALERTS)


def page(answers: Answers = ANSWERS) -> str:
    return render(PageInput(hosts=["rig1", "rig2"], monitor="lb1", now=NOW, hours=HOURS,
                            answers=answers, others=["lb1"]))


def check_dom(dom: Dom) -> None:
    """What both the rendered text and Chromium's DOM must show."""
    figures = {a.get("data-host") for a in dom.all("figure")}
    assert figures == {"rig1", "rig2", "rig9"}
    series = [a.get("data-series") for a in dom.all("polyline")]
    assert series.count("gate tokens/s (int8)") == 1
    assert series.count("gate tokens/s (tq3-mtp-genesis)") == 1
    assert series.count("engine tokens/s (vllm:generation_tokens_total rate)") == 2  # rig1, rig9
    assert len(dom.all("svg")) == 3
    text = " ".join(dom.text)
    for name in ("RigThroughputBelowBaseline", "RigEngineDown", "rig1", "rig2"):
        assert name in text
    assert "rig9 (not in the inventory)" in text
    assert "lb1 (not in the inventory)" not in text
    assert "does not answer <b>" in text  # escaped, shown as text


def test_the_page_shows_hosts_lines_and_alerts() -> None:
    html = page()
    check_dom(Dom(html))
    # Firing before pending; the gate's line is a step (each change drawn at its time).
    assert html.index("RigThroughputBelowBaseline") < html.index("RigEngineDown")
    assert "vllm down" in html and "node up" in html


def test_the_page_is_self_contained() -> None:
    html = page()
    assert "<script" not in html.lower()
    for attr in ("src", "href"):
        assert not re.search(rf"\b{attr}\s*=", html), attr
    urls = set(re.findall(r"https?://[^\s\"'<>]+", html))
    assert urls == {"http://www.w3.org/2000/svg"}  # the SVG namespace, not a fetch


def test_no_data_says_so_and_no_alerts_says_so() -> None:
    empty = ok({"resultType": "matrix", "result": []})
    html = page(Answers(gate=empty, engine=empty, up=ok({"resultType": "vector", "result": []}),
                        alerts=ok({"alerts": []})))
    dom = Dom(html)
    assert {a.get("data-host") for a in dom.all("figure")} == {"rig1", "rig2"}
    assert not dom.all("polyline")
    assert html.count("no tokens/s recorded in this window") == 2
    assert "No alert pending or firing." in html and "no scrape target" in html


def test_a_target_of_no_rig_gets_no_figure() -> None:
    """The distribution's default config scraped Prometheus itself as localhost:9090 before
    the monitor role wrote rigfleet's: its ``up`` is no host of the fleet."""
    up = ok({"resultType": "vector", "result": [
        *UP["data"]["result"],
        {"metric": {"instance": "localhost:9090", "job": "prometheus"}, "value": [NOW, "1"]}]})
    html = page(Answers(gate=GATE, engine=ENGINE, up=up, alerts=ALERTS))
    assert {a.get("data-host") for a in Dom(html).all("figure")} == {"rig1", "rig2", "rig9"}


def test_matrix_leaves_out_what_cannot_be_drawn() -> None:
    got = matrix(ENGINE, "instance")
    assert [v for _, v in got[("rig9",)]] == [10.0, 12.0]


def test_lines_stay_inside_the_plot() -> None:
    html = page()
    for pts in re.findall(r'points="([^"]+)"', html):
        for pair in pts.split():
            x, y = map(float, pair.split(","))
            assert 56 <= x <= 640 - 12 and 12 <= y <= 200 - 26, pair


# --- asking the monitor ----------------------------------------------------------------------


FAKE_CURL = """#!/usr/bin/env python3
import json, os, sys
from urllib.parse import parse_qs, urlsplit
url = urlsplit(sys.argv[-1])
routes = json.load(open(os.environ["FAKE_ROUTES"]))
with open(os.environ["FAKE_ROUTES"] + ".log", "a") as log:
    log.write(sys.argv[-1] + "\\n")
key = url.path + "|" + parse_qs(url.query).get("query", [""])[0]
body = routes.get(key, routes.get(url.path))
if body is None:
    sys.stderr.write(f"curl: (7) Failed to connect to {url.hostname} port {url.port} after "
                     "0 ms: Couldn't connect to server\\n")
    sys.exit(7)
sys.stdout.write(body)
"""


class ShellRemote:
    """Runs the command in a local shell whose ``curl`` answers from ``routes`` (API path, or
    ``path|query``, -> body) and logs the URLs it was asked: what the monitor host's shell
    would do with the same command."""

    def __init__(self, tmp: Path, routes: dict[str, str] | None = None,
                 raise_: Exception | None = None) -> None:
        (tmp / "bin").mkdir()
        curl = tmp / "bin" / "curl"
        curl.write_text(FAKE_CURL)
        curl.chmod(0o755)
        self.routes_file = tmp / "routes.json"
        self.routes_file.write_text(json.dumps(routes or {}))
        self.env = {"PATH": f"{tmp / 'bin'}:/usr/bin:/bin", "FAKE_ROUTES": str(self.routes_file)}
        self.raise_ = raise_
        self.commands: list[str] = []

    @property
    def asked(self) -> list[str]:
        log = Path(f"{self.routes_file}.log")
        return log.read_text().splitlines() if log.exists() else []

    def run(self, host: InventoryHost, command: str, *, timeout: float = 120,
            stdin: bytes = b"") -> tuple[int, str]:
        self.commands.append(command)
        if self.raise_:
            raise self.raise_
        proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                              env=self.env, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr


def all_routes() -> dict[str, str]:
    return {f"/api/v1/query_range|{query.GATE_QUERY}": json.dumps(GATE),
            f"/api/v1/query_range|{query.ENGINE_QUERY}": json.dumps(ENGINE),
            "/api/v1/query": json.dumps(UP), "/api/v1/alerts": json.dumps(ALERTS)}


def test_fetch_asks_prometheus_on_the_monitors_loopback(tmp_path: Path) -> None:
    remote = ShellRemote(tmp_path, all_routes())
    got = fetch(remote, MON, now=NOW, hours=HOURS)
    assert got == ANSWERS
    assert len(remote.commands) == 1  # one SSH round trip
    urls = remote.asked
    assert [urlsplit(u).netloc for u in urls] == ["127.0.0.1:9090"] * 4
    q = [parse_qs(urlsplit(u).query) for u in urls]
    assert q[0]["query"] == [query.GATE_QUERY] and q[1]["query"] == [query.ENGINE_QUERY]
    assert q[0]["start"] == [f"{NOW - 7200:.0f}"] and q[0]["end"] == [f"{NOW:.0f}"]
    assert q[0]["step"] == ["30"]
    assert urlsplit(urls[3]).path == "/api/v1/alerts"
    assert "vllm:generation_tokens_total" in unquote(urls[1])


def test_prometheus_not_running_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MonitorError) as e:
        fetch(ShellRemote(tmp_path), MON, now=NOW, hours=HOURS)
    msg = str(e.value)
    assert msg.startswith("monitor lb1: Prometheus /api/v1/query_range: not a JSON answer")
    assert "Couldn't connect" in msg and "127.0.0.1:9090" in msg


def test_a_prometheus_error_answer_is_quoted(tmp_path: Path) -> None:
    bad = json.dumps({"status": "error", "errorType": "bad_data",
                      "error": "invalid parameter \"query\""})
    with pytest.raises(MonitorError, match=r"answered 'invalid parameter \"query\"'"):
        fetch(ShellRemote(tmp_path, {**all_routes(), "/api/v1/query_range|" + query.GATE_QUERY:
                                     bad}), MON, now=NOW, hours=HOURS)


def test_an_unreachable_monitor_names_it(tmp_path: Path) -> None:
    with pytest.raises(MonitorError, match="^monitor lb1: lb1: no route"):
        fetch(ShellRemote(tmp_path, raise_=HostUnreachable("lb1: no route")), MON, now=NOW,
              hours=HOURS)


def test_no_monitor_host_says_what_to_add() -> None:
    with pytest.raises(MonitorError) as e:
        monitor_host([RIG1, RIG2], "inventory/home.py")
    assert str(e.value).startswith("inventory inventory/home.py: groups: no host in group "
                                   "'monitors'; allowed: a monitor host in group 'monitors'")
    assert monitor_host([RIG1, MON], "inv.py") is MON


# --- the command -----------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rigfleet")
    status_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["status", "--inventory", "inv.py", *argv])


def test_status_html_writes_the_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("rigfleet.inventory.load_inventory", lambda path: [RIG1, RIG2, MON])
    monkeypatch.setattr("rigfleet.monitor.query.fetch", lambda *a, **kw: ANSWERS)
    monkeypatch.setattr(status_cli, "fleet_status",
                        lambda *a, **kw: pytest.fail("--html probes no GPU host"))
    out = tmp_path / "fleet.html"
    assert status_cli.run(parse("--html", str(out), "--hours", "2", "--limit", "rig1")) == 0
    dom = Dom(out.read_text())
    assert {a.get("data-host") for a in dom.all("figure")} == {"rig1", "rig9"}
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {out}: 1 host(s), 2 alert(s), last 2 h, from Prometheus on lb1")


def test_status_html_without_a_monitor(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("rigfleet.inventory.load_inventory", lambda path: [RIG1, RIG2])
    out = tmp_path / "fleet.html"
    assert status_cli.run(parse("--html", str(out))) == status_cli.EXIT_ERROR
    err = " ".join(capsys.readouterr().err.split())
    assert "inventory inv.py: groups: no host in group 'monitors'" in err
    assert not out.exists()


def test_html_and_json_together_is_a_usage_error() -> None:
    from rigfleet.cli import main
    assert main(["status", "--inventory", "inv.py", "--html", "x.html", "--json"]) == 2


def test_hours_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse("--html", "x.html", "--hours", "0")
    assert e.value.code == 2
    assert "--hours: 0; allowed: 0.25 to 720" in capsys.readouterr().err


# --- a real browser --------------------------------------------------------------------------


def test_the_page_in_headless_chromium(tmp_path: Path) -> None:
    dom, console = chromium_open(tmp_path, page())
    assert not console, console
    check_dom(Dom(dom))


def test_chromium_reports_what_the_console_says(tmp_path: Path) -> None:
    """The console check above can fail: a page that logs an error is caught."""
    bad = page().replace("</body>", "<script>console.error('broken page')</script></body>")
    _, console = chromium_open(tmp_path, bad)
    assert any("broken page" in line for line in console), console


def test_timeout_must_be_positive_and_curl_keeps_a_fraction(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--timeout 0`` (or -1, nan) was accepted and ``--timeout 0.5`` reached curl as
    ``--max-time 0``, which is no limit at all."""
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit) as e:
            parse("--html", "x.html", "--timeout", bad)
        assert e.value.code == 2
        assert f"argument --timeout: {bad!r}: allowed: a number > 0" in capsys.readouterr().err
    assert parse("--timeout", "0.5").timeout == 0.5
    command = query.fetch_command(["/api/v1/alerts"], timeout=0.5)
    assert "--max-time 0.5 " in command and "--max-time 0 " not in command
