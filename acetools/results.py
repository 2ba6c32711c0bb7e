"""Benchmark result files (``acetools bench --out DIR``, :meth:`acetools.benchmark.Benchmark.save`)
read back as tidy tables, aggregated over seeds, and ranked against the papers (docs/results.md).

Files per suite, size and seed: ``<suite>_<size>_seed<k>_summary.csv``, ``..._per_task.csv``,
``..._seed<k>.json``, ``..._norms.csv``, ``..._cosine.csv`` and ``..._correct.npz`` (per-example
correctness). Row kinds: :func:`row_kind`. All accuracies are percentages, as the files store them.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .errors import InputError, InputKeyError
from .merging import METHODS
from .search import PATIENCE
from .utils import atomic_write

__all__ = ["save_correctness", "load_correctness", "REFERENCES", "DATA_DEPENDENT", "KINDS", "row_kind", "ResultFiles",
           "bench_command", "find_results", "require_results", "load_summary", "load_per_task", "load_records",
           "search_traces", "load_regime", "load_wudi_step_size", "aggregate", "table1", "wide", "per_task_matrix",
           "task_scores", "kendall_tau", "rank_agreement", "load_merge_speed", "prefix_world", "to_markdown"]

#: Reference rows of a summary (not merge methods).
#: The base row is named for its heads: the vision world's frozen prototype heads, the text
#: world's experts' trained heads (the GLUE protocol) or its zero-shot heads.
BASE_ROWS: tuple[str, ...] = ("base (frozen heads)", "base (experts' heads)", "base (zero-shot heads)")
REFERENCES: tuple[str, ...] = (*BASE_ROWS, "experts (individual)", "multi-task (MTL)")
#: Methods that use data besides the weights (so not "data-free" in ACE's sense).
DATA_DEPENDENT: dict[str, str] = {
    "regmean": "Gram matrices of training inputs",
    "esm": "unlabelled proxy images (32 per task)",
}

#: The kinds of summary rows, in the order tables show them.
KINDS: tuple[str, ...] = ("reference", "method", "variant")
_VARIANT = re.compile(r"^(?P<method>[a-z0-9_]+) \((?P<setting>.+)\)$")


def row_kind(method: str) -> str:
    """``reference`` (:data:`REFERENCES`), ``variant`` (``"<registered method> (<setting>)"``, e.g.
    ``ace (gate off)``) or ``method``."""
    if method in REFERENCES:
        return "reference"
    m = _VARIANT.match(method)
    return "variant" if m and m["method"] in METHODS else "method"


_STEM = re.compile(r"^(?P<suite>.+)_(?P<size>[^_]+)_seed(?P<seed>\d+)_summary\.csv$")


def bench_command(suites: Sequence[str], size: str = "small", seeds: Sequence[int] = (0, 1, 2),
                  out: str = "figures/benchmark") -> str:
    """The shell commands that write the result files this module reads."""
    return " && ".join(
        f"acetools bench --suite {s} --size {size} --seeds {' '.join(map(str, seeds))} --out {out} "
        f"--patience {PATIENCE} --n-val 100 --n-test 500" for s in suites
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
    correct: Path | None = None  # per-example correctness (save_correctness)

    @property
    def stem(self) -> str:
        return f"{self.suite}_{self.size}_seed{self.seed}"


def find_results(
    folder: str | os.PathLike, suites: Sequence[str] | None = None, size: str | None = None
) -> list[ResultFiles]:
    """Every run in ``folder`` (one per ``*_summary.csv``), filtered by ``suites`` / ``size`` and ordered by them."""
    folder = Path(folder)
    found = []
    for f in sorted(folder.glob("*_seed*_summary.csv")) if folder.is_dir() else []:
        m = _STEM.match(f.name)
        if not m or (size is not None and m["size"] != size) or (suites is not None and m["suite"] not in suites):
            continue
        stem = f.name[: -len("_summary.csv")]

        def opt(suffix: str, stem: str = stem) -> Path | None:
            p = folder / f"{stem}{suffix}"
            return p if p.is_file() else None

        found.append(ResultFiles(m["suite"], m["size"], int(m["seed"]), f, opt("_per_task.csv"), opt(".json"),
                                 opt("_norms.csv"), opt("_cosine.csv"), opt("_correct.npz")))
    order = {s: i for i, s in enumerate(suites)} if suites is not None else {}
    return sorted(found, key=lambda r: (order.get(r.suite, len(order)), r.suite, r.size, r.seed))


def require_results(folder: str | os.PathLike, suites: Sequence[str], size: str) -> list[ResultFiles]:
    """:func:`find_results`; ``FileNotFoundError`` naming the command to run where a suite or per-task file lacks."""
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


def _stacked(runs: Sequence[ResultFiles], file: str, front) -> pd.DataFrame:
    """Each run's ``file`` (a :class:`ResultFiles` field) read and stacked, ``front(run)``'s columns first."""
    if not runs:
        raise InputError("no result files given")
    frames = []
    for r in runs:
        if getattr(r, file) is None:
            raise FileNotFoundError(f"{r.stem}: no {file.replace('_', '-')} file")
        df = pd.read_csv(getattr(r, file))
        for i, (name, value) in enumerate(front(r).items()):
            df.insert(i, name, value)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def load_summary(runs: Sequence[ResultFiles]) -> pd.DataFrame:
    """One row per (suite, seed, method): ``suite, n_tasks, size, seed, method, kind`` (:func:`row_kind`)
    and the summary columns (``inputs_seconds``, the data inputs' capture, only in newer files)."""
    out = _stacked(runs, "summary", lambda r: {"suite": r.suite, "n_tasks": _n_tasks(r), "size": r.size,
                                                "seed": r.seed})
    out.insert(list(out.columns).index("method") + 1, "kind", [row_kind(m) for m in out["method"]])
    return out


def load_per_task(runs: Sequence[ResultFiles]) -> pd.DataFrame:
    """One row per (suite, seed, method, task, split): ``accuracy`` and ``normalized`` (%)."""
    return _stacked(runs, "per_task", lambda r: {"suite": r.suite, "seed": r.seed})


def load_records(runs: Sequence[ResultFiles]) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(suite, seed): the run's JSON record}`` for the runs that have one."""
    return {(r.suite, r.seed): json.loads(r.record.read_text()) for r in runs if r.record is not None}


def search_traces(record: Mapping[str, Any]) -> pd.DataFrame:
    """Every validation search of one JSON record, long: ``method, coef_name, alpha, step, is_best, task``
    (``"mean"``: the average), ``accuracy``, ``normalized`` (%)."""
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
    out = pd.DataFrame(rows, columns=cols).sort_values(["method", "alpha", "task"], kind="stable")
    return out.reset_index(drop=True)


def load_regime(files: ResultFiles) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(norms, cosine)`` of one run: ‖tau‖/‖W0‖ per task × layer type, and the task-vector
    cosine matrix (see :meth:`acetools.benchmark.Benchmark.regime`)."""
    if files.norms is None or files.cosine is None:
        raise FileNotFoundError(f"{files.stem}: no _norms.csv / _cosine.csv (saved with regime=False?)")
    return pd.read_csv(files.norms, index_col=0), pd.read_csv(files.cosine, index_col=0)


# --------------------------------------------------------------------------- aggregation
_METRICS = ("test_acc", "test_normalized", "val_normalized", "merge_seconds", "inputs_seconds")


def aggregate(summary: pd.DataFrame) -> pd.DataFrame:
    """Mean and sd over seeds per (suite, method), in first-seen order: ``n_seeds``, ``coef`` (mean) and
    ``<metric>`` / ``<metric>_sd`` of each metric present (sd NaN with one seed). The one aggregation
    over seeds in acetools."""
    keys = ["suite", "n_tasks", "method", "kind"]
    g = summary.groupby(keys, sort=False, dropna=False)  # n_tasks may be unknown (NaN): keep those rows
    out = g.agg(n_seeds=("seed", "nunique"))
    out["coef"] = g["coef"].mean() if "coef" in summary.columns else math.nan
    for m in _METRICS:
        if m in summary.columns:  # frames from load_merge_speed have times only
            out[m] = g[m].mean()
            out[f"{m}_sd"] = g[m].std(ddof=1)
    return out.reset_index()


def wide(agg: pd.DataFrame, metric: str = "test_normalized") -> pd.DataFrame:
    """``metric`` as a method × suite table (suites in ``n_tasks`` order; rows as first seen,
    references, then methods, then variants: :data:`KINDS`)."""
    suites = agg.drop_duplicates("suite").sort_values("n_tasks", kind="stable")["suite"].tolist()
    kinds = agg.drop_duplicates("method").set_index("method")["kind"] if "kind" in agg else {}
    rank = {k: i for i, k in enumerate(KINDS)}
    rows = sorted(dict.fromkeys(agg["method"]), key=lambda m: rank.get(kinds.get(m, row_kind(m)), 1))  # stable
    return agg.pivot(index="method", columns="suite", values=metric).reindex(index=rows, columns=suites)


def table1(agg: pd.DataFrame, metric: str = "test_normalized", digits: int = 1) -> pd.DataFrame:
    """The papers' Table 1 layout: methods × suites, cells ``"mean ± sd"`` over seeds (just the
    mean when a suite has one seed). Columns are labelled ``"<suite> (T=<n>)"``. Variant rows
    (:func:`row_kind`) come after the methods, labelled ``"variant: <label>"``."""
    mean, sd = wide(agg, metric), wide(agg, f"{metric}_sd")
    n_tasks = agg.drop_duplicates("suite").set_index("suite")["n_tasks"]

    def cell(m: float, s: float) -> str:
        if not np.isfinite(m):
            return ""
        return f"{m:.{digits}f}" if not np.isfinite(s) else f"{m:.{digits}f} ± {s:.{digits}f}"

    out = pd.DataFrame({c: [cell(m, s) for m, s in zip(mean[c], sd[c])] for c in mean.columns}, index=mean.index)
    out.columns = [f"{c} (T={n_tasks[c]})" for c in out.columns]
    out.index = [f"variant: {m}" if row_kind(m) == "variant" else m for m in out.index]
    out.index.name = "method"
    return out


def per_task_matrix(
    per_task: pd.DataFrame, suite: str, *, split: str = "test", value: str = "normalized"
) -> pd.DataFrame:
    """Method × task ``value`` (mean over seeds) of one suite, methods and tasks in file order."""
    d = per_task[(per_task["suite"] == suite) & (per_task["split"] == split)]
    if d.empty:
        raise InputKeyError(f"no {split} rows for suite {suite!r}")
    t = d.groupby(["method", "task"], sort=False)[value].mean().unstack("task")
    return t.reindex(index=list(dict.fromkeys(d["method"])), columns=list(dict.fromkeys(d["task"])))


def task_scores(per_task: pd.DataFrame, suite: str, *, split: str = "test", value: str = "normalized") -> pd.DataFrame:
    """Long (method, task) rows with ``mean`` and ``sd`` of ``value`` over seeds, for per-task bars."""
    d = per_task[(per_task["suite"] == suite) & (per_task["split"] == split)]
    g = d.groupby(["method", "task"], sort=False)[value]
    return pd.DataFrame({"mean": g.mean(), "sd": g.std(ddof=1)}).reset_index()


# --------------------------------------------------------------------------- rank agreement
def _pair_signs(x: np.ndarray) -> np.ndarray:
    """sign(x_i - x_j) for every pair i < j."""
    return np.sign(np.subtract.outer(x, x))[np.triu_indices(len(x), 1)]


def kendall_tau(x: ArrayLike, y: ArrayLike) -> float:
    """Kendall's tau-b of two paired sequences: (C - D) / sqrt((C + D + T_x)(C + D + T_y)), T_x the pairs
    tied in x only; NaN when either has no variation."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise InputError(f"x and y must be 1-D of the same length, got {xa.shape} and {ya.shape}")
    sx, sy = _pair_signs(xa), _pair_signs(ya)
    c, d = int(np.sum(sx * sy > 0)), int(np.sum(sx * sy < 0))
    denom = math.sqrt((c + d + np.sum((sx == 0) & (sy != 0))) * (c + d + np.sum((sy == 0) & (sx != 0))))
    return (c - d) / denom if denom > 0 else math.nan


