"""Issue 21 on the simulated fleet: the monitor on lb1 (inventory group ``monitors``) scrapes
every GPU host's node exporter (with the GPU and rigfleet textfiles) and engine through its
front with the key, and the balancer; nothing new listens beyond loopback. An engine killed on
the last fleet host raises RigEngineDown on Prometheus and Alertmanager within the rules'
bound and it clears once the supervisor recreated the stack; ``rigfleet status --html`` drawn
from the live monitor meanwhile shows it in Chromium. The swaps earlier modules ran raised
nothing. The real gate on the first fleet host, its cards at their minimum cap, fails on
throughput and RigThroughputBelowBaseline fires from its record; the gate at the usual cap
clears it. pins.yaml moving under a host (the monitor converged with a copy) makes RigPinsDiffer
pending for that host alone. (The second converge changing nothing is test_02's ``--dry``.)

    RIGFLEET_TESTBED_INSTANCE=4 RIGFLEET_TESTBED_HOSTS=1 RIGFLEET_KEEP_TESTBED=1 \\
        .venv/bin/python -m pytest tests/e2e/test_18_metrics.py -x -v
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from e2e_fleet import BIN, EXTRAS, INVENTORY, REPO, STATE, ledger, read_state, run, wait_for
from test_04_swap import settle

sys.path.insert(0, str(REPO / "tests" / "unit"))
from monitor_tools import Dom, chromium_open

from rigfleet.hostside.front import READY_PATH
from rigfleet.hostside.layout import BUNDLE_PATH, Layout
from rigfleet.monitor.query import ENGINE_QUERY
from rigfleet.scrape import (
    ALERTMANAGER_PORT,
    ENGINE_PATH,
    EVALUATION_INTERVAL_S,
    KEY_FILE,
    NODE_PATH,
    SCRAPE_INTERVAL_S,
)
from roles.monitor import DESIRED_FILE

# The alert rules as the monitor loads them (an alert may have several rules: RigEngineDown).
ALL_RULES = [r for g in yaml.safe_load((REPO / "files" / "monitor" / "rules.yml").read_text())[
    "groups"] for r in g["rules"] if "alert" in r]
RULES = {r["alert"]: r for r in ALL_RULES}
HOST = Layout()
# The host's metrics timer writes the textfiles every scrape interval too (roles/exporter.py).
TEXTFILE_EVERY_S = SCRAPE_INTERVAL_S
# What the bounds below leave for the clocks' own slop: the timer's AccuracySec (1 s), the
# metrics command's run (docker ps, nvidia-smi), a scrape's and an evaluation's own duration.
SLACK_S = 5


def for_s(rule: dict) -> float:
    """A rule's ``for:`` in seconds (``0s``, ``15s``, ``1m``, ``30m``)."""
    m = re.fullmatch(r"(\d+)([smh])", str(rule.get("for", "0s")))
    assert m, rule.get("for")
    return int(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2]]


def engine_down_bound_s() -> float:
    """Kill -> RigEngineDown firing, at the latest: from the host's record, the textfile timer
    plus the node scrape plus one evaluation (two scrape intervals plus one evaluation) plus
    its ``for:``; from the monitor's side, the failed engine scrape plus one evaluation plus
    its ``for:``. It fires on whichever comes first."""
    by_signal = {r["labels"]["signal"]: for_s(r) for r in ALL_RULES
                 if r["alert"] == "RigEngineDown"}
    return min(TEXTFILE_EVERY_S + SCRAPE_INTERVAL_S + EVALUATION_INTERVAL_S
               + by_signal["process"],
               SCRAPE_INTERVAL_S + EVALUATION_INTERVAL_S + by_signal["metrics"])


# A gate's record (last.json written) -> the throughput alert fires (or clears), at the latest:
# the textfile timer, the node scrape, one evaluation, the rule's for:.
RECORD_SEEN_S = (TEXTFILE_EVERY_S + SCRAPE_INTERVAL_S + EVALUATION_INTERVAL_S
                 + for_s(RULES["RigThroughputBelowBaseline"]))
DOWN_WITHIN_S = engine_down_bound_s() + SLACK_S

pytestmark = pytest.mark.skipif(not EXTRAS, reason="the monitor runs on lb1 (the extras)")


@pytest.fixture(scope="module")
def fleet(testbed, converged):
    for host in testbed.hosts:
        settle(host, testbed.api_key)
    yield testbed


