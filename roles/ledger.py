"""What changes without a swap, recorded in ``state.json`` and the ledger (docs/swap.md)."""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation

from rigfleet.commands import hosttool
from rigfleet.facts import SwapProbe, read_fact
from rigfleet.hostside.layout import HOST
from rigfleet.hostside.plan import StackRef
from rigfleet.swapplan import DEPLOY_ID, decide
from roles.ops import executing, root_dir
from roles.preflight import HostContext


@operation()
def record(state: dict[str, Any], desired: StackRef, by: str, deploy_id: str):
    """Record ``state`` when ``state.json`` differs, unless a swap about to run does."""
    # The probe read state.json while preparing (``None`` when missing or not an object).
    current = read_fact(SwapProbe).get("state") or {}
    if all(current.get(k) == v for k, v in state.items()):
        host.noop(f"state.json already records {state['stack']} at serial {state['pins_serial']}")
        return
    # --dry tells the truth: a swap (or adoption) about to run records these keys itself.
    if not executing() and (kind := decide(read_fact(SwapProbe), desired).kind) in (
            "activate", "swap", "update", "adopt"):
        host.noop(f"the swap records {state['stack']} ({kind})")
        return
    yield hosttool.record(state, desired.config_hash, by, deploy_id, host.name)


@deploy("Ledger")
def ledger(ctx: HostContext) -> None:
    root_dir(name=f"Directory {HOST.state_dir}", path=str(HOST.state_dir))
    record(name=f"Record {ctx.want.stack} in state.json and the ledger",
           state=dict(ctx.want.current.tracked), desired=ctx.want.current.ref, by=ctx.by,
           deploy_id=DEPLOY_ID)
