"""A GPU host's node exporter (loopback) and ``rigfleet-metrics.timer`` (docs/monitoring.md)."""

from __future__ import annotations

import io

from pyinfra.api import deploy

from rigfleet.facts import read_paths
from rigfleet.hostside.metrics import TEXTFILE_DIR
from rigfleet.resources import project_file
from rigfleet.scrape import METRICS_UNIT, NODE_EXPORTER, SCRAPE_INTERVAL_S, node_exporter_args
from roles import maintenance
from roles.docker import reload_detaches_gpus
from roles.ops import apt_packages, changed, enabled_running, on_change, root_dir, root_put
from roles.preflight import HostContext
from roles.swap import unit_file

PACKAGE = SERVICE = NODE_EXPORTER
DEFAULTS = f"/etc/default/{PACKAGE}"
UNIT = METRICS_UNIT
UNIT_DIR = "/etc/systemd/system"
TEMPLATES = {f"{UNIT}.service": "files/rigfleet-metrics.service.j2",
             f"{UNIT}.timer": "files/rigfleet-metrics.timer.j2"}
STEP = "node exporter install and systemd daemon-reload (the serving container could lose " \
       "its GPUs)"


def defaults_text() -> str:
    """The package's ``/etc/default`` file: ARGS only (loopback, the textfile directory)."""
    return ("# Managed by rigfleet (roles/exporter.py): loopback only; the fleet's monitor "
            "reads it\n# through the front with the key (docs/monitoring.md).\n"
            + node_exporter_args(TEXTFILE_DIR) + "\n")


@deploy("Exporters (node exporter, GPU and rigfleet textfiles)")
def exporter(ctx: HostContext) -> None:
    read_paths([DEFAULTS, TEXTFILE_DIR, *(f"{UNIT_DIR}/{name}" for name in TEMPLATES)])
    detaches = reload_detaches_gpus(ctx)
    args = root_put(name=f"{DEFAULTS} (loopback only; written before the package starts it)",
                    src=io.StringIO(defaults_text()), dest=DEFAULTS)
    install = apt_packages(name=f"Install {PACKAGE}", packages=[PACKAGE], before=lambda inputs: (
        maintenance.enter(ctx, STEP, inputs, inputs[:1]) if detaches else inputs[:1]))
    root_dir(name=f"Directory {TEXTFILE_DIR} (the textfile collector's)", path=TEXTFILE_DIR)
    units = [unit_file(f"{UNIT_DIR}/{name}", str(project_file(src)), f"{UNIT_DIR}/{name}", ctx,
                       textfile_dir=TEXTFILE_DIR, interval_s=SCRAPE_INTERVAL_S)
             for name, src in TEMPLATES.items()]
    maintenance.plan_step(ctx, STEP, detaches and changed([install, *units]))
    on_change(name="systemd daemon-reload (rigfleet-metrics units changed)",
              commands=["systemctl daemon-reload"], gates=units, reason="units unchanged",
              window=lambda: maintenance.enter(ctx, STEP) if detaches else ())
    enabled_running(name=f"{SERVICE} enabled and running", service=SERVICE)
    on_change(name=f"Restart {SERVICE} (its ARGS changed)",
              commands=[f"systemctl restart {SERVICE}"], gates=[args],
              reason="ARGS unchanged")
    enabled_running(name=f"{UNIT}.timer enabled and running", service=f"{UNIT}.timer")
