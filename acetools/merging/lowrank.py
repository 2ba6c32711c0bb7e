"""Merging LoRA updates in their own rank (docs/methods.md §Low-rank updates).

Each task's update of one matrix is given as factors, ΔW_t = B_t A_t (B_t: d_out × r_t, A_t: r_t × d_in,
the adapter's scale folded into B_t). Every update lies in the span of the stacked factors: with Q_B an
orthonormal basis of the columns of [B_1 | ... | B_T] and Q_A one of the rows of [A_1; ...; A_T],
ΔW_t = Q_B C_t Q_Aᵀ with the R × R core C_t = (Q_Bᵀ B_t)(A_t Q_A), R = sum_t r_t (Core Space, Panariello et
al. 2025, arXiv 2509.17786). The functions here compute task arithmetic, weight averaging, TSV-M, Iso-C,
Iso-CTS and ACE in that span, never forming a d_out × d_in matrix, and return the merged update as factors
(:class:`LowRankUpdate`); :func:`to_rank` cuts it to a chosen rank and reports the discarded energy;
:func:`lowrank_update` runs one registered method on one key (what ``acetools merge`` does for LoRA experts).

What is exact (docs/methods.md §Low-rank updates): task arithmetic, weight averaging and ACE's closed
form (eps > 0) equal the engine's full-space merge of the folded updates. TSV-M, Iso-C, Iso-CTS and ACE's
refinement equal it where the full-space result is a function of the task vectors: the full-space
methods take singular vectors beyond a task's rank (TSV-M when int(min(d_out, d_in) / T) > r_t, Iso-C
when sum_t r_t < min(d_out, d_in), Iso-CTS when its common rank exceeds the span, ACE's refinement when
floor(k_frac min(d_out, d_in)) > R), which are whatever basis of the null space LAPACK returns; here those
zero-singular-value slots are dropped (Core Space's definition).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor

from ..errors import InputError, InputTypeError
from ._registry import METHODS, per_expert_values
from .ace import estimator_preset, gate_flag, heterogeneity, refined_rank, ridge_of
from .linalg import polar, thin_svd
from .svd import iso_cts_ranks, tsv_rank

__all__ = [
    "RANK_RTOL", "LowRankUpdate", "Truncation", "check_factors", "span_bases", "numerical_rank",
    "task_arithmetic_lowrank", "weight_averaging_lowrank", "tsv_m_lowrank", "iso_c_lowrank",
    "iso_cts_lowrank", "ACESpanInfo", "ace_lowrank", "to_rank", "LOWRANK_METHODS", "lowrank_form", "lowrank_update",
]

#: A singular value at or below ``RANK_RTOL · sigma_1`` of the same matrix counts as zero (the factors'
#: product in float64: an exactly rank-deficient product leaves ~1e-16 sigma_1 in place of zero).
RANK_RTOL = 1e-10

_TRACE_FLOOR = 1e-12  # as acetools.merging.ace: tr_t = Tr(Sigma_hat_t) + 1e-12
_ENERGY_FLOOR = 1e-12  # the flagged prior's division by the mean energy + 1e-12 (Eq. (ACE.9))


class LowRankUpdate(NamedTuple):
    """A merged update of one matrix as factors, ΔW = B A (B: d_out × k, A: k × d_in)."""

    B: Tensor
    A: Tensor

    @property
    def rank(self) -> int:
        """k, the inner dimension of the factors (an upper bound on the rank of B A)."""
        return self.B.shape[1]

    def dense(self) -> Tensor:
        """B A, the d_out × d_in update (formed: for checks and small matrices)."""
        return self.B @ self.A


class Truncation(NamedTuple):
    """Output of :func:`to_rank`: the best rank-``k`` factors, the singular values of the input update and
    the discarded energy ``sum_{j > k} s_j² / sum_j s_j²``."""

    update: LowRankUpdate
    S: Tensor
    discarded: float


_F = TypeVar("_F", bound=Callable[..., Any])


def _one_thread(fn: _F) -> _F:
    """Run ``fn`` with one torch thread: the span's matrices are d x R (R = sum_t r_t) and R x R, small enough that a
    second thread costs more in synchronisation than it saves: 0.05 s on one thread against 0.3-1.8 s on two for
    TSV-M at 512 x 512 on the loaded 2-core machine (docs/performance.md §LoRA factors)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        n = torch.get_num_threads()
        if n == 1:
            return fn(*args, **kwargs)
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(n)

    return call  # type: ignore[return-value]


