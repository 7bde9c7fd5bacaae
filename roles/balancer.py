"""HAProxy in front of the GPU hosts' fronts, one backend per stack (docs/balancer.md)."""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import systemd

from rigfleet.balancer.haproxy import HOST_PATHS, keys_list, render_config
from roles.ops import Secret, apt_packages, checked_file, on_change, root_dir, root_put, secret_file
from roles.preflight import BalancerContext

# socat reads the runtime API (rigfleet status); haproxy's tmpfiles.d makes /run/haproxy.
PACKAGES = ["haproxy", "socat"]


@deploy("Balancer (HAProxy)")
def balancer(ctx: BalancerContext) -> None:
    """The key (and certificate), a checked config; a graceful reload only on change."""
    paths = HOST_PATHS
    apt_packages(name="Install HAProxy (and socat for its runtime API)", packages=PACKAGES)
    root_dir(name=f"Directory {paths.secret_dir} (root-only)", path=paths.secret_dir, mode="0700")
    gates = [secret_file(name=f"API key list {paths.keys} (root-only)", dest=paths.keys,
                         content=Secret(keys_list(ctx.api_key.reveal())))]
    if (tls := ctx.settings.tls) is not None and ctx.tls_key is not None:
        cert = Path(tls.cert_file).read_text(encoding="utf-8")
        gates.append(secret_file(name=f"Balancer certificate and key {paths.pem} (root-only)",
                                 dest=paths.pem,
                                 content=Secret(cert.rstrip("\n") + "\n"
                                                + ctx.tls_key.reveal())))
    if tls_servers := [s for p in ctx.plan.pools for s in p.servers if s.ca_file]:
        root_dir(name=f"Directory {paths.ca_dir} (the TLS fronts' CAs)", path=paths.ca_dir)
        for server in host.loop(tls_servers):
            gates.append(root_put(name=f"CA of {server.host}'s front", src=server.ca_file,
                                  dest=paths.ca_file(server.id)))
    stacks = ", ".join(f"{p.stack}: {len(p.servers)} host(s)" for p in ctx.plan.pools)
    conf = checked_file(
        name=f"HAProxy config {paths.config} ({stacks}; checked with haproxy -c first)",
        dest=paths.config, content=render_config(ctx.plan, paths),
        check="haproxy -c -q -f {path}")
    systemd.service(name="HAProxy enabled and running", service="haproxy", running=True,
                    enabled=True)
    on_change(name="Reload HAProxy gracefully (config, key or certificate changed)",
              commands=["systemctl reload-or-restart haproxy"], gates=[conf, *gates],
              reason="balancer unchanged")
