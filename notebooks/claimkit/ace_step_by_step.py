"""Notebook 02's claim verdicts: gamma, the three ACE stages, the spectrum and the direction
(docs/course.md §Claim rules); the tables they read come from :mod:`acetools.course.ace_step_by_step`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from acetools.course.ace_step_by_step import (
    FULL,
    GATE_OFF,
    GATE_ON,
    GATE_ON_NO_REFINE,
    NO_PRIOR,
    NO_REFINE,
    TAU,
    Ablation,
)
from acetools.errors import InputKeyError

from . import verdicts as V
from .claims import PAPER_SETTINGS
from .paper_tables import ACE_STAGE_ABLATION, paper_room
from .power import paired_se
from .verdicts import NOISE  # the lesson reads it here (ace_claims.NOISE)

#: The paper's statement for ViT-B/16: gamma < 0.25 (RoBERTa: gamma > 0.3 = TAU).
GAMMA_VIT = 0.25


#: The paper's numbers for W_bar_pre: top-5% energy 99%+, condition number > 8.7e5.
PAPER_ENERGY = 0.99


PAPER_COND = 8.7e5


#: A world counts as "high heterogeneity" when more than this fraction of its matrices is flagged.
FLAG_FRACTION = 0.1


def ablation_effects(ablation: Ablation, frac_flagged: Mapping[str, float],
                     flag_fraction: float = FLAG_FRACTION) -> dict[str, list[dict[str, Any]]]:
    """The differences (normalized points) the stage claims are decided on, per suite:
    ``{"normalization": [...], "csp": [...], "refinement": [...]}`` for :func:`verdict_normalization`,
    :func:`verdict_csp` and :func:`verdict_refinement` (which rows: docs/course.md §Claim rules).
    Refinement uses full - no refinement where more than ``flag_fraction`` is flagged, else the
    gate forced (``gate_forced``), with ``d_ace_gate`` beside it. Each difference ``d…`` has its paired
    bootstrap standard error ``se…`` over the test examples (None where the world does not score
    examples): the margin of docs/course.md §Margin, power and rivals."""
    out: dict[str, list[dict[str, Any]]] = {"normalization": [], "csp": [], "refinement": []}
    for suite, f in frac_flagged.items():
        def e(a: str, b: str, suite: str = suite) -> float:
            return ablation.effect(a, b, suite=suite)

        def se(a: str, b: str, suite: str = suite) -> float | None:
            pt = ablation.per_task
            if "correct" not in pt:
                return None
            pt = pt[pt["suite"] == suite]
            hits = {v: {str(t): c for t, c in zip(g["task"], g["correct"]) if c is not None}
                    for v, g in pt[pt["variant"].isin([a, b])].groupby("variant")}
            scale = {str(t): x / 100 for t, x in zip(pt["task"], pt["expert"])}
            if any(len(hits.get(v, {})) < len(scale) for v in (a, b)):
                return None
            return paired_se(hits[a], hits[b], scale)

        out["normalization"].append({"suite": suite, "frac_flagged": float(f), "d_auto": e(NO_REFINE, GATE_OFF),
                                     "se_auto": se(NO_REFINE, GATE_OFF), "d_forced": e(GATE_ON_NO_REFINE, GATE_OFF),
                                     "se_forced": se(GATE_ON_NO_REFINE, GATE_OFF)})
        out["csp"].append({"suite": suite, "d": e(FULL, NO_PRIOR), "se": se(FULL, NO_PRIOR), "what": "full - no prior"})
        if f > flag_fraction:
            out["refinement"].append({"suite": suite, "d": e(FULL, NO_REFINE), "se": se(FULL, NO_REFINE),
                                      "what": "full - no refinement", "frac_flagged": float(f), "gate_forced": False})
        else:
            out["refinement"].append({"suite": suite, "d": e(GATE_ON, GATE_ON_NO_REFINE),
                                      "se": se(GATE_ON, GATE_ON_NO_REFINE),
                                      "what": "gate forced: refined - not refined", "frac_flagged": float(f),
                                      "gate_forced": True, "d_ace_gate": e(FULL, NO_REFINE)})
    return out


def _agree_reason(parts: Sequence[str], noise: float) -> str:
    return "; ".join(parts) + f" (normalized points; within the margin, max({noise}, 1.96 se), = {V.TIE})"


def _outcome(d: float, se: float | None, noise: float) -> str:
    """``d``'s outcome against its margin, with the margin named: ``"better, margin 0.62"``."""
    return f"{V.compare(d, noise=noise, se=se)}, margin {V.margin(noise=noise, se=se):.2f}"


