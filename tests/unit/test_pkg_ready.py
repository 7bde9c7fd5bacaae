"""Before a maintenance window opens (``rigfleet.hostside.pkgready``): apt's and dpkg's locks
waited for a bounded time with the holder named, an interrupted dpkg repaired with
``dpkg --configure -a``, room on disk. A real process holds a real ``fcntl`` lock here (what
apt, dpkg and unattended-upgrades take); the clock is a fake one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rigfleet.hostside.pkgready import DPKG_REPAIR, NotReady, Readiness

HOLD = ("import fcntl, sys, time; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(120)")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for rel in ("var/lib/dpkg/lock-frontend", "var/lib/dpkg/lock", "var/lib/apt/lists/lock",
                "var/cache/apt/archives/lock"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "var/lib/dpkg/updates").mkdir()
    return tmp_path


def hold(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


class Clock:
    def __init__(self) -> None:
        self.t, self.naps = 0.0, 0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.naps += 1


def readiness(root: Path, clock: Clock, said: list[str], **kw) -> Readiness:
    return Readiness(root=root, say=said.append, clock=clock.now, sleep=clock.sleep, **kw)


def test_free_locks_and_a_clean_dpkg_are_ready_at_once(root):
    clock, said = Clock(), []
    assert readiness(root, clock, said).check(True, 120, 1) == []
    assert clock.naps == 0 and said == []


def test_a_held_dpkg_lock_is_waited_for_a_bounded_time_naming_its_holder(root):
    clock, said = Clock(), []
    proc = hold(root / "var/lib/dpkg/lock-frontend")
    try:
        with pytest.raises(NotReady) as e:
            readiness(root, clock, said).check(True, 30, 1)
    finally:
        proc.kill()
        proc.wait()
    why = str(e.value)
    assert f"var/lib/dpkg/lock-frontend is held by pid {proc.pid} (" in why
    assert "import fcntl" in why and "still after 30 s" in why and "run the deploy again" in why
    assert 30 <= clock.t < 33
    assert len(said) == 1 and said[0].startswith("waiting up to 30 s for the package manager")


def test_a_lock_released_during_the_wait_lets_the_work_start(root):
    clock, said = Clock(), []
    proc = hold(root / "var/lib/dpkg/lock")
    ready = readiness(root, clock, said)
    real_sleep = ready.sleep

    def sleep(seconds: float) -> None:
        real_sleep(seconds)
        if clock.t >= 10 and proc.poll() is None:
            proc.kill()
            proc.wait()
            time.sleep(0.05)

    ready.sleep = sleep
    assert ready.check(True, 120, 1) == []
    assert 10 <= clock.t < 20 and f"held by pid {proc.pid}" in said[0]


def test_only_a_lock_is_busy_not_a_process_that_merely_opened_the_file(root):
    path = root / "var/lib/dpkg/lock-frontend"
    reader = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); "
                               "print('open', flush=True); time.sleep(60)", str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "open"
        assert readiness(root, Clock(), []).busy() is None
    finally:
        reader.kill()
        reader.wait()


def test_an_interrupted_dpkg_is_repaired_with_the_documented_command(root):
    (root / "var/lib/dpkg/updates/0001").write_text("half-configured\n")
    ran: list[tuple[str, ...]] = []

    def run(argv: tuple[str, ...]) -> tuple[int, str]:
        ran.append(argv)
        (root / "var/lib/dpkg/updates/0001").unlink()
        return 0, "Setting up nvidia-driver ...\n"

    said: list[str] = []
    done = readiness(root, Clock(), said, run=run).check(True, 120, 1)
    assert ran == [DPKG_REPAIR] and ran[0][:3] == ("dpkg", "--configure", "-a")
    assert done == ["repaired an interrupted dpkg (dpkg --configure -a --force-confdef "
                    "--force-confold)"]
    assert "dpkg was interrupted (1 journal file(s)" in said[0]


def test_only_dpkgs_journal_files_say_it_was_interrupted(root):
    # dpkg keeps ``updates/tmp.i`` open while it runs and leaves it when killed; its journal
    # files (what apt's "dpkg was interrupted" counts) are named by digits alone.
    (root / "var/lib/dpkg/updates/tmp.i").write_text("#padded\n" * 512)
    ran: list[tuple[str, ...]] = []

    def run(argv: tuple[str, ...]) -> tuple[int, str]:
        ran.append(argv)
        return 1, "dpkg: error processing package foo (--configure)\n"

    said: list[str] = []
    assert readiness(root, Clock(), said, run=run).check(True, 120, 1) == []
    assert ran == [] and said == []


def test_a_repair_that_fails_keeps_the_window_shut_with_dpkgs_words(root):
    (root / "var/lib/dpkg/updates/0001").write_text("x\n")

    def run(argv: tuple[str, ...]) -> tuple[int, str]:
        return 1, "dpkg: error processing package foo (--configure):\n installed foo " \
                  "package post-installation script subprocess returned error exit status 1\n"

    with pytest.raises(NotReady) as e:
        readiness(root, Clock(), [], run=run).check(True, 120, 1)
    assert "`dpkg --configure -a --force-confdef --force-confold` failed (exit 1: " in str(e.value)
    assert "post-installation script" in str(e.value)


def test_without_apt_steps_the_package_manager_is_not_waited_for(root):
    proc = hold(root / "var/lib/dpkg/lock-frontend")
    try:
        assert readiness(root, Clock(), []).check(False, 120, 1) == []
    finally:
        proc.kill()
        proc.wait()


def test_too_little_disk_names_the_place_and_the_need(root):
    with pytest.raises(NotReady) as e:
        readiness(root, Clock(), []).check(False, 120, 1 << 40)
    assert "MiB free; the maintenance needs" in str(e.value) and str(root) in str(e.value)
