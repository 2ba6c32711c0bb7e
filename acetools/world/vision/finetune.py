"""Training loops of the mini-world: base pretraining (:func:`pretrain_base`), expert fine-tuning
(:func:`finetune_expert`), the MTL reference (:func:`train_multitask`) and top-1 evaluation, each
deterministic given the seed and the thread count (docs/vision-world.md §Training). Data have ``x``
(uint8 ``[N, 3, H, W]``) and ``y`` (int64 ``[N]``); the pool ``labels`` per head (``-1``: not applicable)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import InputError
from ...utils import atomic_write, cpu_threads, make_generator, resolve_device, seed_everything, strip_ansi
from ...utils import progress as _progress
from .models import ClassificationHead, Classifier, ImageEncoder, build_encoder, load_encoder

__all__ = ["PretrainConfig", "FinetuneConfig", "pretrain_base", "finetune_expert", "train_multitask", "correctness",
           "evaluate", "augment_batch", "warmup_cosine", "num_threads", "key_config", "KEY_OPTIONAL"]

StateDict = dict[str, Tensor]


@dataclass(frozen=True)
class PretrainConfig:
    """Hyperparameters of :func:`pretrain_base` (all go into the recipe and the zoo key).

    ``steps`` overrides ``epochs`` when given. ``head_type``: ``"linear"`` or ``"cosine"``
    (normalised features and class weights times ``logit_scale``). Weight decay skips 1-D
    parameters and the class/positional embeddings (open_clip's convention).
    """

    epochs: int = 10
    steps: int | None = None
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int | float = 0.05
    grad_clip: float | None = 1.0
    head_type: str = "linear"
    logit_scale: float = 30.0
    augment: bool = False
    hflip: bool = False
    precision: str = "fp32"


@dataclass(frozen=True)
class FinetuneConfig:
    """Hyperparameters of :func:`finetune_expert` and :func:`train_multitask` (docs/vision-world.md §Training).

    ``warmup_steps``: an int is a step count, a float in [0, 1) a fraction of all steps. Weight
    decay applies to every encoder parameter, as in the papers' code; no label smoothing.
    ``augment`` / ``hflip``: random 4-px crop / horizontal flip; ``precision``: ``"fp32"`` or ``"bf16"``.
    """

    lr: float = 4e-4
    epochs: int = 3
    batch_size: int = 64
    weight_decay: float = 0.1
    warmup_steps: int | float = 0.1
    grad_clip: float | None = None
    augment: bool = False
    hflip: bool = False
    precision: str = "fp32"


#: Config fields added after the first caches were built, left out of cache keys at this default.
KEY_OPTIONAL: dict[str, Any] = {"precision": "fp32"}
PRECISIONS = ("fp32", "bf16")


def key_config(cfg: PretrainConfig | FinetuneConfig) -> dict[str, Any]:
    """``asdict(cfg)`` without the :data:`KEY_OPTIONAL` fields that are at their default."""
    d = asdict(cfg)
    return {k: v for k, v in d.items() if not (k in KEY_OPTIONAL and v == KEY_OPTIONAL[k])}


def _autocast(precision: str, device: torch.device):
    """The autocast context of a config's ``precision`` (a no-op for ``"fp32"``)."""
    if precision not in PRECISIONS:
        raise InputError(f"precision={precision!r} must be one of {PRECISIONS}")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def num_threads(n: int | None = None) -> AbstractContextManager[int]:
    """:func:`acetools.utils.cpu_threads` with ``env_default=True`` (``n=None`` reads ``ACETOOLS_NUM_THREADS``)."""
    return cpu_threads(n, env_default=True)


def warmup_cosine(total_steps: int, warmup_steps: int | float) -> Callable[[int], float]:
    """LR multiplier: linear warm-up from 0 to 1 over ``warmup_steps`` (an int, or a
    fraction of ``total_steps``), then cosine decay to 0 at ``total_steps``."""
    w = int(round(warmup_steps * total_steps)) if isinstance(warmup_steps, float) else int(warmup_steps)
    w = max(0, min(w, total_steps))

    def factor(step: int) -> float:
        if step < w:
            return (step + 1) / w
        progress = (step - w) / max(1, total_steps - w)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def augment_batch(x: Tensor, generator: torch.Generator, *, crop: bool = True, hflip: bool = False,
                  pad: int = 4) -> Tensor:
    """Random crop with ``pad``-pixel zero padding and/or random horizontal flip per image of ``[B, C, H, W]``."""
    b, c, h, w = x.shape
    if crop and pad > 0:
        padded = F.pad(x, (pad, pad, pad, pad))
        oy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
        ox = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
        rows = (oy[:, None] + torch.arange(h))[:, None, :, None]
        cols = (ox[:, None] + torch.arange(w))[:, None, None, :]
        x = padded[torch.arange(b)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]
    if hflip:
        flip = torch.rand(b, generator=generator) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    return x


def _state(module: nn.Module) -> StateDict:
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in module.state_dict().items()}


