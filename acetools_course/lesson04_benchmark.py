"""Lesson 04 (docs/course.md §04_benchmark): its data and tables. The result files are read by
:mod:`acetools.results`; which differences count and the claims' verdicts are this module's.

Figures of notebooks 04 and 05: pure functions ``(ax, data, ...) -> ax`` on the tidy frames of
:mod:`acetools.results` (percentages).

Notebook 04's claim verdicts: the benchmark claims (sota, growth with T, WUDI, cost, ordering)
and the mini-world's design targets (docs/course.md §Claim rules, §04_benchmark); the data they
read come from :func:`load_benchmark`."""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from acetools import results
from acetools.benchmark import ACE_SCALED_ROW, VARIANTS
from acetools.errors import InputError, InputKeyError
from acetools.merging import METHODS
from acetools.plotting import bar_plot, finish, heatmap, label_points, track_drawing
from acetools.results import DATA_DEPENDENT, REFERENCES, aggregate, rank_agreement, wide
from acetools.search import PATIENCE

from . import lesson_worlds as course
from . import paper_tables
from . import paper_tables as P
from .claims import PAPER_SETTINGS, paper_setting
from .paper_tables import ACE_CLAIMED_RANKS, paper_lead, paper_room, table_rivals
from .power import paired_rows
from .stats import PairedDifference
from .verdicts import (
    NOISE,
    UNDECIDABLE,
    Effect,
    Verdict,
    World,
    agreement,
    compare,
    criteria,
    effect,
    margin,
    threshold,
)

# ---- Experiments: the tables and runs -------------------------------------------------------------

