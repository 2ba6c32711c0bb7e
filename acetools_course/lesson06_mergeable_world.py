"""Lesson 06 (docs/course.md §06_mergeable_world): what makes a world mergeable, from the committed
regime cards of the recipe study (:mod:`acetools.regime`, docs/regime.md).

Figures of notebook 06: pure functions ``(ax, data, ...) -> ax`` on regime cards and the tables of
this module's experiments.

Notebook 06's regime targets: which of the mini-world's design targets a regime card meets
(docs/regime.md §Targets); the cards come from this module's experiments."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from acetools.errors import InputError, InputKeyError
from acetools.merging import METHODS
from acetools.plotting import finish, track_drawing
from acetools.regime import RegimeCard, regime_card
from acetools.results import aggregate, find_results, load_summary
from acetools.search import PATIENCE

from . import lesson_worlds as course

# ---- Experiments: the tables and runs -------------------------------------------------------------

#: The card's key rows, in order (docs/regime.md §How the card is measured).
KEY_ROWS: tuple[str, ...] = ("experts_abs", "base_abs", "base_norm", "ta_norm", "ta_lambda", "tsv_norm",
                             "iso_cts_norm", "tsv_minus_ta", "tsv_gap_share", "ace_gamma_median",
                             "ace_gated_fraction", "tau_ratio", "wpre_top5_energy", "cosine_mean", "cosine_max")
#: The rows that explain the room.
EXPLAIN_ROWS: tuple[str, ...] = ("trunc_norm", "trunc_energy", "scaled_norm", "ta_interference", "overlap_topk",
                                 "overlap_left", "overlap_right", "overlap_random", "act_overlap", "act_topk_energy",
                                 "tau_in_act", "log_energy_mean", "log_energy_sd")


def load_cards(folder: str | os.PathLike, order: Sequence[str] | None = None) -> dict[str, RegimeCard]:
    """``{recipe: card}`` for every ``<folder>/<recipe>/card.json``, ``order`` first, the rest alphabetically."""
    folder = Path(folder)
    found = sorted(p.parent.name for p in folder.glob("*/card.json"))
    if not found:
        raise FileNotFoundError(f"no regime card under {folder}/*/card.json; measure one with "
                                "`python3 benchmarks/recipe_study.py first_world` or `python3 -m acetools regime`")
    names = [n for n in (order or []) if n in found] + [n for n in found if n not in (order or [])]
    return {n: RegimeCard.load(folder / n) for n in names}


def card_table(cards: Mapping[str, RegimeCard], rows: Sequence[str] = KEY_ROWS, *, clip: bool = True) -> pd.DataFrame:
    """Rows ``rows`` of every card as columns, plus the CLIP ViT-B/32 column (NaN where no number)."""
    if not cards:
        raise InputError("card_table needs at least one card")
    first = next(iter(cards.values())).to_frame().set_index("metric")
    missing = [r for r in rows if r not in first.index and not any(r in c.to_frame()["metric"].values
                                                                     for c in cards.values())]
    if missing:
        raise InputKeyError(f"no card has rows {missing}; rows: {list(first.index)}")
    out = {}
    labels = {}
    for name, card in cards.items():
        df = card.to_frame().set_index("metric")
        labels.update(df["label"].to_dict())
        out[name] = [float(df.loc[r, "value"]) if r in df.index else math.nan for r in rows]
    table = pd.DataFrame(out, index=[labels.get(r, r) for r in rows])
    if clip:
        table["CLIP ViT-B/32"] = [float(first.loc[r, "clip"]) if r in first.index else math.nan for r in rows]
    table.index.name = "row"
    return table


def room_budget(card: RegimeCard) -> pd.DataFrame:
    """The two paths from the experts (100 % normalized) to a merge, as steps with their cost: task
    arithmetic (each task alone at λ_TA, then with the others) and TSV-M (truncated to rank ⌊r/T⌋,
    then merged). Columns: path, step, normalized, cost (points lost; negative = gained)."""
    v = card.value
    rows = []
    for path, steps in (("task arithmetic", [("experts", 100.0), ("each task alone at λ_TA", v("scaled_norm")),
                                             ("task arithmetic", v("ta_norm"))]),
                        ("TSV-M", [("experts", 100.0), ("each task truncated to rank r/T", v("trunc_norm")),
                                   ("TSV-M", v("tsv_norm"))])):
        prev = None
        for step, val in steps:
            rows.append({"path": path, "step": step, "normalized": val,
                         "cost": math.nan if prev is None else prev - val})
            prev = val
    return pd.DataFrame(rows)


def benchmark_summary(results_dir: str | os.PathLike, suites: Sequence[str] = ("tasks8", "tasks14", "tasks20"),
                      size: str = "small") -> pd.DataFrame | None:
    """The benchmark's per-seed table from ``results_dir``, or ``None`` without results of ``suites``."""
    runs = find_results(results_dir, list(suites), size)
    return load_summary(runs) if runs else None


