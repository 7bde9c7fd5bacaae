"""The front's route file, the ledger's lines and state, the journal, the plan file."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading

import pytest
from swap_fakes import make_plan, make_ref

from rigfleet.hostside import ledger
from rigfleet.hostside.front import (
    MAINTENANCE,
    ROUTE_HEADER,
    Front,
    FrontError,
    render_maintenance,
    render_serving,
)
from rigfleet.hostside.journal import Journal
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.plan import Plan, PlanError, compose_hash
from rigfleet.hostside.records import ledger_tail, read_state, route
from rigfleet.hostside.stackctl import SystemOps, http_request, run_cmd


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(tmp_path)


class Nginx:
    """``nginx -t`` / reload and the front's answers, as the route file says."""

    def __init__(self, lay: Layout, test_ok: bool = True, lag: int = 0, stale: int = 0) -> None:
        self.lay, self.test_ok, self.lag = lay, test_ok, lag
        self.commands: list[list[str]] = []
        self.live: str | None = None
        self.polls = 0
        # Worker PIDs taking connections; a reload starts one and the old one stops taking
        # connections after ``stale`` more listings.
        self.workers, self.stale = ["101"], stale

    def run(self, argv: list[str], timeout: float) -> tuple[int, str]:
        self.commands.append(argv)
        if argv[:2] == ["nginx", "-t"]:
            return (0, "") if self.test_ok else (1, "nginx: [emerg] unexpected end of file")
        if argv[:2] == ["systemctl", "show"]:
            return 0, "100\n"
        if argv[0] == "pgrep":
            assert argv[1:3] == ["-P", "100"]
            if len(self.workers) > 1:
                if self.stale <= 0:
                    self.workers = self.workers[1:]
                self.stale -= 1
            return 0, "\n".join(self.workers)
        self.live = route(self.lay.front_route)
        self.workers.append(str(int(self.workers[-1]) + 1))
        return 0, ""

    def http(self, method, url, headers, body, timeout):
        assert headers == {"Authorization": "Bearer k3y"} and url.endswith("/v1/models")
        self.polls += 1
        if self.polls <= self.lag:
            return 200, {ROUTE_HEADER: "int8/old"}, b""
        if self.live == MAINTENANCE:
            return 503, {ROUTE_HEADER: MAINTENANCE, "Retry-After": "30"}, b"{}"
        return 200, {ROUTE_HEADER: self.live or ""}, b"{}"


def front(lay: Layout, nginx: Nginx) -> Front:
    return Front(lay, 8000, nginx.run, nginx.http, api_key="k3y", settle_s=5,
                 sleep=lambda s: None)


def test_serving_route_proxies_to_the_stack_and_names_itself(lay):
    ref = make_ref(lay, "tq3-mtp-genesis", "3333cccc4444dddd")
    text = render_serving(ref)
    assert text.splitlines()[0] == "# rigfleet route: tq3-mtp-genesis/3333cccc4444dddd"
    assert "proxy_pass http://127.0.0.1:8015;" in text
    assert f'add_header {ROUTE_HEADER} "tq3-mtp-genesis/3333cccc4444dddd" always;' in text
    assert "proxy_buffering off;" in text and "_timeout" not in text  # the location's own


def test_maintenance_is_a_503_with_retry_after_and_a_json_body(lay):
    text = render_maintenance("swap int8 -> tq3-mtp-genesis in progress'; evil", 12)
    assert "add_header Retry-After 12 always;" in text
    body = text.rsplit("return 503 '", 1)[1].rsplit("';", 1)[0]  # with the key
    data = json.loads(body)
    assert data["error"]["code"] == 503 and data["error"]["type"] == "service_unavailable"
    assert "swap int8 -> tq3-mtp-genesis in progress" in data["error"]["message"]
    assert "'" not in body  # nothing can close nginx's string early


