"""Merge checkpoints on disk: ``acetools merge`` in Python (:func:`merge_files`).

Two drivers share one layout (:mod:`acetools.layouts`) and give equal results:

- **streaming** (methods whose :func:`acetools.merging.key_scope` is ``"key"``: weight
  averaging, task arithmetic, TIES/DARE with ``scope="tensor"``, TSV-M, Iso-C, Iso-CTS, CART,
  WUDI, ACE, RegMean): for each key, read W0 and the T expert tensors from disk (safetensors are
  read lazily), merge that key (:func:`acetools.merging.merge_key`) and hand the result to a
  :class:`acetools.files.checkpoints.ShardedWriter`. Peak memory is about (T + 2) x the largest
  tensor in the compute dtype plus the method's work space for it (the writer holds no
  shard). TIES and DARE-TIES with ``scope="global"`` stream too, with extra read passes: two
  (four for float64) for the exact per-task trim threshold over the whole model (a radix
  select on the float bits: the same value as sorting every entry), one for the majority
  sign, then the merge pass;
- **in memory** (ESM, or ``mode="memory"``): the whole base and experts are loaded and
  :func:`acetools.merge` is called, then written the same way.

Non-float tensors are carried from the base; tied keys (GPT-2's ``lm_head``/``wte``) are
merged once and written under every key the base file has; in x out weights are transposed to
d_out x d_in around the method. Classifier heads of different shapes (``num_labels``) stay per task
(``heads="per-task"``, the default for classifiers: :mod:`acetools.files.heads`). See
docs/your-models.md.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import __version__
from ..errors import InputError, InputKeyError, InputTypeError
from ..layouts import Layout, describe, get_layout
from ..merging import METHODS, check_same_keys, confirmed_ties, key_scope, merge, merge_key
from ..merging.esm import with_layout_names
from ..merging.ties import dare_mask, disjoint_merge, drop_and_rescale, elect_sign, kept_count, resolve_zero_signs
from ..utils import PROGRESS, jsonable, progress, resolve_device, short_repr
from .checkpoints import (
    Checkpoint,
    ShardedWriter,
    check_output_folder,
    copy_side_files,
    file_sha256,
    open_checkpoint,
    parse_size,
)
from .heads import HEAD_MODES, HeadPlan, HeadWriter, check_heads_folder, plan_heads, remove_stale_heads

__all__ = ["merge_files", "plan_merge", "MergePlan", "MergeResult", "parse_dtype", "DTYPES", "save_activations",
           "load_activations"]

log = logging.getLogger("acetools.files.merge_files")

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}
MODES = ("auto", "stream", "memory")


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``None`` (keep the base's dtype per key) or a float dtype from a name like ``bf16``."""
    if dtype is None or isinstance(dtype, torch.dtype):
        if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
            raise InputError(f"output dtype must be a floating type, got {dtype}")
        return dtype
    name = str(dtype).lower().replace("torch.", "")
    if name in ("base", "auto", "none"):
        return None
    if name not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; use one of: base, {', '.join(DTYPES)}")
    return DTYPES[name]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def save_activations(path: str | Path, activations: Mapping[str, Sequence[Tensor]]) -> Path:
    """Save ESM's proxy activations ``{weight key: [X_1, ..., X_T]}`` as one safetensors file.

    Tensor names are ``"<weight key>@<t>"`` (t from 0, in the order of the experts), so that
    ``acetools merge --method esm -p activations=FILE`` (or ``activations: FILE`` in a config)
    can read them back (:func:`load_activations`). Written atomically.
    """
    from safetensors.torch import save

    from ..utils import atomic_write

    flat = {}
    for key, xs in activations.items():
        if "@" in key:
            raise InputError(f"activation key {key!r} contains '@', which the file format uses as separator")
        for t, x in enumerate(xs):
            flat[f"{key}@{t}"] = x.detach().to("cpu").contiguous()
    path = Path(path)
    with atomic_write(path) as fh:
        fh.write(save(flat))
    return path


