"""Run the testbed's services process (``python3 -m services``) on free loopback ports::

    with services(data_dir) as ports:       # {"apt": N, "hub": N, "git": N, "pypi": N}
        url = f"http://127.0.0.1:{ports['git']}/sndr_core_engine.git"
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVICES_DIR = Path(__file__).resolve().parents[2] / "testbed/rigfleet_testbed/images/services"


@contextmanager
def services(data: Path, log: Path | None = None) -> Iterator[dict[str, int]]:
    """The services serving ``data`` until the block ends; yields the bound ports."""
    ports_file = data / "ports.json"
    ports_file.unlink(missing_ok=True)
    extra = ["--log", str(log)] if log else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "services", "--data", str(data), "--bind", "127.0.0.1",
         "--apt-port", "0", "--hub-port", "0", "--git-port", "0", "--pypi-port", "0",
         "--ports-file", str(ports_file), *extra],
        cwd=SERVICES_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while not ports_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "services did not start"
        time.sleep(0.05)
    try:
        yield json.loads(ports_file.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
