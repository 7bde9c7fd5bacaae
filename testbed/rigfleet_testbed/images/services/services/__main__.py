"""Entry point: ``python3 -m services --data /srv/testbed``.

Options for running outside the container (tests pick free ports with 0)::

    python3 -m services --data DIR --bind 127.0.0.1 --apt-port 0 --hub-port 0 --git-port 0 \
        --pypi-port 0 --ports-file /tmp/ports.json --log /tmp/services.log

``--ports-file`` receives ``{"apt": N, "hub": N, "git": N, "pypi": N}`` once every listener is
bound.
SIGTERM/SIGINT stop the servers and exit 0 (the process is PID 1 in its container).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path

from .app import start
from .common import RequestLog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m services", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data", type=Path, default=Path("/srv/testbed"))
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--apt-port", type=int, default=80)
    parser.add_argument("--hub-port", type=int, default=8080)
    parser.add_argument("--git-port", type=int, default=8090)
    parser.add_argument("--pypi-port", type=int, default=3141)
    parser.add_argument("--ports-file", type=Path)
    parser.add_argument("--log", type=Path, help="also append the request log to this file")
    args = parser.parse_args(argv)

    log = RequestLog(extra_path=args.log)
    running = start(
        args.data,
        host=args.bind,
        apt_port=args.apt_port,
        hub_port=args.hub_port,
        git_port=args.git_port,
        pypi_port=args.pypi_port,
        log=log,
    )
    if args.ports_file:
        tmp = args.ports_file.with_name(args.ports_file.name + ".tmp")
        tmp.write_text(json.dumps(running.ports))
        os.replace(tmp, args.ports_file)  # readers never see a partial file

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.line("[services] stopping")
    running.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
