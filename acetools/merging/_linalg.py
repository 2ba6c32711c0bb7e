"""Linear-algebra helpers shared by the merge methods: polar factor, safe solve."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

__all__ = ["polar", "solve_right", "top_svd"]


def polar(M: Tensor) -> Tensor:
    """Orthogonal polar factor P Q^T of ``M = P S Q^T`` (thin SVD).

    The closest matrix to ``M`` with orthonormal rows or columns (spec, Notation: the
    papers' "whitening", "orthogonalization" or "Procrustes"). Invariant to the SVD's
    sign/rotation ambiguity.
    """
    U, _, Vh = torch.linalg.svd(M, full_matrices=False)
    return U @ Vh


def top_svd(M: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The top-``k`` singular triplets ``(U_k, S_k, Vh_k)`` of ``M`` (thin SVD)."""
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    return U[:, :k], S[:k], Vh[:k, :]


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
