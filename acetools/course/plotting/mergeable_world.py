"""Figures of notebook 06: pure functions ``(ax, data, ...) -> ax`` on regime cards and the tables of
:mod:`acetools.course.mergeable_world`."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ...errors import InputError
from ...plotting import finish


def merges_vs_clip(ax, cards: Mapping, *, target: float = 10.0):
    """Task arithmetic, TSV-M and Iso-CTS (normalized) per recipe, CLIP ViT-B/32's dashed, each room above."""
    if not cards:
        raise InputError("merges_vs_clip needs at least one card")
    names = list(cards)
    x = np.arange(len(names))
    w = 0.27
    first = next(iter(cards.values())).to_frame().set_index("metric")
    for i, (m, lab) in enumerate((("ta_norm", "task arithmetic"), ("tsv_norm", "TSV-M"), ("iso_cts_norm", "Iso-CTS"))):
        vals = [cards[n].value(m) for n in names]
        ax.bar(x + (i - 1) * w, vals, w, label=lab, color=f"C{i}")
        c = float(first.loc[m, "clip"])
        if np.isfinite(c):
            ax.axhline(c, color=f"C{i}", ls="--", lw=1)
    for j, n in enumerate(names):
        room = cards[n].value("tsv_minus_ta")
        top = max(cards[n].value(m) for m in ("ta_norm", "tsv_norm", "iso_cts_norm"))
        ax.text(j, top + 1, f"room {room:.1f}", ha="center", fontsize=7, color="C3" if room >= target else "k")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("normalized test accuracy (%)")
    ax.set_ylim(0, 105)
    return finish(ax, "merges per recipe (dashed: CLIP ViT-B/32)", legend=True)


def room_budget(ax, budget: pd.DataFrame, *, title: str | None = None):
    """The two paths of ``room_budget`` (experts → intermediate → merge) as lines, each step's cost on it."""
    for i, (path, g) in enumerate(budget.groupby("path", sort=False)):
        xs = np.arange(len(g))
        ax.plot(xs, g["normalized"], marker="o", color=f"C{i}", label=path)
        for xx, (_, r) in zip(xs, g.iterrows()):
            if np.isfinite(r["cost"]):
                ax.annotate(f"−{r['cost']:.1f}" if r["cost"] >= 0 else f"+{-r['cost']:.1f}",
                            (xx, r["normalized"]), textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color=f"C{i}")
    ax.set_xticks([0, 1, 2], ["experts", "each task\n(alone / truncated)", "merged"])
    ax.set_ylabel("normalized test accuracy (%)")
    return finish(ax, title, legend=True)


def subspace_overlap(ax, cards: Mapping):
    """Per recipe: the overlap of tasks' top-k update subspaces (both sides), activations at W0, and chance."""
    names = list(cards)
    x = np.arange(len(names))
    keys = (("overlap_left", "τ output side"), ("overlap_right", "τ input side"), ("act_overlap", "activations at W0"),
            ("overlap_random", "random subspaces"))
    w = 0.2
    for i, (m, lab) in enumerate(keys):
        vals = []
        for n in names:
            try:
                vals.append(cards[n].value(m))
            except KeyError:
                vals.append(np.nan)
        ax.bar(x + (i - 1.5) * w, vals, w, label=lab, color="0.6" if m == "overlap_random" else f"C{i}")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("mean cos² of principal angles")
    ax.set_ylim(0, 1)
    return finish(ax, "do the tasks need the same directions?", legend=True)
