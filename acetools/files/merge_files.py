"""Merge checkpoints on disk: ``acetools merge`` in Python (:func:`merge_files`; docs/your-models.md).

The files go through the one merge driver (:func:`acetools.merging.driver.run`), streamed key by key
where the method allows it (docs/your-models.md §Memory: streaming and what each method holds).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save
from torch import Tensor

from .. import __version__
from ..errors import InputError, InputKeyError, InputTypeError
from ..layouts import Layout, describe, get_layout
from ..merging import METHODS, key_scope
from ..merging.driver import Source, compute_dtype, format_bytes, run
from ..merging.lowrank import lowrank_form
from ..notebooks import parse_parameter
from ..utils import atomic_write, jsonable, resolve_device, short_repr
from .buffers import carry_missing_buffers, non_persistent
from .checkpoints import (
    HASH_WINDOW,
    Checkpoint,
    ShardedWriter,
    check_compatible,
    check_output_folder,
    copy_side_files,
    file_sha256,
    open_checkpoint,
    parse_size,
)
from .heads import HeadPlan, HeadWriter, check_heads_folder, plan_heads, remove_stale_heads
from .lineage import check_lineage
from .lora import adapter_of, canonical_factors, lora_target, open_expert
from .lora_output import write_adapter_output
from .outputs import check_task_folders, commit_task_folders, rewrite_config, stage_task_folders, written_dtype
from .per_expert import MERGEKIT_KEYS, mergekit_key_hint, read_experts
from .staging import lock_output, make_stage, remove_stale_stages
from .vocab import VocabPlan, plan_vocab

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
#: ``lowrank``: where every expert of a key is a LoRA adapter, merge that key in the span of the factors ("auto") or
#: from the folded task vectors ("never"; docs/your-models.md §LoRA adapters as experts).
LOWRANK = ("auto", "never")


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


def save_activations(path: str | Path, activations: Mapping[str, Sequence[Tensor]]) -> Path:
    """Save ESM's proxy activations ``{weight key: [X_1, ..., X_T]}`` as one safetensors file (atomically),
    tensors named ``"<weight key>@<t>"``, for ``acetools merge --method esm -p activations=FILE``."""
    for key in activations:
        if "@" in key:
            raise InputError(f"activation key {key!r} contains '@', which the file format uses as separator")
    flat = {f"{key}@{t}": x.detach().to("cpu").contiguous()
            for key, xs in activations.items() for t, x in enumerate(xs)}
    path = Path(path)
    with atomic_write(path) as fh:
        fh.write(save(flat))
    return path


def load_activations(path: str | Path, n_tasks: int | None = None) -> dict[str, list[Tensor]]:
    """Read a :func:`save_activations` file back into ``{weight key: [X_1, ..., X_T]}``; every key must have
    tasks 0..T-1 (``T = n_tasks`` when given)."""
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
    files: dict[str, str] = field(default_factory=dict)  # hyperparameters read from files: name -> path
    heads: HeadPlan = field(default_factory=lambda: HeadPlan("merge"))  # what happens to classifier heads
    vocab: VocabPlan = field(default_factory=lambda: VocabPlan("same"))  # rows only some models have
    buffers_carried: dict[str, str] = field(default_factory=dict)  # non-persistent buffer -> the model it came from
    lowrank: str = "auto"  # LOWRANK: LoRA keys merged in the span of their factors, or from the task vectors
    lowrank_keys: list[str] = field(default_factory=list)  # the keys merged in the span
    lowrank_reason: str = ""  # why those keys (or none), in words

    def lowrank_record(self) -> dict[str, Any]:
        """The low-rank choice as acetools_merge.json records it."""
        return {"mode": self.lowrank, "keys": list(self.lowrank_keys), "reason": self.lowrank_reason}

    def summary(self) -> str:
        """Human-readable lines: inputs, layout, driver, counts per path."""
        paths = Counter("tied" if r["path"].startswith("tied") else r["path"] for r in self.rows)
        largest = max(self.rows, key=lambda r: _bytes(self.base, r["key"]))
        lines = [
            f"method {self.method} {self.hparams_text()}",
            f"base {self.base.path} ({len(self.base)} tensors); {len(self.experts)} experts",
            *([f"experts: {n} LoRA adapters, folded onto the base key by key"] if (n := sum(
                adapter_of(ck) is not None for ck in self.experts)) else []),
            f"layout {self.layout.name}: {self.layout.description}",
            "keys: " + ", ".join(f"{n} {p}" for p, n in paths.items()),
            f"driver: {self.mode}" + (f" ({self.scope_reason})" if self.scope_reason else ""),
            *([f"lowrank={self.lowrank}: {self.lowrank_reason}"] if self.lowrank_reason else []),
            *([self.heads.summary()] if self.heads.mode != "merge" or self.heads.alignment is not None else []),
            *([self.vocab.summary()] if self.vocab.mode != "same" else []),
            *([f"buffers: {len(self.buffers_carried)} non-persistent buffer(s) missing from some models, carried "
               f"from the models that have them ({', '.join(sorted(self.buffers_carried))})"]
              if self.buffers_carried else []),
            *([f"note: {self.method} {METHODS[self.method].note}"] if METHODS[self.method].note else []),
            f"memory: {self.memory_text(largest['key'])}",
        ]
        return "\n".join(lines)

    def hparams_text(self) -> str:
        """The hyperparameters as the method uses them (presets resolved: ACE's ``gate=auto``, not ``None``)."""
        return " ".join(f"{k}={short_repr(v)}" for k, v in METHODS[self.method].effective(self.hparams).items())

    def memory_text(self, largest_key: str) -> str:
        """The dry run's estimate of the merge's peak resident memory (docs/your-models.md §Memory: streaming and
        what each method holds): this process as it is now (Python, torch and acetools loaded: most of a small
        model's peak), what the driver holds (streamed: (T + 2) x the largest tensor; in memory: W0 and the
        update of every key besides) and the hashing threads' file windows."""
        T = len(self.experts)
        big = _bytes(self.base, largest_key, compute=True)
        now = resident_bytes()
        n_files = sum(len(ck.files) for ck in (self.base, *self.experts))
        threads = min(n_files, os.cpu_count() or 1)
        hashing = threads * HASH_WINDOW
        if self.mode == "memory":
            w = sum(_bytes(self.base, r["key"], compute=True) for r in self.rows)
            held = 2 * w + T * big
            how = (f"in memory, one call of the method on every key: W0 and the update of every key and the {T} "
                   f"task vectors of the key being merged, in the compute dtype, ~{format_bytes(held)}")
        else:
            held = (T + 2) * big
            how = (f"streaming: (T + 2) x the largest tensor ({largest_key}, {format_bytes(big)} in the compute "
                   f"dtype) = {format_bytes(held)}")
        text = (f"about {format_bytes(now + held + hashing)} at the peak: this process now (Python, torch, acetools) "
                f"{format_bytes(now)} + {how} + hashing the inputs {format_bytes(hashing)} ({threads} x "
                f"{format_bytes(HASH_WINDOW)} windows)")
        widths = [self.base.meta(r["key"]).shape[0 if r["orientation"] == "in_out" else 1]  # d_in of each matrix
                  for r in self.rows if r["path"] == "matrix"]
        note = METHODS[self.method].memory_note
        if note is not None and widths:
            text += f", {note(T, max(widths))}"
        return text


def resident_bytes() -> int:
    """This process's resident memory now (Linux ``/proc/self/statm``; elsewhere its peak so far)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _bytes(ck: Checkpoint, key: str, compute: bool = False) -> int:
    """Bytes of ``key`` as stored (``compute``: in the compute dtype, for float keys)."""
    m = ck.meta(key)
    return math.prod(m.shape) * (compute_dtype(m.dtype) if compute and m.dtype.is_floating_point else m.dtype).itemsize


@dataclass
class MergeResult:
    """What :func:`merge_files` wrote (or would write, for a dry run)."""

    plan: MergePlan
    out: Path | None = None
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


def _open_all(base: Any, experts: Sequence[Any], force: bool = False) -> tuple[Checkpoint, list[Checkpoint]]:
    """The base and the experts opened (LoRA adapters folded onto the base, ``force``: one naming another base
    with a warning); the same path twice is an error (:func:`_check_distinct`), a single expert (usually a
    typo) a warning."""
    if isinstance(experts, (str, Path)) or not isinstance(experts, Sequence):
        raise InputTypeError("experts must be a list of checkpoint paths (one per fine-tuned model)")
    if len(experts) == 0:
        raise InputError("no experts given: pass at least one fine-tuned checkpoint")
    base = base if isinstance(base, Checkpoint) else open_checkpoint(base)
    experts = [open_expert(e, base, force=force) for e in experts]  # a LoRA adapter folded onto the base (lora.py)
    models = [base, *experts]
    _check_distinct([ck.path.expanduser().resolve() for ck in models], [ck.path for ck in models],
                    "is the same checkpoint as")
    if len(experts) == 1:
        warnings.warn(f"only one expert ({experts[0].path}): the merge is the base plus the method's rescaled task "
                      "vector of that expert; pass every fine-tuned checkpoint to merge them", UserWarning,
                      stacklevel=4)
    return base, list(experts)


def _check_distinct(ids: Sequence[Any], paths: Sequence[Path], same: str) -> None:
    """The base among the experts, or an expert listed twice, by ``ids`` (resolved paths or content
    hashes; ``ids[0]`` the base's), is an error."""
    seen: dict[Any, int] = {}
    for i, h in enumerate(ids):
        if h in seen:
            j = seen[h]
            what = "the base" if j == 0 else f"expert {j - 1} ({paths[j]})"
            fix = ("the base is not an expert (its task vector is zero)" if j == 0 else
                   "list every expert once (a duplicate counts its task twice)")
            raise InputError(f"expert {i - 1} ({paths[i]}) {same} {what}; {fix}")
        seen[h] = i


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
    vocab: str | None = None,
    force: bool = False,
    lowrank: str = "auto",
) -> MergePlan:
    """Open and check the inputs and decide layout, per-key paths, heads and driver, reading no tensor data
    (arguments as :func:`merge_files`'s)."""
    if method not in METHODS:
        raise InputError(f"unknown merge method {method!r}; valid methods are: {', '.join(sorted(METHODS))}")
    if mode not in MODES:
        raise InputError(f"mode={mode!r} must be one of {MODES}")
    if lowrank not in LOWRANK:
        raise InputError(f"lowrank={lowrank!r} must be one of {LOWRANK} (--lowrank)")
    info = METHODS[method]
    hp = dict(hparams or {})
    files = {}
    for name in info.per_key:  # a per-key input given as a file (save_activations' format)
        if isinstance(hp.get(name), (str, Path)):
            files[name] = str(hp[name])
            hp[name] = load_activations(hp[name], len(experts))
    info.resolve(hp)  # bad hyperparameters fail before any file is opened
    b, ex = _open_all(base, experts, force)
    lay = get_layout(layout, keys=b.keys(), config=b.config, force=force_layout)
    vocab_plan = plan_vocab(vocab, b, ex, lay)  # docs/your-models.md §Vocabularies
    b, ex = vocab_plan.views(b, ex)  # the experts' rows of the base's tokens
    head_plan = plan_heads(heads, b, ex, lay, names)
    b, ex, lay = head_plan.views(b, ex, lay)  # per-task / drop: the head keys are not merged
    b, ex, carried = carry_missing_buffers(b, ex)  # non-persistent buffers one side did not save
    check_compatible(b, ex, layout=lay)
    resolved = info.resolve(hp, layout=lay.name)  # e.g. ESM's layer names per layout preset (docs/methods.md §ESM)
    info.check_per_expert(resolved, len(ex))  # weights=[...], k=[...]: one value per expert
    keys = set(b.keys())
    for name in info.per_key:
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
    carry = set(non_persistent(b))  # non-persistent buffers are never merged, whatever their dtype
    rows = [{**r, "path": "carried from base"} if r["key"] in carry else r for r in describe(lay, b.metas())]
    low_keys, low_why = _lowrank_keys(method, resolved, ex, lay, run, [r["key"] for r in rows if r["key"] not in carry],
                                      lowrank)
    return MergePlan(method, resolved, b, ex, lay, scope, why if run == "memory" or scope == "global_ties" else "",
                     run, rows, files, head_plan, vocab_plan, carried, lowrank, low_keys, low_why)


def _lowrank_keys(method: str, hparams: Mapping[str, Any], experts: Sequence[Checkpoint], layout: Layout, run: str,
                  keys: Sequence[str], lowrank: str) -> tuple[list[str], str]:
    """The keys merged in the span of the adapters' factors (docs/methods.md §Low-rank updates) and why, from the
    adapters' headers: those every expert updates as a LoRA (:func:`~acetools.files.lora.lora_target`), when the
    method has a form there and the driver goes key by key; ``([], "")`` without adapters."""
    if not any(adapter_of(ck) is not None for ck in experts):
        return [], ""
    if lowrank == "never":
        return [], "every key from the folded task vectors (lowrank='never' / --lowrank never)"
    why = lowrank_form(method, hparams)
    if why is None and run == "memory":
        why = "the driver runs in memory (one call of the method on the model); the span is taken key by key"
    if why is not None:
        return [], f"every key from the folded task vectors: {why}"
    low = [k for k in keys if all(lora_target(ck, k) is not None for ck in experts)]
    full = "every expert" if len(low) == len(keys) else "the rest from the folded task vectors (a full checkpoint " \
        "among the experts, or a key not every adapter updates)"
    return low, (f"{len(low)} of {len(keys)} keys (those every expert updates as a LoRA) merged in the span of "
                 f"their factors, no task vector formed; {full}" if low else
                 "no key is updated as a LoRA by every expert: every key from the folded task vectors")


class _InputHashes:
    """The sha256 of every input file, computed by background threads while the merge reads the same files.
    A copy among the inputs is an error before any merging when sizes and sampled bytes already say
    so (:meth:`check_copies`), else at :meth:`result`."""

    def __init__(self, plan: MergePlan, enabled: bool):
        self.models = [plan.base, *plan.experts]
        self.files = [str(f) for ck in self.models for f in ck.files] + list(plan.files.values())
        self._pool = (ThreadPoolExecutor(min(len(self.files), os.cpu_count() or 1),
                                         thread_name_prefix="acetools-sha256") if enabled else None)
        self._stop = threading.Event()
        self._futures = ({f: self._pool.submit(file_sha256, f, stop=self._stop.is_set) for f in self.files}
                         if self._pool is not None else {})

    def check_copies(self) -> None:
        """Wait for the hashes (and raise on a copy) when two inputs look alike by size and sampled bytes."""
        if self._pool is None:
            return
        prints = [_fingerprint(ck) for ck in self.models]
        if len(set(prints)) < len(prints):
            self.result()

    def result(self) -> dict[str, str] | None:
        """``{file: sha256}`` of every input (``None`` when hashing is off); a copy among the inputs is an error."""
        if self._pool is None:
            return None
        try:
            out = {f: fut.result() for f, fut in self._futures.items()}
        finally:
            self._pool.shutdown()
        _check_distinct([tuple(sorted(out[str(f)] for f in ck.files)) for ck in self.models],
                        [ck.path for ck in self.models], "has the same content (sha256) as")
        return out

    def cancel(self) -> None:
        self._stop.set()  # a file being hashed stops at its next window
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _fingerprint(ck: Checkpoint, samples: int = 16, width: int = 4096) -> tuple:
    """Sizes and the bytes at ``samples`` evenly spaced offsets of every file: equal for copies."""
    out = []
    for f in ck.files:
        size = Path(f).stat().st_size
        with open(f, "rb") as fh:
            parts = []
            for i in range(samples):
                fh.seek(size * i // samples)
                parts.append(fh.read(width))
        out.append((size, b"".join(parts)))
    return tuple(out)


def _merge_record(method: str, plan: MergePlan, sha256: Mapping[str, str] | None) -> tuple[dict, dict, dict]:
    """``(inputs, hp_record, meta)`` of a merge: the inputs (with ``sha256`` when given), the hyperparameters
    as the method uses them, and the safetensors metadata."""
    inputs: dict[str, Any] = {"base": str(plan.base.path), "experts": [str(ck.path) for ck in plan.experts]}
    if sha256 is not None:
        inputs["sha256"] = dict(sha256)
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


def _write_merge(plan: MergePlan, out_dir: Path, *, size: int, dev: torch.device, out_dtype: torch.dtype | None,
                 show: bool | None, hashes: _InputHashes, overwrite: bool) -> dict[str, Any]:
    """Merge into ``out_dir`` (the staging folder): weights, heads and the base's side files; returns what the
    record needs."""
    record: dict[str, Any] = {}

    def metadata() -> dict[str, str]:  # the shards' header, once the hashes are known (at the first shard's end)
        if not record:
            record["inputs"], record["hparams"], record["meta"] = _merge_record(plan.method, plan, hashes.result())
        return record["meta"]

    # the header's size before the hashes are known: a sha256 has 64 hex digits
    size_hint = _merge_record(plan.method, plan, dict.fromkeys(hashes.files, "0" * 64) if hashes._pool else None)[2]
    planned = [(k, out_dtype if out_dtype is not None and m.dtype.is_floating_point else m.dtype, m.shape)
               for k, m in plan.vocab.out_metas(plan.base.metas()).items()]
    head_writer = None
    try:
        hashes.check_copies()
        with ShardedWriter(out_dir, shard_size=size, metadata=metadata, metadata_hint=size_hint,
                           header_room=ShardedWriter.header_room(planned, size_hint)) as writer:
            src = Source(plan.base, plan.experts, names=[str(ck.path) for ck in (plan.base, *plan.experts)])
            low = set(plan.lowrank_keys)

            def factors(key: str) -> list[tuple[Tensor, Tensor]] | None:  # LoRA keys: in the span (lowrank.py)
                return canonical_factors(plan.experts, key, plan.layout.orientation(key) == "in_out") \
                    if key in low else None

            add = plan.vocab.emit(writer.add)  # union: the rows only some experts have appended
            extra = run(METHODS[plan.method], plan.hparams, src, plan.layout, add, device=dev,  # the one driver
                        whole_model=plan.mode == "memory", out_dtype=out_dtype, show=show,
                        hparams_text=plan.hparams_text(), carry=non_persistent(plan.base), factors=factors)
            metadata()
            if plan.heads.mode == "per-task":
                head_writer = HeadWriter(out_dir, plan.heads, record["inputs"].get("sha256"))
            head_tasks = head_writer.write() if head_writer else {}
            files = writer.close()
        if head_writer:
            head_writer.commit()
        elif overwrite:
            remove_stale_heads(out_dir)
        copied = copy_side_files(plan.base.folder, out_dir)
        plan.vocab.write_files(out_dir)  # union's tokenizer, config.json's vocab_size
        rewrite_config(out_dir, written_dtype((dt, shape) for _, dt, shape in planned))  # the dtype written
    except BaseException:
        if head_writer:
            head_writer.abort()
        raise
    return {"files": files, "extra": extra, "head_tasks": head_tasks, "copied": copied, **record}


def _merge_info(plan: MergePlan, done: Mapping[str, Any], *, out_dtype: torch.dtype | None, size: int,
                seconds: float, lineage: dict[str, Any], tasks_dir: Path | None) -> dict[str, Any]:
    """acetools_merge.json of a merge (docs/your-models.md §What is written) from the plan and what
    :func:`_write_merge` returned."""
    extra = done["extra"]
    return {
        "method": plan.method, "hparams": done["hparams"], "layout": plan.layout.name,
        "driver": plan.mode, "dtype": str(out_dtype).replace("torch.", "") if out_dtype else "base",
        "shard_size": size, "files": [f.name for f in done["files"]], "copied": done["copied"],
        "seconds": round(seconds, 3), "acetools_version": __version__, "inputs": done["inputs"],
        "tied": extra.get("tied", {}), "buffers_changed": extra.get("buffers_changed", {}),
        "buffers_carried": plan.buffers_carried,
        "heads": {"mode": plan.heads.mode, "reason": plan.heads.reason, "keys": plan.heads.keys,
                  "tasks": done["head_tasks"]},
        "lineage": lineage,
        **({"vocab": plan.vocab.as_dict()} if plan.vocab.mode != "same" else {}),
        "per_task_out": [str(tasks_dir / n) for n in plan.heads.names] if tasks_dir is not None else [],
        **({"lowrank": plan.lowrank_record()} if plan.lowrank_reason else {}),
    }


def _stage_tasks(plan: MergePlan, out_dir: Path, tasks_dir: Path | None, size: int, stage: Path | None
                 ) -> list[tuple[Path, Path]]:
    """The per-task folders of ``--per-task-out`` (:func:`acetools.files.outputs.stage_task_folders`), staged
    from the merge in ``out_dir``; on failure the merge's own staging folder ``stage`` is removed too."""
    try:
        return stage_task_folders(out_dir, tasks_dir, plan.heads, shard_size=size) if tasks_dir else []
    except BaseException:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        raise


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
    force: bool = False,
    vocab: str | None = None,
    lora_out: str | Path | None = None,
    per_task_out: str | Path | None = None,
    lowrank: str = "auto",
    lora_rank: int | None = None,
) -> MergeResult:
    """Merge the expert checkpoints fine-tuned from ``base`` with ``method`` into ``out`` (docs/your-models.md).

    ``layout``: a preset name, ``"auto"`` or a Layout (``force_layout``: over the base's config). ``dtype``: of
    the float outputs (default each key's in the base). ``mode``: ``"auto"`` streams when the method allows it,
    ``"stream"`` insists, ``"memory"`` loads everything. ``out`` must not hold an input or earlier weights
    (``overwrite``). ``heads``/``names``: docs/your-models.md §Per-task heads (``per_task_out``: one full model
    per task in ``<per_task_out>/<name>/``). ``force``: merge a base that fails the lineage check, with a warning.
    ``vocab``: ``"base"`` or ``"union"``, for experts whose vocabulary differs from the base's (docs/your-models.md
    §Vocabularies; default ``"base"``, with a warning when experts have tokens the base lacks). ``lora_out``: a
    folder for the merge of LoRA experts as one adapter (linear rules; docs/your-models.md §LoRA adapters as
    experts), written instead of ``out`` or beside it; ``lora_rank``: that adapter of this rank, for every method
    with a form in the factors' span (the discarded energy reported). ``lowrank``: ``"auto"`` merges the keys that
    every expert updates as a LoRA in the span of their factors (docs/methods.md §Low-rank updates), ``"never"``
    from the folded task vectors.
    """
    dev = resolve_device(device)  # up front, with the other options: a meta or missing device is refused at once
    out_dtype = parse_dtype(dtype)
    size = parse_size(shard_size)
    plan = plan_merge(method, base, experts, hparams=hparams, layout=layout, mode=mode, heads=heads, names=names,
                      force_layout=force_layout, vocab=vocab, force=force, lowrank=lowrank)
    if dry_run:
        return MergeResult(plan)
    if lora_rank is not None and lora_out is None:
        raise InputError("lora_rank / --lora-rank is the rank of the adapter output: give lora_out / --lora-out too")
    lora_info: dict[str, Any] = {}  # what the adapter output's record says, in the full merge's too
    if lora_out is not None:  # one adapter: the linear rules' exact one (lora_output.py)
        t0 = time.perf_counter()
        lineage = check_lineage(plan.base, plan.experts, plan.layout, force=force) if out is None else None
        folder, written, tasks, record = write_adapter_output(plan, lora_out, overwrite=overwrite, dtype=out_dtype,
                                                              rank=lora_rank)
        lora_info = {"lora_out": str(folder), "lora_record": record}
        if out is None and lineage is not None:
            info = {"method": method, "files": [f.name for f in written], "lineage": lineage.as_dict(), **lora_info,
                    "heads": {"mode": plan.heads.mode, "reason": plan.heads.reason, "keys": plan.heads.keys,
                              "tasks": tasks}}
            return MergeResult(plan, folder, written, time.perf_counter() - t0, info)
    if out is None:
        raise InputError("out is required: the folder the merged checkpoint is written to")
    out_dir = check_output_folder(out, [plan.base, *plan.experts], overwrite=overwrite)  # before a lock is written
    with lock_output(out_dir):  # held until the output is in place: a second merge into it is refused at once
        remove_stale_stages(out_dir)  # the folders killed merges left beside it (docs/your-models.md §What is written)
        # checked again under the lock: a merge into it may have finished meanwhile
        out_dir = check_output_folder(out, [plan.base, *plan.experts], overwrite=overwrite)
        check_heads_folder(out_dir, [plan.base, *plan.experts], overwrite, writing=plan.heads.mode == "per-task")
        tasks_dir = check_task_folders(per_task_out, out_dir, plan.heads, [plan.base, *plan.experts], overwrite)
        hashes = _InputHashes(plan, hash_inputs)  # from here on, beside the lineage check and the merge
        final_dir, stage = out_dir, None
        try:
            lineage = check_lineage(plan.base, plan.experts, plan.layout, force=force)
            t0 = time.perf_counter()
            # a new folder is assembled as a hidden sibling (make_stage) and renamed into place at the end; an
            # existing one gets its files moved in
            stage = None if out_dir.exists() else make_stage(out_dir)
            done = _write_merge(plan, stage or out_dir, size=size, dev=dev, out_dtype=out_dtype, show=progress,
                                hashes=hashes, overwrite=overwrite)
        except BaseException:
            hashes.cancel()
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            raise
        out_dir, files, seconds = stage or out_dir, done["files"], time.perf_counter() - t0
        info = _merge_info(plan, done, out_dtype=out_dtype, size=size, seconds=seconds, lineage=lineage.as_dict(),
                           tasks_dir=tasks_dir) | lora_info
        with atomic_write(out_dir / "acetools_merge.json", "w") as fh:
            json.dump(info, fh, indent=2)
        staged = _stage_tasks(plan, out_dir, tasks_dir, size, stage)  # renamed into place after --out
        if stage is not None:
            os.rename(stage, final_dir)  # atomic: the folder appears complete or not at all
            files = [final_dir / f.name for f in files]
        commit_task_folders(staged)
        log.info("merged %d experts with %s into %s in %.1f s", len(plan.experts), method, final_dir, seconds)
        return MergeResult(plan, final_dir, files, seconds, info)


# --------------------------------------------------------------------------- command line and config files
CONFIG_KEYS = ("method", "base", "experts", "out", "hyperparameters", "layout", "dtype", "device", "shard_size",
               "mode", "overwrite", "heads", "names", "force_layout", "force", "models", "vocab", "lora_out",
               "per_task_out", "lowrank", "lora_rank")


def parse_hparam(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, value)``: ``true``/``false``/``none``/``null``, else as
    :func:`acetools.notebooks.parse_parameter` reads it (a literal: ``20``, ``(1, 2)``; else the string)."""
    key, raw = parse_parameter(text, literal=False)
    low = raw.strip().lower()
    if low in ("true", "false", "none", "null"):
        return key, low == "true" if low in ("true", "false") else None
    return parse_parameter(f"{key}={raw.strip()}")


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a merge config (YAML, :data:`CONFIG_KEYS`; docs/your-models.md §Config file); paths relative to
    the file, unknown keys an error naming them. Expert entries may carry ``weight`` and ``density``
    (docs/your-models.md §Coming from mergekit), returned under ``"per_expert"`` for
    :func:`acetools.files.per_expert.per_expert_hparams`; ``models:`` is mergekit's name for ``experts:``."""
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
        hints = "".join(f"; {mergekit_key_hint(k)}" for k in unknown if k in MERGEKIT_KEYS)
        raise InputError(f"{p}: unknown key(s) {unknown}; valid keys are: {', '.join(CONFIG_KEYS)}{hints}")
    cfg = dict(data)
    if "models" in cfg:  # mergekit's spelling of the experts' list
        if "experts" in cfg:
            raise InputError(f"{p}: give the experts once, as experts: or as mergekit's models:")
        cfg["experts"] = cfg.pop("models")
    for k, what in (("experts", "a list of paths"), ("names", "a list, one per expert")):
        if k in cfg and not isinstance(cfg[k], list):
            raise InputError(f"{p}: {k} must be {what}")
    if "hyperparameters" in cfg and not isinstance(cfg["hyperparameters"] or {}, Mapping):
        raise InputError(f"{p}: hyperparameters must be a mapping name: value")

    def rel(x: Any) -> str:
        q = Path(str(x)).expanduser()
        return str(q if q.is_absolute() else p.parent / q)

    for k in ("base", "out", "lora_out", "per_task_out"):
        if cfg.get(k) is not None:
            cfg[k] = rel(cfg[k])
    if cfg.get("experts"):
        paths, per_expert = read_experts(cfg["experts"], str(p))
        cfg["experts"] = [rel(e) for e in paths]
        if per_expert:
            cfg["per_expert"] = per_expert
    cfg["hyperparameters"] = dict(cfg.get("hyperparameters") or {})
    return cfg
