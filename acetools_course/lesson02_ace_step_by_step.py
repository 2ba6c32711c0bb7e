"""Notebook 02 (docs/course.md §02_ace_step_by_step): its tables and its ablation.

The lesson computes every ACE stage itself (docs/methods.md §ACE); this module only measures what
``merge("ace", ...)`` returns. The verdicts are this module's.

Figures of notebook 02: pure functions ``(ax, data, ...) -> ax`` on the tables of
this module's experiments and :func:`acetools.diagnostics.heterogeneity_per_layer`.

Notebook 02's claim verdicts: gamma, the three ACE stages, the spectrum and the direction
(docs/course.md §Claim rules); the tables they read come from this module's experiments."""

from __future__ import annotations

import functools
import math
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from acetools import merging
from acetools.diagnostics import condition_number, effective_rank, energy_fraction, heterogeneity_per_layer
from acetools.errors import InputError, InputKeyError
from acetools.keys import short_label, short_name  # short_label: ``...resblocks.3.mlp.c_fc.weight`` -> ``3.c_fc``
from acetools.merging import METHODS, is_matrix_param, task_vectors
from acetools.merging import ace as A
from acetools.merging.linalg import top_svd
from acetools.plotting import finish, track_drawing
from acetools.utils import progress as bar

from . import lesson_worlds as course
from . import verdicts as V
from .claims import PAPER_SETTINGS, paper_setting
from .paper_tables import ACE_STAGE_ABLATION, paper_room
from .power import paired_se
from .verdicts import NOISE  # the lesson reads it here (ace_claims.NOISE)

# ---- Experiments: the tables and runs -------------------------------------------------------------

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
            from acetools.benchmark import ACE_SCALED as search
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


# ---- Figures: the lesson's plots, drawn on a given axes -------------------------------------------

def _wants_log(values, ratio: float = 100.0) -> bool:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return v.size > 0 and v.max() / v.min() > ratio


def gamma_strip(ax, table, *, vit: float = 0.25, tau: float = 0.3, logy: bool | None = None, title: str | None = None):
    """gamma of every matrix, one column per layer type, against the paper's ViT line ``vit`` and ACE's
    gate ``tau``; ``logy=None``: log scale when gamma spans two decades."""
    missing = [c for c in ("layer_type", "gamma") if c not in table.columns]
    if missing:
        raise InputKeyError(f"gamma_strip: the table has no column {missing[0]!r} (columns: {list(table.columns)}); "
                       "pass acetools.diagnostics.heterogeneity_per_layer(...) or a table with layer_type and gamma")
    types = list(dict.fromkeys(table["layer_type"]))
    g = table["gamma"].to_numpy(dtype=float)
    x = np.array([types.index(t) for t in table["layer_type"]], dtype=float)
    # deterministic jitter: spread the points of a type evenly
    for t in types:
        idx = np.flatnonzero(table["layer_type"].to_numpy() == t)
        if idx.size > 1:
            x[idx] += np.linspace(-0.2, 0.2, idx.size)
    flag = g > tau
    ax.scatter(x[~flag], g[~flag], s=24, color="C0", label=f"gamma <= tau ({int((~flag).sum())})", zorder=3)
    ax.scatter(x[flag], g[flag], s=24, color="C3", label=f"flagged: gamma > tau ({int(flag.sum())})", zorder=3)
    ax.axhline(vit, color="C2", ls="--", lw=1, label=f"paper: ViT gamma < {vit}")
    ax.axhline(tau, color="k", ls=":", lw=1, label=f"gate tau = {tau} (RoBERTa above)")
    ax.set_xticks(range(len(types)), [short_name(t) for t in types], rotation=30, ha="right")
    if logy is None:
        logy = _wants_log(np.append(g, [vit, tau]))
    if logy:
        ax.set_yscale("log")
    ax.set_ylabel("heterogeneity gamma (eq. 7)")
    return finish(ax, title, legend=True)


