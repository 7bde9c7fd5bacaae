"""The front's TLS from the clients' side: the gate's client and ``rigfleet endpoints`` verify
the front against the inventory's certificate (or CA), and refuse anything else.

A local HTTPS server (the standard library's, with a certificate openssl makes here) stands in
for nginx; the nginx configuration itself is rendered and, where nginx is installed, checked
with ``nginx -t``.
"""

from __future__ import annotations

import http.server
import json
import shutil
import ssl
import subprocess
import threading
import urllib.error
from pathlib import Path

import jinja2
import pytest

from rigfleet.endpoints import chat, front_context
from rigfleet.hostdata import FrontTls
from rigfleet.hostside.verify.client import CA_FILE_ENV, Client
from rigfleet.resources import project_file

KEY = "k3y-" + "t" * 40


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed here")
    d = tmp_path_factory.mktemp("tls")
    for name, cn in (("front", "127.0.0.1"), ("other", "other")):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                        "-subj", f"/CN={cn}", "-addext", f"subjectAltName=IP:{cn}"
                        if cn[0].isdigit() else f"subjectAltName=DNS:{cn}",
                        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt")],
                       check=True, capture_output=True)
    return {p.name: p for p in d.iterdir()}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {KEY}"
        body = json.dumps({"data": [{"id": "m"}]} if ok else {"error": "no"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.dumps({"model": "m", "choices": [{"message": {"content": "Paris."}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def front(certs):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs["front.crt"], certs["front.key"])
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_gate_client_verifies_against_the_given_certificate(front, certs, monkeypatch):
    monkeypatch.delenv(CA_FILE_ENV, raising=False)
    ok = Client(front, api_key=KEY, ca_file=str(certs["front.crt"])).request("GET", "/v1/models",
                                                                              timeout=10)
    assert ok.status == 200 and ok.json() == {"data": [{"id": "m"}]}
    # The system's trust store does not know a self-signed front; another certificate neither.
    for client in (Client(front, api_key=KEY),
                   Client(front, api_key=KEY, ca_file=str(certs["other.crt"]))):
        r = client.request("GET", "/v1/models", timeout=10)
        assert r.status == 0 and "CERTIFICATE_VERIFY_FAILED" in r.error
        assert KEY not in r.error
    # The gate runs as its own program: RIGFLEET_CA_FILE carries the file to it.
    monkeypatch.setenv(CA_FILE_ENV, str(certs["front.crt"]))
    assert Client(front, api_key=KEY).request("GET", "/v1/models", timeout=10).status == 200


def test_endpoints_speak_tls_with_the_inventory_ca(front, certs):
    tls = FrontTls(str(certs["front.crt"]), str(certs["front.key"]), str(certs["front.crt"]))
    reply = chat(front, KEY, "capital of France?", "m", context=front_context(tls), timeout=10)
    assert reply["choices"][0]["message"]["content"] == "Paris."
    wrong = FrontTls(str(certs["front.crt"]), str(certs["front.key"]), str(certs["other.crt"]))
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        chat(front, KEY, "capital of France?", "m", context=front_context(wrong), timeout=10)


def render(tls: bool, tmp: Path) -> str:
    template = jinja2.Template(project_file("files/nginx-front.conf.j2").read_text(),
                               keep_trailing_newline=True)
    from rigfleet.hostside.front import READY_PATH
    from roles.front import NOT_READY_RETRY_S

    return template.render(front_port=8000, keys_file=str(tmp / "keys.conf"),
                           route_file=str(tmp / "route.conf"), tls=tls,
                           cert_file=str(tmp / "front.crt"), key_file=str(tmp / "front.key"),
                           ready_path=READY_PATH, not_ready_retry_s=NOT_READY_RETRY_S,
                           node_metrics_path="/rigfleet/metrics/node",
                           engine_metrics_path="/rigfleet/metrics/engine",
                           node_exporter_port=9100)


def test_the_front_listens_tls_except_on_loopback(tmp_path):
    conf = render(True, tmp_path)
    assert "    listen 127.0.0.1:8000;\n    listen 8000 ssl;\n" in conf
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in conf
    plain = render(False, tmp_path)
    assert "    listen 8000;\n    server_name _;" in plain and "ssl" not in plain


@pytest.mark.skipif(not shutil.which("nginx"), reason="nginx is not installed here")
def test_the_tls_front_passes_nginx_t(tmp_path, certs):
    from rigfleet.hostside.front import render_maintenance
    from roles.front import keys_conf

    shutil.copy(certs["front.crt"], tmp_path / "front.crt")
    shutil.copy(certs["front.key"], tmp_path / "front.key")
    (tmp_path / "keys.conf").write_text(keys_conf(KEY))
    (tmp_path / "route.conf").write_text(render_maintenance("test", 30))
    (tmp_path / "front.conf").write_text(render(True, tmp_path))
    temps = " ".join(f"{k}_temp_path {tmp_path}/tmp;"
                     for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{ access_log off; {temps} include {tmp_path}/front.conf; }}\n")
    proc = subprocess.run(["nginx", "-t", "-c", str(tmp_path / "nginx.conf"), "-p",
                           str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
