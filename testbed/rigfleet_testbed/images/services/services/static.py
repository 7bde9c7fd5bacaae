"""Static files over HTTP: the apt repository (port 80), git's dumb protocol (port 8090) and the
PEP 503 package index (port 3141).

The web root is a directory; ``GET /debian/dists/stable/Release`` serves
``<root>/debian/dists/stable/Release``. GET and HEAD, exact ``Content-Length``, ``Last-Modified``
with ``If-Modified-Since`` (apt uses it), single byte ranges (apt resumes partial files), and a
plain directory listing for people poking around with a browser. Query strings are ignored, which
is exactly what git's dumb protocol needs: ``GET /repo.git/info/refs?service=git-upload-pack``
gets the plain ``info/refs`` file with a non-smart content type, so git falls back to fetching
``HEAD``, ``objects/info/packs`` and pack files as static files::

    git clone http://git.rigfleet.test:8090/sndr_core_engine.git

For that to work each bare repository needs ``git update-server-info`` after every change;
:func:`update_server_info` runs it at startup for a ``*.git`` under the root that lacks it.
A symlinked ``old-name.git -> new-name.git`` serves the same repository under both names.

The package index serves ``index.html`` for a directory (``GET /simple/xxhash/``), which is all
pip needs from a PEP 503 index.
"""

from __future__ import annotations

import html
import mimetypes
import os
import shutil
import subprocess
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .common import BaseHandler, RequestLog, http_date, parse_range, within

# apt and git care about bodies, not types; these keep browsers and curl -I readable.
_TYPES = {
    ".gz": "application/gzip",
    ".xz": "application/x-xz",
    ".deb": "application/vnd.debian.binary-package",
    ".asc": "text/plain; charset=utf-8",
    ".gpg": "application/pgp-keys",
    ".pack": "application/x-git-packed-objects",
    ".idx": "application/x-git-packed-objects-toc",
}


def content_type(path: Path) -> str:
    """Content type by suffix; never a Content-Encoding (``.gz`` files are served as is)."""
    if path.suffix in _TYPES:
        return _TYPES[path.suffix]
    if path.name in ("Release", "InRelease", "Packages", "HEAD", "refs", "packs"):
        return "text/plain; charset=utf-8"
    guessed, encoding = mimetypes.guess_type(path.name)
    if guessed and not encoding:
        return guessed
    return "application/octet-stream"


class StaticHandler(BaseHandler):
    """Serve ``server.root`` read-only."""

    def do_HEAD(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _not_allowed(self) -> None:
        self.send_bytes(405, b"method not allowed\n", "text/plain", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

    def _serve(self) -> None:
        root: Path = self.server.root  # type: ignore[attr-defined]
        raw_path = urlsplit(self.path).path
        parts = [unquote(p) for p in raw_path.split("/") if p not in ("", ".")]
        if any(p == ".." or "/" in p or "\x00" in p for p in parts):
            self.send_bytes(400, b"bad path\n", "text/plain")
            return
        target = root.joinpath(*parts)
        if not within(root, target) or not target.exists():
            self.send_bytes(404, b"not found\n", "text/plain")
            return
        if target.is_dir():
            if not raw_path.endswith("/"):
                self.send_bytes(301, b"", "text/plain", {"Location": raw_path + "/"})
                return
            self._listing(target, raw_path)
            return
        try:
            stat = target.stat()
        except OSError:
            self.send_bytes(404, b"not found\n", "text/plain")
            return
        size = stat.st_size
        last_modified = http_date(stat.st_mtime)
        since = self.headers.get("If-Modified-Since")
        if since and not self.headers.get("Range"):
            try:
                if int(stat.st_mtime) <= parsedate_to_datetime(since).timestamp():
                    self.send_bytes(
                        304, b"", content_type(target), {"Last-Modified": last_modified}
                    )
                    return
            except (TypeError, ValueError, IndexError, OverflowError):
                pass

        wanted = parse_range(self.headers.get("Range"), size)
        if_range = self.headers.get("If-Range")
        if if_range is not None and if_range != last_modified:
            wanted = None  # the client's partial copy is of another version: send it whole
        if wanted == "unsatisfiable":
            self.send_bytes(
                416, b"range not satisfiable\n", "text/plain", {"Content-Range": f"bytes */{size}"}
            )
            return
        start, end = wanted if isinstance(wanted, tuple) else (0, size - 1)
        self.send_response(206 if isinstance(wanted, tuple) else 200)
        self.send_header("Content-Type", content_type(target))
        self.send_header("Content-Length", str(end - start + 1 if size else 0))
        self.send_header("Last-Modified", last_modified)
        self.send_header("Accept-Ranges", "bytes")
        if isinstance(wanted, tuple):
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if self.command == "HEAD" or size == 0:
            return
        self.stream_file(target, start, end)

    def _listing(self, directory: Path, raw_path: str) -> None:
        rows = []
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            name = entry.name + ("/" if entry.is_dir() else "")
            rows.append(f'<a href="{html.escape(name, quote=True)}">{html.escape(name)}</a>')
        title = html.escape(raw_path)
        body = (
            f"<!doctype html><title>Index of {title}</title><h1>Index of {title}</h1><pre>\n"
            + "\n".join(rows)
            + "\n</pre>\n"
        ).encode()
        self.send_bytes(200, body, "text/html; charset=utf-8")


class AptHandler(StaticHandler):
    """The apt repository: web root ``<data>/apt``."""


class GitHandler(StaticHandler):
    """Bare git repositories, dumb HTTP: web root ``<data>/git``."""


class PypiHandler(StaticHandler):
    """A PEP 503 simple index (``simple/<project>/index.html``): web root ``<data>/pypi``."""

    def _listing(self, directory: Path, raw_path: str) -> None:
        index = directory / "index.html"
        if not index.is_file():
            self.send_bytes(404, b"not found\n", "text/plain")
            return
        self.send_bytes(200, index.read_bytes(), "text/html; charset=utf-8")


def update_server_info(git_root: Path, log: RequestLog) -> None:
    """Run ``git update-server-info`` in bare repositories under ``git_root`` that lack it.

    Only where ``info/refs`` is missing: the fixture builder already ran it, and writing into
    the control side's bind mount as root would leave files its user cannot remove. Failures
    (no git, read-only mount) are logged, not fatal.
    """
    if not git_root.is_dir():
        return
    git = shutil.which("git")
    for repo in sorted(git_root.glob("*.git")):
        if not (repo / "HEAD").is_file() or (repo / "info/refs").is_file():
            continue
        if git is None:
            log.line(f"[git] {repo.name} has no info/refs and git is not installed")
            continue
        proc = subprocess.run(
            [git, "--git-dir", str(repo), "update-server-info"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0:
            log.line(f"[git] update-server-info {repo.name}: ok")
        else:
            log.line(f"[git] update-server-info {repo.name} failed: {proc.stderr.strip()}")
