"""The model zoo: a base, frozen heads, one expert per task and the MTL reference, cached; the image
mini-world behind the world interface (:mod:`acetools.world.base`).

``Zoo(["fashion", "digits"], size="tiny", seed=0).build()`` loads what is cached and builds the rest.
Checkpoints are safetensors state dicts with a JSON sidecar (recipe, metrics, cache key and the
fields it hashes, content SHA-256); keys, file layout and resuming: docs/vision-world.md §The zoo.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...errors import InputError, InputKeyError
from ...executor import Executor, as_executor
from ...files.checkpoints import (
    CheckpointError,
    config_hash,
    load_checkpoint,
    save_checkpoint,
    sidecar_path,
    state_hash,
)
from ...utils import atomic_write, make_generator
from ...utils import progress as _progress
from ..base import StateDict, WorldBase, cache_dir, cached_checkpoint, config_from
from . import finetune as _ft
from .finetune import FinetuneConfig, PretrainConfig
from .models import (
    DEFAULT_LOGIT_SCALE,
    MODEL_VERSION,
    ClassificationHead,
    ImageEncoder,
    load_encoder,
    model_config,
    prototype_head,
)

log = logging.getLogger(__name__)

__all__ = ["Zoo", "ASSETS", "VISION_MATRICES", "WORLD_FINETUNE", "data_hash", "build_zoos"]

#: Where shipped base checkpoints live: ``base_<size>.safetensors`` + ``base_<size>.json``.
ASSETS = Path(__file__).resolve().parent / "assets"

#: Per size, overrides of ``FinetuneConfig``'s defaults where ``Zoo(finetune=...)`` leaves a field
#: unset (docs/regime.md §The chosen recipe).
WORLD_FINETUNE: dict[str, dict[str, Any]] = {"small": {"lr": 1e-4, "precision": "bf16"}}

#: ESM's and RegMean's target matrices in the mini-world's ViT (open_clip names, ESM's default targets), as
#: the regular expression :meth:`WorldBase.matrix_keys` searches.
VISION_MATRICES = r"attn\.in_proj_weight|mlp\.c_fc\.weight|mlp\.c_proj\.weight"


class _NotCached(Exception):
    """Raised inside :meth:`Zoo.missing` instead of building an entry."""


def _raw_bytes(t: Tensor) -> memoryview:
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data


def data_hash(data) -> str:
    """SHA-256 of a dataset's content (``x``, ``y`` or ``labels``, name, class names), or its ``sha256``."""
    given = getattr(data, "sha256", None)
    if isinstance(given, str) and given:
        return given
    h = hashlib.sha256()
    h.update(f"{getattr(data, 'name', '')}|{getattr(data, 'split', '')}|".encode())
    h.update(json.dumps(list(getattr(data, "class_names", None) or [])).encode())
    x = torch.as_tensor(data.x)
    h.update(f"{str(x.dtype)}|{tuple(x.shape)}|".encode())
    h.update(_raw_bytes(x))
    if hasattr(data, "y"):
        h.update(_raw_bytes(torch.as_tensor(data.y)))
    for k in sorted(getattr(data, "labels", None) or {}):
        h.update(f"label:{k}:{int(data.head_classes[k])}|".encode())
        h.update(_raw_bytes(torch.as_tensor(data.labels[k])))
    return h.hexdigest()


