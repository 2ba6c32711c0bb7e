"""Notebook 02 (docs/course.md §02_ace_step_by_step): its tables and its ablation.

The lesson computes every ACE stage itself (docs/methods.md §ACE); this module only measures what
``merge("ace", ...)`` returns. The verdicts are ``claimkit.ace_step_by_step``'s."""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .. import merging
from ..diagnostics import condition_number, effective_rank, energy_fraction, heterogeneity_per_layer
from ..errors import InputError, InputKeyError
from ..keys import short_label, short_name
from ..merging import METHODS, is_matrix_param, task_vectors
from ..merging import ace as A
from ..merging.linalg import top_svd
from ..utils import progress as bar
from . import world as course

#: ACE's gate threshold (docs/methods.md §ACE, (ACE.6)), read from the registry.
TAU: float = METHODS["ace"].params["tau"].default
#: "Top 5% of the singular values" in the spectrum claim.
TOP_FRAC = 0.05

StateDict = Mapping[str, Tensor]


# --------------------------------------------------------------------------- tables


def gamma_by_type(table: Any, *, tau: float = TAU) -> Any:
    """Per layer type of a :func:`acetools.diagnostics.heterogeneity_per_layer` table: matrices, median,
    smallest and largest gamma, and how many are flagged (gamma > ``tau``)."""
    g = table.groupby("layer_type", sort=False)["gamma"]
    out = g.agg(["size", "median", "min", "max"])
    out["flagged"] = table.assign(f=table["gamma"] > tau).groupby("layer_type", sort=False)["f"].sum()
    out.columns = ["matrices", "median γ", "smallest γ", "largest γ", f"flagged (γ > {tau:g})"]
    out.index = [short_name(t) for t in out.index]
    return out.rename_axis("layer type")


