"""The monitor: which hosts are service hosts, its host data, the scrape config made from the
inventory (checked by the real promtool when it is installed), the bound-before-start ARGS,
and the desired pins' textfile."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from balancer_helpers import gpu_host, key_file, tls_files

from rigfleet import scrape
from rigfleet.hostdata import HostDataError, validate_balancer, validate_monitor
from rigfleet.inventory import InventoryHost, gpu_hosts, host_kind
from rigfleet.pins import GenesisPin, ModelPin, Pins, StackPins
from rigfleet.scrape import BalancerHost, desired_textfile, plan_monitor, render_prometheus
from roles.exporter import defaults_text


@pytest.mark.parametrize(("groups", "gpu", "balancer", "monitor"), [
    ((), True, False, False),
    (("monitors",), False, False, True),
    (("monitors", "balancers"), False, True, True),
    (("monitors", "gpu_hosts"), True, False, True),
    (("balancers",), False, True, False),
])
def test_service_hosts_are_never_rigs_unless_in_gpu_hosts(groups, gpu, balancer, monitor):
    kind = host_kind(groups)
    assert (kind.gpu, kind.balancer, kind.monitor) == (gpu, balancer, monitor)
    assert (kind.balancer or kind.monitor or kind.cache) == (balancer or monitor)


def test_monitors_are_not_served_by_status_or_the_bump():
    hosts = [InventoryHost("rig-a", (), {}), InventoryHost("mon1", ("monitors",), {})]
    assert [h.name for h in gpu_hosts(hosts)] == ["rig-a"]
    assert [h.name for h in hosts if h.kind.monitor] == ["mon1"]


def test_monitor_data(tmp_path):
    key = str(key_file(tmp_path))
    s = validate_monitor("mon1", {"api_key_file": key})
    assert (s.retention_days, s.retention_gib) == (30, None)
    with pytest.raises(HostDataError) as e:
        validate_monitor("mon1", {"api_key_file": key, "monitor_retention_days": 0,
                                  "monitor_retention_gb": 5})
    assert e.value.problems[0].startswith("mon1: monitor_retention_gb: 'monitor_retention_gb' "
                                          "is not a rigfleet key (did you mean")
    assert any(p.startswith("mon1: monitor_retention_days: 0 is not valid; allowed: an integer "
                            "1..3650") for p in e.value.problems)


def test_an_alertmanager_file_of_ones_own(tmp_path):
    key = str(key_file(tmp_path))
    own = tmp_path / "alertmanager.yml"
    own.write_text("route:\n  receiver: mail\nreceivers:\n  - name: mail\n")
    own.chmod(0o600)
    s = validate_monitor("mon1", {"api_key_file": key, "monitor_alertmanager_file": str(own)})
    assert s.alertmanager_file == str(own)
    assert validate_monitor("mon1", {"api_key_file": key}).alertmanager_file is None

    def problem(**data):
        with pytest.raises(HostDataError) as e:
            validate_monitor("mon1", {"api_key_file": key, **data})
        return e.value.problems[0]

    own.chmod(0o644)
    assert problem(monitor_alertmanager_file=str(own)) == (
        f"mon1: monitor_alertmanager_file: {str(own)!r} is readable by others (mode 0644); "
        f"allowed: mode 0600 or stricter (it may hold credentials): chmod 600 {own}")
    own.chmod(0o600)
    own.write_text("receivers: []\nsmtp_auth_password: hunter2\n")
    got = problem(monitor_alertmanager_file=str(own))
    assert "is not one; allowed: Alertmanager's configuration: a YAML mapping with 'route' " \
           "and 'receivers'" in got and "hunter2" not in got
    assert "does not exist" in problem(
        monitor_alertmanager_file=str(tmp_path / "none.yml"))


def plan(tmp_path, **monitor):
    key = key_file(tmp_path)
    crt, _ = tls_files(tmp_path, "rig-b.lan")
    tls_key = tmp_path / "rig-b.lan.key"
    hosts = [gpu_host("rig-a", key, "rig-a.lan"),
             gpu_host("rig-b", key, "10.0.0.12", balancer_front_address="rig-b.lan:8443",
                      front_tls_cert_file=str(crt), front_tls_key_file=str(tls_key))]
    lbs = [BalancerHost("lb1", validate_balancer("lb1", {"api_key_file": str(key)}), "lb1.lan"),
           BalancerHost("mon1", validate_balancer("mon1", {"api_key_file": str(key),
                                                           "balancer_port": 9443}), "x")]
    settings = validate_monitor("mon1", {"api_key_file": str(key), **monitor})
    return plan_monitor("mon1", settings, hosts, lbs), crt


def test_targets_from_the_inventory(tmp_path):
    p, crt = plan(tmp_path)
    assert [(t.instance, t.address, t.tls) for t in p.fronts] == [
        ("rig-a", "rig-a.lan:8000", False), ("rig-b", "rig-b.lan:8443", True)]
    # A balancer on the monitor's own host is scraped on loopback.
    assert [(t.instance, t.address) for t in p.balancers] == [("lb1", "lb1.lan:8080"),
                                                             ("mon1", "127.0.0.1:9443")]
    assert p.ca_files == (str(crt),)
    doc = json.loads(render_prometheus(p).split("\n", 1)[1])
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert sorted(jobs) == ["balancer", "monitor-node", "node", "prometheus", "vllm"]
    assert doc["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    node = jobs["node"]
    assert node["metrics_path"] == "/rigfleet/metrics/node"
    assert jobs["vllm"]["metrics_path"] == "/rigfleet/metrics/engine"
    assert jobs["balancer"]["metrics_path"] == "/rigfleet/metrics/haproxy"
    assert node["authorization"] == {"type": "Bearer", "credentials_file": scrape.KEY_FILE}
    assert node["tls_config"] == {"ca_file": scrape.CA_FILE}
    assert node["static_configs"][1] == {"targets": ["rig-b.lan:8443"], "labels": {
        "instance": "rig-b", "__scheme__": "https"}}
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:9093"]
    # The key is never in the config, only the file that holds it.
    assert "k3y-" not in render_prometheus(p)


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed here")
def test_promtool_accepts_the_config(tmp_path):
    p, crt = plan(tmp_path)
    rules = tmp_path / "rules.yml"
    rules.write_text("groups: []\n")
    text = (render_prometheus(p).replace(scrape.KEY_FILE, str(key_file(tmp_path)))
            .replace(scrape.CA_FILE, str(crt)).replace(scrape.RULES_FILE, str(rules)))
    conf = tmp_path / "prometheus.yml"
    conf.write_text(text)
    proc = subprocess.run(["promtool", "check", "config", str(conf)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_retention_sized_from_the_inventory(tmp_path):
    p, _ = plan(tmp_path)
    assert p.retention_gib == scrape.MIN_RETENTION_GIB        # 2 hosts x 30 d x 16 MiB < 2 GiB
    p, _ = plan(tmp_path, monitor_retention_days=365)
    assert p.retention_gib == 12                              # 2 x 365 x 16 MiB = 11.4 GiB
    p, _ = plan(tmp_path, monitor_retention_gib=50)
    assert p.retention_gib == 50
    assert scrape.prometheus_args(p) == (
        'ARGS="--web.listen-address=127.0.0.1:9090 --storage.tsdb.retention.time=30d '
        '--storage.tsdb.retention.size=50GB"')


def test_every_service_is_bound_to_loopback():
    assert "--web.listen-address=127.0.0.1:9093 --cluster.listen-address=\"" in \
        scrape.alertmanager_args()
    text = defaults_text()
    assert 'ARGS="--web.listen-address=127.0.0.1:9100 ' in text
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in text


def test_desired_textfile(tmp_path):
    key = key_file(tmp_path)
    hosts = [gpu_host("rig-a", key), gpu_host("rig-b", key, stack="tq3-mtp-genesis")]
    model = ModelPin("Qwen/Qwen3.6-27B", "a" * 40, "qwen")
    genesis = GenesisPin(repo="http://g", commit="c" * 40)
    stacks = {"int8": StackPins("int8", "vllm/vllm-openai:v1", "sha256:" + "1" * 64, "0.20"),
              "tq3-mtp-genesis": StackPins("tq3-mtp-genesis", "vllm/vllm-openai:v1",
                                           "sha256:" + "2" * 64, "0.20", genesis)}
    pins = Pins("pins.yaml", 1, "580", None, "1.17.8-1", "0.30", model, stacks)
    text = desired_textfile(hosts, {"rig-a": pins, "rig-b": pins})
    assert ('rigfleet_desired_info{host="rig-a",stack="int8",image_digest="sha256:' + "1" * 64
            + f'",model_revision="{"a" * 40}",genesis_commit=""}} 1') in text
    assert "# TYPE rigfleet_desired_info gauge" in text
    assert ('rigfleet_desired_info{host="rig-b",stack="tq3-mtp-genesis",image_digest="sha256:'
            + "2" * 64 + f'",model_revision="{"a" * 40}",genesis_commit="{"c" * 40}"}} 1') in text


@pytest.mark.parametrize("value", [600, True, ["alertmanager.yml"]])
def test_an_alertmanager_file_that_is_not_a_path_is_refused_as_such(tmp_path, monkeypatch, value):
    """A number or a list was made a path with str(): `600` read ./600 if there was one."""
    monkeypatch.chdir(tmp_path)
    for name in ("600", "True", "['alertmanager.yml']"):
        (tmp_path / name).write_text("route:\n  receiver: mail\nreceivers:\n  - name: mail\n")
        (tmp_path / name).chmod(0o600)
    with pytest.raises(HostDataError) as e:
        validate_monitor("mon1", {"api_key_file": str(key_file(tmp_path)),
                                  "monitor_alertmanager_file": value})
    assert e.value.problems == [
        f"mon1: monitor_alertmanager_file: {value!r} is not valid; allowed: a file on this "
        "(control) machine, mode 0600: Alertmanager's YAML config with route and receivers"]


def test_a_tls_balancer_on_the_monitor_host_is_scraped_at_a_name_its_certificate_has(tmp_path):
    key = key_file(tmp_path)
    crt, tls_key = tls_files(tmp_path, "mon1.lan")
    lb = validate_balancer("mon1", {"api_key_file": str(key), "balancer_port": 9443,
                                    "balancer_tls_cert_file": str(crt),
                                    "balancer_tls_key_file": str(tls_key)})
    settings = validate_monitor("mon1", {"api_key_file": str(key)})
    p = plan_monitor("mon1", settings, [gpu_host("rig-a", key, "rig-a.lan")],
                     [BalancerHost("mon1", lb, "mon1.lan")])
    # Prometheus checks the certificate against the target's host: 127.0.0.1 is not in it.
    assert [(t.address, t.tls) for t in p.balancers] == [("mon1.lan:9443", True)]
    assert p.ca_files == (str(crt),)