def fixture_card(*, seed: int = 0, device: str = "cpu", progress: bool | None = False) -> RegimeCard:
    """The regime card of the quick profile's fixture world: for checking that the lesson runs."""
    zoo = course.world(quick=True, seed=seed, device=device)
    bench = course.benchmark(zoo, quick=True, patience=PATIENCE)
    return regime_card(zoo, bench=bench, progress=progress, n_act=64)


# ---- Figures: the lesson's plots, drawn on a given axes -------------------------------------------

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


def plot_room_budget(ax, budget: pd.DataFrame, *, title: str | None = None):
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


# ---- Verdicts: the lesson's claims, judged --------------------------------------------------------

def _timing_minutes(card: RegimeCard, kind: str) -> float:
    t = [float(s) for k, s in (card.meta.get("timing") or {}).items() if k.split("/")[0] == kind and s is not None]
    return sum(t) / 60 if t else math.nan


def targets(card: RegimeCard, summary: pd.DataFrame | None = None, *, small: str | None = None,
                   large: str = "tasks20") -> pd.DataFrame:
    """The mini-world's regime targets (docs/regime.md §Targets), one row each: ``target, suite,
    measured, threshold, passed, source`` (``passed`` None where data are missing). Accuracies from
    ``summary`` when given, else from ``card``; ACE's gate and build times from the card."""
    small = small or str(card.meta.get("suite") or "tasks8")
    agg = aggregate(summary) if summary is not None and len(summary) else None

    def get(suite: str, method: str, col: str) -> float:
        if agg is not None:
            r = agg[(agg["suite"] == suite) & (agg["method"] == method)]
            return float(r[col].iloc[0]) if len(r) else math.nan
        if suite != small:
            return math.nan
        metric = {("experts (individual)", "test_acc"): "experts_abs", ("base (frozen heads)", "test_acc"): "base_abs",
                  ("tsv_m", "test_normalized"): "tsv_norm", ("task_arithmetic", "test_normalized"): "ta_norm",
                  ("task_arithmetic", "coef"): "ta_lambda"}[(method, col)]
        return float(card.value(metric))

    src = f"benchmark, {int(agg['n_seeds'].max())} seed(s)" if agg is not None else "regime card"
    rows: list[dict[str, Any]] = []

    def add(target: str, suite: str, measured: float, threshold: str, ok: Any, source: str = src) -> None:
        rows.append({"target": target, "suite": suite, "measured": None if math.isnan(measured) else round(measured, 2),
                     "threshold": threshold, "passed": None if math.isnan(measured) else bool(ok), "source": source})

    exp, base = get(small, "experts (individual)", "test_acc"), get(small, "base (frozen heads)", "test_acc")
    add("experts (absolute, %)", small, exp, "≥ 85", exp >= 85)
    add("base below the experts (points)", small, exp - base, "≥ 20", exp - base >= 20)
    tsv = get(small, "tsv_m", "test_normalized")
    add("TSV-M (normalized, %)", small, tsv, "≥ 85", tsv >= 85)
    for suite, need in ((small, 10.0), (large, 8.0)):
        room = get(suite, "tsv_m", "test_normalized") - get(suite, "task_arithmetic", "test_normalized")
        add("TSV-M − task arithmetic (normalized points)", suite, room, f"≥ {need:g}", room >= need)
    drop = get(small, "task_arithmetic", "test_normalized") - get(large, "task_arithmetic", "test_normalized")
    add(f"task arithmetic on {large} below {small} (normalized points)", f"{small}→{large}", drop, "≥ 5", drop >= 5)
    if agg is not None and summary is not None:  # agg comes from summary
        lams = summary.loc[summary["method"] == "task_arithmetic", "coef"].dropna().astype(float)
    else:
        lams = pd.Series([get(small, "task_arithmetic", "coef")])
    for name, lam in (("smallest", lams.min()), ("largest", lams.max())):
        add(f"task arithmetic's λ on validation ({name} over runs)", "all" if agg is not None else small,
            float(lam) if len(lams) else math.nan, "in [0.2, 0.6]", 0.2 - 1e-9 <= lam <= 0.6 + 1e-9)
    gated = float(card.value("ace_gated_fraction"))
    tau = card.meta.get("tau") or METHODS["ace"].params["tau"].default
    add(f"ACE's gate off (γ ≤ τ = {tau:g}), % of matrices", small, 100.0 - gated, "≥ 75", 100.0 - gated >= 75,
        "regime card")
    experts_min = _timing_minutes(card, "expert")
    add(f"building a {small} expert set (min, as recorded)", small, experts_min, "≤ 20", experts_min <= 20,
        "regime card")
    base_h = float(((card.meta.get("recipe") or {}).get("base_recipe") or {}).get("seconds") or math.nan) / 3600
    add("pretraining the base once (h, as recorded)", "—", base_h, "≤ 2", base_h <= 2, "regime card")
    return pd.DataFrame(rows, columns=["target", "suite", "measured", "threshold", "passed", "source"])


track_drawing([sys.modules[__name__]])  # each figure function notes itself on the figure it draws (the manifest)
