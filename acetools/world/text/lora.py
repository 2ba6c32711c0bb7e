"""LoRA experts of the text world (docs/text-world.md §LoRA experts): the same tasks, base, heads and recipe as
the full fine-tunes (:mod:`acetools.world.text.world`), but each expert trains rank-``r`` LoRA factors on the
transformer layers' matrices with peft, its head as a ``modules_to_save`` module. Each is cached as a peft adapter
folder (``adapter_config.json`` + ``adapter_model.safetensors``, so ``acetools merge`` reads it too) under
``$ACETOOLS_CACHE/text/lora``, keyed like the full experts plus the LoRA's settings; its expert state is the
adapter folded exactly by :class:`acetools.files.lora.LoraCheckpoint`, ``W0 + (lora_alpha / r) B A``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from torch import Tensor, nn

from ...errors import InputError
from ...files.checkpoints import config_hash, open_checkpoint
from ...files.lora import LoraCheckpoint
from ...utils import cpu_threads, seed_everything
from ..base import StateDict
from .finetune import finetune_text, text_correctness
from .model import minilm_folder
from .world import TextWorld

__all__ = ["TextLoraConfig", "LoraFactors", "TextLoraWorld", "fold"]

#: The sidecar of a cached adapter folder (key, key fields, metrics).
SIDECAR = "acetools_expert.json"


@dataclass(frozen=True)
class TextLoraConfig:
    """A LoRA expert's own settings (docs/text-world.md §LoRA experts); the rest is the world's recipe."""

    rank: int = 8
    #: peft's ``lora_alpha``: the update is ``(alpha / rank) B A``
    alpha: int = 16
    #: the factors' learning rate (a LoRA trains few parameters from a zero update: a larger step than a full
    #: fine-tune's; the head keeps the recipe's ``head_lr``)
    lr: float = 1e-3
    #: the Linear layers adapted (peft's target_modules): every matrix the full fine-tunes train
    targets: Sequence[str] = ("query", "key", "value", "dense")

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))  # a list from JSON or a notebook
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise InputError(f"rank={self.rank!r}: a LoRA rank is an integer >= 1 (8 or 16 here)")
        for name in ("alpha", "lr"):
            if not getattr(self, name) > 0:
                raise InputError(f"{name}={getattr(self, name)!r} must be positive")

    def to_dict(self) -> dict:
        return {**asdict(self), "targets": list(self.targets)}


class LoraFactors(NamedTuple):
    """One adapted matrix of an expert: ``ΔW_t = scale · B A`` (B: d_out × r, A: r × d_in, scale = alpha / r)."""

    B: Tensor
    A: Tensor
    scale: float


class _Classifier(nn.Module):
    """The model an adapter belongs to: the BERT as ``bert`` and the task's head as ``classifier`` (so its keys are
    ``bert.encoder.*`` and ``classifier.*``, the layout of a task model on the base's backbone)."""

    def __init__(self, bert: nn.Module, head: nn.Linear):
        super().__init__()
        self.bert, self.classifier = bert, head
        self.__dict__["name_or_path"] = str(minilm_folder())  # peft's base_model_name_or_path