def _make_encoder(size: str | Callable[[], ImageEncoder], state: Mapping[str, Tensor] | None) -> ImageEncoder:
    if callable(size):
        enc = size()
        if state is not None:
            enc.load_state_dict(dict(state))
        return enc
    return build_encoder(size) if state is None else load_encoder(state, size)


def _n_steps(n: int, batch_size: int, epochs: int) -> tuple[int, int]:
    per_epoch = max(1, math.ceil(n / batch_size))
    return per_epoch, per_epoch * epochs


def _batches(n: int, batch_size: int, total_steps: int, g: torch.Generator, start: int = 0):
    """Yield index batches: a fresh permutation each epoch (last batch may be short).

    ``start`` (a multiple of the steps per epoch) skips the first ``start`` steps; the caller
    restores ``g`` to its state at that epoch boundary (resuming)."""
    step = start
    while step < total_steps:
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, batch_size):
            if step >= total_steps:
                return
            yield perm[i : i + batch_size]
            step += 1


def _size_name(size: str | Callable[[], ImageEncoder]) -> str:
    return size if isinstance(size, str) else getattr(size, "__name__", "custom")


def _fingerprint(cfg, seed, size, n, head_classes, labels, x) -> str:
    """What a resume checkpoint must match: config, seed, size, pool shape, heads, label sums."""
    doc = {"config": asdict(cfg), "seed": seed, "size": _size_name(size), "n": n, "head_classes": head_classes,
           "labels": {k: int(v.sum()) for k, v in labels.items()}, "x": [int(x[:64].sum()), int(x[-64:].sum())]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _save_resume(path, fingerprint, step, enc, heads, opt, sched, g, window, seconds) -> None:
    """Write a resume checkpoint without pickle (docs/style.md §7): one safetensors file whose tensors are
    the encoder, the heads, the optimizer's per-parameter state and the generator state, and whose
    ``__metadata__["acetools.resume"]`` is JSON (step, fingerprint, scheduler, optimizer hyperparameters,
    loss window). Atomic (:func:`acetools.utils.atomic_write`)."""
    from safetensors.torch import save

    tensors = {f"encoder/{k}": v for k, v in enc.state_dict().items()}
    tensors |= {f"heads/{k}": v for k, v in heads.state_dict().items()}
    osd = opt.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for pid, st in osd["state"].items():
        for name, v in st.items():
            if isinstance(v, Tensor):
                tensors[f"optimizer/{pid}/{name}"] = v
            else:
                scalars.setdefault(str(pid), {})[name] = v
    tensors["generator"] = g.get_state()
    doc = {"format": 1, "fingerprint": fingerprint, "step": int(step), "seconds": float(seconds),
           "window": [[float(loss), {k: list(h) for k, h in hits.items()}] for loss, hits in window],
           "scheduler": sched.state_dict(), "optimizer_groups": osd["param_groups"], "optimizer_scalars": scalars}
    blob = save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
                metadata={"acetools.resume": json.dumps(doc)})
    with atomic_write(path, "wb") as fh:
        fh.write(blob)


