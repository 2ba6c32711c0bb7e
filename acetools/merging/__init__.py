"""The merge engine: ``merge()``, ``task_vectors()`` and the ``METHODS`` registry.

Every method family lives in its own module (``averaging``, ``ties``, ``svd``, ``wudi``, ``regmean``,
``ace``, ``esm``) as a pure function on state dicts; :func:`merge` validates the inputs and runs the
one driver (:mod:`acetools.merging.driver`), which :mod:`acetools.files.merge_files` runs on files.
"""

from __future__ import annotations

import logging
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
    defaults_from,
    methods_table,
    register,
    update_methods_table,
)
from .driver import (
    Source,
    carried_buffers,
    check_finite,
    check_same_keys,
    compute_dtype,
    confirmed_ties,
    merge_key,
    per_key_entries,
    run,
)

log = logging.getLogger("acetools.merging")

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
    "per_key_entries",
    "Search",
    "defaults_from",
    "methods_table",
    "update_methods_table",
    "carried_buffers",
    "confirmed_ties",
    "compute_dtype",
]

StateDict = Mapping[str, Tensor]


def is_matrix_param(key: str, tensor: Tensor) -> bool:
    """The "is it a matrix?" rule of docs/methods.md §Matrix path: ``ndim == 2`` and not ``text_projection``.

    This is the rule of the TSV, Iso, ESM and ACE code (docs/methods.md §Matrix path).
    Pass another predicate as ``merge(..., is_matrix=...)`` to change it.
    """
    return tensor.ndim == 2 and "text_projection" not in key


def validate_state_dicts(base: StateDict, experts: Sequence[StateDict]) -> None:
    """Raise a clear error unless ``experts`` are mergeable with ``base``.

    Checks: a non-empty list of mappings; the same keys and shapes as ``base`` (naming the
    key and the expert index); one dtype per key across base and experts; no NaN/Inf in
    floating tensors. Non-float tensors (integer or bool buffers such as ``position_ids`` or
    ``num_batches_tracked``) are allowed: :func:`merge` carries them from the base.
    """
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
    """Task vectors tau_t = W_t - W0 for every floating key, one dict per expert (docs/methods.md §Notation).

    Computed in float32 (float64 inputs stay float64) unless ``dtype`` is given; new
    tensors, inputs untouched. Non-float buffers have no task vector and are left out.
    """
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
    """How far the merged update of one key reaches, with ``hparams``: ``(scope, why)`` (the registry's
    ``key_scope``): ``"key"`` (that key alone: streamed key by key), ``"global_ties"`` (TIES' whole-model
    trim threshold and majority sign, computed in extra passes first) or ``"model"`` (every key at once:
    in memory)."""
    return _get_method(method).key_scope(hparams)


def _resolve_layout(layout: Any, base: StateDict, is_matrix: Callable | None):
    """(layout, is_matrix predicate) for merge(): a given layout, the legacy predicate, or the layout
    detected from the keys as ``acetools merge`` detects it (:func:`acetools.layouts.default_layout`:
    the open_clip rule where nothing is recognised), so the API and the CLI merge alike."""
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
    or a :class:`acetools.layouts.Layout`; default ``None``: detected from the keys as ``acetools
    merge`` does) says which keys take the matrix path, are stored in x out or are tied
    (docs/methods.md §Matrix path); ``is_matrix(key, tensor)`` instead keeps the old predicate
    interface. Non-float buffers are carried from the base. ``hparams``: ``METHODS[method].hparams``;
    per-key inputs (``covariances``, ``grams``, ``activations``) are in d_out x d_in orientation.
    Inputs are never modified; task vectors are formed key by key (:func:`acetools.merging.driver.run`).
    """
    info = _get_method(method)
    info.resolve(hparams)  # unknown or bad hyperparameters are refused before any other work
    dev = resolve_device(device)  # up front: a meta or missing device is refused before any work
    if is_matrix is not None and not callable(is_matrix):
        raise InputTypeError("is_matrix must be a callable (key, tensor) -> bool")
    validate_state_dicts(base, experts)
    lay, is_mat = _resolve_layout(layout, base, is_matrix)
    resolved = info.resolve(hparams, layout=lay.name)
    out: dict[str, Tensor] = {}
    run(info, resolved, Source(base, experts, check_finite=False), lay, out.__setitem__, device=dev,
        is_matrix=is_mat, whole_model=True, out_device=dev, show=progress)
    return {k: out[k] for k in base}


# Import the method families so that they register themselves.
from . import ace, averaging, esm, regmean, svd, ties, wudi  # noqa: E402,F401