def rank_agreement(ours: pd.Series | Mapping[str, float], paper: pd.Series | Mapping[str, float]) -> dict[str, Any]:
    """Kendall tau-b of our scores against a paper's on the methods both have: ``methods`` (paper's order),
    ``n``, ``tau``, ``p_value`` (scipy's; NaN below 3), ``concordant``, ``discordant`` and both orderings."""
    ours, paper = pd.Series(ours, dtype=float).dropna(), pd.Series(paper, dtype=float).dropna()
    common = [m for m in paper.sort_values(ascending=False, kind="stable").index if m in ours.index]
    x, y = ours[common].to_numpy(), paper[common].to_numpy()
    tau = kendall_tau(x, y) if len(common) >= 2 else math.nan
    p = math.nan
    if len(common) >= 3 and np.isfinite(tau):
        from scipy.stats import kendalltau

        res = cast(Any, kendalltau(x, y))  # scipy's axis/nan-policy decorator hides its SignificanceResult type
        p = float(res.pvalue)
    sx, sy = _pair_signs(x), _pair_signs(y)
    return {"methods": common, "n": len(common), "tau": tau, "p_value": p,
            "concordant": int(np.sum(sx * sy > 0)), "discordant": int(np.sum(sx * sy < 0)),
            "ours_order": list(ours[common].sort_values(ascending=False, kind="stable").index), "paper_order": common}


