"""Pieces shared by the three listeners: request log, HTTP/1.1 base handler, ranges, file bodies.

The request log never carries credential values: ``Authorization``, ``Cookie`` and
``Proxy-Authorization`` are reduced to their scheme (``auth=Bearer``), because the log ends up in
test output and CI artifacts::

    log = RequestLog(extra_path=Path("/tmp/services.log"))
    log.write("hub", "10.0.0.5", "GET", "/api/models/a/b", 200, 1234, auth="Bearer")
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import email.utils
import os
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, ClassVar

# Headers whose values are secrets: logged as their scheme only (or "present").
SECRET_HEADERS = ("authorization", "proxy-authorization", "cookie")

# Body chunk size: big enough to be fast, small enough that a cut lands mid-file.
CHUNK = 256 * 1024


class RequestLog:
    """Thread-safe line logger to stderr and, optionally, a file (appended)."""

    def __init__(self, extra_path: Path | None = None, stream: IO[str] | None = None) -> None:
        self._lock = threading.Lock()
        self._stream = stream if stream is not None else sys.stderr
        self._file: IO[str] | None = None
        if extra_path is not None:
            extra_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(extra_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def line(self, text: str) -> None:
        """Write one free-form line (startup, fault events)."""
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        out = f"{stamp} {text}\n"
        with self._lock:
            for target in (self._stream, self._file):
                if target is None:
                    continue
                try:
                    target.write(out)
                    target.flush()
                except (OSError, ValueError):
                    # A closed stderr (detached container) must not kill request handling.
                    pass

    def write(
        self,
        service: str,
        client: str,
        method: str,
        path: str,
        status: int,
        sent: int,
        **fields: object,
    ) -> None:
        """Write one request line: service, client, method, path, status, body bytes, extras."""
        extra = " ".join(f"{k}={v}" for k, v in fields.items() if v not in (None, ""))
        self.line(f"[{service}] {client} {method} {path} {status} {sent}B {extra}".rstrip())


def redact_auth(value: str | None) -> str | None:
    """The part of a credential header that may be logged: its scheme, never the secret."""
    if not value:
        return None
    scheme, _, rest = value.strip().partition(" ")
    return scheme if rest else "present"


class Server(ThreadingHTTPServer):
    """Threaded server whose handler threads never block shutdown."""

    daemon_threads = True
    allow_reuse_address = True
    # Many parallel downloads (snapshot_download uses 8 workers per client, several hosts).
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        service: str,
        log: RequestLog,
    ) -> None:
        self.service = service
        self.log = log
        super().__init__(address, handler)


class BaseHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler that logs one line per request through the server's log.

    Subclasses set ``self._log_fields`` (dict) while handling, and call :meth:`finish_log`
    implicitly: the line is written when the request ends (status and bytes are known then).
    """

    protocol_version = "HTTP/1.1"
    server_version = "rigfleet-services"
    sys_version = ""
    # Idle keep-alive connections are dropped after this many seconds (clients reconnect).
    timeout = 120
    server: Server  # type: ignore[assignment]

    _status: int
    _sent: int
    _log_fields: dict[str, object]

    # Paths not worth a log line (the container HEALTHCHECK polls every few seconds).
    QUIET_PATHS: ClassVar[frozenset[str]] = frozenset({"/_testbed/health"})

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._sent = 0
        self._log_fields = {}

    # BaseHTTPRequestHandler calls these from send_response/send_error: route them to our log,
    # once per request, at the end (see handle_one_request).
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        with contextlib.suppress(TypeError, ValueError):
            self._status = int(code)

    def log_message(self, format: str, *args: object) -> None:
        # Only called for errors (bad request line, timeouts): the request line has no secrets.
        self.server.log.line(f"[{self.server.service}] {self.client_address[0]} " + format % args)

    def handle_one_request(self) -> None:
        self._reset()
        super().handle_one_request()
        if self._status and getattr(self, "command", None) and self.path not in self.QUIET_PATHS:
            fields = dict(self._log_fields)
            fields.setdefault("auth", redact_auth(self.headers.get("Authorization")))
            rng = self.headers.get("Range")
            if rng:
                fields.setdefault("range", rng)
            self.server.log.write(
                self.server.service,
                self.client_address[0],
                self.command,
                self.path,
                self._status,
                self._sent,
                **fields,
            )

    # ---- response helpers -------------------------------------------------------------------

    def send_bytes(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/octet-stream",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Send a complete response with an exact Content-Length (no body for HEAD)."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            self._sent += len(body)

    def read_body(self, limit: int = 1 << 20) -> bytes:
        """The request body (Content-Length framed; chunked uploads are not needed here)."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > limit:
            raise ValueError(f"request body too large ({length} > {limit} bytes)")
        return self.rfile.read(length) if length else b""

    def stream_file(
        self,
        path: Path,
        start: int,
        end: int,
        *,
        transform: Callable[[int, bytes], bytes] | None = None,
        cut_after: int | None = None,
    ) -> bool:
        """Write bytes ``start..end`` (inclusive) of ``path``; returns False if cut on purpose.

        ``transform(offset, chunk)`` may alter bytes (same length). ``cut_after`` stops after that
        many body bytes and closes the connection, as a dropped TCP connection would look.
        """
        remaining = end - start + 1
        with open(path, "rb") as fh:
            fh.seek(start)
            offset = start
            while remaining > 0:
                chunk = fh.read(min(CHUNK, remaining))
                if not chunk:
                    # The file shrank under us: the promised length cannot be met.
                    self.close_connection = True
                    return False
                if transform is not None:
                    chunk = transform(offset, chunk)
                if cut_after is not None and self._sent + len(chunk) >= cut_after:
                    chunk = chunk[: max(cut_after - self._sent, 0)]
                    self.wfile.write(chunk)
                    self._sent += len(chunk)
                    self.wfile.flush()
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return False
                self.wfile.write(chunk)
                self._sent += len(chunk)
                offset += len(chunk)
                remaining -= len(chunk)
        return True


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """Parse a single-range ``Range`` header against a resource of ``size`` bytes.

    Returns ``(start, end)`` inclusive, ``None`` to serve the whole resource (no header, multiple
    ranges or a syntax we ignore, as RFC 9110 allows), or ``"unsatisfiable"`` (-> 416).
    """
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            if not last:
                return None
            suffix = int(last)
            if suffix <= 0:
                return "unsatisfiable"
            return (max(size - suffix, 0), size - 1) if size else "unsatisfiable"
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size or start < 0:
        return "unsatisfiable"
    if end < start:
        return None
    return start, min(end, size - 1)


def http_date(timestamp: float) -> str:
    """RFC 7231 date for Last-Modified."""
    return email.utils.formatdate(timestamp, usegmt=True)


def within(root: Path, candidate: Path) -> bool:
    """Whether ``candidate`` (after resolving symlinks) stays inside ``root``."""
    try:
        real_root = os.path.realpath(root)
        real = os.path.realpath(candidate)
    except OSError:
        return False
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)
