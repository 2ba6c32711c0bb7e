"""Weight averaging and task arithmetic (docs/methods.md §Weight averaging, §Task arithmetic)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from ..errors import InputError
from ..utils import progress
from ._registry import LAMBDA_GRID, Param, Search, per_expert_values, register

__all__ = ["weight_averaging", "task_arithmetic", "mean_update", "summed", "weighted_sum", "warn_mean_fallback",
           "check_matrix_key", "matrix_or_mean", "WEIGHTS"]


def _finite_number(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "must be a finite number"
    return None


#: The per-expert weights w_t of the methods that take them (mergekit's ``weight``; docs/your-models.md
#: §Coming from mergekit): ``None`` (every w_t = 1, the unweighted method) or one finite number per expert.
WEIGHTS = Param("per-expert weights w_t, one number per expert (None: every w_t = 1)",
                per_expert=True, scalar=False, check=_finite_number)

#: The plan's note (``acetools merge --dry-run``) for methods that merge every key the same way.
ALIKE = "treats every float key alike; the matrix/elementwise column does not change its result"


def mean_update(task_vectors: Sequence[Mapping[str, Tensor]], key: str) -> Tensor:
    """(1/T) sum_t tau_t[key]: the element-wise mean used for every non-matrix key."""
    return torch.stack([tv[key] for tv in task_vectors]).mean(0)


def summed(tensors: Iterable[Tensor]) -> Tensor:
    """sum_t x_t as a new tensor, added in order ((x_1 + x_2) + x_3 ..., as fusion_bench does), in the tensors'
    dtype; a generator is summed as it yields (no T-fold list held: ACE's float64 sums of d_in x d_in terms)."""
    it = iter(tensors)
    out = next(it).clone()
    for x in it:
        out.add_(x)
    return out


def weighted_sum(tensors: Sequence[Tensor], weights: Sequence[float] | None) -> Tensor:
    """sum_t w_t x_t as a new tensor, added in order; :func:`summed` itself when ``weights`` is ``None``."""
    if weights is None:
        return summed(tensors)
    out = tensors[0] * weights[0]
    for x, w in zip(tensors[1:], weights[1:]):
        out.add_(x, alpha=w)
    return out


def warn_mean_fallback(method: str, keys: Sequence[str], why: str) -> None:
    """Warn that matrix ``keys`` take the mean instead of ``method``'s matrix merge because they have ``why``."""
    if keys:
        more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
        warnings.warn(f"{method}: {len(keys)} matrix key(s) have {why} and take the mean of the task vectors "
                      f"instead: {keys[0]!r}{more}", RuntimeWarning, stacklevel=3)


def check_matrix_key(method: str, key: str, W0: Tensor) -> None:
    """Refuse a key the matrix path selected that is not 2-D, naming ``method`` and ``key``."""
    if W0.ndim != 2:
        raise InputError(
            f"{method}: is_matrix selected key {key!r} with shape {tuple(W0.shape)}, but the matrix "
            "path needs 2-D tensors; return False for it from is_matrix"
        )


def matrix_or_mean(method: str, base: Mapping[str, Tensor], task_vectors: Sequence[Mapping[str, Tensor]],
                   takes: Callable[[str, Tensor], bool], matrix_fn: Callable[[list[Tensor], str], Tensor], desc: str,
                   *, alpha: float | None = None, rest: Callable[[str], Tensor] | None = None) -> dict[str, Tensor]:
    """``matrix_fn(taus, key)`` on the keys ``takes(key, W0)`` selects (:func:`check_matrix_key`), the mean
    update (or ``rest(key)``) on the others; every key times ``alpha`` where given."""
    out = {}
    for key in progress(list(base), desc=desc):
        if takes(key, base[key]):
            check_matrix_key(method, key, base[key])
            out[key] = matrix_fn([tv[key] for tv in task_vectors], key)
        else:
            out[key] = mean_update(task_vectors, key) if rest is None else rest(key)
        if alpha is not None:
            out[key] = alpha * out[key]
    return out


def _check_weight_sum(weights: Sequence[float] | None) -> None:
    if weights is not None and sum(weights) == 0:
        raise InputError(f"weight_averaging: hyperparameter weights={list(weights)!r} sum to 0, so the weighted mean "
                         "sum_t w_t theta_t / sum_t w_t is undefined; give weights with a non-zero sum")


@register("weight_averaging",
          "theta0 + (1/T) sum_t tau_t: plain averaging of the experts (docs/methods.md §Weight averaging)",
          key_scope="key", note=ALIKE, weights=WEIGHTS)
def weight_averaging(base, task_vectors, *, is_matrix, weights=None):
    """Weight averaging, docs/methods.md §Weight averaging: theta = (1/T) sum_t theta_t, on every key; with
    ``weights``, the weighted mean sum_t w_t theta_t / sum_t w_t (Eq. (WA.2), mergekit's ``linear``)."""
    if weights is None:
        return {k: mean_update(task_vectors, k) for k in base}
    w = per_expert_values("weight_averaging", "weights", weights, len(task_vectors))
    _check_weight_sum(w)
    total = sum(w)
    return {k: weighted_sum([tv[k] for tv in task_vectors], w).div_(total) for k in base}


@register(
    "task_arithmetic",
    "theta0 + lam * sum_t tau_t (Ilharco et al. 2023; docs/methods.md §Task arithmetic)",
    key_scope="key",
    note=ALIKE,
    summed=lambda hp: hp["lam"] if hp["weights"] is None else None,
    search=Search("lam", "grid", LAMBDA_GRID),
    lam=Param("scaling of the summed task vectors", low=0.0),
    weights=WEIGHTS,
)
def task_arithmetic(base, task_vectors, *, is_matrix, lam=0.3, weights=None):
    """Task arithmetic, docs/methods.md §Task arithmetic: theta = theta0 + lam * sum_t tau_t on every key; with
    ``weights``, theta0 + lam * sum_t w_t tau_t (Eq. (TA.2), mergekit's ``task_arithmetic``)."""
    w = None if weights is None else per_expert_values("task_arithmetic", "weights", weights, len(task_vectors))
    return {k: weighted_sum([tv[k] for tv in task_vectors], w).mul_(lam) for k in base}