def verdict_gamma(gtable: Any, *, vit: float = GAMMA_VIT, tau: float = TAU) -> V.Verdict:
    """ace.gamma_vit (rule: docs/course.md §Claim rules) at the paper's ViT level ``vit``; the RoBERTa
    half is not testable in a vision world."""
    g = gtable["gamma"].to_numpy(dtype=float)
    frac_below = float(np.mean(g < vit))
    nums = {"median_gamma": float(np.median(g)), "frac_below_vit": frac_below,
            "frac_flagged": float(np.mean(g > tau)), "n_layers": int(g.size), "max_gamma": float(g.max())}
    if frac_below >= 0.9:
        v = "reproduced"
    elif nums["median_gamma"] < vit:
        v = "partly"
    else:
        v = "not reproduced"
    reason = (f"{100 * frac_below:.0f}% of {g.size} matrices have gamma < {vit} (median {nums['median_gamma']:.3g}, "
              f"{100 * nums['frac_flagged']:.0f}% flagged > {tau}); rule: >= 90% below -> reproduced, median below "
              f"-> partly; the RoBERTa half is not testable here")
    measured = (f"median gamma {nums['median_gamma']:.3g}, {100 * nums['frac_below_vit']:.0f}% of "
                f"matrices < {vit:g}, {100 * nums['frac_flagged']:.0f}% > {tau}")
    return V.Verdict(measured, v, reason, nums, value=nums["median_gamma"])


#: The effect each stage has in the paper's ViT setting (:data:`claimkit.paper_tables.ACE_STAGE_ABLATION`):
#: what a vision world's stage claims predict.
VIT_STAGE_EFFECT: dict[str, float] = {k: v["effect"] for k, v in ACE_STAGE_ABLATION.items()}


def _paper_room_vit(n_tasks: int) -> float:
    return paper_room("spec", n_tasks if n_tasks in (8, 14, 20) else 8)


def _stage_effect(s: Mapping[str, Any], d: float, *, world: V.World | None, n_tasks: Mapping[str, int] | None,
                  paper: float | None, noise: float) -> V.Effect:
    """A stage claim's :class:`~claimkit.verdicts.Effect` at one suite (its paired ``se`` where ``s`` has one):
    with ``world`` and ``paper`` (the paper's effect on its ViT-B/16 ablation) the prediction is scaled to the
    world's room."""
    if world is None or paper is None:
        return V.effect(s["suite"], d, noise=noise, se=s.get("se"), seeds=1)
    if n_tasks is None or s["suite"] not in n_tasks:
        raise InputKeyError(f"suite {s['suite']!r}: n_tasks= must give its number of tasks to scale the paper's effect")
    n = int(n_tasks[s["suite"]])
    return V.effect(s["suite"], d, paper=paper, paper_room=_paper_room_vit(n), world_room=world.room_at(n), noise=noise,
                    se=s.get("se"), seeds=1)


def _better_everywhere(name: str, per_suite: Sequence[Mapping[str, Any]], noise: float,
                       label: str | None = None) -> V.Verdict:
    agree = [V.compare(s["d"], noise=noise, se=s.get("se")) == "better" for s in per_suite]
    parts = [f"{s['suite']}: {s.get('what', name)} = {s['d']:+.2f} ({_outcome(s['d'], s.get('se'), noise)})"
             for s in per_suite]
    nums = {s["suite"]: dict(s) for s in per_suite}
    measured = "; ".join(f"{s['suite']}: {label or s.get('what', name)} {s['d']:+.2f}" for s in per_suite)
    return V.Verdict(measured, V.agreement(agree), _agree_reason(parts, noise), nums,
                   [V.effect(s["suite"], s["d"], noise=noise, se=s.get("se"), seeds=1) for s in per_suite])


