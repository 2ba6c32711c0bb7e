"""Linear-algebra helpers shared by the merge methods: polar factor, safe solve, input checks.

Besides the plain LAPACK routes (:func:`thin_svd`, :func:`polar`, :func:`solve_right`) this
module holds the cheaper *exact* routes the merge methods take where the numerics allow them
(measured in ``docs/performance.md``):

* :func:`gram_top_svd`, :func:`gram_polar`: top singular triplets and polar factors through the
  eigendecomposition of the smaller float64 Gram matrix. The Gram squares the condition number,
  so each checks the spectrum it needs and falls back to the SVD where float64 would lose more
  than the float32 SVD it replaces (``GRAM_MAX_RATIO``).
* :func:`gram_polar_times`: ``polar(M) @ B`` through the same Gram without forming the square
  polar factor of a tall ``M`` when ``B`` is narrower than ``M`` (ESM's whitening of P_cat).
* :func:`solve_spd_rank_one`: ``B (M + 1 cᵀ)^-1`` for symmetric positive-definite ``M`` by a
  Cholesky factorisation and the Sherman–Morrison formula (one factorisation, half the flops of
  LU); it reports failure so the caller can take the LU route.

Every solve and factorisation decides singularity from a measured quantity, never from whether
LAPACK raises (docs/methods.md §Numerics): :func:`rcond_estimate` (LU) and :func:`cholesky_rcond`
(pivot ratio, then the same 1-norm estimate) against ``RCOND_MIN``; below it :func:`solve_right`
takes :func:`pinv_right` with a warning naming the layer.
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
    "rcond_estimate", "cholesky_rcond", "pinv_right", "polar_rank",
]

#: Largest sigma_1 / sigma_j a float64 Gram route accepts for the singular values it uses.
#: Eigenvalues of the Gram carry an absolute error ~1e-16 sigma_1^2, i.e. a relative error
#: ~1e-16 (sigma_1/sigma_j)^2 on sigma_j: at the limit 1e4 that is 1e-8, below the float32
#: SVD's own ~1e-7 relative error, so the Gram route is never less accurate than the route
#: it replaces for float32 inputs.
GRAM_MAX_RATIO = 1e4


def thin_svd(M: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD ``M = U diag(S) Vh``.

    A wide matrix is decomposed through its (tall) transpose: the same factors up to the
    usual sign ambiguity, and faster on the CPU (768 x 3072, float32, one thread,
    torch 2.14 + MKL: 0.9 s instead of 2.2 s).
    """
    if M.shape[-2] < M.shape[-1]:
        U, S, Vh = torch.linalg.svd(M.mT, full_matrices=False)
        return Vh.mT, S, U.mT
    return torch.linalg.svd(M, full_matrices=False)


def polar(M: Tensor) -> Tensor:
    """Orthogonal polar factor P Q^T of ``M = P S Q^T`` (thin SVD).

    The closest matrix to ``M`` with orthonormal rows or columns (docs/methods.md §Notation: the
    papers' "whitening", "orthogonalization" or "Procrustes"). Invariant to the SVD's
    sign/rotation ambiguity.
    """
    U, _, Vh = thin_svd(M)
    return U @ Vh