def load_activations(path: str | Path, n_tasks: int | None = None) -> dict[str, list[Tensor]]:
    """Read a :func:`save_activations` file back into ``{weight key: [X_1, ..., X_T]}``.

    Every key must have the same tasks 0..T-1 (``T = n_tasks`` when given); errors name the key.
    """
    ck = open_checkpoint(path)
    per: dict[str, dict[int, Tensor]] = {}
    for name in ck.keys():
        key, sep, t = name.rpartition("@")
        if not sep or not t.isdigit():
            raise InputError(f"{path}: tensor {name!r} is not named '<weight key>@<task index>' "
                             "(write the file with acetools.files.merge_files.save_activations)")
        per.setdefault(key, {})[int(t)] = ck.get(name)
    out = {}
    for key, xs in per.items():
        T = n_tasks if n_tasks is not None else len(xs)
        if sorted(xs) != list(range(T)):
            raise InputError(f"{path}: activations of {key!r} are given for tasks {sorted(xs)}, expected 0..{T - 1} "
                             "(one per expert, in order)")
        out[key] = [xs[t] for t in range(T)]
    return out


@dataclass
class MergePlan:
    """What :func:`merge_files` will do: inputs, layout, per-key path and driver."""

    method: str
    hparams: dict[str, Any]
    base: Checkpoint
    experts: list[Checkpoint]
    layout: Layout
    scope: str
    scope_reason: str
    mode: str
    rows: list[dict[str, Any]]
    tie_candidates: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)  # hyperparameters read from files: name -> path
    heads: HeadPlan = field(default_factory=lambda: HeadPlan("merge"))  # what happens to classifier heads

    def summary(self) -> str:
        """Human-readable lines: inputs, layout, driver, counts per path."""
        paths: dict[str, int] = {}
        for r in self.rows:
            p = "tied" if r["path"].startswith("tied") else r["path"]
            paths[p] = paths.get(p, 0) + 1
        largest = max((r for r in self.rows), key=lambda r: _bytes(self.base, r["key"]))
        lines = [
            f"method {self.method} {self.hparams_text()}",
            f"base {self.base.path} ({len(self.base)} tensors); {len(self.experts)} experts",
            f"layout {self.layout.name}: {self.layout.description}",
            "keys: " + ", ".join(f"{n} {p}" for p, n in paths.items()),
            f"driver: {self.mode}" + (f" ({self.scope_reason})" if self.scope_reason else ""),
            *([self.heads.summary()] if self.heads.mode != "merge" else []),
            *([f"note: {_ALIKE[self.method]}"] if self.method in _ALIKE else []),
            f"memory: {self.memory_text(largest['key'])}",
        ]
        return "\n".join(lines)

    def hparams_text(self) -> str:
        """The hyperparameters as the method uses them (presets resolved: ACE's ``gate=auto``, not ``None``)."""
        return " ".join(f"{k}={short_repr(v)}" for k, v in METHODS[self.method].effective(self.hparams).items())

    def memory_text(self, largest_key: str) -> str:
        T = len(self.experts)
        m = self.base.meta(largest_key)
        n = 1
        for s in m.shape:
            n *= s
        big = n * (_compute_dtype(m.dtype) if m.dtype.is_floating_point else m.dtype).itemsize
        if self.mode == "memory":
            total = self.base.nbytes() * (T + 1)
            return (f"in memory: base and {T} experts loaded (~{_fmt(total)} as stored), plus T task vectors, "
                    "the update and the result in float32 while merging")
        text = (f"streaming: about (T + 2) x the largest tensor ({largest_key}, {_fmt(big)} in the compute dtype) "
                f"= {_fmt((T + 2) * big)}")
        widths = [_d_in(r) for r in self.rows if r["path"] == "matrix"]
        if self.method == "ace" and widths:
            w = max(widths)
            text += (f", plus ACE's {T} float64 covariances of the widest input (d_in = {w}: at least "
                     f"{_fmt(T * w * w * 8)})")
        return text


def _d_in(row: Mapping[str, Any]) -> int:
    """d_in of a 2-D key from its :func:`acetools.layouts.describe` row (in x out keys flipped)."""
    d0, d1 = (int(x) for x in row["shape"].split("x"))
    return d0 if row["orientation"] == "in_out" else d1


_ALIKE = {
    m: f"{m} treats every float key alike; the matrix/elementwise column does not change its result"
    for m in ("weight_averaging", "task_arithmetic", "ties", "dare")
}
_ALIKE["regmean"] = "regmean merges the keys its Gram matrices name; every other key gets the mean"