class TextLoraWorld(TextWorld):
    """The text world with LoRA experts: :class:`TextWorld`'s arguments, plus ``lora`` (a :class:`TextLoraConfig`
    or a dict of overrides). ``expert_state`` is the folded adapter's merged part, ``head`` the adapter's head;
    :meth:`factors` gives the adapter's factors per matrix key and :meth:`adapter_folder` the peft folder."""

    def __init__(self, suite: str | Sequence[str] = "text8", seed: int = 0, *,
                 lora: TextLoraConfig | Mapping[str, Any] | None = None, **world: Any):
        super().__init__(suite, seed, **world)
        if isinstance(lora, Mapping):
            lora = TextLoraConfig(**lora)
        self.lora = lora or TextLoraConfig()
        self._adapters: dict[str, LoraCheckpoint] = {}
        self._base_ck = None

    def describe(self) -> str:
        return (super().describe().replace("text world", "text world (LoRA experts)", 1)
                + f", LoRA rank {self.lora.rank}, alpha {self.lora.alpha}")

    def __repr__(self) -> str:
        return f"TextLoraWorld({self.name!r}, seed={self.seed}, profile={self.profile!r}, rank={self.lora.rank})"

    # ----------------------------------------------------------------- the cache
    def _lora_entry(self, task: str) -> tuple[Path, str, dict]:
        """``task``'s adapter folder, its cache key and the key's fields (the full expert's and the LoRA's)."""
        *_, fields = self._expert_entry(task)
        fields = {**fields, "lora": self.lora.to_dict()}
        key = config_hash(fields)
        return self.root / "lora" / f"{task}-seed{self.seed}-{key[:16]}", key, fields

    def adapter_folder(self, task: str) -> Path:
        """Task ``task``'s peft adapter folder (trained and cached on first use)."""
        self.expert_state(task)
        return self._adapters[task].folder

    def expert_state(self, task: str) -> StateDict:
        """Task ``task``'s folded LoRA expert: the merged part with ``W0 + (alpha / r) B A`` on every adapted matrix."""
        self._check_task(task)
        if task in self._experts:
            return self._experts[task]
        folder, key, fields = self._lora_entry(task)
        side = _read_sidecar(folder, key)
        if side is None:
            side = self._train(task, folder, key, fields)
            self.built.append(task)
        else:
            self.loaded.append(task)
        if self._base_ck is None:
            self._base_ck = open_checkpoint(minilm_folder())
        ck = self._adapters[task] = LoraCheckpoint(folder, self._base_ck)
        own = set(self.base_state())
        self._experts[task] = {ck.rename[k]: ck.get(k) for k in ck.targets if ck.rename[k] in own}
        head = {k.split(".", 1)[1]: ck.get(k) for k in ck.saved if k.startswith("classifier.")}
        self._heads[task] = nn.Linear(head["weight"].shape[1], head["weight"].shape[0], bias="bias" in head)
        self._heads[task].load_state_dict(head)
        self._heads[task].requires_grad_(False)
        self._sides[task] = side
        return self._experts[task]

    def factors(self, task: str) -> dict[str, LoraFactors]:
        """``{merged-part key: (B, A, scale)}``: the adapter's raw factors, as peft stored them (float32)."""
        self.expert_state(task)
        ck = self._adapters[task]
        return {ck.rename[k]: LoraFactors(ck.factor(t.b).float(), ck.factor(t.a).float(), t.scale)
                for k, t in ck.targets.items()}

    def _train(self, task: str, folder: Path, key: str, fields: dict) -> dict:
        from peft import LoraConfig, get_peft_model

        t0 = time.perf_counter()
        enc = self._fresh_encoder()
        head = self._head_for_base(task, enc)
        model = _Classifier(enc.bert, head)
        cfg = LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha, lora_dropout=0.0,
                         target_modules=list(self.lora.targets), modules_to_save=["classifier"])
        seed_everything(self._task_seed(task))  # peft draws A (Kaiming uniform) from the global generator
        peft_model = get_peft_model(model, cfg)
        names = [n for n, _ in enc.bert.named_parameters() if ".lora_" in n]
        recipe = self.config.__class__(**{**asdict(self.config), "lr": self.lora.lr})
        with cpu_threads(self.threads, env_default=False):
            metrics = finetune_text(enc, model.classifier, self.split(task, "train"), self.tokenizer, recipe,
                                    seed=self._task_seed(task), device=self.device, trainable=names,
                                    desc=f"LoRA expert {task}")
            hits = text_correctness(enc, model.classifier, self.split(task, "val"), self.tokenizer,
                                    max_length=self.config.max_length, bf16=self.config.bf16, device=self.device)
        metrics["val_acc"] = int(hits.sum()) / max(1, len(hits))
        metrics["trainable_parameters"] = sum(p.numel() for n, p in enc.bert.named_parameters() if n in set(names))
        side = {"kind": "text_lora_expert", "task": task, "key": key, "key_fields": fields, "metrics": metrics,
                "seconds": round(time.perf_counter() - t0, 2)}
        peft_model.to("cpu")
        _save_adapter(peft_model, folder, side)
        return side


def _read_sidecar(folder: Path, key: str) -> dict | None:
    """The cached adapter's sidecar when ``folder`` holds an adapter saved under ``key`` (else None: build it)."""
    try:
        side = json.loads((folder / SIDECAR).read_text())
    except (OSError, ValueError):
        return None
    ok = side.get("key") == key and (folder / "adapter_model.safetensors").is_file()
    return side if ok else None


def _save_adapter(peft_model: Any, folder: Path, side: dict) -> None:
    """peft's ``save_pretrained`` into a temporary folder beside ``folder``, the sidecar last, then renamed into
    place: a cache entry is whole or absent."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        peft_model.save_pretrained(str(tmp))
        (tmp / SIDECAR).write_text(json.dumps(side, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fold(W0: Tensor, f: LoraFactors) -> Tensor:
    """``W0 + scale · B A`` (peft's ``merge_and_unload`` of one Linear; docs/methods.md §Low-rank updates, (LR.1))."""
    return W0 + f.scale * (f.B.to(W0.dtype) @ f.A.to(W0.dtype))