# --------------------------------------------------------------------------- merge speed at ViT width
def load_merge_speed(folder: str | os.PathLike, blocks: int = 1) -> pd.DataFrame:
    """Merge times of ``benchmarks/merge_speed.py`` from every ``<folder>/*/merge_speed.csv`` at ``blocks``
    blocks as a summary-like frame (``suite`` "T<n>", ``merge_seconds``, ``source``, ...); empty if none.
    Times are read as ratios to TSV-M's: per T the last file (by name) timing ``tsv_m`` gives every method
    it times, the last file timing a method it lacks gives that one."""
    cols = ["suite", "n_tasks", "seed", "method", "kind", "merge_seconds", "blocks", "width", "source"]
    frames = []
    for order, f in enumerate(sorted(Path(folder).glob("*/merge_speed.csv"))):
        d = pd.read_csv(f)
        if "error" in d.columns:
            d = d[d["error"].isna()]
        d = d[(d["blocks"] == blocks) & d["seconds"].notna()]
        # today's code (not a --before tree), the default variant, the function entry, and the log-normal
        # world (ACE's gate fires there, as on real task vectors)
        for col, keep in (("code", "now"), ("variant", "-"), ("world", "lognormal"), ("entry", "func")):
            if col in d.columns:
                d = d[d[col].fillna(keep).astype(str) == keep]
        if len(d):
            frames.append(pd.DataFrame({
                "suite": [f"T{n}" for n in d["n_tasks"]], "n_tasks": d["n_tasks"].astype(int), "seed": 0,
                "method": d["method"], "kind": "method", "merge_seconds": d["seconds"].astype(float),
                "blocks": blocks, "width": d["width"] if "width" in d.columns else math.nan,
                "source": f"{f.parent.name}/{f.name}", "order": order}))
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    ref = out[out["method"] == "tsv_m"].groupby("n_tasks")["order"].max()
    out["session"] = [o == ref.get(t, -1) for o, t in zip(out["order"], out["n_tasks"])]
    out = out.sort_values(["session", "order"], kind="stable").drop_duplicates(["method", "n_tasks"], keep="last")
    return out.sort_values(["n_tasks", "method"], kind="stable").reset_index(drop=True)[cols]


