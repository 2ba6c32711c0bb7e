"""Benchmark result files as tidy tables, rank agreement with the papers, and the claim checks.

``acetools bench --out DIR`` (:meth:`acetools.benchmark.Benchmark.save`) writes, per suite,
size and expert seed, ``<suite>_<size>_seed<k>_summary.csv`` (one row per method),
``..._per_task.csv`` (method × task × split), ``..._seed<k>.json`` (hyperparameters, search
traces, versions, checkpoint hashes), ``..._norms.csv`` and ``..._cosine.csv`` (the regime).
This module reads them back for notebook ``04_benchmark``:

* loading: :func:`find_results`, :func:`load_summary`, :func:`load_per_task`,
  :func:`load_records`, :func:`search_traces`, :func:`load_regime`;
* aggregation over seeds: :func:`aggregate`, :func:`table1` (the papers' Table 1 layout,
  mean ± sd), :func:`wide`, :func:`per_task_matrix`, :func:`task_scores`;
* rank agreement: :func:`kendall_tau` (tau-b, ties allowed), :func:`rank_agreement`;
* differences that count: :func:`paired_difference` — a difference between two methods is
  real when it exceeds the **spread over seeds** of their paired per-seed difference (its
  standard deviation), and at least :data:`MIN_MARGIN` points (the only guard with one seed);
* verdicts from the numbers for the claims ``04_benchmark`` owns (:func:`assess_beats`,
  :func:`assess_grows`, :func:`assess_vs_wudi`, :func:`assess_cost`,
  :func:`assess_ordering`, :func:`assess_overhead`) and the mini-world targets
  (:func:`mini_world_targets`);
* merge times at ViT-B/32 width from ``benchmarks/merge_speed.py``: :func:`load_merge_speed`;
* writing results on the fixture world: :func:`prefix_world`, :func:`write_results`.

All accuracies are percentages, as the CSV files store them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "REFERENCES",
    "DATA_DEPENDENT",
    "MIN_MARGIN",
    "ResultFiles",
    "Assessment",
    "bench_command",
    "find_results",
    "require_results",
    "load_summary",
    "load_per_task",
    "load_records",
    "search_traces",
    "load_regime",
    "load_wudi_step_size",
    "aggregate",
    "table1",
    "wide",
    "per_task_matrix",
    "task_scores",
    "kendall_tau",
    "rank_agreement",
    "paired_difference",
    "data_free_methods",
    "assess_beats",
    "assess_grows",
    "assess_vs_wudi",
    "assess_cost",
    "assess_ordering",
    "assess_overhead",
    "mini_world_targets",
    "load_merge_speed",
    "prefix_world",
    "write_results",
    "to_markdown",
]

#: Reference rows of a summary (not merge methods).
REFERENCES: tuple[str, ...] = ("base (frozen heads)", "experts (individual)", "multi-task (MTL)")
#: Methods that use data besides the weights (so not "data-free" in ACE's sense).
DATA_DEPENDENT: dict[str, str] = {
    "regmean": "Gram matrices of training inputs",
    "esm": "unlabelled proxy images (32 per task)",
}
#: The smallest difference (percentage points) that counts, whatever the seeds say.
MIN_MARGIN: float = 0.5

_STEM = re.compile(r"^(?P<suite>.+)_(?P<size>[^_]+)_seed(?P<seed>\d+)_summary\.csv$")


def bench_command(suites: Sequence[str], size: str = "small", seeds: Sequence[int] = (0, 1, 2),
                  out: str = "figures/benchmark") -> str:
    """The shell commands that write the result files this module reads."""
    return " && ".join(
        f"acetools bench --suite {s} --size {size} --seeds {' '.join(map(str, seeds))} --out {out} "
        "--patience 5 --n-val 100 --n-test 500" for s in suites
    )


# --------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class ResultFiles:
    """The files of one (suite, size, seed) benchmark run; optional ones may be ``None``."""

    suite: str
    size: str
    seed: int
    summary: Path
    per_task: Path | None
    record: Path | None
    norms: Path | None
    cosine: Path | None

    @property
    def stem(self) -> str:
        return f"{self.suite}_{self.size}_seed{self.seed}"


def find_results(folder: str | os.PathLike, suites: Sequence[str] | None = None, size: str | None = None) -> list[ResultFiles]:
    """Every run in ``folder`` (one per ``*_summary.csv``), ordered by ``suites`` then seed.

    ``suites``/``size`` filter (``None``: all found; suites then sorted by name).
    """
    folder = Path(folder)
    found = []
    for f in sorted(folder.glob("*_seed*_summary.csv")) if folder.is_dir() else []:
        m = _STEM.match(f.name)
        if not m or (size is not None and m["size"] != size) or (suites is not None and m["suite"] not in suites):
            continue
        stem = f.name[: -len("_summary.csv")]

        def opt(suffix: str) -> Path | None:
            p = folder / f"{stem}{suffix}"
            return p if p.is_file() else None

        found.append(ResultFiles(m["suite"], m["size"], int(m["seed"]), f, opt("_per_task.csv"), opt(".json"),
                                 opt("_norms.csv"), opt("_cosine.csv")))
    order = {s: i for i, s in enumerate(suites)} if suites is not None else {}
    return sorted(found, key=lambda r: (order.get(r.suite, len(order)), r.suite, r.size, r.seed))


def require_results(folder: str | os.PathLike, suites: Sequence[str], size: str) -> list[ResultFiles]:
    """:func:`find_results`, raising ``FileNotFoundError`` that names the command to run when
    a suite has no result file (or a run lacks its per-task file)."""
    runs = find_results(folder, suites, size)
    missing = [s for s in suites if not any(r.suite == s for r in runs)]
    incomplete = [r.stem for r in runs if r.per_task is None]
    if missing or incomplete:
        what = (f"no {', '.join(f'{s}_{size}_seed*_summary.csv' for s in missing)}" if missing
                else f"no per-task file for {', '.join(incomplete)}")
        raise FileNotFoundError(f"{what} in {Path(folder).resolve()}. Run the benchmark first, from the repository "
                                f"root: `bash benchmarks/mini_world.sh` (every suite, seeds 0 1 2), or "
                                f"`{bench_command(missing or suites, size)}`; or pass recompute=True.")
    return runs


def _n_tasks(files: ResultFiles) -> int:
    if files.per_task is not None:
        pt = pd.read_csv(files.per_task, usecols=["task"])
        return int(pt["task"].nunique())
    if files.record is not None:
        return len(json.loads(files.record.read_text())["tasks"])
    raise FileNotFoundError(f"{files.stem}: neither a per-task nor a JSON file tells the number of tasks")


def load_summary(runs: Sequence[ResultFiles]) -> pd.DataFrame:
    """One row per (suite, seed, method): ``suite, n_tasks, size, seed, method, kind`` (``reference``
    or ``method``) and the summary columns (``coef_name, coef, test_acc, test_normalized,
    val_normalized, merge_seconds``)."""
    frames = []
    for r in runs:
        df = pd.read_csv(r.summary)
        df.insert(0, "seed", r.seed)
        df.insert(0, "size", r.size)
        df.insert(0, "n_tasks", _n_tasks(r))
        df.insert(0, "suite", r.suite)
        frames.append(df)
    if not frames:
        raise ValueError("no result files given")
    out = pd.concat(frames, ignore_index=True)
    out.insert(out.columns.get_loc("method") + 1, "kind",
               np.where(out["method"].isin(REFERENCES), "reference", "method"))
    return out


def load_per_task(runs: Sequence[ResultFiles]) -> pd.DataFrame:
    """One row per (suite, seed, method, task, split): ``accuracy`` and ``normalized`` (%)."""
    frames = []
    for r in runs:
        if r.per_task is None:
            raise FileNotFoundError(f"{r.stem}: no per-task file")
        df = pd.read_csv(r.per_task)
        df.insert(0, "seed", r.seed)
        df.insert(0, "suite", r.suite)
        frames.append(df)
    if not frames:
        raise ValueError("no result files given")
    return pd.concat(frames, ignore_index=True)


def load_records(runs: Sequence[ResultFiles]) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(suite, seed): the run's JSON record}`` for the runs that have one."""
    return {(r.suite, r.seed): json.loads(r.record.read_text()) for r in runs if r.record is not None}


