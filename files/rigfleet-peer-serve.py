#!/usr/bin/env python3
"""Serve this rig's verified weights and pinned images to its peers (no fleet cache).

Installed by rigfleet (roles/weights.py) and started by a peer's converge on the first rig
that holds what it needs, as a transient unit that stops once nobody asked for a while:

    rigfleet-peer-serve.py --port 8082 --model-dir /srv/models \
        --repository vllm/vllm-openai ... [--idle 300]

- ``GET /models/<org>/<name>/<revision>/<file>``: a file of a revision directory under
  ``--model-dir`` whose ``.rigfleet-manifest.json`` names that repo and revision and lists
  the file, unchanged since it was verified (size and mtime); nothing under a dot name. The
  peer's fetcher verifies every file against the hub's listing again (``--mirror``).
- ``GET /images/<id>``: ``docker save <id>`` of an image this host names as one of the
  ``--repository`` (the fleet's pinned repositories); the peer loads it and checks the id.
One log line per request (client, status, bytes, path). Stdlib only.
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import socket
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

MANIFEST = ".rigfleet-manifest.json"
CHUNK = 1 << 20


def verified_file(model_dir: Path, repo: str, revision: str, name: str) -> Path | None:
    """The file ``name`` of a directory verified for ``repo@revision``, unchanged since."""
    if not name or any(p.startswith(".") or p == "" for p in name.split("/")):
        return None
    for d in sorted(p for p in model_dir.iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            continue
        meta = manifest["files"].get(name)
        if manifest.get("repo") != repo or manifest.get("revision") != revision \
                or not isinstance(meta, dict):
            continue
        try:
            st = (d / name).stat()
        except OSError:
            return None
        mtime = meta.get("mtime")  # no number: a damaged manifest, not served
        if st.st_size == meta.get("size") and isinstance(mtime, int | float) \
                and abs(st.st_mtime - mtime) <= 0.001:
            return d / name
        return None
    return None


def pinned(image_id: str, repositories: set[str]) -> bool:
    """Is ``image_id`` an image this host names under one of ``repositories``?"""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", image_id):
        return False
    proc = subprocess.run(["docker", "image", "inspect", "--format",
                           "{{json .RepoTags}} {{json .RepoDigests}}", image_id],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return False
    names = [n for part in proc.stdout.split() for n in (json.loads(part) or [])]
    return any(re.split(r"[@:](?=[^/]*$)", n, maxsplit=1)[0] in repositories for n in names)


def any_address() -> str:
    """``::`` (IPv4 too: ``Server.server_bind``) where the kernel has IPv6, else ``0.0.0.0``."""
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        return "0.0.0.0"
    return "::"


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, model_dir: Path, repositories: set[str]) -> None:
        # peers reach the seed where the balancer does: an IPv4 or IPv6 address, or a name
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, Handler)
        self.model_dir, self.repositories = model_dir, repositories
        self.last, self.busy, self.lock = time.monotonic(), 0, threading.Lock()

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:  # dual-stack whatever net.ipv6.bindv6only
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args) -> None:  # the one line per request below
        pass

    def _done(self, status: int, sent: int) -> None:
        print(f"{self.client_address[0]} {status} {sent} GET {self.path}", flush=True)

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.busy += 1
        try:
            self._get()
        finally:
            with self.server.lock:
                self.server.busy -= 1
                self.server.last = time.monotonic()

    def _missing(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self._done(404, 0)

    def _get(self) -> None:
        kind, _, rest = urllib.parse.unquote(self.path).lstrip("/").partition("/")
        if kind == "models":
            parts = rest.split("/", 3)
            path = verified_file(self.server.model_dir, "/".join(parts[:2]), parts[2],
                                 parts[3]) if len(parts) == 4 else None
            if path is None:
                return self._missing()
            size = path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            sent = 0
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    self.wfile.write(chunk)
                    sent += len(chunk)
            return self._done(200, sent)
        if kind == "images" and pinned(rest, self.server.repositories):
            proc = subprocess.Popen(["docker", "save", rest], stdout=subprocess.PIPE)
            assert proc.stdout is not None
            first = proc.stdout.read(CHUNK)
            if not first:
                proc.wait()
                return self._missing()  # not on this host (or docker failed)
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            sent = 0
            chunk = first
            while chunk:
                self.wfile.write(chunk)
                sent += len(chunk)
                chunk = proc.stdout.read(CHUNK)
            self.close_connection = True
            return self._done(200 if proc.wait() == 0 else 500, sent)
        self._missing()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bind", help="default: every IPv6 and IPv4 address")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--repository", action="append", default=[])
    p.add_argument("--idle", type=float, default=300, help="stop after S idle seconds")
    args = p.parse_args(argv)
    server = Server((args.bind or any_address(), args.port), Path(args.model_dir),
                    set(args.repository))

    def watch() -> None:
        while True:
            time.sleep(min(5.0, args.idle / 2))
            with server.lock:
                if not server.busy and time.monotonic() - server.last > args.idle:
                    break
        server.shutdown()

    threading.Thread(target=watch, daemon=True).start()
    print(f"serving {args.model_dir} and images of {sorted(server.repositories)} on :{args.port} "
          f"until {args.idle:g}s idle", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
