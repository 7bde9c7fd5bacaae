"""Tools the monitor's unit tests run for real (promtool, Chromium): skipped with the reason
where one is missing, except in CI (``RIGFLEET_CI`` set by .ci/run, or a CI system's ``CI``;
scripts/ensure-docker.sh installs them there), where a missing tool is a failure."""

from __future__ import annotations

import os
import shutil

import pytest


def need(tool: str, package: str, *alternatives: str) -> str:
    """The path of ``tool`` (or of the first alternative found); skip or fail without it."""
    for name in (tool, *alternatives):
        found = shutil.which(name)
        if found:
            return found
    why = f"{tool} is not installed here (Debian package {package}: apt-get install -y {package})"
    if os.environ.get("RIGFLEET_CI") or os.environ.get("CI"):
        pytest.fail(f"{why}; CI installs it through scripts/ensure-docker.sh")
    pytest.skip(why)
