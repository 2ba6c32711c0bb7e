"""Lesson 07 (docs/course.md §07_language): merging language models on the text world
(:mod:`acetools.world.text`), its tables (the verdicts of ACE's language claims: ``claimkit.language``),
beside the published anchor RoBERTa-base on 8 GLUE tasks (:data:`ROBERTA_GLUE`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..results import aggregate, find_results, load_per_task, load_summary
from ..utils import progress as bar
from .paper_tables import ROBERTA_GLUE  # the published anchor, RoBERTa-base on 8 GLUE tasks


def task_table(world) -> pd.DataFrame:
    """One row per task: source, classes, texts per class, the expert's validation accuracy and training time."""
    from ..world.text.sources import SOURCES

    rows = []
    for t in world.tasks:
        spec = world.task_specs[t]
        world.expert_state(t)
        m = (world._sides.get(t) or {}).get("metrics", {})
        rows.append({"task": t, "source": SOURCES[spec.source].doc, "classes": len(spec.classes),
                     "per class (train/val/test)": f"{spec.n_train}/{spec.n_val}/{spec.n_test}",
                     "expert val acc (%)": 100 * float(m.get("val_acc", math.nan)),
                     "training (s)": m.get("seconds")})
    return pd.DataFrame(rows)


#: The stage ablation's rows: (label, ACE hyperparameters) at each eps.
STAGE_ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("gate auto (code)", {}),
    ("gate off", {"gate": "off"}),
    ("gate on (forced)", {"gate": "on"}),
    ("gate on, no normalization", {"gate": "on", "trace_norm": False}),
    ("gate on, no prior", {"gate": "on", "prior": False}),
    ("gate on, no refinement", {"gate": "on", "refine": False}),
)


def stage_ablation(bench, eps: Sequence[float] = (1e-2, 2e-4, 1e-5), rows=STAGE_ROWS,
                   progress: bool | None = None) -> pd.DataFrame:
    """ACE's stages on the text world: each of :data:`STAGE_ROWS` at each ``eps``, merged once and scored on
    validation and test (means over tasks, %; ``correct``: each test example's correctness per task, and
    ``attrs["experts"]`` the experts' test accuracy, for paired margins)."""
    jobs = [(e, label, hp) for e in eps for label, hp in rows]
    out = []
    for e, label, hp in bar(jobs, desc="ACE stages", enabled=progress):
        run = bench.run("ace", search=None, label=label, eps=e, **hp)
        s = run.summary()
        out.append({"eps": e, "setting": label, **{k: str(v) for k, v in hp.items()},
                    "val_normalized": s["val_normalized"], "test_normalized": s["test_normalized"],
                    "test_acc": s["test_acc"], "merge_seconds": s["merge_seconds"], "correct": run.test_correct})
    table = pd.DataFrame(out)
    table.attrs["experts"] = bench.expert_accuracy("test")
    return table


def stage_view(abl: pd.DataFrame) -> pd.DataFrame:
    """:func:`stage_ablation` in five plain columns (accuracies in %)."""
    return abl[["eps", "setting", "val_normalized", "test_normalized", "test_acc"]].rename(columns={
        "eps": "ε", "val_normalized": "validation, normalized (%)", "test_normalized": "test, normalized (%)",
        "test_acc": "test accuracy (%)"})


def benchmark_tables(folder: str | Path, suite: str = "text8") -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per_seed, mean)``: the committed summaries of ``suite`` in ``folder`` and their mean / sd over seeds."""
    runs = find_results(folder, suites=[suite])
    if not runs:
        raise FileNotFoundError(f"no {suite}_*_seed*_summary.csv in {folder}: run "
                                f"`python3 benchmarks/text_world.py bench --suite {suite} --seeds 0 1 2`")
    per_seed = load_summary(runs)
    return per_seed, aggregate(per_seed)


def beside_anchor(mean: pd.DataFrame, suite: str = "text8") -> pd.DataFrame:
    """The text world's normalized accuracies (``mean`` of :func:`benchmark_tables`) beside RoBERTa-base GLUE's,
    with the two rooms (TSV-M and WUDI minus task arithmetic) as last rows."""
    ours = mean[mean["suite"] == suite].set_index("method")["test_normalized"]
    base = next((b for b in ours.index if str(b).startswith("base (")), None)
    rows = [{"method": m, "text world": float(ours.get(base if m == "pretrained" else m, np.nan)),
             "RoBERTa-base GLUE": a} for m, a in ROBERTA_GLUE.items()]
    df = pd.DataFrame(rows).set_index("method")
    for rival in ("tsv_m", "wudi"):
        df.loc[f"{rival} − task_arithmetic"] = df.loc[rival] - df.loc["task_arithmetic"]
    return df.reset_index()


def room_by_task(folder: str | Path, suite: str = "text8",
                 methods: Sequence[str] = ("task_arithmetic", "tsv_m", "ace (eps 2e-4)")) -> pd.DataFrame:
    """Where the room for structured merges lives: per task, the base and each of ``methods``
    (normalized test accuracy, mean over the committed seeds) and TSV-M minus task arithmetic,
    largest first. The room is the mean of the last column over tasks."""
    runs = find_results(folder, suites=[suite])
    if not runs:
        raise FileNotFoundError(f"no {suite}_*_seed*_per_task.csv in {folder}")
    pt = load_per_task(runs)
    t = pt[pt["split"] == "test"].pivot_table(index="task", columns="method", values="normalized", aggfunc="mean")
    base = next((c for c in t.columns if str(c).startswith("base (")), None)
    cols = ([base] if base else []) + [m for m in methods if m in t.columns]
    out = t[cols].copy()
    out["tsv_m − task_arithmetic"] = t["tsv_m"] - t["task_arithmetic"]
    out = out.sort_values("tsv_m − task_arithmetic", ascending=False).rename_axis("task").reset_index()
    out.columns.name = None
    return out


def growth_table(folder: str | Path, suites: Sequence[str] = ("text8", "text12"),
                 methods: Sequence[str] = ("tsv_m", "iso_cts", "esm", "wudi", "ace", "ace (eps 2e-4)",
                                           "ace (eps 1e-5)")) -> pd.DataFrame:
    """Each method's lead over task arithmetic (normalized points, mean over seeds) per suite of ``suites``
    found in ``folder``: how the leads move as T grows (an empty frame when no suite has results)."""
    cols = {}
    for suite in suites:
        if not find_results(folder, suites=[suite]):
            continue
        per_seed, mean = benchmark_tables(folder, suite)
        m = mean.set_index("method")["test_normalized"]
        n_tasks, n_seeds = int(per_seed["n_tasks"].iloc[0]), int(per_seed["seed"].nunique())
        cols[f"{suite} (T = {n_tasks}, {n_seeds} seed{'s' if n_seeds > 1 else ''})"] = {
            f"{x} − task_arithmetic": float(m[x] - m["task_arithmetic"]) for x in methods if x in m.index}
    return pd.DataFrame(cols).rename_axis("lead").reset_index() if cols else pd.DataFrame()
