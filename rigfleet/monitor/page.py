"""``rigfleet status --html``: one self-contained page (inline CSS and SVG) from Prometheus'
answers: tokens/s per host over time, then the pending and firing alerts::

    html = render(PageInput(hosts=["rig1"], monitor="lb1", now=t, hours=6, answers=answers))
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from rigfleet.monitor.query import Answers

W, H = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 26
ENGINE_COLOUR = "#1f6feb"
GATE_COLOURS = ("#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285")

Series = list[tuple[float, float]]

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
p.meta{color:#57606a;margin:0 0 16px}
table{border-collapse:collapse}td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left}
tr.firing td:first-child{color:#cf222e;font-weight:600}tr.pending td:first-child{color:#9a6700}
figure.host{margin:0 0 20px;display:inline-block;vertical-align:top}
figcaption{font-weight:600;margin-bottom:4px}span.down{color:#cf222e}span.up{color:#1a7f37}
svg text{font-size:11px;fill:#57606a}ul.legend{list-style:none;padding:0;margin:4px 0}
ul.legend li{display:inline-block;margin-right:12px}
ul.legend i{display:inline-block;width:18px;height:3px;vertical-align:middle;margin-right:4px}
"""


@dataclass(frozen=True)
class PageInput:
    """What the page shows: the inventory's hosts (in order), the monitor, the window."""

    hosts: Sequence[str]
    monitor: str
    now: float
    hours: float
    answers: Answers
    others: Sequence[str] = ()  # inventory hosts that do not serve (monitor, balancers)


def matrix(answer: dict[str, Any], *labels: str) -> dict[tuple[str, ...], Series]:
    """A query_range answer as {(label values...): [(t, v), ...]}, NaN and Inf left out."""
    out: dict[tuple[str, ...], Series] = {}
    for r in answer.get("data", {}).get("result", []):
        key = tuple(str(r.get("metric", {}).get(k, "")) for k in labels)
        points = [(float(t), float(v)) for t, v in r.get("values", []) if math.isfinite(float(v))]
        out.setdefault(key, []).extend(points)
    return out


def up_by_host(answer: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """The instant ``up`` answer as {instance: {job: up}}."""
    out: dict[str, dict[str, bool]] = {}
    for r in answer.get("data", {}).get("result", []):
        m = r.get("metric", {})
        out.setdefault(str(m.get("instance", "")), {})[str(m.get("job", ""))] = \
            r.get("value", [0, "0"])[1] == "1"
    return out


def _nice(top: float) -> float:
    """A round axis maximum at or above ``top`` (1, 2, 5 x 10^n)."""
    if top <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(top))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= top)


def _points(series: Series, x0: float, x1: float, ymax: float, step: bool) -> list[str]:
    """SVG polyline point lists, one per unbroken run (a gap of more than 5 minutes breaks)."""
    def xy(t: float, v: float) -> str:
        x = LEFT + (t - x0) / (x1 - x0) * (W - LEFT - RIGHT)
        y = H - BOTTOM - v / ymax * (H - TOP - BOTTOM)
        return f"{x:.1f},{y:.1f}"
    runs: list[list[str]] = []
    prev: tuple[float, float] | None = None
    for t, v in sorted(series):
        if prev is None or t - prev[0] > 300:
            runs.append([])
        elif step:
            runs[-1].append(xy(t, prev[1]))
        runs[-1].append(xy(t, v))
        prev = (t, v)
    return [" ".join(r) for r in runs if r]


def chart(host: str, lines: Sequence[tuple[str, str, Series, bool]], x0: float, x1: float) -> str:
    """An inline SVG of tokens/s for one host; ``lines``: (label, colour, points, step)."""
    ymax = _nice(max((v for _, _, s, _ in lines for _, v in s), default=0) * 1.05)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'viewBox="0 0 {W} {H}" role="img" aria-label="tokens/s on {escape(host)}">',
             f"<title>tokens/s on {escape(host)}</title>"]
    for frac in (0.0, 0.5, 1.0):
        y = H - BOTTOM - frac * (H - TOP - BOTTOM)
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#d0d7de" stroke-width="1"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f"{ymax * frac:g}</text>")
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        x = LEFT + frac * (W - LEFT - RIGHT)
        parts.append(f'<text x="{x:.1f}" y="{H - 8}" text-anchor="{anchor}">'
                     f"{time.strftime('%H:%M', time.gmtime(x0 + frac * (x1 - x0)))}</text>")
    drawn = [f'<polyline class="series" data-series="{escape(label)}" fill="none" '
             f'stroke="{colour}" stroke-width="2" points="{pts}"/>'
             for label, colour, series, step in lines
             for pts in _points(series, x0, x1, ymax, step)]
    parts += drawn or [f'<text x="{W / 2:.0f}" y="{H / 2:.0f}" text-anchor="middle">'
                       "no tokens/s recorded in this window</text>"]
    parts.append("</svg>")
    return "".join(parts)


