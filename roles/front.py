"""nginx on ``front_port``: API key required, routes as the host tool says (docs/converge.md)."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import Link
from pyinfra.operations import files, systemd

from rigfleet.facts import read_fact, read_paths
from rigfleet.hostside.front import READY_PATH, render_maintenance
from rigfleet.hostside.layout import HOST
from rigfleet.resources import project_file
from rigfleet.scrape import ENGINE_PATH, NODE_EXPORTER_PORT, NODE_PATH
from roles.ops import Secret, apt_packages, initial_file, on_change, root_dir, root_put, secret_file
from roles.preflight import HostContext

TEMPLATE = str(project_file("files/nginx-front.conf.j2"))
CONF_PATH = "/etc/nginx/conf.d/rigfleet-front.conf"
KEYS_PATH = "/etc/nginx/rigfleet-keys.conf"
ROUTE_DIR = str(HOST.front_dir)
ROUTE_PATH = str(HOST.front_route)
# Debian's and Ubuntu's nginx enable this site (port 80) on install.
DEFAULT_SITE = "/etc/nginx/sites-enabled/default"
TLS_DIR = "/etc/nginx/rigfleet-tls"
CERT_PATH = f"{TLS_DIR}/front.crt"
TLS_KEY_PATH = f"{TLS_DIR}/front.key"
# Retry-After of a readiness answer when the engine does not answer (the supervisor polls
# every few seconds and opens the window itself).
NOT_READY_RETRY_S = 5


def keys_conf(key: str) -> str:
    """The ``map`` that sets ``$rigfleet_authorized`` to 1 for the right bearer token only: a
    case-sensitive regex (nginx compares plain map strings ignoring case)."""
    # Keys hold only [A-Za-z0-9-._~+/=] (preflight): '.' and '+' written as classes, so no
    # backslash reaches nginx's parser.
    literal = "".join(f"[{c}]" if c in ".+" else c for c in key)
    return ("# Managed by rigfleet (roles/front.py). Root-only: it holds the API key.\n"
            "map $http_authorization $rigfleet_authorized {\n"
            "    default 0;\n"
            f'    "~^Bearer {literal}$" 1;\n'
            "}\n")


@operation()
def site_disabled(path: str):
    """Remove an enabled nginx site (a link or a file) when present."""
    if read_fact(Link, path=path) is None:
        host.noop(f"{path} is not there")
        return
    yield f"rm -f {shlex.quote(path)}"


@deploy("Front (nginx)")
def front(ctx: HostContext) -> None:
    settings = ctx.want.settings
    apt_packages(name="Install nginx", packages=["nginx"])
    tls_paths = (TLS_DIR, CERT_PATH, TLS_KEY_PATH) if settings.front_tls else ()
    read_paths([DEFAULT_SITE, *tls_paths, ROUTE_DIR, ROUTE_PATH, KEYS_PATH, CONF_PATH])
    gates = [site_disabled(name=f"Disable nginx's default site {DEFAULT_SITE} (only the front "
                                "listens)", path=DEFAULT_SITE)]
    tls = settings.front_tls
    if tls is not None and ctx.tls_key is not None:
        root_dir(name=f"Directory {TLS_DIR} (root-only)", path=TLS_DIR, mode="0700")
        gates.append(root_put(name=f"Front certificate {CERT_PATH}", src=tls.cert_file,
                               dest=CERT_PATH))
        gates.append(secret_file(name=f"Front private key {TLS_KEY_PATH} (root-only)",
                                 dest=TLS_KEY_PATH, content=ctx.tls_key))
    root_dir(name=f"Directory {ROUTE_DIR}", path=ROUTE_DIR)
    route = initial_file(
        name=f"Front route {ROUTE_PATH} (503 until a stack passes the gate; only if missing)",
        dest=ROUTE_PATH, content=render_maintenance("no verified stack on this host yet",
                                                    settings.swap.retry_after_s))
    keys = secret_file(name=f"API key map {KEYS_PATH} (root-only)", dest=KEYS_PATH,
                       content=Secret(keys_conf(ctx.api_key.reveal())))
    conf = files.template(
        name=f"Front on port {settings.front_port} ({settings.front_scheme})", src=TEMPLATE,
        dest=CONF_PATH, user="root", group="root", mode="0644", front_port=settings.front_port,
        keys_file=KEYS_PATH, route_file=ROUTE_PATH, tls=tls is not None, cert_file=CERT_PATH,
        key_file=TLS_KEY_PATH, ready_path=READY_PATH, not_ready_retry_s=NOT_READY_RETRY_S,
        node_metrics_path=NODE_PATH, engine_metrics_path=ENGINE_PATH,
        node_exporter_port=NODE_EXPORTER_PORT)
    systemd.service(name="nginx enabled and running", service="nginx", running=True, enabled=True)
    # An older host tool's route sets its own proxy timeouts, which the template now sets:
    # dropped before nginx -t, or nginx refuses the duplicates.
    on_change(name=f"Front route {ROUTE_PATH} without its own proxy timeouts (front changed)",
              commands=[f"sed -i -e '/^proxy_read_timeout /d' -e '/^proxy_send_timeout /d' "
                        f"{shlex.quote(ROUTE_PATH)}"],
              gates=[conf], reason="front unchanged")
    on_change(name="Test and reload nginx (front changed)",
              commands=["nginx -t -q", "systemctl reload nginx"],
              gates=[keys, conf, route, *gates], reason="front unchanged")