def gamma_scaling(ax, df, *, tau: float = 0.3, title: str | None = None):
    """gamma of c·ΔW_t against the scale c (log-log; ``df``: scale, gamma), the gate tau and c = 1 marked."""
    d = df.sort_values("scale")
    ax.plot(d["scale"], d["gamma"], marker="o", ms=3, label="gamma(c·ΔW)")
    ax.axhline(tau, color="k", ls=":", lw=1, label=f"gate tau = {tau}")
    ax.axvline(1.0, color="C3", ls="--", lw=1, label="our weights (c = 1)")
    ax.set_xscale("log")
    if _wants_log(d["gamma"]):
        ax.set_yscale("log")
    ax.set_xlabel("scale c of every task vector")
    ax.set_ylabel("gamma")
    return finish(ax, title, legend=True)


def task_weights(ax, weights, *, title: str | None = None):
    """Each task's share of sum_t Sigma_tilde,t before (tr_t / sum tr) and after ACE's
    normalisation (``weights``: columns task, share_raw, share_used); line at 1/T."""
    n = len(weights)
    pos = np.arange(n)
    ax.bar(pos - 0.2, weights["share_raw"], width=0.4, label=r"raw: $\mathrm{tr}_t / \sum_s \mathrm{tr}_s$")
    ax.bar(pos + 0.2, weights["share_used"], width=0.4, label="as ACE used it")
    ax.axhline(1.0 / n, color="k", ls=":", lw=1, label="$1/T$")
    ax.set_xticks(pos, list(weights["task"]), rotation=45, ha="right")
    ax.set_ylabel("share of the summed covariance")
    ax.legend(fontsize=10, framealpha=0.9)
    return finish(ax, title)


def prior_profile(ax, profile, *, title: str | None = None):
    """The prior's column profile |c_j| against the diagonal of sum_t Sigma_tilde,t and the ridge, log
    scale, columns sorted by the diagonal. ``profile``: columns column, prior, cov_diag, ridge."""
    p = profile.sort_values("cov_diag", ascending=False).reset_index(drop=True)
    j = np.arange(len(p))
    c = p["prior"].to_numpy(dtype=float)
    ax.plot(j, p["cov_diag"], label=r"diag of $\sum_t \tilde\Sigma_t$")
    ax.plot(j, p["ridge"], ls="--", label=r"ridge on the diagonal ($\varepsilon I$)")
    pos, neg = c > 0, c < 0
    ax.scatter(j[pos], c[pos], s=8, marker="o", color="C2", label=r"$C_{\mathrm{agg}}$ column value $c_j > 0$")
    ax.scatter(j[neg], -c[neg], s=10, marker="x", color="C3", label=r"$|c_j|$, $c_j < 0$")
    ax.set_yscale("log")
    ax.set_xlabel("input column j (sorted by covariance diagonal)")
    ax.set_ylabel("value (log)")
    # a readable legend off the data: below the axes
    ax.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2, frameon=False)
    return finish(ax, title)


def spectra(ax, spectra: Mapping[str, Sequence[float]], *, top_frac: float | None = 0.05, logy: bool = True,
            title: str | None = None):
    """Singular values (descending) of several matrices, one line each; a line where the top ``top_frac`` ends."""
    r = 0
    for label, s in spectra.items():
        s = np.sort(np.asarray(s, dtype=float))[::-1]
        r = max(r, s.size)
        ax.plot(np.arange(1, s.size + 1), np.clip(s, 1e-16, None), label=label)
    if top_frac:
        k = max(1, int(np.ceil(top_frac * r)))
        ax.axvline(k, color="k", ls=":", lw=1, label=f"top {100 * top_frac:g}% (k = {k})")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("index i")
    ax.set_ylabel("singular value sigma_i")
    return finish(ax, title, legend=True)