def _where(key: str) -> str:
    return f"key {key!r}: " if key else ""


def check_factors(factors: Sequence[tuple[Tensor, Tensor]], key: str = "") -> list[tuple[Tensor, Tensor]]:
    """Validate the per-task factors ``(B_t, A_t)`` of one matrix: 2-D floating tensors, B_t d_out × r_t and
    A_t r_t × d_in, one d_out and d_in for all; errors name ``key`` and the task."""
    out = list(factors)
    if not out:
        raise InputError(f"{_where(key)}no factors given: pass one (B_t, A_t) pair per task")
    shape = None
    for t, pair in enumerate(out):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InputTypeError(f"{_where(key)}task {t}: expected a (B_t, A_t) pair, got {type(pair).__name__}")
        B, A = pair
        if not isinstance(B, Tensor) or not isinstance(A, Tensor):
            raise InputTypeError(f"{_where(key)}task {t}: B_t and A_t must be torch.Tensors")
        if B.ndim != 2 or A.ndim != 2 or B.shape[1] != A.shape[0]:
            raise InputError(f"{_where(key)}task {t}: B_t {tuple(B.shape)} and A_t {tuple(A.shape)} must be "
                             "d_out x r_t and r_t x d_in (B_t A_t is the update)")
        if not (B.is_floating_point() and A.is_floating_point()):
            raise InputTypeError(f"{_where(key)}task {t}: factors must be floating point, got {B.dtype}, {A.dtype}")
        if shape is None:
            shape = (B.shape[0], A.shape[1])
        elif (B.shape[0], A.shape[1]) != shape:
            raise InputError(f"{_where(key)}task {t}: B_t A_t is {B.shape[0]} x {A.shape[1]} but task 0's is "
                             f"{shape[0]} x {shape[1]}; every task must update the same matrix")
    return out


def _out_dtype(factors: Sequence[tuple[Tensor, Tensor]]) -> torch.dtype:
    dt = factors[0][0].dtype
    return dt if dt in (torch.float32, torch.float64) else torch.float32


def _orth(M: Tensor) -> Tensor:
    """An orthonormal basis (reduced QR) of the columns of ``M``, at most ``min(M.shape)`` columns."""
    return torch.linalg.qr(M, mode="reduced").Q


