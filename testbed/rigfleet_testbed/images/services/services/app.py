"""Start and stop the four listeners in one process.

In-process use (tests, tools)::

    running = start(Path("/srv/testbed"), host="127.0.0.1", apt_port=0, hub_port=0, git_port=0,
                    pypi_port=0)
    print(running.ports)          # {"apt": 41234, "hub": 41235, "git": 41236, "pypi": 41237}
    running.stop()
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from .common import RequestLog, Server
from .faults import Faults
from .hub import HubHandler
from .hubstore import HubStore
from .static import AptHandler, GitHandler, PypiHandler, update_server_info


@dataclass
class Running:
    """The started servers; ``ports`` are the bound ports (useful with port 0)."""

    servers: dict[str, Server]
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def ports(self) -> dict[str, int]:
        return {name: srv.server_address[1] for name, srv in self.servers.items()}

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.shutdown()
            srv.server_close()
        for t in self.threads:
            t.join(timeout=5)


def start(
    data: Path,
    *,
    host: str = "0.0.0.0",
    apt_port: int = 80,
    hub_port: int = 8080,
    git_port: int = 8090,
    pypi_port: int = 3141,
    log: RequestLog | None = None,
) -> Running:
    """Bind and serve ``<data>/apt``, ``<data>/hub``, ``<data>/git``, ``<data>/pypi``; returns
    at once."""
    log = log or RequestLog()
    for sub in ("apt", "hub", "git", "pypi"):
        if not (data / sub).is_dir():
            # The testbed may fill a directory later (bind mount); serve 404s until then.
            log.line(f"[services] warning: {data / sub} does not exist yet")
    update_server_info(data / "git", log)

    apt = Server((host, apt_port), AptHandler, service="apt", log=log)
    apt.root = data / "apt"  # type: ignore[attr-defined]
    hub = Server((host, hub_port), HubHandler, service="hub", log=log)
    hub.store = HubStore(data / "hub")  # type: ignore[attr-defined]
    hub.faults = Faults()  # type: ignore[attr-defined]
    git = Server((host, git_port), GitHandler, service="git", log=log)
    git.root = data / "git"  # type: ignore[attr-defined]
    pypi = Server((host, pypi_port), PypiHandler, service="pypi", log=log)
    pypi.root = data / "pypi"  # type: ignore[attr-defined]

    running = Running(servers={"apt": apt, "hub": hub, "git": git, "pypi": pypi})
    for name, srv in running.servers.items():
        thread = threading.Thread(target=srv.serve_forever, name=f"services-{name}", daemon=True)
        thread.start()
        running.threads.append(thread)
    log.line(
        "[services] listening: "
        + ", ".join(f"{name}={host}:{port}" for name, port in running.ports.items())
        + f" data={data}"
    )
    return running
