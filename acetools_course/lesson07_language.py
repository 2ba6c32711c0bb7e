"""Lesson 07 (docs/course.md §07_language): merging language models on the text world
(:mod:`acetools.world.text`), its tables (the verdicts of ACE's language claims: this module),
beside the published anchor RoBERTa-base on 8 GLUE tasks (:data:`ROBERTA_GLUE`).

Figures of lesson 07 (merging language models): pure functions that draw on given axes.

Notebook 07's claim verdicts: ACE's language claims on the text world (docs/course.md §Claim
rules); the tables they read come from this module's experiments."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from acetools.errors import InputError
from acetools.plotting import track_drawing
from acetools.results import aggregate, find_results, load_per_task, load_summary
from acetools.utils import progress as bar

from .claims import paper_setting
from .lesson04_benchmark import TUNED_WUDI_ROW, competing_rivals, paired_difference
from .paper_tables import ROBERTA_GLUE  # the published anchor, RoBERTa-base on 8 GLUE tasks
from .power import paired_rows, paired_se
from .verdicts import NOT_TESTABLE, Verdict, World, agreement, compare, decide, effect, margin

# ---- Experiments: the tables and runs -------------------------------------------------------------

def task_table(world) -> pd.DataFrame:
    """One row per task: source, classes, texts per class, the expert's validation accuracy and training time."""
    from acetools.world.text.sources import SOURCES

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


# ---- Figures: the lesson's plots, drawn on a given axes -------------------------------------------

def stage_bars(ax, abl: pd.DataFrame, *, title: str | None = None):
    """ACE's stage ablation (``stage_ablation``): test normalized accuracy per setting, one group per eps."""
    settings = list(dict.fromkeys(abl["setting"]))
    eps = list(dict.fromkeys(abl["eps"]))
    w = 0.8 / len(eps)
    for i, e in enumerate(eps):
        sub = abl[abl["eps"] == e].set_index("setting").reindex(settings)
        ax.bar(np.arange(len(settings)) + (i - (len(eps) - 1) / 2) * w, sub["test_normalized"], width=w,
               label=f"eps {e:g}")
    ax.set_xticks(range(len(settings)), settings, rotation=25, ha="right")
    ax.set_ylabel("test accuracy (% normalized)")
    lo = float(np.nanmin(abl["test_normalized"]))
    ax.set_ylim(max(0.0, lo - 10), None)
    ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=True, title="ridge")
    ax.set_title(title or "ACE's stages on the text world")
    return ax


def anchor_bars(ax, beside: pd.DataFrame, *, title: str | None = None):
    """The text world's normalized accuracies beside RoBERTa-base GLUE's (``beside_anchor``, without the rooms)."""
    df = beside[~beside["method"].str.contains("−")]
    x = np.arange(len(df))
    ax.bar(x - 0.2, df["text world"], width=0.4, label="text world (MiniLM)")
    ax.bar(x + 0.2, df["RoBERTa-base GLUE"], width=0.4, label="RoBERTa-base GLUE (papers)")
    ax.set_xticks(x, df["method"], rotation=25, ha="right")
    ax.set_ylabel("test accuracy (% normalized)")
    ax.legend(fontsize=10, loc="upper left", frameon=True)
    ax.set_title(title or "the text world beside RoBERTa-base on GLUE")
    return ax


# ---- Verdicts: the lesson's claims, judged --------------------------------------------------------

def wudi_rows(per_seed: pd.DataFrame, suite: str) -> tuple[str, str]:
    """Of every WUDI row ``per_seed`` holds on ``suite`` (``wudi``, ``wudi (lr …)``, ``wudi (lr on val)``):
    the best on validation (mean ``val_normalized`` over seeds;
    :data:`~acetools_course.lesson04_benchmark.TUNED_WUDI_ROW` on a tie), the one a claim against WUDI is decided
    on, and the best on test, reported beside it."""
    d = per_seed[(per_seed["suite"] == suite) & (per_seed["method"].str.match(r"wudi( \(|$)"))]
    if d.empty:
        raise InputError(f"{suite}: no WUDI row (wudi, wudi (lr ...)) in the tables")
    means = d.groupby("method")[[c for c in ("val_normalized", "test_normalized") if c in d]].mean()
    if "val_normalized" not in means:  # tables without validation: the tuned row where there is one
        row = TUNED_WUDI_ROW if TUNED_WUDI_ROW in means.index else str(means.index[0])
        return row, row
    val = means["val_normalized"]
    best_val = TUNED_WUDI_ROW if TUNED_WUDI_ROW in val and val[TUNED_WUDI_ROW] >= val.max() - 1e-9 \
        else str(val.idxmax())
    return best_val, str(means["test_normalized"].idxmax())