def _fmt(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n}"


def _bytes(ck: Checkpoint, key: str) -> int:
    m = ck.meta(key)
    n = 1
    for s in m.shape:
        n *= s
    return n * torch.empty((), dtype=m.dtype).element_size()


@dataclass
class MergeResult:
    """What :func:`merge_files` wrote (or would write, for a dry run)."""

    plan: MergePlan
    out: Path | None = None
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


def _open_all(base: Any, experts: Sequence[Any]) -> tuple[Checkpoint, list[Checkpoint]]:
    if isinstance(experts, (str, Path)) or not isinstance(experts, Sequence):
        raise InputTypeError("experts must be a list of checkpoint paths (one per fine-tuned model)")
    if len(experts) == 0:
        raise InputError("no experts given: pass at least one fine-tuned checkpoint")
    b = base if isinstance(base, Checkpoint) else open_checkpoint(base)
    ex = [e if isinstance(e, Checkpoint) else open_checkpoint(e) for e in experts]
    return b, ex


def _check_expert_list(base: Checkpoint, experts: Sequence[Checkpoint]) -> None:
    """The expert list from the paths alone: the base among the experts or an expert listed twice
    is an error (a zero task vector, or one task counted twice, silently changes every method's
    weights); a single expert gets a warning (a merge of one is well defined: the base plus the
    method's rescaled task vector, e.g. to check a coefficient, but is usually a typo)."""
    where = {base.path.expanduser().resolve(): "the base"}
    for t, ck in enumerate(experts):
        p = ck.path.expanduser().resolve()
        if p in where:
            raise InputError(f"expert {t} ({ck.path}) is the same checkpoint as {where[p]}; "
                             + ("the base is not an expert (its task vector is zero)" if where[p] == "the base" else
                                "list every expert once (a duplicate counts its task twice)"))
        where[p] = f"expert {t} ({ck.path})"
    if len(experts) == 1:
        warnings.warn(f"only one expert ({experts[0].path}): the merge is the base plus the method's rescaled task "
                      "vector of that expert; pass every fine-tuned checkpoint to merge them", UserWarning,
                      stacklevel=4)


def _check_distinct_contents(hashes: Sequence[tuple[str, ...]], paths: Sequence[Path]) -> None:
    """Same as :func:`_check_expert_list` by content hash (``hashes[0]`` the base's): a copy of the
    base or of another expert under a different name is an error."""
    seen: dict[tuple[str, ...], int] = {}
    for i, h in enumerate(hashes):
        if h in seen:
            j = seen[h]
            what = "the base" if j == 0 else f"expert {j - 1} ({paths[j]})"
            fix = ("the base is not an expert (its task vector is zero)" if j == 0 else
                   "list every expert once (a duplicate counts its task twice)")
            raise InputError(f"expert {i - 1} ({paths[i]}) has the same content (sha256) as {what}; {fix}")
        seen[h] = i


def _check_compatible(base: Checkpoint, experts: Sequence[Checkpoint]) -> None:
    """Same keys and shapes; float tensors where the base has floats, the same dtype elsewhere."""
    bkeys = base.keys()
    for ck in experts:
        check_same_keys(bkeys, ck.keys(), f"expert {ck.path}", f"the base {base.path}")
        for k in bkeys:
            mb, me = base.meta(k), ck.meta(k)
            if mb.shape != me.shape:
                raise InputError(f"shape mismatch at key {k!r}: base {base.path} has {mb.shape}, expert {ck.path} has "
                                 f"{me.shape}")
            if mb.dtype.is_floating_point != me.dtype.is_floating_point or (
                    not mb.dtype.is_floating_point and mb.dtype != me.dtype):
                raise InputTypeError(
                    f"dtype mismatch at key {k!r}: base {base.path} has {mb.dtype}, expert {ck.path} has "
                                f"{me.dtype}")


