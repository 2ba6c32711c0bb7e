"""Figures of notebooks 04 and 05: pure functions ``(ax, data, ...) -> ax`` on the tidy frames of
:mod:`acetools.results` (percentages)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ...errors import InputError
from ...merging import METHODS
from ...plotting import bar_plot, finish, heatmap, label_points
from ...results import DATA_DEPENDENT

#: One colour per verdict (05's table and bars).
VERDICT_COLORS: dict[str, str] = {
    "reproduced": "#4daf4a",
    "partly": "#ffbf00",
    "not reproduced": "#e41a1c",
    "undecidable here": "#80b1d3",
    "not testable here": "#999999",
    "not measured": "#ffffff",
}
_METRIC_LABEL = {
    "test_acc": "test accuracy (%)",
    "test_normalized": "normalized test accuracy (%)",
    "val_normalized": "normalized validation accuracy (%)",
    "merge_seconds": "merge time (s)",
    "normalized": "normalized accuracy (%)",
    "accuracy": "accuracy (%)",
}


def method_bars(ax, agg: pd.DataFrame, suite: str, *, metric: str = "test_normalized",
                highlight: Sequence[str] = ("ace", "esm"), references: bool = True):
    """Bars of ``metric`` per method on ``suite`` (mean over seeds, sd as error bars)."""
    d = agg[agg["suite"] == suite]
    if not references:
        d = d[d["kind"] == "method"]
    if d.empty:
        raise InputError(f"no rows for suite {suite!r}")
    sd = d.get(f"{metric}_sd", pd.Series(np.nan, index=d.index)).fillna(0.0).to_numpy()
    n = int(d["n_tasks"].iloc[0])
    bar_plot(ax, d[metric].to_numpy(), labels=d["method"].tolist(), errors=sd, highlight=highlight,
             ylabel=_METRIC_LABEL.get(metric, metric), title=f"{suite} (T={n}), {int(d['n_seeds'].max())} seed(s)")
    from matplotlib.container import BarContainer

    for c in ax.containers:
        if isinstance(c, BarContainer):
            ax.bar_label(c, fmt="%.1f", fontsize=6, padding=2)
    return ax


def per_task_heatmap(ax, matrix: pd.DataFrame, *, title: str | None = None, value: str = "normalized",
                     vmin: float | None = None, vmax: float | None = None):
    """Method × task heatmap of (normalized) accuracy, annotated with whole percentages."""
    heatmap(ax, matrix, title=title or _METRIC_LABEL.get(value, value), fmt=".0f", cmap="viridis",
            vmin=vmin, vmax=vmax)
    ax.set_xlabel("task")
    ax.set_ylabel("")
    return ax


def accuracy_vs_tasks(ax, agg: pd.DataFrame, *, metric: str = "test_normalized", methods: Sequence[str] | None = None,
                      highlight: Sequence[str] = ("ace", "esm"), references: bool = False, legend: bool = True):
    """``metric`` against the number of tasks, one line per method (sd over seeds as bars).
    ``legend``: draw the legend right of the axes (set False on all but the last panel of a
    row, so no legend covers a neighbour's axis label)."""
    d = agg if references else agg[agg["kind"] == "method"]
    if methods is not None:
        d = d[d["method"].isin(methods)]
    for i, (m, g) in enumerate(d.groupby("method", sort=False)):
        g = g.sort_values("n_tasks")
        err = g.get(f"{metric}_sd", pd.Series(np.nan, index=g.index)).fillna(0.0)
        strong = m in highlight
        ax.errorbar(g["n_tasks"], g[metric], yerr=err, marker="o", capsize=3, label=m,
                    lw=2.5 if strong else 1.2, color=f"C{i % 10}", zorder=3 if strong else 2)
    ax.set_xticks(sorted(d["n_tasks"].unique()))
    ax.set_xlabel("number of tasks T")
    ax.set_ylabel(_METRIC_LABEL.get(metric, metric))
    if legend:
        ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1.0), loc="upper left", borderaxespad=0.0)
    return ax


def merge_time(ax, agg: pd.DataFrame, *, methods: Sequence[str] | None = None,
               highlight: Sequence[str] = ("ace", "esm")):
    """Merge seconds against the number of tasks per method (log scale); where ``agg`` has
    ``inputs_seconds``, each data-dependent method's capture time is a dashed line in its colour."""
    ax = accuracy_vs_tasks(ax, agg, metric="merge_seconds", methods=methods, highlight=highlight, legend=False)
    if "inputs_seconds" in agg.columns:
        d = agg[agg["kind"] == "method"]
        if methods is not None:
            d = d[d["method"].isin(methods)]
        for i, (m, g) in enumerate(d.groupby("method", sort=False)):
            g = g.sort_values("n_tasks")
            if m in DATA_DEPENDENT and (g["inputs_seconds"].fillna(0) > 0).any():
                ax.plot(g["n_tasks"], g["inputs_seconds"], ls="--", marker="x", lw=1.2, color=f"C{i % 10}",
                        label=f"{m}: data capture (apart)")
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1.0), loc="upper left", borderaxespad=0.0)
    ax.set_title("merge time (one merge)" + (", data capture dashed" if "inputs_seconds" in agg.columns else ""))
    return ax


