"""The SVD family: TSV-M, Iso-C, Iso-CTS and CART (docs/methods.md §TSV-M, §Iso-C, §Iso-CTS, §CART).

Each method is a per-matrix helper (the T task vectors of one matrix in, the merged update out,
without ``alpha``) plus a registered state-dict function; the rank rules are public. For float32
inputs the top-k triplets and polar factors go through the float64 Gram where the spectrum allows
(docs/performance.md, TSV-M and Iso); all-zero task vectors give exactly zero.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import InputError, InputTypeError
from ._registry import ALPHA_GRID, Param, Search, register
from .averaging import matrix_or_mean, warn_mean_fallback
from .inputs import check_task_vectors
from .linalg import (
    GRAM_MAX_RATIO,
    _gram_lower,
    gram_polar,
    polar,
    spread_ok,
    sym_eig,
    syrk_lower_,
    thin_svd,
    top_svd,
)

__all__ = [
    "stack_taus",
    "tsv_rank",
    "tsv_merge_matrix",
    "iso_c_matrix",
    "iso_cts_ranks",
    "iso_cts_matrix",
    "CART_TARGET_WORDS",
    "CART_EXCLUDE_WORDS",
    "is_cart_key",
    "cart_rank",
    "low_rank",
    "cart_matrix",
    "tsv_m",
    "iso_c",
    "iso_cts",
    "cart",
]


# --------------------------------------------------------------------------- helpers
def _where(key: str) -> str:
    return f"key {key!r}: " if key else ""


def stack_taus(taus: Sequence[Tensor] | Tensor, key: str = "") -> Tensor:
    """The task vectors of one matrix as a ``T x d_out x d_in`` floating tensor (a new view/copy); errors name
    ``key``."""
    if isinstance(taus, Tensor):
        X = taus
        if X.ndim != 3:
            raise InputError(
                f"{_where(key)}expected a T x d_out x d_in stack of task vectors, got shape {tuple(X.shape)}"
            )
    else:
        taus = check_task_vectors(list(taus), key)
        if not any(bool(tau.any()) for tau in taus):
            # all zero (e.g. CLIP's 49408 x 512 text token_embedding): a zero-stride view, no copy
            X = taus[0].new_zeros(()).expand(len(taus), *taus[0].shape)
        else:
            X = torch.stack(taus)
    if X.shape[0] == 0:
        raise InputError(f"{_where(key)}no task vectors given: pass at least one")
    if not X.is_floating_point():
        raise InputTypeError(f"{_where(key)}task vectors must be floating point, got {X.dtype}")
    if X.dtype not in (torch.float32, torch.float64):  # SVD needs float32/64
        X = X.float()
    return X


def _gram_ok(X: Tensor) -> bool:
    """The Gram routes serve float32 (and lower) inputs; float64 inputs keep the float64 SVD."""
    return X.dtype != torch.float64


def _side_by_side(triplets: Sequence[tuple[Tensor, Tensor, Tensor]], dtype: torch.dtype
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Triplets ``(U_i, S_i, Vh_i)`` concatenated in order, in ``dtype``: U_cat = [U_1 | U_2 | ...], s_cat, V_cat
    = [Vh_1; Vh_2; ...]."""
    Us, Ss, Vhs = zip(*triplets)
    return (torch.cat([U.to(dtype) for U in Us], dim=1), torch.cat([S.to(dtype) for S in Ss]),
            torch.cat([Vh.to(dtype) for Vh in Vhs], dim=0))


def _polar(M: Tensor, gram: bool) -> Tensor:
    """Polar factor on the cheapest exact route (``gram``: float64 Gram where conditioning allows, else the SVD)."""
    if gram:
        out = gram_polar(M)
        if out is not None:
            return out[0]
    return polar(M)


# --------------------------------------------------------------------------- TSV-M (docs/methods.md §TSV-M)
def tsv_rank(r: int, n_tasks: int) -> int:
    """Per-task rank budget of TSV-M, ``int(r * (1.0 / n_tasks))`` as the official code (docs/methods.md
    §TSV-M, Eq. (TSV-M.1)): r // T for every CLIP shape, one less in floating point for r = T = 49."""
    if n_tasks < 1:
        raise InputError(f"n_tasks must be >= 1, got {n_tasks}")
    return int(r * (1.0 / n_tasks))


