"""Linear algebra shared by the merge methods: polar factor, safe solves, input checks.

Beside the plain LAPACK routes (:func:`thin_svd`, :func:`polar`, :func:`solve_right`), the cheaper
*exact* routes the methods take where the numerics allow (docs/performance.md): the float64 Gram of
the smaller side (:func:`gram_top_svd`, :func:`gram_polar`, :func:`gram_polar_times`, each checked
against ``GRAM_MAX_RATIO``), Cholesky with Sherman–Morrison (:func:`solve_spd_rank_one`) and ESM's
cheapest Step A (:func:`top_shift_factors`); ACE's one pass over the tasks is ACE's own
(:func:`acetools.merging.ace.task_sums`). Singularity is decided from a measured condition number
against ``RCOND_MIN``, never from whether LAPACK raises (docs/methods.md §Numerics).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError, InputTypeError

__all__ = [
    "thin_svd", "polar", "solve_right", "top_svd", "check_square", "check_psd",
    "GRAM_MAX_RATIO", "sym_eig", "gram_top_svd", "gram_polar", "gram_polar_times",
    "solve_spd_rank_one", "syrk_lower_", "symmetrize_lower_", "spread_ok", "gram_spectrum", "RCOND_MIN",
    "rcond_estimate", "cholesky_rcond", "polar_rank", "SHIFT_RANK_RTOL", "shift_rank", "top_shift_factors",
]

#: Largest sigma_1 / sigma_j a float64 Gram route accepts: its relative error ~1e-16 (sigma_1/sigma_j)^2
#: stays below the float32 SVD's ~1e-7 (docs/performance.md, TSV-M and Iso).
GRAM_MAX_RATIO = 1e4


def thin_svd(M: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD ``M = U diag(S) Vh``; a wide matrix through its transpose (faster on the CPU: 768 x 3072,
    float32, one thread: 0.9 s instead of 2.2 s)."""
    if M.shape[-2] < M.shape[-1]:
        U, S, Vh = torch.linalg.svd(M.mT, full_matrices=False)
        return Vh.mT, S, U.mT
    return torch.linalg.svd(M, full_matrices=False)


def polar(M: Tensor) -> Tensor:
    """Orthogonal polar factor P Q^T of ``M = P S Q^T`` (thin SVD): the closest matrix with orthonormal
    rows or columns (docs/methods.md §Notation)."""
    U, _, Vh = thin_svd(M)
    return U @ Vh


