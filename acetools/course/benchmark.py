"""Lesson 04 (docs/course.md §04_benchmark): its data and tables. The result files are read by
:mod:`acetools.results`; which differences count and the claims' verdicts are ``claimkit.benchmark``'s."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pandas as pd

from .. import results
from ..benchmark import ACE_SCALED_ROW, VARIANTS
from ..errors import InputError
from ..merging import METHODS
from ..results import DATA_DEPENDENT, REFERENCES, aggregate, rank_agreement, wide
from ..search import PATIENCE
from . import paper_tables
from . import world as course


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
    from ..world.text.world import TextWorld

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
