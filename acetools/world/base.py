"""The world interface: what the benchmark, the regime card, the claims and the notebooks need from a
world (a base model, one expert per task, and a way to score a merged model on each task), whatever its
model and data. The merge engine never sees a world: the harness asks it for state dicts of the *merged
part* and for ESM's and RegMean's data inputs, then hands tensors to :func:`acetools.merge`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from ..errors import InputError, InputKeyError, InputTypeError
from ..files.activations import capture_inputs, gram_matrices
from ..files.checkpoints import CheckpointError, config_hash, load_checkpoint

__all__ = ["WorldBase", "cache_dir", "config_from", "EvaluatesAll", "MultiTaskWorld", "PerExample", "SplitData",
           "World", "as_world", "check_world", "cached_checkpoint"]

log = logging.getLogger(__name__)
StateDict = dict[str, Tensor]


@runtime_checkable
class World(Protocol):
    """One world: base, experts, tasks, evaluation and data inputs.

    Attributes: ``kind`` (``"vision"``, ``"text"``, ...), ``name`` (the suite), ``tasks``
    (merge order), ``seed`` (of the experts), ``size`` (the model's name), ``layout`` (the
    key layout name for :mod:`acetools.layouts`, or None), ``device``, ``profile``
    (``"full"`` or ``"quick"`` for a fixture world).
    """

    # read-only members: a world may hold them as attributes or compute them as properties
    @property
    def kind(self) -> str: ...
    @property
    def tasks(self) -> list[str]: ...
    @property
    def seed(self) -> int: ...
    @property
    def size(self) -> str: ...
    @property
    def layout(self) -> str | None: ...
    @property
    def device(self) -> torch.device | str: ...
    @property
    def name(self) -> str: ...

    def describe(self) -> str:
        """One line for pages and records."""
        ...

    def base_state(self) -> StateDict:
        """W0 of the merged part."""
        ...

    def expert_state(self, task: str) -> StateDict:
        """Task ``task``'s expert, same keys as :meth:`base_state`."""
        ...

    def evaluate(self, state: Mapping[str, Tensor], task: str, split: str = "test", n: int | None = None) -> float:
        """Top-1 accuracy (fraction) of the merged part ``state`` on ``task``'s split (first ``n``
        examples), with the head the world defines for ``task``."""
        ...

    def matrix_keys(self) -> list[str]:
        """The matrices ESM and RegMean target (the layers whose inputs can be captured)."""
        ...

    def proxy_inputs(self, task: str, n: int, seed: int = 0) -> Any:
        """ESM's ``n`` proxy inputs of ``task`` (from validation, seeded)."""
        ...

    def layer_inputs(self, state: Mapping[str, Tensor], inputs: Any, keys: Sequence[str]) -> dict[str, Tensor]:
        """Input activations (rows x d_in) of ``keys`` inside the model with ``state``."""
        ...

    def gram_inputs(self, state: Mapping[str, Tensor], inputs: Any, keys: Sequence[str]) -> dict[str, Tensor]:
        """RegMean's Grams XᵀX of ``keys``' inputs."""
        ...

    def gram_examples(self, task: str, n: int) -> Any:
        """RegMean's ``n`` training inputs of ``task``."""
        ...

    def records(self) -> list[dict]:
        """Sidecars of the checkpoints used (hashes, recipes, metrics)."""
        ...


@runtime_checkable
class EvaluatesAll(Protocol):
    """A world that scores one merged state on several tasks with one model built for it (the
    harness uses it where a world has it, else :meth:`World.evaluate` task by task)."""

    def evaluate_all(self, state: Mapping[str, Tensor], split: str = "test", n: int | None = None,
                     tasks: Sequence[str] | None = None) -> dict[str, float]:
        """Accuracy (fraction) per task of ``tasks`` (default: all) on ``split`` (first ``n`` examples)."""
        ...


@runtime_checkable
class PerExample(Protocol):
    """A world that scores every test example, so that two merges can be compared example by
    example (the claims' ``acetools_course.stats.paired_bootstrap``; docs/course.md §Claim rules)."""

    def correctness(self, state: Mapping[str, Tensor], split: str = "test", n: int | None = None,
                    tasks: Sequence[str] | None = None) -> dict[str, Any]:
        """Per task of ``tasks`` (default: all), a bool array with one entry per example of the
        first ``n`` of ``split``, in the split's order: whether the top-1 prediction is right."""
        ...


@runtime_checkable
class SplitData(Protocol):
    """A world whose splits can be read as data (the image worlds: ``x`` inputs and ``y`` labels)."""

    def data(self, task: str, split: str, n: int | None = None) -> Any:
        """``task``'s ``split``, cut to its first ``n`` examples (None: all)."""
        ...


@runtime_checkable
class MultiTaskWorld(Protocol):
    """A world with a multi-task model beside its experts (the vision zoo's MTL reference row)."""

    def mtl_state(self) -> StateDict:
        """The merged part of the model trained on all tasks at once."""
        ...