def prom(lb, path: str, **params: str) -> dict:
    """Prometheus' HTTP API on the monitor host (loopback only), as JSON."""
    args = " ".join(f"--data-urlencode {shlex.quote(f'{k}={v}')}" for k, v in params.items())
    rc, out = lb.sh(f"curl -sS -G http://127.0.0.1:9090{path} {args}", timeout=30)
    assert rc == 0, out
    data = json.loads(out)
    assert data["status"] == "success", data
    return data["data"]


def query(lb, expr: str) -> dict[tuple[str, str], float]:
    """``expr``'s instant vector as {(job, instance): value}."""
    return {(r["metric"].get("job", ""), r["metric"].get("instance", "")): float(r["value"][1])
            for r in prom(lb, "/api/v1/query", query=expr)["result"]}


def targets(lb) -> dict[tuple[str, str], str]:
    """Every active target's (job, instance) -> health (up, down, unknown)."""
    return {(t["labels"]["job"], t["labels"]["instance"]): t["health"]
            for t in prom(lb, "/api/v1/targets", state="active")["activeTargets"]}


def listening(host) -> list[str]:
    """Local addresses of the host's listening TCP sockets."""
    rc, out = host.sh("ss -Hltn | awk '{print $4}'")
    assert rc == 0, out
    return out.split()


def test_the_monitor_scrapes_every_host_with_the_key(fleet):
    lb = fleet.balancer
    want = {(job, h.name) for h in fleet.hosts for job in ("node", "vllm")}
    want |= {("balancer", lb.name), ("monitor-node", lb.name), ("prometheus", lb.name)}
    seen = wait_for(lambda: (t := targets(lb)) and all(t.get(w) == "up" for w in want) and t,
                    90, f"every target up: {sorted(want)}")
    assert set(seen) == want, seen
    hosts = {h.name for h in fleet.hosts}
    # The textfiles ride on each host's node exporter; the engine's own names on its job. A
    # host's textfile names its stack from the timer's next run after the stack serves: each
    # series is there within a timer period and a scrape (right after a fresh converge too).
    for expr in ("rigfleet_gpu_scrape_ok == 1", "rigfleet_facts_timestamp_seconds",
                 "rigfleet_serving_info", "rigfleet_engine_up == 1",
                 'rigfleet_gpu_throttle{reason="sw_power_cap"}',
                 "node_textfile_scrape_error == 0", "vllm:num_requests_running"):
        wait_for(lambda e=expr: hosts <= {i for _, i in query(lb, e)},
                 TEXTFILE_EVERY_S + SCRAPE_INTERVAL_S + SLACK_S,
                 f"{expr} for {sorted(hosts)}")
    per_card = query(lb, "count by (instance) (rigfleet_gpu_power_watts)")
    assert {i: v for (_, i), v in per_card.items()} == {
        h.name: (1.0 if h is fleet.single else 2.0) for h in fleet.hosts}
    desired = prom(lb, "/api/v1/query", query="rigfleet_desired_info")["result"]
    assert {r["metric"]["host"] for r in desired} == hosts
    # Both sides of the "pins differ" join carry its labels (earlier tests may have moved a
    # host's pins since the monitor was converged, so their values are not compared here).
    for r in prom(lb, "/api/v1/query", query="rigfleet_serving_info")["result"]:
        m = r["metric"]
        assert m["stack"] and m["image_digest"].startswith("sha256:") and m["model_revision"], m


def test_nothing_new_is_exposed(fleet):
    lb, key = fleet.balancer, fleet.api_key
    ports = {"9090", "9093", "9094", "9100"}
    for host in (lb, *fleet.hosts):
        open_ = [a for a in listening(host) if a.rsplit(":", 1)[1] in ports]
        assert open_ and all(a.startswith("127.0.0.1:") for a in open_), (host.name, open_)
    assert not [a for a in listening(lb) if a.endswith(":9094")]       # no cluster port
    rc, out = lb.sh(f"stat -c '%U:%G %a' {KEY_FILE}")
    assert (rc, out.strip()) == (0, "root:prometheus 640"), out
    rc, out = lb.sh("grep -rl " + shlex.quote(key) + " /etc/prometheus /var/lib/prometheus "
                    "/etc/default 2>/dev/null | grep -vx " + shlex.quote(KEY_FILE))
    assert rc == 1 and out == "", f"the key is in {out}"
    for host in fleet.hosts:
        for path in (NODE_PATH, ENGINE_PATH):
            try:
                with host.urlopen(f"{host.front_url}{path}", timeout=10) as answer:
                    raise AssertionError(f"{host.name}{path}: {answer.status} without the key")
            except urllib.error.HTTPError as e:
                assert e.code == 401 and b"node_" not in e.read(), (host.name, path)
        req = urllib.request.Request(f"{host.front_url}{NODE_PATH}",
                                     headers={"Authorization": f"Bearer {key}"})
        with host.urlopen(req, timeout=10) as answer:
            assert b"rigfleet_gpu_scrape_ok 1" in answer.read()
        with host.urlopen(f"{host.front_url}{READY_PATH}", timeout=10) as answer:
            assert answer.read() == b""                                 # still says nothing