def search_traces(record: Mapping[str, Any]) -> pd.DataFrame:
    """Every validation search of one JSON record, long format: ``method, coef_name, alpha,
    step, is_best, task`` (``"mean"`` for the task average), ``accuracy``, ``normalized`` (%).
    Methods without a search (no trace) are absent."""
    rows = []
    for run in record.get("runs", []):
        trace = run.get("search_trace")
        if not trace:
            continue
        for e in trace:
            base = {"method": run["method"], "coef_name": run.get("coef_name"), "alpha": float(e["alpha"]),
                    "step": int(e["step"]), "is_best": bool(e["is_best"])}
            rows.append({**base, "task": "mean", "accuracy": 100 * e["avg_top1"],
                         "normalized": 100 * e["avg_normalized_top1"]
                         if e.get("avg_normalized_top1") is not None else math.nan})
            for k, v in e.items():
                if k.endswith(":top1") and not k.endswith(":normalized_top1"):
                    t = k[: -len(":top1")]
                    n = e.get(f"{t}:normalized_top1")
                    rows.append({**base, "task": t, "accuracy": 100 * v,
                                 "normalized": math.nan if n is None else 100 * n})
    cols = ["method", "coef_name", "alpha", "step", "is_best", "task", "accuracy", "normalized"]
    return pd.DataFrame(rows, columns=cols).sort_values(["method", "alpha", "task"], kind="stable").reset_index(drop=True)


