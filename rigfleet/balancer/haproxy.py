"""HAProxy on a balancer host: its paths, its config from a ``BalancerPlan``, its stats (pure)::

    text = render_config(plan, HOST_PATHS)                 # /etc/haproxy/haproxy.cfg
    parse_stat_csv(show_stat)[0].in_rotation               # True
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

import jinja2

from rigfleet.balancer.plan import STACK_PREFIX, BalancerPlan
from rigfleet.hostside.front import READY_PATH, ROUTE_HEADER
from rigfleet.resources import project_file

# HAProxy's own Prometheus exporter, behind the key: what the monitor scrapes (rigfleet.scrape).
METRICS_PATH = "/rigfleet/metrics/haproxy"

TEMPLATE = "files/haproxy-balancer.cfg.j2"
STREAM_TIMEOUT_S = 3600  # as long as a front lets an answer stream (its proxy_read_timeout)
MAXCONN = 512
FALL, RISE = 2, 2


@dataclass(frozen=True)
class HostPaths:
    config: str = "/etc/haproxy/haproxy.cfg"
    secret_dir: str = "/etc/haproxy/rigfleet"          # root 0700
    ca_dir: str = "/etc/haproxy/rigfleet-ca"           # the TLS fronts' CAs (public)
    socket: str = "/run/haproxy/rigfleet.sock"         # runtime API, root 0600

    @property
    def keys(self) -> str:  # accepted Authorization values, one a line
        return f"{self.secret_dir}/api-keys.lst"

    @property
    def pem(self) -> str:  # the balancer's certificate followed by its private key
        return f"{self.secret_dir}/balancer.pem"

    def ca_file(self, host: str) -> str:
        return f"{self.ca_dir}/{host}.pem"


HOST_PATHS = HostPaths()


def keys_list(key: str) -> str:
    return f"Bearer {key}\n"


def check_timing(interval_s: float) -> dict[str, int]:
    """HAProxy's check timing in ms (docs/balancer.md: how soon a host leaves rotation)."""
    inter = int(round(interval_s * 1000))
    return {"inter_ms": inter, "fastinter_ms": max(250, inter // 4),
            "check_timeout_ms": max(500, min(inter, 3000))}


def render_config(plan: BalancerPlan, paths: HostPaths = HOST_PATHS) -> str:
    template = jinja2.Template(project_file(TEMPLATE).read_text(encoding="utf-8"),
                               undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    s = plan.settings
    default = plan.pool(plan.default_stack).backend if plan.default_stack else None
    return template.render(
        name=plan.name, scheme=s.scheme, port=s.port, tls=s.tls is not None, pem=paths.pem,
        keys=paths.keys, socket=paths.socket, pools=plan.pools, prefix=STACK_PREFIX,
        default_stack=plan.default_stack, default_backend=default,
        ca_files={srv.id: paths.ca_file(srv.id) for p in plan.pools for srv in p.servers},
        bufsize=s.retry_buffer_kib * 1024, maxconn=MAXCONN, stream_timeout_s=STREAM_TIMEOUT_S,
        hard_stop_s=STREAM_TIMEOUT_S + 300, fall=FALL, rise=RISE,
        ready_path=READY_PATH, route_header=ROUTE_HEADER, metrics_path=METRICS_PATH,
        **check_timing(s.check_interval_s))


def show_stat_command(paths: HostPaths = HOST_PATHS) -> str:
    """``show stat`` (CSV) from the runtime API, run on the balancer host as root (0600)."""
    return f"printf 'show stat\\n' | socat -t 5 - UNIX-CONNECT:{paths.socket}"


@dataclass(frozen=True)
class ServerState:
    backend: str
    host: str              # the server's name (``Server.id``)
    status: str            # UP, DOWN, UP 1/2 (failing), DOWN 1/2 (recovering), MAINT, DRAIN
    check: str = ""        # last check: L7OK, L7STS, L4CON, ...
    check_code: str = ""   # HTTP status of the last check

    @property
    def in_rotation(self) -> bool:
        """Gets new requests: UP (also "UP 1/2": failing, not out yet)."""
        return self.status.startswith("UP")


def parse_stat_csv(text: str) -> list[ServerState]:
    """The server rows of ``show stat`` CSV (frontends, backends' totals left out)."""
    lines = text.strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not HAProxy 'show stat' output: {text.strip()[:120]!r}")
    reader = csv.DictReader([lines[0][2:], *lines[1:]])
    return [ServerState(backend=row.get("pxname", ""), host=row.get("svname", ""),
                        status=row.get("status", ""), check=row.get("check_status", ""),
                        check_code=row.get("check_code", ""))
            for row in reader if row.get("type") == "2"]  # 0 frontend, 1 backend, 2 server