def wudi_step_size(ax, df: pd.DataFrame, *, value: str = "test_normalized", default_lr: float | None = None):
    """WUDI's accuracy against its Adam learning rate (log x), one line per suite and seed, task
    arithmetic at lambda = 1 dashed, ``default_lr`` marked. ``df``: :func:`acetools.results.load_wudi_step_size`."""
    if default_lr is None:
        default_lr = float(METHODS["wudi"].hparams["lr"])
    for i, ((suite, seed), d) in enumerate(df.groupby(["suite", "seed"], sort=False)):
        color = f"C{i % 10}"
        w = d[d["method"] == "wudi"].sort_values("lr")
        ax.plot(w["lr"], w[value], marker="o", color=color, label=f"{suite} seed {seed}: WUDI")
        start = d[d["method"] != "wudi"]
        if len(start):
            ax.axhline(float(start[value].iloc[0]), color=color, ls="--", lw=1,
                       label=f"{suite}: task arithmetic, lambda = 1 (WUDI's start)")
    ax.axvline(default_lr, color="0.4", ls=":", lw=1, label=f"default lr {default_lr:g}")
    ax.set_xscale("log")
    ax.set_xlabel("Adam learning rate (300 steps)")
    ax.set_ylabel({"test_normalized": "normalized test accuracy (%)",
                   "val_normalized": "normalized val accuracy (%)"}.get(value, value))
    return finish(ax, "WUDI: how far 300 Adam steps get", legend=True)


def rank_scatter(ax, ours: pd.Series | Mapping[str, float], paper: pd.Series | Mapping[str, float], *,
                 tau: float | None = None, title: str | None = None, ylabel: str = "ours: normalized test acc. (%)"):
    """Our score against the paper's for the methods both have, each point labelled;
    a rank agreement puts points on an increasing curve."""
    ours, paper = pd.Series(ours, dtype=float), pd.Series(paper, dtype=float)
    common = [m for m in paper.index if m in ours.index and np.isfinite(ours[m]) and np.isfinite(paper[m])]
    if not common:
        raise InputError("no method in common")
    x, y = paper[common].to_numpy(), ours[common].to_numpy()
    ax.scatter(x, y, color="C0", zorder=3)
    ax.margins(0.15)  # room for the labels of the points at the edges
    ax.set_xlabel(f"paper: {paper.name or 'accuracy (%)'}")
    ax.set_ylabel(ylabel)
    t = title or ""
    if tau is not None:
        t = f"{t}  Kendall τ = {tau:.2f}".strip()
    if t:
        ax.set_title(t, fontsize=9)
    label_points(ax, x, y, common, fontsize=7)
    return ax


def sweep_at(ax, traces: pd.DataFrame, alpha: float, *, method: str, value: str = "normalized"):
    """A method's validation sweep (precomputed search trace): each task's ``value`` and the
    mean against the coefficient, a marker line at ``alpha`` and the values there."""
    d = traces[traces["method"] == method]
    if d.empty:
        raise InputError(f"no search trace for {method!r}; have {sorted(traces['method'].unique())}")
    coef = d["coef_name"].iloc[0] or "coefficient"
    for task, g in d[d["task"] != "mean"].groupby("task", sort=False):
        g = g.sort_values("alpha")
        ax.plot(g["alpha"], g[value], lw=0.8, alpha=0.6, marker=".", label=str(task))
    m = d[d["task"] == "mean"].sort_values("alpha")
    ax.plot(m["alpha"], m[value], color="k", lw=2, marker="o", label="mean over tasks")
    best = m[m["is_best"]]
    if len(best):
        ax.scatter(best["alpha"], best[value], s=120, facecolors="none", edgecolors="C3", zorder=4,
                   label=f"chosen {coef} = {best['alpha'].iloc[0]:.3g}")
    ax.axvline(alpha, color="C3", ls="--", lw=1)
    at = m.loc[(m["alpha"] - alpha).abs().idxmin()]
    ax.set_title(f"{method}: {coef} = {alpha:.3g} → mean {value} {at[value]:.1f} %", fontsize=9)
    ax.set_xlabel(coef)
    ax.set_ylabel(f"validation {_METRIC_LABEL.get(value, value)}")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1.0), loc="upper left", borderaxespad=0.0)
    return ax


def task_bars(ax, scores: pd.DataFrame, task: str, *, highlight: Sequence[str] = ("ace", "esm"),
              ylabel: str = "normalized test accuracy (%)"):
    """Every method on one task (``scores`` from :func:`acetools.results.task_scores`)."""
    d = scores[scores["task"] == task]
    if d.empty:
        raise InputError(f"unknown task {task!r}; tasks: {list(dict.fromkeys(scores['task']))}")
    bar_plot(ax, d["mean"].to_numpy(), labels=d["method"].tolist(), errors=d["sd"].fillna(0.0).to_numpy(),
             highlight=highlight, ylabel=ylabel, title=f"task: {task}")
    return ax


def verdict_counts(ax, table: pd.DataFrame, *, by: str = "paper"):
    """Stacked bars: number of claims per verdict, one bar per value of ``by``."""
    counts = pd.crosstab(table[by], table["verdict"])
    order = [v for v in VERDICT_COLORS if v in counts.columns] + [v for v in counts.columns if v not in VERDICT_COLORS]
    counts = counts[order]
    bottom = np.zeros(len(counts))
    for v in order:
        ax.bar(counts.index.astype(str), counts[v], bottom=bottom, label=v,
               color=VERDICT_COLORS.get(v, "C7"), edgecolor="k", lw=0.5)
        bottom += counts[v].to_numpy()
    ax.set_ylabel("claims")
    if len(counts) > 1:  # long group names ("text (analogues) · ACE") overprint each other side by side
        ax.set_xticks(range(len(counts)), [str(i).replace(" · ", "\n") for i in counts.index], fontsize=8,
                      rotation=30, ha="right", rotation_mode="anchor")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside the bars, not on them
    return ax