def top_svd(M: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The top-``k`` singular triplets ``(U_k, S_k, Vh_k)`` of ``M`` (thin SVD)."""
    U, S, Vh = thin_svd(M)
    return U[..., :, :k], S[..., :k], Vh[..., :k, :]


#: Smallest reciprocal condition number (1-norm, :func:`rcond_estimate`) at which a solve,
#: inverse or Cholesky factorisation of the engine is trusted. A float64 solve has a relative
#: error of about cond · 1.1e-16, so at the limit 1e10 that is 1e-6, the size of the float32
#: rounding of the merged weights: below it the answer no longer depends on the CPU's kernels
#: (MKL's LU on an exactly singular matrix may find a pivot of 1e-16 instead of 0 and return a
#: finite but arbitrary solution). Below it the engine takes the pseudo-inverse with singular
#: values under ``RCOND_MIN · sigma_1`` dropped (docs/methods.md §Numerics).
RCOND_MIN = 1e-10


def _inv_norm1_estimate(solve: Any, solve_t: Any, n: int, like: Tensor) -> float:
    """Lower bound on ``||A^-1||_1`` from a few solves (Hager 1984; Higham 1988, Alg. 4.1, as
    LAPACK's ``xLACON``): ``solve(x) = A^-1 x`` and ``solve_t(x) = A^-T x`` for ``n x 1``
    columns. At most 5 iterations plus Higham's alternative vector; O(n²) per solve, so
    cheap next to the factorisation. Deterministic (no random start)."""
    x = like.new_full((n, 1), 1.0 / n)
    est = 0.0
    j_old = -1
    for it in range(5):
        y = solve(x)
        if not bool(torch.isfinite(y).all()):
            return math.inf
        new = float(y.abs().sum())
        if it > 0 and new <= est:
            break
        est = new
        xi = torch.where(y >= 0, 1.0, -1.0).to(like.dtype)
        z = solve_t(xi)
        if not bool(torch.isfinite(z).all()):
            return math.inf
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
        return math.inf
    return max(est, 2.0 * float(yb.abs().sum()) / (3.0 * n))


def rcond_estimate(A: Tensor, factor: tuple[Tensor, Tensor] | None = None) -> float:
    """Estimated reciprocal condition number ``1 / (||A||_1 ||A^-1||_1)`` of a square ``A``
    from its LU factorisation (``factor = torch.linalg.lu_factor(A)``, computed here if not
    given), like LAPACK's ``xGECON``. 0 for an exactly singular ``A`` (a zero pivot) or a
    non-finite one; never above the true value by more than the estimator's usual factor
    (within 3 in practice, and never below it)."""
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
    inv = _inv_norm1_estimate(lambda x: torch.linalg.lu_solve(LU, piv, x),
                              lambda x: torch.linalg.lu_solve(LU, piv, x, adjoint=True), n, A)
    return 0.0 if inv == math.inf or inv == 0.0 else 1.0 / (norm1 * inv)


def cholesky_rcond(L: Tensor, norm1: float) -> float:
    """Estimated reciprocal condition number of a symmetric positive-definite ``A`` from its
    Cholesky factor ``L`` and ``norm1 = ||A||_1`` (like LAPACK's ``xPOCON``). First the pivot
    ratio ``(min L_ii / max L_ii)²``: every pivot L_ii² lies in [lambda_min, lambda_max], so a
    ratio below ``RCOND_MIN`` proves cond > 1 / RCOND_MIN without a solve; otherwise the 1-norm
    estimate through two triangular solves per step."""
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

    def solve(x: Tensor) -> Tensor:
        return torch.cholesky_solve(x, L)

    inv = _inv_norm1_estimate(solve, solve, n, L)
    return 0.0 if inv == math.inf or inv == 0.0 else 1.0 / (norm1 * inv)


def _warn_singular(name: str, what: str, rcond: float, stacklevel: int) -> None:
    warnings.warn(
        f"matrix for layer {name!r} is singular or ill-conditioned (estimated rcond {rcond:.2g} < "
        f"{RCOND_MIN:g}); {what}",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )


def pinv_right(B: Tensor, A: Tensor) -> Tensor:
    """``B @ pinv(A)`` with singular values below ``RCOND_MIN · sigma_1`` dropped: the fallback
    of :func:`solve_right` (the minimum-norm least-squares solution of ``X A = B``)."""
    return B @ torch.linalg.pinv(A, rtol=RCOND_MIN)


def solve_right(B: Tensor, A: Tensor, *, name: str = "") -> Tensor:
    """``B @ inv(A)`` computed as a solve; falls back to the pseudo-inverse with a warning.

    Singularity is decided from a measured quantity, not from whether LAPACK raises: the LU
    factorisation's estimated reciprocal condition number (:func:`rcond_estimate`) must be at
    least ``RCOND_MIN`` and the solution finite. Otherwise the result is :func:`pinv_right`
    (``B @ pinv(A)``, singular values below ``RCOND_MIN · sigma_1`` dropped) and a
    ``RuntimeWarning`` names the layer (``name``) so a user can see which matrix was singular.
    """
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
    return pinv_right(B, A)


def check_psd(S: Tensor, where: str, rtol: float | None = None) -> None:
    """Raise unless ``S`` is symmetric positive semi-definite within a relative tolerance.

    Symmetric: ||S - S^T||_F <= rtol ||S||_F. PSD: S + rtol * max|diag S| * I has a Cholesky
    factor (float64), i.e. no eigenvalue below -rtol * max|diag S| (the largest eigenvalue of
    a PSD matrix is at least its largest diagonal entry, so this tolerance is relative to the
    spectrum). ``rtol`` defaults to 1e-6 for float64 and 1e-4 for lower precisions (Gram
    matrices summed in float32). One Cholesky costs d^3/3 flops: 0.7 s at d = 3072 on one core.
    The error names ``where`` and the most negative eigenvalue.
    """
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


def check_square(S: Any, d_in: int, where: str, hint: str = "", *, psd: bool = True) -> None:
    """Validate one user-given d_in x d_in matrix (a covariance or Gram): a floating-point
    Tensor of that shape with finite entries, symmetric PSD within tolerance (:func:`check_psd`;
    ``psd=False`` skips that). ``where`` names it in the error, e.g.
    ``"ace: covariances[2]['blocks.0.mlp.c_fc.weight']"`` (expert 2, that key); ``hint`` is
    appended to the shape error."""
    if not isinstance(S, Tensor):
        raise InputTypeError(f"{where} is a {type(S).__name__}, not a torch.Tensor")
    if tuple(S.shape) != (d_in, d_in):
        raise InputError(f"{where} has shape {tuple(S.shape)}; it must be d_in x d_in = {d_in} x {d_in}{hint}")
    if not S.is_floating_point():
        raise InputTypeError(f"{where} has dtype {S.dtype}; it must be floating point")
    if not torch.isfinite(S).all():
        raise InputError(f"{where} contains NaN or Inf")
    if psd:
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

#: :func:`sym_eig` runs SciPy's LAPACK on one thread up to this size. Its symmetric eigensolver
#: gains nothing from a second thread there (768²: 0.41 s for eight subset calls on two threads,
#: 0.42 s on one), while OpenBLAS's idle worker threads keep spinning after each call and take
#: the cores from the PyTorch products that follow: one ViT-B/32 block of TSV-M took 5.7 s with
#: two OpenBLAS threads and 4.0 s with one (docs/performance.md). Larger matrices (ESM's 3072²
#: Gram: 5.4 s on one thread, 2.8 s on two) keep the library's own thread count.
_ONE_THREAD_MAX_N = 1024
_OPENBLAS: Any = None  # threadpoolctl's controller over the loaded OpenBLAS libraries, once found


def _blas_threads_for(n: int) -> Any:
    """A context manager that holds SciPy's OpenBLAS to one thread for an ``n x n`` eigenproblem
    (``n <= _ONE_THREAD_MAX_N``); a no-op for larger ones or where threadpoolctl is missing."""
    global _OPENBLAS
    if n > _ONE_THREAD_MAX_N:
        return contextlib.nullcontext()
    if _OPENBLAS is None:
        try:
            from threadpoolctl import ThreadpoolController

            _OPENBLAS = ThreadpoolController().select(internal_api="openblas")
        except Exception:  # pragma: no cover - threadpoolctl comes with scikit-learn
            _OPENBLAS = False
    return _OPENBLAS.limit(limits=1) if _OPENBLAS else contextlib.nullcontext()


def sym_eig(G: Tensor, top: int | None = None, *, overwrite: bool = False) -> tuple[Tensor, Tensor]:
    """Eigenvalues (descending) and eigenvectors of the symmetric ``G`` from its lower triangle.

    ``top``: only the largest ``top`` eigenpairs. On the CPU this calls LAPACK through SciPy
    (``syevd``, or ``syevr`` for a subset of at most a quarter of the spectrum: for more, the full
    ``syevd`` is faster; 768², one thread: 0.08 s for all against 0.14 s for the top 384 and
    0.05 s for the top 96), 2-3x faster here than ``torch.linalg.eigh`` on the same matrices
    (torch 2.14 + MKL, 2 threads: 0.7 s instead of 2.1 s for a 768² Gram); on other devices
    ``torch.linalg.eigh``. ``overwrite``: LAPACK may destroy ``G`` (a Gram made for this call),
    which saves one n x n copy (72 MiB for ESM's 3072² Gram). Up to n = ``_ONE_THREAD_MAX_N``
    SciPy's OpenBLAS runs on one thread for the call (docs/performance.md §One OpenBLAS thread
    for small eigenproblems).
    """
    n = G.shape[-1]
    if G.device.type == "cpu" and G.ndim == 2 and n > 0:
        try:
            import scipy.linalg as sl
        except ImportError:  # pragma: no cover - scipy is a dependency
            sl = None
        if sl is not None:
            # the transpose of a row-major G is a column-major (Fortran) array LAPACK takes without a
            # copy; its upper triangle is G's lower one
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
            Q = torch.from_numpy(Q[:, ::-1].copy(order="C")).to(G.dtype)
            return lam, Q
    lam, Q = torch.linalg.eigh(G)
    lam, Q = lam.flip(-1), Q.flip(-1)
    if top is not None:
        lam, Q = lam[..., :top], Q[..., :top]
    return lam, Q


def gram_top_svd(M: Tensor, k: int, *, max_ratio: float = GRAM_MAX_RATIO) -> tuple[Tensor, Tensor, Tensor] | None:
    """The top-``k`` singular triplets of ``M`` through the float64 Gram of its smaller side.

    With ``G = M Mᵀ`` (wide ``M``) or ``Mᵀ M`` (tall) and its top-``k`` eigenpairs
    ``G q = lam q`` (:func:`sym_eig`): sigma = sqrt(lam) and the other side's vectors are
    ``Mᵀ q / sigma`` (or ``M q / sigma``). Costs one ``min(m, n)² max(m, n)`` SYRK and a partial
    ``min(m, n)`` eigendecomposition instead of an SVD. Returns ``(U_k, S_k, Vh_k)`` in float64,
    or ``None`` when sigma_1 / sigma_k > ``max_ratio`` (or sigma_k = 0), where the caller must
    take the SVD.
    """
    M64 = M.double()
    wide = M64.shape[-2] <= M64.shape[-1]
    if k < 1 or k > min(M64.shape):
        raise InputError(f"gram_top_svd: k={k} must be in 1..{min(M64.shape)}")
    lam, Q = sym_eig(_gram_lower(M64, wide), top=k, overwrite=True)
    S = lam.clamp_min(0).sqrt()
    if not spread_ok(S, k - 1, max_ratio):
        return None
    if wide:
        return Q, S, (Q.mT @ M64) / S[:, None]
    return (M64 @ Q) / S, S, Q.mT


def gram_polar(M: Tensor, *, max_ratio: float = GRAM_MAX_RATIO) -> tuple[Tensor, Tensor] | None:
    """Polar factor and singular values of ``M`` through the float64 Gram of its smaller side.

    ``polar(M) = M Q diag(1/sigma) Qᵀ`` (tall; ``Q diag(1/sigma) Qᵀ M`` wide) with
    ``Mᵀ M = Q diag(sigma²) Qᵀ``. Returns ``(polar(M), S)`` in float64 or ``None`` when
    ``M`` is too ill-conditioned for the Gram (sigma_1 / sigma_min > ``max_ratio``, including
    rank-deficient ``M``, whose polar factor is not unique); the caller then takes the SVD.
    """
    M64 = M.double()
    wide = M64.shape[-2] < M64.shape[-1]
    lam, Q = sym_eig(_gram_lower(M64, wide), overwrite=True)
    S = lam.clamp_min(0).sqrt()
    if S.numel() == 0 or not spread_ok(S, -1, max_ratio):
        return None
    W = (Q / S) @ Q.mT  # (M^T M)^(-1/2) or (M M^T)^(-1/2)
    return (W @ M64 if wide else M64 @ W), S


def gram_polar_times(M: Tensor, B: Tensor, *, max_ratio: float = GRAM_MAX_RATIO) -> tuple[Tensor, Tensor] | None:
    """``polar(M) @ B`` and the singular values of ``M`` through the float64 Gram of ``M``.

    For tall or square ``M`` (m x n, m >= n) with ``Mᵀ M = Q diag(sigma²) Qᵀ``:
    ``polar(M) @ B = M (Q (diag(1/sigma) (Qᵀ B)))`` when ``B`` (n x p) has fewer columns than
    ``M`` (4 n² p + 2 m n p flops instead of forming the n x n factor, 2 n³ + 2 m n² + 2 m n p:
    ESM's 3072² P_cat times its 3072 x 768 whitened coordinates), else through the formed
    ``(Mᵀ M)^(-1/2)``. A wide ``M`` goes through :func:`gram_polar`. Returns ``(polar(M) @ B, S)``
    in float64, or ``None`` when sigma_1 / sigma_min > ``max_ratio`` or ``M`` is rank-deficient
    (the caller takes the SVD).
    """
    if M.shape[-1] != B.shape[-2]:
        raise InputError(f"gram_polar_times: M is {tuple(M.shape)} but B is {tuple(B.shape)}")
    if M.shape[-2] < M.shape[-1]:
        out = gram_polar(M, max_ratio=max_ratio)
        return None if out is None else (out[0] @ B.double(), out[1])
    M64, B64 = M.double(), B.double()
    lam, Q = sym_eig(_gram_lower(M64, False), overwrite=True)
    S = lam.clamp_min(0).sqrt()
    if S.numel() == 0 or not spread_ok(S, -1, max_ratio):
        return None
    if B64.shape[-1] < M64.shape[-1]:
        return M64 @ (Q @ ((Q.mT @ B64) / S[:, None])), S
    return (M64 @ ((Q / S) @ Q.mT)) @ B64, S


def solve_spd_rank_one(B: Tensor, M: Tensor, c: Tensor | None = None, *, overwrite: bool = False) -> Tensor | None:
    """``B (M + 1 cᵀ)^-1`` for symmetric positive-definite ``M``: Cholesky plus Sherman–Morrison.

    With ``Y = B M^-1`` (two triangular solves against the Cholesky factor) and
    ``z = M^-1 c``: ``B (M + 1 cᵀ)^-1 = Y - (Y 1) zᵀ / (1 + zᵀ 1)``. Only the lower triangle of
    ``M`` is read, so ``M`` must be symmetric. ``c = None`` solves ``B M^-1``. With
    ``overwrite`` the factor replaces ``M`` in place (no second d×d buffer). Returns ``None``
    when the system is not well conditioned, so the caller can fall back to
    :func:`solve_right` (which measures again on the LU route and warns): the Cholesky fails,
    ``M``'s estimated reciprocal condition number (:func:`cholesky_rcond`: pivot ratio, then a
    1-norm estimate) is below ``RCOND_MIN``, the rank-one update's denominator is too small
    (``|1 + zᵀ 1| < RCOND_MIN (1 + ||z||_1)``), or the result is not finite.
    """
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
        Y = Y - torch.outer(Y.sum(dim=1) / denom, z)
    if not bool(torch.isfinite(Y).all()):
        return None
    return Y


def polar_rank(S: Tensor, dims: tuple[int, int], dtype: torch.dtype) -> int:
    """How many singular values ``S`` (descending) of an ``m x n`` matrix of ``dtype`` are
    above rounding: ``S_j > max(m, n) · eps(dtype) · S_0`` (the rule of ``torch.linalg.matrix_rank``).
    Past it the singular vectors, and so an SVD's polar factor, depend on the CPU's kernels."""
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
    """``S += alpha Fᵀ F`` on the lower block triangle of ``S`` only (a blocked SYRK).

    PyTorch has no symmetric rank-k update; computing only the column blocks on and below
    the diagonal does (nb + 1) / (2 nb) of the GEMM's flops (62 % for a 1536-wide Gram,
    56 % for 3072). The strictly upper blocks of ``S`` are left untouched: call
    :func:`symmetrize_lower_` before using ``S`` as a full matrix (a Cholesky factorisation
    reads the lower triangle only).
    """
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
    """All singular values (descending) of M and its top-k left/right singular vectors, in float32:
    the diagnostics' Gram route (``acetools diagnose``), beside :func:`gram_top_svd` (the merge
    methods' float64 top-k route with its spread check).

    Through the eigendecomposition of the smaller Gram matrix instead of an SVD (several
    times faster on a CPU for 3072 x 768); singular values are accurate to ~1e-3 of sigma_1
    (squared: ~1e-7 of the energy), ample for energy shares, spectra and subspaces."""
    M = M.to(torch.float32)
    d_out, d_in = M.shape
    if d_out <= d_in:
        lam, U = torch.linalg.eigh(M @ M.T)
        lam, U = lam.flip(0).clamp(min=0), U.flip(1)
        S = lam.sqrt()
        Uk = U[:, :k]
        Sk = S[:k]
        Vk = (M.T @ Uk) / torch.where(Sk > 0, Sk, torch.ones_like(Sk))
    else:
        lam, V = torch.linalg.eigh(M.T @ M)
        lam, V = lam.flip(0).clamp(min=0), V.flip(1)
        S = lam.sqrt()
        Vk = V[:, :k]
        Sk = S[:k]
        Uk = (M @ Vk) / torch.where(Sk > 0, Sk, torch.ones_like(Sk))
    return S, Uk, Vk
