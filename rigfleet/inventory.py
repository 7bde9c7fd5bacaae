"""Read a pyinfra inventory from outside pyinfra (the rollout, status, testinfra bridge).

pyinfra's CLI does the loading (group data, precedence) in a subprocess: importing
``pyinfra_cli`` here would monkey-patch gevent into our process::

    hosts = load_inventory("inventory/home.py")
    hosts[0].name, hosts[0].data["power_caps_w"]
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class InventoryError(RuntimeError):
    """The inventory could not be loaded; the message quotes pyinfra."""


@dataclass(frozen=True)
class InventoryHost:
    name: str
    groups: tuple[str, ...]
    data: dict[str, Any]

    @property
    def ssh_target(self) -> tuple[str, int, str]:
        """(hostname, port, user) as pyinfra's SSH connector would use them."""
        return (self.data.get("ssh_hostname") or self.name, int(self.data.get("ssh_port") or 22),
                self.data.get("ssh_user") or "root")


def load_inventory(path: str | Path, cwd: str | Path | None = None) -> list[InventoryHost]:
    pyinfra = Path(sys.executable).with_name("pyinfra")
    cmd = [str(pyinfra) if pyinfra.exists() else "pyinfra", str(path), "debug-inventory", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=60)
    if proc.returncode != 0:
        raise InventoryError(f"cannot load inventory {path}: {proc.stderr.strip()[-2000:]}")
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise InventoryError(f"pyinfra printed no JSON for {path}: {proc.stdout[:500]}") from None
    return [InventoryHost(r["name"], tuple(r.get("groups", [])), r.get("data", {})) for r in rows]