def merge_time_table(agg: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """Seconds per merge, method × suite (means over seeds), and whether the data inputs were timed apart:
    then each data-dependent method gets ``"<method>: data capture"`` and ``"<method>: merge + capture"`` rows."""
    t = wide(agg, "merge_seconds")
    if "inputs_seconds" not in agg.columns:
        return t, False
    cap = wide(agg, "inputs_seconds")
    rows = []
    for m in t.index:
        rows.append(t.loc[[m]])
        c = cap.loc[m] if m in cap.index and m in DATA_DEPENDENT else None
        if c is not None and (c.fillna(0) > 0).any():
            rows.append(c.to_frame().T.rename(index={m: f"{m}: data capture"}))
            rows.append((t.loc[m] + c).to_frame().T.rename(index={m: f"{m}: merge + capture"}))
    out = pd.concat(rows)
    out.index.name = t.index.name
    return out, True


#: The methods the quick profile runs on the fixture world.
QUICK_METHODS: tuple[str, ...] = ("weight_averaging", "task_arithmetic", "tsv_m", "iso_cts", "cart", "wudi", "ace",
                                  "esm")


def suite_order(summary: pd.DataFrame, suites: Sequence[str] | None) -> list[str]:
    """The suites of ``summary`` by number of tasks (only ``suites`` where given)."""
    order = summary.drop_duplicates("suite").sort_values("n_tasks", kind="stable")["suite"].tolist()
    return order if suites is None else [s for s in suites if s in order]


@dataclass
class BenchmarkData:
    """What notebook 04 reads: the result files and the tables made from them (``paper_n``: suite -> the
    T of the paper column it is compared with; ``speed`` / ``step_size`` empty in the quick profile)."""

    world: str
    res_dir: Path
    size: str
    suites: list[str]
    main_suite: str
    runs: list
    summary: pd.DataFrame
    per_task: pd.DataFrame
    agg: pd.DataFrame
    n_tasks: dict[str, int]
    paper_n: dict[str, int]
    paper_cols: dict[tuple[str, str], pd.Series]
    methods: list[str]
    seeds: list[int]
    speed: pd.DataFrame
    step_size: pd.DataFrame


def load_benchmark(*, quick: bool, suites: Sequence[str], size: str, suite: str, seed: int, results_dir: str | Path,
                   figures_dir: str | Path, speed_dir: str | Path, wudi_dir: str | Path, recompute: bool = False,
                   device: str = "auto", world_options: dict | None = None) -> BenchmarkData:
    """Notebook 04's setup: read (or, with ``quick`` / ``recompute``, first write) the result files.

    Full profile: ``suites`` at ``size`` in ``results_dir``; quick: the fixture world as 2 and 3 tasks under
    ``<figures_dir>/results``; ``world_options`` selects the CLIP or a text world (docs/course.md §04_benchmark)."""
    options: dict[str, Any] = dict(world_options or {})
    text = bool(options) and course.is_text_world(str(options.get("kind", "")))
    if quick:
        res_dir = Path(figures_dir) / "results"
        zoo = course.world(quick=True, device=device, **(options if text else {}))
        run_size = zoo.size
        counts = (2, len(zoo.tasks))
        run_suites = [f"{'fixture' if text else 'tiny'}{n}" for n in counts]
        for name, n in zip(run_suites, counts):
            sub_bench = course.benchmark(results.prefix_world(zoo, n), quick=True, patience=PATIENCE)
            # on the text fixture (MiniLM's width) WUDI's 300 Adam steps are the slowest merge: the
            # smaller suite, there for the "more tasks" axis (ACE against task arithmetic), goes without
            methods = [m for m in QUICK_METHODS if not (text and n < len(zoo.tasks) and m == "wudi")]
            rows = sub_bench.run_all(methods, progress=False, extra=VARIANTS)
            sub_bench.save(rows, res_dir, f"{name}_{run_size}_seed{seed}")
        main_suite = run_suites[-1]
        kind = "fixture text world: its 3 small text tasks" if text else "fixture world: its 3 procedural tasks"
        world = (f"the quick profile's {kind} ({', '.join(zoo.tasks)}) "
                 f"at model size {run_size}, merged as the first 2 and all {len(zoo.tasks)} (suites "
                 f"{' and '.join(run_suites)}), expert seed {seed}; numbers for checking the code, not for reading")
    elif text:
        res_dir, run_size, main_suite, world = _text_files(str(options["kind"]), seed, results_dir, recompute)
        run_suites = [main_suite]
    else:  # the mini-world, or the CLIP world with world_options
        res_dir = Path(results_dir).expanduser().resolve()
        clip = bool(world_options)
        run_size, main_suite = ("clip-vit-b32", course.clip_suite(suite)) if clip else (size, suite)
        run_suites = list(dict.fromkeys(course.clip_suite(s) for s in suites)) if clip else list(suites)
        if recompute:
            for s in run_suites:
                full_bench = course.benchmark(course.world(s, size, seed=seed, device=device, **options),
                                              patience=PATIENCE)
                rows = full_bench.run_all(progress=True, extra={**ACE_SCALED_ROW, **VARIANTS})  # as mini_world.sh
                full_bench.save(rows, res_dir, f"{s}_{run_size}_seed{seed}")
        world = (f"the papers' CLIP ViT-B/32 with the public experts: suites {', '.join(run_suites)}, compared "
                 "with the papers' ViT-B/32 columns" if clip
                 else f"the mini-world: suites {', '.join(run_suites)} at model size {size}")
    runs = results.require_results(res_dir, run_suites, run_size)
    summary = results.load_summary(runs)
    agg = aggregate(summary)
    n_tasks = agg.drop_duplicates("suite").set_index("suite")["n_tasks"].to_dict()
    paper_n: dict[str, int] = dict(zip(run_suites, (8, 14, 20))) if quick else {s: n_tasks[s] for s in run_suites}
    paper_cols = {}
    for s in run_suites:
        for table in paper_tables.COMPARISONS:
            if world_options and not quick and not text:  # the papers' own backbone
                with contextlib.suppress(KeyError):  # a table may have no ViT-B/32 column at this many tasks
                    paper_cols[table, s] = paper_tables.paper_column(table, "ViT-B/32", paper_n[s])
            elif paper_n[s] in paper_tables.COMPARISONS[table]:
                paper_cols[table, s] = paper_tables.comparison_columns(table, paper_n[s])
    speed = pd.DataFrame() if quick else results.load_merge_speed(speed_dir)
    step_size = pd.DataFrame() if quick else results.load_wudi_step_size(wudi_dir, size=run_size)
    return BenchmarkData(
        world=world, res_dir=res_dir, size=run_size, suites=run_suites, main_suite=main_suite, runs=runs,
        summary=summary, per_task=results.load_per_task(runs), agg=agg, n_tasks=n_tasks, paper_n=paper_n,
        paper_cols=paper_cols, methods=[m for m in dict.fromkeys(summary["method"]) if m not in REFERENCES],
        seeds=sorted(int(k) for k in summary["seed"].unique()), speed=speed, step_size=step_size)


def _text_files(kind: str, seed: int, results_dir: str | Path, recompute: bool) -> tuple[Path, str, str, str]:
    """:func:`load_benchmark`'s full profile on a text world: ``(folder, size, suite, world sentence)``."""
    from acetools.world.text.world import TextWorld

    suite = course.text_suite(kind)
    if recompute:
        raise InputError(f"recompute=True on the text world: its benchmark has its own script, `python3 "
                         f"benchmarks/text_world.py bench --suite {suite} --seeds {seed}` (docs/text-world.md)")
    size = TextWorld(suite, seed).size  # the size in the result files' names
    return (Path(results_dir).expanduser().resolve(), size, suite,
            f"the text world: suite {suite} (all-MiniLM-L6-v2 experts on real offline text tasks), its benchmark "
            "compared with the papers' vision tables of as many tasks: analogues")


def rank_agreement_table(data: BenchmarkData) -> pd.DataFrame:
    """Kendall tau-b of our method ordering against every paper column a suite is compared with."""
    rows = []
    for (table, s), col in data.paper_cols.items():
        ours = method_means(data.agg, s)
        ra = rank_agreement(ours, col)
        rows.append({"suite": s, "table": table, "column": col.name, "n_methods": ra["n"], "tau": ra["tau"],
                     "p_value": ra["p_value"], "discordant pairs": ra["discordant"],
                     "paper order": " > ".join(ra["paper_order"]), "our order": " > ".join(ra["ours_order"])})
    return pd.DataFrame(rows)


def method_means(agg: pd.DataFrame, suite: str, metric: str = "test_normalized") -> pd.Series:
    """``metric`` of every merge method (no reference rows) on ``suite``, from :func:`aggregate`."""
    return agg[(agg["suite"] == suite) & (agg["kind"] == "method")].set_index("method")[metric]


def method_ranks(agg: pd.DataFrame, methods: Sequence[str] = ("ace", "esm"), *,
                 metric: str = "test_normalized") -> pd.DataFrame:
    """Per suite: the best method and its score, and the score and rank (1 = best) of each of ``methods``."""
    rows = []
    for s in suite_order(agg, None):
        a = method_means(agg, s, metric)
        if a.empty:
            continue
        row: dict[str, Any] = {"suite": s, "T": int(agg.loc[agg["suite"] == s, "n_tasks"].iloc[0]),
                               "methods": len(a), "best": str(a.idxmax()), "best score": float(a.max())}
        for m in methods:
            if m in a.index:
                row[f"{m} score"] = float(a[m])
                row[f"{m} rank"] = int((a > a[m]).sum()) + 1
        rows.append(row)
    return pd.DataFrame(rows)


def wudi_lr_summary(step_size: pd.DataFrame) -> pd.DataFrame:
    """Per (suite, seed) of WUDI's learning-rate study: the default lr, how far it moves the entries (RMS), its
    score, and the lr best on validation with its score."""
    default_lr = METHODS["wudi"].hparams["lr"]
    rows = []
    for (s, sd), d in step_size.groupby(["suite", "seed"], sort=False):
        w = d[d["method"] == "wudi"]
        if w.empty:
            continue
        dflt, tuned = w.loc[w["lr"].sub(default_lr).abs().idxmin()], w.loc[w["val_normalized"].idxmax()]
        rows.append({"suite": s, "seed": int(cast(int, sd)), "default lr": float(dflt["lr"]),
                     "RMS start": float(dflt.get("rms_start", math.nan)),
                     "RMS move": float(dflt.get("rms_move", math.nan)), "default score": float(dflt["test_normalized"]),
                     "best lr on val": float(tuned["lr"]), "its score": float(tuned["test_normalized"])})
    return pd.DataFrame(rows)


# ---- Figures: the lesson's plots, drawn on a given axes -------------------------------------------

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


# ---- Verdicts: the lesson's claims, judged --------------------------------------------------------

#: ``(suite, a, b)`` -> the rows' paired bootstrap over test examples and seeds, None where the result
#: files have no per-example results (:func:`acetools_course.power.paired_rows` bound to the runs).
Pairs = Callable[[str, str, str], "PairedDifference | None"]


def paired_difference(summary: pd.DataFrame, suite: str, a: str, b: str, metric: str = "test_normalized",
                      floor: float = NOISE, pairs: Pairs | None = None) -> dict[str, Any]:
    """``a - b`` on ``suite``: per-seed differences on the seeds both have, their mean, the margin and
    the outcome ``"better"`` / ``"tie"`` / ``"worse"`` (``|mean| <= margin`` is a tie). The margin is
    ``max(floor, 1.96 se)`` with ``pairs``' paired bootstrap standard error, ``max(floor, sd over
    seeds)`` without per-example results (``margin_source`` says which; docs/course.md §Margin, power
    and rivals). ``summary.attrs["rows"]`` maps a row standing in for another to its own name."""
    d = summary[summary["suite"] == suite].pivot_table(index="seed", columns="method", values=metric)
    for m in (a, b):
        if m not in d.columns:
            raise InputKeyError(f"no method {m!r} on suite {suite!r}; methods: {sorted(d.columns)}")
    diffs = (d[a] - d[b]).dropna()
    if diffs.empty:
        raise InputError(f"{a} and {b} share no seed on {suite}")
    sd = float(diffs.std(ddof=1)) if len(diffs) > 1 else math.nan
    mean = float(diffs.mean())
    rows = summary.attrs.get("rows", {})
    pb = None if pairs is None else pairs(suite, rows.get(a, a), rows.get(b, b))
    se = None if pb is None else pb.se
    return {"suite": suite, "a": a, "b": b, "diff": mean, "sd": sd, "margin": margin(sd, floor, se=se),
            "n_seeds": len(diffs), "outcome": compare(mean, sd, floor, se=se),
            "per_seed": {int(k): float(v) for k, v in diffs.items()}, "se": se,
            "interval": None if pb is None else [pb.low, pb.high],
            "margin_source": "seeds" if pb is None else "paired bootstrap"}


def data_free_methods(methods: Iterable[str]) -> list[str]:
    """The merge methods among ``methods`` that use nothing but the weights (no references,
    nothing in :data:`DATA_DEPENDENT`)."""
    return [m for m in methods if m not in REFERENCES and m.split(" ")[0] not in DATA_DEPENDENT]


def _best(summary: pd.DataFrame, suite: str, methods: Sequence[str], metric: str) -> str:
    means = summary[(summary["suite"] == suite) & summary["method"].isin(methods)].groupby("method")[metric].mean()
    if means.empty:
        raise InputError(f"none of {list(methods)} ran on {suite}")
    return str(means.idxmax())


#: Per suite of ours: (the paper's effect, the paper's room) in the column it is compared with.
PaperSettings = Mapping[str, tuple[float, float]]


def _effect_for(r: dict[str, Any], paper: PaperSettings | None, world: World | None, n_tasks: int, floor: float,
                headroom: float | None = None) -> Effect:
    """One suite's :class:`~acetools_course.verdicts.Effect` from its :func:`paired_difference` ``r``: with ``paper``
    and ``world`` the paper's effect at that suite is scaled by the world's room at ``n_tasks`` and capped
    at ``headroom``."""
    suite, kw = r["suite"], {"spread": r["sd"], "noise": floor, "se": r.get("se"), "seeds": r.get("n_seeds")}
    if paper is not None and suite in paper and world is not None:
        pe, proom = paper[suite]
        return effect(suite, r["diff"], paper=pe, paper_room=proom, world_room=world.room_at(n_tasks),
                      headroom=headroom, **kw)
    return effect(suite, r["diff"], **kw)


def competing_rivals(summary: pd.DataFrame, suite: str, rivals: Sequence[str],
                     metric: str) -> tuple[list[str], list[str]]:
    """``rivals`` split into those that may judge and those at or below weight averaging on ``suite``
    (docs/course.md §Margin, power and rivals): such a row is not the method its name says (plain
    ``cart`` on BERT is weight averaging) or no competitor. Weight averaging itself stays."""
    means = summary[summary["suite"] == suite].groupby("method")[metric].mean()
    if "weight_averaging" not in means.index:
        return list(rivals), []
    wa = float(means["weight_averaging"])
    out = [r for r in rivals if r != "weight_averaging" and float(means.get(r, math.inf)) <= wa + 1e-9]
    return [r for r in rivals if r not in out], out


def _headroom(summary: pd.DataFrame, suite: str, rival: str, metric: str) -> float | None:
    """The experts' level minus ``rival``'s on ``suite`` (100 minus it in normalized points)."""
    means = summary[summary["suite"] == suite].groupby("method")[metric].mean()
    top = means.get("experts (individual)", 100.0 if "normalized" in metric else None)
    return None if top is None else float(top) - float(means[rival])


def _n_tasks(summary: pd.DataFrame, suite: str) -> int:
    return int(summary.loc[summary["suite"] == suite, "n_tasks"].iloc[0])


def assess_beats(summary: pd.DataFrame, winner: str, rivals: Sequence[str], *, suites: Sequence[str] | None = None,
                 metric: str = "test_normalized", floor: float = NOISE, paper: PaperSettings | None = None,
                 world: World | None = None, shown: Sequence[str] = (), pairs: Pairs | None = None) -> Verdict:
    """Does ``winner`` beat every one of ``rivals`` (the paper's own table) on every suite? ace.sota and
    esm.sota (rule: docs/course.md §Claim rules).

    Per suite, the best rival by mean that competes (above weight averaging) is compared through
    :func:`paired_difference` (``pairs``: per-example results). ``shown``: other rivals, reported, never
    judged. ``paper`` = {suite: (lead, room)} with ``world`` scales the lead, capped at the headroom
    above the rival (docs/course.md §Scaling rule); suites whose prediction is below twice the margin
    are undecidable (docs/course.md §Margin, power and rivals)."""
    rows, effects, left = [], [], {}
    for s in suite_order(summary, suites):
        present = set(summary.loc[summary["suite"] == s, "method"])
        if winner not in present:
            continue
        rv, out = competing_rivals(summary, s, [r for r in rivals if r in present and r != winner], metric)
        if out:
            left[s] = out
        if not rv:
            continue
        best = _best(summary, s, rv, metric)
        r = paired_difference(summary, s, winner, best, metric, floor, pairs)
        extra = [m for m in shown if m in present and m != winner and m not in rivals]
        if extra:
            xb = _best(summary, s, extra, metric)
            xd = paired_difference(summary, s, winner, xb, metric, floor, pairs)
            r["shown"] = {k: xd[k] for k in ("b", "diff", "outcome")}
        rows.append(r)
        effects.append(_effect_for(r, paper, world, _n_tasks(summary, s), floor, _headroom(summary, s, best, metric)))
    if not rows:
        raise InputError(f"{winner} and none of {list(rivals)} ran together on any suite"
                         + (f" above weight averaging (left out: {left})" if left else ""))
    dec = [(r, e) for r, e in zip(rows, effects) if e.decidable]
    undecided = [e for e in effects if not e.decidable]
    note = ("; undecidable: " + ", ".join(f"{e.setting} (predicted {e.predicted:+.2f}, needs ≥ {e.needed:.2f})"
                                          for e in undecided)) if undecided else ""
    if not dec:
        verdict = UNDECIDABLE
        why = (f"the paper's lead, scaled to this world's room, is below twice the margin on every suite"
               f"{note}")
    else:
        wins = sum(r["outcome"] == "better" for r, _ in dec)
        not_worse = sum(r["outcome"] != "worse" for r, _ in dec)
        n = len(dec)
        if wins == n:
            verdict = "reproduced"
            why = f"better than the paper's best rival beyond the margin on all {n} decidable suites"
        elif 2 * not_worse >= n:
            verdict = "partly"
            why = f"better on {wins}, within the margin on {not_worse - wins} of {n} decidable suites"
        else:
            verdict = "not reproduced"
            why = f"beaten beyond the margin on {n - not_worse} of {n} decidable suites"
        why += note
    why += f"; rivals: the paper's table ({', '.join(rivals)})"
    if left:
        why += "; left out, at or below weight averaging: " + ", ".join(f"{', '.join(v)} on {k}"
                                                                          for k, v in left.items())
    if any("shown" in r for r in rows):
        why += "; other rivals shown, not judged"

    def one(r: dict[str, Any]) -> str:
        txt = f"{r['suite']}: {winner} {r['diff']:+.1f} ± {r['margin']:.1f} vs {r['b']} ({r['outcome']})"
        if "shown" in r:
            txt += f" [not judged: {r['shown']['diff']:+.1f} vs {r['shown']['b']}]"
        return txt

    return Verdict("; ".join(one(r) for r in rows), verdict, why,
                   {"metric": metric, "comparisons": rows, "rivals": list(rivals), "shown": list(shown),
                    "left_out": left}, effects)


def assess_grows(summary: pd.DataFrame, method: str, rivals: Sequence[str], *, suites: Sequence[str] | None = None,
                 metric: str = "test_normalized", floor: float = NOISE, paper: tuple[float, float] | None = None,
                 world: World | None = None) -> Verdict:
    """Does ``method``'s lead over the best of ``rivals`` grow with the number of tasks? ace.grows (rule
    and why the rival is task arithmetic, :data:`GROWS_RIVALS`: docs/course.md §Claim rules).

    ``paper`` = (the paper's growth of the gap, its room at the most tasks) with ``world`` predicts the
    growth (docs/course.md §Scaling rule); a deficit that narrows is no lead that grows (``partly``)."""
    gaps = []
    for s in suite_order(summary, suites):
        present = set(summary.loc[summary["suite"] == s, "method"])
        rv = [r for r in rivals if r in present and r != method]
        if method in present and rv:
            gaps.append(paired_difference(summary, s, method, _best(summary, s, rv, metric), metric, floor))
    if len(gaps) < 2:
        raise InputError(f"need {method} and a rival on at least two suites, got {len(gaps)}")

    def change(g0, g1) -> tuple[float, float]:
        seeds = sorted(set(g0["per_seed"]) & set(g1["per_seed"]))
        if len(seeds) > 1:
            ch = np.array([g1["per_seed"][k] - g0["per_seed"][k] for k in seeds])
            return float(g1["diff"] - g0["diff"]), max(floor, float(ch.std(ddof=1)))
        sds = [g["sd"] for g in (g0, g1) if np.isfinite(g["sd"])]
        return float(g1["diff"] - g0["diff"]), max(floor, math.sqrt(sum(v * v for v in sds)) if sds else 0.0)

    total, total_margin = change(gaps[0], gaps[-1])
    steps = [change(a, b) for a, b in zip(gaps[:-1], gaps[1:])]
    monotone = all(d >= -m for d, m in steps)
    n_of = {g["suite"]: _n_tasks(summary, g["suite"]) for g in gaps}
    leads = gaps[-1]["diff"] > 0
    ahead_at = [f"T={n_of[g['suite']]}" for g in gaps if g["diff"] > 0]
    setting = f"{gaps[0]['suite']}→{gaps[-1]['suite']}"
    if paper is not None and world is not None:
        eff = effect(setting, total, paper=paper[0], paper_room=paper[1],
                     world_room=world.room_at(n_of[gaps[-1]["suite"]]), noise=total_margin)
    else:
        eff = effect(setting, total, noise=total_margin)
    rival = rivals[0] if len(rivals) == 1 else "the best rival"
    if not eff.decidable:
        verdict = UNDECIDABLE
        why = (f"the paper's growth of the gap, scaled to this world's room, predicts {eff.predicted:+.2f} here, "
               f"below {eff.needed:.2f}, twice the floor {eff.floor:.2f} of the change; measured {total:+.1f}")
    elif total > total_margin and monotone and leads:
        verdict = "reproduced"
        why = f"the lead over {rival} grows by {total:+.1f} (> {total_margin:.1f}) from the fewest to the most tasks"
    elif total > 0 and not leads:
        verdict = "partly"
        why = (f"the gap to {rival} changes by {total:+.1f} from the fewest to the most tasks, but {method} is "
               f"behind {rival} at the most tasks ({gaps[-1]['diff']:+.1f}"
               + (f"; ahead only at {', '.join(ahead_at)}" if ahead_at else "; never ahead") + ")")
    elif total > 0:
        verdict = "partly"
        why = (f"the lead over {rival} grows by {total:+.1f} overall"
               + ("" if total > total_margin else f", within the spread {total_margin:.1f}")
               + ("" if monotone else ", not monotonically"))
    else:
        verdict, why = "not reproduced", f"the gap to {rival} changes by {total:+.1f} from the fewest to the most tasks"
    measured = ", ".join(f"T={n_of[g['suite']]}: {g['diff']:+.1f} vs {g['b']}" for g in gaps)
    whom = f"{rivals[0]}" if len(rivals) == 1 else "best other"
    return Verdict(f"{method} minus {whom}: {measured}", verdict, why,
                   {"metric": metric, "gaps": gaps, "change": total, "change_margin": total_margin}, (eff,))


def _time_ratio(agg: pd.DataFrame, suite: str, a: str, b: str) -> float:
    t = agg[agg["suite"] == suite].set_index("method")["merge_seconds"]
    return float(t[a] / t[b])


#: WUDI with its step size chosen on validation (the text bench's row): the rival where the files have it.
TUNED_WUDI_ROW: str = "wudi (lr on val)"


def assess_vs_wudi(summary: pd.DataFrame, *, method: str = "ace", rival: str | None = None,
                   suites: Sequence[str] | None = None, metric: str = "test_normalized",
                   floor: float = NOISE, step_size: pd.DataFrame | None = None, pairs: Pairs | None = None) -> Verdict:
    """ace.vs_wudi (rule: docs/course.md §Claim rules): cheaper, stable (two or more seeds) and not worse
    than WUDI (``rival``; default, per suite, :data:`TUNED_WUDI_ROW` where the suite has it, else ``"wudi"``)
    on every suite with both, paired by example where ``pairs`` finds per-example results
    (:func:`paired_difference`). ``step_size`` (:func:`load_wudi_step_size`): WUDI at several learning
    rates, shown beside, not judged."""
    agg = aggregate(summary)
    rows = []
    for s in suite_order(summary, suites):
        present = set(summary.loc[summary["suite"] == s, "method"])
        r_s = rival or (TUNED_WUDI_ROW if TUNED_WUDI_ROW in present else "wudi")
        if {method, r_s} <= present:
            cmp = paired_difference(summary, s, method, r_s, metric, floor, pairs=pairs)
            a = agg[agg["suite"] == s].set_index("method")
            rows.append({"suite": s, "rival": r_s, "diff": cmp["diff"], "margin": cmp["margin"],
                         "se": cmp["se"], "outcome": cmp["outcome"],
                         "competes": bool(competing_rivals(summary, s, [r_s], metric)[0]),
                         "time_ratio": _time_ratio(agg, s, method, r_s),
                         "sd": float(a.loc[method, f"{metric}_sd"]), "sd_rival": float(a.loc[r_s, f"{metric}_sd"])})
    if not rows:
        raise InputError(f"{method} and {rival or 'wudi'} never ran on the same suite")
    # a WUDI row at or below weight averaging is no competitor (docs/course.md §Margin, power and rivals)
    judged = [r for r in rows if r["competes"]]
    crit = {"not worse": all(r["outcome"] != "worse" for r in judged)} if judged else {}
    crit["cheaper"] = all(r["time_ratio"] < 1 for r in rows)
    if all(np.isfinite(r["sd"]) and np.isfinite(r["sd_rival"]) for r in rows):
        crit["stable"] = all(r["sd"] <= r["sd_rival"] + floor for r in rows)
    tuned = _tuned_wudi(summary, step_size, method, metric) if step_size is not None and len(step_size) else []
    met, verdict = criteria(crit)
    why = (f"met: {', '.join(met) or 'none'}; missed: {', '.join(k for k, v in crit.items() if not v) or 'none'}"
           + ("" if "stable" in crit else " (stability needs two or more seeds)")
           + ("" if len(judged) == len(rows) else "; accuracy not judged where WUDI is at or below weight averaging: "
              + ", ".join(r["suite"] for r in rows if not r["competes"]))
           + ("; WUDI at its validation-chosen learning rate shown, not judged" if tuned else ""))
    measured = "; ".join(f"{r['suite']}: {r['diff']:+.1f} ± {r['margin']:.1f} points vs {r['rival']}, "
                         f"time ×{r['time_ratio']:.2f}"
                         + (f", sd {r['sd']:.1f} vs {r['sd_rival']:.1f}" if np.isfinite(r["sd"]) else "") for r in rows)
    if tuned:
        measured += "; not judged, WUDI's Adam learning rate chosen on val: " + "; ".join(
            f"{t['suite']} seed {t['seed']}: lr {t['lr']:g} gives {t['tuned']:.1f} (range over lr "
            f"{t['lo']:.1f}–{t['hi']:.1f}), {method} {t['ours']:.1f} ({t['diff']:+.1f})" for t in tuned)
    effects = [effect(r["suite"], r["diff"], noise=r["margin"], se=r["se"]) for r in rows]
    return Verdict(f"{method} vs WUDI: {measured}", verdict, why,
                   {"criteria": crit, "rows": rows, "tuned_wudi": tuned}, effects)


def _tuned_wudi(summary: pd.DataFrame, step_size: pd.DataFrame, method: str, metric: str) -> list[dict[str, Any]]:
    """Per (suite, seed) of the step-size study that ``summary`` also has for ``method``:
    WUDI at the learning rate with the best validation accuracy against ``method``."""
    out = []
    w = step_size[step_size["method"] == "wudi"]
    for (suite, seed), d in w.groupby(["suite", "seed"], sort=False):
        ours = summary[(summary["suite"] == suite) & (summary["seed"] == seed) & (summary["method"] == method)]
        if ours.empty or d.empty:
            continue
        best = d.loc[d["val_normalized"].idxmax()]
        o = float(ours[metric].iloc[0])
        out.append({"suite": suite, "seed": int(seed), "lr": float(best["lr"]), "tuned": float(best[metric]),
                    "lo": float(d[metric].min()), "hi": float(d[metric].max()), "ours": o,
                    "diff": o - float(best[metric])})
    return out


def _time_rows(summary: pd.DataFrame, method: str, ref: str, suites: Sequence[str] | None) -> list[dict[str, Any]]:
    """Per suite with both: mean merge seconds of ``method`` and ``ref``, their ratio, and
    ``method``'s data-input seconds (NaN in result files that predate ``inputs_seconds``)."""
    agg = aggregate(summary)
    rows = []
    for s in suite_order(summary, suites):
        a = agg[agg["suite"] == s].set_index("method")
        if method in a.index and ref in a.index:
            rows.append({"suite": s, "n_tasks": int(a["n_tasks"].iloc[0]),
                         "seconds": float(a.loc[method, "merge_seconds"]),
                         "seconds_ref": float(a.loc[ref, "merge_seconds"]), "ratio": _time_ratio(agg, s, method, ref),
                         "inputs_seconds": float(a.loc[method, "inputs_seconds"]) if "inputs_seconds" in a
                         else math.nan})
    if not rows:
        raise InputError(f"{method} and {ref} never ran on the same suite")
    return rows


def _loglog_slope(n_tasks: Sequence[float], seconds: Sequence[float]) -> float:
    x, y = np.log(np.asarray(n_tasks, float)), np.log(np.asarray(seconds, float))
    return float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 and np.ptp(x) > 0 else math.nan


def assess_cost(summary: pd.DataFrame, *, method: str = "ace", svd_method: str = "tsv_m",
                suites: Sequence[str] | None = None, max_ratio: float = 2.0, max_slope: float = 1.5) -> Verdict:
    """ace.cost (rule: docs/course.md §Claim rules): merge time at most ``max_ratio`` × ``svd_method``'s
    on every suite, and the log-log slope against T at most ``max_slope``."""
    rows = _time_rows(summary, method, svd_method, suites)
    slope = _loglog_slope([r["n_tasks"] for r in rows], [r["seconds"] for r in rows])
    crit = {"matching": all(r["ratio"] <= max_ratio for r in rows)}
    if np.isfinite(slope):
        crit["linear in T"] = slope <= max_slope
    met, verdict = criteria(crit)
    yes = {True: "yes", False: "no"}
    why = (f"time ratio ≤ {max_ratio} on every suite: {yes[crit['matching']]}"
           + (f"; log-log slope {slope:.2f} (≤ {max_slope}: {yes[crit['linear in T']]})" if "linear in T" in crit
              else "; one suite: no slope"))
    measured = ", ".join(f"T={r['n_tasks']}: {r['seconds']:.3g} s vs {r['seconds_ref']:.3g} s (×{r['ratio']:.2f})"
                         for r in rows)
    return Verdict(f"merge time {method} vs {svd_method}: {measured}", verdict, why,
                   {"rows": rows, "slope": slope, "criteria": crit}, value=max(r["ratio"] for r in rows))


def assess_overhead(summary: pd.DataFrame, *, method: str = "esm", ref: str = "tsv_m",
                    suites: Sequence[str] | None = None, small: float = 3.0, large: float = 10.0) -> Verdict:
    """esm.overhead (rule: docs/course.md §Claim rules): ``method``'s merge-time ratio over ``ref`` per
    suite (``small`` / ``large``). ESM's proxy capture (``inputs_seconds``) is reported beside the ratio;
    files without it include half the capture in ESM's merge time, and the reason says so."""
    rows = _time_rows(summary, method, ref, suites)
    worst = max(r["ratio"] for r in rows)
    verdict = threshold(worst, small, large, higher=False)
    why = {"reproduced": f"at most ×{worst:.2f} the time of {ref} (≤ ×{small:g})",
           "partly": f"up to ×{worst:.2f} the time of {ref}: same order, above ×{small:g}",
           "not reproduced": f"up to ×{worst:.2f} the time of {ref} (> ×{large:g})"}[verdict]
    timed_apart = all(np.isfinite(r["inputs_seconds"]) for r in rows)
    with_capture = max((r["seconds"] + r["inputs_seconds"]) / r["seconds_ref"] for r in rows) if timed_apart \
        else math.nan
    if timed_apart:
        why += f"; merge time without the data capture, which is timed apart (with it: up to ×{with_capture:.2f})"
        measured = ", ".join(f"T={r['n_tasks']}: {r['seconds']:.3g} s (+ {r['inputs_seconds']:.3g} s capture) vs "
                             f"{r['seconds_ref']:.3g} s" for r in rows)
    else:
        why += "; these result files do not time the data capture apart: the merge time includes half of it"
        measured = ", ".join(f"T={r['n_tasks']}: {r['seconds']:.3g} s vs {r['seconds_ref']:.3g} s" for r in rows)
    return Verdict(f"merge time {method} vs {ref}: {measured}", verdict, why,
                   {"rows": rows, "worst_ratio": worst, "capture_timed_apart": timed_apart,
                    "worst_ratio_with_capture": with_capture}, value=worst)


def tau_floor(paper: pd.Series, *, alpha: float = 0.05) -> float:
    """The Kendall tau-b an ordering of ``len(paper)`` methods must reach to differ from a random one at
    level ``alpha`` (ties in ``paper`` kept): by enumeration up to 8 methods, normal approximation above."""
    from itertools import permutations

    from acetools.results import kendall_tau

    y = np.asarray(pd.Series(paper, dtype=float).dropna().to_numpy())
    n = len(y)
    if n < 3:
        return math.inf
    if n > 8:
        return float(2.0 * math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1))))  # z(0.975) ≈ 2 on tau's null sd
    taus = np.array([kendall_tau(np.asarray(p_, float), y) for p_ in permutations(range(n))])
    # the smallest tau whose upper tail (tau >= t) has probability at most alpha
    for t in np.unique(np.round(taus, 12)):
        if np.mean(taus >= t - 1e-12) <= alpha:
            return float(t)
    return math.inf  # pragma: no cover - no tau is that rare (alpha below 1/n!)


