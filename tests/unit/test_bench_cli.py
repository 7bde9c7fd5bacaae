"""The bench's commands: ``rigfleet-host.pyz bench`` (a host's active stack, an accepted
baseline), ``rigfleet bench --url`` (reports, plot), the probe's throughput and doctor
sections, the status column."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fakes import Pace, PacedServer

from rigfleet.bench import cli as bench_cli
from rigfleet.bench import plot as plot_mod
from rigfleet.bench.cli import Target, bench_targets, settings_for
from rigfleet.catalog import builtin_catalog
from rigfleet.cli import main as rigfleet_main
from rigfleet.commands import hosttool
from rigfleet.hostprobe import HostProbe
from rigfleet.hostside.active import write_active
from rigfleet.hostside.atomic import write_json
from rigfleet.hostside.bench import cli as host_cli
from rigfleet.hostside.bench.baseline import baseline_for
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.plan import Active, StackRef
from rigfleet.hostside.probe import doctor, throughput
from rigfleet.hostside.records import (
    SOURCE_ACCEPTED,
    ShapeFigures,
    ThroughputRecord,
    read_throughput_history,
)
from rigfleet.hostside.verify.runner import append_history
from rigfleet.status.cli import render_table, tok_s
from rigfleet.status.rows import StatusRow

FAST = Pace(step_rate=2000.0, prefill_s=0.001)


def activate(lay: Layout, port: int, stack: str = "single-fp8-mtp") -> None:
    ref = StackRef(stack, f"rigfleet-{stack}", f"rigfleet-{stack}", port,
                   str(lay.active_compose), "0123456789abcdef", "img@sha256:" + "a" * 64,
                   "qwen3.6-27b-autoround", 0.97)
    # The snapshot carries the config hash the record names (write_active checks it).
    compose = ("services:\n  vllm:\n    labels:\n"
               f"      io.rigfleet.config-hash: {ref.config_hash}\n")
    write_active(lay, Active(ref, "2026-12-01T10:00:00Z", "D1", "t"), compose)


def test_accept_baseline_on_the_host_restarts_the_history(tmp_path, capsys):
    lay = Layout(tmp_path)
    old = ThroughputRecord("single-fp8-mtp", "2026-11-30T10:00:00Z",
                           shapes={"narrative": ShapeFigures(2400.0)})
    append_history(lay.throughput_dir, old)
    with PacedServer(FAST) as srv:
        activate(lay, int(srv.url.rsplit(":", 1)[1]))
        rc = host_cli.main(["--root", str(tmp_path), "--accept-baseline", "--scale", "40",
                            "--by", "alice@ctl", "--runs", "2", "--warmup", "0", "--json",
                            "--quiet"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stack"] == "single-fp8-mtp" and out["accepted"]["source"] == SOURCE_ACCEPTED
    history = read_throughput_history(lay.throughput_history)
    assert [h.source for h in history] == ["gate", SOURCE_ACCEPTED]
    accepted = history[-1]
    assert accepted.scale == 40 and accepted.baseline["source"] == "accepted by alice@ctl"
    assert accepted.acceptance is not None and len(accepted.acceptance) == 3
    base = baseline_for(history, "single-fp8-mtp", {"narrative": 66.0}, 40.0, 5)
    assert base.figures["narrative"] == accepted.decode("narrative")  # 2400 is forgotten


def test_a_baseline_is_accepted_only_when_every_run_measured(tmp_path, capsys):
    lay = Layout(tmp_path)
    with PacedServer(Pace(step_rate=2000.0, prefill_s=0.001, fail_requests=(2,))) as srv:
        activate(lay, int(srv.url.rsplit(":", 1)[1]))
        rc = host_cli.main(["--root", str(tmp_path), "--accept-baseline", "--runs", "2",
                            "--warmup", "0", "--json", "--quiet"])
    assert rc == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["accepted"] is None
    assert "not accepted as single-fp8-mtp's baseline" in captured.err
    assert "1 of 2 runs measured" in captured.err
    assert read_throughput_history(lay.throughput_history) == []


def test_host_bench_refuses_without_an_active_stack(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        host_cli.main(["--root", str(tmp_path), "--accept-baseline"])
    assert exc.value.code == 2
    assert "nothing verified is active on this host" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        host_cli.main(["--url", "http://127.0.0.1:9", "--accept-baseline"])


def test_probe_sections(tmp_path):
    lay = Layout(tmp_path)
    assert throughput(lay) == {"last": None, "count": 0, "history": []}
    rec = ThroughputRecord("int8", "2026-12-01T10:00:00Z",
                           shapes={"narrative": ShapeFigures(130.0)}, result="fail")
    append_history(lay.throughput_dir, rec)
    write_json(lay.throughput_last, rec.to_dict())
    got = throughput(lay)
    assert got["count"] == 1 and got["last"]["result"] == "fail"
    probe = HostProbe({"throughput": got})
    assert probe.throughput_last == rec and probe.throughput_history == (rec,)
    assert oct(lay.throughput_last.stat().st_mode & 0o777) == "0o644"
    assert doctor(lay, 1.0)["error"].startswith("nothing verified is active")
    assert "--doctor --load-s 15" in hosttool.probe(full=True, doctor_load_s=15)
    assert "--doctor" not in hosttool.probe(full=True)
    assert hosttool.tool("bench", "--accept-baseline", "--json").endswith(
        "rigfleet-host.pyz bench --accept-baseline --json")


def test_status_shows_the_last_gates_tokens_per_second():
    assert tok_s(None).plain == "-"
    cell = tok_s({"narrative": 89.4, "code": 119.0, "result": "fail"})
    assert cell.plain == "89/119" and cell.style == "red"
    row = StatusRow("rig-a", True, stack="tq3-mtp-genesis",
                    throughput={"narrative": 89.4, "code": None, "result": "pass"})
    out = io.StringIO()
    render_table([row]).print(Console(file=out, width=160, color_system=None))
    assert "tok/s" in out.getvalue() and "89/-" in out.getvalue()


def _args(tmp_path: Path, url: str, **kw) -> argparse.Namespace:
    defaults = dict(url=url, inventory=None, limit=[], accept_baseline=None, api_key_file=None,
                    ca_file=None, stack="tq3-mtp-genesis", scale=None, runs=2, warmup=0,
                    concurrency=None, depths=(2000,), no_depths=False, timeout_s=30.0,
                    out=tmp_path / "out", no_plot=False, json=False)
    return argparse.Namespace(**{**defaults, **kw})


def test_rigfleet_bench_url_writes_reports(tmp_path, capsys):
    with PacedServer(FAST) as srv:
        rc = bench_cli.run(_args(tmp_path, srv.url, json=True))
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    [entry] = data["entries"]
    assert data["schema"] == "rigfleet-bench/1" and entry["stack"] == "tq3-mtp-genesis"
    assert entry["reference"] == {"narrative": 89.2, "code": 119.1}
    bench = entry["bench"]
    assert bench["concurrency"]["streams"] == 2  # the stack's max-num-seqs
    assert bench["depths"][0]["decode_tok_s"] > 0
    assert bench["shapes"]["code"]["acceptance"]["per_position"][0] > 0.8
    assert data["fleet"]["tq3-mtp-genesis"]["narrative"] > 0
    files = sorted(p.suffix for p in (tmp_path / "out").iterdir())
    assert files[:2] == [".json", ".md"]
    md = next((tmp_path / "out").glob("*.md")).read_text()
    assert "| narrative |" in md and "Concurrency: 2 streams" in md


def test_rigfleet_bench_usage_errors(tmp_path):
    out = ["--out", str(tmp_path)]
    assert rigfleet_main(["bench", "--url", "http://x", "--limit", "rig-a", *out]) == 2
    assert rigfleet_main(["bench", "--url", "http://x", "--stack", "nope", *out]) == 2
    assert rigfleet_main(["bench", "--inventory", "inv.py", "--stack", "int8", *out]) == 2


def test_plot_draws_or_says_what_to_install(tmp_path, monkeypatch):
    spec = builtin_catalog().get("int8")
    hist = (ThroughputRecord("int8", "t", shapes={"narrative": ShapeFigures(3000.0)}),)
    with PacedServer(FAST) as srv:
        targets = [Target("rig-a", srv.url, None, spec, 40.0, hist),
                   Target("rig-b", srv.url, None, spec, 40.0)]
        entries = bench_targets(targets, lambda t: settings_for(t, 1, 0, 0, ()))
    assert [e.host for e in entries] == ["rig-a", "rig-b"]
    assert entries[0].reference == {"narrative": pytest.approx(130.8 * 40)}
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    path, problem = plot_mod.plot(entries, tmp_path / "b.png")
    assert path is None and "pip install 'rigfleet[plot]'" in (problem or "")
    monkeypatch.undo()
    pytest.importorskip("matplotlib")
    path, problem = plot_mod.plot(entries, tmp_path / "b.png")
    assert problem is None and path is not None and path.read_bytes()[:4] == b"\x89PNG"


class FakeRemote:
    """The SSH layer's ``run``: answers the probe and the host's bench, records commands."""

    def __init__(self, probe: dict, bench: dict | None = None, rc: int = 0):
        self.probe, self.bench, self.rc = probe, bench, rc
        self.commands: list[str] = []

    def run(self, host, command, *, timeout=120, stdin=b""):
        self.commands.append(command)
        if " bench " in command:
            return self.rc, "bench note: x\n" + json.dumps(self.bench or {}) + "\n"
        return 0, json.dumps(self.probe) + "\n"


def test_inventory_targets_read_the_serving_stack_and_history_through_the_probe(tmp_path):
    from test_swap_plan import host_data

    from rigfleet.bench.cli import accept_baseline, inventory_targets
    from rigfleet.desired import load_desired
    from rigfleet.inventory import InventoryHost

    rec = ThroughputRecord("int8", "2026-12-01T10:00:00Z",
                           shapes={"narrative": ShapeFigures(5000.0)})
    probe = {"schema": "rigfleet-probe/1", "state": {"stack": "int8"},
             "throughput": {"last": None, "count": 3, "history": [rec.to_dict()] * 3}}
    data = host_data(tmp_path, front_url="http://rig-a.lan:8000", throughput_scale=40)
    host = InventoryHost("rig-a", (), data)
    remote = FakeRemote(probe, {"stack": "int8", "accepted": {"source": "accepted"}})
    [t] = inventory_targets([host], remote)
    assert (t.url, t.stack.name if t.stack else None, t.scale) == (
        "http://rig-a.lan:8000", "int8", 40.0)
    assert t.history == (rec,) * 3 and t.api_key == "k" * 32 and t.ca_file is None
    base = t.baseline()
    # 3 gates: history beats reference
    assert base is not None and base.figures["narrative"] == 5000.0
    assert "probe --full" in remote.commands[0]
    got = accept_baseline(remote, host, load_desired("rig-a", data), runs=2, warmup=1, by="al")
    assert got["accepted"]["source"] == "accepted"
    assert "bench --accept-baseline --scale 40 --by al --runs 2 --warmup 1 --json --quiet" in (
        remote.commands[-1])
    with pytest.raises(RuntimeError, match="did not record a baseline"):
        accept_baseline(FakeRemote(probe, {}, rc=1), host, load_desired("rig-a", data), 1, 0)
    bad = inventory_targets([InventoryHost("rig-b", (), {**data, "stack": "nope"})], remote)
    assert bad[0].error.startswith("rig-b: stack: 'nope'")


def test_the_baseline_beside_a_hosts_figures_is_the_one_its_gate_judges_by(tmp_path):
    from test_swap_plan import host_data

    from rigfleet.bench.cli import inventory_targets
    from rigfleet.inventory import InventoryHost

    history = [ThroughputRecord("int8", f"2026-12-0{i}T10:00:00Z", shapes={
        "narrative": ShapeFigures(v)}).to_dict() for i, v in ((1, 3000.0), (2, 5000.0),
                                                             (3, 7000.0))]
    probe = {"schema": "rigfleet-probe/1", "state": {"stack": "int8"},
             "throughput": {"last": None, "count": 3, "history": history}}
    data = host_data(tmp_path, throughput_scale=40)
    tuned = {**data, "gate_set": ["throughput_history_n=2", "throughput_history_min=2",
                                  "throughput_margin=0.3"]}
    plain, own = inventory_targets([InventoryHost("rig-a", (), data),
                                    InventoryHost("rig-b", (), tuned)], FakeRemote(probe))
    assert plain.baseline().figures["narrative"] == 5000.0  # the median of the last 5 (3 here)
    assert own.baseline().figures["narrative"] == 6000.0  # host data: the last 2
    assert own.profile is not None and own.profile.throughput_margin == 0.3


def _tls_context(tmp_path, monkeypatch):
    """A server context for a self-signed 127.0.0.1 certificate at ``tmp_path/f.crt``."""
    import shutil
    import ssl
    import subprocess

    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed here")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(tmp_path / "f.key"), "-out", str(tmp_path / "f.crt")],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "f.crt", tmp_path / "f.key")
    monkeypatch.delenv("RIGFLEET_CA_FILE", raising=False)
    return ctx


def test_rigfleet_bench_speaks_tls_like_verify(tmp_path, capsys, monkeypatch):
    ctx = _tls_context(tmp_path, monkeypatch)
    with PacedServer(FAST, tls=ctx) as srv:
        ok = bench_cli.run(_args(tmp_path, srv.url, ca_file=str(tmp_path / "f.crt"), json=True,
                                 depths=(), runs=1, no_plot=True))
        data = json.loads(capsys.readouterr().out)
        refused = bench_cli.run(_args(tmp_path, srv.url, json=True, runs=1, no_plot=True))
        failed = json.loads(capsys.readouterr().out)
    assert ok == 0 and data["entries"][0]["bench"]["shapes"]["narrative"]["decode_mean"] > 0
    assert refused == 1
    assert "CERTIFICATE_VERIFY_FAILED" in failed["entries"][0]["error"]


def test_rigfleet_bench_inventory_uses_its_timeout(tmp_path, monkeypatch):
    from test_swap_plan import host_data

    from rigfleet.inventory import InventoryHost

    host = InventoryHost("rig-a", ("gpu_hosts",), host_data(tmp_path))
    connects: list[float] = []
    probes: list[float] = []

    class Remote:
        def __init__(self, connect_timeout: float = 10.0) -> None:
            connects.append(connect_timeout)

    def targets(hosts, remote, timeout=60.0):
        probes.append(timeout)
        return []

    monkeypatch.setattr(bench_cli, "load_inventory", lambda path: [host])
    monkeypatch.setattr(bench_cli, "SshRemote", Remote)
    monkeypatch.setattr(bench_cli, "inventory_targets", targets)
    monkeypatch.setattr(bench_cli, "accept_baseline",
                        lambda remote, *a, **kw: {"accepted": {}, "stack": "int8"})
    args = _args(tmp_path, None, inventory="inv.py", stack=None, timeout=7.0, no_plot=True,
                 json=True)
    assert bench_cli.run(args) == 0
    assert bench_cli.run(argparse.Namespace(**{**vars(args), "accept_baseline": "rig-a",
                                               "depths": None})) == 0
    assert (connects, probes) == ([7.0, 7.0], [7.0])  # SSH connect and the probe's answer


def test_rigfleet_bench_refuses_an_out_it_cannot_create_before_benching(tmp_path, capsys):
    (tmp_path / "file").write_text("in the way")
    out = tmp_path / "file" / "reports"
    rc = rigfleet_main(["bench", "--url", "http://127.0.0.1:9", "--out", str(out)])
    err = capsys.readouterr().err.replace("\n", "")  # the console wraps long lines
    assert rc == 2 and f"--out {out}" in err and "allowed: a directory" in err
    assert "warm-up" not in err  # refused before anything was asked


def test_accept_baseline_passes_timeout_s_and_the_ssh_timeout(tmp_path, monkeypatch):
    """``rigfleet bench --accept-baseline HOST --timeout-s 900 --timeout 45``: the host's bench
    runs with the per-request timeout asked for, over SSH with the connect timeout asked for
    (both were parsed and then left out: the host used its 300 s, SSH its 10 s)."""
    from test_swap_plan import host_data

    from rigfleet.inventory import InventoryHost

    data = host_data(tmp_path, front_url="http://rig-a.lan:8000", throughput_scale=40)
    remote = FakeRemote({}, {"stack": "int8", "accepted": {"source": "accepted"}})
    made: list[float] = []

    def ssh(connect_timeout: float = 10.0) -> FakeRemote:
        made.append(connect_timeout)
        return remote

    monkeypatch.setattr(bench_cli, "SshRemote", ssh)
    args = _args(tmp_path, None, json=True, timeout_s=900.0, timeout=45.0)
    host = InventoryHost("rig-a", (), data)
    assert bench_cli._accept(args, host, Console(file=io.StringIO())) == 0
    assert made == [45.0]
    assert "--timeout-s 900" in remote.commands[-1]


def test_rigfleet_verify_takes_ca_file_as_documented(tmp_path, monkeypatch):
    """docs/bench.md: the gate's client "trusts --ca-file / $RIGFLEET_CA_FILE"; rigfleet
    verify had no --ca-file (a usage error, 101) and only the variable worked."""
    from rigfleet.hostside.verify.runner import main as verify_main

    ctx = _tls_context(tmp_path, monkeypatch)
    argv = ["--profile", "fast", "--set", "health_wait_s=0", "--only", "preflight",
            "--report-dir", str(tmp_path / "r"), "--quiet"]
    with PacedServer(FAST, tls=ctx) as srv:
        trusted = verify_main(["--url", srv.url, "--ca-file", str(tmp_path / "f.crt"), *argv])
        untrusted = verify_main(["--url", srv.url, *argv])
    assert (trusted, untrusted) == (0, 1)


def test_bench_reports_never_carry_credentials_of_the_url(tmp_path, capsys):
    """rigfleet bench --url http://user:password@host (as rigfleet verify's reports, the
    bench's must not carry it: the password was in bench-<ts>.json, .md and the table)."""
    secret = "s3cret-pw"
    url = f"http://alice:{secret}@127.0.0.1:9"
    rc = bench_cli.run(_args(tmp_path, url, stack=None, depths=(), runs=1, no_plot=True))
    assert rc == 1
    written = "".join(p.read_text() for p in (tmp_path / "out").iterdir())
    assert "127.0.0.1:9" in written and secret not in written
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    assert host_cli.main(["--url", url, "--runs", "1", "--warmup", "0", "--quiet",
                          "--report-dir", str(tmp_path / "host")]) == 1
    written = "".join(p.read_text() for p in (tmp_path / "host").iterdir())
    assert "127.0.0.1:9" in written and secret not in written


