"""Every series the rules and the dashboards read is in the metric-name contract
(tests/unit/metric_names.py); the dashboards are Grafana JSON with the datasource as an input,
and every query in them is PromQL that Prometheus' own parser takes (through promtool)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import metric_names as names
import pytest
import yaml
from monitor_tools import need

MONITOR = Path(__file__).resolve().parents[2] / "files" / "monitor"
DASHBOARDS = sorted((MONITOR / "dashboards").glob("*.json"))

_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
          "group_right", "bool", "offset", "inf", "nan"}


def series_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: strings, label matchers, durations and
    label lists taken out; what is left that is not a function, keyword or number."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b\d[\w.]*", " ", text)  # numbers, durations (offset 5m)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    found = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = m.group(0), text[m.end():].lstrip()
        if word.lower() in _WORDS or rest.startswith("("):
            continue
        found.add(word)
    return found


def test_the_extractor_finds_what_a_query_reads() -> None:
    expr = ('sum by (instance) (rate(vllm:generation_tokens_total{job="vllm"}[1m])) '
            '/ on (instance) group_left (stack) max by (instance, stack) '
            '(rigfleet_serving_info{stack="$stack"}) > bool 0 unless up offset 5m')
    assert series_names(expr) == {"vllm:generation_tokens_total", "rigfleet_serving_info", "up"}


def rule_exprs() -> list[str]:
    rules = yaml.safe_load((MONITOR / "rules.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def panel_targets(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            out.extend(inner.get("targets", []))
    return out


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in DASHBOARDS for t in panel_targets(json.loads(p.read_text()))]


def test_the_table_is_well_formed() -> None:
    for name, m in names.METRICS.items():
        assert m.name == name and m.help and m.type in ("gauge", "counter")
        assert re.fullmatch(r"(vllm:|rigfleet_)[a-z0-9_:]+", name), name
        assert m.type != "counter" or name.endswith("_total"), name
        assert "instance" not in m.labels and "job" not in m.labels, name
    assert all(n.startswith("node_") for n in names.NODE)


@pytest.mark.parametrize("source", ["rules", "dashboards"])
def test_every_name_used_is_in_the_contract(source: str) -> None:
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    used = set().union(*(series_names(e) for e in exprs))
    known = {*names.METRICS, *names.RECORDED, *names.BUILTIN, *names.NODE}
    unknown = sorted(used - known)
    assert not unknown, f"{source} read series outside tests/unit/metric_names.py: {unknown}"
    # and they read the contract for real: the GPU, engine and rigfleet families all appear
    assert any(n.startswith("vllm:") for n in used)
    assert any(n.startswith("rigfleet_") for n in used)


def test_the_dashboards_together_show_every_host_metric() -> None:
    """Directly or through a recording rule of rules.yml."""
    rules = yaml.safe_load((MONITOR / "rules.yml").read_text())
    recorded = {r["record"]: series_names(r["expr"]) for g in rules["groups"]
                for r in g["rules"] if "record" in r}
    used = set().union(*(series_names(e) for e in dashboard_exprs()))
    used |= set().union(*(recorded.get(n, set()) for n in used))
    missing = sorted(set(names.METRICS) - used - {"rigfleet_desired_info"})
    assert not missing, f"no dashboard panel shows {missing}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_grafana_json(path: Path) -> None:
    board = json.loads(path.read_text())
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    assert board["__inputs"][0]["pluginId"] == "prometheus"
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 39
    assert board["uid"] == f"rigfleet-{path.stem}" and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}" and t["expr"].strip()
    variables = {v["name"] for v in board["templating"]["list"]}
    for expr in (t["expr"] for t in panel_targets(board)):
        for var in re.findall(r"\$(\w+)", expr):
            assert var in variables, f"{path.name}: ${var} is not a dashboard variable"


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Prometheus' parser (promtool check rules) takes every dashboard query, the variables
    replaced by a value."""
    exprs = [re.sub(r"\$\w+", "x", e) for e in dashboard_exprs()]
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    (tmp_path / "queries.yml").write_text(yaml.safe_dump(rules))
    proc = subprocess.run([need("promtool", "prometheus"), "check", "rules", "queries.yml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
