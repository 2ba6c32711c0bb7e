"""The one merge driver: :func:`acetools.merge` (state dicts) and ``acetools merge`` (checkpoints) run :func:`run`.

A :class:`Source` holds a base and T experts read one tensor at a time. :func:`run` carries the
non-float buffers, emits tied aliases after their key, turns in x out weights to d_out x d_in around the
method, checks inputs and merged tensors for NaN/Inf and emits every key in the base's order: one call
of the method on the whole model, or key by key ((T + 2) x the largest tensor held) after the registry's
``prepare`` hook (docs/methods.md §Matrix path); a ``summed`` method through :meth:`Source.summed`, every
input read once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError, InputKeyError
from ..layouts import Layout
from ..utils import PROGRESS, cpu_threads, format_bytes, progress
from ._registry import METHODS, MethodInfo, is_matrix_param

__all__ = ["Source", "ModelView", "run", "span_update", "merge_key", "per_key_entries", "compute_dtype", "is_finite",
           "check_finite", "check_same_keys", "carried_buffers", "confirmed_ties", "format_bytes", "is_matrix_param"]

log = logging.getLogger("acetools.merging")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a method computes in for weights stored in ``dtype``: float64 stays, the rest is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def is_finite(t: Tensor) -> bool:
    """Whether every entry of ``t`` is finite, in one read: only a sum that is not finite (a NaN/Inf term,
    or overflow) needs the entry-wise test."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    return math.isfinite(float(t.sum(dtype=acc))) or bool(torch.isfinite(t).all())


def check_finite(name: str, key: str, t: Tensor) -> None:
    """Raise an ``InputError`` naming ``name[key]`` and its NaN/Inf counts unless ``t`` is finite."""
    if not is_finite(t):
        n_nan, n_inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        raise InputError(f"{name}[{key!r}] contains {n_nan} NaN and {n_inf} Inf values")


def check_same_keys(base_keys: Iterable[str], keys: Iterable[str], who: str, base: str = "base") -> None:
    """Raise a ``KeyError`` unless ``keys`` (an expert's) are exactly ``base_keys``, naming ``who`` and the
    first key it lacks or adds: "experts[2] is missing key 'visual.proj' that base has"."""
    base_keys = list(base_keys)
    kset, bset = set(keys), set(base_keys)
    missing = [k for k in base_keys if k not in kset]
    extra = sorted(kset - bset)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputKeyError(f"{who} is missing key {missing[0]!r}{more} that {base} has")
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise InputKeyError(f"{who} has key {extra[0]!r}{more} that {base} does not have")


def _raw(model: Any, key: str) -> Tensor:
    """One tensor of a state dict (``model[key]``) or of a checkpoint reader (``model.get(key)``)."""
    return model[key] if isinstance(model, Mapping) else model.get(key)


def confirmed_ties(tied: Mapping[str, str], base: Any, experts: Sequence[Any]) -> dict[str, str]:
    """The ties of a layout that hold in these models (both keys present and equal in every model); the
    others are logged and merged apart. ``base`` / ``experts``: state dicts or checkpoint readers."""
    models = [base, *experts]
    out = {}
    for alias, canon in tied.items():
        if not all(alias in m.keys() and canon in m.keys() for m in models):
            continue
        if all(torch.equal(_raw(m, alias), _raw(m, canon)) for m in models):
            out[alias] = canon
        else:
            log.info("%s and %s are not tied in these checkpoints (values differ); merging them apart", alias, canon)
    return out


