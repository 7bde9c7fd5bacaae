"""Writing the host's throughput records (readers: ``rigfleet.hostside.records``); not
secret, so the directory is 0755 and the files 0644."""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import append_line, write_atomic
from ..layout import THROUGHPUT_HISTORY_NAME, THROUGHPUT_LAST_NAME
from ..records import ThroughputRecord


def append_history(directory: Path, record: ThroughputRecord) -> Path:
    """Append ``record`` as one line to the directory's history (created when missing)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = directory / THROUGHPUT_HISTORY_NAME
    append_line(path, json.dumps(record.to_dict(), sort_keys=True))
    return path


def write_last(directory: Path, record: ThroughputRecord) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = directory / THROUGHPUT_LAST_NAME
    write_atomic(path, json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n", 0o644)
    return path
