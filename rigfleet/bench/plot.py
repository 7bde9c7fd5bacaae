"""The bench's PNG: decode tok/s per host beside the fleet median, the stack's reference
figure and the host's own history, one panel per stack (matplotlib, ``rigfleet[plot]``).

    path, problem = plot(entries, Path("bench-reports/bench-20261201T101500Z.png"))
    problem      # None, or what to install when matplotlib is missing
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
COLORS = {"narrative": "#4878d0", "code": "#ee854a"}


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, or None when it is not installed."""
    try:
        mpl = importlib.import_module("matplotlib")
    except ImportError:
        return None
    mpl.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def plot(entries: Sequence[Entry], path: Path) -> tuple[Path | None, str | None]:
    """Draw ``entries`` to ``path``; (path, None), or (None, why not)."""
    plt = _pyplot()
    if plt is None:
        return None, INSTALL_HINT
    stacks = sorted({e.stack or "?" for e in entries})
    if not stacks:
        return None, "no PNG: nothing was measured"
    fleet = fleet_medians(entries)
    fig, axes = plt.subplots(len(stacks), 1, figsize=(max(6.0, 1.6 * len(entries) + 3), 3.6
                                                       * len(stacks)), squeeze=False)
    for ax, stack in zip(axes[:, 0], stacks, strict=True):
        rows = [e for e in entries if (e.stack or "?") == stack]
        width = 0.38
        for j, shape in enumerate(SHAPES):
            xs = [i + (j - 0.5) * width for i in range(len(rows))]
            values = [e.decode(shape) or 0.0 for e in rows]
            ax.bar(xs, values, width, color=COLORS[shape], label=f"{shape} (this bench)")
            for x, e in zip(xs, rows, strict=True):
                past = [v for h in e.history if (v := h.decode(shape)) is not None]
                if past:
                    ax.scatter([x] * len(past), past, marker="_", s=160, color="black",
                               zorder=3, label=f"{shape} history" if x == xs[0] else None)
            med = fleet.get(stack, {}).get(shape)
            if med:
                ax.axhline(med, color=COLORS[shape], linestyle="--", linewidth=1, zorder=4,
                           label=f"{shape} fleet median {med:.1f}")
            refs = {e.reference.get(shape) for e in rows} - {None}
            for ref in sorted(r for r in refs if r):
                ax.axhline(ref, color=COLORS[shape], linestyle=":", linewidth=1.5, zorder=4,
                           label=f"{shape} reference {ref:.1f}")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([e.host for e in rows])
        ax.set_ylabel("decode tok/s")
        ax.set_title(f"{stack}: decode tok/s per host")
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, None