def assess_ordering(summary: pd.DataFrame, paper: Mapping[int, pd.Series] | pd.Series, *,
                    suites: Sequence[str] | None = None, metric: str = "test_normalized",
                    paper_tau: float | None = None, alpha: float = 0.05) -> Verdict:
    """ace.ordering (rule: docs/course.md §Claim rules): Kendall tau-b of our ordering against ``paper``
    (a Series, or ``{n_tasks: Series}``) per suite, against :func:`tau_floor`; tau per seed beside.
    ``paper_tau``: the paper's own table against the claimed order, recorded as the predicted effect."""
    rows = []
    for s in suite_order(summary, suites):
        d = summary[summary["suite"] == s]
        n = int(d["n_tasks"].iloc[0])
        ref = paper if isinstance(paper, pd.Series) else paper.get(n)
        if ref is None:
            continue
        ours = d.groupby("method")[metric].mean()
        ra = rank_agreement(ours, ref)
        per_seed = [rank_agreement(g.set_index("method")[metric], ref)["tau"] for _, g in d.groupby("seed")]
        floor = tau_floor(pd.Series(ref)[ra["methods"]], alpha=alpha)
        rows.append({"suite": s, "n_tasks": n, **ra, "tau_per_seed": per_seed, "floor": floor})
    rows = [r for r in rows if np.isfinite(r["tau"])]
    if not rows:
        raise InputError("no suite has two or more methods in common with the paper")
    mean_tau = float(np.mean([r["tau"] for r in rows]))
    agree = [r["tau"] >= r["floor"] - 1e-9 for r in rows]
    effects = [Effect(r["suite"], paper_tau, None, None, paper_tau, float(r["floor"]), float(r["tau"]))
               for r in rows]
    verdict = agreement(agree)
    why = ("tau at or above the chance floor (p ≤ " + f"{alpha:g}) on {sum(agree)} of {len(rows)} suite(s): "
           + ", ".join(f"T={r['n_tasks']}: {r['tau']:.2f} vs floor {r['floor']:.2f} (p = {r['p_value']:.2f})"
                       for r in rows) + f"; mean tau {mean_tau:.2f}")

    def seeds_txt(r):
        v = [t for t in r["tau_per_seed"] if np.isfinite(t)]
        return f" [seeds {min(v):.2f}..{max(v):.2f}]" if len(v) > 1 else ""

    measured = "; ".join(f"T={r['n_tasks']}: tau {r['tau']:.2f} on {r['n']} methods{seeds_txt(r)}, ours "
                         f"{' > '.join(r['ours_order'])}" for r in rows)
    return Verdict(measured, verdict, why, {"mean_tau": mean_tau, "suites": rows}, effects)


