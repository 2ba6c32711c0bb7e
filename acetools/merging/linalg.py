"""Linear-algebra helpers shared by the merge methods: polar factor, safe solve, input checks.

Beside the plain LAPACK routes (:func:`thin_svd`, :func:`polar`, :func:`solve_right`), the cheaper
*exact* routes the methods take where the numerics allow (docs/performance.md): top singular
triplets and polar factors through the smaller float64 Gram (:func:`gram_top_svd`, :func:`gram_polar`,
:func:`gram_polar_times`; each checks the spectrum it needs against ``GRAM_MAX_RATIO`` and otherwise
leaves it to the SVD), Cholesky with Sherman–Morrison (:func:`solve_spd_rank_one`), and ACE's one
pass over the tasks (:class:`TaskCovariance`, :func:`task_sums`; docs/methods.md §ACE).

Every solve and factorisation decides singularity from a measured quantity, never from whether
LAPACK raises (docs/methods.md §Numerics): :func:`rcond_estimate` (LU) and :func:`cholesky_rcond`
(pivot ratio, then the same 1-norm estimate) against ``RCOND_MIN``; below it :func:`solve_right`
takes the pseudo-inverse with a warning naming the layer.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..errors import InputError, InputTypeError

__all__ = [
    "thin_svd", "polar", "solve_right", "top_svd", "check_square", "check_psd",
    "GRAM_MAX_RATIO", "sym_eig", "gram_top_svd", "gram_polar", "gram_polar_times",
    "solve_spd_rank_one", "syrk_lower_", "symmetrize_lower_", "spread_ok", "gram_spectrum", "RCOND_MIN",
    "rcond_estimate", "cholesky_rcond", "polar_rank", "TaskCovariance", "TaskSums", "StreamedCovariances",
    "CenteredRows", "sum64", "sq_norms", "solve_task_sums",
    "NormalizedCovariances", "Refinement", "isotropic_update", "dense_covariance",
    "SHIFT_RANK_RTOL", "shift_rank", "top_shift_factors", "whiten_svd",
    "task_sums",
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


def top_svd(M: Tensor, k: int, *, gram: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """The top-``k`` singular triplets ``(U_k, S_k, Vh_k)`` of ``M`` (thin SVD). ``gram=True``:
    in float64 through the Gram of the smaller side where sigma_1 / sigma_k allows it
    (:func:`gram_top_svd`), else the thin SVD of ``M`` in float64."""
    top = gram_top_svd(M, k) if gram else None
    if top is not None:
        return top
    U, S, Vh = thin_svd(M.double() if gram else M)
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


def solve_right(B: Tensor, A: Tensor, *, name: str = "") -> Tensor:
    """``B @ inv(A)`` computed as a solve; falls back to the pseudo-inverse with a warning.

    Singularity is decided from a measured quantity, not from whether LAPACK raises: the LU
    factorisation's estimated reciprocal condition number (:func:`rcond_estimate`) must be at
    least ``RCOND_MIN`` and the solution finite. Otherwise the result is ``B @ pinv(A)`` with singular
    values below ``RCOND_MIN · sigma_1`` dropped (the minimum-norm least-squares solution) and a
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
    return B @ torch.linalg.pinv(A, rtol=RCOND_MIN)


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
        Y.sub_(torch.outer(Y.sum(dim=1) / denom, z))  # in place: one d_out x d_in buffer fewer
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
    wide = M.shape[0] <= M.shape[1]
    A = M if wide else M.T  # the Gram A Aᵀ of the smaller side
    lam, Q = torch.linalg.eigh(A @ A.T)
    S = lam.flip(0).clamp(min=0).sqrt()
    Qk, Sk = Q.flip(1)[:, :k], S[:k]
    Ok = (A.T @ Qk) / torch.where(Sk > 0, Sk, torch.ones_like(Sk))  # the other side's vectors
    return (S, Qk, Ok) if wide else (S, Ok, Qk)


# --------------------------------------------------------------------------- ACE's task sums


class TaskCovariance(NamedTuple):
    """Sigma_hat_t of one task kept implicit, as the task vector ``delta_W`` (d_out × d_in) it is
    made of (docs/methods.md §ACE, Eqs. (ACE.3)-(ACE.4)), times ``scale``.

    ``kind``: "ace" (W̃ᵀ W̃, W̃ the row-centred ΔW), "wudi" (ΔWᵀ ΔW / ||ΔW||_F^wudi_p),
    "identity" (I) or "given" (``matrix``, d_in × d_in). :meth:`dense` forms it (float64);
    :func:`task_sums` never does for the Gram kinds.
    """

    delta_W: Tensor  # (d_out, d_in)
    kind: str
    wudi_p: float = 2.0
    matrix: Tensor | None = None  # (d_in, d_in), kind "given"
    scale: float = 1.0

    def dense(self) -> Tensor:
        """The d_in × d_in float64 matrix, scale included."""
        d = self.delta_W.double()
        if self.kind == "ace":
            Wc = d - d.mean(dim=0, keepdim=True)
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


