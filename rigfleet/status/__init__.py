"""Fleet status: one row per host, what it runs and whether it drifted from inventory + pins.

``rows`` probes hosts and builds the rows, ``drift`` decides what differs from the host's
``DesiredHost`` (pure), ``render`` prints them, ``cli`` is the command::

    render_table(fleet_status(load_inventory("inventory/home.py"))).print(Console())
"""

from rigfleet.status.drift import cap_drift, find_drift
from rigfleet.status.render import as_json, render_table
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
    "as_json", "render_table",
]
