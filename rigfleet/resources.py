"""Where the project's own files are: the one helper that finds templates and host scripts.

The pyinfra project (``deploy.py``, ``roles/``, ``files/``) is a checkout: rigfleet runs from
it (an editable install, or ``pyinfra`` started in the checkout). Templates and the scripts the
deploy installs on hosts live in ``files/`` at its root; nothing else spells that path::

    from rigfleet.resources import project_file

    project_file("files/nginx-front.conf.j2")     # PosixPath('/home/me/rigfleet/files/...')
"""

from __future__ import annotations

from pathlib import Path

from rigfleet.errors import RigfleetError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def project_file(relative: str) -> Path:
    """A file of the project checkout (``files/...``); raises ``RigfleetError`` when the
    checkout does not have it (a wheel installed without its project)."""
    path = PROJECT_ROOT / relative
    if not path.is_file():
        raise RigfleetError(
            f"{relative}: not found under {PROJECT_ROOT}; run rigfleet from its project "
            "checkout (pip install -e . there), where deploy.py, roles/ and files/ are"
        )
    return path
