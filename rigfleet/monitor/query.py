"""The monitor's Prometheus API (loopback on the monitor host), asked with ``curl`` over the
fleet's SSH, every question in one shell::

    answers = fetch(SshRemote(), monitor_host(hosts, "inventory/home.py"), now=t, hours=6)
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from rigfleet.errors import RigfleetError
from rigfleet.inventory import MONITOR_GROUP, InventoryHost
from rigfleet.scrape import PROMETHEUS_PORT
from rigfleet.ssh import HostUnreachable, Remote

MARK = "--rigfleet-prometheus-answer--"
# The page's figures; the engine's rate from the counter works before recording rules have data.
GATE_QUERY = "max by (instance, stack) (rigfleet_gate_tokens_per_second)"
ENGINE_QUERY = 'sum by (instance) (rate(vllm:generation_tokens_total{job="vllm"}[2m]))'


class MonitorError(RigfleetError):
    """No monitor host, or its Prometheus cannot be asked or answered nonsense."""


@dataclass(frozen=True)
class Answers:
    """Prometheus' JSON answers, as they came (``page.render`` reads them)."""

    gate: dict[str, Any]     # query_range GATE_QUERY
    engine: dict[str, Any]   # query_range ENGINE_QUERY
    up: dict[str, Any]       # instant "up"
    alerts: dict[str, Any]   # /api/v1/alerts


def monitor_host(hosts: Sequence[InventoryHost], inventory: str) -> InventoryHost:
    """The first host of group ``monitors``; ``MonitorError`` saying what to add when none."""
    if (monitor := next((h for h in hosts if MONITOR_GROUP in h.groups), None)) is not None:
        return monitor
    raise MonitorError(
        f"inventory {inventory}: groups: no host in group {MONITOR_GROUP!r}; allowed: a "
        f"monitor host in group {MONITOR_GROUP!r} (e.g. `{MONITOR_GROUP} = [\"lb1\"]` in the "
        "inventory file) converged by deploy.py, whose Prometheus the page is drawn from")


def api_paths(now: float, hours: float) -> list[str]:
    """The API paths asked, in ``Answers``' order (range: ``hours`` back from ``now``)."""
    step = max(15, int(hours * 3600 / 240))  # about 240 points per line
    rng = {"start": f"{now - hours * 3600:.0f}", "end": f"{now:.0f}", "step": str(step)}
    return ["/api/v1/query_range?" + urlencode({"query": GATE_QUERY, **rng}),
            "/api/v1/query_range?" + urlencode({"query": ENGINE_QUERY, **rng}),
            "/api/v1/query?" + urlencode({"query": "up", "time": f"{now:.0f}"}),
            "/api/v1/alerts"]


def fetch_command(paths: Sequence[str], port: int = PROMETHEUS_PORT,
                  timeout: float = 20.0) -> str:
    """One shell command asking every path of Prometheus on loopback, answers split by MARK
    (``curl -sS``: an HTTP error still prints Prometheus' JSON error, read by ``_answer``)."""
    return "; ".join(f"curl -sS --max-time {timeout:g} "
                     f"{shlex.quote(f'http://127.0.0.1:{port}{p}')} 2>&1; echo; echo {MARK}"
                     for p in paths)


def _answer(host: str, path: str, text: str) -> dict[str, Any]:
    what = f"monitor {host}: Prometheus {path.split('?')[0]}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise MonitorError(f"{what}: not a JSON answer: {text.strip()[-300:] or '(nothing)'}; "
                           f"allowed: Prometheus on 127.0.0.1:{PROMETHEUS_PORT} of the monitor "
                           "host (is the monitor converged and running?)") from None
    if not isinstance(data, dict) or data.get("status") != "success" or "data" not in data:
        err = data.get("error") if isinstance(data, dict) else None
        raise MonitorError(f"{what}: answered {err or str(data)[:300]!r}; allowed: "
                           "status success with data")
    return data


def split_answers(host: str, paths: Sequence[str], out: str) -> Answers:
    """The shell's output cut at the markers, each part checked as Prometheus' JSON."""
    parts = out.split(MARK)
    if len(parts) < len(paths) + 1:
        raise MonitorError(f"monitor {host}: the API calls did not all run: "
                           f"{out.strip()[-300:] or '(no output)'}")
    return Answers(*(_answer(host, p, t) for p, t in zip(paths, parts, strict=False)))


def fetch(remote: Remote, monitor: InventoryHost, *, now: float, hours: float,
          timeout: float = 20.0) -> Answers:
    """Ask the monitor's Prometheus over SSH; ``MonitorError`` when it cannot be asked."""
    paths = api_paths(now, hours)
    try:
        rc, out = remote.run(monitor, fetch_command(paths, timeout=timeout),
                             timeout=timeout * len(paths) + 10)
    except HostUnreachable as e:
        raise MonitorError(f"monitor {monitor.name}: {e}") from None
    if "curl: not found" in out or "curl: command not found" in out:
        raise MonitorError(f"monitor {monitor.name}: curl is not installed there (the base "
                           "role installs it: converge the monitor host)")
    return split_answers(monitor.name, paths, out)
