"""The ledger: what this host runs, and a line of history each time that changes.

``state.json`` (``Layout.state_file``) holds the active stack and the pins it runs (other keys
in it, such as the gate's last result, are kept). ``ledger.jsonl`` gets one JSON line per
change. Every activation, swap, rollback and boot-time recreation is written by
the host-side transaction itself (``rigfleet/hostside/ledger.py``), with the gate's result and
report; this role has the same tool (``rigfleet-host record``, under the host lock) record
what changes *without* a swap (a driver branch, the toolkit, the pins serial) in state.json,
the active record and an ``event: "pins"`` line. A converged host appends nothing.

Example::

    ledger(ctx)
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from rigfleet.commands import hosttool
from rigfleet.facts import TextFile, read_fact
from rigfleet.hostside.layout import HOST
from rigfleet.hostside.plan import StackRef
from rigfleet.swapfacts import SwapProbe
from rigfleet.swapplan import DEPLOY_ID, decide
from roles.ops import executing
from roles.preflight import HostContext

STATE_DIR = str(HOST.state_dir)
STATE_FILE = str(HOST.state_file)


def _read_state(text: str | None) -> dict[str, Any]:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


@operation()
def record(state: dict[str, Any], desired: StackRef, by: str, deploy_id: str):
    """Record ``state`` (the tracked keys) when it differs from ``state.json``: the host-side
    tool writes state.json, the active record and a ledger line, under the host lock.

    + state: the tracked keys of the desired stack (``DesiredStack.tracked``)
    + desired: the desired stack as rendered (the active stack must carry its config hash)
    + by: who deployed (``HostContext.by``); deploy_id: this run's id
    """
    current = _read_state(read_fact(TextFile, path=STATE_FILE))
    if all(current.get(k) == v for k, v in state.items()):
        host.noop(f"state.json already records {state['stack']} at serial {state['pins_serial']}")
        return
    if not executing():
        # --dry tells the truth: a swap (or adoption) about to run records these keys itself.
        decision = decide(read_fact(SwapProbe), desired)
        if decision.transaction or decision.kind == "adopt":
            host.noop(f"the swap records {state['stack']} ({decision.kind})")
            return
    yield hosttool.record(state, desired.config_hash, by, deploy_id, host.name)


@deploy("Ledger")
def ledger(ctx: HostContext) -> None:
    """Record the active stack and pins; append history only when they changed."""
    files.directory(
        name=f"Directory {STATE_DIR}", path=STATE_DIR, user="root", group="root", mode="0755"
    )
    record(
        name=f"Record {ctx.want.stack} in state.json and the ledger",
        state=dict(ctx.want.current.tracked),
        desired=ctx.want.current.ref,
        by=ctx.by,
        deploy_id=DEPLOY_ID,
    )
