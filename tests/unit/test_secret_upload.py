"""Secrets reach a host through a command's stdin, never an upload: proven on pyinfra's own SSH
connector code path (``SSHConnector.run_shell_command`` / ``put_file``) with a sudo user.

Only the network is faked: the paramiko client's ``exec_command`` runs each command line
pyinfra builds in a real shell here, with a ``sudo`` stand-in that does what ``sudo -H -n``
does for a user allowed to (it drops its options and runs the rest). A ``base64`` wrapper
records every file in the destination directory at the moment the secret's bytes start to
flow, so the tests see the new file's mode before any byte is written.

The first test shows the hazard: pyinfra's upload with ``_sudo`` stages the file over SFTP at a
predictable path in the temp directory, written with the SSH user's umask (readable by others
for a moment), before ``cp`` moves it. ``secret_file`` must never take that path.
"""

from __future__ import annotations

import base64
import grp
import hashlib
import io
import os
import pwd
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.operations import run_ops
from pyinfra.connectors.ssh import SSHConnector

from roles.ops import Secret, secret_file

SECRET = "k3y-" + "s" * 44

SUDO = """#!/bin/sh
# Stand-in for `sudo -H -n [-A -k] CMD...` as a user sudo lets through: run CMD.
while [ $# -gt 0 ]; do
    case "$1" in -H|-n|-A|-k) shift ;; -u) shift 2 ;; *) break ;; esac
done
exec "$@"
"""

BASE64 = """#!/bin/sh
# Records the destination directory as the secret starts to flow, then decodes.
for f in "$RF_WATCH_DIR"/.rigfleet-secret.* "$RF_WATCH_DIR"/*; do
    [ -e "$f" ] && stat -c '%a %s %n' "$f" >> "$RF_WATCH_LOG"
done
exec "$RF_REAL_BASE64" "$@"
"""


class _Stdin:
    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True


@dataclass
class _Run:
    """One exec_command: runs when pyinfra reads its output (stdin is complete by then)."""

    command: str
    env: dict[str, str]
    stdin: _Stdin = field(default_factory=_Stdin)
    proc: subprocess.CompletedProcess | None = None

    def result(self) -> subprocess.CompletedProcess:
        if self.proc is None:
            self.proc = subprocess.run(["sh", "-c", self.command], input=self.stdin.data,
                                       capture_output=True, env=self.env, timeout=60)
        return self.proc


class _Out:
    def __init__(self, run: _Run, which: str) -> None:
        self.run, self.which = run, which
        self.channel = self

    def __iter__(self):
        data = getattr(self.run.result(), self.which).decode()
        return iter(data.splitlines(keepends=True))

    def recv_exit_status(self) -> int:
        return self.run.result().returncode


class FakeClient:
    """paramiko.SSHClient as pyinfra uses it, running commands locally."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.runs: list[_Run] = []

    def exec_command(self, command: str, get_pty: bool = False):
        run = _Run(command, self.env)
        self.runs.append(run)
        return run.stdin, _Out(run, "stdout"), _Out(run, "stderr")

    def close(self) -> None:
        pass


class FakeSftp:
    """Writes uploads as an SFTP server does for the SSH user: a new file, mode 0666 less
    the user's umask (022 on Debian and Ubuntu); records path and mode."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, int]] = []

    def putfo(self, file_io, remote: str) -> None:
        old = os.umask(0o022)
        try:
            with open(remote, "wb") as f:
                f.write(file_io.read())
        finally:
            os.umask(old)
        self.puts.append((remote, os.stat(remote).st_mode & 0o777))


