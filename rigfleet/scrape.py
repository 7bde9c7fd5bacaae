"""What a monitor makes of the inventory: Prometheus' scrape targets (each GPU host through its
front, each balancer through its port, with the fleet's key; ``instance`` is the inventory
name), its retention, and the desired pins as a textfile (pure; docs/monitoring.md)::

    plan = plan_monitor("mon1", monitor_settings, gpu_hosts, balancers)
    render_prometheus(plan)          # /etc/prometheus/prometheus.yml
    desired_textfile(gpu_hosts, pins_by_host)   # rigfleet_desired_info per GPU host
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rigfleet.balancer.haproxy import METRICS_PATH as BALANCER_PATH
from rigfleet.balancer.plan import GpuHost, front_target, split_address, url_host
from rigfleet.hostdata import (
    ALERTMANAGER_PORT,
    NODE_EXPORTER_PORT,
    PROMETHEUS_PORT,
    BalancerSettings,
    MonitorSettings,
)
from rigfleet.hostside.metrics import Textfile
from rigfleet.pins import Pins

# What the fronts serve behind the key (files/nginx-front.conf.j2).
NODE_PATH = "/rigfleet/metrics/node"
ENGINE_PATH = "/rigfleet/metrics/engine"
NODE_EXPORTER = "prometheus-node-exporter"  # package and unit on every GPU host (roles/exporter)
METRICS_UNIT = "rigfleet-metrics"  # its .service and .timer write the textfiles (roles/exporter)
SCRAPE_INTERVAL_S = 15
EVALUATION_INTERVAL_S = 15
# One GPU host's series on disk per day (~1.4k series at 15 s, ~1.5 bytes a sample).
BYTES_PER_HOST_DAY = 16 * 2**20
MIN_RETENTION_GIB = 2
# On the monitor host (root:prometheus 0640): the key, the fronts' CAs.
PROM_DIR = "/etc/prometheus"
KEY_FILE = f"{PROM_DIR}/rigfleet-api-key"
CA_FILE = f"{PROM_DIR}/rigfleet-fronts-ca.pem"
RULES_FILE = f"{PROM_DIR}/rigfleet-rules.yml"


@dataclass(frozen=True)
class Target:
    instance: str
    address: str
    tls: bool = False


@dataclass(frozen=True)
class BalancerHost:
    name: str
    settings: BalancerSettings
    address: str  # host (or [v6]) only; the port is the balancer's


@dataclass(frozen=True)
class MonitorPlan:
    name: str
    settings: MonitorSettings
    fronts: tuple[Target, ...]
    balancers: tuple[Target, ...]
    ca_files: tuple[str, ...]  # control-side CA files of TLS fronts and balancers, in order
    local_node: bool  # scrape this host's own node exporter (not a GPU host)

    @property
    def retention_gib(self) -> int:
        """``monitor_retention_gib``, else sized from the hosts and the days kept."""
        if self.settings.retention_gib is not None:
            return self.settings.retention_gib
        need = len(self.fronts) * self.settings.retention_days * BYTES_PER_HOST_DAY
        return max(MIN_RETENTION_GIB, -(-need // 2**30))


def plan_monitor(name: str, settings: MonitorSettings, hosts: Sequence[GpuHost],
                 balancers: Sequence[BalancerHost], gpu_host: bool = False) -> MonitorPlan:
    """The monitor ``name``'s targets (a balancer on this very host: on loopback, unless it
    serves TLS: Prometheus checks its certificate against the address)."""
    fronts = tuple(Target(h.name, front_target(h)[0], h.settings.front_tls is not None)
                   for h in hosts)
    lbs = []
    for b in balancers:
        host = "127.0.0.1" if b.name == name and b.settings.tls is None else b.address
        lbs.append(Target(b.name, f"{url_host(host)}:{b.settings.port}",
                          b.settings.tls is not None))
    tls = [h.settings.front_tls for h in hosts] + [b.settings.tls for b in balancers]
    cas = tuple(dict.fromkeys(t.ca_file for t in tls if t is not None))
    return MonitorPlan(name, settings, fronts, tuple(lbs), cas, not gpu_host)


def balancer_address(ssh_hostname: str | None, name: str) -> str:
    """Where a monitor reaches a balancer: its SSH address (``rig-a.lan:22`` -> host)."""
    return split_address(ssh_hostname)[0] if ssh_hostname else name


def _job(name: str, path: str, targets: Sequence[Target], ca: bool) -> dict:
    groups = [{"targets": [t.address],
               "labels": {"instance": t.instance, "__scheme__": "https" if t.tls else "http"}}
              for t in targets]
    job: dict = {"job_name": name, "metrics_path": path,
                 "authorization": {"type": "Bearer", "credentials_file": KEY_FILE},
                 "static_configs": groups}
    if ca:
        job["tls_config"] = {"ca_file": CA_FILE}
    return job


def render_prometheus(plan: MonitorPlan) -> str:
    """``prometheus.yml``, written as JSON (which is YAML: no template quoting can go wrong)."""
    ca = bool(plan.ca_files)
    jobs = [_job("node", NODE_PATH, plan.fronts, ca), _job("vllm", ENGINE_PATH, plan.fronts, ca)]
    if plan.balancers:
        jobs.append(_job("balancer", BALANCER_PATH, plan.balancers, ca))
    local = {"monitor-node": NODE_EXPORTER_PORT} if plan.local_node else {}
    jobs += [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"],
                                                   "labels": {"instance": plan.name}}]}
             for job, port in {**local, "prometheus": PROMETHEUS_PORT}.items()]
    doc = {"global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                      "evaluation_interval": f"{EVALUATION_INTERVAL_S}s"},
           "rule_files": [RULES_FILE],
           "alerting": {"alertmanagers": [{"static_configs": [
               {"targets": [f"127.0.0.1:{ALERTMANAGER_PORT}"]}]}]},
           "scrape_configs": jobs}
    return ("# Managed by rigfleet (roles/monitor.py) from the inventory; docs/monitoring.md.\n"
            + json.dumps(doc, indent=2, sort_keys=True) + "\n")


def prometheus_args(plan: MonitorPlan) -> str:
    """``/etc/default/prometheus``'s ARGS: loopback only, retention by time and size."""
    return (f'ARGS="--web.listen-address=127.0.0.1:{PROMETHEUS_PORT} '
            f"--storage.tsdb.retention.time={plan.settings.retention_days}d "
            f'--storage.tsdb.retention.size={plan.retention_gib}GB"')


