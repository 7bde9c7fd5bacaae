"""The rules and the page against a real Prometheus (the distribution's, on loopback): it
scrapes a stand-in exporter that says what a host with a dead engine says, evaluates
files/monitor/rules.yml, and the page's own shell command (``query.fetch_command``, the curl
calls rigfleet runs on the monitor host over SSH) reads its API; the answers render."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from monitor_tools import need

from rigfleet.monitor.page import PageInput, render
from rigfleet.monitor.query import (
    Answers,
    MonitorError,
    api_paths,
    fetch_command,
    split_answers,
)

MONITOR = Path(__file__).resolve().parents[2] / "files" / "monitor"


class Exporter(BaseHTTPRequestHandler):
    """rig1's node exporter textfile and engine /metrics in one: the engine is gone."""

    scrapes = 0

    def do_GET(self) -> None:
        Exporter.scrapes += 1
        body = ("rigfleet_engine_up 0\nrigfleet_ready 0\nrigfleet_swap_in_progress 0\n"
                "rigfleet_maintenance_window_open 0\n"
                'rigfleet_gate_tokens_per_second{stack="int8"} 41.5\n'
                'vllm:generation_tokens_total{model_name="qwen",engine="0"} '
                f"{Exporter.scrapes * 100}\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[int]:
    binary = need("prometheus", "prometheus")
    need("curl", "curl")
    exporter = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{exporter.server_address[1]}"
    shutil.copy(MONITOR / "rules.yml", tmp_path / "rules.yml")
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(tmp_path / "rules.yml")],
              "scrape_configs": [
                  {"job_name": job, "static_configs": [
                      {"targets": [target], "labels": {"instance": "rig1"}}]}
                  for job in ("node", "vllm")]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        exporter.shutdown()


def ask(port: int, now: float) -> Answers:
    paths = api_paths(now, 0.25)
    out = subprocess.run(["sh", "-c", fetch_command(paths, port=port, timeout=5)],
                         capture_output=True, text=True, timeout=60).stdout
    return split_answers("mon", paths, out)


def test_a_dead_engine_fires_and_the_page_shows_it(prometheus: int) -> None:
    answers, why = None, ""
    for _ in range(60):  # Prometheus starts, scrapes and evaluates every second
        time.sleep(0.5)
        try:
            answers = ask(prometheus, time.time())
        except MonitorError as e:  # not listening yet
            why = str(e)
            continue
        firing = [a for a in answers.alerts["data"]["alerts"] if a["state"] == "firing"]
        if any(a["labels"]["alertname"] == "RigEngineDown" for a in firing) and \
                len(answers.engine["data"]["result"]) == 1:
            break
    assert answers is not None, f"Prometheus never answered: {why}"
    alerts = {(a["labels"]["alertname"], a["labels"].get("signal"), a["state"])
              for a in answers.alerts["data"]["alerts"]}
    assert ("RigEngineDown", "process", "firing") in alerts
    # the engine's /metrics answers (up 1): only the process signal fires
    assert not any(name == "RigEngineDown" and signal == "metrics" for name, signal, _ in alerts)
    html = render(PageInput(hosts=["rig1"], monitor="mon", now=time.time(), hours=0.25,
                            answers=answers))
    assert 'data-host="rig1"' in html and "RigEngineDown" in html
    assert 'data-series="gate tokens/s (int8)"' in html
    assert 'data-series="engine tokens/s (vllm:generation_tokens_total rate)"' in html
    assert "node up" in html and "vllm up" in html
