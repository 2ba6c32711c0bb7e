"""Theme, saver and generic plots shared by every notebook."""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import InputError
from ..utils import atomic_write
from ._versions import figure_record, track_drawing

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def set_theme(context: Literal["paper", "notebook", "talk", "poster"] = "notebook") -> None:
    """The course's one seaborn theme (white grid, colour-blind palette)."""
    import seaborn as sns

    sns.set_theme(context=context, style="whitegrid", palette="colorblind")


def new_axes(nrows: int = 1, ncols: int = 1, *, width: float = 5.0, height: float = 3.6, **kw):
    """A figure and its axes (squeezed), sized per panel; for notebooks and tests."""
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=True, **kw)


def _drawn_texts(fig) -> list:
    """The texts matplotlib draws (what its tight bbox measures): titles, axis labels, the drawn ticks'
    labels, texts, annotations and legends of every axes, and the figure's own."""
    out = []

    def legend_texts(leg):
        return [] if leg is None else [*leg.get_texts(), leg.get_title()]

    for ax in fig.get_axes():
        if not ax.get_visible():
            continue
        out += [ax.title, ax._left_title, ax._right_title, *ax.texts, *legend_texts(ax.get_legend())]
        for axis in (ax.xaxis, ax.yaxis):
            if not axis.get_visible():
                continue
            out += [axis.label, axis.offsetText]
            for tick in axis._update_ticks():
                out += [tick.label1, tick.label2]
    out += [*fig.texts, *legend_texts(fig.legends[0] if fig.legends else None)]
    sup = getattr(fig, "_suptitle", None)
    if sup is not None:
        out.append(sup)
    return out


def _text_extent(t, renderer):
    """The drawn box of text ``t`` (px); for an annotation the text alone, without its leader line."""
    from matplotlib.text import Annotation, Text

    if isinstance(t, Annotation):
        t.update_positions(renderer)
        return Text.get_window_extent(t, renderer)
    return t.get_window_extent(renderer)


def _text_quad(t, renderer) -> np.ndarray:
    """The drawn rectangle of text ``t`` as 4 corners (px), rotated as the text is (a rotated label's
    axis-aligned extent is much larger than its glyphs)."""
    bb = _text_extent(t, renderer)
    theta = np.deg2rad(t.get_rotation() % 180.0)
    if np.isclose(np.sin(2 * theta), 0.0, atol=1e-6):  # 0 or 90 degrees: the extent is the rectangle
        return np.array([[bb.x0, bb.y0], [bb.x1, bb.y0], [bb.x1, bb.y1], [bb.x0, bb.y1]])
    c, s_ = abs(np.cos(theta)), abs(np.sin(theta))
    W, H = bb.width, bb.height  # W = w c + h s, H = w s + h c: solve for the unrotated w, h
    det = c * c - s_ * s_
    if abs(det) < 1e-6:  # 45 degrees: w + h is known only; take the font's line height for h
        h = t.get_fontsize() * renderer.points_to_pixels(1.0) * 1.2
        w = max(W / max(c, 1e-9) - h, 0.0)
    else:
        w, h = (W * c - H * s_) / det, (H * c - W * s_) / det
        w, h = max(w, 0.0), max(h, 0.0)
    ctr = np.array([(bb.x0 + bb.x1) / 2, (bb.y0 + bb.y1) / 2])
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    corners = np.array([[-w / 2, -h / 2], [w / 2, -h / 2], [w / 2, h / 2], [-w / 2, h / 2]])
    return corners @ rot.T + ctr


def _quads_overlap(a: np.ndarray, b: np.ndarray, min_px: float) -> bool:
    """Whether two convex quadrilaterals overlap by more than ``min_px`` along every separating axis."""
    for q in (a, b):
        for i in range(4):
            edge = q[(i + 1) % 4] - q[i]
            n = np.array([-edge[1], edge[0]])
            norm = np.hypot(*n)
            if norm == 0:
                continue
            n = n / norm
            pa, pb = a @ n, b @ n
            if min(pa.max(), pb.max()) - max(pa.min(), pb.min()) <= min_px:
                return False
    return True


