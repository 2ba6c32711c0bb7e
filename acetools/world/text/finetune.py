"""Fine-tuning and evaluation on text tasks (docs/text-world.md §Recipe): the transformer layers'
matrices (:func:`acetools.world.text.model.merged_keys`) trained with AdamW through a frozen zero-shot
head (default) or a trained linear head, optionally under bfloat16 autocast; evaluation is deterministic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InputError
from ...utils import progress, seed_everything
from .model import PARAM_SETS, TextEncoder, merged_keys
from .tasks import TextData

__all__ = ["PROTOCOLS", "protocol_tag", "TextFinetuneConfig", "finetune_text", "text_correctness", "encode_batches"]


@dataclass(frozen=True)
class TextFinetuneConfig:
    """The recipe of one text expert (docs/text-world.md §Recipe)."""

    epochs: float = 3.0
    lr: float = 1e-4
    head_lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.1
    batch_size: int = 32
    max_length: int = 48
    bf16: bool = True
    #: "trained": a linear head per task trained with the encoder (the GLUE protocol);
    #: "zeroshot": a frozen head from the base's embeddings of the class names (the CLIP protocol)
    heads: str = "zeroshot"
    #: what is fine-tuned and merged (:func:`acetools.world.text.model.merged_keys`):
    #: "matrices" (the papers' RoBERTa set) or "layers" (biases and LayerNorms too)
    params: str = "matrices"

    def __post_init__(self):
        if self.heads not in ("trained", "zeroshot"):
            raise InputError(f"heads={self.heads!r}: choose 'trained' or 'zeroshot'")
        if self.params not in PARAM_SETS:
            raise InputError(f"params={self.params!r}: choose one of {PARAM_SETS}")
        for name in ("epochs", "lr", "batch_size", "max_length"):
            if not getattr(self, name) > 0:
                raise InputError(f"{name}={getattr(self, name)!r} must be positive")

    def to_dict(self) -> dict:
        """The recipe as a dict (part of each expert's cache key). Options added after the
        text world's version 2 appear only when set away from their default, so that the
        experts cached before them keep their keys."""
        d = asdict(self)
        for name, default in _LATER_OPTIONS.items():
            if d[name] == default:
                del d[name]
        return d


#: The two head protocols as recipe overrides (docs/text-world.md §Head protocols). The trained
#: heads' world trains in float32: on a CPU without bfloat16 units (AVX2 only) autocast falls back
#: to a generic GEMM, 10x slower (55 against 5.6 training sequences per second, one thread, one
#: AMD EPYC), and float32 gives every machine the same arithmetic.
PROTOCOLS: dict[str, dict[str, Any]] = {"zeroshot": {"heads": "zeroshot"},
                                        "trained": {"heads": "trained", "bf16": False}}


def protocol_tag(suite: str, heads: str) -> str:
    """A suite's name in the file names of a head protocol's results: ``"text8"`` with the zero-shot
    heads, ``"text8_trained"`` with trained ones (docs/text-world.md §Head protocols)."""
    if heads not in PROTOCOLS:
        raise InputError(f"heads={heads!r}: choose one of {sorted(PROTOCOLS)}")
    return suite if heads == "zeroshot" else f"{suite}_{heads}"


#: Options added after TEXT_WORLD_VERSION 2, with their defaults (see ``to_dict``).
_LATER_OPTIONS = {"params": "matrices"}


def encode_batches(tok, texts: list[str], max_length: int, batch_size: int, order: list[int] | None = None):
    """Tokenised batches ``(idx, input_ids, attention_mask)`` in ``order`` (default: as given)."""
    order = list(range(len(texts))) if order is None else order
    for i in range(0, len(order), batch_size):
        idx = order[i: i + batch_size]
        b = tok([texts[j] for j in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        yield idx, b["input_ids"], b["attention_mask"]


def _autocast(enabled: bool, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def finetune_text(encoder: TextEncoder, head: nn.Linear, data: TextData, tok, cfg: TextFinetuneConfig, *,
                  seed: int = 0, device: torch.device | str = "cpu", progress_bar: bool | None = None,
                  desc: str = "fine-tune", trainable: Collection[str] | None = None) -> dict:
    """Fine-tune ``encoder``'s transformer layers (and ``head`` unless the heads are zero-shot)
    on ``data`` in place. ``trainable``: the names of ``encoder.bert``'s parameters to train at
    ``cfg.lr`` instead of :func:`merged_keys` (a LoRA's factors: :mod:`acetools.world.text.lora`).
    Returns metrics (steps, seconds, final loss, sequences per second)."""
    device = torch.device(device)
    encoder.to(device).train()
    head.to(device)
    named = dict(encoder.bert.named_parameters())
    names = set(merged_keys(named, cfg.params) if trainable is None else trainable)
    if not names <= set(named):
        raise InputError(f"trainable: {sorted(names - set(named))[0]!r} is not a parameter of the encoder")
    enc_params = []
    for n, p in named.items():
        p.requires_grad_(n in names)
        if n in names:
            enc_params.append(p)
    groups = [{"params": enc_params, "lr": cfg.lr}]
    if cfg.heads == "trained":
        head.requires_grad_(True)
        groups.append({"params": list(head.parameters()), "lr": cfg.head_lr})
    else:
        head.requires_grad_(False)
    opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    n = len(data)
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    total = max(1, round(cfg.epochs * steps_per_epoch))
    warm = max(1, round(cfg.warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total - s) / max(1, total - warm)))
    g = seed_everything(seed)  # the batches' order, and dropout (MiniLM's, drawn from the global generator)
    y_all = torch.tensor(data.y)
    def batches():
        while True:
            order = torch.randperm(n, generator=g).tolist()
            yield from encode_batches(tok, data.texts, cfg.max_length, cfg.batch_size, order)

    losses, seen, t0 = [], 0, time.perf_counter()
    stream = batches()
    for _ in progress(range(total), desc=desc, total=total, enabled=progress_bar):
        idx, ids, mask = next(stream)
        ids, mask, y = ids.to(device), mask.to(device), y_all[idx].to(device)
        with _autocast(cfg.bf16, device):
            logits = head(encoder(ids, mask))
        loss = nn.functional.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(enc_params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        seen += len(idx)
    step = total
    encoder.eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    head.requires_grad_(False)
    secs = time.perf_counter() - t0
    tail = losses[-max(1, len(losses) // 10):]
    return {"steps": step, "seconds": round(secs, 2), "final_loss": float(sum(tail) / len(tail)),
            "train_seq_per_s": round(seen / secs, 1)}


@torch.no_grad()
def text_correctness(encoder: TextEncoder, head: nn.Linear, data: TextData, tok, *, max_length: int = 48,
                     batch_size: int = 256, bf16: bool = True, device: torch.device | str = "cpu",
                     n: int | None = None) -> Tensor:
    """Per-example top-1 correctness (bool, in ``data``'s order) of ``head(encoder(text))`` on the
    first ``n`` texts of ``data``."""
    device = torch.device(device)
    encoder.to(device).eval()
    head.to(device)
    texts, y = data.texts[:n], torch.tensor(data.y[:n])
    # batches of texts of similar length pad less (the masks make the order immaterial)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    hits = torch.zeros(len(texts), dtype=torch.bool)  # (n_texts,)
    for idx, ids, mask in encode_batches(tok, texts, max_length, batch_size, order):
        with _autocast(bf16, device):
            logits = head(encoder(ids.to(device), mask.to(device)))
        hits[idx] = logits.float().argmax(-1).cpu() == y[idx]
    return hits


@torch.no_grad()
def zeroshot_head(encoder: TextEncoder, tok, prompts: list[str], *, bf16: bool = True,
                  device: torch.device | str = "cpu", scale: float = 20.0) -> nn.Linear:
    """A frozen head whose rows are the base's L2-normalised embeddings of the class prompts
    (times ``scale``, a fixed logit temperature); inputs are compared by dot product."""
    device = torch.device(device)
    encoder.to(device).eval()
    out = []
    for _, ids, mask in encode_batches(tok, prompts, 48, 256):
        with _autocast(bf16, device):
            out.append(encoder(ids.to(device), mask.to(device)).float().cpu())
    e = torch.cat(out) if out else torch.zeros(0, encoder.width)
    e = e / e.norm(dim=1, keepdim=True).clamp_min(1e-12)
    head = nn.Linear(e.shape[1], len(prompts), bias=False)
    head.weight.data.copy_(scale * e)
    return head.requires_grad_(False)


def head_from_state(state: Mapping[str, Tensor]) -> nn.Linear:
    w = state["weight"]
    head = nn.Linear(w.shape[1], w.shape[0], bias="bias" in state)
    head.load_state_dict(dict(state))
    return head.requires_grad_(False)