def _resume(path, fingerprint, enc, heads, opt, sched, g):
    """Load a :func:`_save_resume` file (never unpickled) into the training objects:
    ``(start_step, seconds, window)``."""
    if path is None or not os.path.exists(path):
        return 0, 0.0, []
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            doc = json.loads((f.metadata() or {})["acetools.resume"])
    except Exception as err:  # a truncated file cannot happen (atomic writes) but a foreign one can
        first = strip_ansi((str(err).splitlines() or [""])[0])
        raise RuntimeError(f"resume checkpoint {path} is unreadable ({type(err).__name__}: {first}); "
                           "delete it to start over") from None
    if doc.get("fingerprint") != fingerprint:
        raise RuntimeError(f"resume checkpoint {path} belongs to another pool/config/seed; delete it to start over")

    def part(prefix: str) -> dict[str, Tensor]:
        return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}

    enc.load_state_dict(part("encoder/"))
    heads.load_state_dict(part("heads/"))
    state: dict[int, dict[str, Any]] = {}
    for k, v in part("optimizer/").items():
        pid, name = k.split("/", 1)
        state.setdefault(int(pid), {})[name] = v
    for pid, st in doc.get("optimizer_scalars", {}).items():
        state.setdefault(int(pid), {}).update(st)
    opt.load_state_dict({"state": state, "param_groups": doc["optimizer_groups"]})
    sched.load_state_dict(doc["scheduler"])
    g.set_state(tensors["generator"])
    win = [(float(loss), {k: tuple(h) for k, h in hits.items()}) for loss, hits in doc["window"]]
    return int(doc["step"]), float(doc["seconds"]), win


def _train(enc: nn.Module, heads: nn.Module, decay: list, no_decay: list, cfg, loss_of, g: torch.Generator, *,
           n: int, total: int, per_epoch: int, desc: str, progress: bool | None, checkpoint=None,
           fingerprint: str = "") -> tuple[list[tuple[float, dict[str, tuple[int, int]]]], float]:
    """The one training loop: AdamW (no weight decay on ``no_decay``) with the warm-up-cosine schedule over
    ``total`` steps of index batches from :func:`_batches` (drawn from ``g``), one step per batch on
    ``loss_of(idx) -> (loss, hits per head) | None`` (None: no step), gradients of ``enc`` clipped to
    ``cfg.grad_clip``. With a ``checkpoint`` file it resumes from it, rewrites it every epoch and deletes it
    at the end. Returns the last ``per_epoch`` steps' ``(loss, hits)`` and the seconds trained."""
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total, cfg.warmup_steps))
    enc.train()
    t0 = time.perf_counter()
    start, done_s, window = _resume(checkpoint, fingerprint, enc, heads, opt, sched, g)
    bar = _progress(_batches(n, cfg.batch_size, total, g, start=start), desc=desc, total=total - start,
                    enabled=progress)
    for step, idx in enumerate(bar, start + 1):
        got = loss_of(idx)
        if got is not None:
            opt.zero_grad(set_to_none=True)
            got[0].backward()
            if cfg.grad_clip:
                nn.utils.clip_grad_norm_(enc.parameters(), cfg.grad_clip)
            opt.step()
            window = [*window, (got[0].item(), got[1])][-per_epoch:]
        sched.step()
        if checkpoint is not None and step % per_epoch == 0 and step < total:
            _save_resume(checkpoint, fingerprint, step, enc, heads, opt, sched, g, window,
                         done_s + time.perf_counter() - t0)
    if checkpoint is not None and os.path.exists(checkpoint):
        os.remove(checkpoint)
    return window, done_s + time.perf_counter() - t0


# --------------------------------------------------------------------------- pretraining


class _PoolHeads(nn.Module):
    def __init__(self, head_classes: Mapping[str, int], dim: int, head_type: str, logit_scale: float):
        super().__init__()
        if head_type not in ("linear", "cosine"):
            raise InputError(f"head_type must be 'linear' or 'cosine', got {head_type!r}")
        self.head_type = head_type
        self.logit_scale = logit_scale
        self.heads = nn.ModuleDict(
            {name: nn.Linear(dim, n, bias=head_type == "linear") for name, n in head_classes.items()}
        )

    def forward(self, feats: Tensor) -> dict[str, Tensor]:
        if self.head_type == "cosine":
            f = F.normalize(feats, dim=-1)
            return {k: self.logit_scale * f @ F.normalize(cast(nn.Linear, h).weight, dim=-1).t()
                    for k, h in self.heads.items()}
        return {k: h(feats) for k, h in self.heads.items()}