def tsv_merge_matrix(taus: Sequence[Tensor] | Tensor, *, key: str = "") -> Tensor:
    """TSV-M for one matrix: polar(U_cat) diag(s_cat) polar(V_cat) (docs/methods.md §TSV-M; k =
    :func:`tsv_rank`; zero with a warning when k = 0). Also ESM's for its non-ESD matrices."""
    X = stack_taus(taus, key)
    T, d_out, d_in = X.shape
    r = min(d_out, d_in)
    k = tsv_rank(r, T)
    if not X.any():
        return X.new_zeros(d_out, d_in)
    if k == 0:
        warnings.warn(
            f"TSV-M {_where(key)}per-task rank int({r} * 1/{T}) = 0 because min(d_out, d_in) < n_tasks; "
            "the merged update of this matrix is zero (as in the official code)",
            RuntimeWarning,
            stacklevel=2,
        )
        return X.new_zeros(d_out, d_in)
    # only the T k filled slots: the zero tail of U_cat / V_cat meets zero singular values, so
    # it drops out of polar(U_cat) diag(s_cat) polar(V_cat) (and the Gram route needs full rank)
    gram = _gram_ok(X)
    U_cat, s_cat, V_cat = _side_by_side([top_svd(X[t], k, gram=gram) for t in range(T)],
                                        torch.float64 if gram else X.dtype)  # (d_out, T k), (T k,), (T k, d_in)
    return ((_polar(U_cat, gram) * s_cat) @ _polar(V_cat, gram)).to(X.dtype)


# --------------------------------------------------------------------------- Iso-C (docs/methods.md §Iso-C)
def iso_c_matrix(taus: Sequence[Tensor] | Tensor, *, key: str = "") -> Tensor:
    """Iso-C for one matrix: mean(S) U V^T with U S V^T = sum_t tau_t (docs/methods.md §Iso-C, Eq. (Iso-C.1))."""
    X = stack_taus(taus, key)
    D = X.sum(0)
    if not D.any():
        return torch.zeros_like(D)
    if _gram_ok(D):
        out = gram_polar(D)
        if out is not None:
            return (out[1].mean() * out[0]).to(D.dtype)
    U, S, Vh = thin_svd(D)
    return S.mean() * (U @ Vh)


# --------------------------------------------------------------------------- Iso-CTS (docs/methods.md §Iso-CTS)
def iso_cts_ranks(r: int, n_tasks: int, common_fraction: float = 0.8) -> tuple[int, int]:
    """Iso-CTS rank split ``(k_c, s)``, k_c + T s = r: docs/methods.md §Iso-CTS, Eq. (Iso-CTS.1) (Python's
    round, as the official code); an error when r is too small for T tasks at this fraction."""
    if n_tasks < 1:
        raise InputError(f"n_tasks must be >= 1, got {n_tasks}")
    if not 0.0 <= common_fraction <= 1.0:
        raise InputError(f"common_fraction must lie in [0, 1], got {common_fraction}")
    k_c = int(r * common_fraction)
    m = round((r - k_c) / n_tasks) * n_tasks
    k_c = r - m
    if k_c < 0:
        raise InputError(
            f"Iso-CTS rank split failed: r={r}, n_tasks={n_tasks}, common_fraction={common_fraction} "
            f"gives a task-specific budget of {m} > r; raise common_fraction or merge fewer tasks"
        )
    return k_c, m // n_tasks


def iso_cts_matrix(taus: Sequence[Tensor] | Tensor, common_fraction: float = 0.8, *, key: str = "") -> Tensor:
    """Iso-CTS for one matrix: sigma_bar polar(U) polar(V) (docs/methods.md §Iso-CTS; :func:`iso_cts_ranks`)."""
    X = stack_taus(taus, key)
    T, d_out, d_in = X.shape
    r = min(d_out, d_in)
    try:
        k_c, s = iso_cts_ranks(r, T, common_fraction)
    except ValueError as e:
        raise InputError(f"{_where(key)}{e}") from None
    if not X.any():
        return X.new_zeros(d_out, d_in)
    gram = _gram_ok(X)
    common_gram = gram  # the common subspace's Gram route; off once _iso_cts_gram found it refused
    if gram and k_c > 0 and s > 0:
        out = _iso_cts_gram(X, k_c, s)
        if out is not None:
            return out.to(X.dtype)
        common_gram = False  # the same spread check on the same Gram refused: take the SVD directly
    work = torch.float64 if gram else X.dtype
    U_c, S_c, V_c = top_svd(X.sum(0), k_c, gram=common_gram) if k_c > 0 else (
        X.new_zeros(d_out, 0), X.new_zeros(0), X.new_zeros(0, d_in))
    U_c, S_c, V_c = U_c.to(work), S_c.to(work), V_c.to(work)
    residuals = (Xt - U_c @ (U_c.T @ Xt) for Xt in (X[t].to(work) for t in range(T)))  # one task at a time
    tops = [top_svd(R, s, gram=gram) for R in residuals] if s > 0 else []
    U_all, s_all, V_all = _side_by_side([*tops, (U_c, S_c, V_c)], work)  # (d_out, r), (r,), (r, d_in)
    return (s_all.mean() * (_polar(U_all, gram) @ _polar(V_all, gram))).to(X.dtype)


