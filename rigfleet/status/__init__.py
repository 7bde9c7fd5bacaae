"""Fleet status: one row per host, what it runs and whether it drifted from inventory + pins.

    rigfleet status --inventory inventory/home.py [--json] [--timeout 20]

By concern: ``rows`` probes hosts (the host probe over ``rigfleet.ssh``) and builds the rows,
``drift`` decides what differs from the host's ``DesiredHost`` (pure), ``render`` prints
them, ``cli`` is the command. The host checks (``tests/hosts``) read the same
``DesiredHost``.

Example::

    from rigfleet.inventory import load_inventory
    from rigfleet.status import fleet_status, render_table

    rows = fleet_status(load_inventory("inventory/home.py"))
    render_table(rows).print(rich.console.Console())
"""

from rigfleet.status.drift import cap_drift, find_drift
from rigfleet.status.render import render_json, render_table
from rigfleet.status.rows import (
    EXIT_DRIFT,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    StatusRow,
    build_row,
    exit_status,
    fleet_status,
    gate_summary,
    host_status,
)

__all__ = [
    "EXIT_DRIFT", "EXIT_ERROR", "EXIT_OK", "EXIT_UNREACHABLE", "StatusRow", "build_row",
    "cap_drift", "exit_status", "find_drift", "fleet_status", "gate_summary", "host_status",
    "render_json", "render_table",
]
