"""Before a maintenance window opens: apt's and dpkg's locks free within a bounded wait, an
interrupted dpkg repaired, room on the disks; a ``NotReady`` leaves the host as it was::

    Readiness(root=Path("/"), say=print).check(packages=True, lock_wait_s=120, min_free_mib=1024)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .drain import cmdline
from .stackctl import run

# apt's and dpkg's locks, in the order apt takes them.
LOCKS = ("var/lib/dpkg/lock-frontend", "var/lib/dpkg/lock", "var/cache/apt/archives/lock",
         "var/lib/apt/lists/lock")
# Where the steps write, and the share of the room they need there.
SPACE = (("var/cache/apt/archives", 1.0), ("usr", 1.0), ("boot", 0.1), ("var/lib/rigfleet", 0.1))
DPKG_REPAIR = ("dpkg", "--configure", "-a", "--force-confdef", "--force-confold")


def _apt(argv: tuple[str, ...]) -> tuple[int, str]:
    rc, out, err = run(argv, None, {**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return rc, out + err


class NotReady(Exception):
    """The window's work cannot start; ``str()`` says why and what to do."""


@dataclass
class Readiness:
    """The checks, against ``root`` (``/`` on a host; a tree in tests)."""

    root: Path = Path("/")
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    run: Callable[[tuple[str, ...]], tuple[int, str]] = _apt

    def check(self, packages: bool, lock_wait_s: float, min_free_mib: int) -> list[str]:
        """Raise ``NotReady`` when the work cannot start; else what was done (repairs)."""
        self.space(min_free_mib)
        if not packages:
            return []
        self.wait_locks(lock_wait_s)
        return self.repair_dpkg()

    def space(self, min_free_mib: int) -> None:
        seen: set[int] = set()
        for rel, share in SPACE:
            path = self.root / rel
            while not path.exists() and path != self.root:
                path = path.parent
            dev = os.stat(path).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            st = os.statvfs(path)
            free = st.f_bavail * st.f_frsize // (1024 * 1024)
            need = int(min_free_mib * share)
            if free < need:
                raise NotReady(f"{path}: {free} MiB free; the maintenance needs {need} MiB "
                               "there; free some space (apt-get clean, old logs) and run the "
                               "deploy again")

    def busy(self) -> tuple[str, str] | None:
        """(the lock, who holds it) for the first lock held, else None."""
        for path in (self.root / rel for rel in LOCKS):
            if _held(path):
                return str(path), holders(path) or "a process this tool cannot see"
        return None

    def wait_locks(self, wait_s: float) -> None:
        t0 = self.clock()
        last = ""
        while (busy := self.busy()) is not None:
            line = f"{busy[0]} is held by {busy[1]}"
            if line != last:
                self.say(f"waiting up to {wait_s:g} s for the package manager: {line}")
                last = line
            waited = self.clock() - t0
            if waited >= wait_s:
                raise NotReady(f"the package manager is busy: {line}, still after {waited:.0f} "
                               "s; let it finish (or stop it) and run the deploy again")
            self.sleep(min(2.0, max(0.1, wait_s - waited)))

    def repair_dpkg(self) -> list[str]:
        """``dpkg --configure -a`` when dpkg was interrupted (journal files in its ``updates``:
        digits only, as apt counts them; ``tmp.i`` is dpkg's scratch file)."""
        updates = self.root / "var/lib/dpkg/updates"
        pending = [p.name for p in updates.iterdir() if p.name.isdigit()] \
            if updates.is_dir() else []
        if not pending:
            return []
        self.say(f"dpkg was interrupted ({len(pending)} journal file(s) in {updates}); "
                 f"repairing: {' '.join(DPKG_REPAIR)}")
        status, output = self.run(DPKG_REPAIR)
        if status != 0:
            tail = " | ".join(output.strip().splitlines()[-3:])
            raise NotReady(f"dpkg was interrupted and `{' '.join(DPKG_REPAIR)}` failed "
                           f"(exit {status}: {tail}); repair the packages by hand, then run "
                           "the deploy again")
        return [f"repaired an interrupted dpkg ({' '.join(DPKG_REPAIR)})"]


def _held(path: Path) -> bool:
    """Someone holds a write lock on ``path`` (tried like apt: non-blocking, released)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False  # no such lock file: nobody holds it
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EACCES, errno.EAGAIN)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)  # closing drops the lock
    return False


def holders(path: Path) -> str:
    """``pid N (command line)`` of each process holding ``path`` open or locked."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        ino = os.stat(path).st_ino
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            if "->" in parts:
                continue  # a waiter, not a holder
            if len(parts) >= 6 and parts[5].rsplit(":", 1)[-1] == str(ino) and \
                    parts[4].isdigit() and int(parts[4]) > 0:
                pids.add(int(parts[4]))
    for proc in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == str(path):
                        pids.add(int(proc.name))
                        break
    said = {pid: cmdline(Path(f"/proc/{pid}")).decode(errors="replace") for pid in sorted(pids)}
    return ", ".join(f"pid {pid} ({line[:120] or 'gone'})" for pid, line in said.items())
