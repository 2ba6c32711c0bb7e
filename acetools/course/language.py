"""Lesson 07 (docs/course.md §07_language): merging language models on the text world
(:mod:`acetools.world.text`), its tables and ACE's language claims (each verdict's rule in its docstring),
beside the published anchor RoBERTa-base on 8 GLUE tasks (:data:`ROBERTA_GLUE`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from ..errors import InputError
from .verdicts import Verdict, World, agreement, compare, decide, effect, margin

#: RoBERTa-base on 8 GLUE tasks, normalized accuracy (ESM's table; WUDI's README agrees);
#: ACE's 90.4 is ACE-Merging's own table (docs/text-world.md).
ROBERTA_GLUE: dict[str, float] = {
    "pretrained": 41.7, "weight_averaging": 52.6, "task_arithmetic": 68.1, "ties": 64.7, "tsv_m": 79.0,
    "wudi": 85.3, "esm": 89.6, "ace": 90.4,
}

def task_table(world) -> pd.DataFrame:
    """One row per task: source, classes, texts per class (train / val / test), the expert's
    validation accuracy (from its sidecar) and the build's training time: six columns."""
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
    """ACE's stages on the text world: each of :data:`STAGE_ROWS` at each ``eps``, merged once
    (ACE has no searched coefficient) and scored on validation and test. Columns: ``eps``,
    ``setting``, the hyperparameters, ``val_normalized``, ``test_normalized`` (mean over tasks,
    percent), ``test_acc``, ``gated`` (the share of matrices on the flagged path)."""
    from ..utils import progress as bar

    jobs = [(e, label, hp) for e in eps for label, hp in rows]
    out = []
    for e, label, hp in bar(jobs, desc="ACE stages", enabled=progress):
        run = bench.run("ace", search=None, label=label, eps=e, **hp)
        s = run.summary()
        out.append({"eps": e, "setting": label, **{k: str(v) for k, v in hp.items()},
                    "val_normalized": s["val_normalized"], "test_normalized": s["test_normalized"],
                    "test_acc": s["test_acc"], "merge_seconds": s["merge_seconds"]})
    return pd.DataFrame(out)


def stage_view(abl: pd.DataFrame) -> pd.DataFrame:
    """:func:`stage_ablation` in five plain columns (accuracies in %)."""
    return abl[["eps", "setting", "val_normalized", "test_normalized", "test_acc"]].rename(columns={
        "eps": "ε", "val_normalized": "validation, normalized (%)", "test_normalized": "test, normalized (%)",
        "test_acc": "test accuracy (%)"})


