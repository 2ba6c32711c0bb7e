"""The merge engine: ``merge()``, ``task_vectors()`` and the ``METHODS`` registry.

Every method family lives in its own module (``averaging``, ``ties``, ``svd``, ``wudi``, ``regmean``,
``ace``, ``esm``) as a pure function on state dicts; :func:`merge` validates the inputs and runs the
one driver (:mod:`acetools.merging.driver`), which :mod:`acetools.files.merge_files` runs on files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError, InputTypeError
from ..layouts import Layout, default_layout, get_layout
from ..utils import resolve_device
from ._registry import (
    METHODS,
    REQUIRED,
    MethodInfo,
    Param,
    Search,
    register,
)
from .driver import (
    Source,
    check_finite,
    check_same_keys,
    compute_dtype,
    confirmed_ties,
    is_matrix_param,
    merge_key,
    run,
)

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
    "check_same_keys",
    "merge_key",
    "key_scope",
    "Search",
    "confirmed_ties",
    "compute_dtype",
]

StateDict = Mapping[str, Tensor]


def validate_state_dicts(base: StateDict, experts: Sequence[StateDict]) -> None:
    """Raise a clear error unless ``experts`` (a non-empty list of state dicts) are mergeable with ``base``: the
    same keys, shapes and dtypes, no NaN/Inf in floating tensors (non-float buffers are carried from the base)."""
    if not isinstance(base, Mapping):
        raise InputTypeError(f"base must be a mapping of key -> Tensor (a state dict), got {type(base).__name__}")
    if isinstance(experts, Mapping) or not isinstance(experts, Sequence):
        raise InputTypeError(
            "experts must be a list of state dicts (one per fine-tuned model), "
            f"got {type(experts).__name__}"
        )
    if len(experts) == 0:
        raise InputError("experts is empty: pass at least one fine-tuned state dict to merge")
    if len(base) == 0:
        raise InputError("base is empty: it must hold the pretrained weights")
    for key, w in base.items():
        if not isinstance(w, Tensor):
            raise InputTypeError(f"base[{key!r}] is a {type(w).__name__}, not a torch.Tensor")
        if w.is_floating_point():
            check_finite("base", key, w)
    base_keys = set(base)
    for i, ex in enumerate(experts):
        if not isinstance(ex, Mapping):
            raise InputTypeError(f"experts[{i}] is a {type(ex).__name__}, not a state dict")
        check_same_keys(sorted(base_keys), ex, f"experts[{i}]")
        for key, w0 in base.items():
            w = ex[key]
            if not isinstance(w, Tensor):
                raise InputTypeError(f"experts[{i}][{key!r}] is a {type(w).__name__}, not a torch.Tensor")
            if w.shape != w0.shape:
                raise InputError(
                    f"shape mismatch at key {key!r}: base has {tuple(w0.shape)}, experts[{i}] has {tuple(w.shape)}"
                )
            if w.dtype != w0.dtype:
                raise InputTypeError(
                    f"mixed dtypes at key {key!r}: base is {w0.dtype}, experts[{i}] is {w.dtype}; "
                    "cast every state dict to one dtype before merging"
                )
            if w.is_floating_point():
                check_finite(f"experts[{i}]", key, w)


def task_vectors(
    base: StateDict,
    experts: Sequence[StateDict],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    validate: bool = True,
) -> list[dict[str, Tensor]]:
    """Task vectors tau_t = W_t - W0 for every floating key, one dict per expert (docs/methods.md §Notation), in
    float32 (float64 stays) unless ``dtype`` is given."""
    if validate:
        validate_state_dicts(base, experts)
    dev = resolve_device(device)
    out = []
    for ex in experts:
        tv = {}
        for k, w0 in base.items():
            if not w0.is_floating_point():
                continue
            dt = dtype or compute_dtype(w0.dtype)
            tv[k] = ex[k].to(dev, dt) - w0.to(dev, dt)
        out.append(tv)
    return out


def _get_method(method: str) -> MethodInfo:
    if not isinstance(method, str) or method not in METHODS:
        valid = ", ".join(sorted(METHODS))
        raise InputError(f"unknown merge method {method!r}; valid methods are: {valid}")
    return METHODS[method]


def key_scope(method: str, hparams: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """How far the merged update of one key reaches, with ``hparams``: ``(scope, why)``
    (:meth:`acetools.merging.MethodInfo.key_scope`)."""
    return _get_method(method).key_scope(hparams)


def _resolve_layout(layout: Any, base: StateDict, is_matrix: Callable | None):
    """(layout, is_matrix predicate) for merge(): a given layout, the legacy predicate, or the layout
    detected from the keys as ``acetools merge`` does (:func:`acetools.layouts.default_layout`)."""
    keys = list(base)
    if is_matrix is not None:
        if layout is not None:
            raise InputError("pass either layout= or is_matrix=, not both (a layout decides which keys are matrices)")
        return Layout("is_matrix"), is_matrix
    lay = default_layout(keys) if layout is None else get_layout(layout, keys=keys)
    return lay, lay.is_matrix


def merge(
    method: str,
    base: StateDict,
    experts: Sequence[StateDict],
    *,
    device: str | torch.device = "cpu",
    layout: Any = None,
    is_matrix: Callable[[str, Tensor], bool] | None = None,
    progress: bool | None = None,
    **hparams: Any,
) -> dict[str, Tensor]:
    """Merge ``experts`` fine-tuned from ``base`` with ``method``; return full weights W0 + update.

    Every key of ``base`` is returned in its dtype on ``device``. ``layout`` (a preset name, ``"auto"``
    or a :class:`acetools.layouts.Layout`; default: detected from the keys) says which keys take the
    matrix path, are stored in x out or are tied (docs/methods.md §Matrix path); ``is_matrix(key,
    tensor)`` is the older predicate interface. ``hparams``: ``METHODS[method].hparams``; per-key inputs
    (``covariances``, ``grams``, ``activations``) are d_out x d_in. Inputs are never modified.
    """
    info = _get_method(method)
    info.resolve(hparams)  # unknown or bad hyperparameters are refused before any other work
    dev = resolve_device(device)  # up front: a meta or missing device is refused before any work
    if is_matrix is not None and not callable(is_matrix):
        raise InputTypeError("is_matrix must be a callable (key, tensor) -> bool")
    validate_state_dicts(base, experts)
    lay, is_mat = _resolve_layout(layout, base, is_matrix)
    resolved = info.resolve(hparams, layout=lay.name)
    info.check_per_expert(resolved, len(experts))  # weights=[...], k=[...]: one value per expert
    out: dict[str, Tensor] = {}
    run(info, resolved, Source(base, experts, check_finite=False), lay, out.__setitem__, device=dev,
        is_matrix=is_mat, whole_model=True, out_device=dev, show=progress)
    return {k: out[k] for k in base}


# Import the method families so that they register themselves.
from . import ace, averaging, esm, regmean, svd, ties, wudi  # noqa: E402,F401