def test_alertmanager_sends_where_the_operators_file_says_and_shows_no_credential(
        fleet, converged):
    """Host data monitor_alertmanager_file: Alertmanager runs with the operator's receivers;
    the file is Alertmanager's to read alone; its token is in no output of the converge."""
    lb = fleet.balancer
    own = (STATE / "secrets" / "alertmanager.yml").read_text()
    token = re.search(r"credentials: (\S+)", own)[1]
    rc, out = lb.sh("stat -c '%U:%G %a' /etc/prometheus/alertmanager.yml")
    assert (rc, out.strip()) == (0, "root:prometheus 640"), out
    rc, out = lb.sh(f"curl -sS http://127.0.0.1:{ALERTMANAGER_PORT}/api/v2/status", timeout=30)
    assert rc == 0, out
    loaded = json.loads(out)["config"]["original"]
    assert "receiver: testbed-ops" in loaded and token not in loaded, loaded
    assert token not in converged.stdout + converged.stderr


def alerts_now(lb, name: str, instance: str, *states: str) -> list[dict]:
    """Prometheus' pending/firing alerts named ``name`` on ``instance`` (any state by default)."""
    return [a for a in prom(lb, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == name and a["labels"].get("instance") == instance
            and (not states or a["state"] in states)]


def alertmanager(lb, name: str, instance: str) -> list[dict]:
    """Alertmanager's active alerts named ``name`` on ``instance`` (its v2 API, loopback)."""
    rc, out = lb.sh(f"curl -sS http://127.0.0.1:{ALERTMANAGER_PORT}/api/v2/alerts", timeout=30)
    assert rc == 0, out
    return [a for a in json.loads(out) if a["labels"].get("alertname") == name
            and a["labels"].get("instance") == instance and a["status"]["state"] == "active"]


def raw(lb, selector: str, seconds: float) -> list[tuple[dict, list[tuple[float, float]]]]:
    """Every stored sample of ``selector`` over the last ``seconds``: (labels, [(t, v)])."""
    data = prom(lb, "/api/v1/query", query=f"{selector}[{int(seconds) + 1}s]")
    return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]])
            for r in data["result"]]


def firing_at(lb, name: str, instance: str, seconds: float, **labels: str) -> list[float]:
    """When Prometheus evaluated ``name`` on ``instance`` as firing (its ALERTS series)."""
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    sel = f'ALERTS{{alertname="{name}",instance="{instance}",alertstate="firing"{extra}}}'
    return sorted(t for _, values in raw(lb, sel, seconds) for t, _ in values)


def write_page(tmp_path: Path) -> tuple[str, Dom]:
    """``rigfleet status --html`` from the live monitor, as headless Chromium reads it."""
    out = tmp_path / "fleet.html"
    (tmp_path / "browser").mkdir(exist_ok=True)
    proc = run([str(BIN / "rigfleet"), "status", "--inventory", str(INVENTORY), "--html",
                str(out), "--hours", "0.5"], timeout=180)
    assert "wrote " in proc.stdout, proc.stdout + proc.stderr
    dom, console = chromium_open(tmp_path / "browser", out.read_text())
    assert not console, console
    return dom, Dom(dom)


def figure_of(dom: str, host: str) -> str:
    """The HTML of one host's figure in the page."""
    m = re.search(rf'<figure [^>]*data-host="{re.escape(host)}".*?</figure>', dom, re.S)
    assert m, f"no figure for {host}"
    return m[0]


