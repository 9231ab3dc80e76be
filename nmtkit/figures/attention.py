"""Attention pictures (`nmtkit attention`): one PNG per sentence, a grid of heads of one layer.

Beside `curves.py` (training curves): both are matplotlib figures written atomically, and
matplotlib is the optional `plot` extra, imported only when a figure is drawn. The arrays
come from `nmtkit.forced.Attention`; this module knows no model.

The paper's appendix (Figures 3-5) shows single heads of encoder self-attention in layer 5 of 6
as a weight per (query, key) word pair; here each head is a heatmap of its weights (rows: the
queries, columns: the keys they attend to; 0 white, 1 dark), heads side by side on one color
scale so that they can be compared, every token labelled. Cells keep a fixed size, so a
60-token sentence gets a larger figure rather than unreadable labels.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nmtkit.errors import UserError
from nmtkit.io import atomic_write

CELL_IN = 0.16  # inches per token row/column: room for a 7-point label
MAX_COLS = 4  # heads per row of the grid (8 heads: 2 x 4, as the paper's base model has)


def import_pyplot():
    """matplotlib.pyplot on the Agg backend, or a one-line UserError naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("nmtkit attention needs matplotlib for PNG pictures: pip install -e '.[plot]' in the nmtkit checkout "
                        "(or --format json / npz)") from None
    return plt


def _save_png(plt, fig, out: str | os.PathLike) -> Path:
    """Write `fig` to the PNG `out` atomically (an interrupted run leaves no half picture) and
    close it, since pyplot keeps every open figure alive until closed; return the path."""
    out = Path(out)
    with atomic_write(out, "wb", encoding=None) as fh:
        fig.savefig(fh, format="png", dpi=100)
    plt.close(fig)
    return out


def _font_size(n: int) -> float:
    return 8.0 if n <= 30 else 7.0 if n <= 60 else 5.5


def draw_heads(weights: np.ndarray, rows: Sequence[str], cols: Sequence[str], heads: Sequence[int],
               title: str, out: str | os.PathLike, row_axis: str, col_axis: str) -> Path:
    """Write a grid of heatmaps, one per head, to the PNG `out` (atomically).

    weights: (len(heads), len(rows), len(cols)) in [0, 1]; heads: their 1-based numbers (panel
    titles); row_axis / col_axis: the axes' names (e.g. "target (queries)").
    """
    plt = import_pyplot()
    n = len(heads)
    ncols = min(MAX_COLS, n)
    nrows = math.ceil(n / ncols)
    fs = _font_size(max(len(rows), len(cols)))
    char_in = 0.65 * fs / 72  # a label character's width in inches, about
    longest = max((len(t) for t in rows), default=1), max((len(t) for t in cols), default=1)
    panel_w = max(2.5, CELL_IN * len(cols) + char_in * longest[0] + 0.6)  # + the row labels
    panel_h = max(2.5, CELL_IN * len(rows) + char_in * longest[1] + 0.9)  # + the rotated column labels
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_w * ncols + 1.0, panel_h * nrows + 0.9),
                             squeeze=False, constrained_layout=True)
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.axis("off")
            continue
        image = ax.imshow(weights[k], cmap="Blues", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
        ax.set_title(f"head {heads[k]}", fontsize=fs + 2)
        ax.set_xticks(range(len(cols)), labels=list(cols), rotation=90, fontsize=fs)
        ax.set_yticks(range(len(rows)), labels=list(rows), fontsize=fs)
        ax.tick_params(length=0)
        if k % ncols == 0:
            ax.set_ylabel(row_axis, fontsize=fs + 1)
        if k >= n - ncols:
            ax.set_xlabel(col_axis, fontsize=fs + 1)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(title, fontsize=11)
    return _save_png(plt, fig, out)


def draw_lines(weights: np.ndarray, rows: Sequence[str], cols: Sequence[str], heads: Sequence[int],
               title: str, out: str | os.PathLike, query: int | None = None, min_weight: float = 0.02) -> Path:
    """The paper's own drawing (Figures 3-5): the query tokens in a row on top, the key tokens in
    a row below, a line from each query to each key it attends to, one color per head, the
    line's opacity and width growing with the weight. `query`: draw only that row's lines (0-based;
    Figure 3 shows the word "making" alone). Weights under `min_weight` are not drawn.

    weights: (len(heads), len(rows), len(cols)); heads: their 1-based numbers (the legend). The
    paper shows one head, or two overlaid; `nmtkit attention --style lines` passes head 1 alone
    unless --heads names others, since every head's lines at once hardly read.
    """
    plt = import_pyplot()
    from matplotlib.lines import Line2D

    n = max(len(rows), len(cols))
    fig, ax = plt.subplots(figsize=(max(6.5, 0.26 * n + 1.5), 4.5), constrained_layout=True)
    fs = _font_size(n) + 1

    def xs(k: int) -> np.ndarray:  # both rows centred on the same axis
        return np.arange(k) + (n - k) / 2.0

    xr, xc = xs(len(rows)), xs(len(cols))
    colors = plt.get_cmap("tab10" if len(heads) <= 10 else "tab20")
    picked = range(len(rows)) if query is None else [query]
    for k in range(len(heads)):
        color = colors(k % colors.N)
        for r in picked:
            for c in np.flatnonzero(weights[k, r] >= min_weight):
                w = float(weights[k, r, c])
                ax.plot([xr[r], xc[c]], [1.0, 0.0], color=color, alpha=min(1.0, 0.2 + 0.8 * w),
                        linewidth=(1.0 if query is None else 2.0) + 2.5 * w, solid_capstyle="butt")
    for x, t in zip(xr, rows):
        bold = query is not None and x == xr[query]
        ax.text(x, 1.03, t, rotation=90, ha="center", va="bottom", fontsize=fs,
                fontweight="bold" if bold else "normal")
    for x, t in zip(xc, cols):
        ax.text(x, -0.03, t, rotation=90, ha="center", va="top", fontsize=fs)
    ax.set_xlim(-0.8, n - 0.2)
    ax.set_ylim(-0.9, 1.9)
    ax.axis("off")
    ax.legend(handles=[Line2D([0], [0], color=colors(k % colors.N), lw=2.5) for k in range(len(heads))],
              labels=[f"head {h}" for h in heads], loc="center left", bbox_to_anchor=(1.0, 0.5),
              fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    return _save_png(plt, fig, out)