def load_regime(files: ResultFiles) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(norms, cosine)`` of one run: ‖tau‖/‖W0‖ per task × layer type, and the task-vector
    cosine matrix (see :meth:`acetools.benchmark.Benchmark.regime`)."""
    if files.norms is None or files.cosine is None:
        raise FileNotFoundError(f"{files.stem}: no _norms.csv / _cosine.csv (saved with regime=False?)")
    return pd.read_csv(files.norms, index_col=0), pd.read_csv(files.cosine, index_col=0)


# --------------------------------------------------------------------------- aggregation
_METRICS = ("test_acc", "test_normalized", "val_normalized", "merge_seconds")


def aggregate(summary: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds per (suite, method): columns ``suite, n_tasks,
    method, kind, n_seeds``, ``<metric>`` and ``<metric>_sd`` for test_acc, test_normalized,
    val_normalized, merge_seconds (those present), and ``coef`` (mean). Order: suites and
    methods as first seen. The sd is NaN with one seed."""
    keys = ["suite", "n_tasks", "method", "kind"]
    g = summary.groupby(keys, sort=False)
    out = g.agg(n_seeds=("seed", "nunique"))
    out["coef"] = g["coef"].mean() if "coef" in summary.columns else math.nan
    for m in _METRICS:
        if m in summary.columns:  # frames from load_merge_speed have times only
            out[m] = g[m].mean()
            out[f"{m}_sd"] = g[m].std(ddof=1)
    return out.reset_index()


def wide(agg: pd.DataFrame, metric: str = "test_normalized") -> pd.DataFrame:
    """``metric`` as a method × suite table (suites in ``n_tasks`` order)."""
    suites = agg.drop_duplicates("suite").sort_values("n_tasks", kind="stable")["suite"].tolist()
    t = agg.pivot(index="method", columns="suite", values=metric)
    methods = list(dict.fromkeys(agg["method"]))
    return t.reindex(index=methods, columns=suites)


def table1(agg: pd.DataFrame, metric: str = "test_normalized", digits: int = 1) -> pd.DataFrame:
    """The papers' Table 1 layout: methods × suites, cells ``"mean ± sd"`` over seeds (just the
    mean when a suite has one seed). Columns are labelled ``"<suite> (T=<n>)"``."""
    mean, sd = wide(agg, metric), wide(agg, f"{metric}_sd")
    n_tasks = agg.drop_duplicates("suite").set_index("suite")["n_tasks"]

    def cell(m: float, s: float) -> str:
        if not np.isfinite(m):
            return ""
        return f"{m:.{digits}f}" if not np.isfinite(s) else f"{m:.{digits}f} ± {s:.{digits}f}"

    out = pd.DataFrame({c: [cell(m, s) for m, s in zip(mean[c], sd[c])] for c in mean.columns}, index=mean.index)
    out.columns = [f"{c} (T={n_tasks[c]})" for c in out.columns]
    out.index.name = "method"
    return out


