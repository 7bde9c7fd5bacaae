"""The ledger: what this host runs, and a line of history each time that changes.

``/var/lib/rigfleet/state.json`` holds the active stack and the pins it runs (other keys in
it, such as the gate's last result, are kept). ``/var/lib/rigfleet/ledger.jsonl`` gets one
JSON line appended only when the active stack or a pin changed: stack, image, digest, Genesis
commit, model revision, time, by whom. A converged host appends nothing.

Example::

    ledger(ctx)
"""

from __future__ import annotations

import io
import json
import shlex
from datetime import UTC, datetime
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from rigfleet.facts import TextFile
from roles.preflight import HostContext

STATE_DIR = "/var/lib/rigfleet"
STATE_FILE = f"{STATE_DIR}/state.json"
LEDGER_FILE = f"{STATE_DIR}/ledger.jsonl"


def desired_state(ctx: HostContext) -> dict[str, Any]:
    """The facts the ledger tracks; a difference in any of them is a ledger entry."""
    pinned = ctx.desired
    genesis = pinned.genesis.commit if pinned.genesis is not None else None
    return {
        "stack": ctx.stack,
        "image": pinned.image,
        "digest": pinned.digest,
        "vllm_version": pinned.vllm_version,
        "genesis_commit": genesis,
        "model_repo": ctx.pins.model.repo,
        "model_revision": ctx.pins.model.revision,
        "driver_branch": ctx.pins.driver_branch,
        "toolkit_version": ctx.pins.toolkit_version,
        "pins_serial": ctx.pins.serial,
    }


def _read_state(text: str | None) -> dict[str, Any]:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


@operation()
def record(state: dict[str, Any], by: str):
    """Write state.json and append to the ledger when ``state`` differs from the recorded one.

    + state: ``desired_state(ctx)``
    + by: who deployed (``HostContext.by``)
    """
    current = _read_state(host.get_fact(TextFile, path=STATE_FILE))
    if all(current.get(k) == v for k, v in state.items()):
        host.noop(f"state.json already records {state['stack']} at serial {state['pins_serial']}")
        return
    now = datetime.now(UTC).isoformat(timespec="seconds")
    previous = {k: current.get(k) for k in state} if current else None
    entry = {"time": now, "by": by, "host": host.name, **state, "previous": previous}
    new_state = {**current, **state, "since": now, "by": by}
    yield from files.put._inner(
        src=io.StringIO(json.dumps(new_state, indent=2, sort_keys=True) + "\n"),
        dest=STATE_FILE,
        user="root",
        group="root",
        mode="0644",
    )
    line = json.dumps(entry, sort_keys=True)
    yield f"printf '%s\\n' {shlex.quote(line)} >> {LEDGER_FILE} && chmod 0644 {LEDGER_FILE}"


@deploy("Ledger")
def ledger(ctx: HostContext) -> None:
    """Record the active stack and pins; append history only when they changed."""
    files.directory(
        name=f"Directory {STATE_DIR}", path=STATE_DIR, user="root", group="root", mode="0755"
    )
    record(
        name=f"Record {ctx.stack} in state.json and the ledger",
        state=desired_state(ctx),
        by=ctx.by,
    )