def mini_world_targets(summary: pd.DataFrame, *, small: str = "tasks8", large: str = "tasks20",
                       lam_grid_min: float | None = None) -> pd.DataFrame:
    """The mini-world's design targets (docs/course.md §04_benchmark), one row each: ``target, suite,
    measured, threshold, passed`` (``passed`` is None when the data to check it are missing)."""
    from acetools.search import LAMBDA_GRID

    lam_min = LAMBDA_GRID[0] if lam_grid_min is None else lam_grid_min
    agg = aggregate(summary)

    def get(suite: str, method: str, col: str) -> float:
        r = agg[(agg["suite"] == suite) & (agg["method"] == method)]
        return float(r[col].iloc[0]) if len(r) else math.nan

    rows = []

    def add(target, suite, measured, threshold, ok):
        rows.append({"target": target, "suite": suite, "measured": measured, "threshold": threshold,
                     "passed": None if ok is None else bool(ok)})

    exp, base = get(small, "experts (individual)", "test_acc"), get(small, "base (frozen heads)", "test_acc")
    add("experts ≥ 85 % (absolute)", small, round(exp, 2), 85.0, None if math.isnan(exp) else exp >= 85)
    add("base ≥ 20 points below the experts", small, round(exp - base, 2), 20.0,
        None if math.isnan(exp - base) else exp - base >= 20)
    tsv = get(small, "tsv_m", "test_normalized")
    add("TSV-M ≥ 85 % normalized", small, round(tsv, 2), 85.0, None if math.isnan(tsv) else tsv >= 85)
    gains = []
    for s in suite_order(summary, None):
        a = agg[agg["suite"] == s].set_index("method")
        methods = a[a["kind"] == "method"]
        if len(methods) and "base (frozen heads)" in a.index:
            gains.append(float(methods["test_normalized"].max() - a.loc["base (frozen heads)", "test_normalized"]))
    add("best merge ≥ 10 normalized points over the base (every suite)", "all",
        round(min(gains), 2) if gains else math.nan, 10.0, min(gains) >= 10 if gains else None)
    ta = summary[summary["method"] == "task_arithmetic"]["coef"].dropna()
    add("task arithmetic's lam above the grid's smallest value (every run)", "all",
        round(float(ta.min()), 4) if len(ta) else math.nan, round(lam_min, 4),
        bool((ta > lam_min + 1e-9).all()) if len(ta) else None)
    drop = get(small, "task_arithmetic", "test_normalized") - get(large, "task_arithmetic", "test_normalized")
    if small == large:  # one suite: nothing to compare
        drop = math.nan
    add(f"task arithmetic on {large} ≥ 5 normalized points below {small}", f"{small}→{large}", round(drop, 2), 5.0,
        None if math.isnan(drop) else drop >= 5)
    m = agg[(agg["suite"] == large) & (agg["kind"] == "method")]["test_normalized"]
    spread = float(m.max() - m.min()) if len(m) >= 2 else math.nan
    add("best and worst methods ≥ 10 normalized points apart", large, round(spread, 2), 10.0,
        None if math.isnan(spread) else spread >= 10)
    return pd.DataFrame(rows)