def alertmanager_args() -> str:
    """``/etc/default/prometheus-alertmanager``'s ARGS: loopback only, no cluster port."""
    return (f'ARGS="--web.listen-address=127.0.0.1:{ALERTMANAGER_PORT} '
            '--cluster.listen-address="')


def node_exporter_args(textfile_dir: str) -> str:
    """``/etc/default/prometheus-node-exporter``'s ARGS: loopback only, the textfiles."""
    return (f'ARGS="--web.listen-address=127.0.0.1:{NODE_EXPORTER_PORT} '
            f'--collector.textfile.directory={textfile_dir}"')


def desired_textfile(hosts: Sequence[GpuHost], pins: Mapping[str, Pins]) -> str:
    """``rigfleet-desired.prom``: what each GPU host should serve (for the "pins differ" alert)."""
    info = "What the inventory and pins.yaml want a host to serve (labels), always 1."
    text = Textfile({"rigfleet_desired_info": (info, "gauge", [])})  # HELP, TYPE: even empty
    for h in hosts:
        p = pins[h.name]
        if (stack := p.stacks.get(h.settings.stack)) is None:
            continue
        text.add("rigfleet_desired_info", info, 1, host=h.name, stack=h.settings.stack,
                 image_digest=stack.digest,
                 model_revision=p.model_for(h.settings.spec.model).revision,
                 genesis_commit=stack.genesis.commit if stack.genesis else "")
    return text.render()
