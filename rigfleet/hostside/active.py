"""The active record (what passed the gate here): ``active.json`` and the compose snapshot it
names; the write order and the rebuild of a damaged one: docs/maintenance.md."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import ledger
from .atomic import fsync_dir, move_aside, write_atomic, write_json
from .journal import Journal
from .layout import Layout
from .lock import HostLock
from .plan import Active, Plan, PlanError, StackRef, compose_hash
from .records import decode_strict, ledger_tail, now_iso, read_state, read_text
from .steps import EXIT_FAILED

KEEP_JOURNALS = 50
STALE_TMP_S = 60.0  # a temporary file of the active directory older than this was abandoned
# Ledger results whose line wrote active.json (its "ref" is the record).
WROTE_ACTIVE = ("promoted", "adopted", "recorded", "recovered", "closed")


class ActiveDamaged(PlanError):
    """``active.json`` cannot be read (nor, with repair, rebuilt); says what to do."""


def parse_active(lay: Layout) -> tuple[Active | None, str]:
    """(record, "") or (None, why it is damaged); (None, "") when there is none."""
    try:
        text = lay.active_json.read_text()
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"cannot be read ({e.strerror})"
    except UnicodeDecodeError as e:  # garbage: not even text
        return None, f"is not UTF-8 text ({e.reason} at byte {e.start})"
    if not text.strip():
        return None, "is empty"
    try:
        return Active.from_dict(json.loads(text)), ""
    except PlanError as e:  # a ValueError too: caught before the JSON error
        return None, f"is not an active record ({e})"
    except ValueError as e:
        return None, f"is not JSON ({e}; truncated?)"


def load_active(lay: Layout, repair: bool = False, by: str = "") -> Active | None:
    """The active record; None when nothing was ever verified here. A damaged one raises
    ``ActiveDamaged``, or with ``repair`` (the caller holds the host lock) is rebuilt."""
    active, problem = parse_active(lay)
    if active is not None:
        snap = Path(active.ref.compose_file)
        if compose_hash(read_text(snap) or "") == active.ref.config_hash:
            if repair and snap == lay.active_compose and not snap.is_symlink():
                return write_active(lay, active)  # the older layout
            return active
        problem = (f"names the snapshot {snap}, which is missing or not config "
                   f"{active.ref.config_hash}")
        text = _compose_for(lay, active.ref, active.deploy_id) if repair else None
        if text is not None:
            return _recovered(lay, active, text, by, f"{lay.active_json} {problem}; the "
                              "snapshot was written again from a compose file with the same "
                              "config hash")
    elif not problem:
        return None
    where = f"{lay.active_json} {problem}"
    if not repair:
        raise ActiveDamaged(f"{where}; the next ensure, swap or deploy rebuilds it from the ledger")
    rebuilt, missing = recover_active(lay)
    if rebuilt is None:
        raise ActiveDamaged(f"{where}, and it cannot be rebuilt ({missing}): run the deploy "
                            "(it activates the inventory's stack through the gate); the front "
                            "answers 503 until then")
    aside = move_aside(lay.active_json)
    return _recovered(lay, *rebuilt, by, f"{where}; rebuilt from the ledger"
                      + (f" (damaged file kept: {aside})" if aside else ""))


def _recovered(lay: Layout, active: Active, text: str, by: str, reason: str) -> Active:
    written = write_active(lay, active, text)
    ledger.append(lay, "recover", "recovered", written.ref, by=by, deploy_id=active.deploy_id,
                  gate=active.gate, active=True, reason=reason)
    return written


def _line_ref(lay: Layout, line: dict[str, Any]) -> StackRef | None:
    """The record a ledger line wrote: its ``ref``, else its transaction's plan."""
    with contextlib.suppress(PlanError):
        if isinstance(line.get("ref"), dict):
            return decode_strict(StackRef, line["ref"], "ledger.ref", PlanError)
        deploy_id = str(line.get("deploy_id") or "")
        if deploy_id and "/" not in deploy_id:
            return Plan.load(lay.plan_file(deploy_id)).desired
    return None


def _compose_for(lay: Layout, ref: StackRef, deploy_id: str) -> str | None:
    """Compose text with ``ref``'s config hash, from wherever one is left."""
    places = [lay.active_snapshot(ref.config_hash), lay.active_compose,
              Path(ref.compose_file), lay.compose_file(ref.stack)]
    if deploy_id and "/" not in deploy_id:
        places.insert(2, lay.swap_dir(deploy_id) / "compose.yaml")
    texts = (read_text(place) for place in places)
    return next((t for t in texts if t is not None and compose_hash(t) == ref.config_hash), None)


def recover_active(lay: Layout) -> tuple[tuple[Active, str] | None, str]:
    """((record, compose text), "") rebuilt from the ledger, or (None, what is missing)."""
    lines, _, problem = ledger_tail(lay.ledger_file, n=10**9)
    if not lines:
        return None, f"the ledger {lay.ledger_file} has no usable line ({problem or 'empty'})"
    last = lines[-1]
    for line in reversed(lines):
        if line.get("result") not in WROTE_ACTIVE or not line.get("stack"):
            continue
        ref = _line_ref(lay, line)
        if ref is None or ref.config_hash != line.get("config_hash"):
            continue
        deploy_id = str(line.get("deploy_id") or "")
        text = _compose_for(lay, ref, deploy_id)
        if text is None:
            return None, (f"no compose file with config {ref.config_hash} of {ref.stack} is "
                          f"left ({lay.active_dir}, {lay.swaps_dir}/{deploy_id}, "
                          f"{lay.compose_file(ref.stack)})")
        if last.get("stack") == ref.stack and last.get("config_hash") == ref.config_hash:
            # Pins recorded after it (driver, toolkit) are on the last line.
            pins = {k: last[k] for k in ledger.TRACKED_KEYS if k in last}
            ref = replace(ref, record={**ref.record, **pins})
        gate = line.get("gate")
        return (Active(ref, str(line.get("time") or ""), deploy_id, str(line.get("by") or ""),
                       dict(gate) if isinstance(gate, dict) else {}), text), ""
    return None, (f"no line of {lay.ledger_file} records a verified stack (promoted, adopted "
                  "or recorded) that its transaction's files still describe")


