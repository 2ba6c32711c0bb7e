"""Linear-algebra helpers shared by the merge methods: polar factor, safe solve, input checks."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

__all__ = ["thin_svd", "polar", "solve_right", "top_svd", "check_square"]


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


def solve_right(B: Tensor, A: Tensor, *, name: str = "") -> Tensor:
    """``B @ inv(A)`` computed as a solve; falls back to the pseudo-inverse with a warning.

    The warning names the layer (``name``) so a user can see which matrix was singular.
    """
    try:
        X = torch.linalg.solve(A.transpose(-1, -2), B.transpose(-1, -2)).transpose(-1, -2)
        if torch.isfinite(X).all():
            return X
    except RuntimeError:  # torch raises torch.linalg.LinAlgError (a RuntimeError) when singular
        pass
    warnings.warn(
        f"matrix for layer {name!r} is singular or ill-conditioned; using the pseudo-inverse",
        RuntimeWarning,
        stacklevel=2,
    )
    return B @ torch.linalg.pinv(A)


def check_square(S: Any, d_in: int, where: str, hint: str = "") -> None:
    """Validate one user-given d_in x d_in matrix (a covariance or Gram): a floating-point
    Tensor of that shape with finite entries. ``where`` names it in the error, e.g.
    ``"ace: covariances[2]['blocks.0.mlp.c_fc.weight']"``; ``hint`` is appended to the
    shape error."""
    if not isinstance(S, Tensor):
        raise TypeError(f"{where} is a {type(S).__name__}, not a torch.Tensor")
    if tuple(S.shape) != (d_in, d_in):
        raise ValueError(f"{where} has shape {tuple(S.shape)}; it must be d_in x d_in = {d_in} x {d_in}{hint}")
    if not S.is_floating_point():
        raise TypeError(f"{where} has dtype {S.dtype}; it must be floating point")
    if not torch.isfinite(S).all():
        raise ValueError(f"{where} contains NaN or Inf")