def plan_merge(
    method: str,
    base: Any,
    experts: Sequence[Any],
    *,
    hparams: Mapping[str, Any] | None = None,
    layout: str | Layout | None = "auto",
    mode: str = "auto",
    heads: str = "auto",
    names: Sequence[str] | None = None,
    force_layout: bool = False,
) -> MergePlan:
    """Open and check the inputs and decide layout, per-key paths, heads and driver, reading no tensor data.

    ``heads``/``names``: see :func:`merge_files` and :func:`acetools.files.heads.plan_heads`. A
    ``layout`` preset that contradicts the base's ``config.json`` is an error unless
    ``force_layout`` (:func:`acetools.layouts.get_layout`).
    """
    if method not in METHODS:
        raise InputError(f"unknown merge method {method!r}; valid methods are: {', '.join(sorted(METHODS))}")
    if mode not in MODES:
        raise InputError(f"mode={mode!r} must be one of {MODES}")
    hp = dict(hparams or {})
    files = {}
    if method == "esm" and isinstance(hp.get("activations"), (str, Path)):
        files["activations"] = str(hp["activations"])
        hp["activations"] = load_activations(hp["activations"], len(experts))
    resolved = METHODS[method].resolve(hp)
    b, ex = _open_all(base, experts)
    _check_expert_list(b, ex)
    lay = get_layout(layout, keys=b.keys(), config=b.config, force=force_layout)
    head_plan = plan_heads(heads, b, ex, lay, names)
    b, ex, lay = head_plan.views(b, ex, lay)  # per-task / drop: the head keys are not merged
    _check_compatible(b, ex)
    if method == "esm":  # ESM's layer names from the layout preset unless given (docs/methods.md §ESM)
        resolved = METHODS[method].resolve(with_layout_names(hp, lay.name))
    if resolved.get("in_out_keys"):
        raise InputError("in_out_keys is not used for files: the layout stores the orientation of every key "
                         f"(layout {lay.name!r}; see --dry-run); pass --layout or a Layout instead")
    keys = set(b.keys())
    for name in METHODS[method].per_key:
        value = resolved.get(name)
        if value is None or callable(value):
            continue
        per_expert = [(f"{name}", value)] if isinstance(value, Mapping) else \
            [(f"{name}[{t}]", d) for t, d in enumerate(value)]
        for where, d in per_expert:
            unknown = sorted(set(d) - keys) if isinstance(d, Mapping) else []
            if unknown:
                raise InputKeyError(f"{method}: {where} has key {unknown[0]!r}, which the base {b.path} does not have")
    scope, why = key_scope(method, hp)
    if mode == "auto":
        run = "stream" if scope in ("key", "global_ties") else "memory"
    elif mode == "stream" and scope == "model":
        raise InputError(f"{method} cannot stream: {why}; use mode='memory'")
    else:
        run = mode
    metas = b.metas()
    rows = describe(lay, metas)
    return MergePlan(method, resolved, b, ex, lay, scope, why if run == "memory" or scope == "global_ties" else "",
                     run, rows, dict(lay.tied), files, head_plan)


def _tensor(ck: Checkpoint, key: str, lay: Layout, dev: torch.device, dt: torch.dtype, check: bool = True) -> Tensor:
    t = ck.get(key)
    if check and not torch.isfinite(t).all():
        n_nan, n_inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        raise InputError(f"{ck.path}[{key!r}] contains {n_nan} NaN and {n_inf} Inf values")
    return lay.to_canonical(key, t).to(dev, dt).contiguous()


class _Source:
    """Reads W0 and the task vectors of one key, in d_out x d_in and the compute dtype.

    Each key's finiteness is checked on its first read only: global TIES reads every key in
    up to four passes, and the check of every tensor in every pass was 30 % of its time."""

    def __init__(self, plan: MergePlan, dev: torch.device):
        self.plan, self.dev = plan, dev
        self._checked: set[str] = set()

    def w0_taus(self, key: str) -> tuple[Tensor, list[Tensor]]:
        p = self.plan
        dt = _compute_dtype(p.base.meta(key).dtype)
        check = key not in self._checked
        W0 = _tensor(p.base, key, p.layout, self.dev, dt, check)
        taus = [_tensor(ck, key, p.layout, self.dev, dt, check) - W0 for ck in p.experts]
        self._checked.add(key)
        return W0, taus


def _confirm_ties(plan: MergePlan) -> dict[str, str]:
    return confirmed_ties(plan.tie_candidates, plan.base, plan.experts, get=lambda ck, k: ck.get(k))


