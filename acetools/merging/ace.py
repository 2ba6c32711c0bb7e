"""ACE-Merging (Xu et al., CVPR 2026; arXiv 2603.02945), stage by stage (docs/methods.md §ACE).

ACE merges each d_out × d_in matrix in closed form,

    W_bar_pre = (sum_t N_t Sigma_reg,t) (sum_t Sigma_reg,t + C_agg)^-1          (eq. 14)

with Sigma_reg,t a regularised estimate of task t's input covariance made from the task vector
ΔW_t alone (Theorem 1). The stages, each a public function (docs/methods.md §ACE equations):
:func:`heterogeneity` and :func:`gate_flag` (ACE.5)-(ACE.6); :func:`estimate_covariance`
(ACE.3)-(ACE.4); :func:`normalize_covariances` (ACE.7)-(ACE.8); :func:`structural_prior` (ACE.9);
:func:`closed_form` (ACE.10); :func:`spectral_refine` (ACE.11)-(ACE.13). :func:`ace_matrix` is
their composition, and what ``merge("ace")`` and ``acetools merge`` run on every matrix.

**The fast path is named.** Given plain lists of tensors (as the lessons call them) every stage computes
each sum as written. ``ace_matrix(..., one_pass=True)`` (what the merges run) asks
``normalize_covariances(..., one_pass=True)`` for :class:`TaskSums`, every sum over the tasks from one pass
(:func:`task_sums`, memory independent of T; docs/performance.md, ACE), and hands them on as ``sums=`` to
:func:`structural_prior`, :func:`closed_form` (:func:`solve_task_sums`) and :func:`spectral_refine`: where a
stage is given ``sums`` it reads them (``if sums is not None:``, beside the equation), else it computes the
equation. tests/test_ace_fast_paths.py holds each fast path equal to its readable one. This module also holds
what only ACE uses: its options and covariance inputs, and the task covariances' one pass.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, overload

import torch
from torch import Tensor

from ..errors import InputError, InputTypeError
from ..utils import format_bytes, progress
from ._registry import METHODS, Param, is_matrix_param, register
from .averaging import mean_update, summed, warn_mean_fallback
from .inputs import check_key_matrices, check_one_per_expert, check_task_vectors
from .linalg import (
    check_square,
    solve_right,
    solve_spd_rank_one,
    symmetrize_lower_,
    syrk_lower_,
    thin_svd,
    top_svd,
)

__all__ = [
    "ESTIMATORS", "EPS_MODES", "GAMMA_MODES", "PRECISIONS", "Switches", "estimator_preset", "preset_switches",
    "center_rows", "TaskCovariance", "dense_covariance", "CenteredRows", "task_energies",
    "heterogeneity", "gate_flag", "estimate_covariance", "NormalizedCovariances",
    "normalize_covariances", "ridge_of", "structural_prior", "closed_form", "Refinement",
    "refined_rank", "isotropic_update", "spectral_refine", "TaskSums", "task_sums", "solve_task_sums",
    "ACEDiagnostics", "ace_matrix", "ace_with_diagnostics", "ace",
]

ESTIMATORS = ("ace", "identity", "wudi", "given")
PRECISIONS = ("float64", "float32")
#: "absolute" (the paper's eps I, eps/tr_t I on normalised layers) or "relative" (not the paper's).
EPS_MODES = ("absolute", "relative")
#: "paper" (eq. 7) or "cv" (scale-invariant, not the paper's; :func:`heterogeneity`).
GAMMA_MODES = ("paper", "cv")

_LOG_FLOOR = 1e-12  # log(e + 1e-12) and mean(l)^2 + 1e-12 in eq. 7 (official code)
_TRACE_FLOOR = 1e-12  # tr_t = Tr(Sigma_hat_t) + 1e-12 (official code)
_ENERGY_FLOOR = 1e-12  # flagged prior divided by mean energy + 1e-12 (docs/methods.md §ACE, Eq. (ACE.9))


# --------------------------------------------------------------------------- options and inputs


class Switches(NamedTuple):
    """The component switches an estimator implies (see :func:`estimator_preset`)."""

    gate: str
    prior: bool
    numerator: str


_PRESETS = {"ace": Switches("auto", True, "centered"), **{e: Switches("off", False, "raw") for e in ESTIMATORS[1:]}}


def estimator_preset(estimator: str = "ace", *, gate: str | None = None, prior: bool | None = None,
                     numerator: str | None = None) -> Switches:
    """The switches used with ``estimator`` (docs/methods.md §ACE): "ace" = ("auto", True, "centered"), the
    others ("off", False, "raw"); explicit values (not ``None``) override the preset. Each value is checked by its
    registered :class:`Param`, as ``merge("ace")`` checks it (so are the other stages' options)."""
    METHODS["ace"].resolve(dict(estimator=estimator, gate=gate, prior=prior, numerator=numerator))
    p = _PRESETS[estimator]
    return Switches(gate=p.gate if gate is None else gate, prior=p.prior if prior is None else prior,
                    numerator=p.numerator if numerator is None else numerator)


def preset_switches(hp: dict) -> dict:
    """ACE's resolved ``hp`` with ``gate`` / ``prior`` / ``numerator`` as :func:`estimator_preset` resolves them."""
    return {**hp, **estimator_preset(hp.get("estimator", "ace"), gate=hp.get("gate"), prior=hp.get("prior"),
                                     numerator=hp.get("numerator"))._asdict()}


def check_prior(C_agg: Tensor | None, d_in: int, name: str) -> Tensor | None:
    """ACE's C_agg, which must be d_in × d_in (or None)."""
    if C_agg is not None and C_agg.shape != (d_in, d_in):
        raise InputError(f"layer {name!r}: C_agg has shape {tuple(C_agg.shape)}, expected {(d_in, d_in)}")
    return C_agg


def given_covariances(Sigma: Sequence[Tensor] | None, estimator: str, dWs: list[Tensor],
                      name: str) -> list[TaskCovariance] | None:
    """ACE's ``Sigma`` of one layer (one per task, :func:`check_square`) as unformed float64 task covariances for
    ``estimator="given"``; ``None`` for the other estimators, which take none."""
    if estimator != "given":
        if Sigma is not None:
            raise InputError(f"layer {name!r}: Sigma is only used with estimator='given' (got estimator={estimator!r})")
        return None
    if Sigma is None:
        raise InputError(f"layer {name!r}: estimator='given' needs Sigma=[Sigma_1, ..., Sigma_T] (d_in x d_in each)")
    check_one_per_expert(Sigma, len(dWs), f"layer {name!r}: Sigma", "d_in x d_in covariance", "covariances")
    for t, S in enumerate(Sigma):
        check_square(S, dWs[0].shape[1], f"covariance of task {t} (expert {t}) for layer {name!r}",
                     " (the layer's input dimension)")
    return [TaskCovariance(d, "given", matrix=S.to(d.device, torch.float64)) for d, S in zip(dWs, Sigma)]


def check_covariances_param(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, str):
        return "must be None or a list with one {key: Sigma_t} dict per expert"
    for t, c in enumerate(value):
        if not isinstance(c, Mapping):
            return f"entry {t} is a {type(c).__name__}, not a dict key -> Sigma_t"
    return None


def check_ace_covariances(covariances: Any, estimator: str, base: Mapping[str, Tensor], matrix_keys: Sequence[str],
                          T: int) -> dict[str, list[Tensor]]:
    """ACE's ``covariances`` (estimator="given": one {key: Sigma_t} dict per expert) checked
    (:func:`check_key_matrices`) and gathered per matrix key; ``{}`` for the other estimators."""
    if estimator != "given":
        if covariances is not None:
            raise InputError(f"ace: covariances are only used with estimator='given' (got estimator={estimator!r})")
        return {}
    if covariances is None:
        raise InputError("ace: estimator='given' needs covariances=[{key: Sigma_t}, ...], one dict per expert")
    return check_key_matrices(covariances, base, T, "ace: covariances", "{key: Sigma_t} dict", "entries", "Sigma_t",
                              set(matrix_keys))


# --------------------------------------------------------------------------- task covariances and their sums


def center_rows(delta_W: Tensor, *, out: Tensor | None = None) -> Tensor:
    """W̃ = ΔW - 1 μᵀ, μ the mean row (docs/methods.md §ACE, Eq. (ACE.3); rows are samples): a new tensor, or
    ``out``. ACE's one centring: :class:`TaskCovariance`, :class:`CenteredRows` and :func:`task_sums` run it."""
    return torch.sub(delta_W, delta_W.mean(dim=0, keepdim=True), out=out)


class TaskCovariance(NamedTuple):
    """Sigma_hat_t of one task kept as the task vector ``delta_W`` (d_out × d_in) it is made of, times
    ``scale`` (docs/methods.md §ACE, Eqs. (ACE.3)-(ACE.4)). ``kind``: "ace" (W̃ᵀ W̃, W̃ the row-centred ΔW),
    "wudi" (ΔWᵀ ΔW / ||ΔW||_F^wudi_p), "identity" or "given" (``matrix``). :meth:`dense` forms it."""

    delta_W: Tensor  # (d_out, d_in)
    kind: str
    wudi_p: float = 2.0
    matrix: Tensor | None = None  # (d_in, d_in), kind "given"
    scale: float = 1.0

    def dense(self) -> Tensor:
        """The d_in × d_in float64 matrix, scale included."""
        d = self.delta_W.double()
        if self.kind == "ace":
            Wc = center_rows(d)
            S = Wc.T @ Wc
        elif self.kind == "wudi":
            norm = torch.linalg.matrix_norm(d)
            S = d.T @ d / norm**self.wudi_p if norm > 0 else d.new_zeros(d.shape[1], d.shape[1])
        elif self.kind == "identity":
            S = torch.eye(d.shape[1], dtype=torch.float64, device=d.device)
        else:
            assert self.matrix is not None, "kind 'given' carries its matrix"
            S = self.matrix.to(d.device, torch.float64)
        return S if self.scale == 1.0 else S * self.scale


def dense_covariance(S: Tensor | TaskCovariance) -> Tensor:
    """A covariance as a float64 matrix (a :class:`TaskCovariance` formed)."""
    return S.dense() if isinstance(S, TaskCovariance) else S.double()


class CenteredRows(Sequence):
    """The row-centred W̃_t = ΔW_t - 1 μ_tᵀ of ``delta_W`` (Eq. (ACE.3)), each formed when indexed: ACE's centred
    numerators (the fast path never forms them: its :class:`TaskSums` hold their sums)."""

    def __init__(self, delta_W: Sequence[Tensor]):
        self.delta_W = list(delta_W)

    def __len__(self) -> int:
        return len(self.delta_W)

    def __getitem__(self, t: Any) -> Any:  # an int index: no slices
        return center_rows(self.delta_W[t])


# --------------------------------------------------------------------------- stage outputs


@dataclass
class NormalizedCovariances:
    """Output of :func:`acetools.merging.ace.normalize_covariances`: Sigma_reg,t = Σ̃_t + ridge[t] I, factored."""

    Sigma_tilde: Sequence[Tensor | TaskCovariance]  # Σ̃_t (d_in, d_in) = Sigma_hat_t / tr_t when normalized
    ridge: Tensor  # (T,) eps / tr_t when normalized, else eps
    traces: Tensor  # (T,) tr_t = Tr(Sigma_hat_t) + 1e-12
    normalized: bool
    sums: TaskSums | None = None  # the fast path's sums over the tasks (normalize_covariances(..., one_pass=True))

    @property
    def Sigma_reg(self) -> list[Tensor]:
        """The list of Sigma_reg,t = Σ̃_t + ridge_t I (materialised on request)."""
        dense = [dense_covariance(S) for S in self.Sigma_tilde]
        return [S + r * torch.eye(S.shape[-1], dtype=S.dtype, device=S.device) for S, r in zip(dense, self.ridge)]

    def sum_reg(self) -> Tensor:
        """sum_t Sigma_reg,t (d_in, d_in), a new tensor (fast path: in the sums' dtype)."""
        if self.sums is not None:  # fast path: sum_t Σ̃_t from the one pass
            S = self.sums.S.clone()
        else:
            S = summed(dense_covariance(S) for S in self.Sigma_tilde)
        S.diagonal().add_(self.ridge.sum())
        return S

    def mean_reg(self) -> Tensor:
        """Σ̄_reg = (1/T) sum_t Sigma_reg,t, including the ridge terms (eq. 15)."""
        return self.sum_reg().div_(len(self.Sigma_tilde))


class Refinement(NamedTuple):
    """Output of ACE's :func:`acetools.merging.ace.spectral_refine`: the refined matrix and the SVD it came from."""

    W: Tensor  # W_bar = W_bar_pre + sigma_iso U_k V_kᵀ (or W_bar_pre when k = 0), (d_out, d_in)
    k: int  # refined rank floor(k_frac · r)
    sigma_iso: float  # mean of the top-k singular values of W_fused (NaN when k = 0)
    S_fused: Tensor  # singular values of W_fused = W_bar_pre + Δ_res (fast path: the top k)
    U: Tensor  # left singular vectors of W_fused (d_out, r) (fast path: (d_out, k))
    Vh: Tensor  # right singular vectors, transposed (r, d_in) (fast path: (k, d_in))
    W_fused: Tensor | None = None  # (d_out, d_in)


def isotropic_update(W_pre: Tensor, UV_k: Tensor, sigma_iso: Tensor | float) -> Tensor:
    """W_bar = W_bar_pre + sigma_iso U_k V_kᵀ (eq. 19); ``UV_k`` (U_k V_kᵀ) is overwritten."""
    return UV_k.mul_(sigma_iso).add_(W_pre)


# --------------------------------------------------------------------------- stages


def task_energies(delta_W: Sequence[Tensor]) -> Tensor:
    """e_t = ||ΔW_t||_F², the *uncentred* energies of eq. 7, as a float64 vector of length T (dot products through
    one reused float64 buffer); the one pass takes Tr(Fᵀ F) = ||F||_F² of a task's factor from it too."""
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
    """The heterogeneity gamma of one layer: Var_t(l_t) / (Mean_t(l_t)² + 1e-12), l_t = log(||ΔW_t||_F² + 1e-12)
    (docs/methods.md §ACE, Eqs. (ACE.5)-(ACE.6)); 0 for T = 1. ``mode="cv"``: Var_t(e_t) / Mean_t(e_t)²."""
    if len(delta_W) == 0:
        raise InputError("heterogeneity needs at least one task vector")
    METHODS["ace"].resolve({"gamma_mode": mode})
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
    ``factored=True``: unformed, a :class:`TaskCovariance` (what the one pass reads)."""
    if delta_W.ndim != 2:
        raise InputError(f"estimate_covariance needs a 2-D task vector, got shape {tuple(delta_W.shape)}")
    if estimator == "given":
        raise InputError("estimator='given' has no estimate: pass the covariances (Sigma=...) to ace_matrix")
    METHODS["ace"].resolve(dict(estimator=estimator, wudi_p=wudi_p))
    cov = TaskCovariance(delta_W, estimator, wudi_p)
    return cov if factored else cov.dense()


def ridge_of(trace: float, *, eps: float, normalize: bool, eps_mode: str = "absolute", d_in: int = 1) -> float:
    """r_t of Sigma_reg,t = Σ̃_t + r_t I (eqs 9-10): eps/tr_t if ``normalize`` else eps; "relative": eps·tr(Σ̃_t)/d_in."""
    if eps_mode == "relative":
        return eps * (1.0 if normalize else trace) / d_in
    return eps / trace if normalize else eps


def normalize_covariances(Sigma_hat: Sequence[Tensor | TaskCovariance], *, eps: float = 1e-2, normalize: bool = False,
                          eps_mode: str = "absolute", precision: str = "float64", numerator: str = "centered",
                          refine: bool = True, one_pass: bool = False) -> NormalizedCovariances:
    """Trace normalisation and Tikhonov regularisation (docs/methods.md §ACE, Eqs. (ACE.7)-(ACE.8)).

    ``normalize``: Σ̃_t = Sigma_hat_t / tr_t, Sigma_reg,t = Σ̃_t + (eps / tr_t) I; else Sigma_hat_t + eps I
    (:func:`ridge_of`). ``one_pass`` (the fast path; needs unformed :class:`TaskCovariance`): the covariances
    stay unformed and one pass over the tasks (:func:`task_sums`, in ``precision``) makes the sums the later
    stages read, ``.sums`` (for ``numerator``; the refinement's too if ``refine``).
    """
    if len(Sigma_hat) == 0:
        raise InputError("normalize_covariances needs at least one covariance")
    METHODS["ace"].resolve(dict(eps=eps, eps_mode=eps_mode, precision=precision, numerator=numerator, refine=refine))
    first = Sigma_hat[0]
    d_in = first.delta_W.shape[1] if isinstance(first, TaskCovariance) else first.shape[-1]

    def rule(trace: float) -> tuple[float, float, float]:  # Tr(Sigma_hat_t) -> (tr_t, scale, ridge)
        tr = trace + _TRACE_FLOOR
        return tr, (1.0 / tr if normalize else 1.0), ridge_of(tr, eps=eps, normalize=normalize, eps_mode=eps_mode,
                                                              d_in=d_in)

    if one_pass:  # fast path: (ACE.7)-(ACE.8) applied inside the one pass, no d_in x d_in matrix per task
        covs = [S for S in Sigma_hat if isinstance(S, TaskCovariance)]
        if len(covs) != len(Sigma_hat):
            raise InputTypeError("normalize_covariances(one_pass=True) needs unformed covariances: "
                                 "estimate_covariance(..., factored=True) for every task")
        sums = task_sums(covs, rule, dtype=torch.float64 if precision == "float64" else torch.float32,
                         centered=numerator == "centered", refine=refine)
        tildes = [c._replace(scale=float(s)) for c, s in zip(covs, sums.scales)]
        return NormalizedCovariances(tildes, sums.ridge, sums.traces, bool(normalize), sums)
    S64 = [dense_covariance(S) for S in Sigma_hat]
    traces = torch.stack([torch.diagonal(S).sum() for S in S64]) + _TRACE_FLOOR
    Sigma_tilde = [S / tr for S, tr in zip(S64, traces)] if normalize else S64
    ridge = torch.tensor([rule(float(tr) - _TRACE_FLOOR)[2] for tr in traces], dtype=torch.float64,
                         device=S64[0].device)
    return NormalizedCovariances(Sigma_tilde, ridge, traces, bool(normalize))


def structural_prior(Sigma_tilde: Sequence[Tensor | TaskCovariance], *, energy: float | None = None,
                     sums: TaskSums | None = None) -> Tensor:
    """C_agg = 1 cᵀ (d_in × d_in, an expanded view; docs/methods.md §ACE, Eq. (ACE.9)): c the column means of
    sum_t Σ̃_t, over ``energy + 1e-12`` if given. ``sums`` (the fast path): sum_t Σ̃_t is ``sums.S``."""
    if len(Sigma_tilde) == 0:
        raise InputError("structural_prior needs at least one covariance")
    if sums is not None:  # fast path: the one pass's sum_t Σ̃_t
        S = sums.S
    else:
        S = summed(dense_covariance(S) for S in Sigma_tilde)  # (d_in, d_in)
    c = S.mean(dim=0) if energy is None else S.mean(dim=0) / (float(energy) + _ENERGY_FLOOR)
    return c.unsqueeze(0).expand(S.shape[0], -1)  # a view: every row is c, no d_in x d_in copy


def closed_form(numerators: Sequence[Tensor], Sigma_reg: NormalizedCovariances | Sequence[Tensor],
                C_agg: Tensor | None = None, *, name: str = "", sums: TaskSums | None = None) -> Tensor:
    """W_bar_pre = (sum_t N_t Sigma_reg,t)(sum_t Sigma_reg,t + C_agg)^-1, float64 (docs/methods.md §ACE, Eq. (ACE.10)).

    ``numerators``: the N_t (row-centred W̃_t in ACE, or the raw ΔW_t); ``Sigma_reg``: a
    :class:`NormalizedCovariances` or a list of Sigma_reg,t; the LU solve (:func:`acetools.merging.linalg.solve_right`,
    docs/methods.md §Numerics). ``sums`` (the fast path): the one pass's sums of these numerators and covariances
    (``normalize_covariances(..., one_pass=True).sums``), solved by :func:`solve_task_sums`.
    """
    if len(numerators) == 0:
        raise InputError(f"closed_form for layer {name!r} needs at least one task")
    if sums is not None:  # fast path: both sums of (ACE.10) were accumulated in the one pass
        if len(sums.scales) != len(numerators):
            raise InputError(f"layer {name!r}: {len(numerators)} numerators but sums over {len(sums.scales)} tasks")
        return solve_task_sums(sums, check_prior(C_agg, sums.S.shape[0], name), name=name)
    tildes = Sigma_reg.Sigma_tilde if isinstance(Sigma_reg, NormalizedCovariances) else Sigma_reg
    nums = [N.double() for N in numerators]  # T x (d_out, d_in)
    covs = [dense_covariance(S) for S in tildes]  # T x (d_in, d_in)
    if len(covs) != len(nums):
        raise InputError(f"layer {name!r}: {len(nums)} numerators but {len(covs)} covariances")
    for t, (N, S) in enumerate(zip(nums, covs)):
        if N.ndim != 2 or S.shape != (N.shape[1], N.shape[1]):
            raise InputError(f"layer {name!r}, task {t}: covariance has shape {tuple(S.shape)} but the task "
                             f"vector is {tuple(N.shape)}; it must be d_in x d_in = {N.shape[-1]} x {N.shape[-1]}")
    ridge = Sigma_reg.ridge if isinstance(Sigma_reg, NormalizedCovariances) else torch.zeros(len(covs))
    B = summed(N @ S + r * N for N, S, r in zip(nums, covs, ridge))  # (d_out, d_in)
    A = summed(covs)  # (d_in, d_in)
    A.diagonal().add_(ridge.sum())
    C_agg = check_prior(C_agg, A.shape[0], name)
    return solve_right(B, A if C_agg is None else A + C_agg.double(), name=name)


def refined_rank(k_frac: float, shape: Sequence[int], name: str = "") -> int:
    """k = floor(k_frac · min(d_out, d_in)) (eq. 18); k = 0 warns, naming the layer (it stays unrefined)."""
    k = int(k_frac * min(shape))
    if k == 0:
        warnings.warn(f"spectral refinement skipped for layer {name!r}: k = floor({k_frac} * {min(shape)}) = 0 "
                      "(the official code would return NaN here); raise k_frac or accept the unrefined layer",
                      RuntimeWarning, stacklevel=3)
    return k


def spectral_refine(W_pre: Tensor, delta_W: Sequence[Tensor], Sigma_tilde: Sequence[Tensor | TaskCovariance],
                    Sigma_reg_mean: Tensor, *, k_frac: float = 0.3, name: str = "",
                    sums: TaskSums | None = None) -> Refinement:
    """Spectral refinement (docs/methods.md §ACE, Eqs. (ACE.11)-(ACE.13)): W_fused = W_bar_pre + Δ_res = U S Vᵀ,
    Δ_res = sum_t ΔW_t (Σ̃_t - Σ̄_reg); W_bar = W_bar_pre + mean(S[:k]) U_k V_kᵀ, k = :func:`refined_rank`.
    ``sums`` (the fast path, made with ``refine=True``): Δ_res from the sums (:meth:`TaskSums.residual`) and only
    the top k triplets (:func:`acetools.merging.linalg.top_svd`).
    """
    METHODS["ace"].resolve({"k_frac": k_frac})
    if len(delta_W) != len(Sigma_tilde):
        raise InputError(f"layer {name!r}: {len(delta_W)} task vectors but {len(Sigma_tilde)} covariances")
    Wp = W_pre.double()  # (d_out, d_in)
    if sums is not None:  # fast path: Δ_res of (ACE.11) from the one pass
        if sums.task_sum is None:
            raise InputError(f"layer {name!r}: spectral_refine(sums=...) needs the sums of task_sums(..., refine=True)")
        res = sums.residual(Sigma_reg_mean)  # Δ_res (d_out, d_in)
        W_fused = res.add_(Wp) if res.dtype == torch.float64 else Wp + res.double()
    else:
        dWs = [d.double() for d in delta_W]
        W_fused = Wp + (summed(d @ dense_covariance(S) for d, S in zip(dWs, Sigma_tilde))
                        - summed(dWs) @ Sigma_reg_mean.double())
    k = refined_rank(k_frac, Wp.shape, name)
    if sums is not None:  # fast path: the top k only, for (ACE.12) (none when k = 0)
        U, S, Vh = top_svd(W_fused, k, gram=True)
    else:
        U, S, Vh = thin_svd(W_fused)
    if k == 0:
        return Refinement(Wp, 0, math.nan, S, U, Vh, W_fused)
    sigma_iso = S[:k].mean()
    return Refinement(isotropic_update(Wp, U[:, :k] @ Vh[:k, :], sigma_iso), k, float(sigma_iso), S, U, Vh, W_fused)


# --------------------------------------------------------------------------- the fast path: one pass over the tasks


class TaskSums(NamedTuple):
    """The sums over the T tasks that ACE's stages read on the fast path, from one pass (:func:`task_sums`): N_t
    the numerator (W̃_t = ΔW_t - 1 μ_tᵀ if ``centered``, else ΔW_t), Σ̃_t = s_t Sigma_hat_t. ``S`` is
    (ACE.9)'s sum_t Σ̃_t, :meth:`numerator` and ``S`` + sum_t r_t I the two sums of (ACE.10), :meth:`residual`
    (ACE.11)'s Δ_res."""

    S: Tensor  # sum_t Σ̃_t (d_in, d_in)
    B: Tensor  # sum_t N_t Σ̃_t (d_out, d_in); sum_t N_t (Σ̃_t + r_t I) when R is None (the ridge folded in)
    R: Tensor | None  # sum_t r_t N_t (d_out, d_in), kept apart for the refinement
    v: Tensor | None  # sum_t Σ̃_tᵀ μ_t (d_in,): centred numerator with the refinement
    task_sum: Tensor | None  # sum_t ΔW_t (d_out, d_in): with the refinement
    traces: Tensor  # (T,) tr_t, float64
    scales: Tensor  # (T,) s_t, float64
    ridge: Tensor  # (T,) r_t, float64
    symmetric: bool  # every Σ̃_t symmetric (a Cholesky may solve)
    covs: Sequence[TaskCovariance]  # what they were made of (the same pass again in float64)
    rule: Callable[[float], tuple[float, float, float]]
    centered: bool  # N_t = W̃_t (else ΔW_t)

    def numerator(self) -> Tensor:
        """sum_t N_t (Σ̃_t + r_t I) (d_out, d_in), the numerator of eq. 14 (a new tensor when R is kept)."""
        return self.B if self.R is None else self.B + self.R

    def residual(self, Sigma_reg_mean: Tensor) -> Tensor:
        """Δ_res = sum_t ΔW_t Σ̃_t - (sum_t ΔW_t) Σ̄_reg (d_out, d_in), eq. 16 of ACE-Merging (a new tensor)."""
        assert self.task_sum is not None, "task_sums(..., refine=True) keeps what the residual reads"
        res = self.B + self.v if self.v is not None else self.B.clone()  # sum_t ΔW_t Σ̃_t
        return res.addmm_(self.task_sum, Sigma_reg_mean.to(self.B.dtype), alpha=-1.0)


def task_sums(covs: Sequence[TaskCovariance], rule: Callable[[float], tuple[float, float, float]], *,
              dtype: torch.dtype = torch.float64, centered: bool = True, refine: bool = True) -> TaskSums:
    """One pass over the tasks, memory independent of T (docs/performance.md, ACE).

    ``rule(trace) -> (tr_t, s_t, r_t)``: the trace, scale and ridge of Σ̃_t = s_t Sigma_hat_t (``covs``
    unscaled). ``centered``: N_t = W̃_t (else ΔW_t); ``refine``: also keep what the refinement reads
    (sum_t r_t N_t apart, sum_t ΔW_t and, centred, sum_t Σ̃_t μ_t); else the ridge is folded into B.
    """
    d_out, d_in = covs[0].delta_W.shape
    dev = covs[0].delta_W.device
    z = functools.partial(torch.zeros, dtype=dtype, device=dev)
    S, B = z(d_in, d_in), z(d_out, d_in)
    R = z(d_out, d_in) if refine else B  # R is B: each r_t N_t lands in B
    v = z(d_in) if refine and centered else None
    task_sum = z(d_out, d_in) if refine else None
    T = len(covs)
    traces, scales, ridge = (torch.empty(T, dtype=torch.float64, device=dev) for _ in range(3))
    rows_first = 2 * d_out < d_in
    d_buf = torch.empty(d_out, d_in, dtype=dtype, device=dev)  # fresh temporaries of this size per task cost
    c_buf = torch.empty_like(d_buf)  # page faults comparable to their arithmetic
    symmetric, lower_only = True, False
    for t, cov in enumerate(covs):
        d = d_buf.copy_(cov.delta_W)  # ΔW_t (d_out, d_in)
        mu = d.mean(dim=0)  # (d_in,)
        N = center_rows(d, out=c_buf) if centered else d  # N_t (d_out, d_in)
        if task_sum is not None:
            task_sum += d
        if cov.kind in ("ace", "wudi"):
            F, q = (N if centered else center_rows(d, out=c_buf)), 1.0  # Sigma_hat_t = q Fᵀ F
            if cov.kind == "wudi":
                norm = float(torch.linalg.matrix_norm(d.double()))
                F, q = d, (0.0 if norm == 0 else 1.0 / norm**cov.wudi_p)
            tr, s, r = rule(q * float(task_energies([F])[0]))
            a = q * s  # Σ̃_t = a Fᵀ F
            if rows_first:  # S += a Fᵀ F (lower triangle), B += a (N Fᵀ) F, v += a Fᵀ (F μ)
                syrk_lower_(S, F, alpha=a)
                lower_only = True
                H = symmetrize_lower_(syrk_lower_(F.new_zeros(d_out, d_out), F.mT)) if N is F else N @ F.mT
                B.addmm_(H, F, alpha=a)
                del H
                if v is not None:
                    v.add_((F @ mu) @ F, alpha=a)
            else:
                G = symmetrize_lower_(syrk_lower_(F.new_zeros(d_in, d_in), F))  # (d_in, d_in)
                S.add_(G, alpha=a)
                B.addmm_(N, G, alpha=a)
                if v is not None:
                    v.add_(G @ mu, alpha=a)
                del G
        elif cov.kind == "identity":
            tr, s, r = rule(float(d_in))
            S.diagonal().add_(s)
            B.add_(N, alpha=s)
            if v is not None:
                v.add_(mu, alpha=s)
        else:  # "given"
            assert cov.matrix is not None, "kind 'given' carries its matrix"
            tr, s, r = rule(float(torch.diagonal(cov.matrix.double()).sum()))
            Sg = cov.matrix.to(dev, dtype)
            symmetric = symmetric and bool(torch.allclose(cov.matrix, cov.matrix.mT, rtol=1e-12, atol=0))
            S.add_(Sg, alpha=s)
            B.addmm_(N, Sg, alpha=s)
            if v is not None:
                v.add_(mu @ Sg, alpha=s)
        R.add_(N, alpha=r)
        traces[t], scales[t], ridge[t] = tr, s, r
        del d, N
    if lower_only:
        symmetrize_lower_(S)
    return TaskSums(S, B, R if refine else None, v, task_sum, traces, scales, ridge, symmetric, covs, rule, centered)


def solve_task_sums(sums: TaskSums, C_agg: Tensor | None = None, *, name: str = "") -> Tensor:
    """W_bar_pre of eq. 14 from the sums, float64 (d_out, d_in): :func:`solve_spd_rank_one` for a symmetric
    system with C_agg = 1 cᵀ (or none); otherwise, or where that fails, the float64 sums and :func:`solve_right`."""
    W = None
    if sums.symmetric and (C_agg is None or torch.equal(C_agg, C_agg[:1].expand_as(C_agg))):
        M = sums.S.clone()  # sum_t Sigma_reg,t (d_in, d_in); S stays for the refinement's Σ̄_reg
        M.diagonal().add_(float(sums.ridge.sum()))
        W = solve_spd_rank_one(sums.numerator(), M, None if C_agg is None else C_agg[0], overwrite=True)
    if W is None:
        if sums.B.dtype != torch.float64 or sums.R is not None:  # the float64 sums with the ridge folded in
            sums = task_sums(sums.covs, sums.rule, dtype=torch.float64, centered=sums.centered, refine=False)
        A = sums.S.clone()
        A.diagonal().add_(float(sums.ridge.sum()))
        W = solve_right(sums.numerator(), A if C_agg is None else A + C_agg.double(), name=name)
    return W.double()


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
               eps_mode: str = "absolute", gamma_mode: str = "paper", one_pass: bool = True
               ) -> tuple[Tensor, ACEDiagnostics]:
    """ACE-Merging for one matrix: the composition of the stages (docs/methods.md §ACE).

    ``delta_W``: the T task vectors ΔW_t (d_out × d_in); ``Sigma``: their covariances for
    ``estimator="given"``. Returns W_bar (before ``scaling``; input dtype) and an :class:`ACEDiagnostics`.
    Defaults: those of :func:`ace` (a test keeps them equal), ``None`` switches from the estimator's preset
    (:func:`estimator_preset`). ``one_pass`` (default, what the merges run): the stages read the sums of one pass
    over the tasks (the fast path, module docstring); ``False``: every stage computes its equation as written.
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
                                 precision=precision, numerator=sw.numerator, refine=flag and refine,
                                 one_pass=one_pass)
    sums = norm.sums  # the fast path's sums (one_pass), else None: the stages compute their equations
    C_agg = (structural_prior(norm.Sigma_tilde, energy=float(energies.mean()) if flag else None, sums=sums)
             if sw.prior else None)
    numerators = CenteredRows(dWs) if sw.numerator == "centered" else dWs  # T x (d_out, d_in), formed on use
    W_pre = closed_form(numerators, norm, C_agg, name=name, sums=sums)  # (d_out, d_in), float64
    diag = ACEDiagnostics(
        name=name, shape=(dWs[0].shape[0], dWs[0].shape[1]), n_tasks=len(dWs), estimator=estimator, gate=sw.gate,
        gamma=gamma, flag=flag, normalized=bool(flag and trace_norm), prior=sw.prior, numerator=sw.numerator,
        refined=False, energies=energies.tolist(), traces=norm.traces.tolist(), ridge=norm.ridge.tolist(),
        prior_norm=0.0 if C_agg is None else float(torch.linalg.vector_norm(C_agg[0].double())),
    )
    W, ref = W_pre, None
    if flag and refine:
        ref = spectral_refine(W_pre, dWs, norm.Sigma_tilde, norm.mean_reg(), k_frac=k_frac, name=name, sums=sums)
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
    f"float64 matrices of the widest input (d_in = {d_in}: {format_bytes(2 * d_in * d_in * 8)}; ace.task_sums)",
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
    matrix_keys = [k for k in base if is_matrix(k, base[k])]
    given = check_ace_covariances(covariances, hp["estimator"], base, matrix_keys, T)
    merged = {k for k in matrix_keys if hp["estimator"] != "given" or k in given}  # the others take the mean
    warn_mean_fallback("ace", [k for k in matrix_keys if k not in merged], "no covariances")
    update: dict[str, Tensor] = {}
    diags: dict[str, ACEDiagnostics] = {}
    for key in progress(list(base), desc="ace"):
        dtype = task_vectors[0][key].dtype
        if key not in merged:
            update[key] = scaling * mean_update(list(task_vectors), key)
            continue
        W, diags[key] = ace_matrix([tv[key] for tv in task_vectors], Sigma=given.get(key), name=key,
                                   spectra=spectra, **hp)
        update[key] = (scaling * W.double()).to(dtype).contiguous()
    return update, diags