def test_a_killed_engine_raises_engine_down_until_the_supervisor_recreated_it(fleet, tmp_path):
    """Kill -> RigEngineDown firing within ``engine_down_bound_s`` (measured on Prometheus'
    own evaluation times), on Alertmanager too and on the page; firing all through the
    supervisor's recreation (it holds the host lock, and is no swap); gone once it serves."""
    lb, host = fleet.balancer, fleet.fleet[-1]
    up = f'up{{job="vllm",instance="{host.name}"}}'
    wait_for(lambda: query(lb, up).get(("vllm", host.name)) == 1.0, 60, f"{up} == 1")
    wait_for(lambda: not alerts_now(lb, "RigEngineDown", host.name), 60,
             f"no RigEngineDown on {host.name} before the kill")
    recreations = f'rigfleet_supervisor_recreations_total{{instance="{host.name}"}}'
    before = query(lb, recreations)[("node", host.name)]
    # The page draws an engine line from two scrapes of its counter: on a fresh fleet, the
    # killed engine's must be in before the kill.
    names = {h.name for h in fleet.hosts}
    wait_for(lambda: names <= {i for _, i in query(lb, ENGINE_QUERY)},
             2 * SCRAPE_INTERVAL_S + SLACK_S, f"{ENGINE_QUERY} for {sorted(names)}")
    tmp_path.mkdir(exist_ok=True)
    killed_at = time.time()
    rc, out = host.sh(f"docker kill {host.container_of_stack}")
    assert rc == 0, out
    wait_for(lambda: alerts_now(lb, "RigEngineDown", host.name, "firing"), DOWN_WITHIN_S + 30,
             f"RigEngineDown firing on {host.name}")
    fired = [t for t in firing_at(lb, "RigEngineDown", host.name, time.time() - killed_at + 60)
             if t >= killed_at]
    assert fired and fired[0] - killed_at <= DOWN_WITHIN_S, (
        f"fired {fired[0] - killed_at if fired else None:.1f}s after the kill; bound "
        f"{engine_down_bound_s():g}s + {SLACK_S}s")
    others = [a for a in prom(lb, "/api/v1/alerts")["alerts"]
              if a["labels"].get("alertname") == "RigEngineDown"
              and a["labels"].get("instance") != host.name]
    assert not others, others
    wait_for(lambda: alertmanager(lb, "RigEngineDown", host.name), 60,
             f"RigEngineDown on {host.name} in Alertmanager")
    # The page from the live monitor: every GPU host with its tokens/s, the alert firing.
    dom, parsed = write_page(tmp_path)
    assert {a.get("data-host") for a in parsed.all("figure")} == {h.name for h in fleet.hosts}
    gated = {i for _, i in query(lb, "max_over_time(rigfleet_gate_tokens_per_second[30m])")}
    for h in fleet.hosts:
        fig = figure_of(dom, h.name)
        assert 'data-series="engine tokens/s' in fig, (h.name, fig[:500])
        assert ('data-series="gate tokens/s' in fig) is (h.name in gated), (h.name, gated)
    assert re.search(rf'<tr class="firing"><td>RigEngineDown</td><td>firing</td>'
                     rf"<td>{re.escape(host.name)}</td>", dom), dom[dom.find("<table"):][:2000]
    # Cleared once the supervisor recreated the stack (one more recreation in its ledger).
    wait_for(lambda: query(lb, up).get(("vllm", host.name)) == 1.0, 300,
             f"{up} == 1 once the supervisor recreated the stack")
    wait_for(lambda: query(lb, recreations)[("node", host.name)] == before + 1, 60,
             f"{recreations} == {before + 1:g}")
    wait_for(lambda: not alerts_now(lb, "RigEngineDown", host.name), DOWN_WITHIN_S + 15,
             f"RigEngineDown on {host.name} resolved")
    wait_for(lambda: not alertmanager(lb, "RigEngineDown", host.name), 60,
             f"RigEngineDown on {host.name} resolved in Alertmanager")
    fired = [t for t in firing_at(lb, "RigEngineDown", host.name, time.time() - killed_at + 60)
             if t >= killed_at]
    gaps = [b - a for a, b in zip(fired, fired[1:], strict=False)]
    assert max(gaps, default=0) <= 2 * EVALUATION_INTERVAL_S, (
        f"RigEngineDown stopped firing during the recreation: gaps {gaps}")
    settle(host, fleet.api_key)