def write_active(lay: Layout, active: Active, compose_text: str | None = None) -> Active:
    """Record ``active`` and its snapshot (``compose_text``, else its compose file's text);
    older snapshots stay until ``prune_snapshots`` (a failed front switch puts one back)."""
    if compose_text is None:
        compose_text = Path(active.ref.compose_file).read_text()
    if (found := compose_hash(compose_text)) != active.ref.config_hash:
        raise PlanError(f"the snapshot of {active.ref.route_id} has config hash {found}")
    snap = lay.active_snapshot(active.ref.config_hash)
    if read_text(snap) != compose_text:
        write_atomic(snap, compose_text)
    record = replace(active, ref=replace(active.ref, compose_file=str(snap)))
    write_json(lay.active_json, record.to_dict())
    link = lay.active_compose
    if not (link.is_symlink() and os.readlink(link) == snap.name):
        tmp = link.with_name(f".{link.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
        os.symlink(snap.name, tmp)
        os.replace(tmp, link)
        fsync_dir(link.parent)
    return record


def prune_snapshots(lay: Layout) -> None:
    """Remove snapshots ``active.json`` does not name and stale temporary files."""
    active, _ = parse_active(lay)
    named = Path(active.ref.compose_file).name if active else None
    for path in lay.active_dir.glob("compose-*.yaml"):
        if path.name != named:
            path.unlink(missing_ok=True)
    for path in lay.active_dir.glob(".*.tmp"):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
            if time.time() - path.lstat().st_mtime > STALE_TMP_S:
                path.unlink()


def request_reset(lay: Layout, by: str, why: str) -> None:
    """Ask the supervisor to forget its recreations and a give-up."""
    token = f"{time.time():.6f}-{os.getpid()}-{secrets.token_hex(4)}"
    write_json(lay.supervise_reset, {"token": token, "at": now_iso(), "by": by, "why": why},
               indent=None)


def prune_journals(lay: Layout) -> None:
    """Drop the oldest finished journals beyond ``KEEP_JOURNALS`` (unfinished ones stay)."""
    done = sorted(lay.swaps_dir.glob("*/result.json"), key=lambda p: p.stat().st_mtime)
    for result in done[:-KEEP_JOURNALS]:
        shutil.rmtree(result.parent)


def mark_interrupted(lay: Layout, journal: Journal, exclude: str = "") -> None:
    """Give each transaction that died without a result a result and a ledger line."""
    for directory in sorted(lay.swaps_dir.glob("*")):
        if directory.name == exclude or not (directory / "pid.json").exists() \
                or not (directory / "plan.json").exists() \
                or Journal.read(directory, since=10**9)["state"] != "died":
            continue
        reason = "the transaction's process ended without a result (killed or rebooted)"
        write_json(directory / "result.json",
                   {"result": "interrupted", "exit": EXIT_FAILED, "reason": reason})
        try:
            plan = Plan.load(directory / "plan.json")
            tried, by = plan.desired, plan.by
        except PlanError:
            tried, by = None, ""
        active = None
        with contextlib.suppress(PlanError):
            active = load_active(lay)
        # What serves next is the active (verified) stack: Ensure brings it back.
        ledger.append(lay, "interrupted", "interrupted", active.ref if active else None,
                      attempted=tried, deploy_id=directory.name, by=by, reason=reason)
        journal.event("recover", f"transaction {directory.name} was interrupted; recorded")


def record_pins(lay: Layout, tracked: dict[str, Any], config_hash: str, by: str = "",
                deploy_id: str = "", host: str = "") -> str:
    """Record pins that changed without a swap (driver, toolkit, pins serial): ``recorded`` or
    ``unchanged``; ``PlanError`` when the active stack is not the one the deploy rendered."""
    lock = HostLock(lay)
    lock.acquire(by or "unknown", "record pins", deploy_id)
    try:
        active = load_active(lay, repair=True, by=by)
        if active is None or active.ref.config_hash != config_hash \
                or active.ref.stack != tracked.get("stack"):
            raise PlanError(f"the active stack is {active.ref.route_id if active else 'none'}, "
                            f"not {tracked.get('stack')}/{config_hash}: not recording its pins")
        state = read_state(lay.state_file)
        if all(state.get(k) == v for k, v in tracked.items()) \
                and active.ref.record == {**active.ref.record, **tracked}:
            return "unchanged"
        ref = replace(active.ref, record={**active.ref.record, **tracked})
        written = write_active(lay, replace(active, ref=ref))
        ledger.update_state(lay, **tracked, since=now_iso(), by=by)
        ledger.append(lay, "pins", "recorded", written.ref, host=host, by=by,
                      deploy_id=deploy_id, gate=active.gate, active=True,
                      extra={"previous": {k: state.get(k) for k in tracked}})
        return "recorded"
    finally:
        lock.release()