def carried_buffers(base: Any, experts: Sequence[Any], *, stacklevel: int = 3, carry: Iterable[str] = ()
                    ) -> dict[str, list[int]]:
    """The non-float keys of ``base`` and the keys in ``carry`` (carried through unchanged), each with the
    experts whose value differs from the base's (e.g. BatchNorm's ``num_batches_tracked``), which a warning
    names. ``base`` / ``experts`` are state dicts or checkpoint readers."""
    out: dict[str, list[int]] = {}
    carry = set(carry)
    for k in base.keys():
        w0 = _raw(base, k)
        if w0.is_floating_point() and k not in carry:
            continue
        differ = [i for i, ex in enumerate(experts) if not torch.equal(_raw(ex, k).cpu(), w0.cpu())]
        if differ:
            warnings.warn(
                f"non-float buffer {k!r} differs from the base in experts {differ}; the merged model keeps the "
                "base's value (buffers are not merged)", UserWarning, stacklevel=stacklevel,
            )
        out[k] = differ
    return out


class PinnedStaging:
    """Two pinned host buffers that CPU tensors pass through on their way to a CUDA device: :meth:`to`
    starts a non-blocking transfer from one while the next call fills the other (reused once a CUDA event
    says its transfer finished), so reading overlaps the copies and only two buffers are pinned."""

    def __init__(self):
        self.buffers: list[Tensor | None] = [None, None]
        self._done: list[Any] = [None, None]
        self._next = 0

    def to(self, t: Tensor, device: torch.device) -> Tensor:
        i, self._next = self._next, self._next ^ 1
        if self._done[i] is not None:
            self._done[i].synchronize()
        n = t.numel() * t.element_size()
        buf = self.buffers[i]
        if buf is None or buf.numel() < n:
            buf = self.buffers[i] = torch.empty(max(n, 1), dtype=torch.uint8, pin_memory=True)
        staged = buf[:n].view(t.dtype).reshape(t.shape)
        staged.copy_(t)
        out = staged.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._done[i] = done
        return out


class Source:
    """A base and T experts, read one tensor at a time: state dicts or checkpoint readers (``keys()``,
    ``get(key)``, ``meta(key)``: :class:`acetools.files.checkpoints.Checkpoint`). ``names`` name them in
    errors; with ``check_finite`` each tensor is checked for NaN/Inf the first time its key is read."""

    def __init__(self, base: Any, experts: Sequence[Any], *, names: Sequence[str] | None = None,
                 check_finite: bool = True):
        self.base, self.experts = base, list(experts)
        self.names = list(names) if names is not None else ["base", *(f"experts[{i}]" for i in range(len(experts)))]
        self.check = check_finite
        self._checked: set[tuple[int, str]] = set()
        self.staging = PinnedStaging()  # CPU tensors go to a CUDA device through pinned memory

    @property
    def n_tasks(self) -> int:
        return len(self.experts)

    def keys(self) -> list[str]:
        return list(self.base.keys())

    def dtype(self, key: str) -> torch.dtype:
        """The base's dtype at ``key`` (read from the header for a checkpoint)."""
        return self.base[key].dtype if isinstance(self.base, Mapping) else self.base.meta(key).dtype

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.base[key].shape if isinstance(self.base, Mapping) else self.base.meta(key).shape)

    def raw(self, i: int, key: str) -> Tensor:
        """Model ``i``'s tensor as stored (0: the base, t + 1: expert t)."""
        return _raw(self.base if i == 0 else self.experts[i - 1], key)

    def _read(self, i: int, key: str, device: torch.device) -> Tensor:
        t = self.raw(i, key)
        if device.type == "cuda" and t.device.type == "cpu" and t.numel():
            t = self.staging.to(t, device)  # a new device tensor of ours: checked there, converted in place
        return t

    def tensor(self, i: int, key: str, layout: Layout, device: torch.device, dtype: torch.dtype | None = None
               ) -> Tensor:
        """Model ``i``'s tensor of ``key`` (0: the base), d_out x d_in, contiguous, in ``dtype`` (default the
        key's compute dtype) on ``device``; it may share the source's memory. NaN/Inf are an error naming
        the model the first time it is read."""
        t = self._read(i, key, device)
        self._check(i, key, t)
        return layout.to_canonical(key, t).to(device, dtype or compute_dtype(self.dtype(key))).contiguous()

    def _check(self, i: int, key: str, t: Tensor) -> None:
        if self.check and (i, key) not in self._checked:
            check_finite(self.names[i], key, t)
            self._checked.add((i, key))

    def check_key(self, key: str, device: torch.device) -> None:
        """Check every model's ``key`` not checked yet for NaN/Inf (an error naming the first with any)."""
        for i in range(self.n_tasks + 1):
            if self.check and (i, key) not in self._checked:
                self._check(i, key, self._read(i, key, device))

    def summed(self, key: str, scale: float, device: torch.device, chunk: int = 1 << 18) -> Tensor:
        """W0 + scale x sum_t (W_t - W0) of ``key`` as stored, in the compute dtype: the bits of
        :func:`acetools.merging.averaging.summed`, every input read once (on the CPU ``chunk`` entries at a
        time, through a buffer that stays in the cache). Not checked for NaN/Inf (see :meth:`check_key`)."""
        dt = compute_dtype(self.dtype(key))
        W0, *Ws = (self._read(i, key, device).to(device, dt).reshape(-1) for i in range(self.n_tasks + 1))
        n = W0.numel()
        step = max(1, min(n, chunk) if device.type == "cpu" else n)
        acc = torch.empty_like(W0)
        tmp = torch.empty(step, dtype=dt, device=device)
        # one CPU thread: torch splits a cached chunk over two threads at most, and on a busy machine the waits
        # of those many short parallel regions made this loop ~10x slower (docs/performance.md §Cache-sized parts)
        with cpu_threads(1) if device.type == "cpu" else contextlib.nullcontext():
            for a in range(0, n, step):
                w0, out = W0[a:a + step], acc[a:a + step]
                torch.sub(Ws[0][a:a + step], w0, out=out)
                for W in Ws[1:]:
                    out.add_(torch.sub(W[a:a + step], w0, out=tmp[:out.numel()]))
                out.mul_(scale).add_(w0)
        return acc.view(self.shape(key))