def verdict_sota(per_seed: pd.DataFrame, ace_row: str | None = None,
                 rivals: Sequence[str] = ("wudi", "ties", "tsv_m"), *, world: World | None = None,
                 n_tasks: int = 8, folder: str | Path | None = None) -> Verdict:
    """"ACE beats WUDI, TIES and TSV-M on language": ACE at the paper's setting of the world's model
    family (``ace_row``; default: :func:`acetools_course.claims.paper_setting`'s, eps 2e-4 on the text world)
    against each rival of the claim that competes (above weight averaging), paired
    (:func:`~acetools_course.lesson04_benchmark.paired_difference`: over test examples and seeds where ``folder`` holds
    the per-example results, else over seeds). Reproduced when ACE leads every rival beyond the
    margin, partly when some, not reproduced when none. WUDI is judged against every WUDI row the tables
    hold (:func:`wudi_rows`): the best on validation decides, the best on test is reported beside it.
    On RoBERTa-GLUE the paper's numbers give ACE 90.4 against WUDI 85.3, TIES 64.7, TSV-M 79.0: all three
    leads count.

    With ``world`` (the text world's :class:`~acetools_course.verdicts.World`, its room at ``n_tasks``) each
    of the paper's leads is carried into the world by the course's scaling rule, capped at the
    headroom above the rival (docs/course.md §Scaling rule; RoBERTa-GLUE's room is TSV-M − task
    arithmetic = 10.9 points); a rival whose prediction is short of twice the margin is undecidable
    here (docs/course.md §Margin, power and rivals); none left -> ``undecidable here``. No rival above weight
    averaging at all (a small world where nothing competes) -> ``not testable here``."""
    per_seed = per_seed if "suite" in per_seed else per_seed.assign(suite="text")
    suite = str(per_seed["suite"].iloc[0])
    pairs = None
    if folder is not None:
        runs = find_results(folder, suites=[suite])
        pairs = functools.partial(paired_rows, runs, per_task=load_per_task(runs))
    ace_row = ace_row or paper_setting(world.name if world is not None else "text").ace_row
    wudi_val, wudi_test = wudi_rows(per_seed, suite) if "wudi" in rivals else ("wudi", "wudi")
    rivals = [wudi_val if r == "wudi" else r for r in rivals]  # WUDI at its best step size on validation
    judged, left = competing_rivals(per_seed, suite, rivals, "test_normalized")
    if not judged:  # no competitor to beat in this world (docs/course.md §Margin, power and rivals)
        return Verdict(f"{ace_row}: every rival at or below weight averaging", NOT_TESTABLE,
                       f"no rival competes (left out, at or below weight averaging: {', '.join(left)})",
                       {"ace_row": ace_row, "left_out": left})
    diffs = {r: paired_difference(per_seed, suite, ace_row, r, pairs=pairs) for r in judged}
    n = max(d["n_seeds"] for d in diffs.values())
    measured = f"{ace_row} minus " + ", ".join(f"{r} {d['diff']:+.1f}" for r, d in diffs.items()) + \
        f" normalized points (mean over {n} seed{'s' if n > 1 else ''})"
    agree = [d["outcome"] == "better" for d in diffs.values()]
    reason = "; ".join(f"{r}: {d['outcome']} (margin {d['margin']:.1f}, {d['margin_source']})"
                       for r, d in diffs.items())
    beside = None
    if wudi_test != wudi_val and wudi_val in diffs:  # the best WUDI row on test, reported beside, not judged
        beside = paired_difference(per_seed, suite, ace_row, wudi_test, pairs=pairs)
        measured += f"; beside, not judged: minus {wudi_test} (the best WUDI row on test) {beside['diff']:+.1f}"
        reason += f"; {wudi_test}, the best WUDI row on test, not judged: {beside['outcome']} " \
                  f"(margin {beside['margin']:.1f})"
    if left:
        reason += f"; left out, at or below weight averaging: {', '.join(left)}"
    means = per_seed[per_seed["suite"] == suite].groupby("method")["test_normalized"].mean()
    if world is not None:
        room_p = ROBERTA_GLUE["tsv_m"] - ROBERTA_GLUE["task_arithmetic"]
        effects = [effect(r, d["diff"], paper=ROBERTA_GLUE["ace"] - ROBERTA_GLUE[r.split(" ")[0]], paper_room=room_p,
                          world_room=world.room_at(n_tasks), spread=d["sd"], noise=world.noise, se=d["se"],
                          headroom=100.0 - float(means[r]), seeds=d.get("n_seeds"))
                   for r, d in diffs.items()]
        v, note = decide(effects, agree)
        reason += f"; {note}" if note else ""
    else:
        effects = [effect(r, d["diff"], spread=d["sd"], se=d["se"], seeds=d.get("n_seeds")) for r, d in diffs.items()]
        v = agreement(agree)
    return Verdict(measured, v, reason, {"diffs": {r: d["diff"] for r, d in diffs.items()},
                                         "sd": {r: d["sd"] for r, d in diffs.items()}, "ace_row": ace_row,
                                         "comparisons": list(diffs.values()), "left_out": left,
                                         "wudi_best_on_test": beside}, effects)


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
    forced path with the stage off), decided at ``eps`` (default: the paper's eps for the text world's
    model family, :data:`acetools_course.claims.PAPER_SETTINGS`, 2e-4; every eps in ``abl`` where it lacks it), the
    other eps reported beside (:func:`stage_verdict`). One ablation per eps on one seed: the margin is
    ``max(NOISE, 1.96 se)`` with the paired bootstrap over the test examples where ``abl`` keeps each row's
    ``correct`` (and ``attrs["experts"]``), else NOISE. ``forced``: the compared rows ran with the gate
    forced on every matrix (lesson 07 reads it from the ablation rows)."""
    experts = abl.attrs.get("experts")
    gains, ses = {}, {}
    for e, g in abl.groupby("eps", sort=False):
        on, off = g[g["setting"] == "gate on (forced)"], g[g["setting"] == without]
        if len(on) and len(off):
            key = float(cast(float, e))  # eps: a numeric column
            gains[key] = float(on["test_normalized"].iloc[0] - off["test_normalized"].iloc[0])
            ses[key] = None if experts is None or "correct" not in g else \
                paired_se(on["correct"].iloc[0], off["correct"].iloc[0], experts)
    if not gains:
        raise InputError(f"the ablation has no rows 'gate on (forced)' and {without!r}")
    return stage_verdict(gains, ses, stage, eps=eps, forced=forced)


def stage_verdict(gains: dict[float, float], ses: dict[float, float | None], stage: str, *,
                  eps: float | None = None, forced: bool = True) -> Verdict:
    """:func:`verdict_stage` from its numbers (``gains`` and paired standard errors ``ses`` by eps, as its
    record keeps them): decided at ``eps`` (default: the text world's paper eps where ``gains`` has it,
    else every eps), reproduced when the gain counts at every decided eps, partly at some, not reproduced
    at none; the other eps are measured and shown beside, not judged."""
    paper_eps = paper_setting("text").eps
    gains = {e: gains[e] for e in sorted(gains, reverse=True)}  # largest ridge first, as the lesson's grid
    want = eps if eps is not None else paper_eps
    at = [e for e in gains if abs(e - want) <= 1e-12 * max(1.0, abs(want))]
    if eps is not None and not at:
        raise InputError(f"the ablation has no eps {eps:g}; it has {sorted(gains)}")
    decided = at or list(gains)
    outcomes = {e: compare(gains[e], se=ses.get(e)) for e in gains}
    v = agreement([outcomes[e] == "better" for e in decided])
    label = " (gate forced on every matrix)" if forced else ""
    measured = f"{stage}{label}: " + ", ".join(f"eps {e:g}: {d:+.1f}" for e, d in gains.items()) + " normalized points"
    reason = "a gain counts above its margin: " + ", ".join(
        f"eps {e:g}: {outcomes[e]} (margin {margin(se=ses.get(e)):.2f})" for e in decided)
    rest = [e for e in gains if e not in decided]
    if rest:
        reason += (f" (decided at eps {decided[0]:g}, the paper's eps for the BERT family; beside, not judged: "
                   + ", ".join(f"eps {e:g}: {outcomes[e]}" for e in rest) + ")")
    return Verdict(measured, v, reason, {"gains": gains, "se": ses, "forced": forced, "decided_eps": decided},
                   [effect(f"eps {e:g}" + (" (gate forced)" if forced else ""), gains[e], se=ses.get(e), seeds=1)
                    for e in decided])


def verdict_spectrum(top5: float, cond: float | None = None) -> Verdict:
    """"W_pre's top 5 % singular values hold 99 %+ of the energy": reproduced at ≥ 99 %,
    partly at ≥ 90 %, not reproduced below (``top5`` in percent, median over matrices)."""
    v = "reproduced" if top5 >= 99 else ("partly" if top5 >= 90 else "not reproduced")
    return Verdict(f"W_pre's top-5 % energy {top5:.1f} % (median over matrices)", v,
                   "reproduced at ≥ 99 %, partly at ≥ 90 %", {"top5_energy": top5, "condition": cond}, value=top5)


track_drawing([sys.modules[__name__]])  # each figure function notes itself on the figure it draws (the manifest)