def span_bases(factors: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Q_B (d_out × R_B) and Q_A (d_in × R_A), float64 orthonormal bases holding the columns of every B_t and
    the rows of every A_t (reduced QR of the stacked factors; R_B, R_A <= sum_t r_t)."""
    Q_B = _orth(torch.cat([B.double() for B, _ in factors], dim=1))
    Q_A = _orth(torch.cat([A.double() for _, A in factors], dim=0).mT)
    return Q_B, Q_A


def numerical_rank(S: Tensor) -> int:
    """How many singular values (descending) exceed ``RANK_RTOL · S[0]``."""
    if S.numel() == 0 or not bool(S[0] > 0):
        return 0
    return int((S > RANK_RTOL * S[0]).sum())


def _scaled(factors: Sequence[tuple[Tensor, Tensor]], coef: Sequence[float]) -> LowRankUpdate:
    dt = _out_dtype(factors)
    return LowRankUpdate(torch.cat([(c * B.double()).to(dt) for (B, _), c in zip(factors, coef)], dim=1),
                         torch.cat([A.to(dt) for _, A in factors], dim=0))


# --------------------------------------------------------------------------- the linear rules
@_one_thread
def task_arithmetic_lowrank(factors: Sequence[tuple[Tensor, Tensor]], *, lam: float | None = None,
                            weights: Sequence[float] | None = None, key: str = "") -> LowRankUpdate:
    """Task arithmetic as factors of rank sum_t r_t: lam sum_t w_t B_t A_t = [lam w_1 B_1 | ...] [A_1; ...]
    (docs/methods.md §Low-rank updates, Eq. (LR.2)); exact. ``lam``: the registered default if ``None``."""
    factors = check_factors(factors, key)
    lam = float(METHODS["task_arithmetic"].params["lam"].default if lam is None else lam)
    w = [1.0] * len(factors) if weights is None else per_expert_values("task_arithmetic", "weights", weights,
                                                                      len(factors))
    return _scaled(factors, [lam * wt for wt in w])


@_one_thread
def weight_averaging_lowrank(factors: Sequence[tuple[Tensor, Tensor]], *, weights: Sequence[float] | None = None,
                             key: str = "") -> LowRankUpdate:
    """Weight averaging as factors of rank sum_t r_t: sum_t w_t B_t A_t / sum_t w_t (Eq. (LR.2)); exact."""
    factors = check_factors(factors, key)
    w = [1.0] * len(factors) if weights is None else per_expert_values("weight_averaging", "weights", weights,
                                                                      len(factors))
    if sum(w) == 0:
        raise InputError(f"weight_averaging: hyperparameter weights={list(w)!r} sum to 0; give weights with a "
                         "non-zero sum")
    return _scaled(factors, [wt / sum(w) for wt in w])


# --------------------------------------------------------------------------- TSV-M and Iso-C in the span
def _task_triplets(B: Tensor, A: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The non-zero singular triplets of B A (float64) from the QR of the factors: B = Q_b R_b, Aᵀ = Q_a R_a,
    R_b R_aᵀ = u s vh, so B A = (Q_b u) diag(s) (vh Q_aᵀ) (Eq. (LR.3))."""
    Q_b, R_b = torch.linalg.qr(B.double(), mode="reduced")
    Q_a, R_a = torch.linalg.qr(A.double().mT, mode="reduced")
    u, s, vh = torch.linalg.svd(R_b @ R_a.mT, full_matrices=False)
    n = numerical_rank(s)
    return Q_b @ u[:, :n], s[:n], vh[:n] @ Q_a.mT


@_one_thread
def tsv_m_lowrank(factors: Sequence[tuple[Tensor, Tensor]], *, alpha: float = 1.0, key: str = "") -> LowRankUpdate:
    """TSV-M in the span (docs/methods.md §Low-rank updates, Eq. (LR.4)): each task's top k_t = min(k, rank
    B_t A_t) triplets, k = :func:`acetools.merging.svd.tsv_rank`, orthogonalised by polar in the bases'
    coordinates, polar(Q_B X) = Q_B polar(X). Equals :func:`acetools.merging.svd.tsv_merge_matrix` times
    ``alpha`` where k <= rank(B_t A_t) for every t (else the full-space result depends on LAPACK's null basis)."""
    factors = check_factors(factors, key)
    dt = _out_dtype(factors)
    d_out, d_in = factors[0][0].shape[0], factors[0][1].shape[1]
    T = len(factors)
    k = tsv_rank(min(d_out, d_in), T)
    trips = [_task_triplets(B, A) for B, A in factors]
    trips = [(U[:, :k], s[:k], V[:k]) for U, s, V in trips]
    if k == 0 or all(s.numel() == 0 for _, s, _ in trips):
        if k == 0:
            warnings.warn(f"TSV-M {_where(key)}per-task rank int({min(d_out, d_in)} * 1/{T}) = 0 because "
                          "min(d_out, d_in) < n_tasks; the merged update of this matrix is zero", RuntimeWarning,
                          stacklevel=2)
        return LowRankUpdate(torch.zeros(d_out, 0, dtype=dt), torch.zeros(0, d_in, dtype=dt))
    Q_B, Q_A = span_bases(factors)
    U_cat = torch.cat([U for U, _, _ in trips], dim=1)  # (d_out, n)
    s_cat = torch.cat([s for _, s, _ in trips])  # (n,)
    V_cat = torch.cat([V for _, _, V in trips], dim=0)  # (n, d_in)
    PU = polar(Q_B.mT @ U_cat)  # (R_B, n): polar(U_cat) = Q_B PU
    PV = polar(V_cat @ Q_A)  # (n, R_A): polar(V_cat) = PV Q_Aᵀ
    return LowRankUpdate((alpha * (Q_B @ (PU * s_cat))).to(dt), (PV @ Q_A.mT).to(dt))


@_one_thread
def iso_c_lowrank(factors: Sequence[tuple[Tensor, Tensor]], *, alpha: float = 1.0, key: str = "") -> LowRankUpdate:
    """Iso-C in the span (Eq. (LR.5)): sum_t B_t A_t = Q_B (u S vh) Q_Aᵀ; sigma_bar = sum(S) / min(d_out, d_in)
    (the zero singular values counted, as in full space) times (Q_B u_rho)(vh_rho Q_Aᵀ), rho = the rank. The
    full-space :func:`acetools.merging.svd.iso_c_matrix` adds sigma_bar times a partial isometry between the
    null spaces (whatever LAPACK returns); this omits it."""
    factors = check_factors(factors, key)
    dt = _out_dtype(factors)
    d_out, d_in = factors[0][0].shape[0], factors[0][1].shape[1]
    Q_B, Q_A = span_bases(factors)
    core = torch.stack([(Q_B.mT @ B.double()) @ (A.double() @ Q_A) for B, A in factors]).sum(0)  # (R_B, R_A)
    u, S, vh = thin_svd(core)
    rho = numerical_rank(S)
    sigma_bar = float(S[:rho].sum()) / min(d_out, d_in)
    return LowRankUpdate((alpha * sigma_bar * (Q_B @ u[:, :rho])).to(dt), (vh[:rho] @ Q_A.mT).to(dt))


def _polar_ranked(M: Tensor) -> Tensor:
    """The polar factor of ``M`` over its non-zero singular values (:func:`numerical_rank`): ``polar`` where ``M``
    has full rank, the partial isometry of its range otherwise (the null slots dropped, as Core Space)."""
    U, S, Vh = thin_svd(M)
    n = numerical_rank(S)
    return U[:, :n] @ Vh[:n]


@_one_thread
def iso_cts_lowrank(factors: Sequence[tuple[Tensor, Tensor]], *, alpha: float = 1.0, common_fraction: float = 0.8,
                    key: str = "") -> LowRankUpdate:
    """Iso-CTS in the span (docs/methods.md §Low-rank updates, Eq. (LR.5b)): the common top-k_c triplets of the core
    C = sum_t C_t (C_t = (Q_Bᵀ B_t)(A_t Q_A)), each task's top-s triplets of its residual (I - u_c u_cᵀ) C_t, then
    sigma_bar polar(U_all) polar(V_all) in the bases' coordinates, sigma_bar = sum(s_all) / min(d_out, d_in) and
    (k_c, s) = :func:`acetools.merging.svd.iso_cts_ranks`. Equals :func:`acetools.merging.svd.iso_cts_matrix`
    times ``alpha`` where k_c <= rank C and s <= the rank of every residual (else the full-space result takes
    slots of LAPACK's null basis; here they are dropped)."""
    factors = check_factors(factors, key)
    dt = _out_dtype(factors)
    d_out, d_in = factors[0][0].shape[0], factors[0][1].shape[1]
    r = min(d_out, d_in)
    try:
        k_c, s = iso_cts_ranks(r, len(factors), common_fraction)
    except InputError as e:
        raise InputError(f"{_where(key)}{e}") from None
    Q_B, Q_A = span_bases(factors)
    cores = [(Q_B.mT @ B.double()) @ (A.double() @ Q_A) for B, A in factors]  # T x (R_B, R_A)
    u, S, vh = thin_svd(torch.stack(cores).sum(0))
    n_c = min(k_c, numerical_rank(S))
    u_c = u[:, :n_c]
    Us, ss, Vs = [], [], []
    for C in cores if s > 0 else ():
        ut, st, vt = thin_svd(C - u_c @ (u_c.mT @ C))  # the residual's core
        n = min(s, int((st > RANK_RTOL * float(torch.linalg.matrix_norm(C, 2))).sum()))  # zero: against C_t's scale
        Us.append(ut[:, :n])
        ss.append(st[:n])
        Vs.append(vt[:n])
    Us.append(u_c)
    ss.append(S[:n_c])
    Vs.append(vh[:n_c])
    s_all = torch.cat(ss)
    if not bool((s_all > 0).any()):
        return LowRankUpdate(torch.zeros(d_out, 0, dtype=dt), torch.zeros(0, d_in, dtype=dt))
    sigma_bar = float(s_all.sum()) / r
    core = _polar_ranked(torch.cat(Us, dim=1)) @ _polar_ranked(torch.cat(Vs, dim=0))  # (R_B, R_A)
    return LowRankUpdate((alpha * sigma_bar * (Q_B @ core)).to(dt), Q_A.mT.to(dt))


# --------------------------------------------------------------------------- ACE in the span
@dataclass
class ACESpanInfo:
    """What :func:`ace_lowrank` decided for one matrix (the fields of :class:`acetools.merging.ace.ACEDiagnostics`
    it shares, and the span's)."""

    gamma: float
    flag: bool
    normalized: bool
    span_rank: int  # R_A, the dimension of the row span the closed form lives in
    refined: bool = False
    k: int = 0  # the refined rank floor(k_frac min(d_out, d_in))
    sigma_iso: float = math.nan
    null_rank: int = 0  # k minus the rank of W_fused: the refinement's directions outside the span (omitted)


@_one_thread
def ace_lowrank(factors: Sequence[tuple[Tensor, Tensor]], *, key: str = "", **hparams: Any
                ) -> tuple[LowRankUpdate, ACESpanInfo]:
    """ACE-Merging of one matrix in the row span of the A_t (docs/methods.md §Low-rank updates, Eqs. (LR.6)-(LR.9)).

    Sigma_hat_t = F_tᵀ F_t with F_t = B̃_t A_t (B̃_t = B_t with its column means removed; "wudi": B_t A_t /
    ||B_t A_t||_F^(p/2)) is Q_A K_t Q_Aᵀ, and so is the structural prior's c; with a ridge rho = sum_t r_t > 0,
    W_bar_pre = M (rho I + K + (Q_Aᵀ 1) gᵀ)^-1 Q_Aᵀ exactly. The refinement keeps the top min(k, rank W_fused)
    triplets of W_fused = F Q_Aᵀ and sigma_iso over all k. ``hparams``: those of ``merge("ace")`` (estimator
    "ace" or "wudi"; ``scaling`` applied); returns the factors (rank R_A) and an :class:`ACESpanInfo`.
    """
    factors = check_factors(factors, key)
    hp = METHODS["ace"].resolve(hparams)
    estimator = hp["estimator"]
    if estimator not in ("ace", "wudi"):
        raise InputError(f"ace_lowrank {_where(key)}estimator={estimator!r} has no low-rank form: use 'ace' or "
                         "'wudi' ('identity' is weight averaging: weight_averaging_lowrank)")
    if not hp["eps"] > 0:
        raise InputError(f"ace_lowrank {_where(key)}eps={hp['eps']!r}: sum_t Sigma_reg,t is singular on the full "
                         "space without the ridge; give eps > 0 (the default 1e-2)")
    sw = estimator_preset(estimator, gate=hp["gate"], prior=hp["prior"], numerator=hp["numerator"])
    dt = _out_dtype(factors)
    d_out, d_in = factors[0][0].shape[0], factors[0][1].shape[1]
    T = len(factors)
    _, Q_A = span_bases(factors)  # (d_in, R)
    R = Q_A.shape[1]
    Bs = [B.double() for B, _ in factors]
    As = [A.double() @ Q_A for _, A in factors]  # A_t Q_A (r_t, R)
    D = [B @ A for B, A in zip(Bs, As)]  # ΔW_t Q_A (d_out, R): same Frobenius norm as ΔW_t
    Dc = [(B - B.mean(dim=0, keepdim=True)) @ A for B, A in zip(Bs, As)]  # W̃_t Q_A
    gamma = heterogeneity(D, hp["gamma_mode"])
    flag = gate_flag(gamma, hp["tau"], sw.gate)
    normalize = flag and hp["trace_norm"]
    energies = torch.stack([d.square().sum() for d in D])
    K = torch.zeros(R, R, dtype=torch.float64)
    M = torch.zeros(d_out, R, dtype=torch.float64)
    rho = 0.0
    Kt: list[Tensor] = []
    for t in range(T):
        if estimator == "ace":
            F, q = Dc[t], 1.0
        else:
            norm = float(energies[t].sqrt())
            F, q = D[t], (0.0 if norm == 0 else 1.0 / norm ** hp["wudi_p"])
        G = F.mT @ F  # (R, R)
        tr = q * float(G.diagonal().sum()) + _TRACE_FLOOR
        s = 1.0 / tr if normalize else 1.0
        r = ridge_of(tr, eps=hp["eps"], normalize=normalize, eps_mode=hp["eps_mode"], d_in=d_in)
        Kt.append((q * s) * G)  # Σ̃_t = Q_A Kt Q_Aᵀ
        N = Dc[t] if sw.numerator == "centered" else D[t]
        M += N @ Kt[t] + r * N
        K += Kt[t]
        rho += r
    Gsys = K.clone()
    Gsys.diagonal().add_(rho)
    if sw.prior:
        ones = Q_A.sum(dim=0)  # Q_Aᵀ 1 (R,)
        g = K @ ones / d_in
        if flag:
            g = g / (float(energies.mean()) + _ENERGY_FLOOR)
        Gsys += torch.outer(ones, g)
    B_pre = torch.linalg.solve(Gsys, M, left=False)  # (d_out, R): W_bar_pre = B_pre Q_Aᵀ
    info = ACESpanInfo(gamma=gamma, flag=flag, normalized=normalize, span_rank=R)
    B_out = B_pre
    if flag and hp["refine"]:
        k = refined_rank(hp["k_frac"], (d_out, d_in), key)
        if k > 0:
            mean_reg = (K + rho * torch.eye(R, dtype=torch.float64)) / T  # Σ̄_reg = Q_A (.) Q_Aᵀ + rho/T (I - Q_A Q_Aᵀ)
            # Δ_res Q_A: sum_t ΔW_t Σ̃_t - (sum_t ΔW_t) Σ̄_reg in coordinates (the (I - Q Qᵀ) part is 0)
            res = torch.stack([d @ S for d, S in zip(D, Kt)]).sum(0) - torch.stack(D).sum(0) @ mean_reg
            u, S, vh = thin_svd(B_pre + res)  # W_fused = (B_pre + res) Q_Aᵀ
            n = min(k, numerical_rank(S))
            sigma_iso = float(S[:n].sum()) / k
            B_out = B_pre + sigma_iso * (u[:, :n] @ vh[:n])
            info.refined, info.k, info.sigma_iso, info.null_rank = True, k, sigma_iso, k - n
    return LowRankUpdate((hp["scaling"] * B_out).to(dt), Q_A.mT.to(dt)), info


# --------------------------------------------------------------------------- output rank
@_one_thread
def to_rank(update: LowRankUpdate, rank: int) -> Truncation:
    """The best rank-``rank`` factors of ``update`` (Eckart–Young, Eq. (LR.10)): B = Q_b R_b, Aᵀ = Q_a R_a,
    R_b R_aᵀ = u s vh; B' = Q_b u_k diag(s_k), A' = vh_k Q_aᵀ; discarded = sum_{j>k} s_j² / sum_j s_j²."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise InputError(f"to_rank: rank={rank!r} must be an integer >= 0")
    dt = update.B.dtype
    Q_b, R_b = torch.linalg.qr(update.B.double(), mode="reduced")
    Q_a, R_a = torch.linalg.qr(update.A.double().mT, mode="reduced")
    u, s, vh = torch.linalg.svd(R_b @ R_a.mT, full_matrices=False)
    total = float(s.square().sum())
    kept = min(rank, s.numel())
    discarded = 0.0 if total == 0 else float(s[kept:].square().sum()) / total
    return Truncation(LowRankUpdate((Q_b @ (u[:, :kept] * s[:kept])).to(dt), (vh[:kept] @ Q_a.mT).to(dt)), s,
                      discarded)


# --------------------------------------------------------------------------- one key of a registered method
#: The registered methods with a form in the factors' span (the functions above).
LOWRANK_METHODS = ("task_arithmetic", "weight_averaging", "tsv_m", "iso_c", "iso_cts", "ace")


def lowrank_form(method: str, hparams: Mapping[str, Any]) -> str | None:
    """``None`` when ``method`` with the resolved ``hparams`` has a form in the span (:func:`lowrank_update`),
    else why not, in words (docs/methods.md §Low-rank updates)."""
    if method not in LOWRANK_METHODS:
        return f"{method} has no form in the factors' span (those with one: {', '.join(LOWRANK_METHODS)})"
    if method == "ace" and hparams.get("estimator") not in ("ace", "wudi"):
        return f"ace with estimator={hparams.get('estimator')!r} has none (only 'ace' and 'wudi')"
    if method == "ace" and not float(hparams.get("eps", 0.0)) > 0:
        return "ace with eps=0 has none (the ridge makes the solve exact in the span)"
    return None


def lowrank_update(method: str, factors: Sequence[tuple[Tensor, Tensor]], hparams: Mapping[str, Any], *,
                   is_matrix: bool = True, key: str = "") -> LowRankUpdate:
    """The merged update of one key by the registered ``method`` (resolved ``hparams``, as ``merge()`` takes them)
    from each task's factors (B_t, A_t) (d_out x d_in orientation): the method's function above on a matrix key,
    on the others the mean times ``alpha`` / ``scaling``, as the method does there (docs/methods.md §Low-rank
    updates). An error where :func:`lowrank_form` says there is no such form."""
    why = lowrank_form(method, hparams)
    if why is not None:
        raise InputError(f"{_where(key)}{why}; merge the folded task vectors (lowrank='never')")
    if method == "task_arithmetic":
        return task_arithmetic_lowrank(factors, lam=hparams.get("lam"), weights=hparams.get("weights"), key=key)
    if method == "weight_averaging":
        return weight_averaging_lowrank(factors, weights=hparams.get("weights"), key=key)
    coef = float(hparams["scaling"] if method == "ace" else hparams["alpha"])
    if not is_matrix:  # matrix_or_mean / ace_with_diagnostics: the mean on the keys off the matrix path
        mean = weight_averaging_lowrank(factors, key=key)
        return LowRankUpdate(coef * mean.B, mean.A)
    if method == "tsv_m":
        return tsv_m_lowrank(factors, alpha=coef, key=key)
    if method == "iso_c":
        return iso_c_lowrank(factors, alpha=coef, key=key)
    if method == "iso_cts":
        return iso_cts_lowrank(factors, alpha=coef, common_fraction=float(hparams["common_fraction"]), key=key)
    hp = {k: v for k, v in hparams.items() if k != "covariances"}
    return ace_lowrank(factors, key=key, **hp)[0]
