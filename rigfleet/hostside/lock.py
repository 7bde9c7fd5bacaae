"""The host lock: one transaction (swap, adopt, ensure, a maintenance window) at a time; one
whose process is gone is *stale* and taken over (docs/swap.md; a window's: docs/maintenance.md)::

    note = HostLock(Layout()).acquire(who="alice@laptop", why="swap int8 -> tq3")  # LockHeld
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import fsync_dir, write_json
from .layout import Layout
from .records import BOOT_CLOCK, describe, now_iso, proc_stat, process_id, read_holder

# Per-connection sshd processes (OpenSSH before 9.8, and its sshd-session since).
_SSH_SESSION = ("sshd", "sshd-session")


def session_anchor() -> tuple[int, str]:
    """(pid, what) holds a window opened from this process: the nearest sshd ancestor (the
    deploy's SSH connection, alive while the deploy is), else the parent."""
    cur = parent = os.getppid()
    for _ in range(64):
        stat = proc_stat(cur)
        if stat is None or cur <= 1:
            break
        if stat[0] in _SSH_SESSION:
            return cur, "the deploy's SSH session"
        cur = int(stat[1][1])  # the parent's pid
    return parent, "the shell that opened it"


@dataclass(frozen=True)
class WindowHold:
    """What holds a window's lock: the anchor process and, before a reboot, ``reboot``."""

    window: str
    pid: int
    what: str
    reboot: dict[str, Any] | None = None

    @classmethod
    def here(cls, window: str, reboot_grace_s: float | None = None) -> WindowHold:
        reboot = None if reboot_grace_s is None else {"boot": BOOT_CLOCK.boot(),
                                                      "at": round(BOOT_CLOCK.uptime(), 1),
                                                      "grace_s": reboot_grace_s}
        return cls(window, *session_anchor(), reboot)


class LockHeld(Exception):
    """Someone alive holds the lock; ``str()`` says who, since when and why."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self.holder = holder
        super().__init__(describe(holder))


@dataclass
class HostLock:
    """``layout.lock_dir``, held by this process."""

    layout: Layout
    pid: int = 0  # 0: this process

    def __post_init__(self) -> None:
        self.pid = self.pid or os.getpid()
        self.held = False
        self.path = self.layout.lock_dir

    def read(self) -> dict[str, Any] | None:
        return read_holder(self.path)

    def acquire(self, who: str, why: str, deploy_id: str = "",
                window: WindowHold | None = None) -> str | None:
        """Take the lock (``window``'s: held while its anchor lives, until ``adopt_window`` +
        ``release``); a note when a stale lock was taken over; ``LockHeld`` when one lives."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        note = None
        for _ in range(5):
            if self._place(who, why, deploy_id, window):
                self.held = window is None  # a window's lock is not this process's to release
                return note
            holder = self.read()
            if holder is None:
                continue  # released meanwhile: try again
            if holder.get("alive"):
                raise LockHeld(holder) from None
            gone = "deadline passed" if holder.get("window") and \
                not holder.get("anchor") else "holder gone"
            note = f"took over a stale lock ({describe(holder)}; {gone})"
            self._break_stale()
        raise LockHeld(self.read() or {"who": "unknown", "why": "lock keeps changing"})

    def hold_window(self, hold: WindowHold, why: str = "") -> bool:
        """The window's lock held by ``hold`` from now on; False when it is not that window's."""
        with self._judged():
            holder = self.read()
            if holder is None or holder.get("window") != hold.window:
                return False
            kept = {k: v for k, v in holder.items() if k not in ("alive", "until", "reboot")}
            write_json(self.path / "holder.json",
                       {**kept, **self._anchor(hold), "why": why or holder.get("why")}, indent=None)
        return True

    def adopt_window(self, window_id: str, why: str, take_live: bool = False) -> bool:
        """Take over the window's lock as this process when its holder is gone (or lives, with
        ``take_live``; else ``LockHeld``); False when the lock is not that window's."""
        with self._judged():  # of two closers that saw it at once, one takes it
            holder = self.read()
            if holder is None or holder.get("window") != window_id:
                return False
            if holder.get("alive") and not take_live:
                raise LockHeld(holder)
            self._write_holder(str(holder.get("who") or "unknown"), why,
                               str(holder.get("deploy_id") or window_id), None)
        self.held = True
        return True

    @staticmethod
    def _anchor(hold: WindowHold) -> dict[str, Any]:
        reboot = {} if hold.reboot is None else {"reboot": dict(hold.reboot)}
        return {"window": hold.window, "anchor": hold.what, **process_id(hold.pid), **reboot}

    def _place(self, who: str, why: str, deploy_id: str, window: WindowHold | None) -> bool:
        """The holder in a fresh directory, renamed onto the lock; False when a lock is there."""
        if self.path.exists():
            return False  # (an empty one: an older tool between its mkdir and holder.json)
        for path in self.path.parent.glob(".lock.*"):  # a killed taker's, left before its rename
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime > 60.0:
                    shutil.rmtree(path)
        tmp = self.path.with_name(f".lock.{self.pid}.{secrets.token_hex(4)}")
        os.mkdir(tmp, 0o755)
        try:
            self._write_holder(who, why, deploy_id, window, directory=tmp)
            try:
                os.rename(tmp, self.path)
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                    return False
                raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
        fsync_dir(self.path.parent)
        return True

    def _break_stale(self) -> bool:
        """Remove the lock if its holder is still gone; False when it lives (or is free)."""
        # Judged again under the flock: of two processes that both saw the same stale lock,
        # the second finds the first one's fresh lock alive and keeps it.
        with self._judged():
            holder = self.read()
            if holder is None or holder.get("alive"):
                return False
            aside = self.path.with_name(f"lock.stale.{int(time.time())}.{self.pid}")
            try:
                os.rename(self.path, aside)
            except OSError:
                return False
        shutil.rmtree(aside)
        return True

    @contextlib.contextmanager
    def _judged(self) -> Iterator[None]:
        """An flock of the lock's directory: one process at a time reads and replaces a holder."""
        fd = os.open(self.path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def release_stale(self) -> dict[str, Any] | None:
        """Remove a stale lock on a person's word (``rigfleet lock HOST --release``): its holder."""
        holder = self.read()
        if holder is None:
            return None
        if holder.get("alive"):
            raise LockHeld(holder)
        taken = None if self._break_stale() else self.read()
        if taken is not None and taken.get("alive"):
            raise LockHeld(taken)
        return holder

    def _write_holder(self, who: str, why: str, deploy_id: str,
                      window: WindowHold | None, directory: Path | None = None) -> None:
        holder: dict[str, Any] = {
            "who": who, "why": why, "since": now_iso(), "deploy_id": deploy_id,
            **process_id(self.pid), "host": socket.gethostname(),
            **(self._anchor(window) if window is not None else {})}
        write_json((directory or self.path) / "holder.json", holder, indent=None)

    def release(self) -> None:
        """Drop the lock if this process holds it (never someone else's)."""
        if not self.held:
            return
        holder = self.read()
        if holder is not None and holder.get("pid") == self.pid and not holder.get("window"):
            (self.path / "holder.json").unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.path.rmdir()
        self.held = False
