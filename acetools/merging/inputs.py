"""The merge methods' shared data inputs, validated (task vectors, per-expert d_in x d_in matrices), and ESM's
activations and layer names (docs/methods.md §ESM); ACE's own options and covariances live in
:mod:`acetools.merging.ace`. Errors name the key, the expert and the shape."""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError, InputKeyError, InputTypeError
from .linalg import check_square

__all__ = [
    "DEFAULT_TARGETS", "CLIP_LAYER_TYPES", "LAYOUT_NAMES", "check_task_vectors", "check_key_matrices",
    "check_one_per_expert", "as_rows", "matches", "finite_number", "str_tuple", "check_activations",
    "activation_source", "check_targets", "esd_failure",
]

#: open_clip parameter names of the ESD layers (docs/methods.md §ESM, Eqs. (ESM.1)-(ESM.2), "Target layers").
DEFAULT_TARGETS: tuple[str, ...] = ("attn.in_proj_weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
#: The four CLIP block types compared by the inter-layer polarization (docs/methods.md §ESM, Eq. (ESM.10)).
CLIP_LAYER_TYPES: tuple[str, ...] = (
    "attn.in_proj_weight",
    "attn.out_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
)
#: Per layout preset: ESM's ESD targets and Step-C layer types, regular expressions searched in the key (open_clip:
#: the defaults above; the other architectures' names in ``esm_layers.json``).
LAYOUT_NAMES: dict[str, dict[str, tuple[str, ...]]] = {"open_clip": {"targets": DEFAULT_TARGETS,
                                                                     "layer_types": CLIP_LAYER_TYPES}}
for _preset, _names in json.loads(Path(__file__).with_name("esm_layers.json").read_text(encoding="utf-8")).items():
    if _preset != "about":
        LAYOUT_NAMES[_preset] = {what: tuple(patterns) for what, patterns in _names.items()}


# --------------------------------------------------------------------------- shared by the methods


def check_task_vectors(delta_W: Sequence[Tensor], name: str) -> list[Tensor]:
    """The T task vectors of one matrix as a list: a non-empty list of 2-D tensors (d_out × d_in) of one shape;
    errors name the layer ``name``."""
    if isinstance(delta_W, Tensor) or len(delta_W) == 0:
        raise InputError(f"layer {name!r}: pass a non-empty list of task vectors (at least one; one d_out x d_in "
                         "tensor per task)")
    for t, d in enumerate(delta_W):
        if not isinstance(d, Tensor):
            raise InputTypeError(f"layer {name!r}, task {t}: the task vector is a {type(d).__name__}, not a Tensor")
        if d.ndim != 2:
            raise InputError(f"layer {name!r}, task {t}: shape {tuple(d.shape)}; the matrix path needs 2-D "
                             "(d_out x d_in) tensors (average other tensors, or change is_matrix)")
        if d.shape != delta_W[0].shape:
            raise InputError(f"layer {name!r}, task {t}: shape {tuple(d.shape)} differs from task 0's "
                             f"{tuple(delta_W[0].shape)}; all experts must share the shape")
    return list(delta_W)  # converted one task at a time where used: no T float64 copies


def check_one_per_expert(value: Any, n_tasks: int, where: str, item: str, items: str) -> None:
    """A per-expert input (Grams, covariances, activations of one layer) is a list of ``n_tasks`` entries;
    errors name ``where``: "... has 2 Gram dicts for 3 experts"."""
    if isinstance(value, (Mapping, str, Tensor)) or not isinstance(value, Sequence):
        raise InputTypeError(f"{where} must be a list with one {item} per expert, got {type(value).__name__}")
    if len(value) != n_tasks:
        raise InputError(f"{where} has {len(value)} {items} for {n_tasks} experts; give one per expert, in the "
                         "order of the experts")


def check_key_matrices(value: Any, base: Mapping[str, Tensor], n_tasks: int, where: str, item: str, items: str,
                       noun: str, matrix_keys: Collection[str] | None = None) -> dict[str, list[Tensor]]:
    """Per-expert d_in x d_in inputs (ACE's covariances, RegMean's Grams): one ``{key: matrix}`` dict per expert
    with the same keys, each key a 2-D weight of ``base`` (one of ``matrix_keys`` where given), each matrix
    valid (:func:`check_square`). Returns key -> the experts' matrices, keys sorted; errors name ``where``."""
    check_one_per_expert(value, n_tasks, where, item, items)
    for t, c in enumerate(value):
        if not isinstance(c, Mapping):
            raise InputTypeError(f"{where}[{t}] is a {type(c).__name__}, not a dict of weight key -> {noun}")
    keys = sorted(set().union(*map(set, value)))
    for t, c in enumerate(value):
        missing = [k for k in keys if k not in c]
        if missing:
            raise InputKeyError(f"{where}[{t}] lacks key {missing[0]!r} that other experts' {items} have; give it "
                                "for every expert or for none")
    for k in keys:
        if k not in base:
            hint = next((f"; did you mean {k + s!r}? they are keyed by the weight's state-dict key"
                         for s in (".weight", "_weight") if k + s in base), "")
            raise InputKeyError(f"{where} has key {k!r}, which base does not have{hint}")
        W0 = base[k]
        if W0.ndim != 2 or (matrix_keys is not None and k not in matrix_keys):
            raise InputError(f"{where} has key {k!r} for a parameter of shape {tuple(W0.shape)}, which is not a "
                             f"matrix: only 2-D (d_out x d_in) weights on the matrix path take a {noun}")
        for t, c in enumerate(value):
            check_square(c[k], W0.shape[1], f"{where}[{t}][{k!r}]", f" for a weight of shape {tuple(W0.shape)}")
    return {k: [c[k] for c in value] for k in keys}


# --------------------------------------------------------------------------- ESM


def as_rows(X: Tensor, d_in: int, where: str = "X") -> Tensor:
    """Flatten all leading dims of ``X`` into rows and check its width is ``d_in``."""
    if not isinstance(X, Tensor):
        raise InputTypeError(f"{where} must be a torch.Tensor of input activations (N x d_in), got {type(X).__name__}")
    if X.ndim < 2:
        raise InputError(
            f"{where} has shape {tuple(X.shape)}; input activations must be N x d_in "
            "(tokens flattened into rows; leading dims are flattened for you)"
        )
    if X.shape[-1] != d_in:
        raise InputError(
            f"{where} has d_in={X.shape[-1]} (shape {tuple(X.shape)}) but the weight expects d_in={d_in}; "
            "capture the *input* of the layer (for attn.in_proj_weight the query input, i.e. the ln_1 output); "
            "weights stored in x out (GPT-2 Conv1D) must be given as d_out x d_in (acetools.layouts)"
        )
    X = X.reshape(-1, d_in)
    if X.shape[0] < 1:
        raise InputError(f"{where} has N=0 rows; ESD needs at least one proxy token (the paper uses 32 images)")
    if not X.is_floating_point():
        raise InputTypeError(f"{where} has dtype {X.dtype}; input activations must be floating point")
    return X


def matches(pattern: str, key: str) -> bool:
    """``pattern`` is a regular expression searched anywhere in ``key`` (a plain name acts as a substring)."""
    return re.search(pattern, key) is not None


def finite_number(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return "must be a finite number"
    return None


def str_tuple(allow_empty: bool) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, str) or not isinstance(v, (tuple, list)):
            return "must be a tuple of parameter-name patterns, e.g. ('mlp.c_fc.weight',)"
        if not allow_empty and len(v) == 0:
            return "must name at least one layer pattern"
        if not all(isinstance(s, str) and s for s in v):
            return "every entry must be a non-empty string"
        for s in v:
            try:
                re.compile(s)
            except re.error as e:
                return f"pattern {s!r} is not a valid regular expression ({e})"
        return None

    return check


def check_activations(v: Any) -> str | None:
    if v is None or isinstance(v, Mapping) or callable(v):
        return None
    return (
        "must be a mapping key -> list of tensors (one N x d_in tensor per task) or a callable "
        "activations(t, key) -> Tensor"
    )


def activation_source(activations: Any, esd_keys: Sequence[str], n_tasks: int,
                       d_in: Mapping[str, int]) -> Callable[[int, str], Tensor]:
    """Validate ``activations`` (eagerly for a mapping) and return a getter (t, key) -> X (N x d_in)."""
    how = (
        "capture it inside each task's fine-tuned model with acetools.files.activations.capture_inputs, "
        "or drop the layer from `targets`"
    )
    if isinstance(activations, Mapping):
        for key in esd_keys:
            if key not in activations:
                raise InputKeyError(f"esm: activations has no entry for ESD layer {key!r}; {how}")
            xs = activations[key]
            check_one_per_expert(xs, n_tasks, f"esm: activations[{key!r}]", "N x d_in tensor", "tensors")
            for t, X in enumerate(xs):
                as_rows(X, d_in[key], where=f"esm: activations[{key!r}][{t}] (expert {t}, task {t})")

    def checked(t: int, key: str) -> Tensor:
        where = f"esm: activations for key {key!r}, task {t} (expert {t})"
        X = activations[key][t] if isinstance(activations, Mapping) else activations(t, key)
        X = as_rows(X, d_in[key], where=where)
        if not torch.isfinite(X).all():
            raise InputError(f"{where} contain NaN or Inf values; check the capture")
        return X

    return checked


def esd_failure(key: str, taus: Sequence[Tensor], Xs: Sequence[Tensor] | None, e: Exception) -> InputError:
    """The error for a failed eigensolver or SVD on ESD layer ``key``: the likely cause, with the scales."""
    big = max(float(t.detach().abs().max()) for t in taus)
    xbig = max((float(X.detach().abs().max()) for X in Xs), default=0.0) if Xs is not None else 0.0
    return InputError(
        f"esm: the eigensolver/SVD failed on layer {key!r} ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
        f"max |task vector| = {big:.3g}, max |activation| = {xbig:.3g}: values this large overflow the "
        "float32/float64 Gram and shift matrices. Check that the experts and the base are the same model at "
        "the same scale (a task vector is expert - base) and that the activations are finite and unscaled"
    )


def check_targets(base: Mapping[str, Tensor], matrix_keys: Sequence[str], targets: Sequence[str],
                   activations: Any, layer_types: Sequence[str]) -> list[str]:
    """The ESD keys, or an error (ESM never turns silently into TSV-M): explicit ``targets`` and ``layer_types``
    must each match a matrix key, the defaults at least one (else a warning for ``layer_types``); a mapping
    of ``activations`` may only name ESD keys."""
    where = "esm: "
    esd_keys = [k for k in matrix_keys if any(matches(p, k) for p in targets)]
    defaults = tuple(targets) == DEFAULT_TARGETS
    example = next(iter(matrix_keys), next(iter(base), "?"))
    if not esd_keys:
        what = f"none of the default targets {list(DEFAULT_TARGETS)} (open_clip names)" if defaults else \
            f"no pattern of targets={list(targets)}"
        raise InputError(
            f"{where}{what} matches a matrix key of the model (e.g. {example!r}); without ESD layers ESM "
            "would be TSV-M. Pass targets= with your model's layer names (regular expressions searched in "
            "the key, e.g. targets=('mlp.fc1.weight', 'self_attn.q_proj.weight'))"
        )
    unmatched = [p for p in targets if not any(matches(p, k) for k in matrix_keys)]
    if unmatched and defaults:
        warnings.warn(
            f"{where}the default target(s) {unmatched} (open_clip names) match no matrix key, so ESM runs on "
            f"{len(esd_keys)} layer(s) only and other matrices take TSV-M; pass targets= with your model's names "
            "(acetools.files.esm_inputs.esm_names(layout) has them for the layout presets)", RuntimeWarning,
            stacklevel=4)
    elif unmatched:
        hint = " (it names a key that is not a matrix)" if any(matches(unmatched[0], k) for k in base) else ""
        raise InputError(f"{where}target pattern {unmatched[0]!r} matches no matrix key of the model{hint}; "
                         f"e.g. {example!r}")
    if isinstance(activations, Mapping):
        esd_set = set(esd_keys)
        for key in activations:
            if key in esd_set:
                continue
            if key not in base:
                raise InputKeyError(
                    f"{where}activations are given for key {key!r}, which is not a weight of the model; "
                               "key activations by the weight's state-dict key (e.g. '...mlp.c_fc.weight')")
            raise InputKeyError(f"{where}activations are given for key {key!r}, which no ESM target selects, so they "
                           f"would be ignored; add it to targets (now {list(targets)}) or drop it")
    if layer_types:
        typed = [p for p in layer_types if any(matches(p, k) for k in matrix_keys)]
        if tuple(layer_types) == CLIP_LAYER_TYPES:
            if not typed:
                warnings.warn(
                    f"{where}none of the default layer_types (open_clip names) matches a matrix key, so the "
                    "inter-layer polarization (Step C) does nothing; pass layer_types= with your model's "
                    "names or layer_scaling=False", RuntimeWarning, stacklevel=4)
        else:
            missing = [p for p in layer_types if p not in typed]
            if missing:
                raise InputError(f"{where}layer_types pattern {missing[0]!r} matches no matrix key of the model; "
                                 f"e.g. {example!r}")
    return esd_keys
