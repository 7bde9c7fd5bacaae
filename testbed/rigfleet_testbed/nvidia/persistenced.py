"""Stand-in ``nvidia-persistenced``: keeps persistence mode on for every GPU while it runs.

Like the real daemon (run by ``nvidia-persistenced.service``, ``Type=forking``): at start it
enables persistence mode on all GPUs, writes its pid file and stays in the background; on SIGTERM
it turns persistence off again for the GPUs it enabled and exits. Without a loaded driver, or
with a driver of another version (upgrade without reboot), it fails to initialize like the real
one, and the start job fails::

    nvidia-persistenced [--verbose] [--user USER] [--no-persistence-mode] [--foreground]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__:
    from . import simstate as sim
else:  # inside the zipapp on a simulated host
    import simstate as sim  # type: ignore[no-redef]

PID_FILE = Path("/run/nvidia-persistenced/nvidia-persistenced.pid")
FAILED = "nvidia-persistenced failed to initialize. Check syslog for more details."


def _log(msg: str) -> None:
    # stderr of a systemd service goes to the journal, where the real daemon's syslog lines are.
    print(f"nvidia-persistenced: {msg}", file=sys.stderr, flush=True)


def initialize(paths: sim.SimPaths, version: str | None, enable: bool) -> list[int] | None:
    """Set persistence on every GPU; return the indices changed, or None when it cannot start."""
    loaded = sim.loaded_version(paths)
    if loaded is None:
        _log("Failed to query NVIDIA devices. Please ensure that the NVIDIA device files "
             "(/dev/nvidia*) exist, and that user 0 has read and write permissions for those "
             "files.")
        return None
    if version and version != loaded:
        _log(f"Failed to initialize NVML: Driver/library version mismatch (library {version}, "
             f"driver {loaded})")
        return None
    try:
        hw = sim.load_hardware(paths.hardware)
    except sim.SimError as exc:
        _log(str(exc))
        return None
    changed = []
    with sim.locked_state(paths, hw) as state:
        for idx, st in state.items():
            if enable and not st.persistence:
                st.persistence = True
                changed.append(idx)
    for g in hw.gpus:
        _log(f"device {g.pci_bus_id[4:]} - persistence mode "
             f"{'enabled' if enable else 'disabled'}.")
    return changed


def teardown(paths: sim.SimPaths, changed: list[int]) -> None:
    """Give back what we set: persistence goes off when the daemon stops (if the driver is up)."""
    if not changed or sim.loaded_version(paths) is None:
        return
    try:
        hw = sim.load_hardware(paths.hardware)
    except sim.SimError:
        return
    with sim.locked_state(paths, hw) as state:
        for idx in changed:
            if idx in state:
                state[idx].persistence = False
    _log(f"Shutdown ({os.getpid()})")


def serve(paths: sim.SimPaths, changed: list[int], pid_file: Path,
          ready: Callable[[], None] | None = None) -> int:
    """Hold persistence until SIGTERM; ``ready`` runs once the pid file exists."""
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{os.getpid()}\n")
    if ready:
        ready()
    try:
        while not stop:
            time.sleep(0.5)
    finally:
        teardown(paths, changed)
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
    return 0


def main(argv: Sequence[str] | None = None, *, version: str | None = None,
         pid_file: Path = PID_FILE) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-persistenced", add_help=True)
    parser.add_argument("--verbose", "-V", action="store_true")
    parser.add_argument("--user", "-u")
    parser.add_argument("--group", "-g")
    parser.add_argument("--persistence-mode", dest="mode", action="store_true", default=True)
    parser.add_argument("--no-persistence-mode", dest="mode", action="store_false")
    parser.add_argument("--foreground", "-f", action="store_true",
                        help="do not fork (for tests and debugging)")
    parser.add_argument("--version", "-v", action="store_true")
    args = parser.parse_args(argv)
    if args.version:
        print(f"nvidia-persistenced:  version {version or 'unknown'}")
        return 0
    if args.user:
        try:
            pwd.getpwnam(args.user)
        except KeyError:
            _log(f"Failed to find user '{args.user}'")
            print(FAILED, file=sys.stderr)
            return 1
    paths = sim.SimPaths.from_env()
    _log(f"Started ({os.getpid()})")
    changed = initialize(paths, version, args.mode)
    if changed is None:
        print(FAILED, file=sys.stderr)
        return 1
    if args.foreground:
        return serve(paths, changed, pid_file)
    # Type=forking: the parent returns once the child runs; systemd then reads the pid file.
    read_fd, write_fd = os.pipe()
    if os.fork():
        os.close(write_fd)
        os.read(read_fd, 1)  # the child writes a byte after its pid file exists
        return 0
    os.close(read_fd)
    os.setsid()
    os.dup2(os.open(os.devnull, os.O_RDWR), 0)

    def ready() -> None:
        os.write(write_fd, b"1")
        os.close(write_fd)

    try:
        serve(paths, changed, pid_file, ready)
    finally:
        os._exit(0)  # never return into the parent's code path
