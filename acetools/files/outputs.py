"""Outputs that load as written (docs/your-models.md §What is written, §Per-task heads): ``config.json`` records
the dtype of the weights written (:func:`record_dtype`), and ``--per-task-out DIR`` writes one folder per task
that ``AutoModelForSequenceClassification.from_pretrained(DIR/<name>)`` loads with that task's head, config
and tokenizer (:func:`stage_task_folders`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from ..errors import InputError
from ..utils import atomic_write
from .checkpoints import Checkpoint, ShardedWriter, check_output_folder, copy_side_files, open_checkpoint
from .heads import HeadPlan, load_head, task_config
from .staging import make_stage

__all__ = ["written_dtype", "record_dtype", "check_task_folders", "stage_task_folders", "commit_task_folders"]

log = logging.getLogger("acetools.files.outputs")


def written_dtype(tensors: Iterable[tuple[torch.dtype, Sequence[int]]]) -> torch.dtype | None:
    """The float dtype that holds most of the float entries of ``tensors`` (``(dtype, shape)``), if any."""
    count: dict[torch.dtype, int] = {}
    for dt, shape in tensors:
        if dt.is_floating_point:
            count[dt] = count.get(dt, 0) + math.prod(shape)
    if len(count) > 1:
        log.info("the weights written have several float dtypes (%s); config.json records the most common",
                 ", ".join(f"{str(d).removeprefix('torch.')}: {n} entries" for d, n in count.items()))
    return max(count, key=lambda d: count[d]) if count else None


def record_dtype(config: dict, dtype: torch.dtype | None) -> dict:
    """``config`` (a ``config.json`` as a dict) with ``dtype`` set to the dtype written (the key transformers 5
    reads), and ``torch_dtype`` too where the config has that key (transformers 4's name)."""
    if dtype is None:
        return config
    name = str(dtype).removeprefix("torch.")
    return {**config, "dtype": name, **({"torch_dtype": name} if "torch_dtype" in config else {})}


def rewrite_config(folder: Path, dtype: torch.dtype | None) -> None:
    """``folder/config.json`` (a copy of the base's, never the base's own file) with :func:`record_dtype`."""
    path = folder / "config.json"
    if path.is_file() and dtype is not None:
        cfg = json.loads(path.read_text())
        with atomic_write(path, "w") as fh:
            json.dump(record_dtype(cfg, dtype), fh, indent=2, sort_keys=True)


def check_task_folders(folder: str | os.PathLike | None, out: Path, heads: HeadPlan, inputs: Sequence[Checkpoint],
                       overwrite: bool) -> Path | None:
    """``--per-task-out`` (``None``: not asked) checked as ``--out`` is (no input in or around it; ``DIR/<name>``
    holding anything only with ``overwrite``), apart from ``out``, and with per-task heads; returns it resolved."""
    if folder is None:
        return None
    if heads.mode != "per-task":
        raise InputError(f"--per-task-out writes one model per task head, but heads are {heads.mode!r} "
                         f"({heads.reason}); merge classifiers with --heads per-task, or leave it out")
    where = check_output_folder(folder, inputs, overwrite, weights=False, option="--per-task-out")
    for name in heads.names:
        task = check_output_folder(where / name, inputs, overwrite, option="--per-task-out")
        if task == out or out in task.parents or task in out.parents:
            raise InputError(f"--per-task-out folder {task} and --out {out} overlap; give them separate folders")
        if task.is_dir() and any(task.iterdir()) and not overwrite:
            raise FileExistsError(f"--per-task-out folder {task} is not empty; choose another folder or pass "
                                  "overwrite=True / --overwrite (it is then replaced)")
    return where


def stage_task_folders(merged: Path, folder: Path, heads: HeadPlan, *, shard_size: int | str
                       ) -> list[tuple[Path, Path]]:
    """One hidden staging folder per task beside ``folder/<name>``: the merged backbone of ``merged`` (the merge
    written, not yet in place) with the task's head as one model, the task's config with the dtype written,
    the expert's side files and over them the base's (tokenizer). Returns ``[(stage, folder/<name>)]``
    for :func:`commit_task_folders`."""
    staged: list[tuple[Path, Path]] = []
    try:
        for name, expert in zip(heads.names, heads.experts):
            dest = folder / name
            stage = make_stage(dest)
            staged.append((stage, dest))
            head, record = load_head(merged, name)
            backbone = open_checkpoint(merged)
            with ShardedWriter(stage, shard_size=shard_size, metadata={"acetools.task": name}) as writer:
                for key in backbone.keys():
                    writer.add(key, backbone.get(key))
                for key, t in head.items():
                    writer.add(key, t)
            if expert.folder is not None:
                copy_side_files(Path(expert.folder), stage)
            copy_side_files(merged, stage)
            dtype = written_dtype((m.dtype, m.shape) for m in backbone.metas().values())
            with atomic_write(stage / "config.json", "w") as fh:
                json.dump(record_dtype(task_config(merged, name, record), dtype), fh, indent=2, sort_keys=True)
    except BaseException:
        for stage, _ in staged:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    return staged


def commit_task_folders(staged: Sequence[tuple[Path, Path]]) -> list[Path]:
    """Rename every staged task folder into place (an existing one, allowed by ``overwrite``, is replaced)."""
    for stage, dest in staged:
        old = None
        if dest.exists():
            old = stage.with_name(stage.name + "-old")
            os.rename(dest, old)
        os.rename(stage, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return [dest for _, dest in staged]
