"""Commands of the host-side tool (``rigfleet-host.pyz``): start a swap, follow it, probe.

Example::

    from rigfleet.commands import hosttool

    hosttool.start_swap("20261129T101500Z-1a2b3c")
    # 'systemd-run --unit rigfleet-swap-20261129T101500Z-1a2b3c --collect --quiet ...'
"""

from __future__ import annotations

import io
import json
import shlex
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from pyinfra.api import FileUploadCommand

from rigfleet.hostside.layout import BUNDLE_PATH, HOST
from rigfleet.hostside.layout import STACK_UNIT as STACK_UNIT  # the units roles/swap.py installs
from rigfleet.hostside.layout import SUPERVISE_UNIT as SUPERVISE_UNIT

PYZ = BUNDLE_PATH
PYTHON = "/usr/bin/python3"
# What the probe prints on a host the deploy has not reached yet (no bundle, no records).
BARE_PROBE = '{"schema": "rigfleet-probe/1", "bare": true}'


def tool(*args: str) -> str:
    return " ".join([PYTHON, PYZ, *(shlex.quote(a) for a in args)])


def swap_dir(swap_id: str) -> str:
    return str(HOST.swap_dir(swap_id))


def plan_path(swap_id: str) -> str:
    return str(HOST.plan_file(swap_id))


def unit_name(swap_id: str) -> str:
    return f"rigfleet-swap-{swap_id}"


def start_swap(swap_id: str) -> str:
    """Start the transaction as a transient unit: not a child of the SSH session, so it
    finishes (or rolls back) when the connection drops. ``KillMode=mixed``: a stop request
    reaches only the transaction, which then stops its gate and rolls back itself."""
    return (
        f"systemd-run --unit {shlex.quote(unit_name(swap_id))} --collect --quiet "
        "--property=KillMode=mixed --property=TimeoutStopSec=900 "
        "--setenv=PYTHONUNBUFFERED=1 "
        + tool("swap", "--plan", plan_path(swap_id))
    )


def close_unit(window_id: str) -> str:
    return f"rigfleet-maint-{window_id}"


def window_plan_path(window_id: str) -> str:
    return str(HOST.window_plan(window_id))


def maintenance_open(window_id: str, step: str, reboot_grace_s: float | None = None) -> str:
    """Open (or add ``step`` to) the maintenance window of the uploaded plan, held by this SSH
    session; ``reboot_grace_s``: the step reboots the host (held across it that long)."""
    grace = ("--reboot-grace-s", f"{reboot_grace_s:g}") if reboot_grace_s is not None else ()
    return tool("maintenance", "open", "--plan", window_plan_path(window_id), "--step", step,
                *grace)


def maintenance_ready(packages: bool, lock_wait_s: int = 120) -> str:
    """Before a window opens: the package manager usable (``lock_wait_s`` at most for its
    locks, an interrupted dpkg repaired) and room on disk; fails (nothing disturbed) when
    not."""
    if not packages:
        return tool("maintenance", "ready")
    return tool("maintenance", "ready", "--packages", "--lock-wait-s", str(lock_wait_s))


def maintenance_hold(window_id: str) -> str:
    """Back from the reboot: the window held by this (new) SSH session."""
    return tool("maintenance", "hold", "--plan", window_plan_path(window_id))


def start_close(window_id: str, journal_id: str, cause: str = "") -> str:
    """Close the deploy's own window (``--own``: its lock is this deploy's) as a transient unit
    (recreate + gate can take long; a dropped SSH connection must not stop it), its progress
    in the journal ``journal_id``; ``cause``: why now (a step failed), for the ledger."""
    return (
        f"systemd-run --unit {shlex.quote(close_unit(window_id))} --collect --quiet "
        "--property=KillMode=mixed --property=TimeoutStopSec=900 "
        "--setenv=PYTHONUNBUFFERED=1 "
        + tool("maintenance", "close", "--plan", window_plan_path(window_id),
               "--journal-id", journal_id, "--own", *(("--cause", cause) if cause else ()))
    )


def upload_atomic(data: bytes, dest: str, mode: str = "0644") -> Iterator[Any]:
    """Upload ``data`` so ``dest`` is the old file or the new one, never a part: to a
    temporary name beside it, ``chmod``, ``sync`` (fsync) it, rename, ``sync`` the directory."""
    tmp = f"{dest}.upload.tmp"
    yield FileUploadCommand(io.BytesIO(data), tmp)
    directory = shlex.quote(str(PurePosixPath(dest).parent))
    yield (f"chmod {mode} {shlex.quote(tmp)} && sync -- {shlex.quote(tmp)} && mv -f -- "
           f"{shlex.quote(tmp)} {shlex.quote(dest)} && sync -- {directory}")


def status(swap_id: str, since: int) -> str:
    """Events after ``since`` and the state (JSON, one line)."""
    return tool("status", "--id", swap_id, "--since", str(int(since)), "--json")


def adopt(swap_id: str) -> str:
    return tool("adopt", "--plan", plan_path(swap_id))


def ensure(front_port: int, who: str) -> str:
    return tool("ensure", "--front-port", str(int(front_port)), "--who", who,
                "--why", "deploy: the active stack is not serving")


def probe(full: bool = False, model_path: str | None = None,
          front_port: int | None = None, doctor_load_s: float | None = None) -> str:
    """The host probe (``rigfleet-host.pyz probe``): one JSON object; on a host without the
    tool (not deployed yet) ``BARE_PROBE``, since such a host has no records to read.

    + full: the sections status and the bump read (``--full``)
    + model_path, front_port: what ``--full`` checks
    + doctor_load_s: add the doctor's evidence under a load this long (``--full --doctor``)
    """
    args = ["probe"]
    if full:
        args.append("--full")
        if model_path:
            args += ["--model-path", model_path]
        if front_port:
            args += ["--front-port", str(int(front_port))]
        if doctor_load_s is not None:
            args += ["--doctor", "--load-s", f"{float(doctor_load_s):g}"]
    return (f"if [ -f {shlex.quote(PYZ)} ]; then {tool(*args)}; "
            f"else echo {shlex.quote(BARE_PROBE)}; fi")


def bench(*args: str) -> str:
    """The bench on the host against its active stack (``rigfleet-host.pyz bench``), e.g.
    ``bench("--accept-baseline", "--scale", "1", "--json")``."""
    return tool("bench", *args)


def record(tracked: dict, config_hash: str, by: str, deploy_id: str, host: str) -> str:
    """Record pins that changed without a swap (state.json, active record, ledger)."""
    return tool("record", "--json", json.dumps(tracked, sort_keys=True), "--config-hash",
                config_hash, "--by", by, "--deploy-id", deploy_id, "--host", host)


def report_failure(message: str) -> str:
    """A command that fails with ``message`` on stderr: pyinfra shows it as the host's error."""
    return f"printf '%s\\n' {shlex.quote(message)} >&2; exit 1"


def journal_unit(swap_id: str) -> str:
    """Where a person reads the transaction's output."""
    return f"journalctl -u {unit_name(swap_id)}"


def lock_show() -> str:
    """Who holds the host lock, as JSON (``null`` when free; ``alive`` by the liveness rule)."""
    return tool("lock", "--json")


def lock_release(reason: str, by: str) -> str:
    """Remove a stale host lock; the host tool refuses a live holder (exit 3)."""
    return tool("lock", "--release", "--reason", reason, "--by", by)