class TaskSums(NamedTuple):
    """The sums over the T tasks that ACE's stages read, from one pass (:func:`task_sums`).

    N_t is the numerator the pass was made for (W̃_t = ΔW_t - 1 μ_tᵀ if ``centered``, else ΔW_t;
    μ_t the mean row) and Σ̃_t = s_t Sigma_hat_t. For the refinement ΔW_t Σ̃_t = W̃_t Σ̃_t + 1 (Σ̃_tᵀ μ_t)ᵀ.
    """

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

    def made_of(self, delta_W: Sequence[Tensor]) -> bool:
        """Whether ``delta_W`` are the very task vectors these sums were made of."""
        return len(delta_W) == len(self.covs) and all(a is c.delta_W for a, c in zip(delta_W, self.covs))


def sum64(tensors: Any) -> Tensor:
    """Sum in float64, accumulated in place (no T-fold stack held in memory)."""
    it = iter(tensors)
    out = next(it).double().clone()
    for t in it:
        out += t
    return out


def sq_norms(tensors: Sequence[Tensor]) -> Tensor:
    """||X_t||_F² of each tensor as a float64 vector (float64 dot products; lower precisions are
    converted into one reused float64 buffer, no fresh temporary per tensor)."""
    buf: Tensor | None = None
    out = []
    for d in tensors:
        if d.dtype == torch.float64:
            x = d.reshape(-1)
        else:
            if buf is None or buf.numel() != d.numel() or buf.device != d.device:
                buf = torch.empty(d.numel(), dtype=torch.float64, device=d.device)
            x = buf.copy_(d.reshape(-1))
        out.append(torch.dot(x, x))
    return torch.stack(out)


class CenteredRows(Sequence):
    """The row-centred W̃_t = ΔW_t - 1 μ_tᵀ of ``delta_W`` (μ_t the mean row), each formed when
    indexed: ACE's centred numerators, which its streamed sums already hold (:class:`TaskSums`)."""

    def __init__(self, delta_W: Sequence[Tensor]):
        self.delta_W = list(delta_W)

    def __len__(self) -> int:
        return len(self.delta_W)

    def __getitem__(self, t: Any) -> Any:
        if isinstance(t, slice):
            return [d - d.mean(dim=0, keepdim=True) for d in self.delta_W[t]]
        return self.delta_W[t] - self.delta_W[t].mean(dim=0, keepdim=True)


def solve_task_sums(sums: TaskSums, C_agg: Tensor | None = None, *, name: str = "") -> Tensor:
    """W_bar_pre = (sum_t N_t Sigma_reg,t)(sum_t Sigma_reg,t + C_agg)^-1 (eq. 14 of ACE-Merging) from the
    sums, float64 (d_out, d_in). A symmetric system with C_agg = 1 cᵀ (or none) by Cholesky with
    Sherman–Morrison (:func:`solve_spd_rank_one`); otherwise, or where that fails, the sums again in
    float64 and the LU solve :func:`solve_right` (pseudo-inverse with a warning naming ``name``)."""
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


class StreamedCovariances(list):
    """Σ̃_1..Σ̃_T as :class:`TaskCovariance` (unformed) with ``sums``, the :class:`TaskSums` of their pass."""

    def __init__(self, items: Any, sums: TaskSums):
        super().__init__(items)
        self.sums = sums


def _sq_norm(F: Tensor) -> float:
    """||F||_F² accumulated in float64 (a BLAS dot product; float32 ``F`` is converted first)."""
    x = (F if F.dtype == torch.float64 else F.double()).reshape(-1)
    return float(torch.dot(x, x))