class ModelView:
    """What a method's ``prepare`` hook sees of the model: ``keys`` (the float keys merged, in the base's
    order), ``n_tasks``; :meth:`w0_taus` reads a key's task vectors again on every call."""

    def __init__(self, source: Source, layout: Layout, keys: Sequence[str], device: torch.device, show: bool | None):
        self.source, self.layout, self.keys, self.device, self._show = source, layout, list(keys), device, show

    @property
    def n_tasks(self) -> int:
        return self.source.n_tasks

    def dtype(self, key: str) -> torch.dtype:
        """The compute dtype of ``key``."""
        return compute_dtype(self.source.dtype(key))

    def numel(self, key: str) -> int:
        return math.prod(self.source.shape(key))

    def w0_taus(self, key: str) -> tuple[Tensor, list[Tensor]]:
        """W0 and the T task vectors tau_t = W_t - W0 of ``key`` (d_out x d_in, compute dtype)."""
        src, lay, dev = self.source, self.layout, self.device
        W0 = src.tensor(0, key, lay, dev)
        # one expert at a time: W0, the task vectors and one expert's tensor are held (T + 2 tensors)
        return W0, [src.tensor(t + 1, key, lay, dev, W0.dtype) - W0 for t in range(src.n_tasks)]

    def progress(self, iterable: Iterable, desc: str) -> Iterable:
        """``iterable`` with a progress bar when the merge shows one."""
        return progress(list(iterable), desc=desc, enabled=self._show)


def per_key_entries(value: Any, key: str) -> Any:
    """One key's part of a per-key input (``MethodInfo.per_key``): one dict per expert (covariances, Grams)
    -> ``[{key: x_t}, ...]`` (``{}`` where an expert has none); a mapping ``key -> x`` -> ``{key: x}``;
    ``None`` and callables pass unchanged."""
    if value is None or callable(value):
        return value
    if isinstance(value, Mapping):
        return {key: value[key]} if key in value else {}
    return [{key: d[key]} if key in d else {} for d in value]


