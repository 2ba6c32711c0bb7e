"""Lesson 04 (``notebooks/04_benchmark``): which differences count, and the verdicts of the
claims the benchmark owns.

* differences that count: :func:`paired_difference` — a difference between two methods is
  real when it exceeds the **spread over seeds** of their paired per-seed difference (its
  standard deviation), and at least :data:`MIN_MARGIN` points (the only guard with one seed);
* verdicts from the numbers (:func:`assess_beats`, :func:`assess_grows`, :func:`assess_vs_wudi`,
  :func:`assess_cost`, :func:`assess_ordering`, :func:`assess_overhead`) and the mini-world
  targets (:func:`mini_world_targets`).

The result files themselves are read by the library module :mod:`acetools.results`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..results import DATA_DEPENDENT, REFERENCES, aggregate, rank_agreement

__all__ = [
    "MIN_MARGIN",
    "Assessment",
    "paired_difference",
    "data_free_methods",
    "assess_beats",
    "assess_grows",
    "assess_vs_wudi",
    "assess_cost",
    "assess_ordering",
    "assess_overhead",
    "mini_world_targets",
]

#: The smallest difference (percentage points) that counts, whatever the seeds say.
MIN_MARGIN: float = 0.5


# --------------------------------------------------------------------------- differences that count
def paired_difference(summary: pd.DataFrame, suite: str, a: str, b: str, metric: str = "test_normalized",
                      floor: float = MIN_MARGIN) -> dict[str, Any]:
    """``a - b`` on ``suite``: per-seed differences on the seeds both have, their mean, the
    margin ``max(floor, sd over seeds)`` and the outcome ``"better"`` / ``"tie"`` / ``"worse"``
    (``|mean| <= margin`` is a tie)."""
    d = summary[summary["suite"] == suite].pivot_table(index="seed", columns="method", values=metric)
    for m in (a, b):
        if m not in d.columns:
            raise KeyError(f"no method {m!r} on suite {suite!r}; methods: {sorted(d.columns)}")
    diffs = (d[a] - d[b]).dropna()
    if diffs.empty:
        raise ValueError(f"{a} and {b} share no seed on {suite}")
    sd = float(diffs.std(ddof=1)) if len(diffs) > 1 else math.nan
    margin = max(floor, sd) if np.isfinite(sd) else floor
    mean = float(diffs.mean())
    outcome = "tie" if abs(mean) <= margin else ("better" if mean > 0 else "worse")
    return {"suite": suite, "a": a, "b": b, "diff": mean, "sd": sd, "margin": margin, "n_seeds": len(diffs),
            "outcome": outcome, "per_seed": {int(k): float(v) for k, v in diffs.items()}}


def data_free_methods(methods: Iterable[str]) -> list[str]:
    """The merge methods among ``methods`` that use nothing but the weights (no references,
    nothing in :data:`DATA_DEPENDENT`)."""
    return [m for m in methods if m not in REFERENCES and m.split(" ")[0] not in DATA_DEPENDENT]


@dataclass
class Assessment:
    """A claim's measurement: ``measured`` (words and numbers), ``verdict``, ``reason`` and the
    raw ``numbers``; ``claims.record(fig_dir, claim_id, **a.record())`` stores it."""

    measured: str
    verdict: str
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"measured": self.measured, "verdict": self.verdict, "reason": self.reason, **self.numbers}


def _suites(summary: pd.DataFrame, suites: Sequence[str] | None) -> list[str]:
    order = summary.drop_duplicates("suite").sort_values("n_tasks", kind="stable")["suite"].tolist()
    return order if suites is None else [s for s in suites if s in order]


def _best(summary: pd.DataFrame, suite: str, methods: Sequence[str], metric: str) -> str:
    means = summary[(summary["suite"] == suite) & summary["method"].isin(methods)].groupby("method")[metric].mean()
    if means.empty:
        raise ValueError(f"none of {list(methods)} ran on {suite}")
    return str(means.idxmax())


def assess_beats(summary: pd.DataFrame, winner: str, rivals: Sequence[str], *, suites: Sequence[str] | None = None,
                 metric: str = "test_normalized", floor: float = MIN_MARGIN) -> Assessment:
    """Does ``winner`` beat every one of ``rivals`` on every suite?

    Per suite, ``winner`` is compared with the best rival (by mean) through
    :func:`paired_difference`. Verdict: ``reproduced`` when it is better beyond the margin on
    every suite; ``partly`` when it is not worse beyond the margin on at least half of them;
    ``not reproduced`` otherwise.
    """
    rows = []
    for s in _suites(summary, suites):
        present = set(summary.loc[summary["suite"] == s, "method"])
        if winner not in present:
            continue
        rv = [r for r in rivals if r in present and r != winner]
        if not rv:
            continue
        best = _best(summary, s, rv, metric)
        rows.append(paired_difference(summary, s, winner, best, metric, floor))
    if not rows:
        raise ValueError(f"{winner} and none of {list(rivals)} ran together on any suite")
    wins = sum(r["outcome"] == "better" for r in rows)
    not_worse = sum(r["outcome"] != "worse" for r in rows)
    if wins == len(rows):
        verdict, why = "reproduced", f"better than the best rival beyond the seed spread on all {len(rows)} suites"
    elif 2 * not_worse >= len(rows):
        verdict, why = "partly", f"better on {wins}, within the seed spread on {not_worse - wins} of {len(rows)} suites"
    else:
        verdict, why = "not reproduced", f"beaten beyond the seed spread on {len(rows) - not_worse} of {len(rows)} suites"
    measured = "; ".join(f"{r['suite']}: {winner} {r['diff']:+.1f} ± {r['margin']:.1f} vs {r['b']} ({r['outcome']})"
                         for r in rows)
    return Assessment(measured, verdict, why, {"metric": metric, "comparisons": rows})


def assess_grows(summary: pd.DataFrame, method: str, rivals: Sequence[str], *, suites: Sequence[str] | None = None,
                 metric: str = "test_normalized", floor: float = MIN_MARGIN) -> Assessment:
    """Does ``method``'s lead over the best rival grow with the number of tasks?

    gap(T) = ``method`` - best rival at T (per seed). Verdict: ``reproduced`` when the gap
    at the most tasks exceeds the gap at the fewest by more than the margin (the seed spread
    of that change, at least ``floor``), never drops by more than the margin from one
    suite to the next, and ``method`` leads at the most tasks; ``partly`` when it grows but
    within the margin, not monotonically, or without a lead anywhere (a deficit that
    narrows is no advantage that grows); ``not reproduced`` when it does not grow.
    """
    gaps = []
    for s in _suites(summary, suites):
        present = set(summary.loc[summary["suite"] == s, "method"])
        rv = [r for r in rivals if r in present and r != method]
        if method in present and rv:
            gaps.append(paired_difference(summary, s, method, _best(summary, s, rv, metric), metric, floor))
    if len(gaps) < 2:
        raise ValueError(f"need {method} and a rival on at least two suites, got {len(gaps)}")

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
    leads = gaps[-1]["diff"] > 0
    if total > total_margin and monotone and leads:
        verdict, why = "reproduced", f"the lead grows by {total:+.1f} (> {total_margin:.1f}) from the fewest to the most tasks"
    elif total > 0 and not leads:
        verdict = "partly"
        why = (f"the gap to the best rival narrows by {total:+.1f}, but {method} never leads "
               f"({gaps[-1]['diff']:+.1f} at the most tasks): there is no advantage to grow")
    elif total > 0:
        verdict = "partly"
        why = (f"the lead grows by {total:+.1f} overall" + ("" if total > total_margin else f", within the spread {total_margin:.1f}")
               + ("" if monotone else ", not monotonically"))
    else:
        verdict, why = "not reproduced", f"the lead changes by {total:+.1f} from the fewest to the most tasks"
    measured = ", ".join(f"T={int(summary.loc[summary['suite'] == g['suite'], 'n_tasks'].iloc[0])}: {g['diff']:+.1f} vs {g['b']}"
                         for g in gaps)
    return Assessment(f"{method} minus best other: {measured}", verdict, why,
                      {"metric": metric, "gaps": gaps, "change": total, "change_margin": total_margin})


def _time_ratio(agg: pd.DataFrame, suite: str, a: str, b: str) -> float:
    t = agg[agg["suite"] == suite].set_index("method")["merge_seconds"]
    return float(t[a] / t[b])


def assess_vs_wudi(summary: pd.DataFrame, *, method: str = "ace", rival: str = "wudi",
                   suites: Sequence[str] | None = None, metric: str = "test_normalized",
                   floor: float = MIN_MARGIN, step_size: pd.DataFrame | None = None) -> Assessment:
    """Is the closed form (``method``) more stable and cheaper than WUDI (``rival``)?

    Three criteria, each on every suite with both: *not worse* (accuracy not below WUDI's
    beyond the seed spread), *cheaper* (mean merge time below WUDI's), and, with two or more
    seeds, *stable* (over-seed sd of accuracy not above WUDI's by more than ``floor``).
    With ``step_size`` (:func:`load_wudi_step_size`: WUDI at several Adam learning rates) a
    fourth, *not worse than tuned WUDI*: on each (suite, seed) studied, ``method``'s
    accuracy is not below WUDI's at the learning rate with the best validation accuracy by
    more than ``floor``; the measurement also reports WUDI's range over learning rates.
    Verdict: all measurable criteria met -> ``reproduced``; some -> ``partly``; none ->
    ``not reproduced``.
    """
    agg = aggregate(summary)
    rows = []
    for s in _suites(summary, suites):
        present = set(summary.loc[summary["suite"] == s, "method"])
        if {method, rival} <= present:
            cmp = paired_difference(summary, s, method, rival, metric, floor)
            a = agg[agg["suite"] == s].set_index("method")
            rows.append({"suite": s, "diff": cmp["diff"], "margin": cmp["margin"], "outcome": cmp["outcome"],
                         "time_ratio": _time_ratio(agg, s, method, rival),
                         "sd": float(a.loc[method, f"{metric}_sd"]), "sd_rival": float(a.loc[rival, f"{metric}_sd"])})
    if not rows:
        raise ValueError(f"{method} and {rival} never ran on the same suite")
    crit = {"not worse": all(r["outcome"] != "worse" for r in rows),
            "cheaper": all(r["time_ratio"] < 1 for r in rows)}
    if all(np.isfinite(r["sd"]) and np.isfinite(r["sd_rival"]) for r in rows):
        crit["stable"] = all(r["sd"] <= r["sd_rival"] + floor for r in rows)
    tuned = _tuned_wudi(summary, step_size, method, metric) if step_size is not None and len(step_size) else []
    if tuned:
        crit["not worse than tuned WUDI"] = all(t["diff"] >= -floor for t in tuned)
    met, verdict = _criteria_verdict(crit)
    why = (f"met: {', '.join(met) or 'none'}; missed: {', '.join(k for k, v in crit.items() if not v) or 'none'}"
           + ("" if "stable" in crit else " (stability needs two or more seeds)"))
    measured = "; ".join(f"{r['suite']}: {r['diff']:+.1f} ± {r['margin']:.1f} points, time ×{r['time_ratio']:.2f}"
                         + (f", sd {r['sd']:.1f} vs {r['sd_rival']:.1f}" if np.isfinite(r["sd"]) else "") for r in rows)
    if tuned:
        measured += "; WUDI's Adam learning rate chosen on val: " + "; ".join(
            f"{t['suite']} seed {t['seed']}: lr {t['lr']:g} gives {t['tuned']:.1f} (range over lr "
            f"{t['lo']:.1f}–{t['hi']:.1f}), {method} {t['ours']:.1f} ({t['diff']:+.1f})" for t in tuned)
    return Assessment(f"{method} vs {rival}: {measured}", verdict, why,
                      {"criteria": crit, "rows": rows, "tuned_wudi": tuned})


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


def _criteria_verdict(crit: Mapping[str, bool]) -> tuple[list[str], str]:
    """The criteria met, and the verdict: all -> reproduced, some -> partly, none -> not reproduced."""
    met = [k for k, v in crit.items() if v]
    return met, "reproduced" if len(met) == len(crit) else ("partly" if met else "not reproduced")


def _time_rows(summary: pd.DataFrame, method: str, ref: str, suites: Sequence[str] | None) -> list[dict[str, Any]]:
    """Per suite with both: mean merge seconds of ``method`` and ``ref`` and their ratio."""
    agg = aggregate(summary)
    rows = []
    for s in _suites(summary, suites):
        a = agg[agg["suite"] == s].set_index("method")
        if method in a.index and ref in a.index:
            rows.append({"suite": s, "n_tasks": int(a["n_tasks"].iloc[0]), "seconds": float(a.loc[method, "merge_seconds"]),
                         "seconds_ref": float(a.loc[ref, "merge_seconds"]), "ratio": _time_ratio(agg, s, method, ref)})
    if not rows:
        raise ValueError(f"{method} and {ref} never ran on the same suite")
    return rows


def _loglog_slope(n_tasks: Sequence[float], seconds: Sequence[float]) -> float:
    x, y = np.log(np.asarray(n_tasks, float)), np.log(np.asarray(seconds, float))
    return float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 and np.ptp(x) > 0 else math.nan


def assess_cost(summary: pd.DataFrame, *, method: str = "ace", svd_method: str = "tsv_m",
                suites: Sequence[str] | None = None, max_ratio: float = 2.0, max_slope: float = 1.5) -> Assessment:
    """Does ``method`` cost about what the SVD-based ``svd_method`` does, growing linearly in T?

    Criteria: *matching* (mean merge time at most ``max_ratio`` × the SVD method's on every
    suite) and *linear in T* (log-log slope of merge time against T at most ``max_slope``;
    the claimed O(L·T·n³) has slope 1). Both -> ``reproduced``, one -> ``partly``.
    """
    rows = _time_rows(summary, method, svd_method, suites)
    slope = _loglog_slope([r["n_tasks"] for r in rows], [r["seconds"] for r in rows])
    crit = {"matching": all(r["ratio"] <= max_ratio for r in rows)}
    if np.isfinite(slope):
        crit["linear in T"] = slope <= max_slope
    met, verdict = _criteria_verdict(crit)
    why = (f"time ratio ≤ {max_ratio} on every suite: {crit['matching']}"
           + (f"; log-log slope {slope:.2f} (≤ {max_slope}: {crit['linear in T']})" if "linear in T" in crit
              else "; one suite: no slope"))
    measured = ", ".join(f"T={r['n_tasks']}: {r['seconds']:.3g} s vs {r['seconds_ref']:.3g} s (×{r['ratio']:.2f})"
                         for r in rows)
    return Assessment(f"merge time {method} vs {svd_method}: {measured}", verdict, why,
                      {"rows": rows, "slope": slope, "criteria": crit})


def assess_overhead(summary: pd.DataFrame, *, method: str = "esm", ref: str = "tsv_m",
                    suites: Sequence[str] | None = None, small: float = 3.0, large: float = 10.0) -> Assessment:
    """Is ``method``'s extra cost over ``ref`` small? Merge-time ratio on every suite:
    at most ``small`` -> ``reproduced``; at most ``large`` -> ``partly``; else ``not reproduced``."""
    rows = _time_rows(summary, method, ref, suites)
    worst = max(r["ratio"] for r in rows)
    if worst <= small:
        verdict, why = "reproduced", f"at most ×{worst:.2f} the time of {ref} (≤ ×{small:g})"
    elif worst <= large:
        verdict, why = "partly", f"up to ×{worst:.2f} the time of {ref}: same order, above ×{small:g}"
    else:
        verdict, why = "not reproduced", f"up to ×{worst:.2f} the time of {ref} (> ×{large:g})"
    measured = ", ".join(f"T={r['n_tasks']}: {r['seconds']:.3g} s vs {r['seconds_ref']:.3g} s" for r in rows)
    return Assessment(f"merge time {method} vs {ref}: {measured}", verdict, why, {"rows": rows, "worst_ratio": worst})


def assess_ordering(summary: pd.DataFrame, paper: Mapping[int, pd.Series] | pd.Series, *,
                    suites: Sequence[str] | None = None, metric: str = "test_normalized",
                    good: float = 0.6, some: float = 0.2) -> Assessment:
    """Kendall tau-b of our method ordering (means over seeds) against a paper's.

    ``paper``: one Series (the same ordering for every suite) or ``{n_tasks: Series}``.
    Also computes tau per seed (its spread shows how stable our ordering is). Verdict on
    the mean tau over suites: ``>= good`` -> ``reproduced``, ``>= some`` -> ``partly``.
    """
    rows = []
    for s in _suites(summary, suites):
        d = summary[summary["suite"] == s]
        n = int(d["n_tasks"].iloc[0])
        ref = paper if isinstance(paper, pd.Series) else paper.get(n)
        if ref is None:
            continue
        ours = d.groupby("method")[metric].mean()
        ra = rank_agreement(ours, ref)
        per_seed = [rank_agreement(g.set_index("method")[metric], ref)["tau"] for _, g in d.groupby("seed")]
        rows.append({"suite": s, "n_tasks": n, **ra, "tau_per_seed": per_seed})
    rows = [r for r in rows if np.isfinite(r["tau"])]
    if not rows:
        raise ValueError("no suite has two or more methods in common with the paper")
    mean_tau = float(np.mean([r["tau"] for r in rows]))
    verdict = "reproduced" if mean_tau >= good else ("partly" if mean_tau >= some else "not reproduced")
    why = f"mean Kendall tau {mean_tau:.2f} over {len(rows)} suite(s) (reproduced ≥ {good}, partly ≥ {some})"

    def seeds_txt(r):
        v = [t for t in r["tau_per_seed"] if np.isfinite(t)]
        return f" [seeds {min(v):.2f}..{max(v):.2f}]" if len(v) > 1 else ""

    measured = "; ".join(f"T={r['n_tasks']}: tau {r['tau']:.2f} on {r['n']} methods{seeds_txt(r)}, ours "
                         f"{' > '.join(r['ours_order'])}" for r in rows)
    return Assessment(measured, verdict, why, {"mean_tau": mean_tau, "suites": rows})


# --------------------------------------------------------------------------- mini-world targets
def mini_world_targets(summary: pd.DataFrame, *, small: str = "tasks8", large: str = "tasks20",
                       lam_grid_min: float | None = None) -> pd.DataFrame:
    """The issue's targets for the mini-world, one row each: ``target, suite, measured,
    threshold, passed`` (``passed`` is ``None`` when the data to check it are missing).

    1. experts >= 85 % on ``small`` and the base >= 20 points below them (absolute accuracy);
    2. TSV-M >= 85 % normalized on ``small``;
    3. the best merge >= 10 normalized points over the base, on every suite;
    4. task arithmetic's chosen lam above the smallest grid value (1/30) in every run;
    5. task arithmetic on ``large`` >= 5 normalized points below ``small``;
    6. on ``large``, best and worst merge methods >= 10 normalized points apart.
    """
    from ..search import LAMBDA_GRID

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
    for s in _suites(summary, None):
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