#: The rivals of ace.grows (see :func:`assess_grows`): the paper's own numbers show ACE's lead
#: growing with T over task arithmetic (+15.2 → +15.6 → +16.3 on ViT-B/16), not over the best rival.
GROWS_RIVALS: tuple[str, ...] = ("task_arithmetic",)


def vit_width_checks(speed: pd.DataFrame) -> dict[str, Verdict]:
    """The cost claims (:func:`assess_cost`, :func:`assess_overhead`) on the ViT-B/32-width
    timings of ``benchmarks/merge_speed.py`` — a cross-check; the verdicts are the
    benchmark's. Claims whose methods the timings lack are left out."""
    out = {}
    for cid, assess in (("ace.cost", assess_cost), ("esm.overhead", assess_overhead)):
        try:
            out[cid] = assess(speed)
        except (ValueError, KeyError):
            continue
    return out


#: ACE's variant rows (``acetools bench --variants``, :data:`acetools.benchmark.VARIANTS`)
#: and what each stands for: the paper's ViT numbers are the gate-off setting (ViT gamma <
#: 0.25 never crosses tau = 0.3) at its eps = 1e-5; the "ace" row runs the code's defaults.
ACE_VARIANT_ROWS: dict[str, str] = {
    "ace (gate off)": "the gate off, the paper's ViT setting",
    "ace (eps 1e-5)": "eps 1e-5, the paper's ViT eps",
    "ace (eps 2e-4)": "eps 2e-4, the paper's RoBERTa-Base eps",
}


