"""The gate's HTTP client against small misbehaving servers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rigfleet.hostside.verify.client import Client

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'


@contextmanager
def sse_server(body: Callable[[Any], None]) -> Iterator[str]:
    """A server whose chat completions stream what ``body(wfile)`` writes."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            with contextlib.suppress(OSError):  # the client gave up
                body(self.wfile)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_slow_stream_is_cut_at_the_timeout_not_a_read_later():
    """``timeout`` bounds the whole exchange: a stream that keeps trickling (a chunk a second)
    is cut at 1.2 s, not at the first line after it nor a whole socket timeout later (it
    ended at 2 s, or twice the gate's per-request timeout for a server that stalls)."""

    def trickle(w: Any) -> None:
        for _ in range(6):
            w.write(CHUNK)
            w.flush()
            time.sleep(1.0)

    with sse_server(trickle) as url:
        res = Client(url).chat({"model": "m", "messages": []}, timeout=1.2, stream=True)
    assert res.status == 200 and res.error.startswith("timed out")
    assert res.content.startswith("x")
    assert res.seconds < 1.7


def test_an_unloadable_ca_file_is_a_usage_error_naming_it(tmp_path, monkeypatch, capsys):
    """A missing or non-PEM ``$RIGFLEET_CA_FILE`` (or bench ``--ca-file``) is a usage error
    that names the file; the gate said "cannot write the report to DIR" and exited 102, the
    bench ended in a FileNotFoundError traceback."""
    from rigfleet.cli import main as rigfleet_main
    from rigfleet.hostside.verify.client import CA_FILE_ENV
    from rigfleet.hostside.verify.runner import EXIT_USAGE, main

    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    for path in (bad, tmp_path / "missing.pem"):
        monkeypatch.setenv(CA_FILE_ENV, str(path))
        with pytest.raises(SystemExit) as exc:
            main(["--url", "https://127.0.0.1:9", "--report-dir", str(tmp_path / "r"),
                  "--quiet"])
        assert exc.value.code == EXIT_USAGE
        err = capsys.readouterr().err
        assert f"${CA_FILE_ENV} {path}: cannot be loaded" in err
        assert "cannot write the report" not in err
    assert not (tmp_path / "r").exists()
    monkeypatch.delenv(CA_FILE_ENV)
    assert rigfleet_main(["bench", "--url", "https://127.0.0.1:9", "--ca-file",
                          str(tmp_path / "missing.pem"), "--out", str(tmp_path / "b"),
                          "--no-plot"]) == 2
    out = capsys.readouterr()
    assert "--ca-file" in out.out + out.err


@pytest.mark.parametrize("event", [
    b'{"choices":[null]}', b'{"choices":"abc"}', b'{"choices":{"0":{}}}',
    b'{"choices":[{"delta":"x"}]}', b'{"choices":[{"delta":{"content":5}}]}',
    b'{"choices":[{"delta":{"tool_calls":[{"function":{"name":5}}]}}]}',
    b'{"choices":[{"delta":{"tool_calls":[{"index":null},{"index":0}]}}]}',
])
def test_a_malformed_stream_event_is_a_failed_result_not_a_traceback(event):
    """The client never raises for a server's answer: a chunk whose ``choices`` is not a list
    of objects ended in AttributeError/TypeError (a traceback in ``rigfleet bench``)."""

    def body(w: Any) -> None:
        w.write(CHUNK + b"data: " + event + b"\n\ndata: [DONE]\n\n")
        w.flush()

    with sse_server(body) as url:
        res = Client(url).chat({"model": "m", "messages": []}, timeout=5, stream=True)
    assert res.status == 200 and not res.ok
    assert res.error.startswith("malformed SSE event:") and "choices" in res.error


@pytest.mark.parametrize("body", [
    b'{"choices":[null]}', b'{"choices":"abc"}', b'{"choices":{"a":1}}',
    b'{"choices":[{"message":"x"}]}', b'{"choices":[{"message":{"content":["x"]}}]}',
])
def test_a_malformed_completion_is_a_failed_result_not_a_traceback(body):
    from rigfleet.hostside.verify.client import _parse_completion

    res = _parse_completion(200, body, 0.1)
    assert not res.ok and res.error.startswith("malformed response:")
    assert "choices" in res.error


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_a_reply_the_engine_aborted_is_a_failed_attempt(reason):
    """vLLM ends a request its engine gave up on with HTTP 200, the text so far and
    finish_reason "abort" (vllm/v1/engine/output_processor.py, abort_requests); the client
    took it for a good reply, so a check passed on a cut answer and a bench run measured it."""
    from rigfleet.hostside.verify.client import _parse_completion

    end = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"%s"}]}\n\n' % reason.encode()

    def body(w: Any) -> None:
        w.write(CHUNK + end + b"data: [DONE]\n\n")
        w.flush()

    with sse_server(body) as url:
        streamed = Client(url).chat({"model": "m", "messages": []}, timeout=5, stream=True)
    whole = _parse_completion(200, b'{"choices":[{"message":{"content":"x"},"finish_reason":"%s"}]}'
                              % reason.encode(), 0.1)
    for res in (streamed, whole):
        assert res.status == 200 and res.content == "x" and res.finish_reason == reason
        assert not res.ok and f'finish_reason "{reason}"' in res.error


def test_a_url_password_stays_out_of_transport_errors(tmp_path, capsys):
    """``--url http://user:password@host`` (no port): urllib reads ``password@host`` as the
    port, and its "nonnumeric port: 'password@host'" went into the gate's finding, its
    reports and its progress line, though the report's URL was redacted."""
    from rigfleet.hostside.verify.runner import main

    secret = "s3cret-pw"
    url = f"http://alice:{secret}@127.0.0.1"
    res = Client(url).request("GET", "/health", timeout=2)
    assert res.status == 0 and res.error and secret not in res.error
    assert main(["--url", url, "--profile", "fast", "--set", "health_wait_s=0",
                 "--report-dir", str(tmp_path)]) == 1
    written = "".join(p.read_text() for p in tmp_path.iterdir())
    assert "GET /health" in written and secret not in written
    assert secret not in capsys.readouterr().err


def test_an_api_key_file_that_is_not_text_is_a_usage_error_naming_it(tmp_path, capsys):
    """``--api-key-file`` naming a binary file (a key store, a wrong path) said only "'utf-8'
    codec can't decode byte 0xff in position 0": neither the flag nor the file."""
    from rigfleet.hostside.verify.runner import EXIT_USAGE, main

    key = tmp_path / "key.bin"
    key.write_bytes(b"\xff\xfe\x00key")
    with pytest.raises(SystemExit) as exc:
        main(["--url", "http://127.0.0.1:9", "--api-key-file", str(key), "--quiet"])
    assert exc.value.code == EXIT_USAGE
    assert f"--api-key-file {key}: not UTF-8 text" in capsys.readouterr().err


def test_a_report_dir_that_cannot_be_made_is_a_usage_error_before_the_gate(tmp_path, capsys):
    """``rigfleet verify --report-dir DIR`` where DIR cannot be made: the gate ran every check
    (an hour in the full profile) and then exited 102 "cannot write the report"; now it is a
    usage error naming the directory before any request."""
    from rigfleet.hostside.verify.runner import EXIT_USAGE, main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["--url", "http://127.0.0.1:9", "--profile", "fast", "--set", "health_wait_s=0",
              "--report-dir", str(blocker / "reports")])
    assert exc.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--report-dir {blocker / 'reports'}:" in err and "GET /health" not in err