@pytest.mark.skipif(not shutil.which("nginx"), reason="nginx is not installed here")
def test_rendered_routes_pass_nginx_t(lay, tmp_path):
    ref = make_ref(lay, "int8", "1111aaaa2222bbbb")
    for text in (render_serving(ref), render_maintenance("x", 5)):
        (tmp_path / "route.conf").write_text(text)
        conf = tmp_path / "nginx.conf"
        conf.write_text(f"events {{}}\nhttp {{ map $http_authorization $rigfleet_authorized "
                        f"{{ default 0; }} server {{ listen 127.0.0.1:1; location / {{ "
                        f"include {tmp_path}/route.conf; }} }} }}\n")
        proc = subprocess.run(["nginx", "-t", "-c", str(conf)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_switch_tests_reloads_and_waits_until_the_front_shows_the_route(lay):
    nginx = Nginx(lay, lag=3)
    f = front(lay, nginx)
    ref = make_ref(lay, "int8", "1111aaaa2222bbbb")
    f.serve(ref)
    assert f.current() == "int8/1111aaaa2222bbbb"
    assert nginx.commands[0] == ["nginx", "-t", "-q"]
    assert ["systemctl", "reload", "nginx"] in nginx.commands
    assert nginx.polls == 4  # waited through the lag
    polls = nginx.polls
    f.maintenance("swap", 30)  # returns once the front answers 503 on the maintenance route
    assert f.current() == nginx.live == MAINTENANCE and nginx.polls == polls + 1


def test_a_switch_waits_until_no_worker_from_before_the_reload_takes_connections(lay):
    nginx = Nginx(lay, stale=3)  # the new route answers at once; the old worker lingers
    ref = make_ref(lay, "int8", "1111aaaa2222bbbb")
    front(lay, nginx).serve(ref)
    assert nginx.polls == 4 and nginx.workers == ["102"]
    lingering = Nginx(lay, stale=10**6)
    with pytest.raises(FrontError, match="nginx workers 101 from before the reload still take"):
        Front(lay, 8000, lingering.run, lingering.http, api_key="k3y", settle_s=0.01,
              sleep=lambda s: None).maintenance("x", 1)


def test_a_route_nginx_refuses_is_put_back(lay):
    good = Nginx(lay)
    ref = make_ref(lay, "int8", "1111aaaa2222bbbb")
    front(lay, good).serve(ref)
    before = lay.front_route.read_text()
    bad = Nginx(lay, test_ok=False)
    with pytest.raises(FrontError, match="nginx -t refused route maintenance"):
        front(lay, bad).maintenance("swap", 30)
    assert lay.front_route.read_text() == before
    assert ["systemctl", "reload", "nginx"] not in bad.commands


def test_a_front_that_never_shows_the_route_is_an_error(lay):
    nginx = Nginx(lay, lag=10**6)
    with pytest.raises(FrontError, match="still answers 200 route 'int8/old'"):
        Front(lay, 8000, nginx.run, nginx.http, api_key="k3y", settle_s=0.01,
              sleep=lambda s: None).maintenance("x", 1)


def test_ledger_lines_describe_what_serves_after_the_event(lay):
    old, new = make_ref(lay, "int8", "1111aaaa2222bbbb"), make_ref(lay, "tq3-mtp-genesis", "33")
    gate = {"result": "fail", "failed_checks": ["needles"], "report": "/r.json"}
    ledger.append(lay, "swap", "rolled-back", old, attempted=new, host="h1",
                  by="alice", deploy_id="D", gate=gate, reason="gate failed")
    ledger.append(lay, "activate", "failed", None, attempted=new)
    first, second = ledger_tail(lay.ledger_file)[0]
    assert first["stack"] == "int8" and first["attempted"]["stack"] == "tq3-mtp-genesis"
    assert first["config_hash"] == "1111aaaa2222bbbb" and first["gate"] == gate
    assert set(ledger.TRACKED_KEYS) <= set(first)
    assert second["stack"] is None and second["gate"] == {"result": "not-run"}
    assert len(lay.ledger_file.read_text().splitlines()) == 2


def test_state_updates_keep_keys_others_wrote(lay):
    ledger.update_state(lay, stack="int8", driver_branch="580", custom=1)
    state = ledger.update_state(lay, stack="tq3-mtp-genesis", gate={"result": "pass"})
    assert state == {"stack": "tq3-mtp-genesis", "driver_branch": "580", "custom": 1,
                     "gate": {"result": "pass"}}
    assert read_state(lay.state_file) == state
    lay.state_file.write_text("not json")
    assert read_state(lay.state_file) == {}


def test_journal_states_starting_running_done_and_died(lay, tmp_path):
    d = lay.swap_dir("X")
    d.mkdir(parents=True)
    (d / "plan.json").write_text("{}")
    assert Journal.read(d)["state"] == "starting"
    j = Journal(d, echo=None)
    j.event("stop", "docker compose down rigfleet-int8")
    j.event("vram", "released")
    first = Journal.read(d, since=0)
    assert first["state"] == "running" and first["next"] == 2
    assert [e["phase"] for e in first["events"]] == ["stop", "vram"]
    assert Journal.read(d, since=1)["events"][0]["phase"] == "vram"
    j.finish({"result": "promoted", "exit": 0})
    assert Journal.read(d)["result"]["result"] == "promoted"
    (d / "result.json").unlink()
    (d / "pid.json").write_text(json.dumps({"pid": 2**22 + 12345}))
    assert Journal.read(d)["state"] == "died"


def test_a_half_written_last_event_is_read_again_once_it_is_complete(lay):
    """The follower (``status --id ID --since N``) polls while an event is being appended:
    the partial line is not counted in ``next``, so the whole event is shown next time."""
    d = lay.swap_dir("X")
    j = Journal(d, echo=None)
    j.event("stop", "docker compose down rigfleet-int8")
    line = json.dumps({"seq": 2, "phase": "vram", "message": "released"}, sort_keys=True)
    events = d / "events.jsonl"
    with events.open("a") as f:
        f.write(line[:10])
    first = Journal.read(d, since=0)
    assert [e["phase"] for e in first["events"]] == ["stop"] and first["next"] == 1
    with events.open("a") as f:
        f.write(line[10:] + "\n")
    again = Journal.read(d, since=first["next"])
    assert [e["phase"] for e in again["events"]] == ["vram"] and again["next"] == 2


def test_a_plan_file_that_is_not_text_is_a_bad_plan_not_a_traceback(lay, capsys):
    from rigfleet.hostside.__main__ import main

    path = lay.swap_dir("d1") / "plan.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\xfe{garbage")
    with pytest.raises(SystemExit) as ended:
        main(["--root", str(lay.root), "swap", "--plan", str(path)])
    assert ended.value.code == 4  # docs/swap.md: 4 bad plan
    assert f"rigfleet-host swap: {path}: not UTF-8 text" in capsys.readouterr().err


def test_a_plan_file_with_a_missing_field_is_refused_naming_the_file(lay, capsys):
    from rigfleet.hostside.__main__ import main

    plan = make_plan(lay, make_ref(lay, "int8", "1111aaaa2222bbbb"))
    path = lay.swap_dir(plan.id) / "plan.json"
    data = plan.to_dict()
    path.write_text(json.dumps({**data, "desired": {
        k: v for k, v in data["desired"].items() if k != "port"}}))
    with pytest.raises(PlanError, match=rf"^{re.escape(str(path))}: desired\.port: missing$"):
        Plan.load(path)
    with pytest.raises(SystemExit) as ended:
        main(["--root", str(lay.root), "swap", "--plan", str(path)])
    assert ended.value.code == 4  # docs/swap.md: 4 bad plan
    assert f"rigfleet-host swap: {path}: desired.port: missing" in capsys.readouterr().err


def test_plan_round_trip_and_errors_naming_the_field(lay):
    plan = make_plan(lay, make_ref(lay, "int8", "1111aaaa2222bbbb"), gate_profile="fast",
                     gate_set=("soak_sessions=2",))
    again = Plan.load(lay.swap_dir(plan.id) / "plan.json")
    assert again == plan and again.desired.route_id == "int8/1111aaaa2222bbbb"
    data = plan.to_dict()
    with pytest.raises(PlanError, match=r"desired\.port: missing"):
        Plan.from_dict({**data, "desired": {k: v for k, v in data["desired"].items()
                                            if k != "port"}})
    with pytest.raises(PlanError, match=r"id: '../x' is not a valid id"):
        Plan.from_dict({**data, "id": "../x"})
    with pytest.raises(PlanError, match="gpu_memory_utilization: 1.5"):
        Plan.from_dict({**data, "desired": {**data["desired"], "gpu_memory_utilization": 1.5}})
    assert compose_hash("    labels:\n      io.rigfleet.config-hash: 0123abcd4567ef89\n") == \
        "0123abcd4567ef89"
    assert compose_hash("io.rigfleet.config-hash: '0123abcd4567ef89'") == "0123abcd4567ef89"


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc",  # the engine killed mid-answer
    b"\x15\x03\x01\x00\x02\x02\x46",                        # not HTTP (a TLS alert)
])
def test_a_broken_http_answer_is_no_answer_not_an_exception(answer):
    server = socket.create_server(("127.0.0.1", 0))

    def answer_once() -> None:
        conn, _ = server.accept()
        conn.recv(4096)
        conn.sendall(answer)
        conn.close()

    threading.Thread(target=answer_once, daemon=True).start()
    with server:
        status, headers, _ = http_request(
            "GET", f"http://127.0.0.1:{server.getsockname()[1]}/metrics", {}, None, 5.0)
    assert (status, headers) == (0, {})


