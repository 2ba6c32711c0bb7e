"""TIES-Merging and DARE (docs/methods.md §TIES, §DARE): TIES' steps :func:`trim`, :func:`elect_sign`,
:func:`disjoint_merge`; DARE's :func:`dare_mask` and :func:`drop_and_rescale` before task arithmetic or TIES.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..utils import cpu_threads, make_generator, progress
from ._registry import LAMBDA_GRID, Param, Search, per_expert_values, register
from .averaging import ALIKE, WEIGHTS, weighted_sum

__all__ = [
    "kept_count",
    "trim_threshold",
    "radix_thresholds",
    "global_trim",
    "trim",
    "elect_sign",
    "majority_sign",
    "resolve_zero_signs",
    "disjoint_merge",
    "ties",
    "dare_seed",
    "dare_mask",
    "drop_and_rescale",
    "dare_task_vectors",
    "dare",
]

TaskVectors = Sequence[dict[str, Tensor]]
#: Entries of a key that TIES' histogram, election and disjoint merge handle at a time (elementwise once the
#: thresholds are known): their work space is a few (T, PART) tensors besides the task vectors, not a few
#: copies of them (docs/your-models.md §Memory: streaming and what each method holds). The result does not
#: depend on it. The parts run on one CPU thread: torch splits so few entries over two threads at most, and on
#: a busy machine the waits of those thousands of short parallel regions made TIES ~10x slower
#: (docs/performance.md §Cache-sized parts).
PART = 1 << 16


def _parts(n: int) -> range:
    return range(0, n, PART)


# --------------------------------------------------------------------------- TIES step 1: trim

def kept_count(n: int, k: float) -> int:
    """How many of ``n`` entries the top-``k``% trim keeps (before ties): floor(k * n / 100), ``k`` read as the
    decimal it prints as (``k=29`` on ``n=100`` keeps 29); peft's and mergekit's count (docs/methods.md §TIES)."""
    if not 0 < k <= 100:
        raise InputError(f"TIES k={k!r} is the percent of entries kept: it must be in (0, 100]")
    return min(n, math.floor(Fraction(repr(float(k))) * n / 100))


def trim_threshold(tau: Tensor | Iterable[Tensor], k: float) -> Tensor:
    """The :func:`kept_count`-th largest ``|tau|`` over one tensor or several flattened together (docs/methods.md
    §TIES): a 0-d tensor, ``inf`` when nothing is kept. Entries with ``|tau| >= threshold`` are kept."""
    parts = [tau] if isinstance(tau, Tensor) else list(tau)
    if not parts:
        raise InputError("trim_threshold needs at least one tensor")
    flat = parts[0].detach().abs().reshape(-1) if len(parts) == 1 else torch.cat(
        [p.detach().abs().reshape(-1) for p in parts])
    n_keep = kept_count(flat.numel(), k)
    if n_keep == 0:
        return flat.new_tensor(math.inf)
    # the n_keep-th largest is the (n - n_keep + 1)-th smallest
    idx = flat.numel() - n_keep
    if flat.device.type == "cpu" and flat.dtype in (torch.float32, torch.float64):
        # the same value as torch.kthvalue, about 4x faster on the CPU
        return flat.new_tensor(np.partition(flat.numpy(), idx)[idx])
    return torch.kthvalue(flat, idx + 1).values


def radix_thresholds(keys: Sequence[str], taus_of: Callable[[str], Sequence[Tensor]], n_tasks: int,
                     k: float | Sequence[float], dtype: torch.dtype, n: int,
                     bar: Callable[[Iterable, str], Iterable] | None = None) -> list[Tensor]:
    """Per task, :func:`trim_threshold` of the concatenated task vector without holding it: |tau| orders like
    its IEEE bits read as an integer, so a radix select over 16-bit digits (a call of ``taus_of(key)`` per key
    and digit) fixes it. ``k``: one percent for every task or one per task; ``n``: the entries over ``keys``;
    ``bar(iterable, desc)`` shows progress."""
    itype, nbits = (torch.int32, 32) if dtype == torch.float32 else (torch.int64, 64)
    n_keep = [kept_count(n, k_t) for k_t in per_expert_values("TIES", "k", k, n_tasks)]
    if not any(n_keep):
        return [torch.tensor(float("inf"), dtype=dtype) for _ in range(n_tasks)]
    rank = [n - m if m else 0 for m in n_keep]  # 0-based rank, ascending, of the threshold (any for m = 0)
    prefix = [0] * n_tasks
    shifts = list(range(nbits - 16, -1, -16))
    with cpu_threads(1):  # PART entries at a time (see PART)
        _radix_select(keys, taus_of, itype, shifts, rank, prefix, bar)
    return [torch.tensor(p, dtype=itype).view(dtype).clone() if m else torch.tensor(float("inf"), dtype=dtype)
            for p, m in zip(prefix, n_keep)]


def _radix_select(keys: Sequence[str], taus_of: Callable[[str], Sequence[Tensor]], itype: torch.dtype,
                  shifts: list[int], rank: list[int], prefix: list[int],
                  bar: Callable[[Iterable, str], Iterable] | None) -> None:
    """The passes of :func:`radix_thresholds`: one 16-bit digit of every task's threshold per pass, into
    ``prefix`` (``rank``: what is left of each task's rank below the digits fixed so far)."""
    n_tasks = len(rank)
    for level, shift in enumerate(shifts):
        hist = [torch.zeros(1 << 16, dtype=torch.int64) for _ in range(n_tasks)]
        for key in (bar or (lambda it, desc: it))(keys, f"TIES threshold pass {level + 1}/{len(shifts)}"):
            for t, tau in enumerate(taus_of(key)):
                flat = tau.reshape(-1)
                for a in _parts(flat.numel()):
                    bits = flat[a:a + PART].abs().view(itype)
                    if level > 0:
                        bits = bits[(bits >> (shift + 16)) == prefix[t]]
                    hist[t] += torch.bincount(((bits >> shift) & 0xFFFF).to(torch.int64), minlength=1 << 16).cpu()
        for t in range(n_tasks):
            cum = hist[t].cumsum(0)
            d = int(torch.searchsorted(cum, torch.tensor(rank[t]), right=True))
            rank[t] -= int(cum[d - 1]) if d > 0 else 0
            prefix[t] = (prefix[t] << 16) | d


def global_trim(view: Any, hparams: Mapping[str, Any],
                drop: Callable[[str, list[Tensor]], list[Tensor]] | None = None) -> dict[str, Any]:
    """TIES' ``prepare`` hook: with ``scope="global"``, ``{"global_trim": (thresholds, majority)}``, the per-task
    :func:`radix_thresholds` and the majority sign over the whole model, read from ``view``; ``{}`` for
    ``"tensor"``. ``drop(key, taus)`` changes the task vectors first (DARE-TIES)."""
    if hparams["scope"] != "global":
        return {}
    keys = view.keys
    dts = {view.dtype(key) for key in keys}
    if len(dts) > 1:
        raise InputError("TIES with scope='global' needs one dtype across keys (float64 and others are mixed)")

    def taus_of(key: str) -> list[Tensor]:
        taus = view.w0_taus(key)[1]
        return drop(key, taus) if drop is not None else taus

    T = view.n_tasks
    dtype = dts.pop() if dts else torch.float32
    thr = radix_thresholds(keys, taus_of, T, hparams["k"], dtype, sum(view.numel(key) for key in keys),
                           view.progress)
    weights = hparams.get("weights")
    with cpu_threads(1):  # PART entries at a time (see PART)
        majority = majority_sign(_elected(taus_of(key), thr, weights) for key in view.progress(keys, "TIES: elect"))
    return {"global_trim": (thr, majority)}


def _weighted(stack: Tensor, weights: Sequence[float] | None) -> Tensor:
    """The (T, ...) ``stack`` with row t times w_t (the stack itself when ``weights`` is ``None``)."""
    if weights is None:
        return stack
    w = torch.tensor(list(weights), dtype=stack.dtype, device=stack.device)
    return stack * w.reshape(-1, *([1] * (stack.ndim - 1)))


def _thresholds(task_vectors: TaskVectors, keys: Sequence[str], k: float | Sequence[float], scope: str
                ) -> list[dict[str, Tensor]]:
    """Per task, the trim threshold of every key (one shared value when ``scope='global'``); ``k`` one percent
    for every task or one per task."""
    out = []
    for tv, k_t in zip(task_vectors, per_expert_values("TIES", "k", k, len(task_vectors))):
        if scope == "global":
            thr = trim_threshold((tv[key] for key in keys), k_t)
            out.append({key: thr for key in keys})
        elif scope == "tensor":
            out.append({key: trim_threshold(tv[key], k_t) for key in keys})
        else:
            raise InputError(f"TIES scope={scope!r} must be 'global' (whole model) or 'tensor' (per key)")
    return out


def trim(task_vectors: TaskVectors, k: float | Sequence[float] = 20, scope: str = "global"
         ) -> list[dict[str, Tensor]]:
    """TIES step 1 (docs/methods.md §TIES, Eq. (TIES.1)): keep the top-``k``% entries of each tau_t by magnitude
    (``k`` one percent, or one per task), ranked over the whole task vector (``scope="global"``) or per key
    (``"tensor"``). New dicts."""
    if len(task_vectors) == 0:
        raise InputError("trim needs at least one task vector")
    keys = list(task_vectors[0])
    thr = _thresholds(task_vectors, keys, k, scope)
    return [
        {key: torch.where(tv[key].abs() >= t[key], tv[key], 0) for key in keys}
        for tv, t in zip(task_vectors, thr)
    ]


# --------------------------------------------------------------------------- TIES step 2: elect

def elect_sign(trimmed: Tensor) -> Tensor:
    """gamma = sign(sum_t tau_hat_t) over a (T, ...) stack (docs/methods.md §TIES, Eq. (TIES.2)); 0 where the sum
    is 0 (:func:`resolve_zero_signs`)."""
    return torch.sign(trimmed.sum(0))


def majority_sign(gammas: Iterable[Tensor]) -> int:
    """The sign of the sum of all elected signs: +1, -1, or 0 if they balance exactly."""
    total = sum(int(g.to(torch.int64).sum()) for g in gammas)
    return (total > 0) - (total < 0)


def resolve_zero_signs(gamma: Tensor, majority: int) -> Tensor:
    """Give the coordinates with gamma == 0 the majority sign (docs/methods.md §TIES, Eq. (TIES.2)), as a new tensor."""
    return torch.where(gamma == 0, torch.full_like(gamma, majority), gamma)


# --------------------------------------------------------------------------- TIES step 3: disjoint merge

def disjoint_merge(trimmed: Tensor, gamma: Tensor, merge: str = "mean", weights: Sequence[float] | None = None
                   ) -> Tensor:
    """Disjoint merge of a (T, ...) stack of trimmed task vectors (docs/methods.md §TIES, Eq. (TIES.3)): per
    coordinate, the mean (``merge="mean"``) or sum of the non-zero values with the sign ``gamma`` (0 where
    ``gamma`` is 0). With ``weights``, ``trimmed`` holds the weighted w_t tau_hat_t and the mean divides by
    the agreeing tasks' summed weights, 1 where that is 0 (Eq. (TIES.5))."""
    agree = (torch.sign(trimmed) == gamma) & (trimmed != 0)
    total = torch.where(agree, trimmed, 0).sum(0)
    if merge == "sum":
        return total
    if merge == "mean" and weights is not None:
        divisor = _weighted(agree.to(total.dtype), weights).sum(0)
        return total / torch.where(divisor == 0, 1, divisor)
    if merge == "mean":
        return total / agree.sum(0).clamp(min=1).to(total.dtype)
    raise InputError(f"TIES merge={merge!r} must be 'mean' (disjoint mean) or 'sum'")


def _trimmed_part(flat: Sequence[Tensor], thr: Sequence[Tensor], a: int, weights: Sequence[float] | None
                  ) -> Tensor:
    """(T, PART) stack of the trimmed entries a:a+PART of the flattened task vectors ``flat``, row t times w_t
    when ``weights`` are given (Eq. (TIES.5))."""
    return _weighted(torch.stack([torch.where(f[a:a + PART].abs() >= th.to(f.device), f[a:a + PART], 0)
                                  for f, th in zip(flat, thr)]), weights)


def _elected(taus: Sequence[Tensor], thr: Sequence[Tensor], weights: Sequence[float] | None = None) -> Tensor:
    """The elected sign (int8, flattened) of one key's task vectors trimmed at ``thr`` (one per task) and
    weighted by ``weights``, PART entries at a time."""
    flat = [t.reshape(-1) for t in taus]
    gamma = torch.empty(flat[0].numel(), dtype=torch.int8, device=flat[0].device)
    for a in _parts(gamma.numel()):
        gamma[a:a + PART] = elect_sign(_trimmed_part(flat, thr, a, weights))
    return gamma


def _ties_key(taus: Sequence[Tensor], thr: Sequence[Tensor], majority: int | None, merge: str,
              weights: Sequence[float] | None = None) -> Tensor:
    """v_m of one key (Eqs. (TIES.1)-(TIES.3), (TIES.5) with ``weights``) from its task vectors trimmed at
    ``thr``: elect, zero signs to ``majority`` (None: the key's own), disjoint merge; PART entries at a time,
    in two passes."""
    gamma = _elected(taus, thr, weights)
    if majority is None:
        majority = majority_sign([gamma])
    flat = [t.reshape(-1) for t in taus]
    out = torch.empty_like(flat[0])
    for a in _parts(out.numel()):
        trimmed = _trimmed_part(flat, thr, a, weights)
        g = resolve_zero_signs(gamma[a:a + PART], majority).to(trimmed.dtype)
        out[a:a + PART] = disjoint_merge(trimmed, g, merge, weights)
    return out.view(taus[0].shape)


def _ties_update(task_vectors: TaskVectors, keys: Sequence[str], *, k: float | Sequence[float], lam: float,
                 scope: str, merge: str, desc: str, given: tuple[Sequence[Tensor], int] | None = None,
                 weights: Sequence[float] | None = None) -> dict[str, Tensor]:
    """lam * v_m for every key: trim, elect, resolve zero signs, disjoint merge. ``given``:
    the global thresholds and majority sign of the whole model (:func:`global_trim`); ``weights``: w_t, each
    trimmed tau_t weighted before the election (Eq. (TIES.5))."""
    if given is not None and scope == "global":
        thr = [{key: t for key in keys} for t in given[0]]
    else:
        thr = _thresholds(task_vectors, keys, k, scope)
    majority = None
    out = {}
    with cpu_threads(1):  # PART entries at a time (see PART)
        if scope == "global":  # one majority sign over the model: a pass over every key's elected sign first
            majority = given[1] if given is not None else majority_sign(
                _elected([tv[key] for tv in task_vectors], [t[key] for t in thr], weights)
                for key in progress(keys, desc=f"{desc}: elect"))
        for key in progress(keys, desc=f"{desc}: merge"):
            out[key] = _ties_key([tv[key] for tv in task_vectors], [t[key] for t in thr], majority, merge,
                                 weights).mul_(lam)
    return out


_K = Param("percent of entries KEPT per task by the magnitude trim, 0 < k <= 100 (or one per expert)",
           low=0.0, high=100.0, low_open=True, per_expert=True)
_SCOPE = Param("trim over the whole flattened model ('global') or per tensor ('tensor')",
               choices=("global", "tensor"))
_MERGE = Param("disjoint 'mean' (paper, TSV/Iso code) or 'sum' (fusion_bench)", choices=("mean", "sum"))


def _ties_scope(scope: str) -> tuple[str, str]:
    """TIES' key scope: per key with ``scope="tensor"``, two extra passes with ``"global"``."""
    if scope == "global":
        return "global_ties", ("scope='global' ranks every key of a task vector together (one trim threshold per "
                               "task) and elects one majority sign over the whole model")
    return "key", ""


@register(
    "ties",
    "TIES-Merging: trim to top-k%, elect sign by mass, disjoint mean; theta0 + lam * v_m (docs/methods.md §TIES)",
    key_scope=lambda hp: _ties_scope(hp["scope"]),
    prepare=global_trim,
    note=ALIKE,
    search=Search("lam", "grid", LAMBDA_GRID),
    k=_K,
    lam=Param("scaling of the merged task vector v_m", low=0.0),
    scope=_SCOPE,
    merge=_MERGE,
    weights=WEIGHTS,
)
def ties(base, task_vectors, *, is_matrix, k=20, lam=1.0, scope="global", merge="mean", weights=None,
         global_trim=None):
    """TIES-Merging (docs/methods.md §TIES): trim, elect, disjoint merge, times ``lam``, on every key.
    ``global_trim``: the whole model's thresholds and majority sign (:func:`global_trim`) in a streamed merge;
    ``weights``: per-expert w_t (Eq. (TIES.5), mergekit's ``weight``)."""
    keys = list(base)
    k, w = _per_expert_k_weights("ties", k, weights, len(task_vectors))
    return _ties_update(task_vectors, keys, k=k, lam=lam, scope=scope, merge=merge, desc="TIES", given=global_trim,
                        weights=w)


def _per_expert_k_weights(method: str, k: Any, weights: Any, n_tasks: int) -> tuple[Any, list[float] | None]:
    """``k`` and ``weights`` with a per-expert list checked against ``n_tasks`` (an error naming both counts)."""
    if isinstance(k, (list, tuple)):
        k = per_expert_values(method, "k", k, n_tasks)
    return k, None if weights is None else per_expert_values(method, "weights", weights, n_tasks)


# --------------------------------------------------------------------------- DARE

def dare_seed(seed: int, task: int, key: str) -> int:
    """The seed of the DARE mask of expert ``task`` at ``key`` (docs/methods.md §DARE): the first 8 bytes
    (little-endian, top bit cleared) of ``sha256(f"acetools.dare:{seed}:{task}:{key}")``."""
    digest = hashlib.sha256(f"acetools.dare:{int(seed)}:{int(task)}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def dare_mask(shape: Sequence[int] | torch.Size, p: float, seed: int, task: int, key: str,
              device: str | torch.device = "cpu") -> Tensor:
    """Boolean DARE drop mask m ~ Bernoulli(p) (True = dropped; docs/methods.md §DARE), drawn on the CPU from
    :func:`dare_seed` as float32 ``torch.rand(shape) < p``, so the same on every device and dtype."""
    if not 0 <= p < 1:
        raise InputError(f"DARE drop rate p={p!r} must be in [0, 1)")
    g = make_generator(dare_seed(seed, task, key))
    return (torch.rand(tuple(shape), generator=g, dtype=torch.float32) < p).to(device)


def drop_and_rescale(tau: Tensor, dropped: Tensor, p: float, rescale: bool = True) -> Tensor:
    """tau_hat = (1 - m) * tau / (1 - p) for a boolean drop mask ``m`` (without ``rescale``: no division)."""
    if dropped.shape != tau.shape:
        raise InputError(f"DARE mask shape {tuple(dropped.shape)} does not match the task vector {tuple(tau.shape)}")
    kept = torch.where(dropped.to(tau.device), 0, tau)
    return kept / (1.0 - p) if rescale else kept


def dare_task_vectors(
    task_vectors: TaskVectors, p: float | Sequence[float], seed: int = 0, rescale: bool = True
) -> list[dict[str, Tensor]]:
    """DARE applied to every key of every task vector (new dicts; masks from :func:`dare_mask`); ``p`` one drop
    rate, or one per task."""
    out = []
    for t, (tv, p_t) in enumerate(zip(task_vectors, per_expert_values("dare", "p", p, len(task_vectors)))):
        out.append({
            key: drop_and_rescale(tau, dare_mask(tau.shape, p_t, seed, t, key, tau.device), p_t, rescale)
            for key, tau in progress(tv.items(), desc=f"DARE: task {t}", total=len(tv))
        })
    return out


def _dare_prepare(view: Any, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """DARE's ``prepare`` hook: DARE-TIES' global trim over the dropped task vectors (:func:`global_trim`)."""
    if hparams["base_method"] != "ties":
        return {}
    seed, rescale = hparams["seed"], hparams["rescale"]
    ps = per_expert_values("dare", "p", hparams["p"], view.n_tasks)

    def drop(key: str, taus: list[Tensor]) -> list[Tensor]:
        return [drop_and_rescale(tau, dare_mask(tau.shape, p, seed, t, key, tau.device), p, rescale)
                for t, (tau, p) in enumerate(zip(taus, ps))]

    return global_trim(view, hparams, drop)


@register(
    "dare",
    "DARE: drop each task-vector entry with prob. p, rescale by 1/(1-p), then TA or TIES (docs/methods.md §DARE)",
    key_scope=lambda hp: _ties_scope(hp["scope"]) if hp["base_method"] == "ties" else ("key", ""),
    prepare=_dare_prepare,
    note=ALIKE,
    search=Search("lam", "grid", LAMBDA_GRID),
    p=Param("drop rate of the Bernoulli mask, 0 <= p < 1 (or one per expert)", low=0.0, high=1.0,
            high_open=True, per_expert=True),
    base_method=Param("merge applied after dropping", choices=("task_arithmetic", "ties")),
    seed=Param("seed of the masks; each (task, key) mask is seeded from it (dare_seed)",
               check=lambda v: None if isinstance(v, int) and not isinstance(v, bool) else
               f"seed must be an int, got {type(v).__name__}"),
    lam=Param("scaling of the merged task vector", low=0.0),
    rescale=Param("divide the kept entries by 1 - p", types=(bool,)),
    k=_K,
    scope=_SCOPE,
    merge=_MERGE,
    weights=WEIGHTS,
)
def dare(base, task_vectors, *, is_matrix, p=0.5, base_method="task_arithmetic", seed=0, lam=0.3, rescale=True,
         k=20, scope="global", merge="mean", weights=None, global_trim=None):
    """DARE (docs/methods.md §DARE): :func:`dare_task_vectors`, then task arithmetic or TIES (``base_method``),
    times ``lam``; ``weights`` as for task arithmetic or TIES. ``global_trim``: as for :func:`ties`."""
    k, w = _per_expert_k_weights("dare", k, weights, len(task_vectors))
    dropped = dare_task_vectors(task_vectors, per_expert_values("dare", "p", p, len(task_vectors)), seed, rescale)
    keys = list(base)
    if base_method == "task_arithmetic":
        return {key: weighted_sum([tv[key] for tv in dropped], w).mul_(lam) for key in keys}
    return _ties_update(dropped, keys, k=k, lam=lam, scope=scope, merge=merge, desc="DARE-TIES", given=global_trim,
                        weights=w)
