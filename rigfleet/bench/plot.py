"""The bench's PNG (matplotlib, ``rigfleet[plot]``): per stack, decode tok/s per host beside the
fleet median, the reference and the host's history; then depth and concurrency.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rigfleet.hostside.bench.report import Entry, fleet_medians
from rigfleet.hostside.records import SHAPES

INSTALL_HINT = ("no PNG: matplotlib is not installed; pip install 'rigfleet[plot]' (or "
                "pip install matplotlib) and run again (the JSON and Markdown reports are "
                "written)")
NOTHING = "no PNG: nothing was measured (see the report's errors)"
COLORS = {"narrative": "#4878d0", "code": "#ee854a"}
REF_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.6, "label": "stack reference"}
MEDIAN_STYLE = {"color": "#8c1c13", "linestyle": "-", "linewidth": 1.4, "label": "fleet median"}


def measured(e: Entry) -> bool:
    return any(e.decode(s) is not None for s in SHAPES)


def axis_range(values: Sequence[float]) -> tuple[float, float]:
    """A y range around ``values`` with a margin: small gaps stay visible."""
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.25, hi * 0.03, 1e-6)
    return max(0.0, lo - pad), hi + pad


def _decode_panel(ax: Any, stack: str, rows: list[Entry], fleet: dict[str, float]) -> None:
    width = 0.38
    shown: list[float] = []
    labels: list[tuple[float, float, str]] = []
    for j, shape in enumerate(SHAPES):
        xs = [i + (j - 0.5) * width for i in range(len(rows))]
        ref = next((r for e in rows if (r := e.reference.get(shape))), None)
        for x, e in zip(xs, rows, strict=True):
            value = e.decode(shape)
            past = [v for h in e.history if (v := h.decode(shape)) is not None]
            shown += past
            if past:
                ax.scatter([x] * len(past), past, marker="_", s=220, color="dimgray",
                           zorder=5, label="host history (earlier records)")
            if value is None:
                continue
            shown.append(value)
            ax.bar(x, value, width * 0.95, color=COLORS[shape], alpha=0.55, zorder=2,
                   label=f"{shape} (this bench)")
            labels.append((x, value, f"{value:.1f}" + (f"\n{value / ref:.0%} ref" if ref else "")))
        lo_x, hi_x = xs[0] - width / 2, xs[-1] + width / 2
        for y, style, name in ((ref, REF_STYLE, "ref"), (fleet.get(shape), MEDIAN_STYLE, "median")):
            if y:
                shown.append(y)
                ax.hlines(y, lo_x, hi_x, zorder=4, **style)
                # narrative's labels left of its bars, code's right of its own: apart
                ax.annotate(f"{name} {y:.1f}", (lo_x if j == 0 else hi_x, y),
                            xytext=(-2 if j == 0 else 2, 0), textcoords="offset points",
                            va="center", ha="right" if j == 0 else "left", fontsize=7,
                            color=style["color"], zorder=6)
    if shown:
        lo, hi = axis_range(shown)
        ax.set(ylim=(lo, hi),
               ylabel=f"decode tok/s (axis from {lo:.0f})" if lo > 0 else "decode tok/s")
        for x, value, text in labels:  # inside the bar, halfway up: clear of the lines
            ax.text(x, lo + (value - lo) * 0.45, text, ha="center", va="center", fontsize=7,
                    zorder=6)
    ax.set_xticks(range(len(rows)), [e.host if measured(e) else f"{e.host}\n(not measured)"
                                     for e in rows], fontsize=8)
    ax.set_xlim(-1.0, len(rows))
    ax.grid(axis="y", alpha=0.3, zorder=0)
    ax.set_title(f"{stack}: decode tok/s per host ({' | '.join(SHAPES)})", fontsize=10)


def _depth_panel(ax: Any, rows: list[Entry]) -> bool:
    for e in rows:
        points = [(d.depth / 1000, d.run.decode_tok_s) for d in e.result.depths
                  if d.run is not None and d.run.decode_tok_s is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=f"{e.host} (depth)")
    ax.set(xlabel="context depth (K tokens)", ylabel="decode tok/s")
    ax.set_title("decode by context depth", fontsize=10)
    ax.grid(alpha=0.3)
    return bool(ax.get_lines())


def _concurrency_panel(ax: Any, rows: list[Entry]) -> bool:
    have = [(e.host, c) for e in rows if (c := e.result.concurrency) is not None
            and c.aggregate_tok_s is not None]
    for i, (_host, c) in enumerate(have):
        per, agg = c.per_stream_decode or 0.0, c.aggregate_tok_s or 0.0
        ax.bar(i - 0.2, per, 0.4, color="#6acc64", label="per stream")
        ax.bar(i + 0.2, agg, 0.4, color="#956cb4", label="all streams")
        ax.annotate(f"{c.streams} streams", (i, agg), xytext=(0, 3),
                    textcoords="offset points", ha="center", fontsize=7)
    ax.set_xticks(range(len(have)), [h for h, _ in have], fontsize=8)
    ax.set_ylabel("tok/s")
    ax.set_title("concurrency run", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return bool(have)


def plot(entries: Sequence[Entry], path: Path) -> tuple[Path | None, str | None]:
    """Draw ``entries`` to ``path``; (path, None), or (None, why not)."""
    if not any(measured(e) for e in entries):
        return None, NOTHING
    try:
        importlib.import_module("matplotlib").use("Agg")  # the file-only backend
    except ImportError:
        return None, INSTALL_HINT
    plt = importlib.import_module("matplotlib.pyplot")
    groups = {s: [e for e in entries if (e.stack or "unknown stack") == s]
              for s in sorted({e.stack or "unknown stack" for e in entries if measured(e)})}
    fleet = fleet_medians(entries)
    panels = [panel for panel, wanted in (
        (_depth_panel, any(d.run is not None for e in entries for d in e.result.depths)),
        (_concurrency_panel, any(e.result.concurrency is not None for e in entries))) if wanted]
    widths = [max(4.0, 1.5 * max(map(len, groups.values())) + 2)] + [3.6] * len(panels)
    fig, axes = plt.subplots(len(groups), 1 + len(panels), squeeze=False,
                             figsize=(sum(widths), 3.9 * len(groups) + 0.8),
                             gridspec_kw={"width_ratios": widths})
    for r, (stack, rows) in enumerate(groups.items()):
        _decode_panel(axes[r, 0], stack, rows, fleet.get(stack, {}))
        for col, panel in enumerate(panels, 1):
            if not panel(axes[r, col], rows):
                axes[r, col].set_visible(False)
    handles: dict[str, Any] = {}  # each label once, from every panel
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", fontsize="x-small",
               ncol=min(4, len(handles)) or 1, frameon=False)
    rows_of_legend = -(-len(handles) // 4)
    fig.tight_layout(rect=(0, (0.1 + 0.16 * rows_of_legend) / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, None
