"""Which GPU hosts each balancer has in rotation, from HAProxy's ``show stat`` over SSH::

    rows = balancer_rows(lb, hosts, SshRemote())
    [(r.stack, r.up) for r in rows]        # [('int8', ['host1', 'host2'])]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rigfleet.balancer.haproxy import ServerState, parse_stat_csv, show_stat_command
from rigfleet.balancer.plan import BalancerPlan, fleet_plan, url_host
from rigfleet.errors import RigfleetError
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import HostUnreachable, Remote


@dataclass
class BalancerRow:
    """One stack on one balancer (``--json`` prints these as objects)."""

    balancer: str
    url: str
    stack: str | None
    up: list[str] = field(default_factory=list)
    out: list[tuple[str, str]] = field(default_factory=list)  # (host, why)
    reachable: bool = True
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.reachable and self.error is None and bool(self.up)


def balancer_url(plan: BalancerPlan, host: InventoryHost) -> str:
    """``balancer_url``, else its SSH address and port."""
    s = plan.settings
    return (s.url or f"{s.scheme}://{url_host(host.ssh_target[0])}:{s.port}").rstrip("/")


def balancer_rows(lb: InventoryHost, hosts: Sequence[InventoryHost], remote: Remote,
                  timeout: float = 20.0) -> list[BalancerRow]:
    """One row per stack of ``lb``'s plan; never raises (a problem is the row's ``error``)."""
    try:
        plan = fleet_plan(lb, hosts)
    except RigfleetError as e:
        return [BalancerRow(lb.name, "-", None, reachable=False,
                            error=f"inventory: {str(e).splitlines()[0]}")]
    url = balancer_url(plan, lb)
    try:
        rc, out = remote.run(lb, show_stat_command(), timeout=timeout)
        if rc != 0:
            raise ValueError(f"show stat exited {rc}: {out.strip()[-200:]}")
        servers = parse_stat_csv(out)
    except HostUnreachable as e:
        return [BalancerRow(lb.name, url, p.stack, reachable=False, error=str(e))
                for p in plan.pools]
    except ValueError as e:
        return [BalancerRow(lb.name, url, p.stack, error=f"HAProxy's runtime API: {e}")
                for p in plan.pools]
    return rotation(lb.name, url, plan, servers)


def rotation(lb: str, url: str, plan: BalancerPlan,
             servers: Sequence[ServerState]) -> list[BalancerRow]:
    """Per stack of ``plan``: its hosts in rotation and out (a host the running HAProxy does
    not know yet, its config not reloaded, is out: "not in the running config")."""
    by_backend = {(s.backend, s.host): s for s in servers}
    rows = []
    for pool in plan.pools:
        row = BalancerRow(lb, url, pool.stack)
        for srv in pool.servers:
            if (state := by_backend.get((pool.backend, srv.id))) is None:
                row.out.append((srv.host, "not in the running config"))
            elif state.in_rotation:
                row.up.append(srv.host)
            else:
                check = f" ({state.check} {state.check_code}".rstrip() + ")" if state.check else ""
                row.out.append((srv.host, state.status + check))
        rows.append(row)
    return rows
