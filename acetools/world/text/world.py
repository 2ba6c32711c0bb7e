"""The text world: all-MiniLM-L6-v2 experts on real offline text tasks, built once and cached under
``$ACETOOLS_CACHE/text`` (task splits as JSON keyed by their spec and sources' versions; experts as
safetensors keyed by the base's and data's hashes, the recipe and the seed; a build resumes expert by
expert). ``profile="quick"`` is the fixture world: MiniLM's first layer, three small tasks
(docs/text-world.md).
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...errors import InputError
from ...files.checkpoints import config_hash, save_checkpoint, state_hash
from ...utils import atomic_write, cpu_threads, make_generator, progress, resolve_device
from ..base import StateDict, WorldBase, cache_dir, cached_checkpoint, config_from
from .finetune import (
    TextFinetuneConfig,
    finetune_text,
    head_from_state,
    text_correctness,
    zeroshot_head,
)
from .model import TextEncoder, load_tokenizer, merged_keys
from .tasks import SUITES, TASKS, TextData, TextTask, build_task, task_provenance

__all__ = ["TextWorld", "FIXTURE_TASKS", "build_experts"]

log = logging.getLogger(__name__)
#: Part of every cache key: bump it when the data splits or the expert recipe change meaning.
TEXT_WORLD_VERSION = 2

#: The quick profile's tasks: three small ones from the same sources.
FIXTURE_TASKS: dict[str, TextTask] = {t.name: t for t in (
    replace(TASKS["word_language"], name="fx_language", classes=("english", "german", "french", "spanish", "italian"),
            n_train=24, n_val=8, n_test=12),
    replace(TASKS["emoji_group"], name="fx_emoji", classes=TASKS["emoji_group"].classes[:5], n_train=24, n_val=8,
            n_test=12),
    replace(TASKS["wordnet_noun"], name="fx_noun", classes=TASKS["wordnet_noun"].classes[:5], n_train=24, n_val=8,
            n_test=12),
)}
#: The fixture's recipe trains and evaluates in float32: bf16 autocast on a CPU without bf16 units
#: (AVX2 only, as CI's) is 3-10x slower (docs/text-world.md §Recipe).
FIXTURE_FINETUNE = TextFinetuneConfig(epochs=4, lr=2e-4, head_lr=3e-3, batch_size=16, max_length=24, bf16=False)
#: The fixture's model: MiniLM's first layer (width 384, 1.8 M merged parameters).
FIXTURE_LAYERS = 1


class TextWorld(WorldBase):
    """Base, heads and experts of one text suite at one expert seed.

    Parameters
    ----------
    suite: a name in :data:`acetools.world.text.tasks.SUITES` (``"text8"``, ``"text12"``; ``"fixture"`` with
        ``profile="quick"``), or a list of task names.
    seed: the experts' fine-tuning seed.
    profile: ``"full"`` (MiniLM from its wheel) or ``"quick"`` (the fixture world).
    finetune: a :class:`TextFinetuneConfig` or a dict of overrides of the default recipe.
    root: cache folder (:func:`acetools.world.base.cache_dir`).
    device: ``"cpu"``, ``"cuda"`` or ``"auto"``; threads: CPU threads while building and
        evaluating (None: torch's default for the full world, 1 for the fixture).
    """

    kind = "text"
    layout = "bert"
    #: every linear layer of the transformer layers (BERT's query/key/value and dense weights)
    matrix_pattern = r"\.(query|key|value|dense)\.weight$"

    def __init__(self, suite: str | Sequence[str] = "text8", seed: int = 0, *, profile: str = "full",
                 finetune: TextFinetuneConfig | Mapping[str, Any] | None = None,
                 root: str | os.PathLike | None = None, device: str | torch.device = "cpu",
                 threads: int | None = None):
        if profile not in ("full", "quick"):
            raise InputError(f"profile={profile!r}: choose 'full' or 'quick'")
        self.profile = profile
        self._spec = {"suite": suite if isinstance(suite, str) else list(suite), "seed": seed, "profile": profile,
                      "root": None if root is None else str(root), "device": str(device), "threads": threads}
        catalogue = FIXTURE_TASKS if profile == "quick" else TASKS
        if isinstance(suite, str):
            suites = {"fixture": tuple(FIXTURE_TASKS)} if profile == "quick" else SUITES
            if suite not in suites:
                raise InputError(f"unknown text suite {suite!r} for profile {profile!r}; valid: {sorted(suites)}")
            self.suite: str | None = suite
            names = list(suites[suite])
        else:
            self.suite, names = None, list(suite)
        unknown = [t for t in names if t not in catalogue]
        if unknown or not names or len(set(names)) != len(names):
            raise InputError(f"tasks must be distinct names from {sorted(catalogue)}; got {names}")
        self.tasks: list[str] = names
        self.task_specs = {t: catalogue[t] for t in names}
        self.seed = int(seed)
        self.config = config_from(FIXTURE_FINETUNE if profile == "quick" else TextFinetuneConfig(), finetune)
        self.root = cache_dir("text", root)
        self.device = resolve_device(device)
        # the fixture's tiny batches run fastest on one thread (OpenMP's spinning workers cost
        # 15x on a busy 2-core machine, measured); the full world uses torch's default
        self.threads = threads if threads is not None or profile == "full" else 1
        self.size = "minilm" if profile == "full" else f"minilm-{FIXTURE_LAYERS}layer"
        self.built: list[str] = []
        self.loaded: list[str] = []
        self._data: dict[str, dict[str, TextData]] = {}
        self._experts: dict[str, StateDict] = {}
        self._heads: dict[str, nn.Linear] = {}
        self._sides: dict[str, dict] = {}
        self._base: StateDict | None = None
        self._encoder: TextEncoder | None = None

    # ----------------------------------------------------------------- identity
    @property
    def name(self) -> str:
        return self.suite or "text"

    def describe(self) -> str:
        what = ("all-MiniLM-L6-v2 (22.7 M parameters)" if self.profile == "full"
                else f"MiniLM's first {FIXTURE_LAYERS} layer (fixture)")
        return (f"text world {self.name!r}: {len(self.tasks)} tasks on {what}, expert seed {self.seed}, "
                f"heads {self.config.heads}")

    def __repr__(self) -> str:
        return f"TextWorld({self.name!r}, seed={self.seed}, profile={self.profile!r})"

    # ----------------------------------------------------------------- model and data
    @property
    def tokenizer(self):
        return load_tokenizer()  # loaded once (lru_cache)

    def _fresh_encoder(self) -> TextEncoder:
        return TextEncoder.minilm(None if self.profile == "full" else FIXTURE_LAYERS)

    def full_base(self) -> StateDict:
        """Every parameter of the base BERT (embeddings included)."""
        if self._base is None:
            self._base = self._fresh_encoder().state()
        return self._base

    def base_state(self) -> StateDict:
        """W0 of the merged part (the transformer layers)."""
        full = self.full_base()
        return {k: full[k] for k in merged_keys(full, self.config.params)}

    def base_hash(self) -> str:
        return state_hash(self.full_base())

    def split(self, task: str, split: str = "train") -> TextData:
        """A task's split (cached as JSON keyed by its spec and its sources' versions)."""
        self._check_task(task, split)
        if task not in self._data:
            self._data[task] = self._load_task(self.task_specs[task])
        return self._data[task][split]

    def _load_task(self, spec: TextTask) -> dict[str, TextData]:
        key_fields = {"spec": spec.spec(), "provenance": task_provenance(spec), "version": TEXT_WORLD_VERSION}
        key = config_hash(key_fields)
        path = self.root / "data" / f"{spec.name}-{key[:16]}.json"
        if path.is_file():
            try:
                raw = json.loads(path.read_text())
                return {s: TextData(spec.name, s, d["texts"], d["y"], tuple(raw["classes"]), d["hash"])
                        for s, d in raw["splits"].items()}
            except (OSError, ValueError, KeyError) as err:
                log.warning("rebuilding the unreadable task cache %s (%s)", path, err)
        data = build_task(spec)
        payload = {"key": key, "key_fields": key_fields, "classes": list(spec.classes),
                   "splits": {s: {"texts": d.texts, "y": d.y, "hash": d.hash} for s, d in data.items()}}
        with atomic_write(path, "w") as fh:
            json.dump(payload, fh, ensure_ascii=False)
        return data

    # ----------------------------------------------------------------- experts
    def _expert_entry(self, task: str) -> tuple[Path, str, tuple[StateDict, dict] | None, dict]:
        """``task``'s expert file, cache key, cached ``(state, sidecar)`` or None, and the key's fields."""
        data = {s: self.split(task, s).hash for s in ("train", "val", "test")}
        fields = {"task": task, "base": self.base_hash(), "data": data, "recipe": self.config.to_dict(),
                  "seed": self.seed, "version": TEXT_WORLD_VERSION}
        return *cached_checkpoint(self.root / "experts" / f"{task}-seed{self.seed}", fields), fields

    def _head_for_base(self, task: str, encoder: TextEncoder) -> nn.Linear:
        spec = self.task_specs[task]
        if self.config.heads == "zeroshot":
            return zeroshot_head(encoder, self.tokenizer, list(spec.class_prompts), bf16=self.config.bf16,
                                 device=self.device)
        torch.manual_seed(self._task_seed(task))
        return nn.Linear(encoder.width, len(spec.classes))

    def _task_seed(self, task: str) -> int:
        """The seed of ``task``'s expert: the world's seed and the task's name (not its position)."""
        return self.seed * 100003 + zlib.crc32(task.encode()) % 100003

    def expert_state(self, task: str) -> StateDict:
        """Task ``task``'s fine-tuned merged part (built and cached on first use)."""
        self._check_task(task)
        if task in self._experts:
            return self._experts[task]
        path, key, cached, fields = self._expert_entry(task)
        if cached is not None:
            return self._keep(task, *cached, built=False)
        t0 = time.perf_counter()
        enc = self._fresh_encoder()
        head = self._head_for_base(task, enc)
        with cpu_threads(self.threads, env_default=False):  # (ACETOOLS_NUM_THREADS is not read)
            metrics = finetune_text(enc, head, self.split(task, "train"), self.tokenizer, self.config,
                                    seed=self._task_seed(task),
                                    device=self.device, desc=f"expert {task}")
            hits = text_correctness(enc, head, self.split(task, "val"), self.tokenizer,
                                    max_length=self.config.max_length, bf16=self.config.bf16, device=self.device)
            metrics["val_acc"] = int(hits.sum()) / max(1, len(hits))
        full = enc.state()
        state = {k: full[k] for k in merged_keys(full, self.config.params)}
        state.update({f"head.{k}": v.detach().clone() for k, v in head.state_dict().items()})
        meta = {"kind": "text_expert", "task": task, "key": key, "key_fields": fields, "metrics": metrics,
                "seconds": round(time.perf_counter() - t0, 2)}
        side = save_checkpoint(path, state, meta)
        return self._keep(task, state, side, built=True)

    def _keep(self, task: str, state: StateDict, side: dict, *, built: bool) -> StateDict:
        (self.built if built else self.loaded).append(task)
        self._heads[task] = head_from_state({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        self._experts[task] = {k: v for k, v in state.items() if not k.startswith("head.")}
        self._sides[task] = side
        return self._experts[task]

    def head(self, task: str) -> nn.Linear:
        """Task ``task``'s head: the expert's trained head, or the frozen zero-shot one."""
        if task not in self._heads:
            self.expert_state(task)
        return self._heads[task]

    def build(self, progress_bar: bool | None = None) -> TextWorld:
        """Build (or load) every expert; resumable: finished experts are cached one by one."""
        for t in progress(self.tasks, desc=f"{self.name} experts (seed {self.seed})", enabled=progress_bar):
            self.expert_state(t)
        return self

    def records(self) -> list[dict]:
        """The sidecars of the experts loaded or built so far (hashes, recipe, metrics)."""
        return [self._sides[t] for t in self.tasks if t in self._sides]

    # ----------------------------------------------------------------- evaluation
    def encoder(self, state: Mapping[str, Tensor] | None = None) -> TextEncoder:
        """The base encoder with ``state`` (a merged part) loaded; one instance, reused."""
        if self._encoder is None:
            self._encoder = self._fresh_encoder().to(self.device)
            self._encoder.requires_grad_(False)
        self._encoder.load({**self.base_state(), **(state or {})})
        return self._encoder

    def correctness(self, state: Mapping[str, Tensor], split: str = "test", n: int | None = None,
                    tasks: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Per-example correctness per task (:class:`~acetools.world.base.PerExample`)."""
        enc = self.encoder(state)
        with cpu_threads(self.threads, env_default=False):
            return {t: text_correctness(enc, self.head(t), self.split(t, split), self.tokenizer,
                                        max_length=self.config.max_length, bf16=self.config.bf16,
                                        device=self.device, n=n).numpy() for t in tasks or self.tasks}

    # ----------------------------------------------------------------- data inputs of ESM and RegMean
    @property
    def base_label(self) -> str:
        return "base (zero-shot heads)" if self.config.heads == "zeroshot" else "base (experts' heads)"

    def gram_examples(self, task: str, n: int) -> list[str]:
        """RegMean's ``n`` training texts of ``task`` (the first ``n``: the split is shuffled)."""
        return self.split(task, "train").texts[:n]

    def proxy_inputs(self, task: str, n: int, seed: int = 0) -> list[str]:
        """``n`` validation texts of ``task`` drawn without replacement (ESM's proxies)."""
        d = self.split(task, "val")
        idx = torch.randperm(len(d), generator=make_generator(seed))[:n].tolist()
        return [d.texts[i] for i in idx]

    def _batches(self, texts: list[str]):
        """One text per batch: no padding rows enter the captured activations."""
        for t in texts:
            b = self.tokenizer([t], truncation=True, max_length=self.config.max_length, return_tensors="pt")
            yield {"input_ids": b["input_ids"].to(self.device), "attention_mask": b["attention_mask"].to(self.device)}

    def _capture(self, fn: Any, state: Mapping[str, Tensor], texts: list[str], keys: Sequence[str],
                 **options: Any) -> dict[str, Tensor]:
        """``fn`` over the BERT with ``state`` (rows: the tokens of ``texts``), on the world's threads."""
        enc = self.encoder(state)
        with cpu_threads(self.threads, env_default=False):  # (ACETOOLS_NUM_THREADS is not read)
            return fn(enc.bert, self._batches(texts), list(keys), **options)


def _build_expert(spec: Mapping[str, Any], task: str) -> bool:
    """One job of :func:`build_experts`: ``task``'s expert of the world ``spec`` describes, built into (or found
    in) the shared cache; whether this job built it."""
    world = TextWorld(**spec)
    world.expert_state(task)
    return task in world.built


def build_experts(worlds: Sequence[TextWorld], *, executor: Any = None, progress: bool | None = None
                  ) -> dict[str, bool]:
    """Every expert of ``worlds`` (e.g. one per seed) built into their cache, one job per expert on ``executor``
    (:mod:`acetools.executor`: ``"serial"``, ``"ray"`` or an :class:`~acetools.executor.Executor`; docs/performance.md
    §Executors); an expert already cached is loaded, not built again, so a stopped build resumes under either
    executor. The jobs read the task data and the base from the cache folder, as each world would: on a cluster,
    a folder every node reads. Returns ``{"seed S task": built by its job}``."""
    from ...executor import as_executor

    other = [type(w).__name__ for w in worlds if type(w) is not TextWorld]
    if other:
        raise InputError(f"build_experts builds TextWorld experts; got {other[0]}: build it with its own expert_state")
    jobs = {f"seed {w.seed} {t}": ({**w._spec, "finetune": w.config}, t) for w in worlds for t in w.tasks}
    return as_executor(executor).map(_build_expert, jobs, desc="text experts", progress_bar=progress)