def pretrain_base(pool, size: str = "tiny", config: PretrainConfig | None = None, *, seed: int = 0,
                  device: str | torch.device = "cpu", threads: int | None = None, progress: bool | None = None,
                  checkpoint: str | os.PathLike | None = None, **overrides: Any) -> tuple[StateDict, dict]:
    """Supervised multi-head pretraining of a fresh ``size`` encoder on ``pool``; returns the encoder's
    state (the pool heads are dropped) and the recipe.

    Loss: the mean over the heads present in a batch of each head's cross-entropy over its labelled
    images; ``config`` fields can be overridden by keyword (``steps=2000``). ``checkpoint``: a resume
    file written every epoch; a later call with the same pool, size, config and seed continues from it
    and gives the same weights as an uninterrupted run; it is deleted at the end.
    """
    cfg = replace(config or PretrainConfig(), **overrides)
    dev = resolve_device(device)
    x, labels, head_classes = _pool_tensors(pool)
    n = x.shape[0]
    per_epoch, total = _n_steps(n, cfg.batch_size, cfg.epochs)
    if cfg.steps is not None:
        total = int(cfg.steps)
    with num_threads(threads) as n_threads:
        g = seed_everything(seed)
        enc = _make_encoder(size, None).to(dev)
        heads = _PoolHeads(head_classes, enc.output_dim, cfg.head_type, cfg.logit_scale).to(dev)
        decay, no_decay = [], []
        for name, p in list(enc.named_parameters()) + list(heads.named_parameters()):
            skip = p.ndim < 2 or "positional_embedding" in name or "class_embedding" in name
            (no_decay if skip else decay).append(p)
        autocast = _autocast(cfg.precision, dev)

        def loss_of(idx):
            """The batch's loss (above) and hits per head, or None when no image of it is labelled for any head."""
            xb = x[idx]
            if cfg.augment or cfg.hflip:
                xb = augment_batch(xb, g, crop=cfg.augment, hflip=cfg.hflip)
            with autocast:
                logits = heads(enc(xb.to(dev)))
            losses, hits = [], {}
            for k, lg in logits.items():
                lg, y = lg.float(), labels[k][idx].to(dev)
                m = y >= 0
                if m.any():
                    losses.append(F.cross_entropy(lg[m], y[m]))
                    hits[k] = (int((lg[m].argmax(-1) == y[m]).sum()), int(m.sum()))
            return (torch.stack(losses).mean(), hits) if losses else None

        window, seconds = _train(enc, heads, decay, no_decay, cfg, loss_of, g, n=n, total=total, per_epoch=per_epoch,
                                 desc=f"pretrain {size}", progress=progress, checkpoint=checkpoint,
                                 fingerprint=_fingerprint(cfg, seed, size, n, head_classes, labels, x))
    head_acc: dict[str, tuple[int, int]] = {}
    for _, hits in window:  # the last epoch's accuracy per head
        for k, (c, m) in hits.items():
            head_acc[k] = (head_acc.get(k, (0, 0))[0] + c, head_acc.get(k, (0, 0))[1] + m)
    return _state(enc), _recipe("base", size, cfg, seed, n, total, per_epoch, seconds, n_threads,
                                sum(loss for loss, _ in window) / max(1, len(window)),
                                {k: c / max(1, m) for k, (c, m) in head_acc.items()}, head_classes=head_classes)


def _pool_tensors(pool) -> tuple[Tensor, dict[str, Tensor], dict[str, int]]:
    """``(x, labels per head, classes per head)`` of a pretraining pool, checked (errors name the head)."""
    x = torch.as_tensor(pool.x)
    labels = {k: torch.as_tensor(v, dtype=torch.long) for k, v in pool.labels.items()}
    head_classes = {k: int(v) for k, v in pool.head_classes.items()}
    if set(labels) != set(head_classes):
        raise InputError(f"pool.labels heads {sorted(labels)} differ from head_classes {sorted(head_classes)}")
    for k, lab in labels.items():
        if lab.shape[0] != x.shape[0]:
            raise InputError(f"head {k!r}: {lab.shape[0]} labels for {x.shape[0]} images")
        if lab.max() >= head_classes[k]:
            raise InputError(f"head {k!r}: label {int(lab.max())} >= head_classes {head_classes[k]}")
    return x, labels, head_classes


