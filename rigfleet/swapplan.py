"""Control-side decisions about a host's serving stack (pure): the swap plan the host-side
transaction runs (``build_plan``), and what the deploy must do (``decide``): ``none``
(converged), ``adopt`` (it serves but was never recorded), ``ensure`` (the recorded stack is
not up or not routed), ``activate`` / ``swap`` / ``update`` (a gated transaction)::

    decision = decide(probe, want.current.ref)
    decision.kind, decision.reason      # ('swap', 'int8/0a1b... -> tq3-mtp-genesis/9f8e...')
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rigfleet.desired import DesiredHost
from rigfleet.hostside.plan import Plan, StackRef, change_kind

# One id per control-side run: the swap unit, its directory and the ledger lines carry it.
DEPLOY_ID = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def build_plan(want: DesiredHost, by: str, why: str, deploy_id: str = DEPLOY_ID) -> Plan:
    """The transaction to ``want``'s desired stack (``by``, ``why``: for the lock and ledger)."""
    swap = want.settings.swap
    # Host data drain_timeout_s, else each stack file's drain.timeout_s.
    drain = {name: s.spec.drain_timeout_s if swap.drain_timeout_s is None else swap.drain_timeout_s
             for name, s in want.stacks.items()}
    return Plan(
        id=deploy_id,
        by=by,
        why=why,
        host=want.name,
        desired=want.current.ref,
        projects=want.projects,
        front_port=want.settings.front_port,
        gate_profile=swap.gate_profile,
        gate_set=want.current.gate_set,
        ready_timeout_s=swap.ready_timeout_s,
        vram_timeout_s=swap.vram_timeout_s,
        gate_timeout_s=swap.gate_timeout_s,
        retry_after_s=swap.retry_after_s,
        drain_timeout_s=drain[want.stack],
        drain_timeouts=drain,
    )


@dataclass(frozen=True)
class Decision:
    kind: str  # none, adopt, ensure, activate, swap or update
    reason: str
    change: str = ""  # "int8/<hash> -> tq3-mtp-genesis/<hash>" (for the lock's "why")


def decide(probe: dict[str, Any], desired: StackRef) -> Decision:
    """What the deploy must do on a host, from its probe (``SwapProbe``)."""
    c = (probe.get("containers") or {}).get(desired.container) or {}
    # The pinned digest: the image's own, or the base a derived (runtime) image was built from.
    digest = str(desired.record.get("digest") or desired.image_ref.rpartition("@")[2])
    # Running, from the rendered config, and from the pinned image (a compose file edited by
    # hand keeps the labels but not the image).
    up = (c.get("status") == "running" and c.get("hash") == desired.config_hash
          and ("digests" not in c or digest in c["digests"]))
    if active := (probe.get("active") or {}).get("ref") or {}:
        current = f"{active.get('stack')}/{active.get('config_hash')}"
        if current == desired.route_id:
            if up and probe.get("route") == desired.route_id:
                return Decision("none", f"{desired.route_id} is active, running and routed")
            if up:
                why = f"the front routes to {probe.get('route')}"
            elif c.get("status") == "running":
                why = (f"{desired.container} runs {c.get('image') or 'something else'} "
                       f"(config {c.get('hash') or 'unlabelled'})")
            else:
                why = f"{desired.container} is {c.get('status') or 'missing'}"
            return Decision("ensure", f"{desired.route_id} is active but {why}: bring it back "
                            "(recreated from its snapshot, no gate)")
        change = f"{current} -> {desired.route_id}"
        return Decision(change_kind(str(active.get("stack")), desired.stack),
                        f"{change} (stop, start, gate, promote or roll back)", change)
    if up and (probe.get("state") or {}).get("stack") == desired.stack:
        return Decision("adopt", f"{desired.route_id} serves but no swap recorded it: record "
                        "it as active")
    return Decision(change_kind(None, desired.stack), f"nothing verified here -> "
                    f"{desired.route_id} (start, gate, promote; on failure the front answers "
                    "503)", f"-> {desired.route_id}")
