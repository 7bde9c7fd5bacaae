"""Commands of the host-side tool (``rigfleet-host.pyz``): start a swap, follow it, probe.

Example::

    from rigfleet.commands import hosttool

    hosttool.start_swap("20261129T101500Z-1a2b3c")
    # 'systemd-run --unit rigfleet-swap-20261129T101500Z-1a2b3c --collect --quiet ...'
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rigfleet.hostside.layout import BUNDLE_PATH, Layout

PYZ = BUNDLE_PATH
PYTHON = "/usr/bin/python3"
STACK_UNIT = "rigfleet-stack.service"
_PROBE_SOURCE = Path(__file__).resolve().parent.parent / "hostside" / "probe.py"
_LAYOUT = Layout()


def tool(*args: str) -> str:
    return " ".join([PYTHON, PYZ, *(shlex.quote(a) for a in args)])


def swap_dir(swap_id: str) -> str:
    return str(_LAYOUT.swap_dir(swap_id))


def plan_path(swap_id: str) -> str:
    return f"{swap_dir(swap_id)}/plan.json"


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


def status(swap_id: str, since: int) -> str:
    """Events after ``since`` and the state (JSON, one line)."""
    return tool("status", "--id", swap_id, "--since", str(int(since)), "--json")


def adopt(swap_id: str) -> str:
    return tool("adopt", "--plan", plan_path(swap_id))


def ensure(front_port: int, who: str) -> str:
    return tool("ensure", "--front-port", str(int(front_port)), "--who", who,
                "--why", "deploy: the active stack is not serving")


def probe(lock_only: bool = False) -> str:
    """Fact command: the probe's JSON, without needing the bundle (its source travels)."""
    src = _PROBE_SOURCE.read_text()
    flag = " --lock-only" if lock_only else ""
    return (
        f"if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(src)}{flag}; "
        "else echo '{}'; fi"
    )


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