#: The row ACE's claims are decided on in a vision world where the result files have it: the paper's ViT eps
#: (every world's: :data:`acetools_course.claims.PAPER_SETTINGS`).
PAPER_ACE_ROW: str = PAPER_SETTINGS["vit"].ace_row


#: What the ``"ace"`` row is: the code's defaults.
DEFAULT_ACE_ROW_TEXT: str = "the code's defaults: gate auto, eps 1e-2"


def _ace_replaced(summary: pd.DataFrame, row: str, method: str = "ace") -> pd.DataFrame:
    """``summary`` with the ``row`` rows standing in for ``method``'s."""
    out = summary[summary["method"] != method].copy()
    out.loc[out["method"] == row, "method"] = method
    out.attrs["rows"] = {method: row}  # the per-example results keep the row's own name
    return out


def paper_rows(summary: pd.DataFrame, method: str, world: World | None) -> tuple[pd.DataFrame, str]:
    """``summary`` with ``method``'s row at the paper setting of ``world``'s model family
    (:func:`acetools_course.claims.paper_setting`) standing in for ``method``, and that row's name; ``summary``
    itself and ``method`` where the files lack the row."""
    s = paper_setting(world.name if world is not None else None)
    row = {"ace": s.ace_row, "esm": s.esm_row}[method]
    return (_ace_replaced(summary, row, method), row) if row != method and row in set(summary["method"]) \
        else (summary, method)


