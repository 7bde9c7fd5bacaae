"""The merged reads (``rigfleet.facts.PathStates``, ``ServiceStates``) answer what each fact
would answer alone: each fact's own command run here in ``sh`` against real paths."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from pyinfra.facts.files import Directory, File, Link, Sha1File

from rigfleet.facts import FileDigest, PathStates, ServiceStates, path_answers


def sh(command: str) -> tuple[int, list[str]]:
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout.splitlines()


def alone(fact: type, path: str):
    """The fact's answer as pyinfra gets it: its command alone; no output is its default."""
    one = fact()
    command = one.command(path=path)
    raw = command if isinstance(command, str) else command.get_raw_value()
    rc, lines = sh(raw)
    return one.process(lines) if rc == 0 and lines else one.default()


def test_paths_read_together_answer_as_each_fact_alone(tmp_path: Path) -> None:
    d = tmp_path / "dir with space"
    d.mkdir(mode=0o750)
    f = d / "compose.yaml"
    f.write_text("services: {}\n")
    os.chmod(f, 0o640)
    # Its first read moves its atime (relatime): before either read, not between. A read in
    # the chmod's clock tick leaves atime == ctime, which relatime moves again at the next
    # read: the fact's stat and its own would then differ (seen across a second boundary).
    time.sleep(0.05)
    f.read_text()
    link = tmp_path / "link"
    link.symlink_to(f)
    (tmp_path / "dir link").symlink_to(d)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    paths = [str(d), str(f), str(link), str(tmp_path / "missing"), str(d / "missing.conf"),
             str(tmp_path / "dir link"), str(tmp_path / "dangling")]
    fact = PathStates()
    rc, lines = sh(fact.command(paths=tuple(paths)))
    assert rc == 0
    states = fact.process(lines)
    assert sorted(states) == sorted(paths)
    for path in paths:
        together = path_answers(path, states[path])
        for one in (File, Directory, Link, Sha1File, FileDigest):
            assert together[one] == alone(one, path), (one.__name__, path)
    # The answers say something: a directory, a file with its digest, a missing path.
    assert path_answers(str(d), states[str(d)])[Directory]["mode"] == 750
    assert path_answers(str(f), states[str(f)])[FileDigest].mode == "0640"
    assert path_answers(str(tmp_path / "missing"), states[str(tmp_path / "missing")])[File] is None


def test_an_incomplete_answer_is_asked_alone() -> None:
    assert path_answers("/etc/x", [["user=root ..."]]) == {}


def test_service_states_reads_each_unit_block() -> None:
    output = ["Id=docker.service", "SubState=running", "ActiveState=active",
              "UnitFileState=enabled", "", "Id=nope.service", "SubState=dead",
              "ActiveState=inactive", "UnitFileState="]
    assert ServiceStates().process(output) == {
        "docker.service": {"SubState": "running", "ActiveState": "active",
                           "UnitFileState": "enabled"},
        "nope.service": {"SubState": "dead", "ActiveState": "inactive", "UnitFileState": ""},
    }
    command = ServiceStates().command(units=("docker.service", "nginx.service"))
    assert command.startswith("systemctl show --property Id --property SubState")
    assert command.endswith("docker.service nginx.service || true")
