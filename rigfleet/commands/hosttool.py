"""Commands of the host-side tool (``rigfleet-host.pyz``): start a swap, follow it, probe."""

from __future__ import annotations

import io
import json
import math
import shlex
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from pyinfra.api import FileUploadCommand

from rigfleet.hostside.layout import BUNDLE_PATH, HOST
from rigfleet.hostside.plan import Plan

PYTHON = "/usr/bin/python3"
# The probe's answer on a host the deploy has not reached yet.
BARE_PROBE = '{"schema": "rigfleet-probe/1", "bare": true}'


def tool(*args: str) -> str:
    return " ".join([PYTHON, BUNDLE_PATH, *(shlex.quote(a) for a in args)])


def unit_name(swap_id: str) -> str:
    return f"rigfleet-swap-{swap_id}"


def _transient(unit: str, plan: Plan, *args: str) -> str:
    """Run the tool as a transient unit: it outlives a dropped SSH session; ``KillMode=mixed``
    lets a stop request reach only the tool, which then stops its gate and rolls back, given
    the plan's time for it (``Plan.stop_timeout_s``)."""
    return (f"systemd-run --unit {shlex.quote(unit)} --collect --quiet --property=KillMode="
            f"mixed --property=TimeoutStopSec={math.ceil(plan.stop_timeout_s)} "
            "--setenv=PYTHONUNBUFFERED=1 " + tool(*args))


def start_swap(plan: Plan) -> str:
    return _transient(unit_name(plan.id), plan, "swap", "--plan", str(HOST.plan_file(plan.id)))


def close_unit(window_id: str) -> str:
    return f"rigfleet-maint-{window_id}"


def maintenance_open(window_id: str, step: str, reboot_grace_s: float | None = None) -> str:
    """Open (or add ``step`` to) the window, held by this SSH session (and a reboot's grace)."""
    grace = ("--reboot-grace-s", f"{reboot_grace_s:g}") if reboot_grace_s is not None else ()
    return tool("maintenance", "open", "--plan", str(HOST.window_plan(window_id)), "--step", step,
                *grace)


def maintenance_ready(packages: bool, lock_wait_s: int = 120) -> str:
    """Before a window opens: apt usable (dpkg repaired, locks waited for) and disk room."""
    apt = ("--packages", "--lock-wait-s", str(lock_wait_s)) if packages else ()
    return tool("maintenance", "ready", *apt)


def maintenance_hold(window_id: str) -> str:
    """Back from the reboot: the window held by this (new) SSH session."""
    return tool("maintenance", "hold", "--plan", str(HOST.window_plan(window_id)))


def start_close(plan: Plan, journal_id: str, cause: str = "") -> str:
    """Close the deploy's own window as a transient unit; ``cause``: why now, for the ledger."""
    return _transient(close_unit(plan.id), plan, "maintenance", "close", "--plan",
                      str(HOST.window_plan(plan.id)), "--journal-id", journal_id, "--own",
                      *(("--cause", cause) if cause else ()))


def upload_atomic(data: bytes, dest: str, mode: str = "0644") -> Iterator[Any]:
    """Upload ``data`` so ``dest`` is the old file or the new one, never a part."""
    tmp = f"{dest}.upload.tmp"
    yield FileUploadCommand(io.BytesIO(data), tmp)
    directory = shlex.quote(str(PurePosixPath(dest).parent))
    yield (f"chmod {mode} {shlex.quote(tmp)} && sync -- {shlex.quote(tmp)} && mv -f -- "
           f"{shlex.quote(tmp)} {shlex.quote(dest)} && sync -- {directory}")


def status(swap_id: str, since: int) -> str:
    """Events after ``since`` and the state (JSON, one line)."""
    return tool("status", "--id", swap_id, "--since", str(int(since)), "--json")


def adopt(swap_id: str) -> str:
    return tool("adopt", "--plan", str(HOST.plan_file(swap_id)))


def ensure(front_port: int, who: str) -> str:
    return tool("ensure", "--front-port", str(int(front_port)), "--who", who,
                "--why", "deploy: the active stack is not serving")


def probe(full: bool = False, model_path: str | None = None,
          front_port: int | None = None, doctor_load_s: float | None = None) -> str:
    """One JSON object (``BARE_PROBE``: no tool); ``doctor_load_s``: the doctor's evidence too."""
    args = ["probe"]
    if full:
        args.append("--full")
        if model_path:
            args += ["--model-path", model_path]
        if front_port:
            args += ["--front-port", str(int(front_port))]
        if doctor_load_s is not None:
            args += ["--doctor", "--load-s", f"{float(doctor_load_s):g}"]
    return (f"if [ -f {shlex.quote(BUNDLE_PATH)} ]; then {tool(*args)}; "
            f"else echo {shlex.quote(BARE_PROBE)}; fi")


def bench(*args: str) -> str:
    return tool("bench", *args)


def record(tracked: dict, config_hash: str, by: str, deploy_id: str, host: str) -> str:
    """Record pins that changed without a swap (state.json, active record, ledger)."""
    return tool("record", "--json", json.dumps(tracked, sort_keys=True), "--config-hash",
                config_hash, "--by", by, "--deploy-id", deploy_id, "--host", host)


def report_failure(message: str) -> str:
    """A command that fails with ``message`` on stderr: pyinfra shows it as the host's error."""
    return f"printf '%s\\n' {shlex.quote(message)} >&2; exit 1"


def lock_show() -> str:
    """Who holds the host lock, as JSON (``null`` when free; ``alive`` by the liveness rule)."""
    return tool("lock", "--json")


def lock_release(reason: str, by: str) -> str:
    """Remove a stale host lock; the host tool refuses a live holder (exit 3)."""
    return tool("lock", "--release", "--reason", reason, "--by", by)