# --- swaps raise nothing -------------------------------------------------------------------


# How far back the session's history is read (a whole CI session is about an hour).
HISTORY_S = 4 * 3600
SUPERVISED_WITHIN_S = 300  # a dead engine's ledger line: recreated, or given up on


def swap_windows(values: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(first sample saying 1, first sample saying 0 after it) of each swap the monitor saw."""
    out, start = [], None
    for t, v in values:
        if v == 1 and start is None:
            start = t
        elif v == 0 and start is not None:
            out.append((start, t))
            start = None
    return out


def iso(text: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(text).timestamp()


def test_the_swaps_the_monitor_saw_raised_neither_engine_down_nor_not_ready(fleet):
    """Over the session's history (test_04's swaps, the bumps, the rollbacks of test_09...):
    a swap that ended as swaps end (promoted, or rolled back by its gate) raised no
    RigEngineDown, from a little before the textfile said so to a little after; and no
    RigNotReady while it stayed within its expected duration."""
    lb = fleet.balancer
    lookback = HISTORY_S
    checked = 0
    for h in fleet.hosts:
        series = sorted(p for _, vals in raw(
            lb, f'rigfleet_swap_in_progress{{instance="{h.name}"}}', lookback) for p in vals)
        ended = [(iso(r["time"]), r) for r in ledger(h) if r.get("event") == "swap"
                 and (r.get("result") == "promoted" or (r.get("result") == "rolled-back"
                      and (r.get("gate") or {}).get("result") == "fail"))]
        expected = [p for _, vals in raw(
            lb, f'rigfleet_swap_expected_seconds{{instance="{h.name}"}}', lookback) for p in vals]
        supervised = [iso(r["time"]) for r in ledger(h) if r.get("event") == "supervise"]
        seen_up = [sorted(p for _, vals in raw(lb, sel, lookback) for p in vals) for sel in (
            f'rigfleet_engine_up{{instance="{h.name}"}}', f'up{{job="vllm",instance="{h.name}"}}')]
        for start, end in swap_windows(series):
            if not any(start - 5 <= t <= end + 5 for t, _ in ended):
                continue  # not a swap that ran to its end (a fault another module injected)
            checked += 1
            lo, hi = start - TEXTFILE_EVERY_S - SCRAPE_INTERVAL_S, end + DOWN_WITHIN_S
            # Not the swap's: a firing after both signals saw the engine up past the swap's end
            # (that outage began later), or one the supervisor answered (an engine that died:
            # test_10 kills host2's next to its swaps; the alert is right there).
            down = [t for t in firing_at(lb, "RigEngineDown", h.name, lookback) if lo <= t <= hi
                    and not all(any(end < u < t and v == 1 for u, v in s) for s in seen_up)
                    and not any(t - DOWN_WITHIN_S <= x <= t + SUPERVISED_WITHIN_S
                                for x in supervised)]
            assert not down, f"{h.name}: RigEngineDown fired during the swap {start:.0f}-{end:.0f}"
            expected_s = max((x for t, x in expected if start <= t <= end), default=0.0)
            if end - start <= expected_s:
                late = [t for t in firing_at(lb, "RigNotReady", h.name, lookback)
                        if start <= t <= end]
                assert not late, f"{h.name}: RigNotReady during the swap {start:.0f}-{end:.0f}"
    if not checked:
        pytest.skip("no swap ran to its end while the monitor watched (test_04's swaps and "
                    "test_09's rollbacks run before this module in a whole session)")


# --- the throughput alert from the gate's record -------------------------------------------


def serving_gate(host) -> tuple[str, list[str], int]:
    """The gate the host's swap to what it serves ran: (profile, --set items, the stack's
    loopback port), from that swap's plan.json."""
    stack = read_state(host)["stack"]
    rc, out = host.sh(f"ls -t {HOST.swaps_dir}/*/plan.json")
    assert rc == 0, out
    for path in out.split():
        rc, text = host.sh(f"cat {shlex.quote(path)}")
        plan = json.loads(text) if rc == 0 else {}
        sets = plan.get("gate_set") or []
        if plan.get("desired", {}).get("stack") == stack and \
                any(x == f"throughput_stack={stack}" for x in sets):
            return plan["gate_profile"], sets, int(plan["desired"]["port"])
    raise AssertionError(f"{host.name}: no swap plan to {stack} with a throughput gate")


