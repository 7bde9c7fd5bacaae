"""``rigfleet logs``: the remote commands (built apart, quoted, sudo-wrapped for ``_sudo``
hosts), ``--since``, and the tagged stream printed with the ledger one line per event."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
from datetime import UTC, datetime

import pytest

from rigfleet.commands import logs as cmds
from rigfleet.inventory import InventoryHost
from rigfleet.logs import Printer, build, ledger_line, parse_since
from rigfleet.ssh import SshRemote

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def test_since_takes_durations_and_utc_times_and_names_the_flag():
    assert parse_since("30m", NOW) == datetime(2026, 12, 3, 11, 30, tzinfo=UTC)
    assert parse_since("2h", NOW) == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    assert parse_since("1d", NOW) == datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert parse_since("2026-12-03T10:00:00Z") == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    assert parse_since("2026-12-03T11:00:00+01:00") == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match=r"--since: '10 minutes'; allowed: a duration"):
        parse_since("10 minutes")


def test_a_duration_back_before_year_1_is_a_usage_error_not_a_traceback():
    for value in ("1000000d", "99999999999999999999s"):
        with pytest.raises(ValueError, match=rf"--since: '{value}'; allowed: a duration"):
            parse_since(value, NOW)


def test_the_commands_read_the_active_project_the_supervisor_unit_and_the_ledger():
    command = build(None, list(cmds.SOURCES), None, 100, follow=False)
    assert ("docker compose -f /var/lib/rigfleet/active/compose.yaml logs --no-color "
            "--timestamps --tail 100") in command
    assert ("journalctl -u rigfleet-supervise.service --no-pager -o short-iso-precise -n 100"
            in command)
    assert "tail -n 100 /var/lib/rigfleet/ledger.jsonl" in command
    assert "--follow" not in command and "-F" not in command


def test_stack_since_and_follow():
    since = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    command = build("tq3-mtp-genesis", ["engine", "supervisor", "ledger"], since, None,
                    follow=True)
    assert "-f /opt/rigfleet/stacks/tq3-mtp-genesis/compose.yaml" in command
    assert "--since 2026-12-03T10:00:00Z" in command and "logs" in command
    assert "--since '2026-12-03 10:00:00 UTC'" in command
    assert "tail -n +1 -F /var/lib/rigfleet/ledger.jsonl" in command  # filtered here
    assert command.endswith(" wait") and command.count(") &") == 3


def test_the_tagged_command_runs_in_a_shell_and_tags_every_line(tmp_path):
    inner = cmds._tagged("engine", "printf 'a\\nb\\n'; echo oops >&2")
    out = subprocess.run(["sh", "-c", inner], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["engine\ta", "engine\tb", "engine\toops"]


def test_a_failing_source_says_so_in_its_last_line_and_the_command_is_not_exit_0(monkeypatch,
                                                                                  capsys):
    inner = cmds._tagged("supervisor", "echo 'No journal files were opened'; (exit 1)")
    out = subprocess.run(["sh", "-c", inner], capture_output=True, text=True).stdout
    assert out.splitlines() == ["supervisor\tNo journal files were opened",
                                f"supervisor\t{cmds.EXITED}1"]
    import rigfleet.logs
    import rigfleet.ssh
    from rigfleet.cli import main

    monkeypatch.setattr(rigfleet.ssh, "SshRemote", _Remote)
    monkeypatch.setattr(rigfleet.logs, "one_host", lambda args: InventoryHost("host1", (), {}))
    monkeypatch.setattr(rigfleet.logs, "build", lambda *a: cmds.combined(
        [cmds._tagged("engine", "echo up"), inner]))
    assert main(["logs", "host1"]) == 1
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "supervisor | No journal files were opened",
        "supervisor | (its command exited 1; what it said is above)"]
    # No ledger yet (a host never deployed) is no lines, not a failure.
    missing = cmds.ledger(tail=5).replace(str(cmds.HOST.ledger_file), "/nonexistent/ledger")
    done = subprocess.run(["sh", "-c", missing], capture_output=True, text=True)
    assert done.stdout == ""


def test_a_sudo_host_gets_the_whole_command_through_sudo():
    command = build(None, ["engine", "ledger"], None, 10, follow=False)
    host = InventoryHost("host4", (), {"_sudo": True})
    sent = SshRemote.command(host, command)
    assert sent == f"sudo -n sh -c {shlex.quote(command)}"
    assert SshRemote.command(InventoryHost("host1", (), {}), command) == command


def test_ledger_lines_are_one_readable_line_and_since_filters():
    rec = {"time": "2026-12-03T10:17:02+00:00", "event": "swap", "result": "rolled-back",
           "stack": "int8", "image": "vllm/vllm-openai:v0.28.0", "by": "alice@ctl",
           "gate": {"result": "fail"}, "reason": "gate failed 1 check(s): needles"}
    assert ledger_line(json.dumps(rec)) == (
        "2026-12-03T10:17:02+00:00 swap rolled-back int8 v0.28.0 gate fail by alice@ctl: "
        "gate failed 1 check(s): needles")
    assert ledger_line(json.dumps(rec), since=datetime(2026, 12, 3, 11, tzinfo=UTC)) is None
    assert ledger_line("{torn") == "(not JSON: {torn)"


def test_the_printer_splits_chunks_into_lines_by_source():
    out = io.StringIO()
    p = Printer(None, out)
    rec = json.dumps({"time": "t", "event": "activate", "result": "promoted", "stack": "int8"})
    p.write(b"engine\t\x1b[2KINFO start")
    p.write(b"ed\nsupervisor\tok\nledger\t" + rec.encode() + b"\nengine\tlast")
    p.flush()
    assert out.getvalue().splitlines() == [
        "engine     | INFO started", "supervisor | ok",
        "ledger     | t activate promoted int8 -", "engine     | last"]
    one = io.StringIO()
    Printer(None, one, prefix=False).write(b"engine\tx\n")
    assert one.getvalue() == "x\n"


def test_bad_flags_are_usage_errors_before_any_host_is_asked(capsys):
    from rigfleet.cli import main

    assert main(["logs", "host1", "--inventory", "/nonexistent.py", "--since", "x"]) == 2
    assert "--since: 'x'; allowed: a duration" in capsys.readouterr().err
    assert main(["logs", "host1", "--inventory", "/nonexistent.py", "-n", "-1"]) == 2
    assert main(["lock", "host1", "--inventory", "/nonexistent.py", "--release"]) == 2
    assert "--reason: missing" in " ".join(capsys.readouterr().err.split())
    assert main(["lock", "host1", "--inventory", "/nonexistent.py", "--reason", "x"]) == 2


def test_lines_with_since_keep_the_last_n_ledger_lines_too():
    # The ledger is in time order: its last N lines, those since T kept, are the last N since T.
    since = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    command = build(None, ["ledger"], since, 5, follow=False)
    assert "tail -n 5 /var/lib/rigfleet/ledger.jsonl" in command and "cat " not in command
    assert "cat /var/lib/rigfleet/ledger.jsonl" in build(None, ["ledger"], since, None, False)


class _Remote:
    """``SshRemote`` with the command run by ``sh`` here (the host's paths under tmp)."""

    sent: list[str] = []

    def __init__(self, connect_timeout: float = 10.0) -> None:
        pass

    def stream_out(self, host, command, dest, *, timeout=300):
        _Remote.sent.append(command)
        done = subprocess.run(["sh", "-c", command], capture_output=True)
        dest.write(done.stdout)
        return done.returncode, done.stderr.decode()


def test_a_stack_not_staged_and_a_failed_remote_are_not_exit_0(monkeypatch, capsys):
    """``rigfleet logs host1 --stack nope`` printed docker compose's error as a log line and
    exited 0, as it did for any remote failure (the exit status was dropped)."""
    import rigfleet.logs
    import rigfleet.ssh
    from rigfleet.cli import main

    monkeypatch.setattr(rigfleet.ssh, "SshRemote", _Remote)
    monkeypatch.setattr(rigfleet.logs, "one_host", lambda args: InventoryHost("host1", (), {}))
    assert main(["logs", "host1", "--stack", "nope", "--source", "engine"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "host1: --stack nope: not staged there (no /opt/rigfleet/stacks/nope/compose.yaml)" \
        in err
    monkeypatch.setattr(rigfleet.logs, "build", lambda *a: "echo 'sudo: a password' >&2; exit 1")
    assert main(["logs", "host1"]) == 1
    assert "sudo: a password" in capsys.readouterr().err
    monkeypatch.setattr(rigfleet.logs, "build", lambda *a: "printf 'ledger\\tx\\n'")
    assert main(["logs", "host1", "--source", "ledger"]) == 0
