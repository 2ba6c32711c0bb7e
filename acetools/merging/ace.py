"""ACE-Merging (Xu et al., CVPR 2026; arXiv 2603.02945), stage by stage (docs/methods.md §ACE).

ACE merges each d_out × d_in matrix in closed form,

    W_bar_pre = (sum_t N_t Sigma_reg,t) (sum_t Sigma_reg,t + C_agg)^-1          (eq. 14)

where Sigma_reg,t is a regularised estimate of task t's input covariance, made from the task
vector ΔW_t alone (Theorem 1: Sigma_t ∝ Cov[ΔW_t]). Every stage is a public function, so a
notebook can stop after any of them and look:

====================  ===================================================  =============
stage                 function                                             docs/methods.md §ACE; paper
====================  ===================================================  =============
energies, gamma       :func:`task_energies`, :func:`heterogeneity`          (ACE.5)-(ACE.6), eq. 7
Sigma_hat_t           :func:`estimate_covariance` (+ :func:`center_rows`)   (ACE.3)-(ACE.4), eqs 5-6
Sigma_tilde, Sigma_reg :func:`normalize_covariances`                        (ACE.7)-(ACE.8), eqs 8-10
C_agg                 :func:`structural_prior`                              (ACE.9), eqs 11-13
W_bar_pre             :func:`closed_form`                                   (ACE.10), eq. 14
W_bar                 :func:`spectral_refine`                               (ACE.11)-(ACE.13), eqs 15-19
one matrix            :func:`ace_matrix` -> (W_bar, :class:`ACEDiagnostics`)
a state dict          :func:`ace_with_diagnostics`; registered as ``merge("ace", ...)``
====================  ===================================================  =============

All maths runs in float64 (``precision="float32"``: the accumulation and the solve in float32)
on the device of the inputs; results come back in the input dtype. :func:`ace_matrix` runs the
stages' maths in one streamed pass per matrix (memory independent of T; see
``docs/performance.md``); the stage functions stay as written for notebooks.

The unified framework (ACE-Merging §3): the same closed form with other covariance estimators
reproduces earlier methods. ``estimator`` picks Sigma_hat_t and, through
:func:`estimator_preset`, the switches that make the identity exact:

* ``"ace"``: Sigma_hat_t = W̃_tᵀ W̃_t with W̃_t the row-centred ΔW_t (eqs 5-6); the full method.
* ``"identity"``: Sigma_hat_t = I, raw numerator, no prior, gate off. Then
  Sigma_reg,t = (1 + eps) I for every t and eq. 14 gives (1/T) sum_t ΔW_t: weight averaging,
  exactly, for every eps (docs/methods.md §Weight averaging).
* ``"wudi"``: Sigma_hat_t = ΔW_tᵀ ΔW_t / ||ΔW_t||_F^p (norm-weighted outer product), raw
  numerator, no prior, gate off. With eps = 0 eq. 14 is the stationary point of WUDI's loss
  L(W) = sum_t ||(W - ΔW_t) ΔW_tᵀ||_F² / ||ΔW_t||_F^p (docs/methods.md §WUDI), hence its minimiser
  (L is a convex quadratic): grad L = 2 sum_t (W - ΔW_t) Sigma_t = 0. Where sum_t Sigma_t is
  singular (T·rank < d_in) the minimiser is not unique: the pseudo-inverse picks one, while
  WUDI's Adam run keeps its initial value in the null space. eps > 0 adds a ridge.
* ``"given"``: Sigma_t supplied by the caller (``covariances``), raw numerator, no prior, gate
  off: eq. 14 becomes RegMean's solve (docs/methods.md §RegMean, without the off-diagonal shrink). With eps = 0
  and the true input covariances of linear-regression tasks it returns the joint least-squares
  solution (sum_t W_t Sigma_t)(sum_t Sigma_t)^-1 (W0 cancels).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..errors import InputError, InputKeyError, InputTypeError
from ..layouts import Layout
from ..utils import progress
from ._linalg import (
    check_psd,
    check_square,
    gram_top_svd,
    solve_right,
    solve_spd_rank_one,
    symmetrize_lower_,
    syrk_lower_,
    thin_svd,
)
from ._registry import METHODS, Param, effective_hparams, register, registered_defaults
from .averaging import mean_update, warn_mean_fallback

__all__ = [
    "ESTIMATORS",
    "EPS_MODES",
    "GAMMA_MODES",
    "estimator_preset",
    "center_rows",
    "task_energies",
    "heterogeneity",
    "estimate_covariance",
    "NormalizedCovariances",
    "normalize_covariances",
    "structural_prior",
    "closed_form",
    "Refinement",
    "spectral_refine",
    "gate_flag",
    "ridge_of",
    "prior_vector",
    "refined_rank",
    "refinement_residual",
    "isotropic_update",
    "ACEDiagnostics",
    "ace_matrix",
    "ace_with_diagnostics",
    "ace",
]

ESTIMATORS = ("ace", "identity", "wudi", "given")
_LOG_FLOOR = 1e-12  # log(e + 1e-12) and mean(l)^2 + 1e-12 in eq. 7 (official code)
_TRACE_FLOOR = 1e-12  # tr_t = Tr(Sigma_hat_t) + 1e-12 (official code)
_ENERGY_FLOOR = 1e-12  # flagged prior divided by mean energy + 1e-12 (docs/methods.md §ACE, Eq. (ACE.9))


class Switches(NamedTuple):
    """The component switches an estimator implies (see :func:`estimator_preset`)."""

    gate: str
    prior: bool
    numerator: str


_PRESETS = {
    "ace": Switches(gate="auto", prior=True, numerator="centered"),
    "identity": Switches(gate="off", prior=False, numerator="raw"),
    "wudi": Switches(gate="off", prior=False, numerator="raw"),
    "given": Switches(gate="off", prior=False, numerator="raw"),
}


def estimator_preset(
    estimator: str = "ace",
    *,
    gate: str | None = None,
    prior: bool | None = None,
    numerator: str | None = None,
) -> Switches:
    """The switches used with ``estimator``; ``None`` means "the estimator's preset".

    ========== ======= ======= ==========
    estimator  gate    prior   numerator
    ========== ======= ======= ==========
    ace        auto    True    centered    (the paper's method, docs/methods.md §ACE)
    identity   off     False   raw         (= weight averaging exactly)
    wudi       off     False   raw         (= WUDI's quadratic minimiser, eps=0)
    given      off     False   raw         (= RegMean's solve, eps=0)
    ========== ======= ======= ==========

    Explicit values override the preset, so every ablation is reachable (e.g.
    ``estimator="identity", prior=True``). ``trace_norm`` and ``refine`` need no preset:
    they only act on flagged layers, and the non-ACE presets switch the gate off.
    """
    if estimator not in _PRESETS:
        raise InputError(f"estimator={estimator!r} is not one of {list(ESTIMATORS)}")
    p = _PRESETS[estimator]
    out = Switches(
        gate=p.gate if gate is None else gate,
        prior=p.prior if prior is None else prior,
        numerator=p.numerator if numerator is None else numerator,
    )
    if out.gate not in ("auto", "on", "off"):
        raise InputError(f"gate={out.gate!r} is not one of ['auto', 'on', 'off']")
    if out.numerator not in ("centered", "raw"):
        raise InputError(f"numerator={out.numerator!r} is not one of ['centered', 'raw']")
    if not isinstance(out.prior, bool):
        raise InputTypeError(f"prior={out.prior!r} must be True, False or None")
    return out


# --------------------------------------------------------------------------- stages


def center_rows(delta_W: Tensor) -> Tensor:
    """W̃ = ΔW - 1 μᵀ with μ = (1/d_out) ΔWᵀ 1, the mean row (eq. 5; rows are samples).

    Every column of the result sums to zero. New tensor; the input is untouched.
    """
    return delta_W - delta_W.mean(dim=0, keepdim=True)


def task_energies(delta_W: Sequence[Tensor]) -> Tensor:
    """e_t = ||ΔW_t||_F², the *uncentred* energies of eq. 7, as a float64 vector of length T.

    Each is a float64 dot product of the flattened task vector with itself (lower precisions are
    converted into one reused float64 buffer: no fresh d_out × d_in temporary per task)."""
    buf: Tensor | None = None
    out = []
    for d in delta_W:
        if d.dtype == torch.float64:
            x = d.reshape(-1)
        else:
            if buf is None or buf.numel() != d.numel() or buf.device != d.device:
                buf = torch.empty(d.numel(), dtype=torch.float64, device=d.device)
            x = buf.copy_(d.reshape(-1))
        out.append(torch.dot(x, x))
    return torch.stack(out)


def heterogeneity(delta_W: Sequence[Tensor], mode: str = "paper") -> float:
    """The heterogeneity statistic gamma of one layer (eq. 7 of ACE-Merging; docs/methods.md §ACE,
    Eqs. (ACE.5)-(ACE.6)).

    gamma = Var_t(l_t) / (Mean_t(l_t)² + 1e-12) with l_t = log(||ΔW_t||_F² + 1e-12) and the
    *unbiased* (T-1) variance, as in the official code (docs/methods.md §ACE: T-1, as the code). For T = 1
    gamma = 0 (the code's variance is NaN there, so its flag is false too).

    Note that gamma is not scale-invariant: multiplying every ΔW_t by c shifts every l_t by
    2 log c, which changes the denominator. ``mode="cv"`` is a scale-invariant variant that is
    not the paper's (ACE's ``gamma_mode`` option): the squared coefficient of variation of the
    energies, Var_t(e_t) / Mean_t(e_t)² (:func:`_gamma`).
    """
    if len(delta_W) == 0:
        raise InputError("heterogeneity needs at least one task vector")
    if mode not in GAMMA_MODES:
        raise InputError(f"mode={mode!r} must be one of {GAMMA_MODES}")
    return _gamma(task_energies(delta_W), mode)


def _gamma(energies: Tensor, mode: str = "paper") -> float:
    """gamma of eq. 7 from the energies e_t (:func:`heterogeneity`), so ACE computes them once.

    ``mode="cv"``: the scale-invariant variant (not the paper's), the squared coefficient of
    variation of the energies, Var_t(e_t) / Mean_t(e_t)² (unbiased variance): multiplying every
    ΔW_t by c leaves it unchanged; for log-normal energies with a small spread s of log e_t it
    is about s², the numerator of the paper's gamma."""
    if energies.numel() == 1:
        return 0.0
    if mode == "cv":
        e = energies.double()
        m = float(e.mean())
        return 0.0 if m <= 0 else float(e.var(unbiased=True)) / m**2  # all-zero updates: no heterogeneity
    ell = torch.log(energies + _LOG_FLOOR)
    return float(ell.var(unbiased=True) / (ell.mean() ** 2 + _LOG_FLOOR))


def gate_flag(gamma: float, tau: float, gate: str) -> bool:
    """The heterogeneity gate (eq. 7): ``"auto"`` flags the layer when gamma > tau, ``"on"``
    always, ``"off"`` never. A flagged layer is trace-normalised and refined."""
    return bool({"auto": gamma > tau, "on": True, "off": False}[gate])


def estimate_covariance(delta_W: Tensor, estimator: str = "ace", *, wudi_p: float = 2.0) -> Tensor:
    """Sigma_hat_t (d_in × d_in, float64) estimated from one task vector ΔW_t (d_out × d_in).

    * ``"ace"``: W̃ᵀ W̃ with W̃ = :func:`center_rows` (ΔW) (eqs 5-6 of ACE-Merging), with no
      1/(d_out - 1) factor, as in the official code.
    * ``"identity"``: I (weight averaging in the unified framework).
    * ``"wudi"``: ΔWᵀ ΔW / ||ΔW||_F^wudi_p (WUDI's norm-weighted outer product; a zero ΔW
      gives the zero matrix).

    ``"given"`` has no estimate: pass the covariances to :func:`ace_matrix` instead.
    """
    if delta_W.ndim != 2:
        raise InputError(f"estimate_covariance needs a 2-D task vector, got shape {tuple(delta_W.shape)}")
    d = delta_W.double()
    if estimator == "ace":
        Wc = center_rows(d)
        return Wc.T @ Wc
    if estimator == "identity":
        return torch.eye(d.shape[1], dtype=torch.float64, device=d.device)
    if estimator == "wudi":
        norm = torch.linalg.matrix_norm(d)
        if norm == 0:
            return torch.zeros(d.shape[1], d.shape[1], dtype=torch.float64, device=d.device)
        return (d.T @ d) / norm**wudi_p
    if estimator == "given":
        raise InputError("estimator='given' has no estimate: pass the covariances (Sigma=...) to ace_matrix")
    raise InputError(f"estimator={estimator!r} is not one of {list(ESTIMATORS)}")


@dataclass
class NormalizedCovariances:
    """Output of :func:`normalize_covariances` (eqs 8-10 of ACE-Merging).

    ``Sigma_tilde[t]`` is Σ̃_t (= Sigma_hat_t / tr_t when ``normalized``, else Sigma_hat_t);
    the regularised covariance is Sigma_reg,t = Σ̃_t + ridge[t] · I, kept in this factored
    form so that T d_in × d_in matrices are stored once, not twice.
    """

    Sigma_tilde: list[Tensor]
    ridge: Tensor  # (T,) eps / tr_t when normalized, else eps
    traces: Tensor  # (T,) tr_t = Tr(Sigma_hat_t) + 1e-12
    normalized: bool

    @property
    def Sigma_reg(self) -> list[Tensor]:
        """The list of Sigma_reg,t = Σ̃_t + ridge_t I (materialised on request)."""
        return [S + r * _eye_like(S) for S, r in zip(self.Sigma_tilde, self.ridge)]

    def sum_reg(self) -> Tensor:
        """sum_t Sigma_reg,t."""
        S = _sum(self.Sigma_tilde)
        S.diagonal().add_(self.ridge.sum())
        return S

    def mean_reg(self) -> Tensor:
        """Σ̄_reg = (1/T) sum_t Sigma_reg,t, including the ridge terms (eq. 15)."""
        return self.sum_reg() / len(self.Sigma_tilde)


def _sum(tensors: Iterable[Tensor]) -> Tensor:
    """Sum in float64, accumulated in place (no T-fold stack or list held in memory)."""
    it = iter(tensors)
    out = next(it).double().clone()
    for t in it:
        out += t
    return out


def _eye_like(S: Tensor) -> Tensor:
    return torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)


def normalize_covariances(
    Sigma_hat: Sequence[Tensor], *, eps: float = 1e-2, normalize: bool = False, eps_mode: str = "absolute"
) -> NormalizedCovariances:
    """Adaptive trace normalisation and Tikhonov regularisation.

    Eqs 8-10; docs/methods.md §ACE, Eqs. (ACE.7)-(ACE.8).

    tr_t = Tr(Sigma_hat_t) + 1e-12. If ``normalize`` (ACE: the layer is flagged
    heterogeneous and ``trace_norm`` is on): Σ̃_t = Sigma_hat_t / tr_t and
    Sigma_reg,t = Σ̃_t + (eps / tr_t) I. Otherwise Σ̃_t = Sigma_hat_t and
    Sigma_reg,t = Sigma_hat_t + eps I (eps absolute, so it interacts with the layer's scale).

    ``eps_mode="relative"`` (an option that is not the paper's): the ridge is eps times the
    mean eigenvalue of Σ̃_t, eps·tr(Σ̃_t)/d_in — eps·tr_t/d_in on unnormalised layers and
    eps/d_in on normalised ones — so it has the units of the covariance and one eps means the
    same in every layer and every model.
    """
    if len(Sigma_hat) == 0:
        raise InputError("normalize_covariances needs at least one covariance")
    if eps < 0 or not math.isfinite(eps):
        raise InputError(f"eps={eps!r} must be a finite number >= 0")
    if eps_mode not in EPS_MODES:
        raise InputError(f"eps_mode={eps_mode!r} must be one of {EPS_MODES}")
    S64 = [S.double() for S in Sigma_hat]
    traces = torch.stack([torch.diagonal(S).sum() for S in S64]) + _TRACE_FLOOR
    d_in = S64[0].shape[-1]
    Sigma_tilde = [S / tr for S, tr in zip(S64, traces)] if normalize else S64
    ridge = torch.tensor([ridge_of(float(tr), eps=eps, normalize=normalize, eps_mode=eps_mode, d_in=d_in)
                          for tr in traces], dtype=torch.float64, device=S64[0].device)
    return NormalizedCovariances(Sigma_tilde, ridge, traces, bool(normalize))


def ridge_of(trace: float, *, eps: float, normalize: bool, eps_mode: str = "absolute", d_in: int = 1) -> float:
    """The ridge r_t of Sigma_reg,t = Σ̃_t + r_t I (eqs 9-10): eps / tr_t on a normalised
    layer, eps otherwise; ``trace`` is tr_t = Tr(Sigma_hat_t) + 1e-12. ``eps_mode="relative"``
    (not the paper's): eps times the mean eigenvalue of Σ̃_t, eps·tr(Σ̃_t)/d_in, i.e. eps / d_in
    on a normalised layer and eps·tr_t / d_in otherwise."""
    if eps_mode == "relative":
        return eps * (1.0 if normalize else trace) / d_in
    return eps / trace if normalize else eps


def structural_prior(Sigma_tilde: Sequence[Tensor], *, energy: float | None = None) -> Tensor:
    """The collective structural prior C_agg = 1 cᵀ (eqs 11-13 of ACE-Merging; docs/methods.md §ACE, Eq. (ACE.9)).

    c = (1/d_in) 1ᵀ sum_t Σ̃_t, the column means of the summed *unregularised* Σ̃_t; every row
    of C_agg equals c, so C_agg is not symmetric. If ``energy`` is given (ACE passes the mean
    uncentred energy (1/T) sum_t ||ΔW_t||_F² on flagged layers) C_agg is divided by
    ``energy + 1e-12``.
    """
    if len(Sigma_tilde) == 0:
        raise InputError("structural_prior needs at least one covariance")
    S = _sum(Sigma_tilde)
    c = prior_vector(S, energy=energy)
    return c.unsqueeze(0).expand(S.shape[0], -1).clone()


def prior_vector(Sigma_tilde_sum: Tensor, *, energy: float | None = None) -> Tensor:
    """c of C_agg = 1 cᵀ (eqs 11-13): the column means of sum_t Σ̃_t, divided by
    ``energy + 1e-12`` when ``energy`` (the mean uncentred energy, flagged layers) is given."""
    c = Sigma_tilde_sum.mean(dim=0)
    return c if energy is None else c / (float(energy) + _ENERGY_FLOOR)


def closed_form(
    numerators: Sequence[Tensor],
    Sigma_reg: NormalizedCovariances | Sequence[Tensor],
    C_agg: Tensor | None = None,
    *,
    name: str = "",
) -> Tensor:
    """W_bar_pre = (sum_t N_t Sigma_reg,t)(sum_t Sigma_reg,t + C_agg)^-1 (eq. 14 of ACE-Merging).

    ``numerators`` are the N_t: the row-centred W̃_t in ACE (docs/methods.md §ACE, Eq. (ACE.10): the official code
    and eq. 14 use W̃_t, so every column of the result sums to zero) or the raw ΔW_t.
    ``Sigma_reg`` is a :class:`NormalizedCovariances` or a list of Sigma_reg,t matrices.
    Solved in float64 with :func:`acetools.merging._linalg.solve_right`; if the system is
    singular or ill-conditioned (estimated rcond below ``RCOND_MIN``, docs/methods.md §Numerics) it
    falls back to the pseudo-inverse with a ``RuntimeWarning`` naming ``name`` (with eps > 0 the
    system is positive definite, docs/methods.md §ACE). Returns float64.
    """
    T = len(numerators)
    if T == 0:
        raise InputError(f"closed_form for layer {name!r} needs at least one task")
    nums = [N.double() for N in numerators]
    if isinstance(Sigma_reg, NormalizedCovariances):
        tildes = Sigma_reg.Sigma_tilde
        if len(tildes) != T:
            raise InputError(f"layer {name!r}: {T} numerators but {len(tildes)} covariances")
        _check_inner(nums, tildes, name)
        B = _sum(N @ S + r * N for N, S, r in zip(nums, tildes, Sigma_reg.ridge))
        A = Sigma_reg.sum_reg()
    else:
        regs = [R.double() for R in Sigma_reg]
        if len(regs) != T:
            raise InputError(f"layer {name!r}: {T} numerators but {len(regs)} covariances")
        _check_inner(nums, regs, name)
        B = _sum(N @ R for N, R in zip(nums, regs))
        A = _sum(regs)
    if C_agg is not None:
        if C_agg.shape != A.shape:
            raise InputError(f"layer {name!r}: C_agg has shape {tuple(C_agg.shape)}, expected {tuple(A.shape)}")
        A = A + C_agg.double()
    return solve_right(B, A, name=name)


def _check_inner(nums: list[Tensor], covs: Sequence[Tensor], name: str) -> None:
    for t, (N, S) in enumerate(zip(nums, covs)):
        if N.ndim != 2 or S.shape != (N.shape[1], N.shape[1]):
            raise InputError(
                f"layer {name!r}, task {t}: covariance has shape {tuple(S.shape)} but the task vector "
                f"is {tuple(N.shape)}; it must be d_in x d_in = {N.shape[-1]} x {N.shape[-1]}"
            )


class Refinement(NamedTuple):
    """Output of :func:`spectral_refine`: the refined matrix and the SVD it came from."""

    W: Tensor  # W_bar = W_bar_pre + sigma_iso U_k V_kᵀ (or W_bar_pre when k = 0)
    k: int  # refined rank floor(k_frac · r)
    sigma_iso: float  # mean of the top-k singular values of W_fused (NaN when k = 0)
    S_fused: Tensor  # all singular values of W_fused = W_bar_pre + Δ_res
    U: Tensor  # left singular vectors of W_fused (d_out x r)
    Vh: Tensor  # right singular vectors, transposed (r x d_in)

    def at_rank(self, W_pre: Tensor, k: int) -> Tensor:
        """W_pre + sigma_iso(k) U_k V_kᵀ with sigma_iso(k) = mean(S_fused[:k]): the refinement
        at another rank (k = 0: W_pre), for a lesson's rank slider."""
        if k == 0:
            return W_pre.clone()
        return isotropic_update(W_pre, self.U[:, :k] @ self.Vh[:k, :], self.S_fused[:k].mean())


def refined_rank(k_frac: float, shape: Sequence[int], name: str = "", *, stacklevel: int = 3) -> int:
    """k = floor(k_frac · min(d_out, d_in)) (eq. 18); k = 0 warns (a ``RuntimeWarning`` naming
    the layer: the official code would return NaN there, here the layer stays unrefined)."""
    k = int(k_frac * min(shape))
    if k == 0:
        warnings.warn(
            f"spectral refinement skipped for layer {name!r}: k = floor({k_frac} * {min(shape)}) = 0 "
            "(the official code would return NaN here); raise k_frac or accept the unrefined layer",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
    return k


def refinement_residual(weighted_sum: Tensor, task_sum: Tensor, Sigma_reg_sum: Tensor, n_tasks: int) -> Tensor:
    """Δ_res = sum_t ΔW_t Σ̃_t - (sum_t ΔW_t) Σ̄_reg with Σ̄_reg = (1/T) sum_t Sigma_reg,t (eq. 16),
    from the sums; ``weighted_sum`` (sum_t ΔW_t Σ̃_t) is overwritten with the result."""
    return weighted_sum.addmm_(task_sum, Sigma_reg_sum, alpha=-1.0 / n_tasks)


def isotropic_update(W_pre: Tensor, UV_k: Tensor, sigma_iso: Tensor | float) -> Tensor:
    """W_bar = W_bar_pre + sigma_iso U_k V_kᵀ (eq. 19); ``UV_k`` (U_k V_kᵀ) is overwritten."""
    return UV_k.mul_(sigma_iso).add_(W_pre)


def spectral_refine(
    W_pre: Tensor,
    delta_W: Sequence[Tensor],
    Sigma_tilde: Sequence[Tensor],
    Sigma_reg_mean: Tensor,
    *,
    k_frac: float = 0.3,
    name: str = "",
) -> Refinement:
    """Spectral refinement (eqs 15-19 of ACE-Merging; docs/methods.md §ACE, Eqs. (ACE.11)-(ACE.13)).

    Δ_res = sum_t ΔW_t (Σ̃_t - Σ̄_reg) with the *uncentred* ΔW_t, the unregularised Σ̃_t and
    Σ̄_reg = mean_t Sigma_reg,t (ridge included); W_fused = W_bar_pre + Δ_res = U S Vᵀ;
    k = floor(k_frac · min(d_out, d_in)); sigma_iso = mean(S[:k]);
    W_bar = W_bar_pre + sigma_iso U[:, :k] V[:, :k]ᵀ. The refinement is *added* to W_bar_pre:
    Δ_res only chooses the directions. When k = 0 the official code returns NaN; here the
    layer is left unrefined with a ``RuntimeWarning`` naming ``name`` (docs/methods.md §ACE, Eq. (ACE.13)).
    """
    if not 0.0 <= k_frac <= 1.0:
        raise InputError(f"k_frac={k_frac!r} must be in [0, 1]")
    Wp = W_pre.double()
    dWs = [d.double() for d in delta_W]
    if len(dWs) != len(Sigma_tilde):
        raise InputError(f"layer {name!r}: {len(dWs)} task vectors but {len(Sigma_tilde)} covariances")
    res = _sum(d @ S.double() for d, S in zip(dWs, Sigma_tilde)) - _sum(dWs) @ Sigma_reg_mean.double()
    U, S, Vh = thin_svd(Wp + res)
    k = refined_rank(k_frac, Wp.shape, name)
    if k == 0:
        return Refinement(Wp, 0, math.nan, S, U, Vh)
    sigma_iso = S[:k].mean()
    W = Wp + sigma_iso * (U[:, :k] @ Vh[:k, :])
    return Refinement(W, k, float(sigma_iso), S, U, Vh)


# --------------------------------------------------------------------------- one matrix


@dataclass
class ACEDiagnostics:
    """What :func:`ace_matrix` saw and decided for one matrix, for notebooks.

    Scalars are always filled; the spectra and the condition number only with
    ``spectra=True`` (they cost extra SVDs). ``to_row()`` gives a flat dict for a DataFrame.
    """

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
    cond: float | None = None  # 2-norm condition number of sum_t Sigma_reg,t + C_agg
    spectrum_pre: Tensor | None = field(default=None, repr=False)  # singular values of W_bar_pre
    spectrum_fused: Tensor | None = field(default=None, repr=False)  # of W_bar_pre + Δ_res (refined only)
    spectrum: Tensor | None = field(default=None, repr=False)  # of the final W_bar

    def to_row(self) -> dict[str, Any]:
        """Scalars only (name, shape, gamma, flag, k, ...) plus mean/min/max energy: a DataFrame row."""
        row = {f.name: getattr(self, f.name) for f in fields(self)
               if not isinstance(getattr(self, f.name), (list, Tensor)) and getattr(self, f.name) is not None}
        e = self.energies
        row.update(energy_mean=sum(e) / len(e), energy_min=min(e), energy_max=max(e))
        return row


def _ace_param(name: str, value: Any) -> None:
    METHODS["ace"].params[name].validate("ace", name, value)


PRECISIONS = ("float64", "float32")
#: ``eps_mode``: "absolute" (the paper's eps I, eps/tr_t I on normalised layers) or "relative"
#: (not the paper's: eps times the mean eigenvalue of each task's covariance, eps·tr(Σ̃_t)/d_in).
EPS_MODES = ("absolute", "relative")
#: ``gamma_mode``: "paper" (eq. 7) or "cv" (scale-invariant, not the paper's; :func:`_gamma`).
GAMMA_MODES = ("paper", "cv")


class _Moments(NamedTuple):
    """What one pass over the T task vectors of a layer accumulates (see :func:`_stream_moments`)."""

    S: Tensor  # sum_t Σ̃_t (d_in × d_in, unregularised)
    B: Tensor  # sum_t N_t Sigma_reg,t, the numerator of eq. 14 (d_out × d_in)
    ridge: Tensor  # (T,) eps / tr_t or eps
    traces: Tensor  # (T,) tr_t = Tr(Sigma_hat_t) + 1e-12
    res_part: Tensor | None  # sum_t ΔW_t Σ̃_t (for the refinement), or None
    task_sum: Tensor | None  # sum_t ΔW_t, or None


class _Accumulators:
    """The running sums of :func:`_stream_moments` for one layer, in the working ``dtype``.

    ``S`` = sum_t Σ̃_t, ``B_sig`` = sum_t N_t Σ̃_t, ``R_num`` = sum_t r_t N_t (apart from
    ``B_sig`` only when the refinement needs the unregularised numerator), ``v`` = sum_t Σ̃_t μ_t
    (the refinement's rank-one correction with the centred numerator), ``task_sum`` = sum_t ΔW_t.
    """

    def __init__(self, shape: Sequence[int], n_tasks: int, *, dtype: torch.dtype, device: torch.device,
                 centered: bool, for_refine: bool, estimator: str):
        d_out, d_in = shape
        z = functools.partial(torch.zeros, dtype=dtype, device=device)
        self.S, self.B_sig = z(d_in, d_in), z(d_out, d_in)
        self.R_num = z(d_out, d_in) if for_refine else self.B_sig
        self.v = z(d_in) if for_refine and centered else None
        self.raw_sig = self.B_sig if for_refine and not centered else None  # N_t = ΔW_t: sum_t ΔW_t Σ̃_t is B_sig
        self.task_sum = z(d_out, d_in) if for_refine else None
        self.traces = torch.empty(n_tasks, dtype=torch.float64, device=device)
        self.ridge = torch.empty(n_tasks, dtype=torch.float64, device=device)
        self.rows_first = 2 * d_out < d_in  # the association rule of _stream_moments
        # two reused d_out x d_in buffers for ΔW_t (working dtype) and W̃_t: fresh temporaries of this size
        # per task cost page faults comparable to their arithmetic
        self.d_buf = torch.empty(d_out, d_in, dtype=dtype, device=device)
        self.c_buf = torch.empty_like(self.d_buf) if centered or estimator == "ace" else None

    def add_gram(self, F: Tensor, N: Tensor, mu: Tensor, s: float) -> None:
        """Σ̃_t = s Fᵀ F (the "ace" and "wudi" estimators): S, B_sig and v, cheapest association first."""
        d_out, d_in = F.shape
        if self.rows_first:
            syrk_lower_(self.S, F, alpha=s)
            # N Fᵀ is d_out x d_out; for the centred numerator (N = F) it is a symmetric Gram
            H = symmetrize_lower_(syrk_lower_(F.new_zeros(d_out, d_out), F.mT)) if N is F else N @ F.mT
            self.B_sig.addmm_(H, F, alpha=s)
            del H
            if self.v is not None:
                self.v.add_((F @ mu) @ F, alpha=s)
        else:
            G = symmetrize_lower_(syrk_lower_(F.new_zeros(d_in, d_in), F))
            self.S.add_(G, alpha=s)
            self.B_sig.addmm_(N, G, alpha=s)
            if self.v is not None:
                self.v.add_(G @ mu, alpha=s)
            del G

    def add_dense(self, Sg: Tensor | None, N: Tensor, mu: Tensor, s: float) -> None:
        """Σ̃_t = s Sg (a given covariance) or s I (``Sg`` None, the "identity" estimator)."""
        if Sg is None:
            self.S.diagonal().add_(s)
            self.B_sig.add_(N, alpha=s)
            if self.v is not None:
                self.v.add_(mu, alpha=s)
            return
        self.S.add_(Sg, alpha=s)
        self.B_sig.addmm_(N, Sg, alpha=s)
        if self.v is not None:
            self.v.add_(mu @ Sg, alpha=s)

    def finish(self, estimator: str, for_refine: bool) -> _Moments:
        if estimator in ("ace", "wudi") and self.rows_first:
            symmetrize_lower_(self.S)
        res_part = None
        if for_refine:  # v broadcasts over the rows: + 1 vᵀ
            if self.raw_sig is not None:
                res_part = self.raw_sig.clone()
            else:
                assert self.v is not None, "for_refine with the centred numerator keeps v"
                res_part = self.B_sig + self.v
        B = self.B_sig.add_(self.R_num) if self.R_num is not self.B_sig else self.B_sig
        return _Moments(self.S, B, self.ridge, self.traces, res_part, self.task_sum)


def _gram_factor(d: Tensor, N: Tensor, mu: Tensor, centered: bool, estimator: str, wudi_p: float,
                 c_buf: Tensor | None) -> tuple[Tensor, float]:
    """``(F, q)`` with Sigma_hat_t = q Fᵀ F: F = W̃_t, q = 1 ("ace", eqs 5-6) or F = ΔW_t,
    q = 1 / ||ΔW_t||_F^p ("wudi"), as in :func:`estimate_covariance`."""
    if estimator == "ace":
        return (N if centered else torch.sub(d, mu, out=c_buf)), 1.0
    norm = float(torch.linalg.matrix_norm(d.double()))
    return d, (0.0 if norm == 0 else 1.0 / norm**wudi_p)


def _stream_moments(
    dWs: Sequence[Tensor],
    estimator: str,
    *,
    normalize: bool,
    centered: bool,
    eps: float,
    Sigma: Sequence[Tensor] | None,
    wudi_p: float,
    dtype: torch.dtype,
    for_refine: bool,
    eps_mode: str = "absolute",
) -> _Moments:
    """One pass over the task vectors, holding O(1) matrices in T (docs/methods.md §ACE).

    Every quantity of eqs 8-17 that touches all tasks is a sum over t, and the trace tr_t of
    task t needs only ΔW_t (tr_t = ||W̃_t||_F² + 1e-12 for the "ace" estimator), so each
    task's covariance is made, used and dropped in turn (:class:`_Accumulators`), with the
    stages' own rules for the trace normalisation and the ridge (:func:`ridge_of`): the
    accumulators are S = sum_t Σ̃_t, B = sum_t N_t (Σ̃_t + r_t I) and, for the refinement
    (eq. 16), sum_t ΔW_t Σ̃_t and sum_t ΔW_t.

    Cheapest association. For the Gram estimators (Σ_hat_t = q F_tᵀ F_t with F_t = W̃_t for
    "ace", ΔW_t for "wudi") the numerator N Σ_hat_t is formed as q (N F_tᵀ) F_t, the
    d_out × d_out association (2 d_out² d_in flops), when that beats multiplying by the
    d_in × d_in Gram that S needs anyway (d_out d_in² more flops), i.e. when 2 d_out < d_in
    (CLIP's mlp.c_proj: 4× fewer flops for this product).

    Numerator reuse. With the centred numerator, ΔW_t = W̃_t + 1 μ_tᵀ, so
    ΔW_t Σ̃_t = W̃_t Σ̃_t + 1 (Σ̃_t μ_t)ᵀ: the refinement's sum_t ΔW_t Σ̃_t is the numerator
    minus its ridge part plus a rank-one term, and costs O(d_out d_in) per task instead of
    a second d_out × d_in × d_in product.
    """
    d_in = dWs[0].shape[1]
    acc = _Accumulators(dWs[0].shape, len(dWs), dtype=dtype, device=dWs[0].device, centered=centered,
                        for_refine=for_refine, estimator=estimator)
    for t, dW in enumerate(dWs):
        d = acc.d_buf.copy_(dW)
        mu = d.mean(dim=0)
        N = torch.sub(d, mu, out=acc.c_buf) if centered else d
        if acc.task_sum is not None:
            acc.task_sum += d
        if estimator in ("ace", "wudi"):
            F, q = _gram_factor(d, N, mu, centered, estimator, wudi_p, acc.c_buf)
            tr = q * _sq_norm(F) + _TRACE_FLOOR
            acc.add_gram(F, N, mu, q / tr if normalize else q)
        elif estimator == "identity":
            tr = d_in + _TRACE_FLOOR
            acc.add_dense(None, N, mu, 1.0 / tr if normalize else 1.0)
        else:  # "given"
            assert Sigma is not None, "estimator='given' comes with Sigma (_given_covariances)"
            tr = float(torch.diagonal(Sigma[t].double()).sum()) + _TRACE_FLOOR
            acc.add_dense(Sigma[t].to(d.device, dtype), N, mu, 1.0 / tr if normalize else 1.0)
        r = ridge_of(tr, eps=eps, normalize=normalize, eps_mode=eps_mode, d_in=d_in)
        acc.R_num.add_(N, alpha=r)
        acc.traces[t], acc.ridge[t] = tr, r
        del d, N
    return acc.finish(estimator, for_refine)


def _sq_norm(F: Tensor) -> float:
    """||F||_F² accumulated in float64 (a BLAS dot product; float32 ``F`` is converted first)."""
    x = (F if F.dtype == torch.float64 else F.double()).reshape(-1)
    return float(torch.dot(x, x))


def _top_k_isotropic(W_fused: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``(U_k V_kᵀ, S_k)`` of ``W_fused = U S Vᵀ`` for the refinement (eq. 18), in float64.

    Through the top-k eigenpairs of the Gram of the smaller side
    (:func:`acetools.merging._linalg.gram_top_svd`) where sigma_1 / sigma_k allows it, else
    the thin SVD. ``S_k`` holds the top k singular values.
    """
    top = gram_top_svd(W_fused, k)
    if top is None:
        U, S, Vh = thin_svd(W_fused.double())
        return U[:, :k] @ Vh[:k, :], S[:k]
    U_k, S_k, Vh_k = top
    return U_k @ Vh_k, S_k


@registered_defaults("ace")
def ace_matrix(
    delta_W: Sequence[Tensor],
    *,
    tau: float,
    eps: float,
    k_frac: float,
    gate: str | None,
    trace_norm: bool,
    prior: bool | None,
    refine: bool,
    numerator: str | None,
    estimator: str,
    Sigma: Sequence[Tensor] | None = None,
    wudi_p: float,
    precision: str,
    name: str = "",
    spectra: bool = False,
    eps_mode: str,
    gamma_mode: str,
) -> tuple[Tensor, ACEDiagnostics]:
    """ACE-Merging for one matrix: the composition of the stages (docs/methods.md §ACE).

    ``delta_W`` are the T task vectors ΔW_t (d_out × d_in) of one layer. Returns the merged
    task vector W_bar (before ``scaling``; input dtype) and an :class:`ACEDiagnostics`.

    1. gamma = :func:`heterogeneity`; flag = gamma > ``tau`` (gate "auto"), True ("on") or
       False ("off").
    2. Sigma_hat_t as in :func:`estimate_covariance` (``estimator``), or ``Sigma`` for "given".
    3. Trace normalisation and ridge as in :func:`normalize_covariances` with
       ``normalize = flag and trace_norm``.
    4. C_agg as in :func:`structural_prior` (if ``prior``), divided by the mean energy when
       the layer is flagged (the prior's scaling is tied to the flag, so it does not follow
       ``trace_norm``).
    5. W_bar_pre as in :func:`closed_form` with N_t = W̃_t (``numerator="centered"``) or ΔW_t.
    6. If flag and ``refine``: W_bar as in :func:`spectral_refine`.

    The composition is streamed: stages 2-3 run task by task into sums (:func:`_stream_moments`:
    each Sigma_hat_t is formed, accumulated and dropped, with the stages' trace and ridge rule
    :func:`ridge_of`, the cheapest matrix association per shape, the refinement's residual from
    the numerator); stage 1 is :func:`gate_flag`, stage 4 :func:`prior_vector`, stage 6
    :func:`refined_rank`, :func:`refinement_residual` and :func:`isotropic_update`, as in the
    stage functions; eq. 14 is one symmetric solve, Cholesky with Sherman–Morrison for the rank-one prior
    (eq. 14; LU, then the pseudo-inverse, only if the Cholesky fails), and the refinement's
    top-k through a float64 Gram eigendecomposition where sigma_1/sigma_k allows it. Memory:
    O(d_in² + d_out d_in) per layer, independent of T. The result equals the stage-by-stage
    composition to float64 round-off (``tests/test_ace.py``).

    ``precision``: "float64" (default) or "float32" for the accumulation and the solve (the
    refinement's small Gram eigendecomposition stays float64). float32 halves the time; its
    error against float64 depends on the conditioning of sum_t Sigma_reg,t + C_agg
    (measured in ``docs/performance.md``).

    ``gate``, ``prior`` and ``numerator`` default to the estimator's preset
    (:func:`estimator_preset`; for "ace": "auto", True, "centered" — the paper's method).
    The hyperparameters default to ``METHODS["ace"]``'s (written once, in the registration;
    tau = 0.3, eps = 1e-2, k_frac = 0.3 are the official code's, the paper's ViT eps is
    reported as 1e-5).

    Two options that are not the paper's: ``eps_mode="relative"`` makes the ridge eps times
    each task's mean covariance eigenvalue (:func:`normalize_covariances`, :func:`ridge_of`), and
    ``gamma_mode="cv"`` gates on the scale-invariant squared coefficient of variation of the
    energies instead of eq. 7 (:func:`heterogeneity`).
    """
    _check_ace_params(tau=tau, eps=eps, k_frac=k_frac, wudi_p=wudi_p, trace_norm=trace_norm, refine=refine,
                      estimator=estimator, precision=precision, eps_mode=eps_mode, gamma_mode=gamma_mode)
    sw = estimator_preset(estimator, gate=gate, prior=prior, numerator=numerator)
    dWs = _as_matrices(delta_W, name)
    energies = task_energies(dWs)  # stage 1: energies, gamma, the gate
    gamma = _gamma(energies, gamma_mode)
    flag = gate_flag(gamma, tau, sw.gate)
    Sigma = _given_covariances(Sigma, estimator, dWs, name)
    normalize, want_refine = bool(flag and trace_norm), bool(flag and refine)
    # stages 2-3 (Sigma_hat_t, normalisation, ridge) streamed task by task into sums
    stream = functools.partial(_stream_moments, dWs, estimator, normalize=normalize,
                               centered=sw.numerator == "centered", eps=eps, Sigma=Sigma, wudi_p=wudi_p,
                               eps_mode=eps_mode)
    mom = stream(dtype=torch.float64 if precision == "float64" else torch.float32, for_refine=want_refine)
    # stage 4: C_agg = 1 cᵀ, divided by the mean energy on flagged layers
    c = prior_vector(mom.S, energy=float(energies.mean()) if flag else None) if sw.prior else None
    symmetric = Sigma is None or all(torch.allclose(Sg, Sg.mT, rtol=1e-12, atol=0) for Sg in Sigma)
    W_pre, res, A_dense, mom = _solve_moments(mom, c, len(dWs), stream, symmetric=symmetric,  # stage 5
                                              want_refine=want_refine, spectra=spectra, name=name)
    diag = ACEDiagnostics(
        name=name, shape=(dWs[0].shape[0], dWs[0].shape[1]), n_tasks=len(dWs), estimator=estimator, gate=sw.gate,
        gamma=gamma, flag=flag, normalized=normalize, prior=sw.prior,
        numerator=sw.numerator, refined=False, energies=energies.tolist(),
        traces=mom.traces.tolist(), ridge=mom.ridge.tolist(),
    )
    W = _refine_streamed(W_pre, res, k_frac, diag, spectra=spectra, name=name) if res is not None else W_pre  # stage 6
    if A_dense is not None:  # spectra=True
        _record_spectra(diag, A_dense, W_pre, W)
    return W.to(delta_W[0].dtype), diag


def _check_ace_params(**values: Any) -> None:
    for pname, val in values.items():
        _ace_param(pname, val)


def _given_covariances(Sigma: Sequence[Tensor] | None, estimator: str, dWs: list[Tensor],
                       name: str) -> list[Tensor] | None:
    """``Sigma`` checked for ``estimator="given"`` (float64 on the task vectors' device); an
    error when it is missing there or given with another estimator."""
    if estimator == "given":
        if Sigma is None:
            raise InputError(
                f"layer {name!r}: estimator='given' needs Sigma=[Sigma_1, ..., Sigma_T] (d_in x d_in each)"
            )
        return _check_given(Sigma, dWs, name)
    if Sigma is not None:
        raise InputError(f"layer {name!r}: Sigma is only used with estimator='given' (got estimator={estimator!r})")
    return None


def _solve_moments(mom: _Moments, c: Tensor | None, T: int, restream: Callable[..., _Moments], *, symmetric: bool,
                   want_refine: bool, spectra: bool, name: str):
    """Eq. 14 from the streamed sums: ``(W_pre, Δ_res or None, dense system or None, moments)``.

    M = sum_t Sigma_reg,t is formed in place of S; Δ_res (:func:`refinement_residual`) is
    taken from it before the solve overwrites it. Cholesky with Sherman–Morrison for the
    rank-one prior; where that fails (eps = 0 and singular, or a non-symmetric given
    covariance) the moments are streamed again in float64 for the LU route
    (:func:`acetools.merging._linalg.solve_right`, as :func:`closed_form`).
    """
    M = mom.S
    M.diagonal().add_(float(mom.ridge.sum()))  # S is now M = sum_t Sigma_reg,t
    res = None
    if want_refine:
        assert mom.res_part is not None and mom.task_sum is not None, "moments streamed with for_refine=True"
        res = refinement_residual(mom.res_part, mom.task_sum, M, T)
    A_dense = None
    if spectra:
        A_dense = M.to(torch.float64, copy=True) + (c.double().unsqueeze(0) if c is not None else 0.0)
    W_pre = solve_spd_rank_one(mom.B, M, c, overwrite=True) if symmetric else None
    if W_pre is None:  # LU route
        mom = restream(dtype=torch.float64, for_refine=False)
        A = mom.S
        A.diagonal().add_(float(mom.ridge.sum()))
        if c is not None:
            A += c.double().unsqueeze(0)
        W_pre = solve_right(mom.B, A, name=name)
    return W_pre.double(), res, A_dense, mom


def _refine_streamed(W_pre: Tensor, res: Tensor, k_frac: float, diag: ACEDiagnostics, *, spectra: bool,
                     name: str) -> Tensor:
    """Stage 6 as :func:`spectral_refine`, from Δ_res (overwritten by W_fused = W_pre + Δ_res)
    with the top-k pairs only (:func:`_top_k_isotropic`); fills ``diag``'s k, sigma_iso, refined."""
    W_fused = res.add_(W_pre) if res.dtype == torch.float64 else W_pre + res.double()
    k = refined_rank(k_frac, W_pre.shape, name, stacklevel=5)
    W = W_pre
    if k > 0:
        UV, S_top = _top_k_isotropic(W_fused, k)
        sigma_iso = S_top[:k].mean()
        W = isotropic_update(W_pre, UV, sigma_iso)
        diag.k, diag.sigma_iso, diag.refined = k, float(sigma_iso), True
    if spectra:  # all singular values of W_fused (the top-k route computes only k)
        diag.spectrum_fused = torch.linalg.svdvals(W_fused).cpu()
    return W


def _record_spectra(diag: ACEDiagnostics, A_dense: Tensor, W_pre: Tensor, W: Tensor) -> None:
    """``spectra=True``: the condition number of the system and the spectra of W_pre and W."""
    sA = torch.linalg.svdvals(A_dense)
    diag.cond = float(sA[0] / sA[-1]) if sA[-1] > 0 else math.inf
    diag.spectrum_pre = torch.linalg.svdvals(W_pre).cpu()
    diag.spectrum = torch.linalg.svdvals(W).cpu()


def _as_matrices(delta_W: Sequence[Tensor], name: str) -> list[Tensor]:
    if isinstance(delta_W, Tensor) or len(delta_W) == 0:
        raise InputError(f"layer {name!r}: pass a non-empty list of task vectors (one d_out x d_in tensor per task)")
    shape = delta_W[0].shape
    for t, d in enumerate(delta_W):
        if not isinstance(d, Tensor) or d.ndim != 2:
            raise InputError(
                f"layer {name!r}, task {t}: expected a 2-D tensor, got {getattr(d, 'shape', type(d).__name__)}"
            )
        if d.shape != shape:
            raise InputError(f"layer {name!r}, task {t}: shape {tuple(d.shape)} differs from task 0's {tuple(shape)}")
    return list(delta_W)  # converted one task at a time where used: no T float64 copies


def _check_given(Sigma: Sequence[Tensor], dWs: list[Tensor], name: str) -> list[Tensor]:
    if len(Sigma) != len(dWs):
        raise InputError(
            f"layer {name!r}: {len(Sigma)} covariances for {len(dWs)} task vectors; pass one per task, in order"
        )
    d_in = dWs[0].shape[1]
    out = []
    for t, S in enumerate(Sigma):
        if not isinstance(S, Tensor):
            raise InputTypeError(
                f"covariance of task {t} for layer {name!r} is a {type(S).__name__}, not a torch.Tensor")
        if S.shape != (d_in, d_in):
            raise InputError(
                f"covariance of task {t} for layer {name!r} has shape {tuple(S.shape)}; "
                f"it must be d_in x d_in = {d_in} x {d_in} (the layer's input dimension)"
            )
        if not torch.isfinite(S).all():
            raise InputError(f"covariance of task {t} for layer {name!r} contains NaN or Inf")
        check_psd(S, f"covariance of task {t} (expert {t}) for layer {name!r}")
        out.append(S.to(dWs[0].device, torch.float64))
    return out


# --------------------------------------------------------------------------- state dicts


@effective_hparams("ace")
def _effective(hp: dict) -> dict:
    """ACE's ``gate`` / ``prior`` / ``numerator`` as :func:`estimator_preset` resolves them."""
    sw = estimator_preset(hp.get("estimator", "ace"), gate=hp.get("gate"), prior=hp.get("prior"),
                          numerator=hp.get("numerator"))
    return {**hp, "gate": sw.gate, "prior": sw.prior, "numerator": sw.numerator}


def _check_covariances_param(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, str):
        return "must be None or a list with one {key: Sigma_t} dict per expert"
    for t, c in enumerate(value):
        if not isinstance(c, Mapping):
            return f"entry {t} is a {type(c).__name__}, not a dict key -> Sigma_t"
    return None


def _check_in_out_keys(value: Any) -> str | None:
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
        return "must be a tuple of key names or fnmatch patterns, e.g. ('visual.proj',)"
    return None


@register(
    "ace",
    "ACE-Merging: closed-form merge with covariances estimated from the task vectors "
    "(Xu et al. 2026; docs/methods.md §ACE)",
    key_scope="key", per_key=("covariances",), needs_layout=True,  # no search: ACE uses scaling 1 (ACE_SCALED)
    tau=Param(0.3, "heterogeneity threshold: the layer is flagged when gamma > tau (eq. 7)", low=0.0),
    eps=Param(1e-2, "Tikhonov strength (eqs 9-10): eps I, or eps/tr_t I on normalised layers", low=0.0),
    k_frac=Param(0.3, "refined rank k = floor(k_frac * min(d_out, d_in)) (eq. 18)", low=0.0, high=1.0),
    scaling=Param(1.0, "s in theta = theta0 + s * W_bar, applied to every key (docs/methods.md §ACE, Eq. (ACE.14))",
                  low=0.0),
    gate=Param(None, "heterogeneity gate: 'auto' (gamma > tau), 'on', 'off'; None = estimator preset",
               choices=(None, "auto", "on", "off")),
    trace_norm=Param(True, "trace-normalise the covariances on flagged layers (eq. 8)", types=(bool,)),
    prior=Param(None, "add the collective structural prior C_agg (eqs 11-13); None = estimator preset",
                types=(bool, type(None))),
    refine=Param(True, "spectral refinement on flagged layers (eqs 15-19)", types=(bool,)),
    numerator=Param(None, "numerator of eq. 14: 'centered' W̃_t or 'raw' ΔW_t; None = estimator preset",
                    choices=(None, "centered", "raw")),
    estimator=Param("ace", "covariance estimator: 'ace' (eqs 5-6), 'identity' (= weight averaging), 'wudi', 'given'",
                    choices=ESTIMATORS),
    covariances=Param(None, "for estimator='given': one {key: Sigma_t (d_in x d_in)} dict per expert",
                      check=_check_covariances_param),
    precision=Param("float64", "arithmetic of the accumulation and solve: 'float64' (default) "
                    "or 'float32' (about 2x faster; error in docs/performance.md)", choices=PRECISIONS),
    wudi_p=Param(2.0, "norm power p of the 'wudi' estimator Sigma_t = tau_tᵀ tau_t / ||tau_t||_F^p", low=0.0),
    in_out_keys=Param((), "deprecated alias for a layout: matrices stored in x out (x @ W), transposed around ACE; "
                      "() = as stored, like the official code (docs/methods.md §ACE)", check=_check_in_out_keys),
    eps_mode=Param("absolute", "the ridge: 'absolute' eps (the paper's) or 'relative' eps·tr(Sigma_tilde_t)/d_in, "
                   "eps times each task's mean covariance eigenvalue (not the paper's; docs/methods.md §ACE)",
                   choices=EPS_MODES),
    gamma_mode=Param("paper", "the gate's heterogeneity: 'paper' (eq. 7) or 'cv', the scale-invariant "
                     "Var_t(e_t)/Mean_t(e_t)^2 (not the paper's; docs/methods.md §ACE)", choices=GAMMA_MODES),
)
def ace(base, task_vectors, *, is_matrix, **hparams):
    """ACE-Merging on a state dict (docs/methods.md §ACE): ``merge("ace", base, experts, ...)``.

    Matrix keys (``is_matrix``) get :func:`ace_matrix`; every other key the mean
    (1/T) sum_t tau_t (docs/methods.md §ACE, Eq. (ACE.14)); all are multiplied by ``scaling``. See
    :func:`ace_with_diagnostics` for the hyperparameters and the per-layer diagnostics.
    """
    update, _ = ace_with_diagnostics(base, task_vectors, is_matrix=is_matrix, **hparams)
    return update


def ace_with_diagnostics(
    base: Mapping[str, Tensor],
    task_vectors: Sequence[Mapping[str, Tensor]],
    *,
    is_matrix: Callable[[str, Tensor], bool] | None = None,
    spectra: bool = False,
    **hparams: Any,
) -> tuple[dict[str, Tensor], dict[str, ACEDiagnostics]]:
    """ACE's merged update for every key of ``base`` and an :class:`ACEDiagnostics` per matrix.

    Hyperparameters (defaults as registered in ``METHODS["ace"]``): ``tau=0.3, eps=1e-2,
    k_frac=0.3, scaling=1.0`` (official code, docs/methods.md §ACE); switches ``gate, trace_norm,
    prior, refine, numerator`` (see :func:`ace_matrix`; ``None`` = the estimator's preset,
    which for ``estimator="ace"`` is the paper's method); ``estimator`` and, for
    ``"given"``, ``covariances``: one dict per expert mapping matrix keys to Sigma_t
    (d_in × d_in of the matrix as ACE sees it). Matrix keys absent from *every* dict get the
    mean, as RegMean does for layers without Gram matrices; a key present for some experts
    only is an error. ``in_out_keys`` (deprecated: pass ``merge(..., layout=...)``, which
    transposes in × out weights for every method): names or fnmatch patterns of matrices
    stored in × out (CLIP ``visual.proj``, GPT-2 ``Conv1D``), transposed by a layout
    (:func:`acetools.merging.in_out_keys_layout`). Default ``()`` keeps every matrix as stored,
    as the official code does (docs/methods.md §ACE). ``is_matrix`` defaults to
    :func:`acetools.merging.is_matrix_param`.
    """
    if is_matrix is None:
        from . import is_matrix_param as is_matrix
    hp = METHODS["ace"].resolve(hparams)
    scaling = hp.pop("scaling")
    covariances = hp.pop("covariances")
    in_out = tuple(hp.pop("in_out_keys"))
    T = len(task_vectors)
    if T == 0:
        raise InputError("ace needs at least one task vector")

    matrix_keys = [k for k in base if is_matrix(k, base[k])]
    lay = Layout("as stored")
    if in_out:  # the deprecated alias for a layout: transposed by one
        from . import in_out_keys_layout

        lay = in_out_keys_layout(in_out, lay, base, is_matrix)
    transposed = {k for k in matrix_keys if lay.orientation(k) == "in_out"}

    given = _check_covariances(covariances, hp["estimator"], base, matrix_keys, transposed, T)
    if hp["estimator"] == "given":
        warn_mean_fallback("ace", [k for k in matrix_keys if k not in given], "no covariances")

    update: dict[str, Tensor] = {}
    diags: dict[str, ACEDiagnostics] = {}
    mset = set(matrix_keys)
    for key in progress(list(base), desc="ace"):
        dtype = task_vectors[0][key].dtype
        if key not in mset or (hp["estimator"] == "given" and key not in given):
            update[key] = scaling * mean_update(list(task_vectors), key)
            continue
        dWs = [lay.to_canonical(key, tv[key]) for tv in task_vectors]
        W, diag = ace_matrix(dWs, Sigma=given.get(key) if given else None, name=key, spectra=spectra, **hp)
        W = scaling * W.double()
        update[key] = lay.from_canonical(key, W).to(dtype).contiguous()
        diags[key] = diag
    return update, diags


def _check_covariances(covariances, estimator, base, matrix_keys, transposed, T) -> dict[str, list[Tensor]]:
    if estimator != "given":
        if covariances is not None:
            raise InputError(f"ace: covariances are only used with estimator='given' (got estimator={estimator!r})")
        return {}
    if covariances is None:
        raise InputError("ace: estimator='given' needs covariances=[{key: Sigma_t}, ...], one dict per expert")
    if len(covariances) != T:
        raise InputError(
            f"ace: covariances has {len(covariances)} entries for {T} experts; "
            "pass one dict per expert, in the same order"
        )
    mset = set(matrix_keys)
    for t, c in enumerate(covariances):
        for k in c:
            if k not in base:
                raise InputKeyError(f"ace: covariances[{t}] has key {k!r} that base does not have")
            if k not in mset:
                raise InputError(
                    f"ace: covariances[{t}][{k!r}] is for a parameter that is not a matrix; "
                    "only matrix keys take Sigma_t"
                )
    out: dict[str, list[Tensor]] = {}
    for k in matrix_keys:
        have = [k in c for c in covariances]
        if not any(have):
            continue
        if not all(have):
            missing = have.index(False)
            raise InputKeyError(
                f"ace: covariances[{missing}] lacks key {k!r} that other experts' covariances have; "
                "give it for every expert or for none"
            )
        d_in = base[k].shape[0] if k in transposed else base[k].shape[1]
        hint = " (this key is in in_out_keys, so d_in is its first dimension)" if k in transposed else ""
        for t, c in enumerate(covariances):
            check_square(c[k], d_in, f"ace: covariances[{t}][{k!r}]", hint)
        out[k] = [c[k] for c in covariances]
    return out