def with_ace_rows(assess, summary: pd.DataFrame, world: World | None = None) -> Verdict:
    """An ACE claim decided at the paper's setting of ``world``'s model family (:func:`paper_rows`: eps 1e-5
    on a ViT, 2e-4 on the text world's BERT-family encoder; else the ``"ace"`` row and the reason says so),
    the code-default and :data:`ACE_VARIANT_ROWS` rows decided by the same ``assess`` and shown beside
    (docs/course.md §Claim rules, "Which ACE row")."""
    present = set(summary["method"])
    paper_row = paper_setting(world.name if world is not None else None).ace_row
    decided, decide_row = paper_rows(summary, "ace", world)
    v = assess(decided)
    side, parts = {}, []
    for row in {"ace": DEFAULT_ACE_ROW_TEXT, **ACE_VARIANT_ROWS}:
        if row == decide_row or row not in present:
            continue
        try:
            sv = assess(_ace_replaced(summary, row) if row != "ace" else summary)
        except (KeyError, ValueError) as e:  # the row ran on too few suites for this rule
            side[row] = {"verdict": None, "measured": f"not decidable: {e}"}
            parts.append(f"row '{row}': not decidable")
            continue
        side[row] = {"verdict": sv.verdict, "measured": sv.measured}
        parts.append(f"row '{row}': {sv.verdict}")
    if decide_row == paper_row:
        note = f"row '{paper_row}'"
    else:
        note = (f"row 'ace' ({DEFAULT_ACE_ROW_TEXT}): these result files have no '{paper_row}' row, "
                "the paper's setting (pending rerun with acetools bench --variants)")
    if parts:
        note += "; beside: " + ", ".join(parts)
    return v.with_reason(f"{v.reason} — {note}", ace_row=decide_row, ace_variant_rows=side)


