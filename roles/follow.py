"""Follow a host-tool job (swap, window close): progress, gate reports, ``box["error"]``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinfra import host

from rigfleet.commands import hosttool
from rigfleet.hostside.drain import drain_note
from rigfleet.hostside.journal import START_GRACE_S
from roles.ops import DeployError, connector_kwargs, run_on_host

POLL_S = 2.0
# Consecutive failed polls before the deploy gives up following (the host carries on).
MAX_MISSES = 8


def reports_root() -> Path:
    """``reports/`` next to where pyinfra runs (the repository root; git-ignored)."""
    return Path(os.environ.get("RIGFLEET_REPORTS_DIR") or Path.cwd() / "reports")


def fetch_reports(result: dict[str, Any], dest: Path) -> list[Path]:
    gate = result.get("gate") or {}
    got = []
    for remote in filter(None, (gate.get("report"), gate.get("report_md"))):
        dest.mkdir(parents=True, exist_ok=True)
        local = dest / Path(str(remote)).name
        try:
            if host.get_file(str(remote), str(local), **connector_kwargs()):
                got.append(local)
        except Exception as e:  # the swap's outcome matters more than its copy
            host.log(f"swap: could not copy {remote}: {e}")
    return got


def failure_tail(result: dict[str, Any], reports: list[Any], stack: str) -> str:
    """The gate report, boot failure and kept log of a job that did not succeed."""
    md = next((str(p) for p in reports if str(p).endswith(".md")), None)
    tail = f" Gate report: {md}." if md else ""
    if result.get("boot_failure"):
        tail += f" Boot failure: {result['boot_failure'].get('title')}."
    if result.get("kept_log"):
        tail += f" {stack}'s log is kept on the host: {result['kept_log']}."
    return tail


def outcome_message(name: str, result: dict[str, Any], reports: list[Path]) -> str:
    """One message for a transaction that did not promote."""
    stack = result.get("stack")
    reason = str(result.get("reason") or "no reason recorded").rstrip(".")
    tail = failure_tail(result, reports, str(stack))
    if (result.get("drain") or {}).get("cut"):
        tail += f" {drain_note(result).lstrip('; ')}."
    if (what := result.get("result")) == "rolled-back":
        return (f"{name}: swap to {stack} rolled back ({result.get('phase')} failed): "
                f"{reason}. {result.get('serving')} serves again.{tail}")
    if what == "refused":
        return f"{name}: swap to {stack} {reason}"
    if what == "locked":
        return f"{name}: {reason}"
    return (f"{name}: swap to {stack} failed ({result.get('phase')}): {reason}. The front "
            f"routes to {result.get('serving') or 'nothing'} (503 unless a verified stack "
            f"serves).{tail}")


def follow(swap_id: str, timeout_s: float, reports: str, box: dict[str, str],
           describe: Callable[[str, dict[str, Any], list[Path]], str] = outcome_message,
           label: str = "swap", unit: str | None = None) -> None:
    """At execution time: follow a host job; ``box["error"]`` is set unless it succeeded."""
    unit = unit or hosttool.unit_name(swap_id)
    try:
        t0 = time.monotonic()
        since, misses, data = 0, 0, None
        where = f"{hosttool.tool('status', '--id', swap_id)} or journalctl -u {unit}"
        while True:
            try:
                ok, out, err = run_on_host(hosttool.status(swap_id, since))
                data = json.loads(out[-1]) if ok and out else None
                problem = "" if data else " ".join(err[-2:]) or "no answer"
            except Exception as e:  # a dropped connection: the host carries on regardless
                data, problem = None, f"{type(e).__name__}: {e}"
            misses = misses + 1 if data is None else 0
            if misses >= MAX_MISSES:
                raise DeployError(f"{host.name}: lost contact while following {label} "
                                  f"{swap_id} ({problem}); the transaction continues on the "
                                  f"host: {where}")
            if data is not None:
                for event in data.get("events") or []:
                    host.log(f"{label} {event.get('phase')}: {event.get('message')}")
                since = int(data.get("next", since))
                if data.get("state") == "done":
                    break
                # Until the job it just started writes its journal, the host judges it by
                # the plan's age, which may predate the start (a swap that waited for a slot).
                if data.get("state") == "died" and (since or time.monotonic() - t0 > START_GRACE_S):
                    raise DeployError(f"{host.name}: {label} {swap_id} ended without a result "
                                      f"(killed?); see {where}")
                if data.get("state") == "starting" and time.monotonic() - t0 > START_GRACE_S:
                    # Its journal never appeared (a close's has no plan.json to age).
                    raise DeployError(f"{host.name}: {label} {swap_id} did not start (no "
                                      f"journal after {START_GRACE_S:g}s); see {where}")
            if time.monotonic() - t0 > timeout_s:
                raise DeployError(f"{host.name}: {label} {swap_id} still running after "
                                  f"{timeout_s:g}s; it continues on the host: {where}")
            time.sleep(POLL_S)
        assert data is not None
        result = data.get("result") or {}
        copied = fetch_reports(result, Path(reports) / host.name)
        if copied:
            host.log(f"{label}: gate report copied to {', '.join(str(p) for p in copied)}")
        if result.get("exit") != 0:
            raise DeployError(describe(host.name, result, copied))
        host.log(f"{label}: {result.get('result')}: {result.get('serving')} serves "
                 f"(503 window {result.get('window_s') or 0:.1f}s{drain_note(result)})")
    except DeployError as e:
        box["error"] = str(e)