def verdict_normalization(per_suite: Sequence[Mapping[str, Any]], *, noise: float = NOISE,
                          flag_fraction: float = FLAG_FRACTION) -> V.Verdict:
    """ace.normalization (rule: docs/course.md §Claim rules). ``per_suite``: dicts with ``suite``,
    ``frac_flagged``, ``d_auto`` and ``d_forced`` (:func:`ablation_effects`); a half with no
    high-gamma suite is not testable here."""
    agree, parts, effects = [], [], []
    high = [s for s in per_suite if s["frac_flagged"] > flag_fraction]
    for s in per_suite:
        if s["frac_flagged"] > flag_fraction:
            ok = V.compare(s["d_auto"], noise=noise, se=s.get("se_auto")) == "better"
            parts.append(f"{s['suite']}: high gamma ({100 * s['frac_flagged']:.0f}% flagged), "
                         f"normalise flagged - never = {s['d_auto']:+.2f} "
                         f"({_outcome(s['d_auto'], s.get('se_auto'), noise)})")
            effects.append(V.effect(f"{s['suite']} (flagged layers)", s["d_auto"], noise=noise, se=s.get("se_auto"),
                                    seeds=1))
        else:
            ok = V.compare(s["d_forced"], noise=noise, se=s.get("se_forced")) != "better"
            parts.append(f"{s['suite']}: low gamma ({100 * s['frac_flagged']:.0f}% flagged), gate forced: "
                         f"always - never normalise = {s['d_forced']:+.2f} "
                         f"({_outcome(s['d_forced'], s.get('se_forced'), noise)})")
            effects.append(V.effect(f"{s['suite']} (gate forced)", s["d_forced"], noise=noise,
                                    se=s.get("se_forced"), seeds=1))
        agree.append(ok)
    nums = {s["suite"]: dict(s) for s in per_suite}
    v = V.agreement(agree)
    reason = _agree_reason(parts, noise)
    if not high:
        reason += ("; the high-gamma half is not testable here (no suite has more than "
                   f"{100 * flag_fraction:.0f}% of its matrices flagged: a high-gamma world decides it)")
        if v == "reproduced":
            v = "partly"
    measured = "; ".join(f"{s['suite']}: normalise flagged − never {s['d_auto']:+.2f}, normalise all (gate forced) − "
                         f"never {s['d_forced']:+.2f}" for s in per_suite)
    return V.Verdict(measured, v, reason, nums, effects)


def verdict_csp(per_suite: Sequence[Mapping[str, Any]], *, noise: float = NOISE,
                ridge_over_prior: float | None = None, eps: float | None = None) -> V.Verdict:
    """ace.csp (rule: docs/course.md §Claim rules). ``per_suite``: dicts with ``suite`` and ``d``;
    ``ridge_over_prior`` above 1 (the ridge swamps the prior) makes the claim not testable at ``eps``."""
    at = f" at eps {eps:g}" if eps is not None else ""
    if ridge_over_prior is not None and ridge_over_prior > 1:
        v = _better_everywhere("full - no prior", per_suite, noise, label="full − no prior")
        return V.Verdict(v.measured, V.NOT_TESTABLE,
                       f"the isotropic ridge{at} is {ridge_over_prior:.3g}× the structural prior (median over "
                       f"matrices): the prior does not act, so prior and no prior regularise alike; measured beside: "
                       f"{v.reason}", {**v.numbers, "ridge_over_prior": ridge_over_prior, "eps": eps}, v.effects)
    v = _better_everywhere("full - no prior", per_suite, noise, label="full − no prior")
    extra = {"ridge_over_prior": ridge_over_prior, "eps": eps}
    why = v.reason + (f"; ridge/prior {ridge_over_prior:.3g}{at}" if ridge_over_prior is not None else "")
    return V.Verdict(v.measured, v.verdict, why, {**v.numbers, **extra}, v.effects)


