"""Tools the unit tests run for real (promtool, Chromium, sqv): skipped with the reason
where one is missing, except in CI (``RIGFLEET_CI`` set by .ci/run, or a CI system's ``CI``;
scripts/ensure-docker.sh installs them there), where a missing tool is a failure; and what
reads a page the way a person sees it (``Dom``, ``chromium_open``: the unit tests and
tests/e2e/test_18_metrics.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

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


class Dom(HTMLParser):
    """The elements of a page: tag counts, attributes of each, the text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]


def chromium_open(tmp_path: Path, html: str) -> tuple[str, list[str]]:
    """Chromium's DOM of the page and the console messages it logged."""
    chromium = need("chromium", "chromium", "chromium-browser")
    path = tmp_path / "fleet.html"
    path.write_text(html)
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         f"--screenshot={tmp_path / 'shot.png'}", "--window-size=1400,1200",
         "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "shot.png").stat().st_size > 0
    return proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