def claim_verdicts(data: BenchmarkData, world: World | None = None) -> dict[str, Verdict]:
    """The verdicts of notebook 04's claims by id (ace.grows needs two suites), in ``world`` (None: no
    predictions). Rivals are those of each paper's table (:func:`acetools_course.paper_tables.table_rivals`);
    rules: docs/course.md §Claim rules."""
    summary, speed = data.summary, data.speed
    data_free = [m for m in data_free_methods(data.methods) if m.split(" ")[0] != "ace"]
    wudi_ratio: dict[int, float] = {}
    if len(speed):
        t = speed.pivot_table(index="n_tasks", columns="method", values="merge_seconds")
        if {"ace", "wudi"} <= set(t.columns):
            wudi_ratio = {int(n): float(r) for n, r in (t["ace"] / t["wudi"]).dropna().items()}
    width = {k: {"verdict": v.verdict, "measured": v.measured} for k, v in vit_width_checks(speed).items()} \
        if len(speed) else {}

    def extra(v: Verdict, **numbers: Any) -> Verdict:
        return v.with_reason(v.reason, **numbers)

    given_n = getattr(data, "paper_n", None) or {s: _n_tasks(summary, s) for s in data.suites}
    paper_n = {s: given_n[s] for s in data.suites if given_n.get(s) in P.COMPARISONS["ace"]}
    ace_rivals = table_rivals("ace", 8, "ace")
    ace_paper = {s: (paper_lead("ace", n, "ace")[0], paper_room("ace", n)) for s, n in paper_n.items()}
    esm_rivals = [m for m in table_rivals("esm", 8, "esm")]
    esm_paper = {s: (paper_lead("esm", n, "esm")[0], paper_room("esm", n)) for s, n in paper_n.items()}
    shown = [m for m in data_free if m not in ace_rivals]
    runs = getattr(data, "runs", None)
    pairs = None if runs is None else functools.partial(paired_rows, runs, per_task=getattr(data, "per_task", None))

    ace_rules: dict[str, Callable[[pd.DataFrame], Verdict]] = {
        "ace.sota": lambda s: assess_beats(s, "ace", ace_rivals, paper=ace_paper, world=world, shown=shown,
                                           pairs=pairs)}
    if len(data.suites) >= 2:
        ns = sorted(paper_n.values())
        if len(ns) >= 2:
            b16 = {n: P.paper_column("spec", "ViT-B/16", n) for n in (ns[0], ns[-1])}
            growth = float((b16[ns[-1]]["ace"] - b16[ns[-1]]["task_arithmetic"])
                           - (b16[ns[0]]["ace"] - b16[ns[0]]["task_arithmetic"]))
            grow_paper = (growth, float(b16[ns[-1]]["tsv_m"] - b16[ns[-1]]["task_arithmetic"]))
        else:
            grow_paper = None
        ace_rules["ace.grows"] = lambda s: assess_grows(s, "ace", list(GROWS_RIVALS), paper=grow_paper, world=world)
    ace_rules["ace.vs_wudi"] = lambda s: assess_vs_wudi(s, step_size=data.step_size, pairs=pairs)
    ace_rules["ace.cost"] = assess_cost
    paper_tau = float(np.mean([rank_agreement(P.comparison_columns("ace", n), ACE_CLAIMED_RANKS)["tau"]
                               for n in P.COMPARISONS["ace"]]))
    ace_rules["ace.ordering"] = lambda s: assess_ordering(s, ACE_CLAIMED_RANKS, paper_tau=paper_tau)
    out = {cid: with_ace_rows(rule, summary, world) for cid, rule in ace_rules.items()}
    out["ace.vs_wudi"] = extra(out["ace.vs_wudi"], vit_width_time_ratio=wudi_ratio)
    out["ace.cost"] = extra(out["ace.cost"], vit_width=width.get("ace.cost"))
    esm_summary, esm_row = paper_rows(summary, "esm", world)  # ESM as its code configures the world's family
    out["esm.sota"] = assess_beats(esm_summary, "esm", esm_rivals, paper=esm_paper, world=world,
                                   shown=[m for m in data_free if m not in esm_rivals and m.split(" ")[0] != "esm"],
                                   pairs=pairs)
    out["esm.sota"] = out["esm.sota"].with_reason(f"{out['esm.sota'].reason} — row '{esm_row}'", esm_row=esm_row)
    out["esm.overhead"] = extra(assess_overhead(summary), vit_width=width.get("esm.overhead"))
    return out


track_drawing([sys.modules[__name__]])  # each figure function notes itself on the figure it draws (the manifest)