def verdict_refinement(per_suite: Sequence[Mapping[str, Any]], *, noise: float = NOISE, world: V.World | None = None,
                       n_tasks: Mapping[str, int] | None = None,
                       paper_effect: float | None = VIT_STAGE_EFFECT["refinement"]) -> V.Verdict:
    """ace.refinement (rule: docs/course.md §Claim rules). ``per_suite``: dicts with ``suite``, ``d``,
    ``what`` (:func:`ablation_effects`); ``paper_effect`` (default the ViT-B/16 ablation,
    :data:`VIT_STAGE_EFFECT`) is scaled to ``world``'s room (docs/course.md §Scaling rule)."""
    base = _better_everywhere("refine - no refine", per_suite, noise)
    effects = [_stage_effect(s, s["d"], world=world, n_tasks=n_tasks, paper=paper_effect, noise=noise)
               for s in per_suite]
    agree = [V.compare(s["d"], noise=noise, se=s.get("se")) == "better" for s in per_suite]
    v, note = V.decide(effects, agree)
    reason = base.reason + (f"; {note}" if note else "")
    if v == V.UNDECIDABLE:
        reason = ("the paper's own ViT-B/16 ablation has refinement at 90.60 → 90.60, so the effect it predicts here "
                  f"is {effects[0].predicted:+.2f}, at or below the floor: measured " + base.reason)
    return V.Verdict(base.measured, v, reason, base.numbers, effects)


def verdict_spectrum(stable: Any, *, energy: float = PAPER_ENERGY, cond: float = PAPER_COND) -> V.Verdict:
    """ace.spectrum (rule: docs/course.md §Claim rules), on the medians of ``top_energy_pre`` and ``cond_pre_trim``."""
    e = float(stable["top_energy_pre"].median())
    c = float(stable["cond_pre_trim"].median())
    craw = float(stable["cond_pre"].median())
    nums = {"median_top5_energy": e, "median_cond_trim": c, "median_cond_raw": craw,
            "frac_top5_ge_paper": float((stable["top_energy_pre"] >= energy).mean()),
            "frac_cond_gt_paper": float((stable["cond_pre_trim"] > cond).mean())}
    v = V.agreement([e >= energy, c > cond])
    reason = (f"median over {len(stable)} matrices: top-5% energy {100 * e:.1f}% (paper 99%+), condition number "
              f"{c:.3g} without the centring's structural zero ({craw:.3g} with it; paper > {cond:.3g})")
    measured = f"median top-5% energy {100 * e:.1f}%, condition number {c:.3g} (raw {craw:.3g})"
    return V.Verdict(measured, v, reason, nums, value=100 * e)


def verdict_direction(stable: Any, *, high: float = 0.9, low: float = 0.5) -> V.Verdict:
    """ace.direction (rule: docs/course.md §Claim rules) on the median ``cos_hooked`` of ``layer_table``
    (NaN rows skipped), ``cos_sum`` and chance beside; without hooked values, on ``cos_sum`` (said so)."""
    def med(c: str) -> float:
        return float(stable[c].median()) if c in stable else math.nan

    m_sum = med("cos_sum")
    n_hooked = int(stable["cos_hooked"].notna().sum()) if "cos_hooked" in stable else 0
    m_hooked = med("cos_hooked") if n_hooked else math.nan
    nums = {"median_cos_sum": m_sum, "median_cos_hooked": m_hooked, "n_hooked": n_hooked,
            "median_cos_sum_hooked": med("cos_sum_hooked") if n_hooked else math.nan,
            "median_cos_experts": med("cos_experts"), "median_cos_random": med("cos_random"),
            "decided_on": "cos_hooked" if n_hooked else "cos_sum"}
    m = m_hooked if n_hooked else m_sum
    v = V.threshold(m, high, low)
    context = (f"vs sum_t ΔW_t {m_sum:.2f}, single experts {nums['median_cos_experts']:.2f}, "
               f"chance {nums['median_cos_random']:.2f}")
    if n_hooked:
        reason = (f"median cosine of W_pre's top singular directions with the closed form under the hooked input "
                  f"covariances: {m_hooked:.2f} over {n_hooked} hookable matrices ({context}; sum_t ΔW_t vs the "
                  f"hooked closed form {nums['median_cos_sum_hooked']:.2f}); rule on the hooked reference, the "
                  f"solution W_pre estimates: >= {high} reproduced, >= {low} partly")
        measured = (f"median direction cosine with the hooked-covariance closed form {m_hooked:.2f}, with sum_t ΔW_t "
                    f"{m_sum:.2f} (chance {nums['median_cos_random']:.2f})")
    else:
        reason = (f"no hooked input covariances: decided on the cosine with sum_t ΔW_t's directions, {m_sum:.2f} "
                  f"(single experts {nums['median_cos_experts']:.2f}, chance {nums['median_cos_random']:.2f}); "
                  f"rule: >= {high} reproduced, >= {low} partly")
        measured = f"median direction cosine with sum_t ΔW_t {m_sum:.2f} (chance {nums['median_cos_random']:.2f})"
    return V.Verdict(measured, v, reason, nums, value=m)