@pytest.fixture
def rig(tmp_path: Path, monkeypatch):
    """An SSH host reached as a sudo user, its commands run in a shell here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sudo", SUDO), ("base64", BASE64)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    dest_dir = tmp_path / "etc-secrets"
    dest_dir.mkdir(mode=0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "RF_WATCH_DIR": str(dest_dir), "RF_WATCH_LOG": str(tmp_path / "watch.log"),
           "RF_REAL_BASE64": subprocess.run(["sh", "-c", "command -v base64"],
                                            capture_output=True, text=True).stdout.strip()}
    client = FakeClient(env)
    sftp = FakeSftp()

    def connect(self) -> None:
        self.client = client

    monkeypatch.setattr(SSHConnector, "connect", connect)
    monkeypatch.setattr(SSHConnector, "get_file_transfer_connection", lambda self: sftp)
    inventory = Inventory(([("rig-sudo", {"ssh_user": "deploy"})], {}))
    state = State(inventory, Config(SUDO=True), check_for_changes=True)
    connect_all(state)
    host = inventory.get_host("rig-sudo")
    assert isinstance(host.connector, SSHConnector)
    me = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    return state, host, client, sftp, dest_dir, tmp_path / "watch.log", me


def test_an_upload_with_sudo_is_staged_in_the_temp_dir(rig):
    """Why secret_file does not upload: pyinfra stages it via SFTP at a predictable path."""
    state, host, client, sftp, dest_dir, _, _ = rig
    dest = str(dest_dir / "api-key")
    assert host.put_file(io.BytesIO(SECRET.encode()), dest, _sudo=True)
    [(staged, mode)] = sftp.puts
    tmp = subprocess.run(["sh", "-c", 'echo "${TMPDIR:-/tmp}"'], capture_output=True,
                         text=True).stdout.strip()
    # Predictable (sha1 of the destination) and readable by everyone until it is removed.
    assert staged == f"{tmp}/pyinfra-{hashlib.sha1(dest.encode()).hexdigest()}"
    assert mode & 0o004
    assert any(f"cp {staged} " in r.command for r in client.runs)


def run_secret(state, host, dest: str, content: str, me: tuple[str, str]) -> None:
    def op() -> None:
        secret_file(name="secret", dest=dest, content=Secret(content), user=me[0], group=me[1])

    add_deploy(state, op)
    run_ops(state)
    assert host not in state.failed_hosts


def test_secret_file_writes_through_stdin_into_a_file_born_0600(rig):
    state, host, client, sftp, dest_dir, watch, me = rig
    dest = dest_dir / "api-key"
    dest.write_text("old, world-readable\n")
    dest.chmod(0o644)
    run_secret(state, host, str(dest), f"{SECRET}\n", me)

    # No upload at all: nothing staged anywhere, no temp path of pyinfra's in any command.
    assert sftp.puts == []
    commands = [r.command for r in client.runs]
    assert not any("pyinfra-" in c or c.startswith("sudo -H -n cp ") for c in commands)
    # Every command went through sudo; the secret is in none of them, only on stdin, encoded.
    assert all(c.startswith("sudo -H -n ") for c in commands)
    assert not any(SECRET in c for c in commands)
    [writer] = [r for r in client.runs if r.stdin.data]
    assert base64.b64decode(writer.stdin.data) == f"{SECRET}\n".encode()
    assert SECRET.encode() not in writer.stdin.data

    # The file the bytes went into existed, empty and 0600, before the first byte; nothing in
    # the directory was readable by others then but the old file being replaced.
    seen = [line.split(" ", 2) for line in watch.read_text().splitlines()]
    temp = [(mode, size) for mode, size, path in seen if ".rigfleet-secret." in path]
    assert temp == [("600", "0")]
    # The result: the secret, 0600, the wanted owner, renamed over the old file.
    assert dest.read_text() == f"{SECRET}\n"
    assert oct(dest.stat().st_mode & 0o777) == "0o600"
    assert not list(dest_dir.glob(".rigfleet-secret.*"))


def test_secret_file_changes_nothing_when_the_file_is_right(rig):
    state, host, client, sftp, dest_dir, watch, me = rig
    dest = dest_dir / "api-key"
    dest.write_text(f"{SECRET}\n")
    dest.chmod(0o600)
    run_secret(state, host, str(dest), f"{SECRET}\n", me)
    assert not any(r.stdin.data for r in client.runs)
    assert not watch.exists()


def test_a_failed_write_leaves_no_partial_file(rig, tmp_path):
    """base64 fails (bad input): the temp file goes, the old file stays as it was."""
    from roles.ops import write_secret

    _, _, client, _, dest_dir, _, me = rig
    dest = dest_dir / "api-key"
    dest.write_text("old\n")
    proc = subprocess.run(["sh", "-c", write_secret(str(dest), "0600", *me)],
                          input=b"!!! not base64 !!!\n", capture_output=True, env=client.env)
    assert proc.returncode != 0
    assert dest.read_text() == "old\n"
    assert not list(dest_dir.glob(".rigfleet-secret.*"))


def test_a_checked_secret_is_staged_through_stdin_never_uploaded(rig):
    """``checked_file`` with a ``Secret`` (the monitor's Alertmanager file, which may hold
    credentials): the staged copy is born 0600 and filled from stdin, as ``secret_file`` does."""
    from roles.ops import checked_file

    state, host, client, sftp, dest_dir, _, _ = rig
    bin_dir = Path(client.env["PATH"].split(":")[0])
    # Owner root: stand-ins that take the owner as given (these tests run as any user).
    (bin_dir / "chown").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "install").write_text('#!/bin/sh\nexec /usr/bin/install "$1" "$2" "$7" "$8"\n')
    for name in ("chown", "install"):
        (bin_dir / name).chmod(0o755)
    dest = dest_dir / "alertmanager.yml"

    def op() -> None:
        checked_file(name="checked", dest=str(dest), content=Secret(f"token: {SECRET}\n"),
                     check="test -s {path}", mode="0640")

    add_deploy(state, op)
    run_ops(state)
    assert host not in state.failed_hosts
    assert sftp.puts == []
    assert not any(SECRET in r.command for r in client.runs)
    assert dest.read_text() == f"token: {SECRET}\n"
    assert oct(dest.stat().st_mode & 0o777) == "0o640"
    assert not list(dest_dir.glob("*.rigfleet-new")) and not list(dest_dir.glob(".rigfleet-*"))
