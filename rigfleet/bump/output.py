"""Where ``rigfleet bump`` (and ``rollback``, ``lock``) write their progress: one console on
stderr, timestamped lines, and who runs the command.

Example::

    log("registry https://registry-1.docker.io: listing the tags of vllm/vllm-openai")
    by()        # 'ops@ctl' (RIGFLEET_BY when set)
"""

from __future__ import annotations

import getpass
import os
import socket
import time

from rich.console import Console

console = Console(stderr=True, highlight=False)


def log(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


def by() -> str:
    if os.environ.get("RIGFLEET_BY"):
        return os.environ["RIGFLEET_BY"]
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"
