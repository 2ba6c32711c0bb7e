"""The merge engine: ``merge()``, ``task_vectors()`` and the ``METHODS`` registry.

Every method family lives in its own module (``averaging``, ``ties``, ``svd``, ``wudi``,
``regmean``, ``ace``, ``esm``) as a pure function on state dicts; this module validates
inputs, builds task vectors, calls the method and adds its merged update to W0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..utils import PROGRESS, resolve_device
from ._registry import METHODS, REQUIRED, MethodInfo, Param, register

__all__ = [
    "merge",
    "task_vectors",
    "METHODS",
    "MethodInfo",
    "Param",
    "register",
    "REQUIRED",
    "is_matrix_param",
    "validate_state_dicts",
]

StateDict = Mapping[str, Tensor]


def is_matrix_param(key: str, tensor: Tensor) -> bool:
    """The "is it a matrix?" rule of docs/methods.md §Matrix path: ``ndim == 2`` and not ``text_projection``.

    This is the rule of the TSV, Iso, ESM and ACE code (docs/methods.md §Matrix path).
    Pass another predicate as ``merge(..., is_matrix=...)`` to change it.
    """
    return tensor.ndim == 2 and "text_projection" not in key


def _check_finite(name: str, key: str, t: Tensor) -> None:
    if not torch.isfinite(t).all():
        n_nan = int(torch.isnan(t).sum())
        n_inf = int(torch.isinf(t).sum())
        raise ValueError(f"{name}[{key!r}] contains {n_nan} NaN and {n_inf} Inf values")


def validate_state_dicts(base: StateDict, experts: Sequence[StateDict]) -> None:
    """Raise a clear error unless ``experts`` are mergeable with ``base``.

    Checks: a non-empty list of mappings; the same keys and shapes as ``base`` (naming the
    key and the expert index); floating dtypes only, one dtype per key across base and
    experts; no NaN/Inf.
    """
    if not isinstance(base, Mapping):
        raise TypeError(f"base must be a mapping of key -> Tensor (a state dict), got {type(base).__name__}")
    if isinstance(experts, Mapping) or not isinstance(experts, Sequence):
        raise TypeError(
            "experts must be a list of state dicts (one per fine-tuned model), "
            f"got {type(experts).__name__}"
        )
    if len(experts) == 0:
        raise ValueError("experts is empty: pass at least one fine-tuned state dict to merge")
    if len(base) == 0:
        raise ValueError("base is empty: it must hold the pretrained weights")
    for key, w in base.items():
        if not isinstance(w, Tensor):
            raise TypeError(f"base[{key!r}] is a {type(w).__name__}, not a torch.Tensor")
        if not w.is_floating_point():
            raise TypeError(
                f"base[{key!r}] has dtype {w.dtype}; only floating-point parameters can be merged "
                "(drop integer buffers such as position ids before merging)"
            )
        _check_finite("base", key, w)
    base_keys = set(base)
    for i, ex in enumerate(experts):
        if not isinstance(ex, Mapping):
            raise TypeError(f"experts[{i}] is a {type(ex).__name__}, not a state dict")
        keys = set(ex)
        missing = sorted(base_keys - keys)
        extra = sorted(keys - base_keys)
        if missing:
            raise KeyError(f"experts[{i}] is missing key {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") + " that base has")
        if extra:
            raise KeyError(f"experts[{i}] has key {extra[0]!r}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "") + " that base does not have")
        for key, w0 in base.items():
            w = ex[key]
            if not isinstance(w, Tensor):
                raise TypeError(f"experts[{i}][{key!r}] is a {type(w).__name__}, not a torch.Tensor")
            if w.shape != w0.shape:
                raise ValueError(
                    f"shape mismatch at key {key!r}: base has {tuple(w0.shape)}, experts[{i}] has {tuple(w.shape)}"
                )
            if w.dtype != w0.dtype:
                raise TypeError(
                    f"mixed dtypes at key {key!r}: base is {w0.dtype}, experts[{i}] is {w.dtype}; "
                    "cast every state dict to one dtype before merging"
                )
            _check_finite(f"experts[{i}]", key, w)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def task_vectors(
    base: StateDict,
    experts: Sequence[StateDict],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    validate: bool = True,
) -> list[dict[str, Tensor]]:
    """Task vectors tau_t = W_t - W0 for every key, one dict per expert (docs/methods.md §Notation).

    Computed in float32 (float64 inputs stay float64) unless ``dtype`` is given; new
    tensors, inputs untouched.
    """
    if validate:
        validate_state_dicts(base, experts)
    dev = resolve_device(device)
    out = []
    for ex in experts:
        tv = {}
        for k, w0 in base.items():
            dt = dtype or _compute_dtype(w0.dtype)
            tv[k] = ex[k].to(dev, dt) - w0.to(dev, dt)
        out.append(tv)
    return out


def _get_method(method: str) -> MethodInfo:
    if not isinstance(method, str) or method not in METHODS:
        valid = ", ".join(sorted(METHODS))
        raise ValueError(f"unknown merge method {method!r}; valid methods are: {valid}")
    return METHODS[method]


def merge(
    method: str,
    base: StateDict,
    experts: Sequence[StateDict],
    *,
    device: str | torch.device = "cpu",
    is_matrix: Callable[[str, Tensor], bool] = is_matrix_param,
    progress: bool | None = None,
    **hparams: Any,
) -> dict[str, Tensor]:
    """Merge ``experts`` fine-tuned from ``base`` with ``method``; return full weights.

    Returns W0 + merged update for every key of ``base``, in the dtype of ``base`` and on
    ``device`` (default CPU). ``is_matrix(key, tensor)`` chooses which keys take the matrix
    path (default :func:`is_matrix_param`, the rule of docs/methods.md §Matrix path). ``hparams`` are the method's
    hyperparameters, listed with defaults in ``METHODS[method].hparams``; unknown or
    out-of-range ones raise. ``progress`` shows a bar over the keys (``None``: only in
    interactive sessions). Inputs are never modified.
    """
    info = _get_method(method)
    resolved = info.resolve(hparams)
    if not callable(is_matrix):
        raise TypeError("is_matrix must be a callable (key, tensor) -> bool")
    validate_state_dicts(base, experts)
    dev = resolve_device(device)
    W0 = {k: w.to(dev, _compute_dtype(w.dtype)) for k, w in base.items()}
    tvs = task_vectors(base, experts, device=dev, validate=False)
    token = PROGRESS.set(progress)
    try:
        delta = info.func(W0, tvs, is_matrix=is_matrix, **resolved)
    finally:
        PROGRESS.reset(token)
    missing = [k for k in base if k not in delta]
    if missing:  # a bug in the method, not in the user's input
        raise RuntimeError(f"{method} returned no update for key {missing[0]!r}")
    out: dict[str, Tensor] = {}
    for k, w0 in base.items():
        d = delta[k]
        if d.shape != w0.shape:
            raise RuntimeError(f"{method} returned shape {tuple(d.shape)} for key {k!r}, expected {tuple(w0.shape)}")
        merged = W0[k] + d.to(dev, W0[k].dtype)
        if not torch.isfinite(merged).all():
            raise FloatingPointError(
                f"{method} produced non-finite weights at key {k!r}; check the hyperparameters "
                f"({resolved}) and the scale of the task vectors"
            )
        out[k] = merged.to(w0.dtype)
    return out


# Import the method families so that they register themselves.
from . import ace, averaging, esm, regmean, svd, ties, wudi  # noqa: E402,F401