def _shown_texts(fig, renderer):
    """``(text, drawn box)`` of each visible, non-empty text of ``fig`` (:func:`_drawn_texts`), once each."""
    seen = set()
    for t in _drawn_texts(fig):
        if id(t) in seen or not t.get_visible() or not t.get_text().strip() or t.get_alpha() == 0:
            continue
        seen.add(id(t))
        try:
            bb = _text_extent(t, renderer)
        except (RuntimeError, ValueError):  # pragma: no cover - a text that cannot be laid out
            continue
        if bb.width > 0 and bb.height > 0:
            yield t, bb


def text_overlaps(fig, *, min_px: float = 2.0, min_font: float = 0.0) -> list[tuple[str, str]]:
    """Pairs of drawn texts of ``fig`` whose boxes overlap by more than ``min_px`` pixels both ways
    (crowded ticks, a label over a title); texts under ``min_font`` points are left out."""
    fig.canvas.draw()  # lay the figure out at its own size and dpi: extents from a stale draw mislead
    renderer = fig.canvas.get_renderer()
    boxes = [(t, _text_quad(t, renderer)) for t, _ in _shown_texts(fig, renderer) if t.get_fontsize() >= min_font]
    out = []
    for i in range(len(boxes)):
        ti, a = boxes[i]
        for tj, b in boxes[i + 1:]:
            if _quads_overlap(a, b, min_px):
                out.append((ti.get_text()[:40], tj.get_text()[:40]))
    return out


def save_figure(fig, name: str, folder: str | os.PathLike, *, dpi: int = 120, close: bool = False) -> Path:
    """Write ``fig`` to ``<folder>/<name>.png`` atomically (no timestamp: reruns give identical files).

    Where ``folder`` has a ``figures.json`` (the course's record) its entries become PNG text
    ``acetools:<key>``, the figure's overlapping texts (:func:`text_overlaps`) are listed there, and so is the
    code version it was drawn with (``figures[name]``: :func:`acetools.plotting._versions.figure_record`).
    """
    if not isinstance(name, str) or not _NAME.match(name) or name.endswith(".png"):
        raise InputError(f"figure name {name!r} must be a file stem of letters, digits and _.- (no extension)")
    path = Path(folder) / f"{name}.png"
    buf = io.BytesIO()
    manifest = Path(folder) / "figures.json"  # acetools_course.lesson_worlds.MANIFEST: notebook, profile, world
    m = json.loads(manifest.read_text()) if manifest.is_file() else None
    meta = {"Software": None} | {f"acetools:{k}": str(v) for k, v in sorted((m or {}).items())}
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata=meta)
    with atomic_write(path, "wb") as fh:
        fh.write(buf.getvalue())
    overlaps = text_overlaps(fig)
    if overlaps:
        import logging

        logging.getLogger("acetools.plotting").warning("figure %s: %d overlapping text pair(s), e.g. %r", name,
                                                       len(overlaps), overlaps[0])
    if m is not None:  # the course's record: the report checks fail on any overlap it lists
        old = m.pop("text_overlaps", {})
        got = {k: v for k, v in old.items() if k != name} | ({name: [list(o) for o in overlaps]} if overlaps else {})
        versions = m.get("figures", {}) | {name: figure_record(fig, set_theme)}  # the code version it was drawn with
        if got != old or versions != m.get("figures"):
            with atomic_write(manifest, "w") as fh:
                json.dump(m | {"figures": versions} | ({"text_overlaps": got} if got else {}), fh, indent=1,
                          sort_keys=True)
    if close:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return path