def run_gate(host, profile: str, sets: list[str], port: int) -> tuple[int, str, float]:
    """The host tool's gate, throughput check only, as that swap ran it (the host's key,
    reports and throughput records); (exit status, output, when last.json was written)."""
    cmd = ["python3", BUNDLE_PATH, "verify", "--url", f"http://127.0.0.1:{port}",
           "--api-key-file", str(HOST.api_key_file), "--profile", profile,
           "--only", "throughput", "--report-dir", str(HOST.reports_dir), "--set", *sets]
    rc, out = host.sh(shlex.join(cmd), timeout=900)
    last = HOST.throughput_last
    rc2, stamp = host.sh(f"date -r {last} +%s.%N")
    assert rc2 == 0, stamp
    return rc, out, float(stamp)


def passing_gate(host, profile: str, sets: list[str], port: int, tries: int = 4) -> float:
    """``run_gate`` at the usual cap until it passes (on the shared 2-core machine the other
    testbeds' load alone can take a run below the margin: a few seconds each); when the
    passing record was written."""
    for _ in range(tries):
        rc, out, written = run_gate(host, profile, sets, port)
        if rc == 0:
            return written
    raise AssertionError(f"{host.name}: the gate failed {tries} times at the usual cap:\n"
                         f"{out[-3000:]}")


def last_gate(host) -> dict | None:
    """The host's ``last.json`` (the last gate's throughput record), None without one."""
    rc, text = host.sh(f"cat {HOST.throughput_last}")
    return json.loads(text) if rc == 0 else None


def set_caps(host, watts: list[str]) -> None:
    for i, w in enumerate(watts):
        rc, out = host.sh(f"nvidia-smi -i {i} -pl {float(w):g}")
        assert rc == 0, out


def test_a_slower_gate_raises_the_throughput_alert_and_a_passing_one_clears_it(fleet):
    """The first fleet host's cards at their minimum cap (the twin's engine decodes slower,
    as a capped 3090 does): the real gate fails on throughput, and RigThroughputBelowBaseline
    fires from its record (tokens/s against the baseline, beyond the stack's margin) within
    ``RECORD_SEEN_S``; back at the usual cap, the gate passes and the alert clears."""
    lb, host = fleet.balancer, fleet.fleet[0]
    stack = read_state(host)["stack"]
    profile, sets, port = serving_gate(host)
    last = last_gate(host)
    if (last or {}).get("stack") != stack or last.get("result") != "pass":
        # An earlier module's last gate here was another stack's or failed: start from a
        # passing one of what it serves, as its next swap would leave it.
        passing_gate(host, profile, sets, port)
    wait_for(lambda: not alerts_now(lb, "RigThroughputBelowBaseline", host.name), 60,
             f"no throughput alert on {host.name} before the slower gate")
    rc, out = host.sh("nvidia-smi --query-gpu=power.limit,power.min_limit "
                      "--format=csv,noheader,nounits")
    assert rc == 0, out
    caps = [line.split(",") for line in out.splitlines() if line.strip()]
    try:
        set_caps(host, [c[1].strip() for c in caps])
        rc, out, written = run_gate(host, profile, sets, port)
    finally:
        set_caps(host, [c[0].strip() for c in caps])
    assert rc == 1, out[-3000:]                     # one failed check: throughput
    record = last_gate(host)
    assert record and (record["stack"], record["result"]) == (stack, "fail"), record
    decode = record["shapes"]["narrative"]["decode"]
    wait_for(lambda: alerts_now(lb, "RigThroughputBelowBaseline", host.name, "firing"),
             RECORD_SEEN_S + SLACK_S + 30, f"RigThroughputBelowBaseline on {host.name}")
    fired = [t for t in firing_at(lb, "RigThroughputBelowBaseline", host.name,
                                  time.time() - written + 60, stack=stack) if t >= written]
    assert fired and fired[0] - written <= RECORD_SEEN_S + SLACK_S, (fired[:1], written)
    # The figures it fired on are the gate's record's.
    tps = query(lb, f'rigfleet_gate_tokens_per_second{{instance="{host.name}"}}')
    assert tps[("node", host.name)] == pytest.approx(decode), (tps, decode)
    base = record["baseline"]["narrative"]
    on = f'{{instance="{host.name}",stack="{stack}"}}'
    assert query(lb, f"rigfleet_gate_baseline_tokens_per_second{on}")[
        ("node", host.name)] == pytest.approx(base)
    (shortfall,) = query(lb, f"instance_stack:rigfleet_gate_shortfall:ratio{on}").values()
    assert shortfall == pytest.approx(1 - decode / base), (shortfall, decode, base)
    margin = query(lb, f"rigfleet_gate_margin_ratio{on}")[("node", host.name)]
    assert shortfall > margin > 0, (shortfall, margin)
    # At the usual cap the same gate passes, and the alert clears.
    written = passing_gate(host, profile, sets, port)
    wait_for(lambda: not alerts_now(lb, "RigThroughputBelowBaseline", host.name),
             RECORD_SEEN_S + SLACK_S + 30, f"RigThroughputBelowBaseline on {host.name} cleared")
    late = [t for t in firing_at(lb, "RigThroughputBelowBaseline", host.name,
                                 time.time() - written + 60)
            if t > written + RECORD_SEEN_S + SLACK_S]
    assert not late, late


