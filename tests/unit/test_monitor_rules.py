"""The monitor's rules and scrape configuration through Prometheus' own checker (promtool):
rules.yml loads, every alert's firing and quiet cases in rules.test.yml hold, and a
configuration rendered as the monitor role renders one passes ``promtool check config``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import metric_names as names
import yaml
from monitor_tools import need

MONITOR = Path(__file__).resolve().parents[2] / "files" / "monitor"


def promtool(*args: str, cwd: Path = MONITOR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need("promtool", "prometheus"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_rules_check() -> None:
    proc = promtool("check", "rules", "rules.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_unit_tests() -> None:
    proc = promtool("test", "rules", "rules.test.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    """The promtool run can fail: the same tests with one alert expected quiet do."""
    shutil.copy(MONITOR / "rules.yml", tmp_path / "rules.yml")
    text = (MONITOR / "rules.test.yml").read_text()
    broken = text.replace("summary: \"rig1: the serving engine is not running\"",
                          "summary: \"rig1: something else\"", 1)
    assert broken != text
    (tmp_path / "rules.test.yml").write_text(broken)
    proc = promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert proc.returncode != 0


def test_every_alert_of_the_contract_is_defined_and_tested() -> None:
    rules = yaml.safe_load((MONITOR / "rules.yml").read_text())
    defined = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    assert defined == set(names.ALERTS)
    assert recorded == set(names.RECORDED)
    tests = yaml.safe_load((MONITOR / "rules.test.yml").read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    quiet = {c["alertname"] for t in tests for c in t["alert_rule_test"] if not c["exp_alerts"]}
    assert fired == set(names.ALERTS)
    assert quiet == set(names.ALERTS)


def test_engine_down_is_raised_within_two_scrapes_and_one_evaluation() -> None:
    """The contract: scrape and evaluation every 15 s, RigEngineDown's ``for`` at most 15 s."""
    rules = yaml.safe_load((MONITOR / "rules.yml").read_text())
    fors = [r.get("for", "0s") for g in rules["groups"] for r in g["rules"]
            if r.get("alert") == "RigEngineDown"]
    assert fors and all(re.fullmatch(r"(0|15)s", f) for f in fors), fors


def test_rendered_config_passes_promtool(tmp_path: Path) -> None:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(MONITOR),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    shutil.copy(MONITOR / "rules.yml", tmp_path / "rules.yml")
    key = tmp_path / "scrape-key"
    key.write_text("not-a-real-key\n")
    text = env.get_template("prometheus-check.yml.j2").render(
        rules_file=str(tmp_path / "rules.yml"), key_file=str(key), scheme="https",
        hosts=[{"name": "rig1", "address": "10.0.0.11", "port": 8443},
               {"name": "rig2", "address": "10.0.0.12", "port": 8443}],
        balancers=[{"name": "lb1", "address": "10.0.0.2", "port": 8404}])
    (tmp_path / "prometheus.yml").write_text(text)
    config = yaml.safe_load(text)
    assert [j["job_name"] for j in config["scrape_configs"]] == [*names.JOBS, "balancer"]
    proc = promtool("check", "config", str(tmp_path / "prometheus.yml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
