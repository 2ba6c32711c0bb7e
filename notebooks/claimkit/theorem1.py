"""Notebook 01's claim verdicts: ace.theorem1, ace.theorem1_vit and ace.unified (docs/course.md
§Claim rules); the tables they read come from :mod:`acetools.course.theorem1`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from acetools.errors import InputError

from .verdicts import Verdict, threshold

#: ace.theorem1 / ace.theorem1_vit: the levels of the median cosine (docs/course.md §Claim rules).
COSINE_REPRODUCED: float = 0.9


COSINE_PARTLY: float = 0.7


#: ace.theorem1_vit, partly: the estimate beats the isotropic guess I in at least this share of
#: the layer × task cells (it carries covariance information where it is not proportional).
BEATS_IDENTITY: float = 0.5


#: ace.unified: the equivalences are exact, so they hold to numerical precision (float32 merges
#: on the mini-world, float64 on the synthetic layer).
TOLERANCES: dict[str, float] = {"identity_vit": 1e-6, "identity_synthetic": 1e-10, "wudi_gradient": 1e-8,
                                "given_jls": 1e-8}


def median_cosine(frame: pd.DataFrame, column: str = "cosine", **where: Any) -> float:
    """The median of ``column`` over the rows of ``frame`` where every ``col == value`` of ``where`` holds."""
    sel = frame
    for k, v in where.items():
        sel = sel[sel[k] == v]
    if sel.empty:
        raise InputError(f"no rows where {where}")
    return float(sel[column].median())


def verdict_theorem1(regime: pd.DataFrame, curves: pd.DataFrame, adam: pd.DataFrame, *, steps: int) -> Verdict:
    """ace.theorem1 (rule: docs/course.md §Claim rules) on ``regime`` (``estimate_experiment``);
    ``curves`` (``sweep`` with a ``model`` column) and ``adam`` are the degradations reported with it."""
    cos, cos_sq = median_cosine(regime), median_cosine(regime, "cosine_sq")
    overlap, identity = median_cosine(regime, "subspace_overlap"), median_cosine(regime, "identity_cosine")
    last = int(curves["steps"].max())
    converged = median_cosine(curves, model="linear layer, SGD", steps=last)
    relu = median_cosine(curves, model="2-layer ReLU", steps=last)
    cos_adam = median_cosine(adam)
    measured = (f"SGD, linear layer, {steps} steps: median cos(Σ̂, Σ) = {cos:.3f} (cos with Σ² {cos_sq:.3f}, top-k "
                f"overlap {overlap:.3f}, isotropic guess {identity:.3f}); after {last} steps {converged:.3f}; "
                f"Adam {cos_adam:.3f}; 2-layer ReLU after {last} steps {relu:.3f}")
    reason = (f"threshold {COSINE_REPRODUCED} (partly {COSINE_PARTLY}) on the median cosine in the Theorem's regime; "
              + ("there the estimate tracks Σ² more closely than Σ (the first-order prediction); "
                 if cos_sq > cos else "")
              + f"it falls to {converged:.2f} when the expert converges (isotropic guess {identity:.2f})")
    nums = {"cosine": cos, "cosine_sq": cos_sq, "subspace_overlap": overlap, "identity_cosine": identity,
            "cosine_converged": converged, "cosine_adam": cos_adam, "cosine_relu": relu, "steps": steps}
    return Verdict(measured, threshold(cos, COSINE_REPRODUCED, COSINE_PARTLY), reason, nums, value=cos)


def verdict_theorem1_vit(vit: pd.DataFrame, *, vit_base: pd.DataFrame, vit_gram: pd.DataFrame, n_images: int,
                         suite: str, size: str) -> Verdict:
    """ace.theorem1_vit (rule: docs/course.md §Claim rules) from ``vit_agreement`` tables
    (``vit``; ``vit_base`` and ``vit_gram`` beside)."""
    med_type = vit.groupby("layer_type", sort=False)["cosine"].median()
    beats_identity = float((vit["cosine"] > vit["identity_cosine"]).mean())
    beats_cross = float((vit["cosine"] > vit["cross_task_cosine"]).mean())
    if (med_type >= COSINE_REPRODUCED).all():
        verdict = "reproduced"
    elif beats_identity >= BEATS_IDENTITY:
        verdict = "partly"
    else:
        verdict = "not reproduced"
    per_type = ", ".join(f"{str(t).replace('.weight', '').replace('_weight', '')} {v:.2f}" for t, v in med_type.items())
    measured = (f"median cos(Σ̂, hooked Σ) per layer type: {per_type}; isotropic guess "
                f"{vit['identity_cosine'].median():.2f}; beats I in {100 * beats_identity:.0f}% and other tasks' Σ in "
                f"{100 * beats_cross:.0f}% of {len(vit)} layer×task cells")
    reason = (f"thresholds: median ≥ {COSINE_REPRODUCED} in every type → reproduced; beats I in ≥ "
              f"{100 * BEATS_IDENTITY:.0f}% of cells → partly ({size} ViT, experts trained with AdamW, {n_images} "
              "images per task)")
    nums = {"median_cosine": {t: float(v) for t, v in med_type.items()},
            "identity_cosine": float(vit["identity_cosine"].median()),
            "cross_task_cosine": float(vit["cross_task_cosine"].median()), "beats_identity": beats_identity,
            "beats_cross": beats_cross, "base_input_cosine": float(vit_base["cosine"].median()),
            "gram_cosine": float(vit_gram["cosine"].median()), "n_images": n_images, "suite": suite, "size": size}
    return Verdict(measured, verdict, reason, nums, value=float(vit["cosine"].median()))


def verdict_unified(checks: Mapping[str, float], vit_unified: pd.DataFrame, early: pd.Series, converged: pd.Series,
                    *, eps: float) -> Verdict:
    """ace.unified (rule: docs/course.md §Claim rules): every check of ``checks`` within its
    :data:`TOLERANCES`; ``vit_unified``, ``early`` and ``converged`` are shown beside."""
    acc = dict(zip(vit_unified["method"], vit_unified["test_normalized"]))
    vit_err = max(checks["identity_vit"], checks["identity_route"])
    holds = (vit_err <= TOLERANCES["identity_vit"] and checks["identity_synthetic"] <= TOLERANCES["identity_synthetic"]
             and checks["wudi_gradient"] <= TOLERANCES["wudi_gradient"])
    measured = (f"identity = weight averaging to {vit_err:.1e} (mini-world) and {checks['identity_synthetic']:.1e} "
                f"(synthetic); WUDI row's relative loss gradient {checks['wudi_gradient']:.1e}; normalized test acc "
                f"identity {acc['identity']:.1f}, WUDI {acc['wudi']:.1f}, ACE estimator {acc['ace']:.1f}, true "
                f"covariance {acc['given']:.1f}, true Gram {acc['given_gram']:.1f}, full ACE {acc['ace_full']:.1f}; "
                f"synthetic gain (early / converged) ACE {early['ace']:.0f} / {converged['ace']:.0f}, true Σ "
                f"{early['given']:.0f} / {converged['given']:.0f}")
    reason = ("the equivalences hold to numerical precision; the merges differ only in the Sigma_t plugged in" if holds
              else "an equivalence fails beyond its tolerance: " + ", ".join(
                  f"{k} {checks[k]:.1e} > {t:g}" for k, t in TOLERANCES.items() if k in checks and checks[k] > t))
    nums = {"identity_vs_wa": checks["identity_vit"], "identity_route_vs_wa": checks["identity_route"],
            "identity_synthetic": checks["identity_synthetic"], "wudi_relative_gradient": checks["wudi_gradient"],
            "given_vs_jls": checks["given_jls"], "vit_normalized": acc, "synthetic_gain_early": early.to_dict(),
            "synthetic_gain_converged": converged.to_dict(), "eps": eps}
    return Verdict(measured, "reproduced" if holds else "not reproduced", reason, nums, value=float(vit_err))