def _bases(M: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Orthonormal bases (float64) of the top-k left and right singular subspaces of M."""
    U, _, Vh = top_svd(M.double(), k, gram=True)
    return U, Vh.mT


def _mean_cos(QA: Tensor, QB: Tensor) -> float:
    return float(torch.linalg.svdvals(QA.T @ QB).clamp(max=1.0).mean())


def direction_cosine(A_: Tensor, B: Tensor, k: int) -> dict[str, float]:
    """Mean principal-angle cosine of the top-``k`` left and right singular subspaces of two matrices:
    ``left``, ``right`` and their ``mean`` (1: the same subspace; docs/glossary.md)."""
    if A_.shape != B.shape:
        raise InputError(f"shapes differ: {tuple(A_.shape)} vs {tuple(B.shape)}")
    r = min(A_.shape)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= r:
        raise InputError(f"k={k!r} must be an int in [1, {r}]")
    UA, VA = _bases(A_, k)
    UB, VB = _bases(B.to(A_.device), k)
    left, right = _mean_cos(UA, UB), _mean_cos(VA, VB)
    return {"left": left, "right": right, "mean": (left + right) / 2}


@functools.lru_cache(maxsize=256)
def random_subspace_cosine(d: int, k: int, n_draws: int = 32, seed: int = 0) -> float:
    """The chance level of :func:`direction_cosine` on one side: two random k-dim subspaces of R^d (Monte Carlo)."""
    if not 1 <= k <= d:
        raise InputError(f"need 1 <= k <= d, got k={k}, d={d}")
    g = torch.Generator().manual_seed(seed)
    vals = []
    for _ in range(n_draws):
        QA = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))[0]
        QB = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))[0]
        vals.append(_mean_cos(QA, QB))
    return float(np.mean(vals))


def _spectrum(M: Tensor, top_frac: float, null: int = 0) -> dict[str, float]:
    S = torch.linalg.svdvals(M.double())
    trimmed = S[: S.numel() - null] if null else S
    return {"top_energy": energy_fraction(S, top_frac), "cond": condition_number(S),
            "cond_trim": condition_number(trimmed), "erank": effective_rank(S)}


def layer_table(task_vectors: Sequence[StateDict], W_pre: Mapping[str, Tensor], W: Mapping[str, Tensor],
                diags: Mapping[str, A.ACEDiagnostics], *, hooked: Mapping[str, Tensor] | None = None,
                top_frac: float = TOP_FRAC) -> Any:
    """One row per matrix of ``diags`` (``ace_with_diagnostics``): spectra and directions of ``W_pre`` (ACE.10),
    ``W`` (ACE's output) and ``hooked`` (the closed form under hooked covariances, ACE.1; absent keys NaN).
    ``top_energy_*``: share of the top ``top_frac`` singular values; ``cond_pre_trim``: without the centred
    numerator's structural zero; ``cos_*``: mean principal cosines at k_dir = ceil(top_frac·r);
    ``ridge_over_prior`` = sum_t ridge_t / ‖c‖₂ (c of (ACE.9))."""
    rows = []
    for key, diag in diags.items():
        dW = [tv[key].double() for tv in task_vectors]
        task_sum = torch.stack(dW).sum(0)
        Wp = W_pre[key].double().to(task_sum.device)
        d_out, d_in = Wp.shape
        null = 1 if (diag.numerator == "centered" and d_out <= d_in) else 0
        pre, fin = _spectrum(Wp, top_frac, null), _spectrum(W[key], top_frac)
        kd = max(1, math.ceil(top_frac * min(d_out, d_in)))
        UP, VP = _bases(Wp, kd)  # W_pre's top directions, once per matrix

        def with_pre(M: Tensor, UP: Tensor = UP, VP: Tensor = VP, kd: int = kd) -> float:
            UB, VB = _bases(M.to(UP.device), kd)
            return (_mean_cos(UP, UB) + _mean_cos(VP, VB)) / 2  # = direction_cosine(W_pre, M, kd)["mean"]

        cos = {"cos_hooked": math.nan, "cos_sum_hooked": math.nan}
        if hooked is not None and key in hooked:
            Wh = hooked[key].double().to(Wp.device)
            cos = {"cos_hooked": with_pre(Wh), "cos_sum_hooked": direction_cosine(task_sum, Wh, kd)["mean"]}
        c = diag.prior_norm
        rows.append({
            "key": key, "shape": (d_out, d_in), "gamma": diag.gamma, "flag": diag.flag,
            "top_energy_pre": pre["top_energy"], "cond_pre": pre["cond"], "cond_pre_trim": pre["cond_trim"],
            "erank_pre": pre["erank"], "top_energy_sum": energy_fraction(task_sum, top_frac),
            "top_energy_final": fin["top_energy"], "k_dir": kd,
            "cos_sum": with_pre(task_sum), "cos_experts": float(np.mean([with_pre(d) for d in dW])),
            "cos_random": (random_subspace_cosine(d_out, kd) + random_subspace_cosine(d_in, kd)) / 2,
            **cos, "ridge_over_prior": sum(diag.ridge) / c if c > 0 else math.inf,
        })
    return pd.DataFrame(rows)


def _short(table: Any, columns: Mapping[str, str]) -> Any:
    out = table[list(columns)].rename(columns=columns)
    out.insert(0, "matrix", [short_label(k, style="dot") for k in table["key"]])
    return out


def spectrum_view(table: Any) -> Any:
    """:func:`layer_table`'s spectrum in five plain columns (energies in %)."""
    t = table.assign(**{c: 100 * table[c] for c in ("top_energy_pre", "top_energy_sum", "top_energy_final")})
    return _short(t, {"top_energy_pre": "W_pre: top-5% energy (%)", "top_energy_sum": "∑ΔW_t: top-5% energy (%)",
                      "top_energy_final": "ACE output: top-5% energy (%)",
                      "cond_pre_trim": "W_pre: condition number (no structural zero)"})


def direction_view(table: Any) -> Any:
    """:func:`layer_table`'s direction cosines in five plain columns (1 = the same subspace)."""
    return _short(table, {"cos_hooked": "W_pre vs true-Σ solution", "cos_sum": "W_pre vs ∑ΔW_t",
                          "cos_sum_hooked": "∑ΔW_t vs true-Σ solution", "cos_random": "chance"})


# --------------------------------------------------------------------------- ablation

FULL = "ACE (full)"
GATE_ON = "gate on (normalise every layer)"
GATE_ON_NO_REFINE = "gate on, no refinement"
GATE_OFF = "gate off (never normalise)"
NO_PRIOR = "no structural prior"
NO_REFINE = "no refinement"
RAW_NUMERATOR = "raw numerator ΔW_t"
IDENTITY = "identity estimator (= averaging)"


#: The ablation of notebook 02: one ACE component changed at a time (``merge("ace", ...)``
#: hyperparameters; see :func:`acetools.merging.ace.ace_matrix`). "gate on" also switches on
#: the refinement of every layer, so "gate on, no refinement" isolates the normalisation.
ABLATIONS: dict[str, dict[str, Any]] = {
    FULL: {},
    GATE_ON: {"gate": "on"},
    GATE_ON_NO_REFINE: {"gate": "on", "refine": False},
    GATE_OFF: {"gate": "off"},
    NO_PRIOR: {"prior": False},
    NO_REFINE: {"refine": False},
    RAW_NUMERATOR: {"numerator": "raw"},
    IDENTITY: {"estimator": "identity"},
}
#: The label of ACE with its scaling chosen on validation (:data:`acetools.benchmark.ACE_SCALED`).
SCALED_LABEL = "ACE, scaling chosen on val"


@dataclass
class Ablation:
    """Result of :func:`run_ablation`: ``table`` (one row per variant) and ``per_task`` (one per variant and task)."""

    table: Any
    per_task: Any

    def effect(self, a: str, b: str, column: str = "test_normalized", suite: str | None = None) -> float:
        """``column`` of variant ``a`` minus that of ``b`` (in ``suite``, needed when the table holds several)."""
        t = self.table
        if suite is not None:
            t = t[t["suite"] == suite]
        elif t["suite"].nunique() > 1:
            raise InputError(f"the table holds suites {sorted(t['suite'].unique())}; pass suite=")
        v = t.set_index("variant")[column]
        for name in (a, b):
            if name not in v.index:
                raise InputKeyError(f"no variant {name!r}; variants: {list(v.index)}")
        return float(v[a] - v[b])

    def beside(self, eps: float) -> Ablation:
        """The rows :func:`ablation_over_suites` ran at another ``eps``, under their plain variant names."""
        tag = f" @ eps {eps:g}"
        t = self.table[self.table["variant"].str.endswith(tag)].copy()
        t["variant"] = t["variant"].str[: -len(tag)]
        pt = self.per_task
        if len(pt):
            pt = pt[pt["variant"].str.endswith(tag)].copy()
            pt["variant"] = pt["variant"].str[: -len(tag)]
        return Ablation(t.reset_index(drop=True), pt)

    def main(self) -> Ablation:
        """The rows at the ablation's own eps (without the ``@ eps`` rows of :meth:`beside`)."""
        keep = ~self.table["variant"].str.contains(" @ eps ", regex=False)
        pt = self.per_task[~self.per_task["variant"].str.contains(" @ eps ", regex=False)] if len(self.per_task) \
            else self.per_task
        return Ablation(self.table[keep].reset_index(drop=True), pt)

    @staticmethod
    def concat(parts: Sequence[Ablation]) -> Ablation:
        return Ablation(pd.concat([p.table for p in parts], ignore_index=True),
                        pd.concat([p.per_task for p in parts], ignore_index=True))


def _same_state(a: StateDict, b: StateDict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def run_ablation(bench, variants: Mapping[str, Mapping[str, Any]] | None = None, *, scaled: bool = True,
                 search=None, hparams: Mapping[str, Any] | None = None, suite: str | None = None,
                 progress: bool | None = None) -> Ablation:
    """Merge with ACE once per variant (label -> hyperparameters, default :data:`ABLATIONS`, over the
    shared ``hparams``) and score each on test. A merge equal to an earlier one reuses its scores
    (``same_as``). ``scaled`` adds ``bench.run("ace", search=search)`` as :data:`SCALED_LABEL`."""
    layout = bench.layout_kwargs()
    variants = dict(ABLATIONS if variants is None else variants)
    if suite is None:
        suite = getattr(bench.world, "suite", None) or ""
    base, experts = bench.base, bench.experts
    done: list[tuple[str, StateDict, dict, dict, dict | None]] = []
    rows, per_task = [], []
    shared = dict(hparams or {})

    def add(label: str, hp: str, scaling: Any, acc: dict, norm: dict, hits: dict | None, same_as: str,
            t0: float) -> None:
        rows.append({"suite": suite, "variant": label, "hparams": hp, "scaling": scaling,
                     "test_acc": 100 * float(np.mean(list(acc.values()))),
                     "test_normalized": 100 * float(np.mean(list(norm.values()))),
                     "same_as": same_as, "seconds": time.perf_counter() - t0})
        # per task: each test example's correctness where the world scores examples (paired margins)
        per_task.extend({"suite": suite, "variant": label, "task": t, "accuracy": 100 * acc[t],
                         "normalized": 100 * norm[t], "expert": 100 * bench.expert_accuracy("test")[t],
                         "correct": None if hits is None else hits[t]} for t in acc)

    for label, hp in bar(list(variants.items()), desc="ablation", enabled=progress):
        hp = {**shared, **dict(hp)}
        t0 = time.perf_counter()
        merged = merging.merge("ace", base, experts, **hp, **layout)
        same = next((d for d in done if _same_state(d[1], merged)), None)
        if same is None:
            acc, hits = bench.scored(merged, "test")
            done.append((label, merged, acc, bench.normalized(acc, "test"), hits))
        _, _, acc, norm, hits = same or done[-1]
        add(label, ", ".join(f"{k}={v!r}" for k, v in variants[label].items()) or "defaults",
            hp.get("scaling", 1.0), acc, norm, hits, same[0] if same else "", t0)
    if scaled:
        if search is None:
            from ..benchmark import ACE_SCALED as search
        t0 = time.perf_counter()
        run = bench.run("ace", search=search, label=SCALED_LABEL, **shared)
        add(SCALED_LABEL, f"{run.coef_name} on val", run.coef, run.test, run.test_normalized, run.test_correct, "",
            t0)
    return Ablation(pd.DataFrame(rows), pd.DataFrame(per_task))


def ablation_view(table: Any) -> Any:
    """An :class:`Ablation` table in six plain columns (accuracies in %)."""
    return table[["suite", "variant", "scaling", "test_acc", "test_normalized", "same_as"]].rename(columns={
        "scaling": "scaling s", "test_acc": "test accuracy (%)", "test_normalized": "normalized accuracy (%)",
        "same_as": "same merge as"})


def ablation_over_suites(suites: Sequence[str], *, main: Any, size: str, seed: int, quick: bool, device: str,
                         hparams: Mapping[str, Any], tau: float = TAU, patience: int | None = None,
                         beside_eps: float | None = None, world_options: Mapping[str, Any] | None = None
                         ) -> tuple[Ablation, dict[str, float], Any]:
    """:func:`run_ablation` on every suite (``main`` = (suite, zoo, bench, gamma table) reused for its own):
    the :class:`Ablation`, the flagged share per suite, a table of suites. ``beside_eps``: also :data:`FULL`
    and :data:`NO_PRIOR` at that eps."""
    parts, flagged, rows = [], {}, []
    main_suite, main_zoo, main_bench, main_gt = main
    for s in suites:
        if s == main_suite:
            z, b, g = main_zoo, main_bench, main_gt
        else:
            z = course.world(s, size, seed=seed, quick=quick, device=device, **dict(world_options or {}))
            b = course.benchmark(z, quick=quick, patience=patience)
            g = heterogeneity_per_layer(task_vectors(b.base, b.experts), tau=tau)
        name = z.suite or s
        flagged[name] = float(g.flag.mean())
        t0 = time.perf_counter()
        parts.append(run_ablation(b, hparams=hparams, suite=name))
        if beside_eps is not None:
            tag = f" @ eps {beside_eps:g}"
            parts.append(run_ablation(b, {FULL + tag: {**ABLATIONS[FULL], "eps": beside_eps},
                                          NO_PRIOR + tag: {**ABLATIONS[NO_PRIOR], "eps": beside_eps}},
                                      scaled=False, hparams=hparams, suite=name))
        rows.append({"suite": name, "tasks": len(z.tasks), "flagged (%)": 100 * flagged[name],
                     "seconds": time.perf_counter() - t0})
        del z, b, g
    return Ablation.concat(parts), flagged, pd.DataFrame(rows)


def eps_sweep(bench, eps_grid: Sequence[float], *, hparams: Mapping[str, Any] | None = None,
              modes: Sequence[str] = ("absolute", "relative"), keys: Sequence[str] | None = None,
              progress: bool | None = None) -> Any:
    """ACE's test accuracy per ``eps`` and ``eps_mode`` (notebook 02, "eps in units"): ``ridge_rel`` is the median
    ridge over the mean covariance eigenvalue, ``pinv_layers`` the matrices whose system was singular."""
    taus = task_vectors(bench.base, bench.experts)
    keys = list(keys) if keys is not None else [k for k in bench.base if is_matrix_param(k, bench.base[k])]
    tr = {k: np.array([float(A.center_rows(tv[k].double()).pow(2).sum()) for tv in taus]) for k in keys}
    d_in = {k: int(taus[0][k].shape[1]) for k in keys}
    rows = []
    shared = {k: v for k, v in dict(hparams or {}).items() if k not in ("eps", "eps_mode")}
    for mode, eps in bar([(m, float(e)) for m in modes for e in eps_grid], desc="eps sweep", enabled=progress):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            merged = merging.merge("ace", bench.base, bench.experts, **shared, eps=eps, eps_mode=mode,
                           **bench.layout_kwargs())
        pinv = [w for w in caught if issubclass(w.category, RuntimeWarning) and "pseudo-inverse" in str(w.message)]
        for w in caught:  # every other warning as it was
            if w not in pinv:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        acc = bench.evaluate(merged, "test")
        norm = bench.normalized(acc, "test")
        rel = eps if mode == "relative" else float(np.median([np.mean(eps * d_in[k] / tr[k]) for k in keys]))
        rows.append({"eps_mode": mode, "eps": eps, "ridge_rel": rel,
                     "test_acc": 100 * float(np.mean(list(acc.values()))),
                     "test_normalized": 100 * float(np.mean(list(norm.values()))), "pinv_layers": len(pinv)})
    return pd.DataFrame(rows)
