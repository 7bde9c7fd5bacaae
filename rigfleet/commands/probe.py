"""Readiness probe of a serving container, through its loopback port.

The API key never appears in a command: curl reads the ``Authorization`` header from a
root-only file (``-H @file``).

Example::

    probe.ready("rigfleet-int8", 8011, "/etc/rigfleet/secrets/api-auth-header")
"""

from __future__ import annotations

import shlex

AUTH_HEADER_FILE = "/etc/rigfleet/secrets/api-auth-header"


def ready(container: str, port: int, header_file: str = AUTH_HEADER_FILE) -> str:
    """One round trip: container state, ``/health`` status code, ``/v1/models`` body.

    Output lines: ``state=<status> <exit code> <restarts>``, ``health=<http code>``,
    ``models=<json or empty>``.
    """
    fmt = "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}"
    base = f"http://127.0.0.1:{int(port)}"
    return (
        f"printf 'state=%s\\n' \"$(docker inspect --type container --format {shlex.quote(fmt)} "
        f'{shlex.quote(container)} 2>/dev/null)"; '
        f"printf 'health=%s\\n' \"$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 "
        f'{base}/health)"; '
        f"printf 'models=%s\\n' \"$(curl -s --max-time 5 -H @{shlex.quote(header_file)} "
        f"{base}/v1/models | tr -d '\\n')\""
    )
