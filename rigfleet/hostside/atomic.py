"""Crash-safe writes of the host's records: a reader, a SIGKILL or a power cut sees the old
file or the new one, never an empty or half-written one.

One write is: a temporary file in the same directory (so the rename never crosses a
filesystem), the whole content written, ``fsync`` of the file, ``rename`` over the target,
``fsync`` of the directory (so the rename itself is on disk). Without the first ``fsync`` a
crash after the rename can leave the new name with no data (delayed allocation: the classic
zero-length file after a power cut); without the second the rename may be lost::

    write_atomic(lay.active_json, text)              # mode 0644
    write_atomic(lay.lock_dir / "holder.json", text, mode=0o644)
    write_json(lay.window_file, {"schema": ...})     # sorted keys, newline at the end

Every record rigfleet keeps on a host goes through here (``active/``, ``state.json``, the
lock holder, plans and results of transactions, the supervisor's records, the maintenance
window, the front's route); append-only logs (``ledger.jsonl``, a journal's
``events.jsonl``) are appended in one ``write`` each instead (``append_line``), so a torn
write can only cut their last line, which the readers skip.

``move_aside`` keeps a damaged record for a person (``active.json.damaged-<time>``) before a
repaired one is written in its place. Stdlib only (ships in the host bundle).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    """``fsync`` a directory: the names created, renamed or removed in it are on disk."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: temp file, write, fsync, rename, fsync the directory.

    + path: the record; its directory is created when missing
    + data: text (UTF-8) or bytes
    + mode: the file's permissions (set on the temporary file before any byte is in it, so a
      secret never sits in a readable file)
    """
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


def write_json(path: Path, data: Any, mode: int = 0o644, indent: int | None = 2) -> None:
    """``write_atomic`` of ``data`` as JSON (sorted keys, one newline at the end)."""
    write_atomic(path, json.dumps(data, indent=indent, sort_keys=True) + "\n", mode)


def append_line(path: Path, line: str, sync: bool = True) -> None:
    """Append one line in a single ``write`` (``O_APPEND``: concurrent writers never
    interleave a line; a torn write can only cut the last one), ``fsync`` unless ``sync`` is
    False (progress logs). After a torn last line (no newline at the end) the line starts on
    a line of its own: glued to the torn one, it would be unreadable too."""
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


def move_aside(path: Path, why: str = "damaged") -> Path | None:
    """Rename a damaged record to ``<name>.<why>-<time>`` (kept for a person); returns the
    new path, None when there was nothing to move."""
    aside = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    fsync_dir(path.parent)
    return aside
