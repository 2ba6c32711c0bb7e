"""Weight averaging and task arithmetic (docs/methods.md §Weight averaging, §Task arithmetic)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ._registry import LAMBDA_GRID, Param, Search, register

__all__ = ["weight_averaging", "task_arithmetic", "mean_update", "warn_mean_fallback"]


def mean_update(task_vectors: Sequence[Mapping[str, Tensor]], key: str) -> Tensor:
    """(1/T) sum_t tau_t[key]: the element-wise mean used for every non-matrix key."""
    return torch.stack([tv[key] for tv in task_vectors]).mean(0)


def warn_mean_fallback(method: str, keys: Sequence[str], why: str) -> None:
    """Say loudly (a RuntimeWarning) that matrix ``keys`` take the mean of the task vectors
    instead of ``method``'s matrix merge, because they have ``why`` (e.g. "no Gram matrices")."""
    if keys:
        more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
        warnings.warn(f"{method}: {len(keys)} matrix key(s) have {why} and take the mean of the task vectors "
                      f"instead: {keys[0]!r}{more}", RuntimeWarning, stacklevel=3)


@register("weight_averaging",
          "theta0 + (1/T) sum_t tau_t: plain averaging of the experts (docs/methods.md §Weight averaging)",
          key_scope="key")
def weight_averaging(base, task_vectors, *, is_matrix):
    """Weight averaging, docs/methods.md §Weight averaging: theta = (1/T) sum_t theta_t, on every key."""
    return {k: mean_update(task_vectors, k) for k in base}


@register(
    "task_arithmetic",
    "theta0 + lam * sum_t tau_t (Ilharco et al. 2023; docs/methods.md §Task arithmetic)",
    key_scope="key",
    search=Search("lam", "grid", LAMBDA_GRID),
    lam=Param(0.3, "scaling of the summed task vectors", low=0.0),
)
def task_arithmetic(base, task_vectors, *, is_matrix, lam):
    """Task arithmetic, docs/methods.md §Task arithmetic: theta = theta0 + lam * sum_t tau_t on every key."""
    return {k: lam * torch.stack([tv[k] for tv in task_vectors]).sum(0) for k in base}
