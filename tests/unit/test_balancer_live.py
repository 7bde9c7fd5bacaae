"""The rendered HAProxy config, run by a real HAProxy on loopback in front of fake fronts.

What the balancer promises, checked against HAProxy itself rather than against the text of
its config: the key, routing per stack, stickiness by ``X-Session-Id``, a host leaving and
rejoining rotation by its readiness answer alone, a request refused before any byte (503,
closed) retried on another host, in-flight streams finishing, long bodies passing, streams
not buffered. Skipped when ``haproxy`` is not installed (``apt-get install haproxy``).

The config is the role's, with only what needs root or syslog left out (``chroot``, the
``haproxy`` user, ``daemon``, ``log /dev/log``) and the paths under a temporary directory.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from balancer_helpers import API_KEY, FakeFront, free_port, make_plan

from rigfleet.balancer.haproxy import HostPaths, keys_list, parse_stat_csv, render_config

pytestmark = pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed")

ROOT_ONLY = ("    chroot ", "    user ", "    group ", "    daemon", "    log /dev/log")


class Balancer:
    def __init__(self, tmp: Path, fronts: list[FakeFront]) -> None:
        self.port = free_port()
        addresses = {f.name: f"127.0.0.1:{f.port}" for f in fronts}
        plan = make_plan(tmp, {f.name: f.stack for f in fronts}, addresses,
                         balancer_port=self.port, balancer_check_interval_s=0.5,
                         balancer_default_stack="int8", balancer_retry_buffer_kib=16)
        self.paths = HostPaths(config=str(tmp / "haproxy.cfg"), secret_dir=str(tmp),
                               ca_dir=str(tmp / "ca"), socket=str(tmp / "stats.sock"))
        Path(self.paths.keys).write_text(keys_list(API_KEY))
        text = "".join(line for line in render_config(plan, self.paths).splitlines(True)
                       if not line.startswith(ROOT_ONLY))
        Path(self.paths.config).write_text(text)
        check = subprocess.run(["haproxy", "-c", "-q", "-f", self.paths.config],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", self.paths.config],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            self.wait(lambda: (rows := self.stats()) and all(s.in_rotation for s in rows),
                      "all hosts up")
        except BaseException:
            self.close()
            raise

    def stats(self):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(self.paths.socket)
                s.sendall(b"show stat\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:
            return []
        return parse_stat_csv(data.decode())

    def up(self, backend: str) -> set[str]:
        return {s.host for s in self.stats() if s.backend == backend and s.in_rotation}

    def wait(self, ok, what: str, timeout: float = 10.0) -> float:
        start = time.monotonic()
        while not ok():
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            assert time.monotonic() - start < timeout, f"not within {timeout}s: {what}"
            time.sleep(0.05)
        return time.monotonic() - start

    def request(self, path: str = "/v1/chat/completions", body: dict | bytes | None = None,
                key: str | None = API_KEY, session: str | None = None,
                auth: str | None = None) -> tuple[int, dict, bytes]:
        data = body if isinstance(body, bytes) else json.dumps(body or {"messages": []}).encode()
        headers = {"Content-Type": "application/json"}
        if auth is not None:
            headers["Authorization"] = auth
        elif key is not None:
            headers["Authorization"] = f"Bearer {key}"
        if session:
            headers["X-Session-Id"] = session
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=20) as resp:
                return resp.status, _low(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, _low(e.headers.items()), e.read()

    def host_of(self, path: str = "/v1/chat/completions", **kw) -> str:
        code, _, body = self.request(path, **kw)
        assert code == 200, (code, body)
        return json.loads(body)["host"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _low(items) -> dict[str, str]:
    """Header names lower-cased (HAProxy writes them so; HTTP says case does not matter)."""
    return {k.lower(): v for k, v in items}


@pytest.fixture
def fleet(tmp_path):
    fronts = [FakeFront("host1", "int8"), FakeFront("host2", "int8"),
              FakeFront("host3", "tq3-mtp-genesis")]
    lb = Balancer(tmp_path, fronts)
    yield lb, {f.name: f for f in fronts}
    lb.close()
    for f in fronts:
        f.close()


def session_on(lb: Balancer, host: str) -> str:
    """A session id the hash puts on ``host``."""
    for i in range(200):
        if lb.host_of(session=f"s{i}") == host:
            return f"s{i}"
    raise AssertionError(f"no session id lands on {host}")


def test_the_key_is_required_exactly_as_at_the_front(fleet):
    lb, fronts = fleet
    for auth in (None, "Bearer wrong-key-0123456789", f"bearer {API_KEY}", f"Bearer {API_KEY}x",
                 f"Bearer {API_KEY}, Bearer x"):
        code, headers, body = lb.request(key=None, auth=auth)
        assert code == 401, auth
        assert headers.get("www-authenticate") == 'Bearer realm="rigfleet"'
        assert json.loads(body)["error"]["code"] == 401
    assert not any(f.seen for f in fronts.values())
    code, _, _ = lb.request()
    assert code == 200
    # The client's key goes on to the front, which checks it again.
    assert [s["auth"] for f in fronts.values() for s in f.seen] == [f"Bearer {API_KEY}"]


def test_each_stack_is_asked_by_its_path_and_never_reaches_another(fleet):
    lb, fronts = fleet
    assert {lb.host_of() for _ in range(6)} == {"host1", "host2"}  # /v1: the default stack
    for _ in range(4):
        assert lb.host_of("/stacks/tq3-mtp-genesis/v1/chat/completions") == "host3"
        assert lb.host_of("/stacks/int8/v1/chat/completions") in ("host1", "host2")
    assert {s["path"] for s in fronts["host3"].seen} == {"/v1/chat/completions"}
    code, _, body = lb.request("/stacks/nope/v1/chat/completions")
    assert code == 404 and b"/stacks/int8/v1/" in body


def test_a_conversation_stays_on_one_host_and_moves_only_when_it_leaves(fleet):
    lb, fronts = fleet
    sid = session_on(lb, "host1")
    assert {lb.host_of(session=sid) for _ in range(5)} == {"host1"}
    others = {lb.host_of(session=f"other-{i}") for i in range(20)}
    assert others == {"host1", "host2"}
    fronts["host1"].ready = False
    lb.wait(lambda: lb.up("stack_int8") == {"host2"}, "host1 out")
    assert lb.host_of(session=sid) == "host2"
    fronts["host1"].ready = True
    lb.wait(lambda: lb.up("stack_int8") == {"host1", "host2"}, "host1 back")
    assert lb.host_of(session=sid) == "host1"


def test_a_host_leaves_rotation_by_its_readiness_answer_within_the_check_interval(fleet):
    lb, fronts = fleet
    fronts["host2"].serving = False  # its swap window opened: the route's 503
    took = lb.wait(lambda: "host2" not in lb.up("stack_int8"), "host2 out")
    # interval 0.5 s: the next check fails, a second one fastinter (250 ms) later.
    assert took < 1.5
    row = next(s for s in lb.stats() if s.host == "host2")
    assert row.status.startswith("DOWN") and row.check_code == "503"
    # Back only once it answers ready for its own stack.
    fronts["host2"].serving = True
    fronts["host2"].stack = "tq3-mtp-genesis"  # serves another stack now: stays out
    time.sleep(1.5)
    assert "host2" not in lb.up("stack_int8")
    fronts["host2"].stack = "int8"
    lb.wait(lambda: "host2" in lb.up("stack_int8"), "host2 back")


def test_a_request_refused_before_any_byte_is_answered_by_another_host(fleet):
    lb, fronts = fleet
    sid = session_on(lb, "host1")
    # host1 opened its window after its last good check: the balancer still sends to it.
    fronts["host1"].serving = False
    assert lb.host_of(session=sid) == "host2"
    assert fronts["host1"].seen[-1]["session"] == sid  # it was asked, and refused
    fronts["host1"].serving = True
    fronts["host1"].drop = True  # closes without a byte (its engine died on the request)
    assert lb.host_of(session=sid) == "host2"
    fronts["host1"].drop = False


def test_only_requests_safe_to_repeat_are_retried_after_a_refusal(fleet):
    lb, fronts = fleet
    sid = session_on(lb, "host1")
    fronts["host1"].serving = False
    code, headers, _ = lb.request("/v1/files", session=sid)
    assert code == 503 and headers.get("retry-after") == "30"


def test_a_body_larger_than_the_retry_buffer_streams_through_and_is_not_retried(fleet):
    lb, fronts = fleet
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 300_000}]}).encode()
    code, _, body = lb.request(body=big)
    assert code == 200 and json.loads(body)["length"] == len(big)
    # The trade-off (docs/balancer.md): past the buffer, a 503 reaches the client, who
    # retries after Retry-After; a connection failure is still retried elsewhere.
    sid = session_on(lb, "host1")
    fronts["host1"].serving = False
    code, headers, _ = lb.request(body=big, session=sid)
    assert code == 503 and headers.get("retry-after") == "30"


def test_streams_are_not_buffered_and_finish_on_a_host_leaving_rotation(fleet):
    lb, fronts = fleet
    sid = session_on(lb, "host1")
    fronts["host1"].stream_gap_s = 0.6
    req = urllib.request.Request(
        lb.url + "/v1/chat/completions", method="POST",
        data=json.dumps({"stream": True, "messages": []}).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "X-Session-Id": sid,
                 "Content-Type": "application/json"})
    started = time.monotonic()
    events, times = [], []
    with urllib.request.urlopen(req, timeout=20) as resp:
        for line in resp:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                times.append(time.monotonic() - started)
                if len(events) == 1:
                    fronts["host1"].serving = False  # leaves rotation mid-stream
    assert times[0] < 0.5, times  # the first event came before the next one was written
    assert events[-1] == b"[DONE]" and len(events) == 5
    assert "host1" not in lb.up("stack_int8")
