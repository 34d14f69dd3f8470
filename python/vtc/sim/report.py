"""Result tables and plots: how experiments show what they measured."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vtc.sim.engine import SimResult
from vtc.sim.metrics import tokens
from vtc.sim.workloads import Client


@dataclass
class Table:
    """A printed table and its machine-readable twin: ``rows`` keyed by ``columns``."""

    name: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def render(self) -> str:
        """The table as aligned text, with a title line."""
        cells = [[_fmt(col, row.get(col)) for col in self.columns] for row in self.rows]
        widths = [
            max([len(col)] + [len(r[k]) for r in cells]) for k, col in enumerate(self.columns)
        ]

        def line(values: Sequence[str]) -> str:
            return "  ".join(
                v.ljust(w) if k == 0 else v.rjust(w) for k, (v, w) in enumerate(zip(values, widths))
            ).rstrip()

        out = [self.title, line(self.columns), line(["-" * w for w in widths])]
        out += [line(r) for r in cells]
        return "\n".join(out)

    def records(self) -> list[dict[str, Any]]:
        """Rows for JSON: every column present, NaN as ``None``."""
        return [{col: _jsonable(row.get(col)) for col in self.columns} for row in self.rows]


@dataclass
class Panel:
    """One run to plot: cumulative service per client, with marked steps and a shaded span.

    With ``zoom=(lo, hi)`` only steps ``lo..hi`` are drawn, service counted from
    ``lo``; zoomed panels of one figure share their y range.  ``labels`` names
    clients in the legend (default ``client <id>``).
    """

    title: str
    result: SimResult
    marks: list[tuple[int, str]] = field(default_factory=list)
    shade: tuple[int, int, str] | None = None
    zoom: tuple[int, int] | None = None
    labels: dict[Client, str] = field(default_factory=dict)


@dataclass
class Report:
    """What an experiment produced."""

    tables: list[Table]
    panels: list[Panel]


def _fmt(col: str, v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return "/".join(f"{100 * x:.0f}" for x in v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if math.isnan(v):
        return "-"
    if col.endswith("share") or col == "admitted":
        return f"{100 * v:.1f}%"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, tuple):
        return list(v)
    return v


def write_json(tables: Sequence[Table], path: str | os.PathLike) -> None:
    """Write ``{table name: [row, ...]}`` for ``tables`` to ``path``."""
    with open(path, "w") as f:
        json.dump({t.name: t.records() for t in tables}, f, indent=2)
        f.write("\n")


PLOT_EXTRA_HINT = "plots need matplotlib: pip install 'vtc[sim]'"


def can_plot() -> bool:
    """Whether :func:`plot` can run: matplotlib comes with the ``sim`` extra."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(panels: Sequence[Panel], path: str | os.PathLike, title: str = "") -> None:
    """Write a PNG: one subplot per panel, cumulative weighted tokens per client over steps.

    Raises :class:`ImportError` naming the ``vtc[sim]`` extra when matplotlib is missing.
    """
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(PLOT_EXTRA_HINT) from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False, sharey=False
    )
    for ax, panel in zip(axes.flat, panels):
        res = panel.result
        lo, hi = panel.zoom or (0, res.steps)
        x = np.arange(lo, hi + 1)
        for c in res.clients:
            y = tokens(res, c)[lo : hi + 1]
            label = panel.labels.get(c, f"client {c}")
            ax.plot(x, (y - y[0]) / 1000, label=label, linewidth=1.4)
        if panel.shade is not None:
            lo, hi, label = panel.shade
            ax.axvspan(lo, hi, color="0.85", label=label)
        for step, label in panel.marks:
            ax.axvline(step, color="crimson", linestyle="--", linewidth=1.2, label=label)
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.set_ylabel(
            "service (k weighted tokens)"
            if panel.zoom
            else "cumulative service (k weighted tokens)"
        )
        ax.grid(True, alpha=0.3)
        if len(res.clients) <= 8:
            ax.legend(fontsize=8, loc="upper left")
    zoomed = [ax for ax, panel in zip(axes.flat, panels) if panel.zoom]
    if zoomed:
        top = max(ax.get_ylim()[1] for ax in zoomed)
        for ax in zoomed:
            ax.set_ylim(top=top)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
