"""A merge of LoRA experts written back as one peft adapter: the linear rules' exact one of rank sum_t r_t
(:func:`acetools.files.lora.write_merged_adapter`), or of a chosen rank (docs/your-models.md §LoRA adapters as
experts): each key's merge in the span of the adapters' factors (:func:`acetools.merging.lowrank.lowrank_update`:
TSV-M, Iso-C, Iso-CTS, ACE, task arithmetic, weight averaging), cut to rank R by
:func:`acetools.merging.lowrank.to_rank`, with the discarded energy per key and in total.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError
from ..merging.lowrank import lowrank_form, lowrank_update, to_rank
from .lora import (
    _PREFIX,
    ADAPTER_CONFIG,
    canonical_factors,
    lora_target,
    output_adapters,
    save_adapter,
    write_merged_adapter,
)

__all__ = ["write_rank_adapter", "write_adapter_output"]

log = logging.getLogger("acetools.files.lora_output")


def _refuse(what: str) -> InputError:
    return InputError(f"{what}; write the full model (out / --out)")


def write_rank_adapter(plan: Any, out: str | os.PathLike, rank: int, *, dtype: torch.dtype | None = None
                       ) -> tuple[list[Path], dict[str, Any]]:
    """Write the planned merge of LoRA experts (``plan``: a :class:`~acetools.files.merge_files.MergePlan`) as one
    peft adapter of rank ``rank`` into ``out``: per key every adapter updates, the method's merge in the span of
    their factors, its best rank-``rank`` factors (Eckart–Young, docs/methods.md §Low-rank updates, Eq. (LR.10)),
    ``lora_alpha = r``. Refused in one line where ``rank`` exceeds the rank a key's merged update has, where the
    method has no form in the span, where an adapter updates a module another does not, and for what an adapter
    of this kind cannot carry (lora_bias, a stored W0, modules_to_save other than per-task heads). Returns the
    written files and the record (``discarded``: per key, ``discarded_total``: over every key, of the energy
    sum_j s_j² of the merged updates)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InputError(f"--lora-rank {rank!r}: the adapter's rank is an integer >= 1")
    why = lowrank_form(plan.method, plan.hparams)
    if why is not None:
        raise _refuse(f"--lora-rank: {why}")
    ads, fan = output_adapters(plan.experts)
    for a in ads:
        for name in a.saved:
            if name not in plan.heads.keys:
                raise _refuse(f"--lora-rank: LoRA adapter {a.path} saves {name!r} (modules_to_save or a bias), which "
                              "an adapter of a chosen rank does not carry; only per-task heads are written beside it")
    tensors: dict[str, Tensor] = {}
    ranks: dict[str, int] = {}
    discarded: dict[str, float] = {}
    energy = kept = 0.0
    seen = 0
    for key in plan.base.keys():
        found = [lora_target(ck, key) for ck in plan.experts]
        if all(f is None for f in found):
            continue
        if any(f is None for f in found):
            raise _refuse(f"--lora-rank: {key!r} is updated by {sum(f is not None for f in found)} of the "
                          f"{len(found)} adapters; an adapter of a chosen rank needs every adapter on the same modules")
        seen += len(found)
        in_out = plan.layout.orientation(key) == "in_out"
        factors = canonical_factors(plan.experts, key, in_out)
        assert factors is not None
        matrix = plan.layout.is_matrix(key, plan.base.meta(key))
        up = lowrank_update(plan.method, factors, plan.hparams, is_matrix=matrix, key=key)
        cut = to_rank(up, rank)
        if cut.update.rank < rank:
            raise InputError(f"--lora-rank {rank} exceeds the rank available at {key!r}: its merged update has "
                             f"{cut.update.rank} singular values (the span of the factors); choose --lora-rank <= "
                             f"{cut.update.rank}")
        total = float(cut.S.square().sum())
        energy += total
        kept += total * (1.0 - cut.discarded)
        discarded[key] = cut.discarded
        first = found[0]
        assert first is not None  # every expert has a target here
        a, t = first
        B, A = cut.update
        B, A = (A.mT, B.mT) if t.transpose != in_out else (B, A)  # peft's B A is the stored update (transposed)
        dt = dtype or a.ameta[t.a].dtype
        part = ("lora_embedding_A", "lora_embedding_B") if t.embedding else ("lora_A.weight", "lora_B.weight")
        tensors[f"{_PREFIX}{t.module}.{part[0]}"] = A.to(dt).contiguous()
        tensors[f"{_PREFIX}{t.module}.{part[1]}"] = B.to(dt).contiguous()
        ranks[t.module] = rank
    total_targets = sum(len(a.targets) for a in ads)
    if seen != total_targets:
        raise _refuse(f"--lora-rank: {total_targets - seen} of the adapters' LoRA modules are not plain updates of the "
                      "base's matrices (lora_bias, an embedding with its own stored W0, or a head)")
    total = 0.0 if energy == 0 else max(0.0, 1.0 - kept / energy)
    record = {"method": plan.method, "lora_rank": rank, "experts": [str(a.path) for a in ads], "ranks": ranks,
              "discarded": discarded, "discarded_total": total}
    log.info("adapter of rank %d: %.3g of the merged updates' energy discarded over %d keys", rank, total,
             len(discarded))
    return save_adapter(out, tensors, ranks, [], fan, ads[0].adapter_config, record), record


def write_adapter_output(plan: Any, lora_out: str | os.PathLike, *, overwrite: bool = False,
                         dtype: torch.dtype | None = None, rank: int | None = None
                         ) -> tuple[Path, list[Path], dict[str, str], dict[str, Any]]:
    """``merge_files(..., lora_out=...)``: the planned merge of LoRA experts as one adapter in ``lora_out``, the
    linear rules' exact one (:func:`acetools.files.lora.write_merged_adapter`) or, with ``rank``, any method's
    with a form in the span cut to that rank (:func:`write_rank_adapter`); per-task heads in ``lora_out/heads/``
    as a full merge writes them. Returns ``(folder, files, {task: heads/<task>}, record)``; ``plan`` is a
    :class:`~acetools.files.merge_files.MergePlan`."""
    from .checkpoints import check_output_folder
    from .heads import HeadWriter, check_heads_folder, remove_stale_heads
    from .staging import lock_output

    inputs = [plan.base, *plan.experts]
    out = check_output_folder(lora_out, inputs, overwrite=overwrite, option="--lora-out")
    if out.is_dir() and not overwrite and (out / ADAPTER_CONFIG).is_file():
        raise FileExistsError(f"--lora-out {out} already holds an adapter ({ADAPTER_CONFIG}); choose an empty folder "
                              "or pass overwrite=True / --overwrite")
    with lock_output(out):
        per_task = plan.heads.mode == "per-task"
        check_heads_folder(out, inputs, overwrite, writing=per_task)
        if rank is None:
            files = write_merged_adapter(plan.method, plan.hparams, plan.experts, out, dtype=dtype,
                                         skip=plan.heads.keys)
            record: dict[str, Any] = json.loads((out / "acetools_merge.json").read_text())
        else:
            files, record = write_rank_adapter(plan, out, rank, dtype=dtype)
        tasks: dict[str, str] = {}
        if per_task:
            writer = HeadWriter(out, plan.heads)
            try:
                tasks = writer.write()
            except BaseException:
                writer.abort()
                raise
            writer.commit()
        elif overwrite:
            remove_stale_heads(out)
    return out, files, tasks, record
