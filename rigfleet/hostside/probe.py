"""What the deploy needs to know about a host's serving state, in one round trip.

Self-contained on purpose (stdlib, no package imports): the control side sends this file's
source as ``python3 -c <source>`` (``rigfleet.swapfacts.SwapProbe``), so it works before the
host-side bundle is installed, and the bundle's own lock code uses the same liveness rules::

    python3 -c "$(cat probe.py)"            # prints one JSON object
    python3 rigfleet-host.pyz probe          # the same, from the bundle

Output::

    {"active": {...active.json...} | null, "state": {...state.json...} | null,
     "lock": {"who", "why", "since", "pid", "deploy_id", "alive": bool, ...} | null,
     "containers": {"rigfleet-int8": {"status", "stack", "hash", "created", "image",
                                      "digests": ["sha256:..."]}},
     "route": "int8/0123abcd..." | "maintenance" | null, "bundle": "<sha256>" | null}
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# A lock directory without holder.json is being written; older than this it was abandoned.
HALF_WRITTEN_LOCK_S = 30.0
ROUTE_MARK = "# rigfleet route: "


def boot_id() -> str:
    """The kernel's boot id: a pid from another boot is never alive."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time since boot): tells a reused pid apart."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def holder_alive(holder: dict[str, Any]) -> bool:
    """True while the process that took the lock still runs (same boot, same pid start)."""
    if holder.get("boot_id") and holder.get("boot_id") != boot_id():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    start = pid_start_ticks(pid)
    if start is None:
        return False
    return holder.get("pid_start") in (None, start)


def read_holder(lock_dir: Path) -> dict[str, Any] | None:
    """The lock's ``holder.json`` plus ``alive``; None when nobody holds the lock."""
    if not lock_dir.is_dir():
        return None
    try:
        holder = json.loads((lock_dir / "holder.json").read_text())
        if not isinstance(holder, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        # Between mkdir and writing holder.json, or a holder killed right there.
        try:
            age = time.time() - lock_dir.stat().st_mtime
        except OSError:
            return None
        return {"who": "unknown", "why": "lock being taken", "since": None, "pid": None,
                "alive": age < HALF_WRITTEN_LOCK_S, "half_written": True}
    holder["alive"] = holder_alive(holder)
    return holder


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _docker(*args: str) -> str:
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=30,
                              check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def containers() -> dict[str, dict[str, Any]]:
    """Every container carrying the ``io.rigfleet.stack`` label or a ``rigfleet-`` name (one
    started by hand under a stack's name counts too), by name, with the image it runs: the
    reference it was created from and that image's repo digests."""
    fmt = ('{{.Names}}\t{{.State}}\t{{.Label "io.rigfleet.stack"}}\t'
           '{{.Label "io.rigfleet.config-hash"}}\t{{.CreatedAt}}')
    found: dict[str, dict[str, Any]] = {}
    for line in _docker("ps", "-a", "--format", fmt).splitlines():
        parts = line.split("\t")
        if len(parts) == 5 and (parts[2] or parts[0].startswith("rigfleet-")):
            found[parts[0]] = {"status": parts[1], "stack": parts[2], "hash": parts[3],
                               "created": parts[4]}
    if not found:
        return found
    images: dict[str, str] = {}
    for line in _docker("inspect", "--type", "container", "--format",
                        "{{.Name}}\t{{.Config.Image}}\t{{.Image}}", *found).splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0].lstrip("/") in found:
            found[parts[0].lstrip("/")]["image"] = parts[1]
            images[parts[0].lstrip("/")] = parts[2]
    digests: dict[str, list[str]] = {}
    for line in _docker("image", "inspect", "--format", "{{.Id}}\t{{json .RepoDigests}}",
                        *sorted(set(images.values()))).splitlines():
        image_id, _, text = line.partition("\t")
        try:
            digests[image_id] = [str(d).rpartition("@")[2] for d in json.loads(text)]
        except ValueError:
            continue
    for name, image_id in images.items():
        found[name]["digests"] = digests.get(image_id, [])
    return found


def route(path: Path) -> str | None:
    """The front's current route id, from the first line of ``route.conf``."""
    try:
        first = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return first[len(ROUTE_MARK):].strip() if first.startswith(ROUTE_MARK) else None


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def probe(root: Path = Path("/")) -> dict[str, Any]:
    """Everything above, as one dict (see the module docstring)."""
    state = root / "var/lib/rigfleet"
    return {
        "active": _json_file(state / "active" / "active.json"),
        "state": _json_file(state / "state.json"),
        "lock": read_holder(state / "lock"),
        "containers": containers(),
        "route": route(root / "etc/nginx/rigfleet/route.conf"),
        "bundle": file_sha256(root / "usr/local/lib/rigfleet/rigfleet-host.pyz"),
    }


def main(argv: list[str]) -> int:
    root = Path(argv[argv.index("--root") + 1]) if "--root" in argv else Path("/")
    if "--lock-only" in argv:  # preflight's question: is a live transaction running?
        print(json.dumps({"lock": read_holder(root / "var/lib/rigfleet/lock")}, sort_keys=True))
    else:
        print(json.dumps(probe(root), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
