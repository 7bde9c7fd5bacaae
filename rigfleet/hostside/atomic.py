"""Crash-safe writes of the host's records: the old file or the new one, never half of one; an
appended log loses at most its torn last line (docs/maintenance.md, "Crash-safe host records")."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (its ``mode`` set before any byte is written: a secret
    never sits in a readable file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have taken bits away
            view = memoryview(raw)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    write_atomic(path, json.dumps(data, indent=indent, sort_keys=True) + "\n")


def append_line(path: Path, line: str, sync: bool = True) -> None:
    """Append one line in a single ``O_APPEND`` write (``fsync`` unless ``sync`` is False);
    after a torn last line it starts on a line of its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # two writers doing so leave a blank line: readers skip it
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def move_aside(path: Path) -> Path | None:
    """Rename a damaged record to ``<name>.damaged-<time>``; None when there was none."""
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    fsync_dir(path.parent)
    return aside
