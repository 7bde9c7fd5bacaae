"""Writing the host's throughput records (readers: ``rigfleet.hostside.records``); not
secret, so the directory is 0755 and the files 0644."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..layout import THROUGHPUT_HISTORY_NAME, THROUGHPUT_LAST_NAME
from ..records import ThroughputRecord
from ..verify.report import atomic_write


def append_history(directory: Path, record: ThroughputRecord) -> Path:
    """Append ``record`` as one line to the directory's history (created when missing)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = directory / THROUGHPUT_HISTORY_NAME
    line = json.dumps(record.to_dict(), sort_keys=True) + "\n"
    # One write of one line with O_APPEND: a reader never sees half a line of another writer.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)
    return path


def write_last(directory: Path, record: ThroughputRecord) -> Path:
    """Replace the directory's ``last.json`` with ``record`` (atomically)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = directory / THROUGHPUT_LAST_NAME
    atomic_write(path, json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n", 0o644)
    return path
