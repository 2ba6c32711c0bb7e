"""Notebook 06's regime targets: which of the mini-world's design targets a regime card meets
(docs/regime.md §Targets); the cards come from :mod:`acetools.course.mergeable_world`."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from acetools.merging import METHODS
from acetools.regime import RegimeCard
from acetools.results import aggregate


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