def per_task_matrix(per_task: pd.DataFrame, suite: str, *, split: str = "test", value: str = "normalized") -> pd.DataFrame:
    """Method × task ``value`` (mean over seeds) of one suite, methods and tasks in file order."""
    d = per_task[(per_task["suite"] == suite) & (per_task["split"] == split)]
    if d.empty:
        raise KeyError(f"no {split} rows for suite {suite!r}")
    t = d.groupby(["method", "task"], sort=False)[value].mean().unstack("task")
    return t.reindex(index=list(dict.fromkeys(d["method"])), columns=list(dict.fromkeys(d["task"])))


def task_scores(per_task: pd.DataFrame, suite: str, *, split: str = "test", value: str = "normalized") -> pd.DataFrame:
    """Long (method, task) rows with ``mean`` and ``sd`` of ``value`` over seeds, for per-task bars."""
    d = per_task[(per_task["suite"] == suite) & (per_task["split"] == split)]
    g = d.groupby(["method", "task"], sort=False)[value]
    return pd.DataFrame({"mean": g.mean(), "sd": g.std(ddof=1)}).reset_index()


# --------------------------------------------------------------------------- rank agreement
def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two paired sequences (ties in either count as neither concordant
    nor discordant): (C - D) / sqrt((n0 - n1)(n0 - n2)). NaN when either has no variation."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of the same length, got {x.shape} and {y.shape}")
    n = len(x)
    c = d = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            if sx == 0 and sy == 0:
                continue
            if sx == 0:
                tx += 1
            elif sy == 0:
                ty += 1
            elif sx == sy:
                c += 1
            else:
                d += 1
    denom = math.sqrt((c + d + tx) * (c + d + ty))
    return (c - d) / denom if denom > 0 else math.nan


def rank_agreement(ours: pd.Series | Mapping[str, float], paper: pd.Series | Mapping[str, float]) -> dict[str, Any]:
    """Kendall tau-b between our scores and a paper's on the methods both have (higher is
    better in both). Returns ``methods`` (in the paper's order, best first), ``n``, ``tau``,
    ``p_value`` (scipy's, NaN below 3 methods), ``concordant``/``discordant`` pair counts and
    both orderings."""
    ours, paper = pd.Series(ours, dtype=float).dropna(), pd.Series(paper, dtype=float).dropna()
    common = [m for m in paper.sort_values(ascending=False, kind="stable").index if m in ours.index]
    x, y = ours[common].to_numpy(), paper[common].to_numpy()
    tau = kendall_tau(x, y) if len(common) >= 2 else math.nan
    p = math.nan
    if len(common) >= 3 and np.isfinite(tau):
        from scipy.stats import kendalltau

        p = float(kendalltau(x, y).pvalue)
    sx = np.sign(np.subtract.outer(x, x))[np.triu_indices(len(x), 1)]
    sy = np.sign(np.subtract.outer(y, y))[np.triu_indices(len(y), 1)]
    return {"methods": common, "n": len(common), "tau": tau, "p_value": p,
            "concordant": int(np.sum(sx * sy > 0)), "discordant": int(np.sum(sx * sy < 0)),
            "ours_order": list(ours[common].sort_values(ascending=False, kind="stable").index), "paper_order": common}


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
    from .search import LAMBDA_GRID

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