#: The eps the paper reports for ViTs (the ViT family's of :data:`claimkit.claims.PAPER_SETTINGS`); the stage
#: claims are decided there (the code's default, 1e-2 as in the official code, is shown beside).
PAPER_EPS_VIT: float = PAPER_SETTINGS["vit"].eps


def ridge_over_prior(stable: Any) -> float | None:
    """Median over matrices of ``layer_table``'s ``ridge_over_prior`` (sum_t ridge_t / ‖c‖₂):
    how much the isotropic ridge outweighs the structural prior (None without that column)."""
    if stable is None or "ridge_over_prior" not in stable.columns:
        return None
    r = stable["ridge_over_prior"].replace(math.inf, np.nan).dropna()
    return float(r.median()) if len(r) else None


def claim_verdicts(gtable: Any, stable: Any, ablation: Ablation, frac_flagged: Mapping[str, float], *,
                   tau: float = TAU, world: V.World | None = None, n_tasks: Mapping[str, int] | None = None,
                   eps: float | None = None, beside: Mapping[str, Any] | None = None) -> dict[str, V.Verdict]:
    """The verdicts of notebook 02's claims, by id. ``world`` and ``n_tasks`` scale the paper's stage
    effects; ``beside`` = ``{"eps", "stable", "ablation"}`` at the code's default eps, where ace.csp and
    ace.spectrum are decided too and shown beside, not judged."""
    effects = ablation_effects(ablation, frac_flagged)
    out = {
        "ace.gamma_vit": verdict_gamma(gtable, tau=tau),
        "ace.normalization": verdict_normalization(effects["normalization"]),
        "ace.csp": verdict_csp(effects["csp"], ridge_over_prior=ridge_over_prior(stable), eps=eps),
        "ace.refinement": verdict_refinement(effects["refinement"], world=world, n_tasks=n_tasks),
        "ace.spectrum": verdict_spectrum(stable),
        "ace.direction": verdict_direction(stable),
    }
    for cid in ("ace.csp", "ace.spectrum", "ace.normalization", "ace.refinement"):
        out[cid] = decided_at(out[cid], eps)
    if beside:
        e2, ab2, st2 = beside["eps"], beside.get("ablation"), beside.get("stable")
        side = {}
        if ab2 is not None:
            csp2 = [{"suite": su, "d": ab2.effect(FULL, NO_PRIOR, suite=su), "what": "full - no prior"}
                    for su in frac_flagged]
            side["ace.csp"] = verdict_csp(csp2, ridge_over_prior=ridge_over_prior(st2), eps=e2)
        if st2 is not None:
            side["ace.spectrum"] = verdict_spectrum(st2)
        for cid, sv in side.items():
            out[cid] = with_beside(out[cid], {"eps": e2, "verdict": sv.verdict, "measured": sv.measured,
                                              "reason": sv.reason})
    return out


def decided_at(v: V.Verdict, eps: float | None) -> V.Verdict:
    """``v`` with the eps it was decided at in its reason and ``numbers["eps"]`` (None: no text):
    notebook 02's stage claims."""
    at = f" (decided at eps {eps:g}, the paper's ViT setting)" if eps is not None else ""
    return v.with_reason(v.reason + at, eps=eps)


def with_beside(v: V.Verdict, side: Mapping[str, Any]) -> V.Verdict:
    """``v`` with the verdict at the code default eps shown beside it (not judged): ``side`` =
    ``{"eps", "verdict", "measured", "reason"}``, stored as ``numbers["beside"]``."""
    return v.with_reason(f"{v.reason}; beside it, the code default eps {side['eps']:g}: {side['verdict']} "
                         f"({side['measured']})", beside=dict(side))