def _host_figure(host: str, data: PageInput, gate: dict[tuple[str, ...], Series],
                 engine: dict[tuple[str, ...], Series], up: dict[str, dict[str, bool]]) -> str:
    lines = [("engine tokens/s (vllm:generation_tokens_total rate)", ENGINE_COLOUR,
              engine[(host,)], False)] if engine.get((host,)) else []
    lines += [(f"gate tokens/s ({stack})", GATE_COLOURS[i % len(GATE_COLOURS)],
               gate[(host, stack)], True)
              for i, stack in enumerate(sorted(s for h, s in gate if h == host))]
    jobs = up.get(host, {})
    targets = " ".join(f'<span class="{"up" if ok else "down"}">{escape(job)} '
                       f'{"up" if ok else "down"}</span>' for job, ok in sorted(jobs.items()))
    note = "" if host in data.hosts else " (not in the inventory)"
    legend = "".join(f'<li><i style="background:{c}"></i>{escape(label)}</li>'
                     for label, c, _, _ in lines)
    x0, x1 = data.now - data.hours * 3600, data.now
    return (f'<figure class="host" id="host-{escape(host)}" data-host="{escape(host)}">'
            f"<figcaption>{escape(host)}{note} · "
            f"{targets or '<span class=down>no scrape target</span>'}</figcaption>"
            f"{chart(host, lines, x0, x1)}<ul class=\"legend\">{legend}</ul></figure>")


def _alerts_table(answer: dict[str, Any]) -> tuple[int, str]:
    alerts = sorted(answer.get("data", {}).get("alerts", []),
                    key=lambda a: (a.get("state") != "firing", a.get("labels", {}).get(
                        "alertname", ""), a.get("labels", {}).get("instance", "")))
    if not alerts:
        return 0, '<p id="no-alerts">No alert pending or firing.</p>'
    rows = []
    for a in alerts:
        labels, notes = a.get("labels", {}), a.get("annotations", {})
        state = str(a.get("state", ""))
        extra = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())
                          if k not in ("alertname", "instance", "severity", "job"))
        cells = (labels.get("alertname", ""), state, labels.get("instance", ""),
                 labels.get("severity", ""), str(a.get("activeAt", ""))[:19].replace("T", " "),
                 notes.get("summary", "") + (f" ({extra})" if extra else ""))
        rows.append(f'<tr class="{escape(state)}">'
                    + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    return len(alerts), ('<table id="alerts"><thead><tr><th>alert</th><th>state</th>'
                         "<th>host</th><th>severity</th><th>since (UTC)</th><th>summary</th>"
                         "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def render(data: PageInput) -> str:
    gate = matrix(data.answers.gate, "instance", "stack")
    engine = matrix(data.answers.engine, "instance")
    up = up_by_host(data.answers.up)
    # A host outside the inventory gets a figure for the tokens/s it served; an ``up`` alone is
    # the distro's default scrape of localhost:9090 before ours (its series stays 5 minutes).
    seen = {k[0] for k in gate} | {k[0] for k in engine}
    others = sorted(h for h in seen - set(data.hosts) - set(data.others) if h and h != data.monitor)
    figures = [_host_figure(h, data, gate, engine, up) for h in (*data.hosts, *others)]
    count, alerts = _alerts_table(data.answers.alerts)
    x0 = data.now - data.hours * 3600
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>rigfleet: fleet tokens/s and alerts</title>"
            f"<style>{CSS}</style></head><body>"
            "<h1>rigfleet: fleet tokens/s and alerts</h1>"
            f'<p class="meta">From Prometheus on {escape(data.monitor)}, '
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(x0))} to "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(data.now))} UTC · "
            f"{len(data.hosts)} host(s) · {count} alert(s)</p>"
            f"<h2>Alerts ({count})</h2>{alerts}"
            f'<h2>Tokens/s per host</h2><div id="hosts">{"".join(figures)}</div>'
            "</body></html>\n")