# --- the pins join ---------------------------------------------------------------------------


PINS_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-monitor-pins.py")
MOVED_PINS = STATE / "monitor-pins.yaml"


def test_pins_that_moved_under_a_host_make_pins_differ_pending_for_it_alone(fleet):
    """The monitor converged with a pins file whose single-card stack moved to another
    release (as ``rigfleet bump`` writes pins.yaml before the hosts converge): its
    rigfleet_desired_info joined with the hosts' rigfleet_serving_info makes RigPinsDiffer
    pending (``for: 30m``) for the single-card host alone, with the pinned labels; the
    monitor's own desired textfile put back, it goes away."""
    from rigfleet_testbed import layout, vllm_builds

    from rigfleet.registry import Registry

    lb, single = fleet.balancer, fleet.single
    assert single is not None
    stack = read_state(single)["stack"]
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    now = pins["stacks"][stack]
    tag = "v0.27.1" if not str(now["image"]).endswith(":v0.27.1") else "v0.28.0"
    digest = Registry(f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}").digest(
        "vllm/vllm-openai", tag)
    assert digest != now["digest"]
    pins["stacks"][stack] = {**now, "image": f"vllm/vllm-openai:{tag}", "digest": digest,
                             "vllm_version": vllm_builds.by_tag(tag).version}
    MOVED_PINS.write_text(yaml.safe_dump(pins, sort_keys=False))
    PINS_INVENTORY.write_text(f'''"""Testbed {layout.INSTANCE}: test_18's pins that moved."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
gpu_hosts = (_hosts, {{**_data, "pins_file": {str(MOVED_PINS)!r}}})
balancers = _tb["balancers"]
monitors = _tb["monitors"]
''')
    wait_for(lambda: not alerts_now(lb, "RigPinsDiffer", single.name), 60,
             f"{single.name} serving what the monitor's pins say before they move")
    before = {a["labels"]["instance"] for a in prom(lb, "/api/v1/alerts")["alerts"]
              if a["labels"].get("alertname") == "RigPinsDiffer"}
    desired = DESIRED_FILE
    rc, out = lb.sh(f"cp -p {desired} /root/rigfleet-desired.prom.test18")
    assert rc == 0, out
    try:
        run([str(BIN / "pyinfra"), str(PINS_INVENTORY), "deploy.py", "-y", "--limit", lb.name],
            timeout=900)
        got = wait_for(lambda: alerts_now(lb, "RigPinsDiffer", single.name, "pending"),
                       RECORD_SEEN_S + SLACK_S + 30, f"RigPinsDiffer pending on {single.name}")
        assert [(a["labels"]["stack"], a["labels"]["image_digest"]) for a in got] == [
            (stack, digest)], got
        everyone = {a["labels"]["instance"] for a in prom(lb, "/api/v1/alerts")["alerts"]
                    if a["labels"].get("alertname") == "RigPinsDiffer"}
        assert everyone == before | {single.name}, (everyone, before)
    finally:
        rc, out = lb.sh(f"mv /root/rigfleet-desired.prom.test18 {desired}")
        PINS_INVENTORY.unlink(missing_ok=True)
        MOVED_PINS.unlink(missing_ok=True)
    assert rc == 0, out
    wait_for(lambda: not alerts_now(lb, "RigPinsDiffer", single.name),
             RECORD_SEEN_S + SLACK_S + 30, f"RigPinsDiffer on {single.name} gone")