def _radix_thresholds(keys: Sequence[str], taus_of: Callable[[str], list[Tensor]], T: int, k: float,
                      dtype: torch.dtype, n: int, bar: Callable) -> list[Tensor]:
    """Per task, the ``kept_count``-th largest |tau| over every key: TIES' global trim threshold.

    The same value as :func:`acetools.merging.ties.trim_threshold` on the concatenated task
    vector, found without holding it: |tau| >= 0 orders like its IEEE bit pattern read as an
    integer, so a most-significant-first radix select over 16-bit digits (one read pass per
    digit: 2 for float32, 4 for float64) fixes the value bit by bit. ``n`` is the number of
    entries over ``keys``.
    """
    itype, nbits = (torch.int32, 32) if dtype == torch.float32 else (torch.int64, 64)
    n_keep = kept_count(n, k)
    if n_keep == 0:
        return [torch.tensor(float("inf"), dtype=dtype) for _ in range(T)]
    rank = [n - n_keep] * T  # 0-based rank, ascending, of the threshold
    prefix = [0] * T
    shifts = list(range(nbits - 16, -1, -16))
    for level, shift in enumerate(shifts):
        hist = [torch.zeros(1 << 16, dtype=torch.int64) for _ in range(T)]
        for key in bar(keys, f"TIES threshold pass {level + 1}/{len(shifts)}"):
            for t, tau in enumerate(taus_of(key)):
                bits = tau.abs().reshape(-1).view(itype)
                if level > 0:
                    bits = bits[(bits >> (shift + 16)) == prefix[t]]
                hist[t] += torch.bincount(((bits >> shift) & 0xFFFF).to(torch.int64), minlength=1 << 16)
        for t in range(T):
            cum = hist[t].cumsum(0)
            d = int(torch.searchsorted(cum, torch.tensor(rank[t]), right=True))
            rank[t] -= int(cum[d - 1]) if d > 0 else 0
            prefix[t] = (prefix[t] << 16) | d
    return [torch.tensor(p, dtype=itype).view(dtype).clone() for p in prefix]