# --------------------------------------------------------------------------- the zoo


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class Zoo(WorldBase):
    """Base, heads, experts and MTL model of one world, built once and cached (docs/vision-world.md §The zoo),
    and that world's evaluation, ESM's and RegMean's inputs and captured layers (:mod:`acetools.world.base`).

    Parameters
    ----------
    tasks: task names (or a suite name from ``acetools.world.vision.data.SUITES``), in merge order.
    size: model size (:data:`acetools.world.vision.models.SIZES`).
    seed: seed of the experts' and the MTL model's fine-tuning.
    root: cache folder (:func:`acetools.world.base.cache_dir`).
    base: ``"auto"`` (the shipped ``assets/base_<size>`` if present, else pretrain), ``"train"``
        (pretrain, cached), or a path to a base safetensors file (:meth:`_user_base`).
    base_seed, pool_seed: seeds of base pretraining and of the pretraining pool.
    pretrain, finetune: a ``PretrainConfig`` / ``FinetuneConfig`` or a dict of overrides.
    mtl: build the multi-task reference (with the ``finetune`` config).
    augment, hflip: per-task augmentation flags (default: the config's).
    logit_scale: of the prototype heads (docs/methods.md §Benchmark protocol).
    load_split, pretraining_pool, pool_kwargs: data functions (default ``acetools.world.vision.data``'s)
        and the pool's extra arguments; pass your own to build a world from other data.
    device, threads: where and with how many CPU threads to train.
    """

    kind = "vision"
    layout = "open_clip"
    base_label = "base (frozen heads)"
    matrix_pattern = VISION_MATRICES
    gram_batch_size = 128
    #: evaluation's batch size and CPU threads (a benchmark's own: :meth:`evaluated_with`)
    eval_batch_size: int = 512
    eval_threads: int | None = None

    def __init__(self, tasks: Sequence[str] | str, size: str = "tiny", seed: int = 0,
                 root: str | os.PathLike | None = None, *, base: str | os.PathLike = "auto", base_seed: int = 0,
                 pool_seed: int = 0, pretrain: PretrainConfig | Mapping[str, Any] | None = None,
                 finetune: FinetuneConfig | Mapping[str, Any] | None = None, mtl: bool = True,
                 augment: Mapping[str, bool] | None = None, hflip: Mapping[str, bool] | None = None,
                 logit_scale: float = DEFAULT_LOGIT_SCALE, load_split: Callable[[str, str], Any] | None = None,
                 pretraining_pool: Callable[..., Any] | None = None, pool_kwargs: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu", threads: int | None = None):
        self._load_split_fn = load_split
        self._pool_fn = pretraining_pool
        self.pool_kwargs = dict(pool_kwargs or {})
        if isinstance(tasks, str):
            suites = self._data_module().SUITES
            if tasks not in suites:
                raise InputError(f"unknown suite {tasks!r}; suites: {sorted(suites)}")
            self.suite: str | None = tasks
            tasks = list(suites[tasks])
        else:
            self.suite = None
        self.tasks: list[str] = list(tasks)
        if len(set(self.tasks)) != len(self.tasks) or not self.tasks:
            raise InputError(f"tasks must be a non-empty list of distinct names, got {self.tasks}")
        self.size = size
        model_config(size)  # fail early on an unknown size
        self.seed = int(seed)
        self.root = cache_dir("zoo", root)
        self.base_source = base
        self.base_seed = int(base_seed)
        self.pool_seed = int(pool_seed)
        self.pretrain_config = config_from(PretrainConfig(), pretrain)
        self.finetune_config = config_from(replace(FinetuneConfig(), **WORLD_FINETUNE.get(size, {})), finetune)
        self.mtl = bool(mtl)
        self.augment = {t: bool((augment or {}).get(t, self.finetune_config.augment)) for t in self.tasks}
        self.hflip = {t: bool((hflip or {}).get(t, self.finetune_config.hflip)) for t in self.tasks}
        self.logit_scale = float(logit_scale)
        self.device = device
        self.threads = threads
        #: what this object trained or computed, in order: ``(kind, task or None)``.
        self.built: list[tuple[str, str | None]] = []
        #: what it loaded from the cache: ``(kind, task or None)``.
        self.loaded: list[tuple[str, str | None]] = []
        self._data: dict[tuple[str, str], Any] = {}
        self._data_hashes: dict[tuple[str, str], str] = {}
        self._states: dict[tuple[str, str | None], StateDict] = {}
        self._sides: dict[tuple[str, str | None], dict] = {}
        self._paths: dict[tuple[str, str | None], Path] = {}
        self._progress: bool | None = None
        self._dry = False  # True inside missing(): never build

    def __repr__(self) -> str:
        return (
            f"Zoo(tasks={self.tasks}, size={self.size!r}, seed={self.seed}, root={str(self.root)!r}, "
            f"base={str(self.base_source)!r})"
        )

    def describe(self) -> str:
        return (f"vision mini-world {self.name!r}: {len(self.tasks)} tasks, ViT size {self.size}, "
                f"expert seed {self.seed}")

    @property
    def profile(self) -> str:
        return "quick" if self.size in ("micro", "tiny") else "full"

    @property
    def name(self) -> str:
        return self.suite or "custom"

    @property
    def folder(self) -> Path:
        return self.root / _safe(self.size)

    def _data_module(self):
        from . import data

        return data

    def split(self, task: str, split: str = "train"):
        """A task's data split (cached in memory), from ``load_split`` or ``acetools.world.vision.data``."""
        key = (task, split)
        if key not in self._data:
            fn = self._load_split_fn or self._data_module().load_split
            self._data[key] = fn(task, split)
        return self._data[key]

    def _pool(self):
        if ("__pool__", "train") not in self._data:
            fn = self._pool_fn or self._data_module().pretraining_pool
            self._data[("__pool__", "train")] = fn(seed=self.pool_seed, **self.pool_kwargs)
        return self._data[("__pool__", "train")]

    def _data_hash(self, task: str, split: str = "train") -> str:
        key = (task, split)
        if key not in self._data_hashes:
            self._data_hashes[key] = data_hash(self._pool() if task == "__pool__" else self.split(task, split))
        return self._data_hashes[key]

    def _val_acc(self, model, head: ClassificationHead, task: str) -> float | None:
        """Accuracy of ``head(model)`` on ``task``'s validation split (None: the task has none)."""
        try:
            val = self.split(task, "val")
        except (KeyError, ValueError, FileNotFoundError):
            return None
        return _ft.evaluate(model, head, val, size=self.size, device=self.device, threads=self.threads)

    # ----------------------------------------------------------------- generic entry handling

    def _entry(self, kind: str, task: str | None, key_fields: dict, path: Path, make: Callable[[], tuple]):
        """Load a valid cached entry or build it with ``make() -> (state, recipe, metrics)``."""
        ident = (kind, task)
        if ident in self._states:
            return self._states[ident]
        path, key, cached = cached_checkpoint(path, key_fields)
        if cached is None:
            if self._dry:
                raise _NotCached(ident)
            t0 = time.perf_counter()
            state, recipe, metrics = make()
            meta = {"kind": kind, "task": task, "key": key, "key_fields": key_fields, "recipe": recipe,
                    "metrics": metrics, "seconds": round(time.perf_counter() - t0, 2),
                    "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "acetools_model_version": MODEL_VERSION}
            side = save_checkpoint(path, state, meta)
            self.built.append(ident)
            log.info("built %s%s in %.1f s: %s", kind, f" {task}" if task else "", meta["seconds"], path)
        else:
            state, side = cached
            self.loaded.append(ident)
            log.debug("loaded %s%s from %s", kind, f" {task}" if task else "", path)
        self._states[ident] = state
        self._sides[ident] = side
        self._paths[ident] = path
        return state

    # ----------------------------------------------------------------- base

    def _shipped_base(self) -> Path | None:
        if self.base_source in ("auto", None):
            p = ASSETS / f"base_{self.size}.safetensors"
            return p if p.is_file() else None
        if self.base_source == "train":
            return None
        p = Path(self.base_source).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"base checkpoint {p} not found")
        return p

    def _user_base(self, path: Path) -> tuple[StateDict, dict]:
        """A base file of the user's (``base=path``): checked against the hash its sidecar or metadata
        records; without one, its hash is recorded on first use (``base/user_bases.json``) and a later
        change is logged (every cache key below the base holds its hash)."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                recorded = (f.metadata() or {}).get("content_sha256")
        except Exception as err:  # safetensors' own error types for a damaged header
            raise CheckpointError(f"unreadable base file {path}: {err}; pass a safetensors state dict or use "
                                  "Zoo(..., base='train')") from err
        if sidecar_path(path).is_file() or recorded:
            try:
                return load_checkpoint(path, verify=True)
            except CheckpointError as err:
                raise CheckpointError(
                    f"the base file {path} does not match the content hash recorded in its sidecar or metadata "
                    f"({err}); fix or remove {sidecar_path(path).name}, pass the file the hash was recorded for, "
                    "or use Zoo(..., base='train')"
                ) from err
        state, side = load_checkpoint(path, verify=False)
        got = state_hash(state)
        book = self.folder / "base" / "user_bases.json"
        seen = json.loads(book.read_text()) if book.is_file() else {}
        key = str(path.resolve())
        if seen.get(key, got) != got:
            log.warning("the base file %s changed since its first use (content hash %s... against %s... in %s); "
                        "heads, experts and the MTL model are rebuilt for it (their cache keys hold the base's hash)",
                        path, got[:12], seen[key][:12], book)
        if seen.get(key) != got:
            seen[key] = got
            book.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(book, "w") as fh:
                json.dump(seen, fh, indent=1, sort_keys=True)
        return state, {**side, "content_sha256": got}

    def base_state(self) -> StateDict:
        """W0: the shipped base, or the cached one, or a freshly pretrained one."""
        ident = ("base", None)
        if ident in self._states:
            return self._states[ident]
        shipped = self._shipped_base()
        if shipped is not None:
            if self.base_source in ("auto", None):  # the asset shipped with acetools
                try:
                    state, side = load_checkpoint(shipped, verify=True)
                except CheckpointError as err:
                    raise CheckpointError(
                        f"the base file {shipped} does not match its recorded hash ({err}); restore it "
                        "(git checkout) or use Zoo(..., base='train') to pretrain one"
                    ) from err
            else:
                state, side = self._user_base(shipped)
            load_encoder(state, self.size)  # fails clearly if the file is for another size
            side = dict(side)
            side.setdefault("content_sha256", state_hash(state))
            side.setdefault("kind", "base")
            self._states[ident], self._sides[ident], self._paths[ident] = state, side, shipped
            self.loaded.append(ident)
            return state
        fields = {"kind": "base", "size": self.size, "model_config": model_config(self.size),
                  "pretrain": _ft.key_config(self.pretrain_config), "pool": self._data_hash("__pool__"),
                  "pool_seed": self.pool_seed, "seed": self.base_seed, "model_version": MODEL_VERSION}

        def make():
            # epoch checkpoints next to the final file, so an interrupted pretraining resumes
            self.folder.joinpath("base").mkdir(parents=True, exist_ok=True)
            resume = self.folder / "base" / f"base-{config_hash(fields)[:16]}.resume.safetensors"
            state, recipe = _ft.pretrain_base(
                self._pool(), self.size, self.pretrain_config, seed=self.base_seed,
                device=self.device, threads=self.threads, progress=self._progress, checkpoint=resume,
            )
            return state, recipe, {}

        return self._entry("base", None, fields, self.folder / "base" / "base", make)

    def base_hash(self) -> str:
        return self.sidecar("base")["content_sha256"]

    # ----------------------------------------------------------------- heads

    def head(self, task: str) -> ClassificationHead:
        """The frozen prototype head of ``task`` (normalised class means of the base's
        features on the task's training split, times ``logit_scale``)."""
        self._check_task(task)
        data = self.split(task, "train")
        fields = {"kind": "head", "head_type": "prototype", "task": task, "logit_scale": self.logit_scale,
                  "base": self.base_hash(), "data": self._data_hash(task), "model_version": MODEL_VERSION}

        def make():
            enc = self.encoder()
            n_classes = (
                len(data.class_names) if getattr(data, "class_names", None) else int(torch.as_tensor(data.y).max()) + 1
            )
            with _ft.num_threads(self.threads):
                h = prototype_head(enc, data.x, data.y, n_classes, logit_scale=self.logit_scale, device=self.device)
            acc = self._val_acc(enc, h, task)
            metrics = {} if acc is None else {"base_val_acc": acc}
            recipe = {"head_type": "prototype", "logit_scale": self.logit_scale, "n_classes": n_classes,
                      "class_names": list(getattr(data, "class_names", None) or [])}
            return {"weight": h.weight.detach().clone()}, recipe, metrics

        state = self._entry("head", task, fields, self.folder / "heads" / _safe(task), make)
        names = self._sides[("head", task)].get("recipe", {}).get("class_names") or None
        return ClassificationHead(state["weight"], class_names=names)

    # ----------------------------------------------------------------- experts and MTL

    def _ft_fields(self, cfg: FinetuneConfig, tasks: Sequence[str]) -> dict:
        return _ft.key_config(replace(cfg, augment=False, hflip=False)) | {
            "augment": {t: self.augment[t] for t in tasks},
            "hflip": {t: self.hflip[t] for t in tasks},
        }

    def expert_state(self, task: str) -> StateDict:
        """W_t: the encoder fine-tuned on ``task`` from the base with its head frozen."""
        self._check_task(task)
        head = self.head(task)
        fields = {"kind": "expert", "size": self.size, "task": task,
                  "finetune": self._ft_fields(self.finetune_config, [task]), "data": self._data_hash(task),
                  "base": self.base_hash(), "head": self.sidecar("head", task)["content_sha256"], "seed": self.seed,
                  "model_version": MODEL_VERSION}

        def make():
            state, recipe = _ft.finetune_expert(
                self.base_state(), head, self.split(task, "train"), self.finetune_config,
                size=self.size, seed=self.seed, device=self.device, threads=self.threads,
                progress=self._progress, augment=self.augment[task], hflip=self.hflip[task],
            )
            acc = self._val_acc(state, head, task)
            return state, recipe, {} if acc is None else {"val_acc": acc}

        return self._entry("expert", task, fields, self.folder / "experts" / f"{_safe(task)}-seed{self.seed}", make)

    def mtl_state(self) -> StateDict:
        """The multi-task reference encoder, trained jointly on all tasks (mixed batches)."""
        heads = {t: self.head(t) for t in self.tasks}
        fields = {"kind": "mtl", "size": self.size, "tasks": self.tasks,
                  "finetune": self._ft_fields(self.finetune_config, self.tasks),
                  "data": [self._data_hash(t) for t in self.tasks], "base": self.base_hash(),
                  "heads": [self.sidecar("head", t)["content_sha256"] for t in self.tasks], "seed": self.seed,
                  "model_version": MODEL_VERSION}

        def make():
            datasets = {t: self.split(t, "train") for t in self.tasks}
            state, recipe = _ft.train_multitask(
                self.base_state(), heads, datasets, self.finetune_config, size=self.size, seed=self.seed,
                augment=self.augment, hflip=self.hflip, device=self.device, threads=self.threads,
                progress=self._progress,
            )
            accs = {t: self._val_acc(state, heads[t], t) for t in self.tasks}
            return state, recipe, {"val_acc": {t: a for t, a in accs.items() if a is not None}}

        name = f"mtl-{len(self.tasks)}tasks-seed{self.seed}"
        return self._entry("mtl", None, fields, self.folder / "mtl" / name, make)

    # ----------------------------------------------------------------- build and views

    def build(self, progress: bool | None = None, *, mtl: bool | None = None) -> Zoo:
        """Load what is cached and valid, build the rest (base, heads, experts, the MTL model if asked);
        returns ``self``. ``progress``: bars over the steps and inside each loop (``None``: automatic)."""
        self._progress = progress
        steps = self._steps(mtl)
        for kind, task in _progress(steps, desc=f"zoo {self.size}", total=len(steps), enabled=progress):
            self._get(kind, task)
        return self

    def unbuilt(self) -> Zoo:
        """A copy of this zoo's settings with nothing loaded (no tensors: what a worker of :func:`build_zoos`
        gets, and loads or builds from the shared cache)."""
        fresh = copy.copy(self)
        fresh.built, fresh.loaded = [], []
        fresh._data, fresh._data_hashes, fresh._states, fresh._sides, fresh._paths = {}, {}, {}, {}, {}
        return fresh

    def _get(self, kind: str, task: str | None):
        """Load or build one entry by ``kind`` (base/head/expert/mtl)."""
        getters = {"base": self.base_state, "head": self.head, "expert": self.expert_state, "mtl": self.mtl_state}
        if kind not in getters:
            raise InputKeyError(f"unknown entry kind {kind!r}; kinds: {', '.join(getters)}")
        return getters[kind](task) if kind in ("head", "expert") else getters[kind]()

    def _steps(self, mtl: bool | None) -> list[tuple[str, str | None]]:
        steps: list[tuple[str, str | None]] = [("base", None)]
        steps += [("head", t) for t in self.tasks] + [("expert", t) for t in self.tasks]
        if self.mtl if mtl is None else mtl:
            steps.append(("mtl", None))
        return steps

    def missing(self, *, mtl: bool | None = None) -> list[tuple[str, str | None]]:
        """What :meth:`build` would compute, ``(kind, task or None)`` in build order, without building:
        entries with no valid cached file, and those that start from one (their keys hold its hash).
        Valid entries are loaded on the way."""
        out = []
        self._dry = True
        try:
            for kind, task in self._steps(mtl):
                try:
                    self._get(kind, task)
                except _NotCached:
                    out.append((kind, task))
        finally:
            self._dry = False
        return out

    def encoder(self, state: Mapping[str, Tensor] | None = None) -> ImageEncoder:
        """An encoder of this zoo's size holding ``state`` (default: the base)."""
        return load_encoder(self.base_state() if state is None else state, self.size, device=self.device)

    def path(self, kind: str, task: str | None = None) -> Path:
        """The file of a built or loaded entry (``kind`` in base/head/expert/mtl)."""
        ident = (kind, task)
        if ident not in self._paths:
            self._get(kind, task)
        return self._paths[ident]

    def sidecar(self, kind: str, task: str | None = None) -> dict:
        """The JSON sidecar (recipe, metrics, hashes, timing) of an entry."""
        self.path(kind, task)
        return self._sides[(kind, task)]

    def records(self) -> list[dict]:
        """One row per entry loaded or built so far: kind, task, file, key, content hash, seconds, metrics
        (docs/style.md §14)."""
        return [{"kind": kind, "task": task, "file": str(self._paths[(kind, task)]), "key": side.get("key"),
                 "content_sha256": side.get("content_sha256"),
                 "seconds": side.get("seconds", (side.get("recipe") or {}).get("seconds")),
                 "metrics": side.get("metrics", {})} for (kind, task), side in self._sides.items()]

    # ----------------------------------------------------------------- the world: evaluation and data inputs

    def evaluated_with(self, batch_size: int = 512, threads: int | None = None) -> Zoo:
        """This zoo (its caches shared) scoring with ``batch_size`` and ``threads`` CPU threads: a benchmark's
        (:func:`acetools.world.base.as_world`); training keeps the zoo's ``threads``."""
        view = copy.copy(self)
        view.eval_batch_size, view.eval_threads = batch_size, threads
        return view

    def data(self, task: str, split: str, n: int | None = None):
        d = self.split(task, split)
        if n is None or n >= len(d.y):
            return d
        return SimpleNamespace(x=d.x[:n], y=d.y[:n], name=task, split=split)

    def correctness(self, state: Mapping[str, Tensor], split: str = "test", n: int | None = None,
                    tasks: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Per-example correctness per task, one encoder built for ``state`` (``world.base.PerExample``)."""
        enc = self.encoder(state)
        return {t: _ft.correctness(enc, self.head(t), self.data(t, split, n), batch_size=self.eval_batch_size,
                                   threads=self.eval_threads).numpy() for t in (tasks or self.tasks)}

    def proxy_inputs(self, task: str, n: int, seed: int = 0) -> Tensor:
        """``n`` validation images of ``task`` drawn without replacement (docs/methods.md §ESM)."""
        d = self.split(task, "val")
        idx = torch.randperm(len(d.y), generator=make_generator(seed))[:n]
        return torch.as_tensor(np.asarray(d.x))[idx]

    def gram_examples(self, task: str, n: int) -> Tensor:
        return torch.as_tensor(np.asarray(self.split(task, "train").x[:n]))

    def export_base(self, folder: str | os.PathLike | None = None, command: str | None = None) -> Path:
        """Write the base as ``base_<size>.safetensors`` + ``.json`` (recipe, content hash,
        the rebuild command) into ``folder`` (default :data:`ASSETS`), for shipping."""
        state = self.base_state()
        side = self._sides[("base", None)]
        folder = Path(folder) if folder is not None else ASSETS
        path = folder / f"base_{self.size}.safetensors"
        meta = {
            "kind": "base", "size": self.size, "recipe": side.get("recipe"), "key_fields": side.get("key_fields"),
            "model_version": MODEL_VERSION,
            "command": command or (
                f"python -c \"from acetools.world.vision.zoo import Zoo; Zoo({self.tasks[:1]!r}, size={self.size!r}, "
                f"base='train', base_seed={self.base_seed}, pool_seed={self.pool_seed}, "
                f"pretrain={asdict(self.pretrain_config)!r}).export_base()\""
            ),
        }
        save_checkpoint(path, state, meta)
        return path


def _build_entry(zoo: Zoo, kind: str, task: str | None) -> str:
    """One job of :func:`build_zoos`: the entry built into (or found in) the cache; its path."""
    zoo._get(kind, task)
    return str(zoo.path(kind, task))


def build_zoos(zoos: Sequence[Zoo], *, executor: str | Executor | None = None, progress: bool | None = None,
               mtl: bool | None = None) -> list[Zoo]:
    """:meth:`Zoo.build` for several zoos (e.g. seeds) with their experts (and MTL models) as the jobs of
    ``executor`` (:mod:`acetools.executor`; docs/performance.md §Executors): the bases and heads first, here,
    then every expert of every zoo, one job each, written to the shared cache; each zoo then loads them. An
    entry already in the cache is not built again (a stopped build resumes, under either executor)."""
    ex = as_executor(executor)
    if ex.kind == "serial":
        return [z.build(progress, mtl=mtl) for z in zoos]
    jobs: dict[str, tuple] = {}
    for z in zoos:
        steps = z._steps(mtl)
        for kind, task in steps:
            if kind in ("base", "head"):
                z._get(kind, task)
        todo = [(k, t) for k, t in z.missing(mtl=mtl) if k not in ("base", "head")]
        jobs |= {f"seed {z.seed} {k}{' ' + t if t else ''}": (z.unbuilt(), k, t) for k, t in todo}
    ex.map(_build_entry, jobs, desc="zoo entries", progress_bar=progress)
    return [z.build(progress, mtl=mtl) for z in zoos]