def benchmark_tables(folder: str | Path, suite: str = "text8") -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per_seed, mean)``: the committed summaries of ``suite`` in ``folder`` (one row per seed
    and method) and their mean / sd over seeds (:func:`acetools.results.aggregate`)."""
    from ..results import aggregate, find_results, load_summary

    runs = find_results(folder, suites=[suite])
    if not runs:
        raise FileNotFoundError(f"no {suite}_*_seed*_summary.csv in {folder}: run "
                                f"`python3 benchmarks/text_world.py bench --suite {suite} --seeds 0 1 2`")
    per_seed = load_summary(runs)
    return per_seed, aggregate(per_seed)


# --------------------------------------------------------------------------- verdicts
def _paired(per_seed: pd.DataFrame, a: str, b: str) -> tuple[float, float, int]:
    """Mean and sd over seeds of test_normalized(a) − test_normalized(b), and the seed count."""
    p = per_seed.pivot_table(index="seed", columns="method", values="test_normalized")
    d = (p[a] - p[b]).dropna()
    return float(d.mean()), float(d.std(ddof=1)) if len(d) > 1 else math.nan, len(d)


def verdict_sota(per_seed: pd.DataFrame, ace_row: str = "ace (eps 2e-4)",
                 rivals: Sequence[str] = ("wudi", "ties", "tsv_m"), *, world: World | None = None,
                 n_tasks: int = 8) -> Verdict:
    """"ACE beats WUDI, TIES and TSV-M on language": ACE at the paper's RoBERTa setting
    (``ace_row``) against each rival of the claim, paired over seeds; a lead counts when it
    exceeds :func:`~acetools.course.verdicts.margin` (NOISE or the seed spread). Reproduced when
    ACE leads every rival, partly when some, not reproduced when none. On RoBERTa-GLUE the
    paper's numbers give ACE 90.4 against WUDI 85.3, TIES 64.7, TSV-M 79.0: all three leads count.

    With ``world`` (the text world's :class:`~acetools.course.verdicts.World`, its room at
    ``n_tasks``) each of the paper's leads is carried into the world by the course's scaling rule
    (docs/course.md §Scaling rule): RoBERTa-GLUE's room is TSV-M − task arithmetic = 10.9 points,
    and a rival whose scaled lead does not clear the margin is undecidable here; none left ->
    ``undecidable here``."""
    diffs = {r: _paired(per_seed, ace_row, r) for r in rivals}
    outcome = {r: compare(d, sd) for r, (d, sd, _) in diffs.items()}
    n = max(n for _, _, n in diffs.values())
    measured = f"{ace_row} minus " + ", ".join(f"{r} {d:+.1f}" for r, (d, _, _) in diffs.items()) + \
        f" normalized points (mean over {n} seed{'s' if n > 1 else ''})"
    agree = [o == "better" for o in outcome.values()]
    reason = "; ".join(f"{r}: {o} (margin {margin(diffs[r][1]):.1f})" for r, o in outcome.items())
    if world is not None:
        room_p = ROBERTA_GLUE["tsv_m"] - ROBERTA_GLUE["task_arithmetic"]
        effects = [effect(r, d, paper=ROBERTA_GLUE["ace"] - ROBERTA_GLUE[r], paper_room=room_p,
                          world_room=world.room_at(n_tasks), spread=sd, noise=world.noise)
                   for r, (d, sd, _) in diffs.items()]
        v, note = decide(effects, agree)
        reason += f"; {note}" if note else ""
    else:
        effects = [effect(r, d, spread=sd) for r, (d, sd, _) in diffs.items()]
        v = agreement(agree)
    return Verdict(measured, v, reason, {"diffs": {r: d for r, (d, _, _) in diffs.items()},
                                         "sd": {r: s for r, (_, s, _) in diffs.items()}, "ace_row": ace_row},
                   effects)


def verdict_gamma(gam: pd.DataFrame, tau: float = 0.3) -> Verdict:
    """"RoBERTa has high heterogeneity (γ > 0.3)": reproduced when the median γ over matrices
    exceeds τ_γ, partly when some layer type's median does, not reproduced otherwise. The
    scale-free views are reported beside (they say whether the energies differ at all)."""
    med = float(gam["gamma"].median())
    by_type = gam.groupby("layer_type")["gamma"].median()
    above = [str(t) for t, g in by_type.items() if g > tau]
    v = "reproduced" if med > tau else ("partly" if above else "not reproduced")
    measured = (f"median γ {med:.3g} over {len(gam)} matrices, {100 * gam['flag'].mean():.0f} % above τ_γ = {tau:g}; "
                f"cv of the energies {gam['cv'].median():.2f}, sd of their logs {gam['log_sd'].median():.2f}")
    reason = (f"median γ {'>' if med > tau else '≤'} τ_γ" + (f"; above it: {', '.join(above)}" if above else
                                                            "; no layer type above it"))
    return Verdict(measured, v, reason, {"gamma_median": med, "flagged_share": float(gam["flag"].mean()),
                                         "cv_median": float(gam["cv"].median()),
                                         "log_sd_median": float(gam["log_sd"].median())}, value=med)


def verdict_stage(abl: pd.DataFrame, without: str, stage: str, *, eps: float | None = None,
                  forced: bool = True) -> Verdict:
    """A stage "improves the merge" / "matters": ``gate on (forced)`` minus ``without`` (the
    forced path with the stage off) at ``eps`` (default: every eps in ``abl``); a gain counts
    above NOISE (one ablation per eps, no seed spread). Reproduced when the gain counts at
    every eps, partly at some, not reproduced at none. ``forced`` labels a world where the
    code's gate flags no matrix, so the stage runs only because the gate was forced."""
    sub = abl if eps is None else abl[abl["eps"] == eps]
    gains = {}
    for e, g in sub.groupby("eps", sort=False):
        on = g.loc[g["setting"] == "gate on (forced)", "test_normalized"]
        off = g.loc[g["setting"] == without, "test_normalized"]
        if len(on) and len(off):
            gains[float(cast(float, e))] = float(on.iloc[0] - off.iloc[0])  # eps: a numeric column
    if not gains:
        raise InputError(f"the ablation has no rows 'gate on (forced)' and {without!r}")
    v = agreement([compare(d) == "better" for d in gains.values()])
    label = " (gate forced on every matrix)" if forced else ""
    measured = f"{stage}{label}: " + ", ".join(f"eps {e:g}: {d:+.1f}" for e, d in gains.items()) + " normalized points"
    reason = f"a gain counts above {margin():.1f} point" + ("s" if margin() != 1 else "")
    return Verdict(measured, v, reason, {"gains": gains, "forced": forced},
                   [effect(f"eps {e:g}" + (" (gate forced)" if forced else ""), d) for e, d in gains.items()])


def verdict_spectrum(top5: float, cond: float | None = None) -> Verdict:
    """"W_pre's top 5 % singular values hold 99 %+ of the energy": reproduced at ≥ 99 %,
    partly at ≥ 90 %, not reproduced below (``top5`` in percent, median over matrices)."""
    v = "reproduced" if top5 >= 99 else ("partly" if top5 >= 90 else "not reproduced")
    return Verdict(f"W_pre's top-5 % energy {top5:.1f} % (median over matrices)", v,
                   "reproduced at ≥ 99 %, partly at ≥ 90 %", {"top5_energy": top5, "condition": cond}, value=top5)


def beside_anchor(mean: pd.DataFrame, suite: str = "text8") -> pd.DataFrame:
    """The text world's normalized accuracies beside RoBERTa-base GLUE's (:data:`ROBERTA_GLUE`),
    method by method, with the two rooms (TSV-M and WUDI minus task arithmetic) as last rows.
    ``mean``: :func:`benchmark_tables`' second table; the base row stands for "pretrained"."""
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
    from ..results import find_results, load_per_task

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
    """Each method's lead over task arithmetic (normalized points, mean over the seeds each suite
    has) in every suite of ``suites`` found in ``folder``: how the room and the leads move as T
    grows. One column per suite, named with its T and seed count; a suite with no committed
    results is left out (an empty frame when none has)."""
    from ..results import find_results

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