def test_host_bench_names_an_unloadable_ca_file(tmp_path, monkeypatch, capsys):
    """rigfleet-host.pyz bench --url https://... with $RIGFLEET_CA_FILE naming a missing file:
    a usage error naming it (it was a FileNotFoundError traceback, exit 1)."""
    monkeypatch.setenv("RIGFLEET_CA_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(SystemExit) as exc:
        host_cli.main(["--url", "https://127.0.0.1:9", "--runs", "1", "--quiet"])
    assert exc.value.code == 2
    assert f"$RIGFLEET_CA_FILE {tmp_path / 'missing.pem'}" in capsys.readouterr().err


def test_bench_progress_notes_are_not_read_as_markup():
    """A note carries the server's error text: "[/x]" in it raised rich's MarkupError (a
    traceback mid-bench) and "[bold]" was swallowed."""
    buf = io.StringIO()
    prog = bench_cli.RichProgress(Console(file=buf, width=200))
    prog.target("rig-a")
    prog.note("narrative: a run measured nothing (HTTP 500: bad [/x] tag [bold]here)")
    assert "HTTP 500: bad [/x] tag [bold]here)" in buf.getvalue()


def test_host_bench_lines_say_unknown_not_zero(capsys):
    """A shape that measured nothing printed "decode 0.0 tok/s", and a CV of one run (none)
    "CV 0.0%": the host bench's summary lines now say "-" and "n/a"."""
    with PacedServer(FAST) as srv:
        assert host_cli.main(["--url", srv.url, "--runs", "1", "--warmup", "0"]) == 0
        err = capsys.readouterr().err
        assert "bench: narrative: decode " in err and "CV n/a," in err and "CV 0.0%" not in err

        def down(h, data, text, prompt):
            h._json(503, {"error": {"message": "overloaded"}})

        srv.chat = down  # type: ignore[method-assign]
        assert host_cli.main(["--url", srv.url, "--runs", "2", "--warmup", "0"]) == 1
    err = capsys.readouterr().err
    assert "bench: code: decode -, CV n/a," in err and "0.0 tok/s" not in err


@pytest.mark.parametrize(("extra", "flag"), [
    (["--scale", "40"], "--scale"),
    (["--accept-baseline", "rig-a", "--limit", "rig-b"], "--limit"),
    (["--accept-baseline", "rig-a", "--concurrency", "4"], "--concurrency"),
    (["--accept-baseline", "rig-a", "--depths", "16000"], "--depths"),
    (["--accept-baseline", "rig-a", "--no-depths"], "--no-depths")])
def test_inventory_refuses_the_flags_it_would_ignore(extra, flag, monkeypatch, capsys):
    """``--inventory --scale 40`` benched with each host's own scale, and ``--accept-baseline``
    benched the gate's shapes whatever --limit/--concurrency/--depths said: both silently."""
    monkeypatch.setattr(bench_cli, "load_inventory",
                        lambda path: pytest.fail("refused before the inventory is read"))
    assert rigfleet_main(["bench", "--inventory", "inv.py", *extra]) == 2
    assert flag in " ".join(capsys.readouterr().err.split())


def test_host_bench_refuses_a_report_dir_it_cannot_write_before_benching(tmp_path, capsys):
    """``rigfleet-host.pyz bench --report-dir DIR`` where DIR cannot be made: a usage error
    naming it before any request (it was a NotADirectoryError traceback once the bench's
    minutes were spent), as ``rigfleet bench --out`` does."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with PacedServer(FAST) as srv:
        with pytest.raises(SystemExit) as exc:
            host_cli.main(["--url", srv.url, "--runs", "1", "--warmup", "0", "--quiet",
                           "--report-dir", str(blocker / "reports")])
        assert srv.state.requests == 0
    assert exc.value.code == 2
    assert f"--report-dir {blocker / 'reports'}:" in capsys.readouterr().err


def test_a_baseline_bench_that_measured_nothing_says_it_was_not_accepted(tmp_path, capsys):
    """Every run failing: exit 1 with no word on stderr, so ``rigfleet bench --accept-baseline``
    could show only the tail of the host's JSON (its "stdout then stderr") as the reason."""
    lay = Layout(tmp_path)
    with PacedServer(Pace(step_rate=2000.0, prefill_s=0.001,
                          fail_requests=tuple(range(1, 10)))) as srv:
        activate(lay, int(srv.url.rsplit(":", 1)[1]))
        rc = host_cli.main(["--root", str(tmp_path), "--accept-baseline", "--runs", "2",
                            "--warmup", "0", "--json", "--quiet"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "not accepted as single-fp8-mtp's baseline (narrative: 0 of 2 runs measured" in err
    assert read_throughput_history(lay.throughput_history) == []


def test_an_acceptance_without_per_position_counters_shows_its_length_not_a_blank(capsys):
    """A vLLM with spec-decode counters but none per draft position: the acceptance length is
    known, yet ``rigfleet bench``'s table and the host bench's summary showed an empty cell."""
    from rigfleet.hostside.bench.measure import Acceptance, BenchResult, ShapeResult
    from rigfleet.hostside.bench.report import Entry

    result = BenchResult("http://rig-a:8000", shapes={
        "narrative": ShapeResult("narrative"),
        "code": ShapeResult("code", acceptance=Acceptance(drafts=900, length=2.53))})
    out = io.StringIO()
    bench_cli.render([Entry("rig-a", "int8", result)]).print(
        Console(file=out, width=200, color_system=None))
    row = next(ln for ln in out.getvalue().splitlines() if ln.startswith("rig-a"))
    assert "AL 2.53" in row
    with PacedServer(FAST) as srv:
        full = srv.render_metrics
        srv.render_metrics = lambda: "".join(  # type: ignore[method-assign]
            ln + "\n" for ln in full().splitlines() if "per_pos" not in ln)
        assert host_cli.main(["--url", srv.url, "--runs", "2", "--warmup", "0"]) == 0
    code_line = next(ln for ln in capsys.readouterr().err.splitlines()
                     if ln.startswith("bench: code:"))
    assert code_line.split("acceptance ")[1].startswith("AL ")