def _recipe(kind, size, cfg, seed, n, total, per_epoch, seconds, n_threads, loss, acc, **extra) -> dict:
    """A training recipe: config, data and schedule sizes, time and speed, the last epoch's loss and accuracy."""
    import open_clip

    return {"kind": kind, "size": _size_name(size), "config": asdict(cfg), "seed": seed, **extra, "n_images": n,
            "steps": total, "steps_per_epoch": per_epoch, "seconds": round(seconds, 2),
            "images_per_s": round(total * cfg.batch_size / max(seconds, 1e-9), 1), "threads": n_threads,
            "final_loss": loss, "final_train_acc": acc,
            "versions": {"torch": torch.__version__, "open_clip": open_clip.__version__}}


# --------------------------------------------------------------------------- fine-tuning


def finetune_expert(base_state: Mapping[str, Tensor], head: ClassificationHead, data,
                    config: FinetuneConfig | None = None, *, size: str | Callable[[], ImageEncoder] = "tiny",
                    seed: int = 0, device: str | torch.device = "cpu", threads: int | None = None,
                    progress: bool | None = None, **overrides: Any) -> tuple[StateDict, dict]:
    """Fine-tune the whole image encoder from ``base_state`` on ``data`` (``x``, ``y``) with ``head`` frozen
    (docs/methods.md §Benchmark protocol); returns the expert's state W_t and the recipe.

    ``size``: a size name or a zero-argument callable returning an :class:`ImageEncoder`; ``config``
    fields can be overridden by keyword (``lr=1e-4``); the head is never in the optimizer.
    """
    cfg = replace(config or FinetuneConfig(), **overrides)
    return _train_heads(base_state, {"task": head}, {"task": data}, cfg, size=size, seed=seed,
                        device=device, threads=threads, progress=progress,
                        desc=f"finetune {getattr(data, 'name', '') or 'task'}", kind="expert",
                        augment={"task": (cfg.augment, cfg.hflip)})


def train_multitask(base_state: Mapping[str, Tensor], heads: Mapping[str, ClassificationHead],
                    datasets: Mapping[str, Any], config: FinetuneConfig | None = None, *,
                    size: str | Callable[[], ImageEncoder] = "tiny", seed: int = 0,
                    augment: Mapping[str, bool] | None = None, hflip: Mapping[str, bool] | None = None,
                    device: str | torch.device = "cpu", threads: int | None = None, progress: bool | None = None,
                    **overrides: Any) -> tuple[StateDict, dict]:
    """The multi-task reference ("MTL"): one encoder trained on mixed batches of all tasks, each image
    scored by its own task's frozen head. An epoch is one pass over every task's data;
    ``augment``/``hflip`` give per-task flags (default: ``config``'s)."""
    cfg = replace(config or FinetuneConfig(), **overrides)
    if set(heads) != set(datasets):
        raise InputError(f"heads {sorted(heads)} and datasets {sorted(datasets)} name different tasks")
    aug = {t: ((augment or {}).get(t, cfg.augment), (hflip or {}).get(t, cfg.hflip)) for t in datasets}
    return _train_heads(base_state, heads, dict(datasets), cfg, size=size,
                        seed=seed, device=device, threads=threads, progress=progress,
                        desc=f"multitask ({len(datasets)} tasks)", kind="mtl", augment=aug)