class WorldBase:
    """What the worlds share: the task check, ``experts()``, accuracy as the mean of :meth:`correctness`,
    :meth:`matrix_keys` and ESM's targets from :attr:`matrix_pattern`, the layer captures (the World protocol's
    docstrings) over :meth:`encoder` and :meth:`_batches`."""

    tasks: list[str]
    layout: str | None
    #: ESM's and RegMean's target matrices: the keys of :meth:`base_state` this regular expression finds
    matrix_pattern: str
    #: RegMean's Grams: inputs per forward pass (None: all at once, or as :meth:`_batches` cuts them)
    gram_batch_size: int | None = None

    def base_state(self) -> StateDict: ...

    def expert_state(self, task: str) -> StateDict: ...

    def encoder(self, state: Mapping[str, Tensor] | None = None) -> nn.Module: ...

    def correctness(self, state: Mapping[str, Tensor], split: str = "test", n: int | None = None,
                    tasks: Sequence[str] | None = None) -> dict[str, Any]: ...

    def _check_task(self, task: str, split: str | None = None) -> None:
        if task not in self.tasks:
            raise InputKeyError(f"task {task!r} is not in this world; tasks: {self.tasks}")
        if split is not None and split not in ("train", "val", "test"):
            raise InputError(f"split={split!r}: choose 'train', 'val' or 'test'")

    def experts(self) -> dict[str, StateDict]:
        return {t: self.expert_state(t) for t in self.tasks}

    def evaluate(self, state: Mapping[str, Tensor], task: str, split: str = "test", n: int | None = None) -> float:
        return self.evaluate_all(state, split, n, [task])[task]

    def evaluate_all(self, state: Mapping[str, Tensor], split: str = "test", n: int | None = None,
                     tasks: Sequence[str] | None = None) -> dict[str, float]:
        """Top-1 accuracy (fraction) per task of ``tasks`` (default: all) on the first ``n`` of ``split``."""
        return {t: int(c.sum()) / max(1, len(c)) for t, c in self.correctness(state, split, n, tasks).items()}

    def matrix_keys(self) -> list[str]:
        return [k for k in self.base_state() if re.search(self.matrix_pattern, k)]

    @property
    def esm_targets(self) -> tuple[str, ...]:
        """ESM's targets as the regular expressions it takes: every matrix of :meth:`matrix_keys` (none in
        the open_clip layout, where ESM's defaults are these matrices)."""
        return () if self.layout == "open_clip" else tuple(re.escape(k) + "$" for k in self.matrix_keys())

    def _batches(self, inputs: Any) -> Any:
        """``inputs`` as the batches :meth:`encoder` takes (default: as given)."""
        return inputs

    def _capture(self, fn: Any, state: Mapping[str, Tensor], inputs: Any, keys: Sequence[str],
                 **options: Any) -> dict[str, Tensor]:
        """``fn`` (``capture_inputs`` or ``gram_matrices``) over the encoder with ``state`` and ``inputs``' batches."""
        return fn(self.encoder(state), self._batches(inputs), list(keys), **options)

    def layer_inputs(self, state: Mapping[str, Tensor], inputs: Any, keys: Sequence[str]) -> dict[str, Tensor]:
        return self._capture(capture_inputs, state, inputs, keys)

    def gram_inputs(self, state: Mapping[str, Tensor], inputs: Any, keys: Sequence[str]) -> dict[str, Tensor]:
        return self._capture(gram_matrices, state, inputs, keys, batch_size=self.gram_batch_size)


def config_from(default: Any, value: Any) -> Any:
    """``value`` when it is a config of ``default``'s (dataclass) type, else ``default`` with ``value``'s
    overrides (a dict or None); an unknown field is an error naming the fields."""
    if isinstance(value, type(default)):
        return value
    names = [f.name for f in dataclasses.fields(default)]
    unknown = sorted(set(value or {}) - set(names))
    if unknown:
        raise InputTypeError(f"{type(default).__name__} has no field(s) {unknown}; fields: {names}")
    return dataclasses.replace(default, **dict(value or {}))


def cached_checkpoint(stem: Path, fields: Mapping[str, Any], read: bool = True,
                      ) -> tuple[Path, str, tuple[StateDict, dict] | None]:
    """A world's cache entry: the file ``<stem>-<key[:16]>.safetensors`` for the cache key of ``fields``
    (:func:`~acetools.files.checkpoints.config_hash`), the key, and ``(state, sidecar)`` when ``read`` and that
    file was saved with this key in its sidecar (None: absent, stale, or unreadable, which is logged; build it)."""
    key = config_hash(fields)
    path = stem.with_name(f"{stem.name}-{key[:16]}.safetensors")
    if read and path.is_file():
        try:
            state, side = load_checkpoint(path)
            if side.get("key") == key:
                return path, key, (state, side)
        except CheckpointError as err:
            log.warning("rebuilding %s: %s", path, err)
    return path, key, None


def cache_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    """A world's cache folder: ``root``, else ``$ACETOOLS_CACHE/<name>``, else ``~/.cache/acetools/<name>``."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("ACETOOLS_CACHE")
    return (Path(env).expanduser() if env else Path("~/.cache/acetools").expanduser()) / name


def as_world(obj: Any, **eval_options: Any) -> World:
    """``obj`` as a :class:`World`: a world is returned as is, the vision
    :class:`~acetools.world.vision.zoo.Zoo` as its view scoring with ``eval_options`` (a benchmark's
    ``batch_size`` and ``threads``: ``Zoo.evaluated_with``); anything else is a TypeError naming what it lacks."""
    check_world(obj)
    evaluated_with = getattr(obj, "evaluated_with", None)
    return obj if evaluated_with is None else evaluated_with(**eval_options)


def check_world(obj: Any) -> None:
    """TypeError naming the first missing member when ``obj`` is not a world."""
    need = ("kind", "tasks", "seed", "base_state", "expert_state", "evaluate", "matrix_keys", "proxy_inputs",
            "layer_inputs", "gram_inputs", "gram_examples", "records", "describe")
    missing = [m for m in need if not hasattr(obj, m)]
    if missing:
        raise InputTypeError(f"{type(obj).__name__} is not a world: it has no {missing[0]!r} "
                        "(see acetools.world.base.World)")
