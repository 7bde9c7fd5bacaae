"""The front's readiness path (``/rigfleet/ready``), run by a real nginx on loopback with the
role's template and the host tool's own route files, in front of a stand-in engine.

200 with the route header while the route serves and the engine's /health is 200; the
maintenance route's 503 + Retry-After during a window; 503 when the engine answers an error
or is gone; never the key, never model data. Skipped when ``nginx`` is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jinja2
import pytest
from balancer_helpers import free_port

from rigfleet.hostside.front import (
    READY_PATH,
    ROUTE_HEADER,
    ready_class,
    render_maintenance,
    render_serving,
)
from rigfleet.hostside.plan import StackRef
from rigfleet.resources import project_file
from rigfleet.scrape import ENGINE_PATH, NODE_PATH
from roles.front import NOT_READY_RETRY_S, keys_conf

pytestmark = pytest.mark.skipif(not shutil.which("nginx"), reason="nginx is not installed here")
KEY = "k3y-" + "r" * 40
METRICS = b'vllm:num_requests_running{engine="0",model_name="qwen3.6-27b-autoround"} 0.0\n'


class Engine:
    """``/health`` as vLLM answers it (200, or 503 when its engine is dead), ``/v1/models``."""

    def __init__(self) -> None:
        self.health = 200
        self.paths: list[str] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                engine.paths.append(self.path)
                code, body = ((engine.health, b"") if self.path == "/health"
                              else (200, METRICS) if self.path == "/metrics"
                              else (200, b'{"data": [{"id": "qwen3.6-27b-autoround"}]}'))
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Nginx:
    def __init__(self, tmp: Path, exporter_port: int = 9) -> None:
        self.tmp, self.port = tmp, free_port()
        (tmp / "keys.conf").write_text(keys_conf(KEY))
        self.route("maintenance")
        template = jinja2.Template(project_file("files/nginx-front.conf.j2").read_text())
        (tmp / "front.conf").write_text(template.render(
            front_port=self.port, keys_file=str(tmp / "keys.conf"),
            route_file=str(tmp / "route.conf"), tls=False, ready_path=READY_PATH,
            not_ready_retry_s=NOT_READY_RETRY_S, node_metrics_path=NODE_PATH,
            engine_metrics_path=ENGINE_PATH, node_exporter_port=exporter_port))
        temps = " ".join(f"{k}_temp_path {tmp}/tmp;"
                         for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (tmp / "nginx.conf").write_text(
            f"pid {tmp}/nginx.pid; error_log {tmp}/error.log; daemon off;\nevents {{}}\n"
            f"http {{ access_log off; {temps} include {tmp}/front.conf; }}\n")
        self.proc = subprocess.Popen(["nginx", "-c", str(tmp / "nginx.conf"), "-p", str(tmp)],
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while self.get(READY_PATH)[0] == 0:
            assert time.monotonic() < deadline and self.proc.poll() is None, \
                self.proc.stderr.read().decode() if self.proc.stderr else ""
            time.sleep(0.05)

    def route(self, what: str, engine: Engine | None = None) -> None:
        text = (render_maintenance("swap int8 -> tq3-mtp-genesis", 45) if what == "maintenance"
                else render_serving(StackRef("int8", "rigfleet-int8", "rigfleet-int8",
                                             engine.port if engine else 9, "/x", "abc123",
                                             "img", "qwen3.6-27b-autoround", 0.9)))
        (self.tmp / "route.conf").write_text(text)

    def reload(self) -> None:
        subprocess.run(["nginx", "-c", str(self.tmp / "nginx.conf"), "-p", str(self.tmp),
                        "-s", "reload"], check=True, capture_output=True)
        time.sleep(0.5)

    def get(self, path: str, key: str | None = None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, dict(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers.items()), e.read()
        except OSError:
            return 0, {}, b""

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def front(tmp_path):
    (tmp_path / "tmp").mkdir()
    engine = Engine()
    nginx = Nginx(tmp_path)
    yield nginx, engine
    nginx.close()
    engine.close()


def test_metrics_paths_need_the_key_and_reach_the_exporter_and_the_engine(tmp_path):
    (tmp_path / "tmp").mkdir()
    engine, exporter = Engine(), Engine()  # the node exporter: any path, its /metrics here
    nginx = Nginx(tmp_path, exporter_port=exporter.port)
    try:
        for path in (NODE_PATH, ENGINE_PATH):
            code, _, body = nginx.get(path)
            assert code == 401 and b"vllm" not in body, path
            assert nginx.get(path, "k3y-" + "x" * 40)[0] == 401
        code, _, body = nginx.get(NODE_PATH, KEY)
        assert (code, body, exporter.paths[-1]) == (200, METRICS, "/metrics")
        code, headers, _ = nginx.get(ENGINE_PATH, KEY)               # the maintenance route
        assert code == 503 and headers[ROUTE_HEADER] == "maintenance"
        nginx.route("serving", engine)
        nginx.reload()
        code, _, body = nginx.get(ENGINE_PATH, KEY)
        assert (code, body, engine.paths[-1]) == (200, METRICS, "/metrics")
        assert nginx.get(READY_PATH)[2] == b""                       # says nothing more
    finally:
        nginx.close()
        engine.close()
        exporter.close()


def test_ready_follows_the_route_and_the_engine_without_the_key(front):
    nginx, engine = front
    code, headers, body = nginx.get(READY_PATH)
    assert code == 503 and headers["Retry-After"] == "45"        # the maintenance route
    assert headers[ROUTE_HEADER] == "maintenance" and b"qwen" not in body

    nginx.route("serving", engine)
    nginx.reload()
    code, headers, body = nginx.get(READY_PATH)
    assert (code, headers[ROUTE_HEADER], body) == (200, "int8/abc123", b"")
    assert engine.paths[-1] == "/health"                          # asked, not the client path
    assert headers["Cache-Control"] == "no-store"

    engine.health = 503                                           # the engine is dead
    code, headers, body = nginx.get(READY_PATH)
    assert code == 503 and headers["Retry-After"] == str(NOT_READY_RETRY_S)
    assert ROUTE_HEADER not in headers
    assert json.loads(body) == {"ready": False, "class": "down",
                                "retry_after_s": NOT_READY_RETRY_S}

    engine.close()                                                # the container is gone
    code, headers, _ = nginx.get(READY_PATH)
    assert code == 503 and ROUTE_HEADER not in headers


def test_everything_else_still_needs_the_key(front):
    nginx, engine = front
    nginx.route("serving", engine)
    nginx.reload()
    assert nginx.get("/v1/models")[0] == 401
    assert nginx.get("/health")[0] == 401                         # only the ready path is open
    code, _, body = nginx.get("/v1/models", KEY)
    assert code == 200 and b"qwen" in body


# A crash loop's reason as the supervisor writes it: a log line, figures, a path.
GAVE_UP = ("crash loop: int8 died again (its container exited (exit code 1): out of memory: "
           "CUDA out of memory. Tried to allocate 2.00 GiB; GPU 0 has 23.56 GiB in use; log "
           "/var/lib/rigfleet/supervise/int8-x.log); gave up after 3 recreations in 4 min")


@pytest.mark.parametrize("message,kind", [
    ("swap int8 -> tq3-mtp-genesis in progress", "swapping"),
    ("maintenance: driver 580 -> 590", "maintenance"),
    ("int8 engine died; recreating it", "starting"),
    (GAVE_UP, "down"),
])
def test_ready_without_the_key_says_the_class_only(front, message, kind):
    nginx, _ = front
    (nginx.tmp / "route.conf").write_text(render_maintenance(message, 45))
    nginx.reload()
    code, headers, body = nginx.get(READY_PATH)
    assert code == 503 and headers["Retry-After"] == "45"
    assert json.loads(body) == {"ready": False, "class": kind, "retry_after_s": 45}
    # No reason, path, log line or figure without the key ...
    assert not re.search(rb"GiB|/var/|crash|int8|driver|\d\.\d", body)
    # ... the reason with it (the same path, the client's API).
    for path in (READY_PATH, "/v1/models"):
        code, _, body = nginx.get(path, KEY)
        error = json.loads(body)["error"]
        assert code == 503 and error["class"] == kind
        assert error["message"].startswith("rigfleet: " + message[:12])
    assert ready_class(message) == kind


def test_ready_path_has_short_proxy_timeouts_clients_long_ones():
    text = project_file("files/nginx-front.conf.j2").read_text()
    ready = text[text.index("location = {{ ready_path }}"):text.index("location @rigfleet_not")]
    client = text[text.index("location / {"):text.index("location = {{ ready_path }}")]
    assert "proxy_read_timeout 5s;" in ready and "proxy_connect_timeout 2s;" in ready
    assert "proxy_read_timeout 3600s;" in client
    # The route file sets none: each including location's own apply.
    assert "_timeout" not in render_serving(StackRef("int8", "p", "c", 1, "/x", "h", "img",
                                                    "m", 0.9))