def top_svd(M: Tensor, k: int, *, gram: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """The top-``k`` singular triplets ``(U_k, S_k, Vh_k)`` of ``M``: with ``gram``, in float64 through the
    Gram of the smaller side where sigma_1 / sigma_k allows it (:func:`gram_top_svd`), else the thin SVD."""
    if gram and 0 < k <= min(M.shape):
        top = gram_top_svd(M, k)
        if top is not None:
            return top
    U, S, Vh = thin_svd(M)
    return U[..., :, :k], S[..., :k], Vh[..., :k, :]


#: Smallest reciprocal condition number (1-norm, :func:`rcond_estimate`) at which a solve or factorisation
#: is trusted; below it the pseudo-inverse (docs/methods.md §Numerics).
RCOND_MIN = 1e-10


def _rcond_from_solves(solve: Any, solve_t: Any, n: int, like: Tensor, norm1: float) -> float:
    """``1 / (norm1 ||A^-1||_1)``, ``||A^-1||_1`` estimated from below by a few solves ``solve(x) = A^-1 x``,
    ``solve_t(x) = A^-T x`` (Hager 1984; Higham 1988, Alg. 4.1, as LAPACK's ``xLACON``): at most 5 iterations
    plus Higham's alternative vector, deterministic; 0 where a solve is not finite."""
    x = like.new_full((n, 1), 1.0 / n)
    est = 0.0
    j_old = -1
    for it in range(5):
        y = solve(x)
        if not bool(torch.isfinite(y).all()):
            return 0.0
        new = float(y.abs().sum())
        if it > 0 and new <= est:
            break
        est = new
        xi = torch.where(y >= 0, 1.0, -1.0).to(like.dtype)
        z = solve_t(xi)
        if not bool(torch.isfinite(z).all()):
            return 0.0
        j = int(z.abs().argmax())
        if it > 0 and (j == j_old or float(z.abs().max()) <= float((z * x).sum())):
            break
        j_old = j
        x = like.new_zeros((n, 1))
        x[j] = 1.0
    i = torch.arange(n, dtype=like.dtype, device=like.device)
    b = ((-1.0) ** i * (1.0 + i / max(n - 1, 1))).reshape(n, 1)
    yb = solve(b)
    if not bool(torch.isfinite(yb).all()):
        return 0.0
    inv = max(est, 2.0 * float(yb.abs().sum()) / (3.0 * n))
    return 0.0 if inv == 0.0 else 1.0 / (norm1 * inv)


def rcond_estimate(A: Tensor, factor: tuple[Tensor, Tensor] | None = None) -> float:
    """Estimated ``1 / (||A||_1 ||A^-1||_1)`` of a square ``A`` from its LU factorisation (``factor``, computed
    here if not given), like LAPACK's ``xGECON``; 0 for a zero pivot or a non-finite ``A``."""
    n = A.shape[-1]
    if n == 0:
        return 1.0
    if not bool(torch.isfinite(A).all()):
        return 0.0
    norm1 = float(torch.linalg.matrix_norm(A, ord=1))
    if norm1 == 0.0:
        return 0.0
    if factor is None:
        LU, piv, info = torch.linalg.lu_factor_ex(A)
        if int(info) != 0:
            return 0.0
    else:
        LU, piv = factor
    if not bool(LU.diagonal().ne(0).all()):
        return 0.0
    return _rcond_from_solves(lambda x: torch.linalg.lu_solve(LU, piv, x),
                              lambda x: torch.linalg.lu_solve(LU, piv, x, adjoint=True), n, A, norm1)


def cholesky_rcond(L: Tensor, norm1: float) -> float:
    """Estimated reciprocal condition number of an SPD ``A`` from its Cholesky factor ``L`` and
    ``norm1 = ||A||_1`` (like ``xPOCON``): the pivot ratio ``(min L_ii / max L_ii)²`` where it is below
    ``RCOND_MIN`` (a proof), else the 1-norm estimate."""
    n = L.shape[-1]
    if n == 0:
        return 1.0
    d = L.diagonal().abs()
    dmax = float(d.max())
    if not math.isfinite(dmax) or dmax == 0.0 or not norm1 > 0:
        return 0.0
    pivot_ratio = (float(d.min()) / dmax) ** 2
    if pivot_ratio < RCOND_MIN:
        return pivot_ratio
    return _rcond_from_solves(lambda x: torch.cholesky_solve(x, L), lambda x: torch.cholesky_solve(x, L), n, L, norm1)


def _warn_singular(name: str, what: str, rcond: float, stacklevel: int) -> None:
    warnings.warn(
        f"matrix for layer {name!r} is singular or ill-conditioned (estimated rcond {rcond:.2g} < "
        f"{RCOND_MIN:g}); {what}",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )


def solve_right(B: Tensor, A: Tensor, *, name: str = "") -> Tensor:
    """``B @ inv(A)`` as an LU solve where :func:`rcond_estimate` >= ``RCOND_MIN`` and the result is finite;
    else ``B @ pinv(A)`` (singular values below ``RCOND_MIN · sigma_1`` dropped) with a ``RuntimeWarning``
    naming the layer ``name`` (docs/methods.md §Numerics)."""
    rcond = 0.0
    if A.shape[-1] > 0 and bool(torch.isfinite(A).all()):
        LU, piv, info = torch.linalg.lu_factor_ex(A)
        if int(info) == 0:
            rcond = rcond_estimate(A, (LU, piv))
            if rcond >= RCOND_MIN:
                X = torch.linalg.lu_solve(LU, piv, B, left=False)
                if bool(torch.isfinite(X).all()):
                    return X
    elif A.shape[-1] == 0:
        return B.new_zeros(B.shape)
    _warn_singular(name, "using the pseudo-inverse", rcond, stacklevel=2)
    return B @ torch.linalg.pinv(A, rtol=RCOND_MIN)


def check_psd(S: Tensor, where: str, rtol: float | None = None) -> None:
    """Raise (naming ``where``) unless ``S`` is symmetric PSD within ``rtol`` (default 1e-6 for float64, 1e-4
    below): ||S - S^T||_F <= rtol ||S||_F and S + rtol max|diag S| I has a float64 Cholesky factor."""
    if rtol is None:
        rtol = 1e-6 if S.dtype == torch.float64 else 1e-4
    S64 = S.detach().to(torch.float64)
    scale = float(torch.linalg.norm(S64))
    if scale == 0.0:
        return
    asym = float(torch.linalg.norm(S64 - S64.mT))
    if asym > rtol * scale:
        raise InputError(
            f"{where} is not symmetric: ||S - S^T||_F / ||S||_F = {asym / scale:.3g} > {rtol:g}; a covariance or "
            "Gram matrix is symmetric (symmetrise it with (S + S.T) / 2 if the asymmetry is rounding)"
        )
    Ssym = (S64 + S64.mT) / 2
    shift = rtol * float(Ssym.diagonal().abs().max())
    eye = torch.eye(S64.shape[-1], dtype=torch.float64, device=S64.device)
    _, info = torch.linalg.cholesky_ex(Ssym + max(shift, torch.finfo(torch.float64).tiny) * eye)
    if int(info) != 0:
        lam = torch.linalg.eigvalsh(Ssym)
        raise InputError(
            f"{where} is not positive semi-definite: its smallest eigenvalue is {float(lam[0]):.4g} "
            f"(largest {float(lam[-1]):.4g}); a covariance or Gram matrix has no negative eigenvalues "
            "(a negative one flips that expert's update along its eigenvector)"
        )


def check_square(S: Any, d_in: int, where: str, hint: str = "") -> None:
    """Validate one user-given d_in x d_in matrix (a covariance or Gram): a finite floating Tensor of that
    shape, symmetric PSD (:func:`check_psd`). ``where`` names it in the error, e.g.
    ``"ace: covariances[2]['blocks.0.mlp.c_fc.weight']"``; ``hint`` is appended to the shape error."""
    if not isinstance(S, Tensor):
        raise InputTypeError(f"{where} is a {type(S).__name__}, not a torch.Tensor")
    if tuple(S.shape) != (d_in, d_in):
        raise InputError(f"{where} has shape {tuple(S.shape)}; it must be d_in x d_in = {d_in} x {d_in}{hint}")
    if not S.is_floating_point():
        raise InputTypeError(f"{where} has dtype {S.dtype}; it must be floating point")
    if not torch.isfinite(S).all():
        raise InputError(f"{where} contains NaN or Inf")
    check_psd(S, where)


def spread_ok(S: Tensor, j: int, max_ratio: float = GRAM_MAX_RATIO) -> bool:
    """Whether a Gram route may use the singular values ``S`` (descending) down to ``S[j]``:
    ``S[j] > 0`` and ``S[0] <= max_ratio * S[j]``."""
    return bool(S[j] > 0) and not bool(S[0] > max_ratio * S[j])


def _gram_lower(M64: Tensor, wide: bool) -> Tensor:
    """The Gram of ``M64``'s smaller side, lower triangle only (blocked SYRK; eigh reads only it)."""
    n = M64.shape[-2] if wide else M64.shape[-1]
    return syrk_lower_(M64.new_zeros(n, n), M64.mT if wide else M64)


_SUBSET_MAX_FRACTION = 0.25  # :func:`sym_eig` takes LAPACK's subset driver for at most this share of the spectrum

#: :func:`sym_eig` runs SciPy's LAPACK on one thread up to this size (docs/performance.md §One OpenBLAS
#: thread for small eigenproblems).
_ONE_THREAD_MAX_N = 1024
_OPENBLAS: Any = None  # threadpoolctl's controller over the loaded OpenBLAS libraries, once found


def _blas_threads_for(n: int) -> Any:
    """A context manager holding SciPy's OpenBLAS to one thread for an ``n x n`` eigenproblem
    (``n <= _ONE_THREAD_MAX_N``); a no-op for larger ones."""
    global _OPENBLAS
    if n > _ONE_THREAD_MAX_N:
        return contextlib.nullcontext()
    if _OPENBLAS is None:
        from threadpoolctl import ThreadpoolController

        _OPENBLAS = ThreadpoolController().select(internal_api="openblas")
    return _OPENBLAS.limit(limits=1) if _OPENBLAS else contextlib.nullcontext()


def sym_eig(G: Tensor, top: int | None = None, *, overwrite: bool = False) -> tuple[Tensor, Tensor]:
    """Eigenvalues (descending) and eigenvectors of the symmetric ``G`` from its lower triangle.

    ``top``: only the largest ``top`` eigenpairs. On the CPU through SciPy's LAPACK (``syevd``, or
    ``syevr`` for at most a quarter of the spectrum), 2-3x faster than ``torch.linalg.eigh``
    (docs/performance.md, TSV-M and Iso); elsewhere ``torch.linalg.eigh``. ``overwrite``: LAPACK
    may destroy ``G`` (saves an n x n copy).
    """
    n = G.shape[-1]
    if G.device.type == "cpu" and G.ndim == 2 and n > 0:
        import scipy.linalg as sl

        # the transpose of a row-major G is a column-major array LAPACK takes without a copy; its upper
        # triangle is G's lower one
        a = G.detach().numpy().T
        kw = dict(lower=False, overwrite_a=overwrite and G.is_contiguous(), check_finite=False)
        with _blas_threads_for(n):
            if top is not None and top <= n * _SUBSET_MAX_FRACTION:
                lam, Q = sl.eigh(a, driver="evr", subset_by_index=[n - top, n - 1], **kw)
            else:
                lam, Q = sl.eigh(a, driver="evd", **kw)
        if top is not None and lam.shape[0] > top:
            lam, Q = lam[n - top:], Q[:, n - top:]
        lam = torch.from_numpy(lam[::-1].copy()).to(G.dtype)
        return lam, torch.from_numpy(Q[:, ::-1].copy(order="C")).to(G.dtype)
    lam, Q = torch.linalg.eigh(G)
    lam, Q = lam.flip(-1), Q.flip(-1)
    if top is not None:
        lam, Q = lam[..., :top], Q[..., :top]
    return lam, Q


def _gram_eig(M64: Tensor, wide: bool, max_ratio: float, top: int | None = None) -> tuple[Tensor, Tensor] | None:
    """Eigenvectors Q and singular values S of ``M64`` (the ``top`` largest) from its Gram; ``None`` unless the
    smallest passes :func:`spread_ok`."""
    lam, Q = sym_eig(_gram_lower(M64, wide), top=top, overwrite=True)
    S = lam.clamp_min(0).sqrt()
    return None if S.numel() == 0 or not spread_ok(S, -1, max_ratio) else (Q, S)


def gram_top_svd(M: Tensor, k: int, *, max_ratio: float = GRAM_MAX_RATIO) -> tuple[Tensor, Tensor, Tensor] | None:
    """The top-``k`` singular triplets ``(U_k, S_k, Vh_k)`` of ``M`` in float64 through the top-``k``
    eigenpairs of the Gram of its smaller side (sigma = sqrt(lam), the other side's vectors ``Mᵀ q /
    sigma``); ``None`` when sigma_1 / sigma_k > ``max_ratio`` or sigma_k = 0 (take the SVD)."""
    M64 = M.double()
    wide = M64.shape[-2] <= M64.shape[-1]
    if k < 1 or k > min(M64.shape):
        raise InputError(f"gram_top_svd: k={k} must be in 1..{min(M64.shape)}")
    QS = _gram_eig(M64, wide, max_ratio, top=k)  # S[-1] is sigma_k
    if QS is None:
        return None
    Q, S = QS
    if wide:
        return Q, S, (Q.mT @ M64) / S[:, None]
    return (M64 @ Q) / S, S, Q.mT


def gram_polar(M: Tensor, *, max_ratio: float = GRAM_MAX_RATIO) -> tuple[Tensor, Tensor] | None:
    """``(polar(M), S)`` in float64 through the Gram of the smaller side, ``Mᵀ M = Q diag(sigma²) Qᵀ``:
    ``polar(M) = M Q diag(1/sigma) Qᵀ`` (tall; ``Q diag(1/sigma) Qᵀ M`` wide). ``None`` when sigma_1 /
    sigma_min > ``max_ratio`` (a rank-deficient ``M`` included): take the SVD."""
    M64 = M.double()
    wide = M64.shape[-2] < M64.shape[-1]
    QS = _gram_eig(M64, wide, max_ratio)
    if QS is None:
        return None
    Q, S = QS
    W = (Q / S) @ Q.mT  # (M^T M)^(-1/2) or (M M^T)^(-1/2)
    return (W @ M64 if wide else M64 @ W), S


def gram_polar_times(M: Tensor, B: Tensor, *, max_ratio: float = GRAM_MAX_RATIO) -> tuple[Tensor, Tensor] | None:
    """``(polar(M) @ B, S)`` in float64 as :func:`gram_polar` (``None`` where it is), for a tall ``M`` as
    ``M (Q (diag(1/sigma) (Qᵀ B)))`` when ``B`` has fewer columns than ``M`` (the n x n factor never
    formed: ESM's 3072² P_cat times its 3072 x 768 coordinates)."""
    if M.shape[-1] != B.shape[-2]:
        raise InputError(f"gram_polar_times: M is {tuple(M.shape)} but B is {tuple(B.shape)}")
    if M.shape[-2] < M.shape[-1] or B.shape[-1] >= M.shape[-1]:  # the polar factor first
        out = gram_polar(M, max_ratio=max_ratio)
        return None if out is None else (out[0] @ B.double(), out[1])
    M64 = M.double()
    QS = _gram_eig(M64, False, max_ratio)
    if QS is None:
        return None
    Q, S = QS
    return M64 @ (Q @ ((Q.mT @ B.double()) / S[:, None])), S


def solve_spd_rank_one(B: Tensor, M: Tensor, c: Tensor | None = None, *, overwrite: bool = False) -> Tensor | None:
    """``B (M + 1 cᵀ)^-1`` for symmetric positive-definite ``M`` (lower triangle read; ``c = None``: ``B M^-1``):
    Cholesky and Sherman–Morrison, ``Y - (Y 1) zᵀ / (1 + zᵀ 1)`` with ``Y = B M^-1``, ``z = M^-1 c``.
    ``overwrite``: the factor replaces ``M``. ``None`` where the Cholesky fails, :func:`cholesky_rcond` <
    ``RCOND_MIN``, ``|1 + zᵀ 1| < RCOND_MIN (1 + ||z||_1)`` or the result is not finite (docs/methods.md
    §Numerics): the caller falls back to :func:`solve_right`."""
    norm1 = float(torch.linalg.matrix_norm(M, ord=1))  # M's lower triangle is all a Cholesky reads: M symmetric
    if overwrite:
        L, info = torch.linalg.cholesky_ex(M, out=(M, torch.empty((), dtype=torch.int32, device=M.device)))
    else:
        L, info = torch.linalg.cholesky_ex(M)
    if int(info) != 0:
        return None
    if cholesky_rcond(L, norm1) < RCOND_MIN:
        return None
    Y = torch.cholesky_solve(B.mT, L).mT
    if c is not None:
        z = torch.cholesky_solve(c.reshape(-1, 1).to(L.dtype), L).reshape(-1)
        denom = 1.0 + z.sum()
        if not bool(torch.isfinite(denom)) or abs(float(denom)) < RCOND_MIN * (1.0 + float(z.abs().sum())):
            return None
        Y.sub_(torch.outer(Y.sum(dim=1) / denom, z))  # in place: one d_out x d_in buffer fewer
    if not bool(torch.isfinite(Y).all()):
        return None
    return Y


def polar_rank(S: Tensor, dims: tuple[int, int], dtype: torch.dtype) -> int:
    """How many singular values ``S`` (descending) of an ``m x n`` matrix of ``dtype`` are above rounding,
    ``S_j > max(m, n) · eps(dtype) · S_0`` (``torch.linalg.matrix_rank``'s rule)."""
    if S.numel() == 0 or not bool(S[0] > 0):
        return 0
    tol = max(dims) * torch.finfo(dtype).eps * float(S[0])
    return int((S > tol).sum())


_SYRK_BLOCK = 384  # column-block width of :func:`syrk_lower_`: wide enough for full-speed GEMMs


def _blocks(n: int) -> list[tuple[int, int]]:
    nb = max(1, round(n / _SYRK_BLOCK))
    edges = [round(i * n / nb) for i in range(nb + 1)]
    return list(zip(edges[:-1], edges[1:]))


def syrk_lower_(S: Tensor, F: Tensor, alpha: float = 1.0) -> Tensor:
    """``S += alpha Fᵀ F`` on the lower block triangle of ``S`` only (a blocked SYRK: (nb + 1) / (2 nb) of a
    GEMM's flops); the upper blocks are left untouched (see :func:`symmetrize_lower_`)."""
    for lo, hi in _blocks(S.shape[-1]):
        S[lo:, lo:hi].addmm_(F[:, lo:].mT, F[:, lo:hi], alpha=alpha)
    return S


def symmetrize_lower_(S: Tensor) -> Tensor:
    """Copy the lower block triangle of ``S`` onto its upper one, in place (after :func:`syrk_lower_`)."""
    bl = _blocks(S.shape[-1])
    for i, (lo, hi) in enumerate(bl):
        D = S[lo:hi, lo:hi]
        D.copy_(D.tril() + D.tril(-1).mT)
        for lo2, hi2 in bl[i + 1:]:
            S[lo:hi, lo2:hi2] = S[lo2:hi2, lo:hi].mT
    return S


def gram_spectrum(M: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """All singular values (descending) of M and its top-k left/right singular vectors in float32, through
    the smaller Gram (``acetools diagnose``; accurate to ~1e-3 of sigma_1, ample for energy shares)."""
    M = M.to(torch.float32)
    wide = M.shape[0] <= M.shape[1]
    A = M if wide else M.T  # the Gram A Aᵀ of the smaller side
    lam, Q = torch.linalg.eigh(A @ A.T)
    S = lam.flip(0).clamp(min=0).sqrt()
    Qk, Sk = Q.flip(1)[:, :k], S[:k]
    Ok = (A.T @ Qk) / torch.where(Sk > 0, Sk, torch.ones_like(Sk))  # the other side's vectors
    return (S, Qk, Ok) if wide else (S, Ok, Qk)


# --------------------------------------------------------------------------- ESM's Step A

#: A singular value of the activation shift dO = X ΔWᵀ at or below ``SHIFT_RANK_RTOL · sigma_1`` counts as
#: zero: float32 rounding leaves ~6e-8 sqrt(d_in) in place of an exact zero (docs/methods.md §ESM, Step A).
SHIFT_RANK_RTOL = 1e-5


def shift_rank(S: Tensor) -> int:
    """Rank of the activation shift from its singular values ``S`` (descending): how many exceed
    ``SHIFT_RANK_RTOL · S[0]`` (docs/methods.md §ESM, Step A)."""
    if S.numel() == 0 or not bool(S[0] > 0):
        return 0
    return int((S > SHIFT_RANK_RTOL * S[0]).sum())


def top_shift_factors(X: Tensor | None, delta_W: Tensor, k: int, decomposition: str = "esd"
                      ) -> tuple[Tensor, Tensor, Tensor] | None:
    """ESM's Step A on its cheapest exact route (docs/performance.md, ESM): the top ``k`` columns of
    :func:`acetools.merging.esm.essential_subspace`'s ``P``, their ``lam`` and n_t = ||P_tᵀ ΔW_t||_F of the
    *full* coordinates, P and Pᵀ ΔW never formed: the QR-reduced shift R ΔWᵀ (N >= d_in), the float64 Gram
    for float32 inputs, and n_t² = ||ΔW||_F² + ||ΔW[m:]||_F² (m = min(N, d_out); "svd": min(d_out, d_in)).

    Returns ``(P_k, lam_k, n_t)`` in ``delta_W``'s dtype (fewer than k columns where :func:`shift_rank` is
    below k), or ``None`` where the shortcut does not apply (k past the rank bound, X without full column
    rank while P is completed, or a zero shift): the caller then decomposes in full.
    """
    d_out, d_in = delta_W.shape
    gram = delta_W.dtype != torch.float64
    W64 = delta_W.double()
    if decomposition == "esd":
        if X is None:
            raise InputError("esm: the 'esd' decomposition needs the layer's activations X")
        X = X.reshape(-1, d_in)  # (N, d_in)
        n = X.shape[0]
        m = min(n, d_out)
        if k > min(n, d_in, d_out) or (m < d_out and n < d_in):
            return None
        X64 = X.to(delta_W.device, torch.float64)
        if n >= d_in:
            R = torch.linalg.qr(X64, mode="r").R
            r_diag = R.diagonal().abs()
            if m < d_out and not bool(r_diag.min() > 1e-10 * r_diag.max()):
                return None  # X lacks full column rank: the completion's norm would depend on LAPACK's basis
            C = R @ W64.T
        else:
            C = X64 @ W64.T
        scale = max(n - 1, 1)
    else:
        m = min(d_out, d_in)
        if k > m:
            return None
        C, scale = W64.T, 1  # right singular vectors of ΔWᵀ = left ones of ΔW
    top = gram_top_svd(C, k) if gram else None
    if top is not None:
        _, S, Vh_k = top
    else:
        _, S, Vh = thin_svd(C.to(delta_W.dtype) if gram else C)
        S, Vh_k = S[:k].double(), Vh[:k, :].double()
        if not bool(S[0] > 0):
            return None
    r = shift_rank(S)
    S, Vh_k = S[:r], Vh_k[:r]
    norm2 = W64.square().sum() + (W64[m:].square().sum() if m < d_out else 0.0)
    dt = delta_W.dtype
    return Vh_k.mT.to(dt), (S.square() / scale).to(dt), norm2.sqrt().to(dt)