def _stream(plan: MergePlan, writer: ShardedWriter, dev: torch.device, out_dtype: torch.dtype | None,
            show: bool | None) -> dict[str, Any]:
    """The streaming driver: key by key (plus TIES' global passes), written as it goes."""
    method, hp, lay = plan.method, plan.hparams, plan.layout
    base, experts = plan.base, plan.experts
    T = len(experts)
    tied = _confirm_ties(plan)
    aliases_of: dict[str, list[str]] = {}
    for a, c in tied.items():
        aliases_of.setdefault(c, []).append(a)
    buffers = [k for k in base.keys() if not base.meta(k).dtype.is_floating_point]
    keys = [k for k in base.keys() if k not in tied and k not in buffers]
    src = _Source(plan, dev)

    def bar(it, desc):
        return progress(list(it), desc=desc, enabled=show)

    def dropped(key: str, taus: list[Tensor]) -> list[Tensor]:
        """DARE-TIES drops before trimming (the masks depend on seed, task and key only)."""
        if method != "dare":
            return taus
        return [drop_and_rescale(tau, dare_mask(tau.shape, hp["p"], hp["seed"], t, key, tau.device), hp["p"],
                                 hp["rescale"]) for t, tau in enumerate(taus)]

    def taus_of(key: str) -> list[Tensor]:
        return dropped(key, src.w0_taus(key)[1])

    ties_state: dict[str, Any] = {}
    if plan.scope == "global_ties":

        dts = {_compute_dtype(base.meta(k).dtype) for k in keys}
        if len(dts) != 1:
            raise InputError("TIES with scope='global' needs one dtype across keys (float64 and others are mixed)")
        dtype = dts.pop()
        n = sum(_bytes(base, k) // base.meta(k).dtype.itemsize for k in keys)
        thr = _radix_thresholds(keys, taus_of, T, hp["k"], dtype, n, bar)
        total = 0
        for key in bar(keys, "TIES: elect"):
            trimmed = torch.stack([torch.where(tau.abs() >= thr[t].to(tau.device), tau, 0) for t, tau in
                                   enumerate(taus_of(key))])
            total += int(elect_sign(trimmed).to(torch.int64).sum())
        ties_state = {"thr": thr, "majority": (total > 0) - (total < 0)}

    info: dict[str, Any] = {"tied": tied, "buffers_changed": {}}
    token = PROGRESS.set(False)  # the methods' own per-key bars would flicker once per key
    try:
        for key in bar(base.keys(), f"{method}: merge"):
            if key in tied:
                continue
            if key in buffers:
                t0 = base.get(key)
                differ = [i for i, ck in enumerate(experts) if not torch.equal(ck.get(key), t0)]
                if differ:
                    info["buffers_changed"][key] = differ
                    warnings.warn(f"non-float buffer {key!r} differs from the base in experts {differ}; the merged "
                                  "model keeps the base's value (buffers are not merged)", UserWarning, stacklevel=3)
                writer.add(key, t0)
                continue
            W0, taus = src.w0_taus(key)
            if plan.scope == "global_ties":
                taus = dropped(key, taus)
                thr = ties_state["thr"]
                trimmed = torch.stack([torch.where(tau.abs() >= thr[t].to(tau.device), tau, 0)
                                       for t, tau in enumerate(taus)])
                gamma = resolve_zero_signs(elect_sign(trimmed).to(torch.int8), ties_state["majority"]).to(trimmed.dtype)
                delta = hp["lam"] * disjoint_merge(trimmed, gamma, hp["merge"])
            else:
                delta = merge_key(method, key, W0, taus, is_matrix=lay.is_matrix(key, W0), hparams=hp)
            merged = W0 + delta.to(dev, W0.dtype)
            if not torch.isfinite(merged).all():
                raise FloatingPointError(f"{method} produced non-finite weights at key {key!r}; check the "
                                         f"hyperparameters ({plan.hparams_text()}) and the scale of the task vectors")
            dt = out_dtype or base.meta(key).dtype
            result = lay.from_canonical(key, merged).to("cpu", dt).contiguous()
            writer.add(key, result)
            for alias in aliases_of.get(key, ()):
                writer.add(alias, result.clone())
            del W0, taus, merged, delta
    finally:
        PROGRESS.reset(token)
    return info


def _in_memory(plan: MergePlan, writer: ShardedWriter, dev: torch.device, out_dtype: torch.dtype | None,
               show: bool | None) -> dict[str, Any]:
    """Load everything, :func:`acetools.merge`, write."""
    base = plan.base.state_dict()
    experts = [ck.state_dict() for ck in plan.experts]
    # mixed float dtypes across files: compute every such key in float32/64 (as the streaming driver does)
    for k, w in base.items():
        if w.is_floating_point() and any(ex[k].dtype != w.dtype for ex in experts):
            dt = _compute_dtype(w.dtype)
            base[k] = w.to(dt)
            for ex in experts:
                ex[k] = ex[k].to(dt)
    out = merge(plan.method, base, experts, device=dev, layout=plan.layout, progress=show, **plan.hparams)
    for k in plan.base.keys():
        t = out[k]
        if t.is_floating_point():
            t = t.to("cpu", out_dtype or plan.base.meta(k).dtype)
        writer.add(k, t)
    changed = {k: [i for i, ex in enumerate(experts) if not torch.equal(ex[k], w)]
               for k, w in base.items() if not w.is_floating_point()}
    return {"tied": confirmed_ties(plan.layout.tied, base, experts),
            "buffers_changed": {k: v for k, v in changed.items() if v}}


def _merge_record(method: str, plan: MergePlan, hash_inputs: bool) -> tuple[dict, dict, dict]:
    """``(inputs, hp_record, meta)``: the inputs (with their hashes), the hyperparameters as the
    method uses them, and the safetensors metadata of a merge."""
    inputs = {"base": str(plan.base.path), "experts": [str(ck.path) for ck in plan.experts]}
    if hash_inputs:
        per_ck = [ck.sha256() for ck in [plan.base, *plan.experts]]
        _check_distinct_contents([tuple(sorted(h.values())) for h in per_ck],
                                 [ck.path for ck in [plan.base, *plan.experts]])
        inputs["sha256"] = {f: h for d in per_ck for f, h in d.items()}
        inputs["sha256"].update({f: file_sha256(f) for f in plan.files.values()})
    hp_record = {k: plan.files.get(k) or jsonable(v, fallback=short_repr)
                 for k, v in METHODS[method].effective(plan.hparams).items()}
    meta = {
        "acetools.version": __version__,
        "acetools.method": method,
        "acetools.hparams": json.dumps(hp_record, sort_keys=True),
        "acetools.layout": plan.layout.name,
        "acetools.inputs": json.dumps(inputs, sort_keys=True),
        "acetools.heads": plan.heads.mode,
    }
    return inputs, hp_record, meta


def _staging_folder(out_dir: Path) -> Path | None:
    """A new output folder is assembled as a hidden sibling and renamed into place at the end, so a
    merge that is killed leaves no folder at ``out`` (only the hidden staging folder); an existing
    (empty, or overwritten) folder gets its files moved in at the end instead (None)."""
    if out_dir.exists():
        return None
    import tempfile

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.acetools-stage-", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(stage, 0o777 & ~umask)  # mkdtemp's 0700 would stay on the renamed folder
    return stage


def merge_files(
    method: str,
    base: str | Path | Checkpoint,
    experts: Sequence[str | Path | Checkpoint],
    out: str | Path | None = None,
    *,
    hparams: Mapping[str, Any] | None = None,
    layout: str | Layout | None = "auto",
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    shard_size: int | str = "5GB",
    mode: str = "auto",
    dry_run: bool = False,
    progress: bool | None = None,
    overwrite: bool = False,
    hash_inputs: bool = True,
    heads: str = "auto",
    names: Sequence[str] | None = None,
    force_layout: bool = False,
) -> MergeResult:
    """Merge the expert checkpoints fine-tuned from ``base`` with ``method`` into ``out``.

    ``base``/``experts``: paths (files or folders; see :mod:`acetools.files.checkpoints`).
    ``hparams``: the method's hyperparameters (``METHODS[method].hparams``). ``layout``: a
    preset name, ``"auto"`` (from the base's config.json or key names) or a Layout. ``dtype``:
    output dtype of the float tensors (default: each key's dtype in the base); merging is done
    in float32 (float64 stays float64). ``device``: where each key is merged. ``shard_size``:
    the largest output file (e.g. ``"5GB"``). ``mode``: ``"auto"`` streams when the method
    allows it, ``"stream"`` insists, ``"memory"`` loads everything. ``dry_run``: plan only,
    write nothing. ``out`` must not hold an input or earlier weights (``overwrite=True`` to
    replace a previous merge); the base folder's config and tokenizer files are copied next
    to the weights, so the result loads like the base. ``heads``: ``"auto"`` (default:
    ``"per-task"`` for classifiers such as ``*ForSequenceClassification``, else ``"merge"``),
    ``"merge"``, ``"per-task"`` (merge the backbone, write each expert's head to
    ``<out>/heads/<name>/``; load one task with :func:`acetools.files.heads.load_with_head`) or
    ``"drop"`` (the backbone only); ``names``: the experts' head folder names (default: their
    folder names). See :mod:`acetools.files.heads`. Returns a :class:`MergeResult`.
    """
    dev = resolve_device(device)  # up front, with the other options: a meta or missing device is refused at once
    if heads not in HEAD_MODES:
        raise InputError(f"heads={heads!r} must be one of {', '.join(HEAD_MODES)}")
    out_dtype = parse_dtype(dtype)
    size = parse_size(shard_size)
    plan = plan_merge(method, base, experts, hparams=hparams, layout=layout, mode=mode, heads=heads, names=names,
                      force_layout=force_layout)
    if dry_run:
        return MergeResult(plan)
    if out is None:
        raise InputError("out is required: the folder the merged checkpoint is written to")
    out_dir = check_output_folder(out, [plan.base, *plan.experts], overwrite=overwrite)
    check_heads_folder(out_dir, [plan.base, *plan.experts], overwrite, writing=plan.heads.mode == "per-task")
    t0 = time.perf_counter()
    inputs, hp_record, meta = _merge_record(method, plan, hash_inputs)
    final_dir, stage = out_dir, _staging_folder(out_dir)
    if stage is not None:
        out_dir = stage
    head_writer = HeadWriter(out_dir, plan.heads, inputs.get("sha256")) if plan.heads.mode == "per-task" else None
    try:
        with ShardedWriter(out_dir, shard_size=size, metadata=meta) as writer:
            driver = _stream if plan.mode == "stream" else _in_memory
            extra = driver(plan, writer, dev, out_dtype, progress)
            head_tasks = head_writer.write() if head_writer else {}
            files = writer.close()
        if head_writer:
            head_writer.commit()
        elif overwrite:
            remove_stale_heads(out_dir)
        copied = copy_side_files(plan.base.folder, out_dir)
    except BaseException:
        if head_writer:
            head_writer.abort()
        if stage is not None:
            import shutil

            shutil.rmtree(stage, ignore_errors=True)
        raise
    seconds = time.perf_counter() - t0
    info = {
        "method": method, "hparams": hp_record, "layout": plan.layout.name,
        "driver": plan.mode, "dtype": str(out_dtype).replace("torch.", "") if out_dtype else "base",
        "shard_size": size, "files": [f.name for f in files], "copied": copied, "seconds": round(seconds, 3),
        "acetools_version": __version__, "inputs": inputs,
        "tied": extra.get("tied", {}), "buffers_changed": extra.get("buffers_changed", {}),
        "heads": {"mode": plan.heads.mode, "reason": plan.heads.reason, "keys": plan.heads.keys, "tasks": head_tasks},
    }
    with_info = out_dir / "acetools_merge.json"
    from ..utils import atomic_write

    with atomic_write(with_info, "w") as fh:
        json.dump(info, fh, indent=2)
    if stage is not None:
        os.rename(stage, final_dir)  # atomic: the folder appears complete or not at all
        files = [final_dir / f.name for f in files]
    log.info("merged %d experts with %s into %s in %.1f s", len(plan.experts), method, final_dir, seconds)
    return MergeResult(plan, final_dir, files, seconds, info)


# --------------------------------------------------------------------------- command line and config files
CONFIG_KEYS = ("method", "base", "experts", "out", "hyperparameters", "layout", "dtype", "device", "shard_size",
               "mode", "overwrite", "heads", "names", "force_layout")


def parse_hparam(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, value)``: a Python literal (``20``, ``0.3``, ``True``, ``(1, 2)``),
    ``true``/``false``/``none``/``null``, else the string (``scope=tensor``)."""
    import ast

    if "=" not in text:
        raise InputError(f"hyperparameter {text!r} must look like key=value (e.g. -p lam=0.3)")
    key, raw = (s.strip() for s in text.split("=", 1))
    if not key.isidentifier():
        raise InputError(f"hyperparameter name {key!r} is not a Python identifier")
    low = raw.lower()
    if low in ("true", "false"):
        return key, low == "true"
    if low in ("none", "null"):
        return key, None
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a merge config (YAML; schema in docs/your-models.md); paths relative to the file.

    Keys: ``method``, ``base``, ``experts`` (list), ``out``, ``hyperparameters`` (mapping),
    ``layout``, ``dtype``, ``device``, ``shard_size``, ``mode``, ``overwrite``, ``heads``,
    ``names`` (list). Unknown keys are an error naming them.
    """
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a dependency
        raise ImportError("reading a merge config needs PyYAML: pip install pyyaml") from None
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"merge config not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise InputError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, Mapping):
        raise InputError(f"{p}: a merge config is a mapping (method: ..., base: ..., experts: [...]), "
                         f"got {type(data).__name__}")
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise InputError(f"{p}: unknown key(s) {unknown}; valid keys are: {', '.join(CONFIG_KEYS)}")
    cfg = dict(data)
    if "experts" in cfg and (isinstance(cfg["experts"], str) or not isinstance(cfg["experts"], list)):
        raise InputError(f"{p}: experts must be a list of paths")
    if "names" in cfg and (isinstance(cfg["names"], str) or not isinstance(cfg["names"], list)):
        raise InputError(f"{p}: names must be a list, one per expert")
    if "hyperparameters" in cfg and not isinstance(cfg["hyperparameters"] or {}, Mapping):
        raise InputError(f"{p}: hyperparameters must be a mapping name: value")

    def rel(x: Any) -> str:
        q = Path(str(x)).expanduser()
        return str(q if q.is_absolute() else p.parent / q)

    for k in ("base", "out"):
        if cfg.get(k) is not None:
            cfg[k] = rel(cfg[k])
    if cfg.get("experts"):
        cfg["experts"] = [rel(e) for e in cfg["experts"]]
    cfg["hyperparameters"] = dict(cfg.get("hyperparameters") or {})
    return cfg
