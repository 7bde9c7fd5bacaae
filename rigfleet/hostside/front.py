"""The front's route (``route.conf``, included by ``roles/front.py``'s nginx): proxy to the
verified stack, or 503 + ``Retry-After``; how it is switched: docs/swap.md::

    front = Front(Layout(), port=8000, run=run_cmd, http=http_request, api_key=key)
    front.maintenance("swap int8 -> tq3-mtp-genesis", retry_after_s=30)
    front.serve(plan.desired)          # only ever a stack that passed the gate
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .atomic import write_atomic
from .layout import ROUTE_MARK, Layout
from .plan import StackRef
from .records import route
from .steps import Failure

ROUTE_HEADER = "X-Rigfleet-Route"
MAINTENANCE = "maintenance"
# The readiness path balancers check (no key needed): 200 only while a verified stack serves
# and answers /health. Without the key a 503 says only its class (docs/balancer.md).
READY_PATH = "/rigfleet/ready"
READY_CLASSES = ("swapping", "maintenance", "starting", "down")

Run = Callable[[list[str], float], tuple[int, str]]
# (method, url, headers, body, timeout) -> (status, headers, body); status 0: no answer.
Http = Callable[[str, str, dict[str, str], bytes | None, float], tuple[int, dict[str, str], bytes]]

# nginx string literals: keep the maintenance message free of quotes and backslashes.
_SAFE = re.compile(r"[^A-Za-z0-9 ._:>()/+,=-]")


class FrontError(Failure):
    """The front could not be switched (phase ``front``); the previous route is still in place."""

    def __init__(self, reason: str) -> None:
        super().__init__("front", reason)


def render_serving(ref: StackRef) -> str:
    """The proxy to one stack's loopback port (timeouts: the including location's)."""
    return (
        f"{ROUTE_MARK}{ref.route_id}\n"
        "# Managed by the rigfleet host tool (rigfleet/hostside/front.py): switched by swaps.\n"
        f'add_header {ROUTE_HEADER} "{ref.route_id}" always;\n'
        f"proxy_pass http://127.0.0.1:{int(ref.port)};\n"
        "proxy_http_version 1.1;\n"
        "proxy_set_header Host $host;\n"
        'proxy_set_header Connection "";\n'
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n"
        "# Streaming (SSE) answers go out token by token: no buffering (the long timeouts are\n"
        "# the front's client location's).\n"
        "proxy_buffering off;\n"
        "proxy_request_buffering off;\n"
        "proxy_cache off;\n"
        "add_header X-Accel-Buffering no always;\n"
    )


def ready_class(message: str) -> str:
    """The ``READY_CLASSES`` entry of a maintenance message the host tool wrote."""
    text = message.lower()
    if text.startswith("maintenance") or "through the gate" in text:
        return "maintenance"
    if text.endswith(" in progress"):  # "swap int8 -> tq3-mtp-genesis in progress"
        return "swapping"
    if "recreating" in text:
        return "starting"
    return "down"


def render_maintenance(message: str, retry_after_s: int) -> str:
    """503 with ``Retry-After`` and an OpenAI-style JSON error; without the key, the class."""
    text = _SAFE.sub("", message)[:200] or "stack swap in progress"
    kind = ready_class(text)
    body = json.dumps({"error": {"message": f"rigfleet: {text}; retry in {int(retry_after_s)} s",
                                 "type": "service_unavailable", "code": 503, "class": kind}})
    short = json.dumps({"ready": False, "class": kind, "retry_after_s": int(retry_after_s)})
    return (
        f"{ROUTE_MARK}{MAINTENANCE}\n"
        "# Managed by the rigfleet host tool: no verified stack is serving right now.\n"
        f'add_header {ROUTE_HEADER} "{MAINTENANCE}" always;\n'
        f"add_header Retry-After {int(retry_after_s)} always;\n"
        "# Without the API key (the readiness path): not ready and why in one word.\n"
        "if ($rigfleet_authorized = 0) {\n"
        f"    return 503 '{short}';\n"
        "}\n"
        f"return 503 '{body}';\n"
    )


@dataclass
class Front:
    """The route include of one host's front (``port``: probed on 127.0.0.1)."""

    layout: Layout
    port: int
    run: Run
    http: Http
    api_key: str = ""
    settle_s: float = 15.0
    sleep: Callable[[float], None] = field(default=time.sleep)

    def __post_init__(self) -> None:
        self.path = self.layout.front_route

    def current(self) -> str | None:
        return route(self.path)

    def serve(self, ref: StackRef, wait: bool = True) -> None:
        self._apply(render_serving(ref), ref.route_id, wait)

    def maintenance(self, message: str, retry_after_s: int, wait: bool = True) -> None:
        self._apply(render_maintenance(message, retry_after_s), MAINTENANCE, wait)

    def _apply(self, text: str, route_id: str, wait: bool) -> None:
        old = self.path.read_text() if self.path.exists() else None
        if old == text and not wait:
            return
        write_atomic(self.path, text)
        rc, out = self.run(["nginx", "-t", "-q"], 30.0)
        if rc != 0:
            self._restore(old)
            raise FrontError(f"nginx -t refused route {route_id}: {out.strip()[-400:]}")
        master = self._master() if wait else ""
        before = self._accepting(master)
        rc, out = self.run(["systemctl", "reload", "nginx"], 30.0)
        if rc != 0:
            # systemd refuses new jobs while the machine shuts down: signal nginx directly.
            rc, out = self.run(["nginx", "-s", "reload"], 30.0)
        if rc != 0:
            if not wait:
                return  # nginx not running (boot, shutdown): the file is read at its start
            self._restore(old)
            self.run(["systemctl", "reload", "nginx"], 30.0)
            raise FrontError(f"nginx reload failed for route {route_id}: {out.strip()[-400:]}")
        if wait:
            try:
                self._wait_for(route_id, master, before)
            except FrontError:  # said as "the previous route is still in place": so it is
                self._restore(old)
                self.run(["systemctl", "reload", "nginx"], 30.0)
                raise

    def _master(self) -> str:
        rc, out = self.run(["systemctl", "show", "--value", "-p", "MainPID", "nginx"], 10.0)
        return out.strip() if rc == 0 and out.strip().isdigit() and int(out) > 0 else ""

    def _accepting(self, master: str) -> set[str]:
        """PIDs of the master's workers that still take new connections: a reload's graceful
        quit retitles a worker "... is shutting down" as it closes its listening sockets, and
        until then it answers new connections with the old route."""
        if not master:
            return set()
        rc, out = self.run(["pgrep", "-P", master, "-f", "^nginx: worker process[[:space:]]*$"],
                           10.0)
        return set(out.split()) if rc == 0 else set()

    def _wait_for(self, route_id: str, master: str, before: set[str]) -> None:
        """Until ``GET /v1/models`` through the front shows ``route_id`` in its route header
        and no worker from before the reload takes new connections."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + self.settle_s
        while True:
            status, got, _ = self.http("GET", f"http://127.0.0.1:{self.port}/v1/models",
                                       headers, None, 5.0)
            seen = {k.lower(): v for k, v in got.items()}.get(ROUTE_HEADER.lower())
            stale = before & self._accepting(master) if seen == route_id and before else set()
            if seen == route_id and not stale:
                return
            if time.monotonic() > deadline:
                what = (f"nginx workers {' '.join(sorted(stale))} from before the reload still "
                        "take connections" if stale else
                        f"the front still answers {status} route {seen!r}")
                raise FrontError(f"{what} {self.settle_s:g}s after switching to {route_id!r}")
            self.sleep(0.2)

    def _restore(self, old: str | None) -> None:
        if old is None:
            self.path.unlink(missing_ok=True)
        else:
            write_atomic(self.path, old)
