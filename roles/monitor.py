"""Prometheus and Alertmanager on loopback, scraping the inventory's hosts (docs/monitoring.md)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import systemd

from rigfleet.balancer.plan import GpuHost, read_fleet, read_gpu_host
from rigfleet.desired import pins_for
from rigfleet.hostdata import MonitorSettings, validate_balancer, validate_monitor
from rigfleet.hostside.metrics import TEXTFILE_DIR
from rigfleet.inventory import HostKind
from rigfleet.pins import Pins
from rigfleet.resources import project_file
from rigfleet.scrape import (
    CA_FILE,
    KEY_FILE,
    PROM_DIR,
    RULES_FILE,
    BalancerHost,
    MonitorPlan,
    alertmanager_args,
    balancer_address,
    desired_textfile,
    plan_monitor,
    prometheus_args,
    render_prometheus,
)
from roles.exporter import PACKAGE as NODE_PACKAGE
from roles.exporter import defaults_text as node_defaults
from roles.ops import Secret, apt_packages, checked_file, on_change, root_put, secret_file
from roles.preflight import PreflightError, check_service_os, fleet_key, preflight_of

RULES_SOURCE = "files/monitor/rules.yml"
ALERTMANAGER_CONFIG = f"{PROM_DIR}/alertmanager.yml"
DESIRED_FILE = f"{TEXTFILE_DIR}/rigfleet-desired.prom"
MANAGED = "# Managed by rigfleet (roles/monitor.py): {}; docs/monitoring.md.\n{}\n"
# A route to a receiver without integrations: alerts are kept and shown (API, UI); where they
# go (mail, chat) is the operator's to add (docs/monitoring.md).
ALERTMANAGER_YML = ("# Managed by rigfleet (roles/monitor.py): a converge replaces it. Your own\n"
                    "# receivers: host data monitor_alertmanager_file (docs/monitoring.md).\n"
                    "route:\n  receiver: rigfleet\n  group_by: [alertname, instance]\n"
                    "receivers:\n  - name: rigfleet\n")


@dataclass(frozen=True)
class MonitorContext:
    plan: MonitorPlan
    api_key: Secret
    desired: str
    gpu_host: bool = False

    @property
    def settings(self) -> MonitorSettings:
        return self.plan.settings


def _targets(other: Any, kind: HostKind) -> tuple[GpuHost | None, Pins | None, BalancerHost | None]:
    """A host's scrape targets: as a GPU host (and its pins), as a balancer."""
    gpu = read_gpu_host(other, kind)
    pins = pins_for(gpu.settings) if gpu else None
    lb = (BalancerHost(other.name, validate_balancer(other.name, other.data, gpu_host=kind.gpu),
                       balancer_address(other.data.get("ssh_hostname"), other.name))
          if kind.balancer else None)
    return gpu, pins, lb


def _check_monitor(name: str, gpu_host: bool) -> MonitorContext:
    """A monitor host: its data, every GPU host's and balancer's, the key, the OS."""
    settings = validate_monitor(name, host.data)
    fleet = read_fleet(name, "monitors", "its scrape targets cannot be built", host.inventory,
                       _targets)
    if not (gpus := [gpu for gpu, _, _ in fleet if gpu]):
        raise PreflightError(f"{name}: monitors: the inventory has no GPU host to monitor; "
                             "allowed: a monitor beside at least one GPU host")
    check_service_os(name)
    api_key = fleet_key(name, settings.api_key_file, gpus)
    plan = plan_monitor(name, settings, gpus, [lb for _, _, lb in fleet if lb], gpu_host=gpu_host)
    pins = {gpu.name: p for gpu, p, _ in fleet if gpu and p}
    return MonitorContext(plan, api_key, desired_textfile(gpus, pins), gpu_host)


preflight_monitor = preflight_of("Preflight (monitor)", _check_monitor)


@deploy("Monitor (Prometheus, Alertmanager)")
def monitor(ctx: MonitorContext) -> None:
    plan = ctx.plan
    before = "written before the package starts it"
    defaults = [("prometheus", MANAGED.format("loopback only, retention", prometheus_args(plan)),
                 before),
                ("prometheus-alertmanager",
                 MANAGED.format("loopback only, no cluster", alertmanager_args()), before)]
    if not ctx.gpu_host:  # a GPU host's own exporter role did this
        defaults.append((NODE_PACKAGE, node_defaults(), "loopback only; before the package"))
    args = {package: root_put(name=f"/etc/default/{package} ({note})", src=io.StringIO(text),
                              dest=f"/etc/default/{package}")
            for package, text, note in defaults}
    apt_packages(name=f"Install {', '.join(args)}", packages=list(args))
    gates = [secret_file(name=f"API key for scraping {KEY_FILE} (root:prometheus 0640)",
                         dest=KEY_FILE, content=Secret(ctx.api_key.reveal() + "\n"),
                         mode="0640", group="prometheus")]
    if plan.ca_files:
        bundle = "".join(Path(f).read_text(encoding="utf-8").rstrip("\n") + "\n"
                         for f in plan.ca_files)
        gates.append(root_put(name=f"CAs of the TLS fronts and balancers {CA_FILE}",
                              src=io.StringIO(bundle), dest=CA_FILE))
    gates.append(checked_file(name=f"Rules {RULES_FILE} (checked with promtool first)",
                              dest=RULES_FILE, check="promtool check rules {path}",
                              content=project_file(RULES_SOURCE).read_text(encoding="utf-8")))
    conf = checked_file(
        name=f"Prometheus config ({len(plan.fronts)} GPU host(s), {len(plan.balancers)} "
             "balancer(s); checked with promtool first)",
        dest=f"{PROM_DIR}/prometheus.yml", content=render_prometheus(plan),
        check="promtool check config {path}")
    own = ctx.settings.alertmanager_file
    # The operator's file may hold credentials: readable by Alertmanager, never shown (amtool's
    # complaints quote values too; `amtool check-config <file>` shows them where it is kept).
    am_conf = checked_file(name=f"Alertmanager config {ALERTMANAGER_CONFIG} (root:prometheus "
                           f"0640{', from monitor_alertmanager_file' if own else ''})",
                           dest=ALERTMANAGER_CONFIG, mode="0640", group="prometheus",
                           content=Secret(Path(own).read_text(encoding="utf-8")) if own
                           else ALERTMANAGER_YML,
                           check="amtool check-config {path}" + (" >/dev/null 2>&1" if own else ""))
    root_put(name=f"Desired pins textfile {DESIRED_FILE}", src=io.StringIO(ctx.desired),
             dest=DESIRED_FILE)
    reload_gates = {"prometheus": [conf, *gates], "prometheus-alertmanager": [am_conf]}
    for service, service_args in args.items():
        systemd.service(name=f"{service} enabled and running", service=service, running=True,
                        enabled=True)
        # One command: a reload right after a restart can reach the new process before its
        # signal handler is set, and SIGHUP would stop it.
        restart = bool(service_args.will_change)
        on_change(name=f"{'Restart' if restart else 'Reload'} {service} (its ARGS or config "
                       "changed)",
                  commands=[f"systemctl {'restart' if restart else 'reload-or-restart'} {service}"],
                  gates=[service_args, *reload_gates.get(service, [])],
                  reason="ARGS and config unchanged")
