"""Issue 21 (items 1, 2, 5) on the simulated fleet: the monitor on lb1 (inventory group
``monitors``) scrapes every GPU host's node exporter (with the GPU and rigfleet textfiles)
and engine through its front with the key, and the balancer; nothing new listens beyond
loopback; an engine killed on one host shows ``up{job="vllm"} == 0`` for it, and 1 again
once the supervisor recreated the stack. (The second converge changing nothing is test_02's
``--dry`` over the whole fleet, the monitor included.)

    RIGFLEET_TESTBED_INSTANCE=4 RIGFLEET_TESTBED_HOSTS=1 RIGFLEET_KEEP_TESTBED=1 \\
        .venv/bin/python -m pytest tests/e2e/test_18_metrics.py -x -v
"""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request

import pytest
from conftest import EXTRAS, wait_for
from test_04_swap import settle

from rigfleet.hostside.front import READY_PATH
from rigfleet.scrape import ENGINE_PATH, KEY_FILE, NODE_PATH

# Two scrape intervals plus one rule evaluation (15 s each), and a little for SSH and curl.
DOWN_WITHIN_S = 2 * 15 + 15 + 15

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
    # The textfiles ride on each host's node exporter; the engine's own names on its job.
    for expr in ("rigfleet_gpu_scrape_ok == 1", "rigfleet_facts_timestamp_seconds",
                 "rigfleet_serving_info", "rigfleet_engine_up == 1",
                 'rigfleet_gpu_throttle{reason="sw_power_cap"}',
                 "node_textfile_scrape_error == 0", "vllm:num_requests_running"):
        got = {i for _, i in query(lb, expr)}
        assert hosts <= got, f"{expr}: {sorted(got)}"
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


def test_a_killed_engine_shows_down_then_up_after_the_supervisor(fleet):
    lb, host = fleet.balancer, fleet.fleet[-1]
    up = f'up{{job="vllm",instance="{host.name}"}}'
    wait_for(lambda: query(lb, up).get(("vllm", host.name)) == 1.0, 60, f"{up} == 1")
    recreations = f'rigfleet_supervisor_recreations_total{{instance="{host.name}"}}'
    before = query(lb, recreations)[("node", host.name)]
    rc, out = host.sh(f"docker kill {host.container_of_stack}")
    assert rc == 0, out
    wait_for(lambda: query(lb, up).get(("vllm", host.name)) == 0.0, DOWN_WITHIN_S,
             f"{up} == 0 after the engine was killed")
    others = {i for (_, i), v in query(lb, 'up{job="vllm"}').items() if v == 1.0}
    assert others >= {h.name for h in fleet.hosts if h is not host}, others
    wait_for(lambda: query(lb, up).get(("vllm", host.name)) == 1.0, 300,
             f"{up} == 1 once the supervisor recreated the stack")
    # rigfleet's own facts say why: one more recreation in the host's ledger.
    wait_for(lambda: query(lb, recreations)[("node", host.name)] == before + 1, 60,
             f"{recreations} == {before + 1:g}")
    settle(host, fleet.api_key)