def test_running_containers_are_never_docker_s_error_words(monkeypatch):
    error = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    monkeypatch.setattr("rigfleet.hostside.stackctl.run_cmd", lambda argv, timeout=0: (1, error))
    assert SystemOps().running() == []
    monkeypatch.setattr("rigfleet.hostside.stackctl.run_cmd",
                        lambda argv, timeout=0: (0, "rigfleet-int8\nother\n"))
    assert SystemOps().running() == ["rigfleet-int8", "other"]


def test_a_command_that_cannot_be_started_is_an_exit_status_not_an_exception(tmp_path):
    script = tmp_path / "nginx"
    script.write_text("#!/bin/sh\nexit 0\n")  # not executable (mode 0644)
    rc, out = run_cmd([str(script), "-t"], 5.0)
    assert rc == 126 and "Permission denied" in out and str(script) in out
    assert run_cmd([str(tmp_path / "missing")], 5.0) == (127, f"{tmp_path}/missing: not found")


def test_a_switch_the_front_never_shows_puts_the_previous_route_back(lay):
    """FrontError says the previous route is still in place: a swap refused at its 503 must
    not leave the host out of rotation."""
    ref = make_ref(lay, "int8", "1111aaaa2222bbbb")
    front(lay, Nginx(lay)).serve(ref)
    before = lay.front_route.read_text()
    nginx = Nginx(lay, lag=10**6)
    with pytest.raises(FrontError, match="still answers 200 route 'int8/old'"):
        Front(lay, 8000, nginx.run, nginx.http, api_key="k3y", settle_s=0.01,
              sleep=lambda s: None).maintenance("x", 1)
    assert lay.front_route.read_text() == before
    assert nginx.commands[-1] == ["systemctl", "reload", "nginx"] and nginx.live == ref.route_id


