"""The active record: what passed the gate on this host, and how records stay consistent.

``active.json`` + the compose snapshot (``Layout.active_dir``) say what serves (or served
last); ``record_pins`` records pins that changed without a swap; ``mark_interrupted`` gives a
transaction that died without a result its result and ledger line; ``prune_journals`` keeps
the transaction journals bounded; ``request_reset`` tells the supervisor that someone else
brought the verified stack back (its count of recreations starts again).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any

from . import ledger
from .journal import Journal
from .layout import Layout
from .lock import HostLock
from .plan import Active, Plan, PlanError, StackRef
from .steps import EXIT_FAILED

KEEP_JOURNALS = 50


def read_active(lay: Layout) -> Active | None:
    """``active.json`` (None when nothing was ever verified on this host)."""
    try:
        data = json.loads(lay.active_json.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise PlanError(f"{lay.active_json}: unreadable ({e})") from None
    return Active.from_dict(data)


def snapshot_gate(active: Active) -> dict[str, Any]:
    """The gate record of a stack brought back from its snapshot without a gate (boot,
    reroute, the supervisor): the gate it passed at promotion, saying so."""
    return {**active.gate, "note": f"verified at promotion {active.since}"}


def write_active(lay: Layout, active: Active, compose_text: str) -> None:
    """Snapshot the verified compose file and record it as active (both atomic)."""
    lay.active_dir.mkdir(parents=True, exist_ok=True)
    tmp = lay.active_compose.with_name(".compose.yaml.tmp")
    tmp.write_text(compose_text)
    tmp.replace(lay.active_compose)
    tmp = lay.active_json.with_name(".active.json.tmp")
    tmp.write_text(json.dumps(active.to_dict(), indent=2, sort_keys=True) + "\n")
    tmp.replace(lay.active_json)


def request_reset(lay: Layout, by: str, why: str) -> dict[str, Any]:
    """Ask the supervisor (``rigfleet.hostside.supervise``) to forget its recreations and a
    give-up: ``ensure`` and a rolled-back swap brought the verified stack back, or a person
    fixed what made it die (``rigfleet-host.pyz supervise --reset``). A new active stack
    (a promotion) resets it without asking. Written atomically; the supervisor only reads it::

        request_reset(lay, "alice@laptop", "freed the cards")   # {"token": ..., "at": ...}
    """
    request = {"token": f"{time.time():.6f}-{os.getpid()}-{secrets.token_hex(4)}",
               "at": ledger.now_iso(), "by": by, "why": why}
    ledger.atomic_write(lay.supervise_reset, json.dumps(request, sort_keys=True) + "\n")
    return request


def prune_journals(lay: Layout, keep: int = KEEP_JOURNALS) -> list[str]:
    """Drop the oldest finished journals (transactions, ensure and shutdown runs) beyond
    ``keep``; ones without a result are never dropped (``mark_interrupted`` needs them)."""
    if not lay.swaps_dir.exists():
        return []
    done = sorted((d for d in lay.swaps_dir.iterdir() if (d / "result.json").exists()),
                  key=lambda d: (d / "result.json").stat().st_mtime)
    dropped = []
    for directory in done[:-keep] if len(done) > keep else []:
        for child in sorted(directory.iterdir()):
            child.unlink(missing_ok=True)
        directory.rmdir()
        dropped.append(directory.name)
    return dropped


def mark_interrupted(lay: Layout, journal: Journal, exclude: str = "") -> list[str]:
    """Transactions that died without a result (killed, host rebooted): give each a result
    and a ledger line, so the ledger never leaves one hanging."""
    found = []
    for directory in sorted(lay.swaps_dir.glob("*")) if lay.swaps_dir.exists() else []:
        if directory.name == exclude or not (directory / "pid.json").exists() \
                or not (directory / "plan.json").exists():
            continue
        state = Journal.read(directory, since=10**9)
        if state["state"] != "died":
            continue
        found.append(directory.name)
        reason = "the transaction's process ended without a result (killed or rebooted)"
        result = {"result": "interrupted", "exit": EXIT_FAILED, "reason": reason}
        (directory / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        try:
            plan = Plan.load(directory / "plan.json")
            tried, by = plan.desired, plan.by
        except PlanError:
            tried, by = None, ""
        try:
            active = read_active(lay)
        except PlanError:
            active = None
        # What serves next is the active (verified) stack: Ensure brings it back.
        ledger.append(lay, ledger.entry("interrupted", "interrupted",
                                        active.ref if active else None, attempted=tried,
                                        deploy_id=directory.name, by=by,
                                        reason=reason))
        journal.event("recover", f"transaction {directory.name} was interrupted; recorded")
    return found


def record_pins(lay: Layout, tracked: dict[str, Any], config_hash: str, by: str = "",
                deploy_id: str = "", host: str = "") -> str:
    """Record pins that changed without a swap (driver branch, toolkit, pins serial) in
    ``state.json``, the active record and the ledger (``event: "pins"``); returns
    ``recorded`` or ``unchanged``. Refuses (``PlanError``) when the active stack is not the
    one the deploy rendered: only a swap may change what runs."""
    lock = HostLock(lay)
    lock.acquire(by or "unknown", "record pins", deploy_id)
    try:
        active = read_active(lay)
        if active is None or active.ref.config_hash != config_hash \
                or active.ref.stack != tracked.get("stack"):
            raise PlanError(f"the active stack is {active.ref.route_id if active else 'none'}, "
                            f"not {tracked.get('stack')}/{config_hash}: not recording its pins")
        state = ledger.read_state(lay)
        if all(state.get(k) == v for k, v in tracked.items()) \
                and active.ref.record == {**active.ref.record, **tracked}:
            return "unchanged"
        previous = {k: state.get(k) for k in tracked}
        ref = StackRef(**{**active.ref.to_dict(), "record": {**active.ref.record, **tracked}})
        write_active(lay, Active(ref, active.since, active.deploy_id, active.by, active.gate),
                     lay.active_compose.read_text())
        ledger.update_state(lay, **tracked, since=ledger.now_iso(), by=by)
        ledger.append(lay, ledger.entry("pins", "recorded", ref, host=host, by=by,
                                        deploy_id=deploy_id, gate=active.gate,
                                        extra={"previous": previous}))
        return "recorded"
    finally:
        lock.release()