def _iso_cts_gram(X: Tensor, k_c: int, s: int) -> Tensor | None:
    """:func:`iso_cts_matrix` for float32 inputs in float64 (docs/performance.md §Iso-CTS on float32 inputs);
    ``None`` where sigma_1 / sigma_k_c of the summed task vector > ``GRAM_MAX_RATIO`` (the generic path)."""
    T, d_out, d_in = X.shape
    n = T * s
    D = X.sum(0).double()
    wide = d_out <= d_in
    lam, Q = sym_eig(_gram_lower(D, wide), overwrite=True)  # every eigenpair: k_c > r/4 needs the full driver
    S = lam.clamp_min(0).sqrt()
    if not spread_ok(S, k_c - 1):
        return None
    S_c = S[:k_c]
    if wide:
        U_c, U_perp = Q[:, :k_c], Q[:, k_c:k_c + n]
        V_c = (U_c.mT @ D) / S_c[:, None]
    else:
        V_c = Q[:, :k_c].mT
        U_c = (D @ Q[:, :k_c]) / S_c
    del D, Q
    tops = []
    for t in range(T):
        Xt = X[t].double()
        if wide:
            A, St, Vht = top_svd(U_perp.mT @ Xt, s, gram=True)
            tops.append((U_perp @ A, St, Vht))
        else:
            top = _tall_residual_top(Xt, U_c, s)
            tops.append(top if top is not None else top_svd(Xt - U_c @ (U_c.mT @ Xt), s, gram=True))
    # U_tasks (d_out, n) holds the task columns only: the common ones enter below as U_c @ PV[n:]
    U_tasks, s_all, V_all = _side_by_side([*tops, (U_c[:, :0], S_c, V_c)], torch.float64)
    PV = _polar(V_all, True)
    return s_all.mean() * torch.addmm(U_c @ PV[n:], _polar(U_tasks, True), PV[:n])


def _tall_residual_top(Xt: Tensor, U_c: Tensor, s: int) -> tuple[Tensor, Tensor, Tensor] | None:
    """Top-``s`` triplets of R = (I - U_c U_cᵀ) Xt for tall float64 ``Xt`` from Rᵀ R = Xtᵀ Xt - Yᵀ Y, Y = U_cᵀ Xt;
    ``None`` where ||Xt||_F > ``GRAM_MAX_RATIO`` sigma_s(R) or sigma_s(R) = 0."""
    Y = U_c.mT @ Xt
    G = _gram_lower(Xt, False)
    fro2 = float(G.diagonal().sum())
    syrk_lower_(G, Y, alpha=-1.0)
    lam, Q = sym_eig(G, top=s, overwrite=True)
    S = lam.clamp_min(0).sqrt()
    if not bool(S[s - 1] > 0) or fro2 > (GRAM_MAX_RATIO * float(S[s - 1])) ** 2:
        return None
    return (Xt @ Q - U_c @ (Y @ Q)) / S, S, Q.mT


# --------------------------------------------------------------------------- CART (docs/methods.md §CART)
#: CART's low-rank keys contain one of these words ...
CART_TARGET_WORDS = ("attn", "mlp")
#: ... and none of these (docs/methods.md §CART: the open_clip block Linear weights).
CART_EXCLUDE_WORDS = ("ln", "bias")


def is_cart_key(key: str) -> bool:
    """CART's name rule: ``"attn"`` or ``"mlp"`` in the key, and neither ``"ln"`` nor ``"bias"``."""
    return any(w in key for w in CART_TARGET_WORDS) and not any(w in key for w in CART_EXCLUDE_WORDS)


def cart_rank(r: int, rank_ratio: float) -> int:
    """CART's rank, k = max(1, int(rank_ratio * r)) (docs/methods.md §CART)."""
    return max(1, int(rank_ratio * r))


def low_rank(M: Tensor, k: int) -> Tensor:
    """LR_k(M): the best rank-k approximation U_k diag(S_k) V_k^T of a matrix (thin SVD)."""
    if not M.any():
        return torch.zeros_like(M)
    U, S, Vh = thin_svd(M)
    return (U[:, :k] * S[:k]) @ Vh[:k, :]


def cart_matrix(
    taus: Sequence[Tensor] | Tensor, rank_ratio: float = 0.12, lam: float = 2.0, *, key: str = ""
) -> Tensor:
    """CART for one matrix: mean_t tau_t + lam sum_t LR_k(tau_t - mean_i tau_i), k = :func:`cart_rank`
    (docs/methods.md §CART)."""
    X = stack_taus(taus, key)
    T, d_out, d_in = X.shape
    k = cart_rank(min(d_out, d_in), rank_ratio)
    if not X.any():
        return X.new_zeros(d_out, d_in)
    mean = X.mean(0)
    C = X - mean
    low = torch.zeros_like(mean)
    for t in range(T):
        low += low_rank(C[t], k)
    return mean + lam * low