def merge_key(
    method: str | MethodInfo,
    key: str,
    W0: Tensor,
    taus: Sequence[Tensor],
    *,
    is_matrix: bool,
    hparams: Mapping[str, Any],
    prepared: Mapping[str, Any] | None = None,
) -> Tensor:
    """The merged update of one key: ``method`` called on the one-key state dict ``{key: W0}``.

    ``W0`` and ``taus``: d_out x d_in for matrices, in the compute dtype; ``hparams``: resolved
    (``METHODS[method].resolve``); ``prepared``: what the ``prepare`` hook returned. For key scope
    ``"key"`` it equals that key's update from the whole-model call.
    """
    info = method if isinstance(method, MethodInfo) else METHODS[method]
    hp = dict(hparams)
    for name in info.per_key:
        hp[name] = per_key_entries(hp.get(name), key)
    out = info.func({key: W0}, [{key: t} for t in taus], is_matrix=lambda k, t: bool(is_matrix), **hp,
                    **(prepared or {}))
    return out[key]


class _KeyByKeyTaskVector(Mapping):
    """tau_t = W_t - W0 of one expert, formed when a method asks for a key (d_out x d_in, compute dtype):
    the whole-model call holds the task vectors of one key. The last key asked for is kept."""

    def __init__(self, source: Source, t: int, W0: Mapping[str, Tensor], layout: Layout, dev: torch.device):
        self._source, self._t, self._W0, self._lay, self._dev = source, t, W0, layout, dev
        self._key: str | None = None
        self._value: Tensor | None = None

    def __getitem__(self, key: str) -> Tensor:
        if key == self._key and self._value is not None:
            return self._value
        w0 = self._W0[key]
        self._key, self._value = None, None  # free the previous key's tensor first
        value = self._source.tensor(self._t + 1, key, self._lay, self._dev, w0.dtype) - w0
        self._key, self._value = key, value
        return value

    def __iter__(self):
        return iter(self._W0)

    def __len__(self) -> int:
        return len(self._W0)


def span_update(method: str, key: str, factors: Sequence[tuple[Tensor, Tensor]], hparams: Mapping[str, Any],
                is_matrix: bool, device: torch.device) -> Tensor:
    """The merged update of ``key`` (d_out x d_in, on ``device``) from each task's factors (B_t, A_t), computed in
    their span (:func:`acetools.merging.lowrank.lowrank_update`; docs/methods.md §Low-rank updates)."""
    from .lowrank import lowrank_update

    up = lowrank_update(method, factors, hparams, is_matrix=is_matrix, key=key)
    return up.B.to(device) @ up.A.to(device)


