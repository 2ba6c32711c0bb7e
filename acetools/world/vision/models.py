"""Image encoders built with open_clip's own classes, and the frozen heads that read them.

Encoders are open_clip vision towers of configs registered in open_clip's registry, held as
``visual`` so state dicts carry CLIP's ``visual.*`` keys; they take uint8 images and pre-process
themselves. Heads are frozen, bias-free and read L2-normalised features; the mini-world's are class
prototypes (:func:`prototype_head`). docs/vision-world.md §The models.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import InputError, InputTypeError
from ...utils import progress as _progress
from ...utils import resolve_device
from .sizes import SIZES

__all__ = ["MODEL_VERSION", "SIZES", "IMAGE_MEAN", "IMAGE_STD", "DEFAULT_LOGIT_SCALE", "register_model_configs",
           "model_config", "ImageEncoder", "ClassificationHead", "Classifier", "build_encoder", "build_clip",
           "encoder_from_clip", "load_encoder", "encode", "prototype_head"]

#: Bumped whenever a change here alters what a given config and seed produce (init,
#: pre-processing, head maths). Part of every zoo cache key.
MODEL_VERSION = 1

#: Fixed pre-processing constants: OpenAI CLIP's (``open_clip.constants.OPENAI_DATASET_*``).
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)

#: Logit scale of prototype heads (CLIP's trained value is 100).
DEFAULT_LOGIT_SCALE = 30.0

_PREFIX = "acetools-"


def register_model_configs() -> list[str]:
    """Put the mini-world sizes into open_clip's model-config registry (``acetools-<size>``, the dict
    ``open_clip.add_model_config`` fills); idempotent. Returns the registered names."""
    from open_clip import factory

    names = []
    for size, cfg in SIZES.items():
        name = _PREFIX + size
        if name not in factory._MODEL_CONFIGS:
            factory._MODEL_CONFIGS[name] = copy.deepcopy(cfg)
        names.append(name)
    return names


def model_config(size: str) -> dict:
    """The open_clip config dict of a registered size (``"tiny"`` or ``"acetools-tiny"``) or
    of a built-in open_clip model (``"ViT-B-32"``); a deep copy."""
    import open_clip

    register_model_configs()
    name = size if size.startswith(_PREFIX) or size not in SIZES else _PREFIX + size
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise InputError(
            f"unknown model size {size!r}: use one of {sorted(SIZES)} or an open_clip model name "
            f"such as 'ViT-B-32' (open_clip.list_models())"
        )
    return cfg


class ImageEncoder(nn.Module):
    """An open_clip vision tower under the attribute ``visual``, with its pre-processing.

    ``forward(x)``: uint8 ``[N, 3, H, W]`` (or floats in [0, 1]) resized (bicubic) to ``image_size``
    when needed and normalised with ``mean``/``std`` (non-persistent buffers: ``state_dict()`` holds
    only ``visual.*``) -> projected features ``[N, embed_dim]``, not normalised.
    """

    def __init__(self, visual: nn.Module, image_size: int, mean: Sequence[float] = IMAGE_MEAN,
                 std: Sequence[float] = IMAGE_STD, name: str | None = None):
        super().__init__()
        self.visual = visual
        self.image_size = int(image_size)
        self.mean: Tensor  # buffers (declared for the type checker: nn.Module's attributes are untyped)
        self.std: Tensor
        self.name = name
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

    @property
    def output_dim(self) -> int:
        return int(cast(int, self.visual.output_dim))  # open_clip's towers hold it as an int

    def preprocess(self, x: Tensor) -> Tensor:
        """uint8 (0..255) or float (0..1) images -> normalised float input of the tower."""
        if x.ndim != 4 or x.shape[1] != 3:
            raise InputError(f"expected images of shape [N, 3, H, W], got {tuple(x.shape)}")
        dtype = self.mean.dtype
        if x.dtype == torch.uint8:
            x = x.to(self.mean.device, dtype).div_(255.0)
        elif x.is_floating_point():
            x = x.to(self.mean.device, dtype)
        else:
            raise InputTypeError(f"images must be uint8 or float, got {x.dtype}")
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bicubic", align_corners=False)
        return (x - self.mean) / self.std

    def forward(self, x: Tensor) -> Tensor:
        return self.visual(self.preprocess(x))


class ClassificationHead(nn.Module):
    """A frozen, bias-free head: ``logits = normalize(features) @ weight.T`` with ``weight``
    ``[n_classes, embed_dim]`` unit class vectors times the logit scale (docs/methods.md §Benchmark protocol)."""

    def __init__(self, weight: Tensor, normalize: bool = True, class_names: Sequence[str] | None = None):
        super().__init__()
        if weight.ndim != 2:
            raise InputError(f"head weight must be [n_classes, embed_dim], got {tuple(weight.shape)}")
        self.weight = nn.Parameter(weight.detach().clone().float(), requires_grad=False)
        self.normalize = normalize
        self.class_names = list(class_names) if class_names is not None else None

    @property
    def n_classes(self) -> int:
        return self.weight.shape[0]

    def forward(self, features: Tensor) -> Tensor:
        if self.normalize:
            features = F.normalize(features, dim=-1)
        return features @ self.weight.t()


class Classifier(nn.Module):
    """``head(encoder(x))``: an image encoder and a (frozen) classification head."""

    def __init__(self, encoder: ImageEncoder, head: ClassificationHead):
        super().__init__()
        self.encoder: ImageEncoder = encoder  # (typed: nn.Module's attributes are not)
        self.head = head

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))


def vision_tower(cfg: dict) -> nn.Module:
    # open_clip's own builder — the one CLIP.__init__ / create_model use for the image tower.
    from open_clip.model import _build_vision_tower

    return _build_vision_tower(cfg["embed_dim"], cfg["vision_cfg"], quick_gelu=cfg.get("quick_gelu", False))


def build_encoder(size: str = "tiny", *, pretrained: str | None = None, seed: int | None = None,
                  device: str | torch.device = "cpu", cache_dir: str | None = None,
                  allow_download: bool = False) -> ImageEncoder:
    """A fresh :class:`ImageEncoder` of a mini-world ``size`` (randomly initialised; ``seed`` seeds
    torch first) or of an open_clip model such as ``"ViT-B-32"`` (:func:`build_clip`'s image tower,
    with the model's input size and mean/std)."""
    if size in SIZES or size.startswith(_PREFIX):
        if pretrained is not None:
            raise InputError(
                f"size {size!r} has no published weights; load a base with load_encoder() or a Zoo"
            )
        cfg = model_config(size)
        if seed is not None:
            torch.manual_seed(seed)
        enc = ImageEncoder(vision_tower(cfg), cfg["vision_cfg"]["image_size"], name=size)
        return enc.to(resolve_device(device))
    if seed is not None:
        torch.manual_seed(seed)
    clip = build_clip(size, pretrained=pretrained, device=device, cache_dir=cache_dir, allow_download=allow_download)
    return encoder_from_clip(clip, name=size)


def _cached_checkpoint(tag_cfg: dict, cache_dir: str | None) -> str | None:
    """The local file of an open_clip pretrained tag where ``open_clip.pretrained.download_pretrained``
    would have put it (the Hugging Face cache, or ``~/.cache/clip``), else ``None``; never online."""
    if tag_cfg.get("file"):
        return tag_cfg["file"] if os.path.isfile(tag_cfg["file"]) else None
    hub = tag_cfg.get("hf_hub", "")
    if hub:
        from huggingface_hub import try_to_load_from_cache  # an open_clip (and transformers) dependency

        model_id, filename = os.path.split(hub)
        names = [filename] if filename else ["open_clip_pytorch_model.bin"]
        names = [n.rsplit(".", 1)[0] + ".safetensors" for n in names] + names
        names = ["open_clip_model.safetensors"] * (not filename) + names
        for name in names:
            found = try_to_load_from_cache(model_id, name, cache_dir=cache_dir)
            if isinstance(found, str) and os.path.isfile(found):
                return found
    url = tag_cfg.get("url", "")
    if url:
        root = cache_dir or os.path.expanduser("~/.cache/clip")
        path = os.path.join(root, os.path.basename(url))
        if os.path.isfile(path):
            return path
    return None


def build_clip(name: str = "ViT-B-32", *, pretrained: str | None = "openai", device: str | torch.device = "cpu",
               cache_dir: str | None = None, allow_download: bool = False) -> nn.Module:
    """A full open_clip CLIP model, e.g. the papers' ViT-B/32 (docs/vision-world.md §The models).

    ``pretrained``: an open_clip tag (``"openai"``), a local checkpoint file, or ``None`` (random).
    Without ``allow_download`` a tag's weights must already be in open_clip's caches, else a
    RuntimeError says how to get them. OpenAI weights get QuickGELU (docs/methods.md §Benchmark protocol).
    """
    import open_clip

    register_model_configs()
    if name in SIZES:
        name = _PREFIX + name
    kwargs = {}
    source = pretrained
    if pretrained is not None and not os.path.isfile(str(pretrained)):
        tag_cfg = open_clip.get_pretrained_cfg(name, pretrained)
        if not tag_cfg:
            raise InputError(
                f"pretrained={pretrained!r} is neither a file nor a known open_clip tag for {name!r}; "
                f"known tags: {open_clip.list_pretrained_tags_by_model(name)}"
            )
        kwargs["force_quick_gelu"] = bool(tag_cfg.get("quick_gelu", False))
        local = _cached_checkpoint(tag_cfg, cache_dir)
        if local is not None:
            source = local
            kwargs["force_preprocess_cfg"] = {
                k: tag_cfg[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in tag_cfg
            }
        elif not allow_download:
            raise RuntimeError(
                f"the pretrained weights {pretrained!r} of {name!r} are not on this machine and "
                "acetools does not download at run time. On a machine with internet run once\n"
                f"    python -c \"import open_clip; open_clip.create_model('{name}', pretrained='{pretrained}')\"\n"
                "to fill the cache (~/.cache/huggingface; or pass cache_dir=), pass "
                "pretrained=<path to the checkpoint file>, or call with allow_download=True."
            )
    elif pretrained is not None and name.startswith("ViT-B-32") and "quickgelu" not in name:
        kwargs["force_quick_gelu"] = True  # a local OpenAI-style checkpoint file
    try:
        model = open_clip.create_model(
            name, pretrained=source, device=resolve_device(device), cache_dir=cache_dir, **kwargs
        )
    except RuntimeError as err:
        if pretrained is None:
            raise
        raise RuntimeError(
            f"could not load the pretrained weights {pretrained!r} of {name!r}: {err}. Pass "
            "pretrained=<path to a checkpoint file> or fill the cache on a machine with internet "
            f"(open_clip.create_model('{name}', pretrained='{pretrained}'))."
        ) from err
    model.eval()
    return model


def encoder_from_clip(clip: nn.Module, name: str | None = None) -> ImageEncoder:
    """Wrap ``clip.visual`` (shared, not copied) as an :class:`ImageEncoder` with the model's
    own input size and mean/std (open_clip's ``preprocess_cfg``)."""
    visual = cast(nn.Module, clip.visual)
    size = cast("int | tuple[int, int] | list[int]", visual.image_size)  # open_clip's towers
    size = int(size[0] if isinstance(size, (tuple, list)) else size)
    pcfg = getattr(visual, "preprocess_cfg", None) or {}
    mean = tuple(pcfg.get("mean", IMAGE_MEAN))
    std = tuple(pcfg.get("std", IMAGE_STD))
    return ImageEncoder(visual, size, mean=mean, std=std, name=name)


def load_encoder(state: Mapping[str, Tensor], size: str = "tiny", *,
                 device: str | torch.device = "cpu") -> ImageEncoder:
    """An encoder of ``size`` with ``state`` loaded (strictly: same keys and shapes)."""
    enc = build_encoder(size, device="cpu")
    missing, unexpected = enc.load_state_dict(dict(state), strict=False)
    if missing or unexpected:
        raise InputError(
            f"state dict does not fit size {size!r}: missing {sorted(missing)[:5]}..., "
            f"unexpected {sorted(unexpected)[:5]}..."
        )
    return enc.to(resolve_device(device))


@torch.no_grad()
def encode(encoder: nn.Module, x: Tensor, *, batch_size: int = 512, device: str | torch.device | None = None,
           progress: bool | None = False) -> Tensor:
    """Image features ``[N, embed_dim]`` (float32, CPU) of ``x``, batched, in eval mode."""
    x = torch.as_tensor(x)
    dev = resolve_device(device) if device is not None else next(encoder.parameters()).device
    was_training = encoder.training
    encoder.eval()
    try:
        out = [
            encoder(x[i : i + batch_size].to(dev)).float().cpu()
            for i in _progress(range(0, len(x), batch_size), desc="encode", enabled=progress)
        ]
    finally:
        encoder.train(was_training)
    if not out:
        return torch.empty(0, getattr(encoder, "output_dim", 0))
    return torch.cat(out)


def prototype_head(encoder: nn.Module, x: Tensor, y: Tensor, n_classes: int, *,
                   logit_scale: float = DEFAULT_LOGIT_SCALE, class_names: Sequence[str] | None = None,
                   batch_size: int = 512, device: str | torch.device | None = None) -> ClassificationHead:
    """A class-prototype head: per class the normalised mean of the normalised features of its images
    under the *base* encoder, times ``logit_scale`` (the image analogue of the papers' zero-shot
    head, docs/methods.md §Benchmark protocol); every class needs an image."""
    feats = F.normalize(encode(encoder, x, batch_size=batch_size, device=device), dim=-1)
    y = torch.as_tensor(y).long().cpu()
    if y.shape[0] != feats.shape[0]:
        raise InputError(f"{feats.shape[0]} images but {y.shape[0]} labels")
    if y.numel() and (y.min() < 0 or y.max() >= n_classes):
        raise InputError(f"labels must be in 0..{n_classes - 1}, got {int(y.min())}..{int(y.max())}")
    counts = torch.bincount(y, minlength=n_classes)
    if (counts == 0).any():
        raise InputError(f"classes without images: {torch.nonzero(counts == 0).flatten().tolist()}")
    sums = torch.zeros(n_classes, feats.shape[1]).index_add_(0, y, feats)
    protos = F.normalize(sums / counts[:, None], dim=-1)
    return ClassificationHead(protos * logit_scale, class_names=class_names)
