"""Notebook 07's claim verdicts: ACE's language claims on the text world (docs/course.md §Claim
rules); the tables they read come from :mod:`acetools.course.language`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pandas as pd

from acetools.course.language import ROBERTA_GLUE
from acetools.errors import InputError
from acetools.results import find_results, load_per_task

from .benchmark import TUNED_WUDI_ROW, competing_rivals, paired_difference
from .claims import paper_setting
from .power import paired_rows, paired_se
from .verdicts import Verdict, World, agreement, compare, decide, effect, margin


def wudi_rows(per_seed: pd.DataFrame, suite: str) -> tuple[str, str]:
    """Of every WUDI row ``per_seed`` holds on ``suite`` (``wudi``, ``wudi (lr …)``, ``wudi (lr on val)``):
    the best on validation (mean ``val_normalized`` over seeds; :data:`~claimkit.benchmark.TUNED_WUDI_ROW` on a
    tie), the one a claim against WUDI is decided on, and the best on test, reported beside it."""
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
    family (``ace_row``; default: :func:`claimkit.claims.paper_setting`'s, eps 2e-4 on the text world)
    against each rival of the claim that competes (above weight averaging), paired
    (:func:`~claimkit.benchmark.paired_difference`: over test examples and seeds where ``folder`` holds
    the per-example results, else over seeds). Reproduced when ACE leads every rival beyond the
    margin, partly when some, not reproduced when none. WUDI is judged against every WUDI row the tables
    hold (:func:`wudi_rows`): the best on validation decides, the best on test is reported beside it.
    On RoBERTa-GLUE the paper's numbers give ACE 90.4 against WUDI 85.3, TIES 64.7, TSV-M 79.0: all three
    leads count.

    With ``world`` (the text world's :class:`~claimkit.verdicts.World`, its room at ``n_tasks``) each
    of the paper's leads is carried into the world by the course's scaling rule, capped at the
    headroom above the rival (docs/course.md §Scaling rule; RoBERTa-GLUE's room is TSV-M − task
    arithmetic = 10.9 points); a rival whose prediction is short of twice the margin is undecidable
    here (docs/course.md §Margin, power and rivals); none left -> ``undecidable here``."""
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
    if not judged:
        raise InputError(f"{suite}: none of {list(rivals)} is above weight averaging (left out: {left})")
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
    model family, :data:`claimkit.claims.PAPER_SETTINGS`, 2e-4; every eps in ``abl`` where it lacks it), the
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