# --------------------------------------------------------------------------- merge speed at ViT width
def load_merge_speed(folder: str | os.PathLike, blocks: int = 1) -> pd.DataFrame:
    """Merge times of ``benchmarks/merge_speed.py`` (random task vectors in ViT-B/32's shapes)
    from every ``<folder>/*/merge_speed.csv`` run with ``blocks`` transformer blocks, as a
    summary-like frame (``suite`` = ``"T<n>"``, ``n_tasks``, ``seed`` 0, ``method``, ``kind``,
    ``merge_seconds``, ``blocks``, ``width``, ``source``) that :func:`assess_cost` and
    :func:`assess_overhead` accept. Where two files time the same (method, T), the later
    file (by name) wins. Empty when there are none."""
    cols = ["suite", "n_tasks", "seed", "method", "kind", "merge_seconds", "blocks", "width", "source"]
    frames = []
    for f in sorted(Path(folder).glob("*/merge_speed.csv")):
        d = pd.read_csv(f)
        if "error" in d.columns:
            d = d[d["error"].isna()]
        d = d[(d["blocks"] == blocks) & d["seconds"].notna()]
        if len(d):
            frames.append(pd.DataFrame({
                "suite": [f"T{n}" for n in d["n_tasks"]], "n_tasks": d["n_tasks"].astype(int), "seed": 0,
                "method": d["method"], "kind": "method", "merge_seconds": d["seconds"].astype(float),
                "blocks": blocks, "width": d["width"] if "width" in d.columns else math.nan,
                "source": f"{f.parent.name}/{f.name}"}))
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True).drop_duplicates(["method", "n_tasks"], keep="last")
    return out.sort_values(["n_tasks", "method"], kind="stable").reset_index(drop=True)[cols]


# --------------------------------------------------------------------------- writing results
def load_wudi_step_size(folder: str | os.PathLike, size: str | None = None) -> pd.DataFrame:
    """The rows of every ``<folder>/wudi_step_size_<suite>_<size>_seed<k>.csv`` written by
    ``benchmarks/wudi_step_size.py`` (task arithmetic at lambda = 1, WUDI's start, and WUDI
    after 300 Adam steps at several learning rates), ordered by number of tasks, seed and
    learning rate. Empty when there are none."""
    frames = []
    for f in sorted(Path(folder).glob(f"wudi_step_size_*_{size or '*'}_seed*.csv")):
        d = pd.read_csv(f)
        need = {"suite", "n_tasks", "seed", "variant", "method", "lr", "test_normalized", "val_normalized"}
        if not need <= set(d.columns):
            raise ValueError(f"{f} lacks columns {sorted(need - set(d.columns))}; rerun benchmarks/wudi_step_size.py")
        frames.append(d.assign(file=f.name))
    if not frames:
        return pd.DataFrame(columns=["suite", "seed", "variant", "method", "lr", "val_normalized", "test_normalized",
                                     "n_tasks", "file"])
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["n_tasks", "suite", "seed", "lr"], kind="stable", na_position="first").reset_index(drop=True)


def prefix_world(zoo, n_tasks: int):
    """A view of ``zoo`` with only its first ``n_tasks`` tasks (sharing its loaded states and
    cache: experts are cached per task, so nothing is rebuilt). Its MTL model is switched off
    (the cached one was trained on all tasks). For the quick profile's "more tasks" axis."""
    import copy

    if not 1 <= n_tasks <= len(zoo.tasks):
        raise ValueError(f"n_tasks={n_tasks} must be in 1..{len(zoo.tasks)}")
    sub = copy.copy(zoo)
    sub.tasks = list(zoo.tasks[:n_tasks])
    sub.mtl = False
    sub.suite = None  # not a registered suite any more
    return sub


def write_results(bench, folder: str | os.PathLike, stem: str, methods: Sequence[str] | None = None,
                  progress: bool | None = False) -> dict[str, Path]:
    """Run ``methods`` (default all) plus the reference rows on ``bench`` and save them with
    :meth:`~acetools.benchmark.Benchmark.save` as ``<folder>/<stem>_*`` (``stem`` must look
    like ``<suite>_<size>_seed<k>`` for :func:`find_results`)."""
    if not _STEM.match(f"{stem}_summary.csv"):
        raise ValueError(f"stem {stem!r} must look like '<suite>_<size>_seed<k>'")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    runs = bench.run_all(methods, progress=progress)
    return bench.save(runs, folder, stem)


def to_markdown(df: pd.DataFrame, *, index: bool = False, floatfmt: str = ".2f") -> str:
    """A GitHub-flavoured markdown table of ``df`` (``|`` and newlines in cells escaped)."""
    d = df.reset_index() if index else df

    def fmt(v) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else format(v, floatfmt)
        return str(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(fmt(c) for c in d.columns) + " |"
    sep = "|" + "|".join("---" for _ in d.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in d.itertuples(index=False)]
    return "\n".join([head, sep, *body]) + "\n"