def label_points(ax, x, y, labels: Sequence[str], *, fontsize: float = 7, pad_px: float = 2.0) -> list:
    """Label each point ``(x[i], y[i])`` with ``labels[i]`` where it overprints no point, text or earlier
    label (greedy, deterministic): eight spots beside the point, then spots up to 90 points away with a
    leader line, else the first spot. Returns the annotations."""
    xs, ys = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    labels = [str(s) for s in labels]
    if not (len(xs) == len(ys) == len(labels)):
        raise InputError(f"label_points: {len(xs)} x, {len(ys)} y and {len(labels)} labels; give one of each per point")
    fig = ax.figure
    fig.canvas.draw()  # limits and sizes as they will be drawn: the extents below are measured in pixels
    renderer = fig.canvas.get_renderer()
    # (offset in points, horizontal alignment, vertical alignment): eight spots beside the point,
    # then a grid of spots further out (nearest first) that take a leader line
    near = [((4, 3), "left", "bottom"), ((4, -3), "left", "top"), ((-4, 3), "right", "bottom"),
            ((-4, -3), "right", "top"), ((0, 6), "center", "bottom"), ((0, -6), "center", "top"),
            ((7, 0), "left", "center"), ((-7, 0), "right", "center")]
    grid = [(dx, dy) for dx in range(-90, 91, 10) for dy in range(-64, 65, 8) if abs(dx) >= 10 or abs(dy) >= 16]
    grid.sort(key=lambda d: (np.hypot(d[0], 1.5 * d[1]), d))
    spots = near + [((dx, dy), "left" if dx > 0 else "right" if dx < 0 else "center", "center") for dx, dy in grid]
    inside = ax.get_window_extent(renderer)
    placed: list = []
    boxes = [bb for _, bb in _shown_texts(fig, renderer)]  # the texts already drawn are obstacles too
    from matplotlib.transforms import Bbox

    r = 4.0 * fig.dpi / 72.0  # the points themselves (a default marker's half-width) are obstacles too
    for px, py in ax.transData.transform(np.column_stack([xs, ys])):
        boxes.append(Bbox([[px - r, py - r], [px + r, py + r]]))
    for xi, yi, text in zip(xs, ys, labels):
        chosen = None
        for k, (off, ha, va) in enumerate(spots):
            far = k >= len(near)
            ann = ax.annotate(text, (xi, yi), textcoords="offset points", xytext=off, fontsize=fontsize,
                              ha=ha, va=va, arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "0.35"} if far else None)
            bb = _text_extent(ann, renderer).padded(pad_px)  # the text alone, not its leader line
            fits = inside.x0 <= bb.x0 and bb.x1 <= inside.x1 and inside.y0 <= bb.y0 and bb.y1 <= inside.y1
            if fits and not any(bb.overlaps(o) for o in boxes):
                chosen = (ann, bb)
                break
            ann.remove()
        if chosen is None:  # every spot collides: the nearest one, as before
            off, ha, va = spots[0]
            ann = ax.annotate(text, (xi, yi), textcoords="offset points", xytext=off, fontsize=fontsize, ha=ha, va=va)
            chosen = (ann, _text_extent(ann, renderer).padded(pad_px))
        placed.append(chosen[0])
        boxes.append(chosen[1])
    return placed


def finish(ax, title: str | None = None, *, legend: bool = False, fontsize: int = 7):
    """The common ending of every plotting function: a small legend and the ``title``; returns ``ax``."""
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
        cols = col_labels if col_labels is not None else labels
        data = pd.DataFrame(arr, index=None if labels is None else list(labels),
                            columns=None if cols is None else list(cols))
    annot = (data.size <= 400) if annot is None else annot
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
        rotation, fontsize = _tick_rotation(ax, len(vals))
        ax.set_xticks(pos, labels, rotation=rotation, ha="right" if rotation == 45 else "center",
                      rotation_mode="anchor" if rotation == 45 else "default", fontsize=fontsize)
        if ylabel:
            ax.set_ylabel(ylabel)
    return finish(ax, title)


def _tick_rotation(ax, n: int) -> tuple[int, float]:
    """Rotation and font size of ``n`` bar labels that keep neighbours apart: 45 degrees while a bar's
    width holds a line diagonally, else 90, with smaller type (down to 6 points) when needed."""
    import matplotlib as mpl
    from matplotlib.font_manager import FontProperties

    fig = ax.figure
    width_px = ax.get_position().width * fig.get_figwidth() * fig.dpi
    pitch = width_px / max(n, 1)  # pixels from one bar's label to the next
    size = float(FontProperties(size=mpl.rcParams["xtick.labelsize"]).get_size_in_points())
    line = 1.25 * size * fig.dpi / 72.0  # a line of text, in pixels, with its leading
    if pitch * np.sin(np.pi / 4) >= line:
        return 45, size
    if pitch >= line:
        return 90, size
    return 90, max(6.0, size * pitch / line)


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


track_drawing([sys.modules[__name__]])  # the shared plots note themselves on the figures they draw on