def _train_heads(base_state, heads, datasets, cfg, *, size, seed, device, threads, progress, desc, kind, augment):
    dev = resolve_device(device)
    tasks = list(datasets)
    xs = [torch.as_tensor(datasets[t].x) for t in tasks]
    ys = [torch.as_tensor(datasets[t].y, dtype=torch.long) for t in tasks]
    # private frozen copies on the device (a bare [n_classes, d] weight becomes a head): the caller's heads never change
    head_list = [(ClassificationHead(h.weight, normalize=h.normalize) if isinstance(h, ClassificationHead)
                  else ClassificationHead(torch.as_tensor(h))).to(dev).eval() for h in (heads[t] for t in tasks)]
    for t, x, y, head in zip(tasks, xs, ys, head_list):
        if x.shape[0] != y.shape[0]:
            raise InputError(f"task {t!r}: {x.shape[0]} images but {y.shape[0]} labels")
        n_cls = head.n_classes
        if y.numel() and (y.min() < 0 or y.max() >= n_cls):
            raise InputError(f"task {t!r}: labels must be in 0..{n_cls - 1}")
    x_all = torch.cat(xs) if len(xs) > 1 else xs[0]
    y_all = torch.cat(ys) if len(ys) > 1 else ys[0]
    t_all = torch.cat([torch.full((len(y),), i, dtype=torch.long) for i, y in enumerate(ys)])
    n = x_all.shape[0]
    per_epoch, total = _n_steps(n, cfg.batch_size, cfg.epochs)
    with num_threads(threads) as n_threads:
        g = seed_everything(seed)
        aug_g = make_generator(seed + 1)
        enc = _make_encoder(size, base_state).to(dev)
        autocast = _autocast(cfg.precision, dev)

        def loss_of(idx):
            xb = _augment_mixed(x_all[idx], t_all[idx], tasks, augment, aug_g)
            with autocast:
                feats = enc(xb.to(dev)).float()
            yb, tb = y_all[idx].to(dev), t_all[idx].to(dev)
            loss, correct = feats.new_zeros(()), 0
            for i, h in enumerate(head_list):
                m = tb == i
                if m.any():
                    lg = h(feats[m])
                    loss = loss + F.cross_entropy(lg, yb[m], reduction="sum")
                    correct += int((lg.argmax(-1) == yb[m]).sum())
            return loss / len(idx), {"all": (correct, len(idx))}

        decay = [p for p in enc.parameters() if p.requires_grad]
        window, seconds = _train(enc, nn.ModuleList(head_list), decay, [], cfg, loss_of, g, n=n, total=total,
                                 per_epoch=per_epoch, desc=desc, progress=progress)
    seen = sum(h["all"][1] for _, h in window)
    extra = {"tasks": [getattr(datasets[t], "name", t) for t in tasks],
             "augment": {t: list(a) for t, a in augment.items()}} if kind == "mtl" else {}
    return _state(enc), _recipe(kind, size, cfg, seed, n, total, per_epoch, seconds, n_threads,
                                sum(loss * h["all"][1] for loss, h in window) / max(1, seen),
                                sum(h["all"][0] for _, h in window) / max(1, seen), **extra)


def _augment_mixed(xb, tb, tasks, augment, g):
    flags = [augment[t] for t in tasks]
    if not any(c or f for c, f in flags):
        return xb
    out = xb.clone()
    for i, (crop, flip) in enumerate(flags):
        m = tb == i
        if (crop or flip) and m.any():
            out[m] = augment_batch(xb[m], g, crop=crop, hflip=flip)
    return out


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def correctness(model: ImageEncoder | Classifier | Mapping[str, Tensor], head: ClassificationHead | None, data, *,
                size: str | Callable[[], ImageEncoder] | None = None, batch_size: int = 512,
                device: str | torch.device = "cpu", threads: int | None = None) -> Tensor:
    """Per-example top-1 correctness (bool, in ``data``'s order) of ``head(model(x))`` on ``data``.

    ``model``: an :class:`ImageEncoder`, a :class:`Classifier` (``head`` may be None), or an
    encoder state dict (``size`` names its architecture).
    """
    dev = resolve_device(device)
    if isinstance(model, Mapping):
        if size is None:
            raise InputError("evaluate() needs size= to build an encoder for a state dict")
        model = _make_encoder(size, model)
    if isinstance(model, Classifier):
        clf = model if head is None else Classifier(model.encoder, head)
    else:
        if head is None:
            raise InputError("evaluate() needs a head for an encoder")
        clf = Classifier(model, head)
    clf = clf.to(dev)
    was_training = clf.training
    clf.eval()
    x = torch.as_tensor(data.x)
    y = torch.as_tensor(data.y, dtype=torch.long)
    hits = []
    with num_threads(threads):
        for i in range(0, len(x), batch_size):
            pred = clf(x[i : i + batch_size].to(dev)).argmax(-1).cpu()
            hits.append(pred == y[i : i + batch_size])  # (batch,) bool
    clf.train(was_training)
    return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool)


def evaluate(model: ImageEncoder | Classifier | Mapping[str, Tensor], head: ClassificationHead | None, data,
             **options: Any) -> float:
    """Top-1 accuracy (fraction in [0, 1]) of ``head(model(x))`` on ``data``: the mean of
    :func:`correctness` (the same keyword options: ``size``, ``batch_size``, ``device``, ``threads``)."""
    hits = correctness(model, head, data, **options)
    return int(hits.sum()) / max(1, len(hits))
