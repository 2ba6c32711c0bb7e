"""``get_task`` and ``load_split``: from a task name to cached tensors (built whole,
checked for images shared between splits, cached as one ``.npz``; docs/vision-world.md §The tasks)."""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ....errors import InputError, InputTypeError
from ._core import (
    SPLITS,
    TaskData,
    TaskInfo,
    cache_path,
    check_split_args,
    data_root,
    digest_arrays,
    load_npz,
    row_hashes,
    save_npz,
    suggest,
    to_tensor_images,
)

if TYPE_CHECKING:
    from .online import OnlineSpec
    from .registry import TaskSpec

log = logging.getLogger(__name__)

__all__ = ["get_task", "load_split", "build_task", "all_task_names"]


def _registries():
    from . import fixtures, online, registry

    return registry.SPECS, online.ONLINE_SPECS, fixtures.FIXTURE_SPECS


def all_task_names() -> list[str]:
    return [name for reg in _registries() for name in reg]


def _spec(name: str) -> TaskSpec | OnlineSpec:
    if not isinstance(name, str):
        raise InputTypeError(f"task name must be a str, got {type(name).__name__}")
    for reg in _registries():
        if name in reg:
            return reg[name]
    raise InputError(f"unknown task {name!r}{suggest(name, all_task_names())} "
                     f"Known tasks: {', '.join(all_task_names())}.")


def get_task(name: str) -> TaskInfo:
    """The :class:`TaskInfo` of an offline, online (torchvision) or fixture task."""
    return _spec(name).info


def _key_params(spec) -> dict:
    return {"task": spec.info.name, **dict(spec.params), "sizes": dict(spec.info.sizes)}


@functools.lru_cache(maxsize=1)
def _load_cached(path: str, mtime_ns: int) -> dict[str, np.ndarray]:
    """The last cache file read (train, val and test are usually asked for in a row);
    callers copy what they return."""
    arrays, _ = load_npz(Path(path))
    for a in arrays.values():
        a.flags.writeable = False
    return arrays


def build_task(name: str, root=None, allow_download: bool = False, write: bool = True) -> dict[str, np.ndarray]:
    """Build every split of ``name`` at full size, check that no image is in two splits, and
    (with ``write``) cache it. Returns ``{"x_train": ..., "y_train": ..., ...}`` (NCHW)."""
    from . import online

    spec = _spec(name)
    if isinstance(spec, online.OnlineSpec):
        raise InputError(f"task {name!r} comes from torchvision (online): load it with load_split, not build_task")
    root = data_root(root)
    t0 = time.perf_counter()
    arrays: dict[str, np.ndarray] = {}
    for split in SPLITS:
        x, y = spec.build(split, int(spec.info.sizes[split]), root, allow_download)
        arrays[f"x_{split}"] = to_tensor_images(x).numpy()
        arrays[f"y_{split}"] = np.asarray(y, dtype=np.int64)
    seen: dict[bytes, str] = {}
    for split in SPLITS:
        for h in set(row_hashes(arrays[f"x_{split}"])):
            if h in seen and seen[h] != split:
                raise RuntimeError(f"task {name!r}: an image occurs in both {seen[h]} and {split}; "
                                   "this is a bug in its builder (report it)")
            seen[h] = split
    seconds = time.perf_counter() - t0
    if write and spec.cache:
        meta = {"params": _key_params(spec), "seconds": round(seconds, 3),
                "digests": {s: digest_arrays(arrays[f"x_{s}"], arrays[f"y_{s}"]) for s in SPLITS}}
        try:
            save_npz(cache_path(root, name, _key_params(spec)), arrays, meta)
        except OSError as e:  # a read-only data folder must not stop the work
            log.warning("could not cache task %r under %s: %s", name, root, e)
    return arrays


def load_split(name: str, split: str, *, root: str | os.PathLike | None = None, allow_download: bool = False,
               n: int | None = None) -> TaskData:
    """Split ``split`` of task ``name`` (offline, online or fixture) as :class:`TaskData` (``x`` uint8
    ``[N, 3, 32, 32]``, ``y`` int64), the same bytes on every call; ``n``: only the first ``n`` rows;
    ``allow_download``: let torchvision download a missing source. A missing source raises
    :class:`DataSourceError` saying how to get it."""
    check_split_args(split, n)
    spec = _spec(name)
    from . import online

    info = spec.info
    if isinstance(spec, online.OnlineSpec):
        return online.load_split(name, split, root=data_root(root), allow_download=allow_download, n=n)
    full = int(info.sizes[split])
    if n is not None and n > full:
        raise InputError(f"task {name!r} has {full} {split} images; n={n} asks for more")
    root_p = data_root(root)
    path = cache_path(root_p, name, _key_params(spec))
    if spec.cache and path.is_file():
        arrays = _load_cached(str(path), path.stat().st_mtime_ns)
        x, y = arrays[f"x_{split}"][:n].copy(), arrays[f"y_{split}"][:n].copy()
    elif not spec.cache:  # fixtures: build just this split (or its first n rows)
        x, y = spec.build(split, full if n is None else int(n), root_p, allow_download)
        x, y = to_tensor_images(x).numpy(), np.asarray(y, dtype=np.int64)
    elif n is None or n == full:
        arrays = build_task(name, root_p, allow_download, write=spec.cache)
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
    else:  # only the first n rows: the same bytes as the full split's prefix, not cached
        x, y = spec.build(split, int(n), root_p, allow_download)
        x, y = to_tensor_images(x).numpy(), np.asarray(y, dtype=np.int64)
    if n is not None:
        x, y = x[:n], y[:n]
    return TaskData(x=torch.from_numpy(np.ascontiguousarray(x)), y=torch.from_numpy(np.ascontiguousarray(y)),
                    class_names=info.class_names, name=name, split=split)