def refined_spectrum(ax, pre: Sequence[float], refined: Mapping[int, Sequence[float]], k: int, *,
                     k_ace: int | None = None):
    """The rank slider's view: the spectrum of W_pre and of W_pre + sigma_iso(k) U_k V_kᵀ for
    the chosen ``k`` (``refined``: k -> singular values; log scale); ``k_ace`` marks ACE's own k."""
    k = int(k)
    if k not in refined:
        raise InputKeyError(
            f"no refined spectrum for k = {k}; have k in {sorted(refined)[:3]}...{sorted(refined)[-3:]}")
    pre_a = np.asarray(pre, dtype=float)
    s = np.asarray(refined[k], dtype=float)
    ax.plot(np.arange(1, pre_a.size + 1), np.clip(pre_a, 1e-16, None), color="C0", label="W_pre")
    ax.plot(np.arange(1, s.size + 1), np.clip(s, 1e-16, None), color="C1", label=f"refined, k = {k}")
    ax.axvline(k, color="C1", ls="--", lw=1)
    if k_ace is not None:
        ax.axvline(int(k_ace), color="k", ls=":", lw=1, label=f"ACE's k = {int(k_ace)}")
    ax.set_yscale("log")
    ax.set_xlabel("index i")
    ax.set_ylabel("singular value")
    ax.set_title(f"spectral refinement at rank k = {k}")
    ax.legend(fontsize=10)
    return ax


def layer_metrics(ax, table, columns: Mapping[str, str] | Sequence[str], *, hlines: Mapping[str, float] | None = None,
                  logy: bool = False, ylabel: str | None = None, title: str | None = None):
    """One marker line per column (names or {column: legend label}) of a per-layer table (``layer_table``),
    layers on the x axis; ``hlines``: {label: y} reference lines (e.g. the paper's numbers)."""
    cols = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}
    x = np.arange(len(table))
    for i, (c, label) in enumerate(cols.items()):
        ax.plot(x, table[c].to_numpy(dtype=float), marker="o", ms=4, lw=1, label=label, color=f"C{i}")
    for j, (label, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, color="k", ls=[":", "--", "-."][j % 3], lw=1, label=label)
    ax.set_xticks(x, [short_label(k) for k in table["key"]], rotation=60, ha="right", fontsize=10)
    if logy:
        ax.set_yscale("log")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return finish(ax, title)


def ablation_bars(ax, table, *, column: str = "test_normalized", reference: str = "ACE (full)", noise: float = 0.5,
                  title: str | None = None):
    """Horizontal bars of ``column`` per variant of an ``Ablation.table``, one colour per suite, with the
    band reference ± ``noise`` (differences inside it count as no effect)."""
    suites = list(dict.fromkeys(table["suite"]))
    variants = list(dict.fromkeys(table["variant"]))
    h = 0.8 / len(suites)
    for i, s in enumerate(suites):
        t = table[table["suite"] == s].set_index("variant")
        vals = [float(t.loc[v, column]) if v in t.index else np.nan for v in variants]
        pos = np.arange(len(variants)) + (i - (len(suites) - 1) / 2) * h
        ax.barh(pos, vals, height=h, color=f"C{i}", label=str(s))
        if reference in t.index:
            ref = float(t.loc[reference, column])
            ax.axvspan(ref - noise, ref + noise, color=f"C{i}", alpha=0.15)
    ax.set_yticks(np.arange(len(variants)), variants)
    ax.invert_yaxis()
    finite = table[column].to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size:
        lo, hi = finite.min(), finite.max()
        pad = max(1.0, 0.1 * (hi - lo))
        ax.set_xlim(lo - pad - noise, hi + pad + noise)
    ax.set_xlabel(
        {"test_normalized": "normalized test accuracy (%)", "test_acc": "test accuracy (%)"}.get(column, column)
    )
    ax.legend(fontsize=10, title="suite (band: full ACE ± noise)", title_fontsize=10)
    return finish(ax, title)