def task_sums(covs: Sequence[TaskCovariance], rule: Callable[[float], tuple[float, float, float]], *,
              dtype: torch.dtype = torch.float64, centered: bool = True, refine: bool = True) -> TaskSums:
    """One pass over the tasks, holding O(1) matrices in T (docs/methods.md §ACE; docs/performance.md).

    ``rule(trace) -> (tr_t, s_t, r_t)`` turns Tr(Sigma_hat_t) into the trace, scale and ridge of
    Σ̃_t = s_t Sigma_hat_t (ACE's normalisation; ``covs`` are unscaled). Each task's covariance is made,
    accumulated and dropped in turn; ΔW_t and W̃_t live in two reused buffers of the working ``dtype``.
    ``centered``: the numerator N_t is W̃_t (else ΔW_t); ``refine``: also keep what the refinement
    reads (sum_t r_t N_t apart, sum_t ΔW_t and, centred, sum_t Σ̃_t μ_t); without it the ridge is
    folded into B and those d_out × d_in sums are not held.

    Cheapest association: for the Gram kinds (Sigma_hat_t = q Fᵀ F) N Σ̃ is formed as
    (N Fᵀ) F, the d_out × d_out association, when 2 d_out < d_in (CLIP's mlp.c_proj: half the
    flops), else as N G with the d_in × d_in Gram G = Fᵀ F that S needs anyway (a blocked SYRK).
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
        N = torch.sub(d, mu, out=c_buf) if centered else d  # N_t (d_out, d_in)
        if task_sum is not None:
            task_sum += d
        if cov.kind in ("ace", "wudi"):
            F, q = (N if centered else torch.sub(d, mu, out=c_buf)), 1.0  # Sigma_hat_t = q Fᵀ F
            if cov.kind == "wudi":
                norm = float(torch.linalg.matrix_norm(d.double()))
                F, q = d, (0.0 if norm == 0 else 1.0 / norm**cov.wudi_p)
            tr, s, r = rule(q * _sq_norm(F))
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


# --------------------------------------------------------------------------- ESM's Step A

#: A singular value of the activation shift dO = X ΔWᵀ at or below ``SHIFT_RANK_RTOL · sigma_1``
#: counts as zero (Step A's rank): float32 rounding of the shift leaves about 6e-8 · sqrt(d_in)
#: (3e-6 at d_in = 3072) in place of an exact zero, e.g. along the mean direction a LayerNorm output
#: lacks, so a lower limit would make the rank, and with it the merge, depend on the dtype.
SHIFT_RANK_RTOL = 1e-5


def shift_rank(S: Tensor) -> int:
    """Rank of the activation shift from its singular values ``S`` (descending): how many exceed
    ``SHIFT_RANK_RTOL · S[0]`` (docs/methods.md §ESM, Step A)."""
    if S.numel() == 0 or not bool(S[0] > 0):
        return 0
    return int((S > SHIFT_RANK_RTOL * S[0]).sum())


def top_shift_factors(X: Tensor | None, delta_W: Tensor, k: int, decomposition: str = "esd"
                      ) -> tuple[Tensor, Tensor, Tensor] | None:
    """ESM's Step A on its cheapest exact route: the top ``k`` columns of
    :func:`acetools.merging.esm.essential_subspace`'s ``P``, their ``lam`` and the norm
    n_t = ||P_tᵀ ΔW_t||_F of the *full* coordinates, without forming P or Pᵀ ΔW in full.

    Exact routes (docs/methods.md §ESM):

    * The activation shift dO = X ΔWᵀ has rank <= d_in. With N >= d_in, X = Q R (QR,
      R d_in × d_in) gives dO = Q (R ΔWᵀ): the same singular values and right vectors from the
      d_in × d_out matrix R ΔWᵀ instead of the N × d_out one. With N < d_in (CLIP's c_proj,
      d_in 3072 > 1600 proxy tokens) dO itself is the smaller matrix.
    * The top k right vectors then come from the float64 Gram of the smaller side
      (:func:`gram_top_svd`) for float32 inputs, where
      sigma_1 / sigma_k allows it; float64 inputs take the float64 SVD of the reduced matrix.
    * Only rows :k of A_t = P_tᵀ ΔW_t are used after Step B2; its norm follows from the columns
      of P: the m = min(N, d_out) SVD columns span range(ΔW Xᵀ) = range(ΔW) whenever X has full
      column rank, so they carry all of ||ΔW||_F² (past rank(dO) they are orthogonal to ΔW),
      and the identity completion e_{m+1}..e_{d_out} adds the squared norms of rows m+1.. of ΔW:
      n_t² = ||ΔW||_F² + ||ΔW[m:]||_F². For the "svd" decomposition the same holds with
      m = min(d_out, d_in).

    Returns ``(P_k, lam_k, n_t)`` in ``delta_W``'s dtype, or ``None`` where the shortcut does
    not apply (k past the rank bound, X without full column rank while P is completed, or a
    zero shift): the caller then decomposes in full. Where the shift's rank
    (:func:`shift_rank`) is below k, ``P_k`` has only that many columns.
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