def test_record_on_a_full_disk_says_why_without_a_traceback(lay, capsys, monkeypatch):
    from rigfleet.hostside.__main__ import main

    def full_disk(self, *a, **k):
        raise OSError(28, "No space left on device", str(lay.lock_dir))

    monkeypatch.setattr("rigfleet.hostside.lock.HostLock.acquire", full_disk)
    rc = main(["--root", str(lay.root), "record", "--json", '{"stack": "int8"}',
               "--config-hash", "1111aaaa2222bbbb"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("rigfleet-host record: ") and "No space left" in err


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_a_reply_the_engine_gave_up_on_is_no_answer_after_a_rollback(monkeypatch, reason):
    """The rollback's chat check: vLLM answers 200 with ``finish_reason: abort`` when its engine
    gives up on a request; the old stack has not answered then."""
    body = json.dumps({"choices": [{"message": {"content": "rea"}, "finish_reason": reason}]})
    monkeypatch.setattr("rigfleet.hostside.stackctl.http_request",
                        lambda *a, **k: (200, {}, body.encode()))
    ok, why = SystemOps().chat(8000, "m")
    assert not ok and f'finish_reason "{reason}"' in why
    body = json.dumps({"choices": [{"message": {"content": "ready"}, "finish_reason": "stop"}]})
    assert SystemOps().chat(8000, "m") == (True, "answered")