# --------------------------------------------------------------------------- registered methods
#: What TSV-M, Iso-C and Iso-CTS declare alike: merged key by key on their matrix path, alpha on every key
#: chosen on validation over ALPHA_GRID (docs/methods.md §Benchmark protocol).
_ALPHA_ON_A_GRID: dict = {"key_scope": "key", "needs_layout": True, "search": Search("alpha", "grid", ALPHA_GRID),
                          "alpha": Param("coefficient on every key, matrices and means alike (grid 0.1..3.0 "
                                         "in the paper code)", low=0.0)}


@register("tsv_m", "TSV-M: per-task top-(r/T) singular triplets, orthogonalised by polar "
          "(Gargiulo et al. 2025; docs/methods.md §TSV-M)", **_ALPHA_ON_A_GRID)
def tsv_m(base, task_vectors, *, is_matrix, alpha=1.0):
    """TSV-M (docs/methods.md §TSV-M): :func:`tsv_merge_matrix` on matrix keys, the mean on the rest, times alpha."""
    return matrix_or_mean("tsv_m", base, task_vectors, is_matrix, lambda taus, k: tsv_merge_matrix(taus, key=k),
                          "TSV-M", alpha=alpha)


@register("iso_c", "Iso-C: the summed task vector with a flat (isotropic) spectrum (Marczak et al. 2025; "
          "docs/methods.md §Iso-C)", **_ALPHA_ON_A_GRID)
def iso_c(base, task_vectors, *, is_matrix, alpha=1.0):
    """Iso-C (docs/methods.md §Iso-C): :func:`iso_c_matrix` on matrix keys, the mean on the rest, times alpha."""
    return matrix_or_mean("iso_c", base, task_vectors, is_matrix, lambda taus, k: iso_c_matrix(taus, key=k), "Iso-C",
                          alpha=alpha)


@register(
    "iso_cts",
    "Iso-CTS: common + task-specific subspaces with a flat spectrum (Marczak et al. 2025; docs/methods.md §Iso-CTS)",
    **_ALPHA_ON_A_GRID,
    common_fraction=Param("fraction of the rank given to the common subspace before the T-divisibility adjustment",
                          low=0.0, high=1.0),
)
def iso_cts(base, task_vectors, *, is_matrix, alpha=1.0, common_fraction=0.8):
    """Iso-CTS (docs/methods.md §Iso-CTS): :func:`iso_cts_matrix` on matrix keys, the mean on the rest, times alpha."""
    return matrix_or_mean("iso_cts", base, task_vectors, is_matrix,
                          lambda taus, k: iso_cts_matrix(taus, common_fraction, key=k), "Iso-CTS", alpha=alpha)


@register(
    "cart",
    "CART: weight average plus low-rank centred task vectors (Choi et al. 2024; docs/methods.md §CART)",
    key_scope="key", needs_layout=True, search=Search("lam", "grid", ALPHA_GRID),
    rank_ratio=Param("rank of each centred vector as a fraction of min(d_out, d_in); "
                     "k = max(1, int(rank_ratio r))",
                     low=0.0, high=1.0, low_open=True),
    lam=Param("coefficient of the summed low-rank centred vectors", low=0.0),
    targets=Param("which matrices take the low-rank path: 'names' = the official rule (attn/mlp in the "
                  "key, not ln/bias: open_clip's block weights); 'blocks' = every matrix inside a transformer "
                  "block (the same keys on open_clip, and BERT's, GPT-2's or LLaMA's block weights, whose names "
                  "the official rule misses)", choices=("names", "blocks")),
)
def cart(base, task_vectors, *, is_matrix, rank_ratio=0.12, lam=2.0, targets="names"):
    """CART (docs/methods.md §CART): :func:`cart_matrix` on the matrix keys :func:`is_cart_key` selects (with
    ``targets="blocks"``: every key inside a transformer block); every other key ends at the average."""
    from ..keys import block_index

    def low_rank_key(key: str) -> bool:
        return is_cart_key(key) if targets == "names" else block_index(key) is not None

    missed = [k for k in base if is_matrix(k, base[k]) and block_index(k) is not None and not low_rank_key(k)]
    warn_mean_fallback("cart", missed, "names without 'attn'/'mlp' (CART's name rule; targets='blocks' takes every "
                       "block matrix) inside the blocks")
    return matrix_or_mean("cart", base, task_vectors, lambda k, w: low_rank_key(k) and is_matrix(k, w),
                          lambda taus, k: cart_matrix(taus, rank_ratio, lam, key=k), "CART")