def eps_units(ax, table, *, paper_eps: float | None = 1e-5, default_eps: float | None = 1e-2,
              title: str | None = None):
    """ACE's normalized test accuracy against the ridge in the covariance's units, eps·d_in/tr (``eps_sweep``),
    one line per ``eps_mode``; the paper's (ViT) and the code's default eps marked."""
    for i, (mode, d) in enumerate(table.groupby("eps_mode", sort=False)):
        d = d.sort_values("ridge_rel")
        ax.plot(d["ridge_rel"], d["test_normalized"], "o-", color=f"C{i}", ms=4,
                label="absolute ε (the paper's)" if mode == "absolute" else "relative ε (eps_mode='relative')")
    ab = table[table["eps_mode"] == "absolute"]
    for eps, name, ls in ((paper_eps, "paper's ViT eps", "--"), (default_eps, "code default", ":")):
        row = ab[np.isclose(ab["eps"], eps)] if eps is not None else ab.iloc[:0]
        if len(row):
            ax.axvline(float(row["ridge_rel"].iloc[0]), color="0.4", ls=ls, lw=1, label=f"{name} {eps:g}")
    ax.set_xscale("log")
    ax.set_xlabel(r"ridge / mean eigenvalue of the covariance, $\rho = \varepsilon\, d_{\mathrm{in}} / \mathrm{tr}_t$")
    ax.set_ylabel("normalized test accuracy (%)")
    ax.legend(fontsize=10, loc="best", framealpha=0.9)
    return finish(ax, title)


# ---- Verdicts: the lesson's claims, judged --------------------------------------------------------

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


#: The effect each stage has in the paper's ViT setting (:data:`acetools_course.paper_tables.ACE_STAGE_ABLATION`):
#: what a vision world's stage claims predict.
VIT_STAGE_EFFECT: dict[str, float] = {k: v["effect"] for k, v in ACE_STAGE_ABLATION.items()}


def _paper_room_vit(n_tasks: int) -> float:
    return paper_room("spec", n_tasks if n_tasks in (8, 14, 20) else 8)


def _stage_effect(s: Mapping[str, Any], d: float, *, world: V.World | None, n_tasks: Mapping[str, int] | None,
                  paper: float | None, noise: float) -> V.Effect:
    """A stage claim's :class:`~acetools_course.verdicts.Effect` at one suite (its paired ``se`` where ``s`` has one):
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


#: The eps the paper reports for ViTs (the ViT family's of :data:`acetools_course.claims.PAPER_SETTINGS`); the stage
#: claims are decided there in a vision world, at the BERT family's in the text world (the code's default, 1e-2 as
#: in the official code, is shown beside).
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
    family = paper_setting(None if world is None else world.name).family  # None: the ViT's
    for cid in ("ace.csp", "ace.spectrum", "ace.normalization", "ace.refinement"):
        out[cid] = decided_at(out[cid], eps, family)
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


def decided_at(v: V.Verdict, eps: float | None, family: str = PAPER_SETTINGS["vit"].family) -> V.Verdict:
    """``v`` with the eps it was decided at in its reason and ``numbers["eps"]`` (None: no text):
    notebook 02's stage claims, decided at the paper's eps of the world's model ``family``
    (:data:`acetools_course.claims.PAPER_SETTINGS`: ViT 1e-5 in a vision world, the BERT family's 2e-4 in the
    text world)."""
    at = f" (decided at eps {eps:g}, the paper's {family} setting)" if eps is not None else ""
    return v.with_reason(v.reason + at, eps=eps)


def with_beside(v: V.Verdict, side: Mapping[str, Any]) -> V.Verdict:
    """``v`` with the verdict at the code default eps shown beside it (not judged): ``side`` =
    ``{"eps", "verdict", "measured", "reason"}``, stored as ``numbers["beside"]``."""
    return v.with_reason(f"{v.reason}; beside it, the code default eps {side['eps']:g}: {side['verdict']} "
                         f"({side['measured']})", beside=dict(side))


track_drawing([sys.modules[__name__]])  # each figure function notes itself on the figure it draws (the manifest)
