"""Where the project's own files are: rigfleet runs from its checkout, whose ``files/`` holds
the templates and the scripts the deploy installs::

    project_file("files/nginx-front.conf.j2")     # PosixPath('/home/me/rigfleet/files/...')
"""

from __future__ import annotations

import getpass
import os
import socket
from pathlib import Path

from rigfleet.errors import RigfleetError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def project_file(relative: str) -> Path:
    """A file of the project checkout; ``RigfleetError`` when it does not have it."""
    path = PROJECT_ROOT / relative
    if not path.is_file():
        raise RigfleetError(f"{relative}: not found under {PROJECT_ROOT}; run rigfleet from its "
                            "project checkout (pip install -e . there), where deploy.py, "
                            "roles/ and files/ are")
    return path


def deployed_by() -> str:
    """Who runs rigfleet, for the records: ``RIGFLEET_BY``, else ``user@control-host``."""
    if explicit := os.environ.get("RIGFLEET_BY"):
        return explicit
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"
