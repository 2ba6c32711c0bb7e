"""ACE-Merging (Xu et al., CVPR 2026; arXiv 2603.02945), stage by stage (docs/methods.md §ACE).

ACE merges each d_out × d_in matrix in closed form,

    W_bar_pre = (sum_t N_t Sigma_reg,t) (sum_t Sigma_reg,t + C_agg)^-1          (eq. 14)

with Sigma_reg,t a regularised estimate of task t's input covariance made from the task vector
ΔW_t alone (Theorem 1). The stages, each a public function (docs/methods.md §ACE equations):
:func:`heterogeneity` and :func:`gate_flag` (ACE.5)-(ACE.6); :func:`estimate_covariance`
(ACE.3)-(ACE.4); :func:`normalize_covariances` (ACE.7)-(ACE.8); :func:`structural_prior` (ACE.9);
:func:`closed_form` (ACE.10); :func:`spectral_refine` (ACE.11)-(ACE.13). :func:`ace_matrix` is
their composition, and what ``merge("ace")`` and ``acetools merge`` run on every matrix.
Speed lives inside the stages (docs/performance.md, ACE); given plain lists of tensors they compute
each sum as written.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import torch
from torch import Tensor

from ..errors import InputError
from ..utils import progress
from . import linalg
from ._registry import METHODS, Param, register
from .averaging import mean_update, warn_mean_fallback
from .driver import format_bytes, is_matrix_param
from .inputs import (
    EPS_MODES,
    ESTIMATORS,
    GAMMA_MODES,
    PRECISIONS,
    check_ace_covariances,
    check_covariances_param,
    check_prior,
    check_task_vectors,
    estimator_preset,
    given_covariances,
    preset_switches,
)
from .linalg import (
    NormalizedCovariances,
    Refinement,
    TaskCovariance,
    center_rows,
    dense_covariance,
    isotropic_update,
)

__all__ = [
    "ESTIMATORS", "EPS_MODES", "GAMMA_MODES", "PRECISIONS", "estimator_preset", "center_rows",
    "task_energies", "heterogeneity", "gate_flag", "estimate_covariance", "NormalizedCovariances",
    "normalize_covariances", "ridge_of", "structural_prior", "closed_form", "Refinement",
    "refined_rank", "isotropic_update", "spectral_refine", "ACEDiagnostics", "ace_matrix", "ace_with_diagnostics",
    "ace",
]

_LOG_FLOOR = 1e-12  # log(e + 1e-12) and mean(l)^2 + 1e-12 in eq. 7 (official code)
_TRACE_FLOOR = 1e-12  # tr_t = Tr(Sigma_hat_t) + 1e-12 (official code)
_ENERGY_FLOOR = 1e-12  # flagged prior divided by mean energy + 1e-12 (docs/methods.md §ACE, Eq. (ACE.9))


# --------------------------------------------------------------------------- stages


def task_energies(delta_W: Sequence[Tensor]) -> Tensor:
    """e_t = ||ΔW_t||_F², the *uncentred* energies of eq. 7, as a float64 vector of length T."""
    return linalg.sq_norms(delta_W)


def heterogeneity(delta_W: Sequence[Tensor], mode: str = "paper") -> float:
    """The heterogeneity gamma of one layer: Var_t(l_t) / (Mean_t(l_t)² + 1e-12), l_t = log(||ΔW_t||_F² + 1e-12)
    (docs/methods.md §ACE, Eqs. (ACE.5)-(ACE.6)); 0 for T = 1. ``mode="cv"``: Var_t(e_t) / Mean_t(e_t)²."""
    if len(delta_W) == 0:
        raise InputError("heterogeneity needs at least one task vector")
    if mode not in GAMMA_MODES:
        raise InputError(f"mode={mode!r} must be one of {GAMMA_MODES}")
    energies = task_energies(delta_W)  # (T,)
    if energies.numel() == 1:
        return 0.0
    if mode == "cv":
        m = float(energies.mean())
        return 0.0 if m <= 0 else float(energies.var(unbiased=True)) / m**2
    ell = torch.log(energies + _LOG_FLOOR)
    return float(ell.var(unbiased=True) / (ell.mean() ** 2 + _LOG_FLOOR))


def gate_flag(gamma: float, tau: float, gate: str) -> bool:
    """The gate (eq. 7): "auto" flags the layer when gamma > tau, "on" always, "off" never."""
    return bool({"auto": gamma > tau, "on": True, "off": False}[gate])


@overload
def estimate_covariance(delta_W: Tensor, estimator: str = ..., *, wudi_p: float = ...,
                        factored: Literal[False] = ...) -> Tensor: ...
@overload
def estimate_covariance(delta_W: Tensor, estimator: str = ..., *, wudi_p: float = ...,
                        factored: Literal[True]) -> TaskCovariance: ...
def estimate_covariance(delta_W: Tensor, estimator: str = "ace", *, wudi_p: float = 2.0,
                        factored: bool = False) -> Tensor | TaskCovariance:
    """Sigma_hat_t (d_in × d_in, float64) from one task vector ΔW_t (docs/methods.md §ACE, Eqs. (ACE.3)-(ACE.4)):
    "ace": W̃ᵀ W̃ (W̃ = :func:`center_rows` (ΔW)); "identity": I; "wudi": ΔWᵀ ΔW / ||ΔW||_F^wudi_p.
    ``factored=True``: unformed, a :class:`acetools.merging.linalg.TaskCovariance`."""
    if delta_W.ndim != 2:
        raise InputError(f"estimate_covariance needs a 2-D task vector, got shape {tuple(delta_W.shape)}")
    if estimator == "given":
        raise InputError("estimator='given' has no estimate: pass the covariances (Sigma=...) to ace_matrix")
    if estimator not in ESTIMATORS:
        raise InputError(f"estimator={estimator!r} is not one of {list(ESTIMATORS)}")
    cov = TaskCovariance(delta_W, estimator, wudi_p)
    return cov if factored else cov.dense()


def ridge_of(trace: float, *, eps: float, normalize: bool, eps_mode: str = "absolute", d_in: int = 1) -> float:
    """r_t of Sigma_reg,t = Σ̃_t + r_t I (eqs 9-10): eps/tr_t if ``normalize`` else eps; "relative": eps·tr(Σ̃_t)/d_in."""
    if eps_mode == "relative":
        return eps * (1.0 if normalize else trace) / d_in
    return eps / trace if normalize else eps


def normalize_covariances(Sigma_hat: Sequence[Tensor | TaskCovariance], *, eps: float = 1e-2, normalize: bool = False,
                          eps_mode: str = "absolute", precision: str = "float64", numerator: str = "centered",
                          refine: bool = True) -> NormalizedCovariances:
    """Trace normalisation and Tikhonov regularisation (docs/methods.md §ACE, Eqs. (ACE.7)-(ACE.8)).

    ``normalize``: Σ̃_t = Sigma_hat_t / tr_t, Sigma_reg,t = Σ̃_t + (eps / tr_t) I; else Sigma_hat_t + eps I
    (:func:`ridge_of`). Unformed covariances are streamed once (:func:`acetools.merging.linalg.task_sums`,
    in ``precision``) into the sums the later stages read (for ``numerator``; the refinement's if ``refine``).
    """
    if len(Sigma_hat) == 0:
        raise InputError("normalize_covariances needs at least one covariance")
    if eps < 0 or not math.isfinite(eps):
        raise InputError(f"eps={eps!r} must be a finite number >= 0")
    if eps_mode not in EPS_MODES:
        raise InputError(f"eps_mode={eps_mode!r} must be one of {EPS_MODES}")
    first = Sigma_hat[0]
    d_in = first.delta_W.shape[1] if isinstance(first, TaskCovariance) else first.shape[-1]

    def rule(trace: float) -> tuple[float, float, float]:  # Tr(Sigma_hat_t) -> (tr_t, scale, ridge)
        tr = trace + _TRACE_FLOOR
        return tr, (1.0 / tr if normalize else 1.0), ridge_of(tr, eps=eps, normalize=normalize, eps_mode=eps_mode,
                                                              d_in=d_in)

    covs = [S for S in Sigma_hat if isinstance(S, TaskCovariance)]
    if len(covs) == len(Sigma_hat):
        sums = linalg.task_sums(covs, rule, dtype=torch.float64 if precision == "float64" else torch.float32,
                                centered=numerator == "centered", refine=refine)
        tildes = linalg.StreamedCovariances((c._replace(scale=float(s)) for c, s in zip(covs, sums.scales)), sums)
        return NormalizedCovariances(tildes, sums.ridge, sums.traces, bool(normalize))
    S64 = [dense_covariance(S) for S in Sigma_hat]
    traces = torch.stack([torch.diagonal(S).sum() for S in S64]) + _TRACE_FLOOR
    Sigma_tilde = [S / tr for S, tr in zip(S64, traces)] if normalize else S64
    ridge = torch.tensor([rule(float(tr) - _TRACE_FLOOR)[2] for tr in traces], dtype=torch.float64,
                         device=S64[0].device)
    return NormalizedCovariances(Sigma_tilde, ridge, traces, bool(normalize))


def structural_prior(Sigma_tilde: Sequence[Tensor], *, energy: float | None = None) -> Tensor:
    """C_agg = 1 cᵀ (d_in × d_in, an expanded view; docs/methods.md §ACE, Eq. (ACE.9)): c the column means of
    sum_t Σ̃_t, over ``energy + 1e-12`` if given."""
    if len(Sigma_tilde) == 0:
        raise InputError("structural_prior needs at least one covariance")
    sums = getattr(Sigma_tilde, "sums", None)
    S = sums.S if sums is not None else linalg.sum64(dense_covariance(S) for S in Sigma_tilde)  # (d_in, d_in)
    c = S.mean(dim=0) if energy is None else S.mean(dim=0) / (float(energy) + _ENERGY_FLOOR)
    return c.unsqueeze(0).expand(S.shape[0], -1)  # a view: every row is c, no d_in x d_in copy


def closed_form(numerators: Sequence[Tensor], Sigma_reg: NormalizedCovariances | Sequence[Tensor],
                C_agg: Tensor | None = None, *, name: str = "") -> Tensor:
    """W_bar_pre = (sum_t N_t Sigma_reg,t)(sum_t Sigma_reg,t + C_agg)^-1, float64 (docs/methods.md §ACE, Eq. (ACE.10)).

    ``numerators``: the N_t (row-centred W̃_t in ACE, or the raw ΔW_t); ``Sigma_reg``: a
    :class:`NormalizedCovariances` or a list of Sigma_reg,t. Streamed covariances with the numerators they
    were made of are solved from their sums (:func:`acetools.merging.linalg.solve_task_sums`); else the LU
    solve (:func:`acetools.merging.linalg.solve_right`, docs/methods.md §Numerics).
    """
    if len(numerators) == 0:
        raise InputError(f"closed_form for layer {name!r} needs at least one task")
    tildes = Sigma_reg.Sigma_tilde if isinstance(Sigma_reg, NormalizedCovariances) else Sigma_reg
    sums = getattr(tildes, "sums", None)
    centered = isinstance(numerators, linalg.CenteredRows)
    dWs = numerators.delta_W if centered else numerators  # type: ignore[attr-defined]
    if sums is not None and sums.centered == centered and sums.made_of(dWs):
        return linalg.solve_task_sums(sums, check_prior(C_agg, sums.S.shape[0], name), name=name)
    nums = [N.double() for N in numerators]  # T x (d_out, d_in)
    covs = [dense_covariance(S) for S in tildes]  # T x (d_in, d_in)
    if len(covs) != len(nums):
        raise InputError(f"layer {name!r}: {len(nums)} numerators but {len(covs)} covariances")
    for t, (N, S) in enumerate(zip(nums, covs)):
        if N.ndim != 2 or S.shape != (N.shape[1], N.shape[1]):
            raise InputError(f"layer {name!r}, task {t}: covariance has shape {tuple(S.shape)} but the task "
                             f"vector is {tuple(N.shape)}; it must be d_in x d_in = {N.shape[-1]} x {N.shape[-1]}")
    ridge = Sigma_reg.ridge if isinstance(Sigma_reg, NormalizedCovariances) else torch.zeros(len(covs))
    B = linalg.sum64(N @ S + r * N for N, S, r in zip(nums, covs, ridge))  # (d_out, d_in)
    A = linalg.sum64(covs)  # (d_in, d_in)
    A.diagonal().add_(ridge.sum())
    C_agg = check_prior(C_agg, A.shape[0], name)
    return linalg.solve_right(B, A if C_agg is None else A + C_agg.double(), name=name)


def refined_rank(k_frac: float, shape: Sequence[int], name: str = "", *, stacklevel: int = 3) -> int:
    """k = floor(k_frac · min(d_out, d_in)) (eq. 18); k = 0 warns, naming the layer (it stays unrefined)."""
    k = int(k_frac * min(shape))
    if k == 0:
        warnings.warn(f"spectral refinement skipped for layer {name!r}: k = floor({k_frac} * {min(shape)}) = 0 "
                      "(the official code would return NaN here); raise k_frac or accept the unrefined layer",
                      RuntimeWarning, stacklevel=stacklevel)
    return k


def spectral_refine(W_pre: Tensor, delta_W: Sequence[Tensor], Sigma_tilde: Sequence[Tensor], Sigma_reg_mean: Tensor,
                    *, k_frac: float = 0.3, name: str = "") -> Refinement:
    """Spectral refinement (docs/methods.md §ACE, Eqs. (ACE.11)-(ACE.13)): W_fused = W_bar_pre + Δ_res = U S Vᵀ,
    Δ_res = sum_t ΔW_t (Σ̃_t - Σ̄_reg); W_bar = W_bar_pre + mean(S[:k]) U_k V_kᵀ, k = :func:`refined_rank`.
    Streamed ``Sigma_tilde``: Δ_res from the sums and only the top k (:func:`acetools.merging.linalg.top_svd`).
    """
    if not 0.0 <= k_frac <= 1.0:
        raise InputError(f"k_frac={k_frac!r} must be in [0, 1]")
    if len(delta_W) != len(Sigma_tilde):
        raise InputError(f"layer {name!r}: {len(delta_W)} task vectors but {len(Sigma_tilde)} covariances")
    Wp = W_pre.double()  # (d_out, d_in)
    sums = getattr(Sigma_tilde, "sums", None)
    streamed = sums is not None and sums.task_sum is not None and sums.made_of(delta_W)
    if streamed:
        assert sums is not None
        res = sums.residual(Sigma_reg_mean)  # Δ_res (d_out, d_in)
        W_fused = res.add_(Wp) if res.dtype == torch.float64 else Wp + res.double()
    else:
        dWs = [d.double() for d in delta_W]
        W_fused = Wp + (linalg.sum64(d @ dense_covariance(S) for d, S in zip(dWs, Sigma_tilde))
                        - linalg.sum64(dWs) @ Sigma_reg_mean.double())
    k = refined_rank(k_frac, Wp.shape, name)
    if streamed and k > 0:  # the top k only
        U, S, Vh = linalg.top_svd(W_fused, k, gram=True)
    else:
        U, S, Vh = linalg.thin_svd(W_fused)
    if k == 0:
        return Refinement(Wp, 0, math.nan, S, U, Vh, W_fused)
    sigma_iso = S[:k].mean()
    return Refinement(isotropic_update(Wp, U[:, :k] @ Vh[:k, :], sigma_iso), k, float(sigma_iso), S, U, Vh, W_fused)


# --------------------------------------------------------------------------- one matrix


@dataclass
class ACEDiagnostics:
    """What :func:`ace_matrix` saw and decided for one matrix (spectra and cond: ``spectra=True``)."""

    name: str
    shape: tuple[int, int]
    n_tasks: int
    estimator: str
    gate: str
    gamma: float
    flag: bool  # heterogeneous branch taken (gate "on", or "auto" with gamma > tau)
    normalized: bool  # trace normalisation applied (flag and trace_norm)
    prior: bool
    numerator: str
    refined: bool  # spectral refinement applied (flag, refine and k > 0)
    energies: list[float]  # ||ΔW_t||_F² (uncentred)
    traces: list[float]  # tr_t = Tr(Sigma_hat_t) + 1e-12
    ridge: list[float]  # eps/tr_t or eps
    k: int = 0
    sigma_iso: float = math.nan
    prior_norm: float = 0.0  # ||c||_2 of C_agg = 1 cᵀ (after the flagged division; 0 without the prior)
    cond: float | None = None  # 2-norm condition number of sum_t Sigma_reg,t + C_agg
    spectrum_pre: Tensor | None = field(default=None, repr=False)  # singular values of W_bar_pre
    spectrum: Tensor | None = field(default=None, repr=False)  # of the final W_bar


def ace_matrix(delta_W: Sequence[Tensor], *, tau: float = 0.3, eps: float = 1e-2, k_frac: float = 0.3,
               gate: str | None = None, trace_norm: bool = True, prior: bool | None = None, refine: bool = True,
               numerator: str | None = None, estimator: str = "ace", Sigma: Sequence[Tensor] | None = None,
               wudi_p: float = 2.0, precision: str = "float64", name: str = "", spectra: bool = False,
               eps_mode: str = "absolute", gamma_mode: str = "paper") -> tuple[Tensor, ACEDiagnostics]:
    """ACE-Merging for one matrix: the composition of the stages (docs/methods.md §ACE).

    ``delta_W``: the T task vectors ΔW_t (d_out × d_in); ``Sigma``: their covariances for
    ``estimator="given"``. Returns W_bar (before ``scaling``; input dtype) and an :class:`ACEDiagnostics`.
    Defaults: those of :func:`ace` (a test keeps them equal), ``None`` switches from the estimator's preset
    (:func:`estimator_preset`).
    """
    METHODS["ace"].resolve(dict(tau=tau, eps=eps, k_frac=k_frac, wudi_p=wudi_p, trace_norm=trace_norm, refine=refine,
                                estimator=estimator, precision=precision, eps_mode=eps_mode, gamma_mode=gamma_mode))
    sw = estimator_preset(estimator, gate=gate, prior=prior, numerator=numerator)
    dWs = check_task_vectors(delta_W, name)  # T x (d_out, d_in)
    energies = task_energies(dWs)  # (T,)
    gamma = heterogeneity(dWs, gamma_mode)
    flag = gate_flag(gamma, tau, sw.gate)
    Sigma_hat = given_covariances(Sigma, estimator, dWs, name)  # T x (d_in, d_in), unformed
    if Sigma_hat is None:
        Sigma_hat = [estimate_covariance(d, estimator, wudi_p=wudi_p, factored=True) for d in dWs]
    norm = normalize_covariances(Sigma_hat, eps=eps, normalize=flag and trace_norm, eps_mode=eps_mode,
                                 precision=precision, numerator=sw.numerator, refine=flag and refine)
    C_agg = structural_prior(norm.Sigma_tilde, energy=float(energies.mean()) if flag else None) if sw.prior else None
    numerators = linalg.CenteredRows(dWs) if sw.numerator == "centered" else dWs  # T x (d_out, d_in)
    W_pre = closed_form(numerators, norm, C_agg, name=name)  # (d_out, d_in), float64
    diag = ACEDiagnostics(
        name=name, shape=(dWs[0].shape[0], dWs[0].shape[1]), n_tasks=len(dWs), estimator=estimator, gate=sw.gate,
        gamma=gamma, flag=flag, normalized=bool(flag and trace_norm), prior=sw.prior, numerator=sw.numerator,
        refined=False, energies=energies.tolist(), traces=norm.traces.tolist(), ridge=norm.ridge.tolist(),
        prior_norm=0.0 if C_agg is None else float(torch.linalg.vector_norm(C_agg[0].double())),
    )
    W, ref = W_pre, None
    if flag and refine:
        ref = spectral_refine(W_pre, dWs, norm.Sigma_tilde, norm.mean_reg(), k_frac=k_frac, name=name)
        W = ref.W
        if ref.k > 0:
            diag.k, diag.sigma_iso, diag.refined = ref.k, ref.sigma_iso, True
    if spectra:
        sA = torch.linalg.svdvals(norm.sum_reg().double() + (C_agg.double() if C_agg is not None else 0.0))
        diag.cond = float(sA[0] / sA[-1]) if sA[-1] > 0 else math.inf
        diag.spectrum_pre, diag.spectrum = torch.linalg.svdvals(W_pre).cpu(), torch.linalg.svdvals(W).cpu()
    return W.to(delta_W[0].dtype), diag


# --------------------------------------------------------------------------- state dicts


@register(
    "ace",
    "ACE-Merging: closed-form merge with covariances estimated from the task vectors "
    "(Xu et al. 2026; docs/methods.md §ACE)",
    key_scope="key", per_key=("covariances",), needs_layout=True,  # no search: ACE uses scaling 1 (ACE_SCALED)
    presets=preset_switches, memory_note=lambda T, d_in: "plus ACE's work space, independent of T: two d_in x d_in "
    f"float64 matrices of the widest input (d_in = {d_in}: {format_bytes(2 * d_in * d_in * 8)}; linalg.task_sums)",
    tau=Param("heterogeneity threshold: the layer is flagged when gamma > tau (eq. 7)", low=0.0),
    eps=Param("Tikhonov strength (eqs 9-10): eps I, or eps/tr_t I on normalised layers", low=0.0),
    k_frac=Param("refined rank k = floor(k_frac * min(d_out, d_in)) (eq. 18)", low=0.0, high=1.0),
    scaling=Param("s in theta = theta0 + s * W_bar, every key (docs/methods.md §ACE, Eq. (ACE.14))", low=0.0),
    gate=Param("heterogeneity gate: 'auto' (gamma > tau), 'on', 'off'; None = estimator preset",
               choices=(None, "auto", "on", "off")),
    trace_norm=Param("trace-normalise the covariances on flagged layers (eq. 8)", types=(bool,)),
    prior=Param("the collective structural prior C_agg (eqs 11-13); None = preset", types=(bool, type(None))),
    refine=Param("spectral refinement on flagged layers (eqs 15-19)", types=(bool,)),
    numerator=Param("numerator of eq. 14: 'centered' W̃_t or 'raw' ΔW_t; None = estimator preset",
                    choices=(None, "centered", "raw")),
    estimator=Param("covariance estimator: 'ace' (eqs 5-6), 'identity' (= weight averaging), 'wudi', 'given'",
                    choices=ESTIMATORS),
    covariances=Param("for 'given': one {key: Sigma_t (d_in x d_in)} per expert", check=check_covariances_param),
    precision=Param("arithmetic of the accumulation and solve: 'float64' (default) "
                    "or 'float32' (about 2x faster; error in docs/performance.md)", choices=PRECISIONS),
    wudi_p=Param("norm power p of the 'wudi' estimator Sigma_t = tau_tᵀ tau_t / ||tau_t||_F^p", low=0.0),
    eps_mode=Param("the ridge: 'absolute' eps (the paper's) or 'relative' eps·tr(Sigma_tilde_t)/d_in, "
                   "eps times each task's mean covariance eigenvalue (not the paper's; docs/methods.md §ACE)",
                   choices=EPS_MODES),
    gamma_mode=Param("the gate's heterogeneity: 'paper' (eq. 7) or 'cv', the scale-invariant "
                     "Var_t(e_t)/Mean_t(e_t)^2 (not the paper's; docs/methods.md §ACE)", choices=GAMMA_MODES),
)
def ace(base, task_vectors, *, is_matrix, tau: float = 0.3, eps: float = 1e-2, k_frac: float = 0.3,
        scaling: float = 1.0, gate: str | None = None, trace_norm: bool = True, prior: bool | None = None,
        refine: bool = True, numerator: str | None = None, estimator: str = "ace",
        covariances: Sequence[Mapping] | None = None, precision: str = "float64", wudi_p: float = 2.0,
        eps_mode: str = "absolute", gamma_mode: str = "paper"):
    """ACE-Merging on a state dict (docs/methods.md §ACE, Eq. (ACE.14)): ``merge("ace", base, experts, ...)``;
    :func:`ace_with_diagnostics` without the diagnostics. The defaults are the paper's (docs/methods.md §ACE)."""
    update, _ = ace_with_diagnostics(
        base, task_vectors, is_matrix=is_matrix, tau=tau, eps=eps, k_frac=k_frac, scaling=scaling, gate=gate,
        trace_norm=trace_norm, prior=prior, refine=refine, numerator=numerator, estimator=estimator,
        covariances=covariances, precision=precision, wudi_p=wudi_p, eps_mode=eps_mode, gamma_mode=gamma_mode)
    return update


def ace_with_diagnostics(base: Mapping[str, Tensor], task_vectors: Sequence[Mapping[str, Tensor]], *,
                         is_matrix: Callable[[str, Tensor], bool] | None = None, spectra: bool = False,
                         **hparams: Any) -> tuple[dict[str, Tensor], dict[str, ACEDiagnostics]]:
    """ACE's merged update for every key of ``base`` and an :class:`ACEDiagnostics` per matrix: :func:`ace_matrix`
    on matrix keys (``is_matrix``, default :func:`acetools.merging.driver.is_matrix_param`), the mean on the others
    (and, for "given", on keys without covariances), all times ``scaling``.
    """
    is_matrix = is_matrix_param if is_matrix is None else is_matrix
    hp = METHODS["ace"].resolve(hparams)
    scaling, covariances = hp.pop("scaling"), hp.pop("covariances")
    T = len(task_vectors)
    if T == 0:
        raise InputError("ace needs at least one task vector")
    matrix_keys = {k: None for k in base if is_matrix(k, base[k])}  # ordered set
    given = check_ace_covariances(covariances, hp["estimator"], base, list(matrix_keys), T)
    if hp["estimator"] == "given":
        warn_mean_fallback("ace", [k for k in matrix_keys if k not in given], "no covariances")
    update: dict[str, Tensor] = {}
    diags: dict[str, ACEDiagnostics] = {}
    for key in progress(list(base), desc="ace"):
        dtype = task_vectors[0][key].dtype
        if key not in matrix_keys or (hp["estimator"] == "given" and key not in given):
            update[key] = scaling * mean_update(list(task_vectors), key)
            continue
        W, diags[key] = ace_matrix([tv[key] for tv in task_vectors], Sigma=given.get(key), name=key,
                                   spectra=spectra, **hp)
        update[key] = (scaling * W.double()).to(dtype).contiguous()
    return update, diags
