"""Theme, saver and generic plots shared by every notebook."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..utils import atomic_write

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def set_theme(context: str = "notebook") -> None:
    """The course's one seaborn theme (white grid, colour-blind palette)."""
    import seaborn as sns

    sns.set_theme(context=context, style="whitegrid", palette="colorblind")


def new_axes(nrows: int = 1, ncols: int = 1, *, width: float = 5.0, height: float = 3.6, **kw):
    """A figure and its axes (squeezed), sized per panel; for notebooks and tests."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=True, **kw)
    return fig, axes


def save_figure(fig, name: str, folder: str | os.PathLike, *, dpi: int = 120, close: bool = False) -> Path:
    """Write ``fig`` to ``<folder>/<name>.png`` atomically; return the path.

    ``name`` is a file stem (letters, digits, ``_.-``), so figure names stay deterministic.
    The PNG carries no timestamp or software tag, so reruns give identical files when the
    pixels are the same.
    """
    if not isinstance(name, str) or not _NAME.match(name) or name.endswith(".png"):
        raise InputError(f"figure name {name!r} must be a file stem of letters, digits and _.- (no extension)")
    path = Path(folder) / f"{name}.png"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    with atomic_write(path, "wb") as fh:
        fh.write(buf.getvalue())
    if close:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return path


def finish(ax, title: str | None = None, *, legend: bool = False, fontsize: int = 7):
    """The common ending of every plotting function: a small legend (``legend=True``) and
    the ``title`` if given; returns ``ax``."""
    if legend:
        ax.legend(fontsize=fontsize)
    if title:
        ax.set_title(title)
    return ax


def heatmap(ax, matrix, *, labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
            title: str | None = None, fmt: str = ".2f", annot: bool | None = None, cmap: str = "vlag",
            center: float | None = None, vmin: float | None = None, vmax: float | None = None, cbar: bool = True):
    """A labelled heatmap of a 2-D array or DataFrame (annotated when small)."""
    import pandas as pd
    import seaborn as sns

    if isinstance(matrix, pd.DataFrame):
        data = matrix
    else:
        arr = np.asarray(matrix, dtype=float)
        if arr.ndim != 2:
            raise InputError(f"heatmap needs a 2-D matrix, got shape {arr.shape}")
        data = pd.DataFrame(arr, index=labels, columns=col_labels if col_labels is not None else labels)
    if annot is None:
        annot = data.size <= 400
    sns.heatmap(data, ax=ax, annot=annot, fmt=fmt, cmap=cmap, center=center, vmin=vmin, vmax=vmax, cbar=cbar,
                annot_kws={"size": 7})
    return finish(ax, title)


def bar_plot(ax, values, *, labels: Sequence[str] | None = None, errors=None, title: str | None = None,
             ylabel: str | None = None, horizontal: bool = False, highlight: Sequence[str] = ()):
    """Bars of ``values`` (a mapping, Series or sequence) with optional error bars."""
    import pandas as pd

    if isinstance(values, dict):
        labels, vals = list(values), list(values.values())
    elif isinstance(values, pd.Series):
        labels, vals = [str(i) for i in values.index], values.to_list()
    else:
        vals = list(values)
        labels = list(labels) if labels is not None else [str(i) for i in range(len(vals))]
    colors = ["C3" if lab in highlight else "C0" for lab in labels]
    pos = np.arange(len(vals))
    if horizontal:
        ax.barh(pos, vals, xerr=errors, color=colors)
        ax.set_yticks(pos, labels)
        ax.invert_yaxis()
        if ylabel:
            ax.set_xlabel(ylabel)
    else:
        ax.bar(pos, vals, yerr=errors, color=colors)
        ax.set_xticks(pos, labels, rotation=45, ha="right")
        if ylabel:
            ax.set_ylabel(ylabel)
    return finish(ax, title)


def line_plot(ax, df, *, x: str, y: str, hue: str | None = None, title: str | None = None,
              xlabel: str | None = None, ylabel: str | None = None, logx: bool = False, logy: bool = False,
              marker: str = "o"):
    """Lines of ``y`` against ``x`` from a tidy DataFrame, one per ``hue`` value."""
    groups = [(None, df)] if hue is None else list(df.groupby(hue, sort=False))
    for key, g in groups:
        g = g.sort_values(x)
        ax.plot(g[x], g[y], marker=marker, label=None if key is None else str(key))
    if hue is not None:
        ax.legend(fontsize=8)
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or y)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    return finish(ax, title)