def whiten_svd(M: Tensor, name: str = "") -> Tensor:
    """ESM's whitening (docs/methods.md §ESM, Eq. (ESM.8)) through the thin SVD of ``M`` in its own
    dtype: polar(M) times the mean singular value; a rank-deficient ``M`` (:func:`polar_rank`) gets
    the partial isometry of its rank-r part, with a warning naming ``name``."""
    if not bool(torch.isfinite(M).all()):
        raise FloatingPointError(f"esm: layer {name!r}: the matrix to whiten has NaN or Inf entries; the task "
                                 "vectors or activations overflow (check their scale)")
    try:
        U, S, Vh = thin_svd(M)
    except RuntimeError as e:  # torch.linalg.LinAlgError: the SVD did not converge
        raise InputError(
            f"esm: the SVD for layer {name!r} failed ({type(e).__name__}); the {tuple(M.shape)} matrix has "
            f"max |entry| {float(M.detach().abs().max()):.3g}: task vectors or activations this large (or NaN/Inf) "
            f"overflow {M.dtype} arithmetic. Check the scale of the experts and the capture") from e
    if S.numel() == 0 or not bool(S.mean() > 0):
        return torch.zeros_like(M)
    r = polar_rank(S, (M.shape[0], M.shape[1]), M.dtype)
    if r < S.numel():
        warnings.warn(
            f"esm: layer {name!r}: the {tuple(M.shape)} matrix to whiten has rank {r} < {S.numel()} (singular "
            "values at rounding level); its polar factor is not unique, so the rank-r part's U_r V_r^T is used "
            "(docs/methods.md §ESM, Step B5)", RuntimeWarning, stacklevel=3)
        return (U[:, :r] @ Vh[:r]) * S.mean()
    return (U @ Vh) * S.mean()


# --------------------------------------------------------------------------- ACE's stage outputs


def dense_covariance(S: Tensor | TaskCovariance) -> Tensor:
    """A covariance as a float64 matrix (a :class:`TaskCovariance` formed)."""
    return S.dense() if isinstance(S, TaskCovariance) else S.double()


@dataclass
class NormalizedCovariances:
    """Output of ACE's :func:`acetools.merging.ace.normalize_covariances`: Sigma_reg,t = Σ̃_t + ridge[t] I,
    kept factored (docs/methods.md §ACE, Eqs. (ACE.7)-(ACE.8))."""

    Sigma_tilde: list[Tensor]  # Σ̃_t (d_in, d_in) = Sigma_hat_t / tr_t when normalized; StreamedCovariances
    ridge: Tensor  # (T,) eps / tr_t when normalized, else eps
    traces: Tensor  # (T,) tr_t = Tr(Sigma_hat_t) + 1e-12
    normalized: bool

    @property
    def Sigma_reg(self) -> list[Tensor]:
        """The list of Sigma_reg,t = Σ̃_t + ridge_t I (materialised on request)."""
        dense = [dense_covariance(S) for S in self.Sigma_tilde]
        return [S + r * torch.eye(S.shape[-1], dtype=S.dtype, device=S.device) for S, r in zip(dense, self.ridge)]

    def sum_reg(self) -> Tensor:
        """sum_t Sigma_reg,t (d_in, d_in), a new tensor (in the streamed sums' dtype)."""
        sums = getattr(self.Sigma_tilde, "sums", None)
        S = sums.S.clone() if sums is not None else sum64(dense_covariance(S) for S in self.Sigma_tilde)
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
    S_fused: Tensor  # singular values of W_fused = W_bar_pre + Δ_res (streamed: the top k)
    U: Tensor  # left singular vectors of W_fused (d_out, r) (streamed: (d_out, k))
    Vh: Tensor  # right singular vectors, transposed (r, d_in) (streamed: (k, d_in))
    W_fused: Tensor | None = None  # (d_out, d_in)

    def at_rank(self, W_pre: Tensor, k: int) -> Tensor:
        """W_pre + mean(S_fused[:k]) U_k V_kᵀ: the refinement at another rank (k = 0: W_pre)."""
        if k == 0:
            return W_pre.clone()
        return isotropic_update(W_pre, self.U[:, :k] @ self.Vh[:k, :], self.S_fused[:k].mean())


def isotropic_update(W_pre: Tensor, UV_k: Tensor, sigma_iso: Tensor | float) -> Tensor:
    """W_bar = W_bar_pre + sigma_iso U_k V_kᵀ (eq. 19); ``UV_k`` (U_k V_kᵀ) is overwritten."""
    return UV_k.mul_(sigma_iso).add_(W_pre)