def run(
    info: MethodInfo,
    hparams: Mapping[str, Any],
    source: Source,
    layout: Layout,
    emit: Callable[[str, Tensor], None],
    *,
    device: torch.device,
    is_matrix: Callable[[str, Tensor], bool] | None = None,
    whole_model: bool = False,
    out_dtype: torch.dtype | None = None,
    out_device: str | torch.device = "cpu",
    show: bool | None = None,
    hparams_text: str | None = None,
    carry: Iterable[str] = (),
    factors: Callable[[str], Sequence[tuple[Tensor, Tensor]] | None] | None = None,
) -> dict[str, Any]:
    """Merge ``source`` with the method ``info`` (resolved ``hparams``) and ``emit(key, tensor)`` every key.

    Every key of the base once, in its order (module docstring): W0 + the merged update as stored, in
    ``out_dtype`` (default: the base's dtype of that key) on ``out_device``. ``whole_model``: one call of
    the method; otherwise key by key. ``is_matrix(key, tensor)`` defaults to the layout's rule; ``show``:
    progress bars (``None``: interactive sessions only); ``carry``: float keys carried from the base like the
    non-float ones (non-persistent buffers); ``factors(key)``: the tasks' factors (B_t, A_t) of ``key``, merged
    key by key in their span (:func:`span_update`), or ``None``. Returns ``{"tied": {alias: key},
    "buffers_changed": {key: [expert indices]}}``.
    """
    is_mat = is_matrix or layout.is_matrix
    buffers = carried_buffers(source.base, source.experts, stacklevel=4, carry=carry)
    tied = confirmed_ties(layout.tied, source.base, source.experts)
    aliases_of: dict[str, list[str]] = {}
    for a, c in tied.items():
        aliases_of.setdefault(c, []).append(a)
    order = source.keys()
    keys = [k for k in order if k not in buffers and k not in tied]
    view = ModelView(source, layout, keys, device, show)
    name = info.name
    text = hparams_text if hparams_text is not None else str(dict(hparams))

    def checked(key: str, merged: Tensor) -> Tensor:
        if not is_finite(merged):
            source.check_key(key, device)  # a NaN/Inf input is named first
            raise FloatingPointError(f"{name} produced non-finite weights at key {key!r}; check the hyperparameters "
                                     f"({text}) and the scale of the task vectors")
        return merged

    def stored(key: str, W0: Tensor, d: Tensor) -> Tensor:  # W0 + update, checked, as stored
        if d.shape != W0.shape:
            raise RuntimeError(f"{name} returned shape {tuple(d.shape)} for key {key!r}, expected {tuple(W0.shape)}")
        return layout.from_canonical(key, checked(key, W0 + d.to(W0.device, W0.dtype)))

    def emit_in_order(merged_of: Callable[[str], Tensor], bar: bool = False) -> None:
        """Every key in the base's order: buffers carried from the base, tied aliases after their key."""
        for key in progress(order, desc=f"{name}: merge", enabled=show if bar else False):
            if key in buffers:
                emit(key, source.raw(0, key).to(out_device).clone())
            elif key not in tied:
                out = merged_of(key).to(out_device, out_dtype or source.dtype(key)).contiguous()
                emit(key, out)
                for alias in aliases_of.get(key, ()):
                    emit(alias, out.clone())

    def one_call() -> None:  # one call of the method; task vectors formed key by key as it reads them
        W0 = {k: source.tensor(0, k, layout, device) for k in keys}
        tvs = [_KeyByKeyTaskVector(source, t, W0, layout, device) for t in range(source.n_tasks)]
        delta = dict(info.func(W0, tvs, is_matrix=is_mat, **hparams))
        del tvs  # the last key's task vectors
        missing = [k for k in keys if k not in delta]
        if missing:  # a bug in the method, not in the user's input
            raise RuntimeError(f"{name} returned no update for key {missing[0]!r}")
        emit_in_order(lambda k: stored(k, W0.pop(k), delta.pop(k)))

    def key_by_key() -> None:  # one call per key, after the registry's prepare hook
        prepared = dict(info.prepare(view, hparams)) if info.prepare is not None else {}
        scale = None if info.summed is None else info.summed(hparams)

        def merged(key: str) -> Tensor:  # T + 2 tensors held
            if factors is not None and (fs := factors(key)) is not None:  # LoRA experts: no task vector formed
                W0 = source.tensor(0, key, layout, device)
                return stored(key, W0, span_update(name, key, fs, hparams, bool(is_mat(key, W0)), device))
            if scale is not None:  # every input read once, into one buffer
                return checked(key, source.summed(key, scale, device))
            W0, taus = view.w0_taus(key)
            d = merge_key(info, key, W0, taus, is_matrix=bool(is_mat(key, W0)), hparams=hparams, prepared=prepared)
            del taus
            return stored(key, W0, d)

        emit_in_order(merged, bar=True)

    token = PROGRESS.set(show if whole_model else False)  # key by key, the methods' own bars would flicker
    try:
        if whole_model:
            one_call()
        else:
            key_by_key()
    finally:
        PROGRESS.reset(token)
    return {"tied": tied, "buffers_changed": {k: v for k, v in buffers.items() if v}}

