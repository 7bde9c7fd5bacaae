"""The host lock: one transaction (swap, adopt, boot-time ensure) at a time, and who has it.

Taking the lock is ``mkdir`` of ``Layout.lock_dir`` (atomic), then writing ``holder.json``
inside: who (``user@control-host``), why, since, the deploy id, and the holder's pid with its
start time and the boot id, so a lock whose process is gone (killed, rebooted) is *stale* and
is taken over, with a message, instead of blocking the host forever::

    lock = HostLock(Layout())
    try:
        note = lock.acquire(who="alice@laptop", why="swap int8 -> tq3-mtp-genesis",
                            deploy_id="20261129T101500Z-1a2b3c")
    except LockHeld as held:
        print(held)          # "locked by alice@laptop since ... (pid 812 ...): swap ..."
    ...
    lock.release()
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .layout import Layout
from .records import boot_id, describe, pid_start_ticks, read_holder

__all__ = ["HostLock", "LockHeld", "describe"]


class LockHeld(Exception):
    """Someone alive holds the lock; ``str()`` says who, since when and why."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self.holder = holder
        super().__init__(describe(holder))


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class HostLock:
    """``layout.lock_dir``, held by this process."""

    layout: Layout
    pid: int = 0  # 0: this process

    def __post_init__(self) -> None:
        self.pid = self.pid or os.getpid()
        self.held = False

    @property
    def path(self) -> Path:
        return self.layout.lock_dir

    def read(self) -> dict[str, Any] | None:
        """The current holder (with ``alive``), or None."""
        return read_holder(self.path)

    def acquire(self, who: str, why: str, deploy_id: str = "") -> str | None:
        """Take the lock; returns a takeover note when a stale lock was replaced.

        Raises ``LockHeld`` when a live process holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        note = None
        for _ in range(5):
            try:
                os.mkdir(self.path, 0o755)
            except FileExistsError:
                holder = self.read()
                if holder is None:
                    continue  # released meanwhile: try again
                if holder.get("alive"):
                    raise LockHeld(holder) from None
                note = f"took over a stale lock ({describe(holder)}; holder gone)"
                self._break_stale()
                continue
            self._write_holder(who, why, deploy_id)
            self.held = True
            return note
        raise LockHeld(self.read() or {"who": "unknown", "why": "lock keeps changing"})

    def _break_stale(self) -> None:
        # Rename first: of two processes breaking the same stale lock only one rename wins,
        # so neither removes a lock the other has just taken.
        aside = self.path.with_name(f"lock.stale.{int(time.time())}.{self.pid}")
        try:
            os.rename(self.path, aside)
        except OSError:
            return
        for child in aside.iterdir():
            child.unlink(missing_ok=True)
        aside.rmdir()

    def _write_holder(self, who: str, why: str, deploy_id: str) -> None:
        holder = {
            "who": who, "why": why, "since": now_iso(), "deploy_id": deploy_id,
            "pid": self.pid, "pid_start": pid_start_ticks(self.pid), "boot_id": boot_id(),
            "host": socket.gethostname(),
        }
        tmp = self.path / f".holder.{self.pid}.tmp"
        tmp.write_text(json.dumps(holder, sort_keys=True) + "\n")
        os.replace(tmp, self.path / "holder.json")

    def release(self) -> None:
        """Drop the lock if this process holds it (never someone else's)."""
        if not self.held:
            return
        holder = self.read()
        if holder is not None and holder.get("pid") == self.pid:
            (self.path / "holder.json").unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.path.rmdir()
        self.held = False

    def __enter__(self) -> HostLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