# --------------------------------------------------------------------------- writing results
def load_wudi_step_size(folder: str | os.PathLike, size: str | None = None) -> pd.DataFrame:
    """The rows of every ``<folder>/wudi_step_size_*_<size>_seed<k>.csv`` of ``benchmarks/wudi_step_size.py``,
    ordered by tasks, seed and learning rate; empty when there are none."""
    frames = []
    for f in sorted(Path(folder).glob(f"wudi_step_size_*_{size or '*'}_seed*.csv")):
        d = pd.read_csv(f)
        need = {"suite", "n_tasks", "seed", "variant", "method", "lr", "test_normalized", "val_normalized"}
        if not need <= set(d.columns):
            raise InputError(f"{f} lacks columns {sorted(need - set(d.columns))}; rerun benchmarks/wudi_step_size.py")
        frames.append(d.assign(file=f.name))
    if not frames:
        return pd.DataFrame(columns=["suite", "seed", "variant", "method", "lr", "val_normalized", "test_normalized",
                                     "n_tasks", "file"])
    out = pd.concat(frames, ignore_index=True)
    out = out.sort_values(["n_tasks", "suite", "seed", "lr"], kind="stable", na_position="first")
    return out.reset_index(drop=True)


def prefix_world(zoo, n_tasks: int):
    """A view of ``zoo`` with its first ``n_tasks`` tasks (its cache shared, no MTL model), for the quick
    profile's "more tasks" axis."""
    if not 1 <= n_tasks <= len(zoo.tasks):
        raise InputError(f"n_tasks={n_tasks} must be in 1..{len(zoo.tasks)}")
    sub = copy.copy(zoo)
    sub.tasks = list(zoo.tasks[:n_tasks])
    sub.mtl = False
    sub.suite = None  # not a registered suite any more
    return sub


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


def save_correctness(path: str | Path, hits: Mapping[str, Mapping[str, ArrayLike]]) -> Path:
    """Write ``{row: {task: bool array}}`` (each test example's correctness) to a compressed ``.npz``, one bit
    per example, atomically."""
    index, arrays = [], {}
    for row, per_task in hits.items():
        for task, h in per_task.items():
            b = np.asarray(h).astype(bool).ravel()
            arrays[f"a{len(index)}"] = np.packbits(b)
            index.append([str(row), str(task), int(b.size)])
    path = Path(path)
    with atomic_write(path, "wb") as fh:
        np.savez_compressed(fh, index=np.array(json.dumps(index)), **arrays)
    return path


def load_correctness(path: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """Read :func:`save_correctness`'s file back as ``{row: {task: bool array}}``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no per-example results at {path}; rerun the benchmark that wrote its tables")
    with np.load(path) as z:
        out: dict[str, dict[str, np.ndarray]] = {}
        for i, (row, task, n) in enumerate(json.loads(str(z["index"]))):
            out.setdefault(row, {})[task] = np.unpackbits(z[f"a{i}"])[:n].astype(bool)
    return out
