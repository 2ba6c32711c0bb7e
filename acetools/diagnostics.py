"""Diagnostics for merging: spectra, subspaces, CKA, task-vector geometry and Theorem 1 checks.

Pure functions on tensors (computed in float64) returning floats, small dataclasses or DataFrames.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import pandas as pd
import torch
from torch import Tensor

from .errors import InputError, InputKeyError, InputTypeError
from .keys import block_index, layer_type  # layer_type re-exported: the public name lessons use
from .merging import METHODS, is_matrix_param
from .merging.ace import heterogeneity, task_energies

__all__ = ["singular_values", "energy_fraction", "condition_number", "effective_rank", "principal_subspace",
           "subspace_similarity", "energy_capture", "linear_cka", "task_vector_cosine",
           "layer_type", "relative_update_norms", "heterogeneity_per_layer", "CovarianceComparison",
           "compare_covariances"]


def _matrix(M: Tensor, what: str = "M") -> Tensor:
    if not isinstance(M, Tensor):
        raise InputTypeError(f"{what} must be a torch.Tensor, got {type(M).__name__}")
    if M.ndim != 2:
        raise InputError(f"{what} must be a 2-D matrix, got shape {tuple(M.shape)}")
    if not torch.isfinite(M).all():
        raise InputError(f"{what} contains NaN or Inf")
    return M.double()


def singular_values(M: Tensor) -> Tensor:
    """Singular values of a matrix, descending, float64 (a 1-D input is taken as a spectrum
    and returned as |values| sorted descending)."""
    if isinstance(M, Tensor) and M.ndim == 1:
        return M.double().abs().sort(descending=True).values
    return torch.linalg.svdvals(_matrix(M))


def energy_fraction(M: Tensor, frac: float = 0.05) -> float:
    """Share of Σσ_i² in the top k = max(1, ceil(frac · r)) singular values of a matrix or 1-D spectrum
    (ACE's "top 5 % hold 99 %+" is ``energy_fraction(W_pre, 0.05)``); NaN for a zero matrix."""
    if not 0.0 < frac <= 1.0:
        raise InputError(f"frac={frac!r} must be in (0, 1] (0.05 = top 5%)")
    S = singular_values(M)
    k = max(1, math.ceil(frac * S.numel()))
    total = float((S**2).sum())
    return float((S[:k] ** 2).sum()) / total if total > 0 else math.nan


def condition_number(M: Tensor) -> float:
    """2-norm condition number σ_max / σ_min over the min(d_out, d_in) singular values
    (``inf`` if σ_min = 0; NaN for a zero matrix)."""
    S = singular_values(M)
    if S[0] == 0:
        return math.nan
    return float(S[0] / S[-1]) if S[-1] > 0 else math.inf


def effective_rank(M: Tensor) -> float:
    """Entropy effective rank (Roy & Vetterli 2007): exp(H(p)), p_i = σ_i / Σ_j σ_j; 0 for a zero matrix."""
    S = singular_values(M)
    total = S.sum()
    if total == 0:
        return 0.0
    p = S / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def principal_subspace(M: Tensor, k: int, side: str = "left") -> Tensor:
    """Orthonormal basis (d × k) of the top-``k`` singular subspace of ``M``: ``"left"`` U_k (outputs),
    ``"right"`` V_k (inputs)."""
    M = _matrix(M)
    if side not in ("left", "right"):
        raise InputError(f"side={side!r} must be 'left' or 'right'")
    r = min(M.shape)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= r:
        raise InputError(f"k={k!r} must be an int in [1, min(d_out, d_in)] = [1, {r}]")
    U, _, Vh = torch.linalg.svd(M, full_matrices=False)
    return U[:, :k] if side == "left" else Vh[:k, :].T


def subspace_similarity(A: Tensor, B: Tensor, k: int, *, side: str = "left", reduction: str = "projection") -> float:
    """Similarity in [0, 1] of the top-``k`` singular subspaces of ``A`` and ``B`` (θ_i their principal
    angles): ``"projection"`` ||U_Aᵀ U_B||_F² / k = mean cos² θ_i, or ``"mean_cos"`` mean cos θ_i."""
    if reduction not in ("projection", "mean_cos"):
        raise InputError(f"reduction={reduction!r} must be 'projection' or 'mean_cos'")
    UA, UB = principal_subspace(A, k, side), principal_subspace(B, k, side)
    if UA.shape[0] != UB.shape[0]:
        raise InputError(f"A and B live in different spaces ({UA.shape[0]} vs {UB.shape[0]} rows on side {side!r})")
    M = UA.T @ UB
    if reduction == "projection":
        return float((M**2).sum() / k)
    return float(torch.linalg.svdvals(M).clamp(max=1.0).mean())


def energy_capture(X: Tensor, delta_W: Tensor, k: int) -> dict[str, float]:
    """Share of ||ΔO||_F², ΔO = X ΔWᵀ, kept at rank ``k`` by ESD (ΔO's top-k output directions) and by
    SVD (ΔW's top-k left singular vectors); ESD ≥ SVD (docs/methods.md §ESM). ``X`` is N × d_in."""
    X, dW = _matrix(X, "X"), _matrix(delta_W, "delta_W")
    if X.shape[1] != dW.shape[1]:
        raise InputError(f"X has {X.shape[1]} features but delta_W has d_in = {dW.shape[1]}")
    d_out = dW.shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_out:
        raise InputError(f"k={k!r} must be an int in [1, d_out] = [1, {d_out}]")
    dO = X @ dW.T
    total = float((dO**2).sum())
    if total == 0:
        raise InputError("X @ delta_W.T is zero: no activation shift to decompose")
    S_out = torch.linalg.svdvals(dO)
    U = torch.linalg.svd(dW, full_matrices=False)[0]
    Uk = U[:, : min(k, U.shape[1])]
    return {
        "k": k,
        "esd": float((S_out[:k] ** 2).sum()) / total,
        "svd": float(((dO @ Uk) ** 2).sum()) / total,
    }


def linear_cka(X: Tensor, Y: Tensor) -> float:
    """Linear CKA (Kornblith et al. 2019) of X (N × p) and Y (N × q) on the same examples, columns
    centred: ||Y_cᵀ X_c||_F² / (||X_cᵀ X_c||_F ||Y_cᵀ Y_c||_F), in [0, 1]."""
    X, Y = _matrix(X, "X"), _matrix(Y, "Y")
    if X.shape[0] != Y.shape[0]:
        raise InputError(f"X and Y need the same number of rows (examples): {X.shape[0]} vs {Y.shape[0]}")
    if X.shape[0] < 2:
        raise InputError("linear_cka needs at least 2 examples")
    Xc, Yc = X - X.mean(0, keepdim=True), Y - Y.mean(0, keepdim=True)
    if X.shape[0] < X.shape[1] + Y.shape[1]:
        K, L = Xc @ Xc.T, Yc @ Yc.T
        hsic, nx, ny = (K * L).sum(), torch.linalg.matrix_norm(K), torch.linalg.matrix_norm(L)
    else:
        hsic = ((Yc.T @ Xc) ** 2).sum()
        nx, ny = torch.linalg.matrix_norm(Xc.T @ Xc), torch.linalg.matrix_norm(Yc.T @ Yc)
    if nx == 0 or ny == 0:
        raise InputError("linear_cka is undefined when X or Y is constant across examples")
    return float(hsic / (nx * ny))


def _names(n: int, names: Sequence[str] | None) -> list[str]:
    if names is None:
        return [f"task{i}" for i in range(n)]
    names = list(names)
    if len(names) != n:
        raise InputError(f"{len(names)} names for {n} task vectors")
    return names


def _select_keys(task_vectors: Sequence[Mapping[str, Tensor]], keys: Iterable[str] | None) -> list[str]:
    if isinstance(task_vectors, Mapping) or len(task_vectors) == 0:
        raise InputError("task_vectors must be a non-empty list of {key: tau_t} dicts")
    all_keys = list(task_vectors[0])
    if keys is None:
        return all_keys
    keys = list(keys)
    for k in keys:
        for t, tv in enumerate(task_vectors):
            if k not in tv:
                raise InputKeyError(f"task_vectors[{t}] has no key {k!r}")
    return keys


def task_vector_cosine(task_vectors: Sequence[Mapping[str, Tensor]], names: Sequence[str] | None = None,
                       keys: Iterable[str] | None = None):
    """T × T cosines of the task vectors flattened over ``keys`` (default all), a DataFrame labelled by
    ``names``; NaN for a zero task vector."""
    keys = _select_keys(task_vectors, keys)
    T = len(task_vectors)
    G = torch.zeros(T, T, dtype=torch.float64)
    for k in keys:
        F = torch.stack([tv[k].detach().double().reshape(-1).cpu() for tv in task_vectors])
        G += F @ F.T
    n = G.diagonal().sqrt()
    C = G / (n[:, None] * n[None, :])
    labels = _names(T, names)
    return pd.DataFrame(C.numpy(), index=labels, columns=labels)


def relative_update_norms(base: Mapping[str, Tensor], task_vectors: Sequence[Mapping[str, Tensor]],
                          names: Sequence[str] | None = None, keys: Iterable[str] | None = None):
    """||tau_t[k]||_F / ||W0[k]||_F per task and key (docs/regime.md): columns task, key, layer_type,
    tau_norm, base_norm, ratio (NaN where the base tensor is zero)."""
    keys = _select_keys(task_vectors, keys)
    labels = _names(len(task_vectors), names)
    rows = []
    for k in keys:
        if k not in base:
            raise InputKeyError(f"base has no key {k!r}")
        b = float(base[k].detach().double().norm())
        for name, tv in zip(labels, task_vectors):
            if tuple(tv[k].shape) != tuple(base[k].shape):
                raise InputError(
                    f"{k!r}: task vector {name} has shape {tuple(tv[k].shape)}, base {tuple(base[k].shape)}"
                )
            t = float(tv[k].detach().double().norm())
            rows.append({"task": name, "key": k, "layer_type": layer_type(k), "tau_norm": t, "base_norm": b,
                         "ratio": t / b if b > 0 else math.nan})
    return pd.DataFrame(rows, columns=["task", "key", "layer_type", "tau_norm", "base_norm", "ratio"])


def heterogeneity_per_layer(task_vectors: Sequence[Mapping[str, Tensor]], *, tau: float | None = None,
                            is_matrix: Callable[[str, Tensor], bool] | None = None, keys: Iterable[str] | None = None):
    """ACE's heterogeneity γ (Eq. 7, :func:`acetools.merging.ace.heterogeneity`) per matrix key: the one
    γ table of the library, the lessons and the reports.

    Columns: key, layer_type, block, shape, gamma, flag (γ > ``tau``, default ACE's registered one),
    the energies e_t = ||τ_t||_F² (mean/min/max/ratio), log_energy_mean / log_energy_sd of
    log(e_t + 1e-12) and cv = sd/mean of e_t.
    """
    tau = float(METHODS["ace"].params["tau"].default) if tau is None else tau
    is_matrix = is_matrix or is_matrix_param
    chosen = _select_keys(task_vectors, keys)
    if keys is None:
        chosen = [k for k in chosen if is_matrix(k, task_vectors[0][k])]
    rows = []
    for k in chosen:
        mats = [tv[k] for tv in task_vectors]
        gamma = heterogeneity(mats)
        e = task_energies(mats)
        ell = torch.log(e + 1e-12)
        many = len(mats) > 1
        rows.append({"key": k, "layer_type": layer_type(k), "block": block_index(k), "shape": tuple(mats[0].shape),
                     "gamma": gamma, "flag": gamma > tau,
                     "energy_mean": float(e.mean()), "energy_min": float(e.min()), "energy_max": float(e.max()),
                     "energy_ratio": float(e.max() / e.min()) if e.min() > 0 else math.inf,
                     "log_energy_mean": float(ell.mean()), "log_energy_sd": float(ell.std()) if many else 0.0,
                     "cv": float(e.std() / e.mean()) if many and float(e.mean()) > 0 else math.nan})
    return pd.DataFrame(rows, columns=["key", "layer_type", "block", "shape", "gamma", "flag", "energy_mean",
                                       "energy_min", "energy_max", "energy_ratio", "log_energy_mean",
                                       "log_energy_sd", "cv"])


@dataclass(frozen=True)
class CovarianceComparison:
    """How well an estimated covariance matches the true one (Theorem 1 of ACE-Merging; scale-invariant)."""

    cosine: float  # <A, B>_F / (||A||_F ||B||_F)
    subspace_overlap: float  # ||U_kᵀ V_k||_F² / k for the top-k eigenvectors
    k: int
    spectrum_pearson: float  # Pearson r of the two sorted (descending) eigenvalue lists
    direction_spearman: float  # Spearman ρ of λ_i(Sigma) vs u_iᵀ Sigma_hat u_i along Sigma's eigenvectors u_i

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _symmetric(M: Tensor, what: str) -> Tensor:
    M = _matrix(M, what)
    if M.shape[0] != M.shape[1]:
        raise InputError(f"{what} must be square, got {tuple(M.shape)}")
    scale = float(M.abs().max())
    if scale > 0 and float((M - M.T).abs().max()) > 1e-8 * scale:
        raise InputError(f"{what} is not symmetric; a covariance must be (symmetrise it with (S + S.T) / 2)")
    return (M + M.T) / 2


def _pearson(a: Tensor, b: Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den > 0 else math.nan


def compare_covariances(Sigma_hat: Tensor, Sigma: Tensor, k: int | None = None) -> CovarianceComparison:
    """Compare an estimated covariance ``Sigma_hat`` with the true ``Sigma`` (both d × d): the fields of
    :class:`CovarianceComparison` (``k`` default max(1, d // 10)). ``direction_spearman`` ranks the
    true eigenvalues against ``Sigma_hat``'s variance along the same eigenvectors (two sorted spectra
    would agree by construction)."""
    from scipy.stats import rankdata

    A, B = _symmetric(Sigma_hat, "Sigma_hat"), _symmetric(Sigma, "Sigma")
    if A.shape != B.shape:
        raise InputError(f"Sigma_hat {tuple(A.shape)} and Sigma {tuple(B.shape)} differ in shape")
    d = A.shape[0]
    k = max(1, d // 10) if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d:
        raise InputError(f"k={k!r} must be an int in [1, {d}]")
    nA, nB = torch.linalg.matrix_norm(A), torch.linalg.matrix_norm(B)
    if nA == 0 or nB == 0:
        raise InputError("compare_covariances needs non-zero matrices")
    lA, UA = torch.linalg.eigh(A)
    lB, UB = torch.linalg.eigh(B)
    lA, UA, lB, UB = lA.flip(0), UA.flip(1), lB.flip(0), UB.flip(1)
    overlap = float(((UA[:, :k].T @ UB[:, :k]) ** 2).sum() / k)
    along = ((A @ UB) * UB).sum(0)  # u_iᵀ Sigma_hat u_i
    ranks = [torch.from_numpy(rankdata(x.detach().cpu().numpy())) for x in (lB, along)]  # ties: their mean rank
    return CovarianceComparison(
        cosine=float((A * B).sum() / (nA * nB)),
        subspace_overlap=overlap,
        k=k,
        spectrum_pearson=_pearson(lA, lB),
        direction_spearman=_pearson(*ranks),
    )
