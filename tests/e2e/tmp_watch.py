"""inotify on a testbed host's /tmp while something runs: did a secret ever sit there where
others could read it?

The hosts are containers on this machine, so the watch runs here (as root, the way the tests
run) on the container's root filesystem (``/proc/<pid>/root/tmp``): it sees every file the
deploy creates there from the first command on a bare host, before the host has a Python of
its own. Each file is looked at the moment inotify reports it (created, written, moved in,
its mode changed): its mode and owner, and whether its content holds one of the secrets
(compared here, in memory; neither the content nor the secrets are logged)::

    with TmpWatch(host.container, [api_key, tls_key]) as watch:
        pyinfra("-y")
    watch.leaks        # [] or [(path, mode)] of files others could read holding a secret
"""

from __future__ import annotations

import ctypes
import os
import select
import stat
import struct
import subprocess
import threading
from dataclasses import dataclass, field

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x4, 0x8, 0x80, 0x100
HEADER = struct.Struct("iIII")


@dataclass
class Seen:
    path: str
    mode: int | None
    uid: int | None
    secret: bool


@dataclass
class TmpWatch:
    container: str
    secrets: list[bytes]
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: str | None = None

    def __enter__(self) -> TmpWatch:
        pid = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", self.container],
                             capture_output=True, text=True, check=True).stdout.strip()
        self.root = f"/proc/{pid}/root/tmp"
        self._thread.start()
        assert self._ready.wait(10), self._error or "inotify watch did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self._error is None, self._error

    @property
    def leaks(self) -> list[tuple[str, str]]:
        """Files holding a secret while group or others could read them."""
        return [(s.path, oct(s.mode or 0)) for s in self.seen
                if s.secret and s.mode is not None and s.mode & 0o044]

    def _run(self) -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK)
        mask = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
        if fd < 0 or libc.inotify_add_watch(fd, self.root.encode(), mask) < 0:
            self._error = f"inotify on {self.root}: errno {ctypes.get_errno()}"
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                if select.select([fd], [], [], 0.1)[0]:
                    self._events(os.read(fd, 65536))
        finally:
            os.close(fd)

    def _events(self, buf: bytes) -> None:
        i = 0
        while i < len(buf):
            _, _, _, size = HEADER.unpack_from(buf, i)
            name = buf[i + HEADER.size:i + HEADER.size + size].rstrip(b"\0").decode(
                errors="replace")
            i += HEADER.size + size
            path = os.path.join(self.root, name)
            try:
                st = os.lstat(path)
                data = b""
                if stat.S_ISREG(st.st_mode):
                    with open(path, "rb") as f:
                        data = f.read(1 << 20)
                self.seen.append(Seen(f"/tmp/{name}", stat.S_IMODE(st.st_mode), st.st_uid,
                                      any(s in data for s in self.secrets)))
            except OSError:  # gone already
                self.seen.append(Seen(f"/tmp/{name}", None, None, False))
