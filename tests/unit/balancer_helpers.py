"""Shared pieces of the balancer tests: host data, a plan, and stand-ins for GPU hosts' fronts.

``FakeFront`` is a small HTTP server playing one GPU host's front as the balancer sees it:
``/rigfleet/ready`` answers as nginx's readiness location does (200 + ``X-Rigfleet-Route:
<stack>/<hash>`` while serving, the maintenance route's 503 + Retry-After, or 503 when the
engine is gone), and ``/v1/chat/completions`` answers JSON or an SSE stream naming the host,
or 503 while ``serving`` is off (the swap window opened between two checks), or closes the
connection without a byte (``drop``: an engine that died mid-request).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from http_fakes import QuietHandler

from rigfleet.balancer.plan import GpuHost, plan_balancer
from rigfleet.hostdata import validate_balancer, validate_host

API_KEY = "k3y-" + "x" * 40
REPO = {"url": "http://apt.rigfleet.test/debian", "key_url": "http://apt.rigfleet.test/k.asc",
        "suite": "stable", "components": ["main"]}


def key_file(tmp: Path, key: str = API_KEY, name: str = "api-key") -> Path:
    path = tmp / name
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def gpu_data(key: Path, **extra: Any) -> dict[str, Any]:
    return {"stack": "int8", "power_caps_w": 250, "model_dir": "/srv/models",
            "front_port": 8000, "api_key_file": str(key),
            "apt_repos": {"cuda": REPO, "nvidia-container-toolkit": REPO}, **extra}


def gpu_host(name: str, key: Path, ssh_hostname: str | None = None, **extra: Any) -> GpuHost:
    return GpuHost(name, validate_host(name, gpu_data(key, **extra)), ssh_hostname)


def make_plan(tmp: Path, stacks: dict[str, str], addresses: dict[str, str] | None = None,
              **balancer: Any):
    """A plan for hosts name -> stack (``addresses``: their balancer_front_address)."""
    key = key_file(tmp)
    hosts = [gpu_host(n, key, stack=s, **({"balancer_front_address": addresses[n]}
                                          if addresses else {}))
             for n, s in stacks.items()]
    settings = validate_balancer("lb1", {"api_key_file": str(key), **balancer})
    return plan_balancer("lb1", settings, hosts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FakeFront:
    """One GPU host's front (see the module docstring)."""

    name: str
    stack: str
    port: int = field(default_factory=free_port)
    ready: bool = True          # the engine answers /health
    serving: bool = True        # False: the maintenance route (503 + Retry-After)
    drop: bool = False          # close chat requests without an answer
    stream_gap_s: float = 0.0   # pause between SSE chunks
    cut_after: int | None = None  # end a stream after this many events (no [DONE])
    seen: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        front = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path == "/rigfleet/ready":
                    if not front.serving:
                        self._send(503, b"{}", {"X-Rigfleet-Route": "maintenance",
                                                "Retry-After": "30"})
                    elif not front.ready:
                        self._send(503, b"{}", {"Retry-After": "5"})
                    else:
                        self._send(200, b"", {"X-Rigfleet-Route": f"{front.stack}/abc123"})
                    return
                self._chat(b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._chat(self.rfile.read(length))

            def _chat(self, body: bytes) -> None:
                front.seen.append({"path": self.path, "length": len(body),
                                   "auth": self.headers.get("Authorization"),
                                   "session": self.headers.get("X-Session-Id")})
                if front.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if not front.serving or not front.ready:
                    self._send(503, b'{"error": "maintenance"}', {"Retry-After": "30"})
                    return
                try:
                    req = json.loads(body or b"{}")
                except ValueError:
                    req = {}
                if not req.get("stream"):
                    self._send(200, json.dumps({"host": front.name, "path": self.path,
                                                "length": len(body), "choices": [
                                                    {"finish_reason": "stop", "message": {
                                                        "content": "ok"}}]}).encode(),
                               {"Content-Type": "application/json"})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [json.dumps({"host": front.name, "i": i, "choices": [
                    {"delta": {"content": "x"}, "finish_reason": "stop" if i == 3 else None}]})
                    for i in range(4)] + ["[DONE]"]
                for i, event in enumerate(events):
                    if front.cut_after is not None and i >= front.cut_after:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if i:
                        time.sleep(front.stream_gap_s)
                    chunk = f"data: {event}\n\n".encode()
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # HAProxy's checks close once they have the headers

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def tls_files(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for ``name`` and its key (0600); skips without openssl."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    crt, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "30", "-subj",
                    f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}", "-keyout",
                    str(key), "-out", str(crt)], check=True, capture_output=True)
    key.chmod(0o600)
    return crt, key
