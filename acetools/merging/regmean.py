"""RegMean (Jin et al., ICLR 2023), docs/methods.md §RegMean: the full weights W_t = W0 + tau_t merged through
their input Gram matrices (:func:`acetools.files.activations.gram_matrices` collects them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..errors import InputError
from ._registry import Param, register
from .averaging import matrix_or_mean, warn_mean_fallback
from .inputs import check_key_matrices
from .linalg import solve_right

__all__ = ["shrink_gram", "regmean_matrix", "validate_grams", "regmean"]


def shrink_gram(G: Tensor, alpha: float) -> Tensor:
    """G~ = alpha G + (1 - alpha) diag(G): off-diagonal entries times alpha, diagonal kept
    (docs/methods.md §RegMean)."""
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise InputError(f"a Gram matrix must be square, got shape {tuple(G.shape)}")
    return alpha * G + (1 - alpha) * torch.diag_embed(torch.diagonal(G))


def regmean_matrix(W: Sequence[Tensor], grams: Sequence[Tensor], alpha: float = 0.95, *, key: str = "") -> Tensor:
    """RegMean for one linear layer: W* = (sum_t W_t G~_t^T) (sum_t G~_t^T)^-1 in float64 (docs/methods.md
    §RegMean; :func:`acetools.merging.linalg.solve_right`). ``W``: the T *full* weights, ``grams`` their Grams.
    """
    if len(W) != len(grams) or len(W) == 0:
        raise InputError(f"key {key!r}: got {len(W)} weights and {len(grams)} Gram matrices; need one Gram per weight")
    A = B = None
    for t, (W_t, G_t) in enumerate(zip(W, grams)):
        G = shrink_gram(G_t.to(W_t.device, torch.float64), alpha)
        W64 = W_t.to(torch.float64)
        if G.shape[0] != W64.shape[1]:
            raise InputError(
                f"key {key!r}: Gram matrix of task {t} is {tuple(G.shape)} but the weight is "
                f"{tuple(W64.shape)} (d_out x d_in); the Gram must be d_in x d_in = {W64.shape[1]} x {W64.shape[1]}"
            )
        A = G.T if A is None else A + G.T
        B = W64 @ G.T if B is None else B + W64 @ G.T
    assert A is not None and B is not None  # W is not empty (checked above)
    return solve_right(B, A, name=key)


def validate_grams(base: Mapping[str, Tensor], grams, n_tasks: int) -> list[str]:
    """Check RegMean's ``grams``, one dict weight key -> d_in x d_in Gram per task with the same keys
    (:func:`acetools.merging.inputs.check_key_matrices`); return the sorted keys that have Grams."""
    return list(check_key_matrices(grams, base, n_tasks, "regmean: grams", "dict (weight key -> Gram matrix)",
                                   "Gram dicts", "Gram matrix"))


@register(
    "regmean",
    "RegMean: per-layer least squares on the experts' input Gram matrices "
    "(Jin et al. 2023; docs/methods.md §RegMean; needs data)",
    key_scope="key", per_key=("grams",), data_inputs=("grams",), needs_layout=True,  # no search (coefficient 1)
    note="merges the keys its Gram matrices name; every other key gets the mean",
    # checked by validate_grams (a Param type check would print the whole list of tensors)
    grams=Param("list (one per expert) of dicts weight key -> d_in x d_in input Gram matrix"),
    alpha=Param("off-diagonal shrink: G~ = alpha G + (1 - alpha) diag(G) (fusion_bench CLIP default 0.95)",
                low=0.0, high=1.0),
)
def regmean(base, task_vectors, *, is_matrix, grams, alpha=0.95):
    """RegMean (docs/methods.md §RegMean): :func:`regmean_matrix` on every key with Grams; the other keys take the
    mean (a RuntimeWarning lists the matrix keys among them)."""
    keys = set(validate_grams(base, grams, len(task_vectors)))
    warn_mean_fallback("regmean", [k for k in base if k not in keys and is_matrix(k, base[k])], "no Gram matrices")

    def merged(taus: list[Tensor], key: str) -> Tensor:  # W* - W0 of the full weights W_t = W0 + tau_t
        W0 = base[key].to(torch.float64)
        W_star = regmean_matrix([W0 + tau.to(torch.float64) for tau in taus], [g[key] for g in grams], alpha, key=key)
        return (W_star - W0).to(base[key].dtype)

    return matrix_or_mean("regmean", base, task_vectors, lambda k, w: k in keys, merged, "RegMean")
