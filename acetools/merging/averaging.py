"""Weight averaging and task arithmetic (docs/methods.md §Weight averaging, §Task arithmetic)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._registry import Param, register

__all__ = ["weight_averaging", "task_arithmetic", "mean_update"]


def mean_update(task_vectors: list[dict[str, Tensor]], key: str) -> Tensor:
    """(1/T) sum_t tau_t[key]: the element-wise mean used for every non-matrix key."""
    return torch.stack([tv[key] for tv in task_vectors]).mean(0)


@register("weight_averaging",
          "theta0 + (1/T) sum_t tau_t: plain averaging of the experts (docs/methods.md §Weight averaging)")
def weight_averaging(base, task_vectors, *, is_matrix):
    """Weight averaging, docs/methods.md §Weight averaging: theta = (1/T) sum_t theta_t, on every key."""
    return {k: mean_update(task_vectors, k) for k in base}


@register(
    "task_arithmetic",
    "theta0 + lam * sum_t tau_t (Ilharco et al. 2023; docs/methods.md §Task arithmetic)",
    lam=Param(0.3, "scaling of the summed task vectors", low=0.0),
)
def task_arithmetic(base, task_vectors, *, is_matrix, lam):
    """Task arithmetic, docs/methods.md §Task arithmetic: theta = theta0 + lam * sum_t tau_t on every key."""
    return {k: lam * torch.stack([tv[k] for tv in task_vectors]).sum(0) for k in base}
