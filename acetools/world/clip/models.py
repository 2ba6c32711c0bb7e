"""The CLIP world's models: the Hugging Face CLIP ViT-B/32 (base ``CLIPModel``, experts
``CLIPVisionModel``), its zero-shot heads, and the open_clip checkpoint layout of the TSV-M / Iso / ESM
code, read with ``torch.load(weights_only=True)`` only (docs/clip-world.md §What is merged, §Heads and
preprocessing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ...errors import InputError
from ...files.checkpoints import open_checkpoint
from ...utils import progress

if TYPE_CHECKING:
    from transformers import CLIPModel

__all__ = ["HFImageEncoder", "load_hf_base", "load_hf_expert", "zeroshot_head", "tokenize",
           "OPENCLIP_NAMES", "load_openclip_state", "openclip_encoder", "openclip_paths", "UnsafeCheckpoint"]

StateDict = dict[str, Tensor]


class HFImageEncoder(nn.Module):
    """``visual_projection(vision_model(x).pooler_output)``: the merged part (``vision_model.*``,
    the published experts' key names) and the base's projection (not merged). Built from a copy
    of the base ``CLIPModel``'s modules, so it follows the installed transformers."""

    def __init__(self, base):
        super().__init__()
        import copy

        self.vision_model = copy.deepcopy(base.vision_model)
        self.visual_projection = copy.deepcopy(base.visual_projection)
        self.requires_grad_(False)

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.visual_projection(self.vision_model(pixel_values=pixel_values).pooler_output)


def _check_config(folder: Path, wanted: Sequence[str]) -> dict:
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{folder / 'config.json'}: unreadable ({err})") from None
    mt = cfg.get("model_type")
    if mt not in wanted:
        raise InputError(f"{folder}: model_type {mt!r}, expected {' or '.join(wanted)}")
    return cfg


def load_hf_base(folder: Path) -> CLIPModel:
    """The base ``CLIPModel`` from a local folder (eval mode, fp32)."""
    from transformers import CLIPModel

    _check_config(folder, ("clip",))
    model = CLIPModel.from_pretrained(str(folder), dtype=torch.float32)
    return model.eval()


def load_hf_expert(folder: Path, reference: Mapping[str, Tensor]) -> StateDict:
    """An expert's vision tower as ``vision_model.*`` (from a ``CLIPVisionModel`` folder, whatever
    transformers version wrote it, or a full ``CLIPModel``); its keys and shapes must be the
    base's (``reference``), else a ValueError names the key."""
    cfg = _check_config(folder, ("clip_vision_model", "clip"))
    raw = open_checkpoint(folder).state_dict()
    if cfg["model_type"] == "clip":
        state = {k: v for k, v in raw.items() if k.startswith("vision_model.")}
    else:  # transformers 4 saved "vision_model.*", transformers 5 saves the tower's own names
        state = {(k if k.startswith("vision_model.") else "vision_model." + k): v for k, v in raw.items()}
    state = {k: v for k, v in state.items() if not k.endswith("position_ids")}
    missing = [k for k in reference if k not in state]
    extra = [k for k in state if k not in reference]
    if missing or extra:
        what = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}, which the base has not"
        raise InputError(f"expert {folder}: its vision tower {what}")
    for k, v in reference.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise InputError(f"expert {folder}: {k} has shape {tuple(state[k].shape)}, the base {tuple(v.shape)}")
    return {k: state[k].float().contiguous() for k in reference}


@lru_cache(maxsize=4)
def _tokenizer(folder: str, context_length: int):
    """The base folder's CLIP tokenizer (``vocab.json`` + ``merges.txt``), else open_clip's copy of
    CLIP's BPE; loaded once per folder (loading the BPE takes a while)."""
    f = Path(folder)
    if (f / "vocab.json").is_file() and (f / "merges.txt").is_file():
        from transformers import CLIPTokenizer

        tok = CLIPTokenizer.from_pretrained(folder)

        def run(texts):
            b = tok(texts, padding="max_length", truncation=True, max_length=context_length, return_tensors="pt")
            return b["input_ids"], b["attention_mask"]

        return run
    from open_clip.tokenizer import SimpleTokenizer

    simple = SimpleTokenizer(context_length=context_length)

    def run_simple(texts):
        ids = simple(texts)
        return ids, (ids != 0).long()

    return run_simple


def tokenize(folder: Path, texts: list[str], context_length: int) -> tuple[Tensor, Tensor]:
    """``(input_ids, attention_mask)`` of ``texts`` (see the module docstring for the tokenizer)."""
    return _tokenizer(str(folder), int(context_length))(list(texts))


@torch.no_grad()
def zeroshot_head(model, folder: Path, prompts: list[list[str]], *, device: torch.device | str = "cpu",
                  desc: str | None = None, batch_size: int = 256) -> tuple[Tensor, float]:
    """``(W, scale)``: per class the normalised mean of the normalised projected template
    embeddings (``W`` is n_classes x embed_dim, fp32 on the CPU) and ``logit_scale.exp()``."""
    text = model.text_model.to(device)
    proj = model.text_projection.to(device)
    ctx = int(model.config.text_config.max_position_embeddings)
    flat = [p for class_prompts in prompts for p in class_prompts]
    owner = torch.tensor([c for c, class_prompts in enumerate(prompts) for _ in class_prompts])
    ids, mask = tokenize(folder, flat, ctx)
    emb = []
    starts = range(0, len(flat), batch_size)
    for i in progress(starts, desc=desc or "zero-shot head", total=len(starts)):
        out = text(input_ids=ids[i:i + batch_size].to(device), attention_mask=mask[i:i + batch_size].to(device))
        emb.append(nn.functional.normalize(proj(out.pooler_output).float(), dim=-1).cpu())
    e = torch.cat(emb)
    counts = torch.bincount(owner, minlength=len(prompts))[:, None]
    mean = torch.zeros(len(prompts), e.shape[1]).index_add_(0, owner, e) / counts
    scale = float(model.logit_scale.detach().float().exp())
    return nn.functional.normalize(mean, dim=-1), scale


# --------------------------------------------------------------------------- open_clip layout

#: Our task names -> the open_clip layout's folder names (the TSV-M / Iso / ESM code's ``{Task}Val``).
OPENCLIP_NAMES: dict[str, str] = {
    "sun397": "SUN397", "stanford-cars": "Cars", "resisc45": "RESISC45", "eurosat": "EuroSAT", "svhn": "SVHN",
    "gtsrb": "GTSRB", "mnist": "MNIST", "dtd": "DTD", "oxford_flowers102": "Flowers102", "pcam": "PCAM",
    "fer2013": "FER2013", "oxford-iiit-pet": "OxfordIIITPet", "stl10": "STL10", "cifar100": "CIFAR100",
    "cifar10": "CIFAR10", "food101": "Food101", "fashion_mnist": "FashionMNIST", "emnist_letters": "EMNIST",
    "kmnist": "KMNIST", "rendered-sst2": "RenderedSST2",
}


class UnsafeCheckpoint(ValueError):
    """A checkpoint that ``torch.load(weights_only=True)`` refuses (a pickled module)."""


def openclip_paths(root: Path, task: str | None, model: str = "ViT-B-32") -> dict[str, Path]:
    """``{"state": ..., "head": ...}`` of ``task`` (``None``: the zero-shot base) in the layout."""
    d = Path(root).expanduser() / model
    if task is None:
        return {"state": d / "MNISTVal" / "nonlinear_zeroshot.pt"}
    name = OPENCLIP_NAMES.get(task, task)
    return {"state": d / f"{name}Val" / "nonlinear_finetuned.pt", "head": d / f"head_{name}Val.pt"}


def _load_safe(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"no {path} (open_clip layout: ROOT/ViT-B-32/{{Task}}Val/nonlinear_finetuned.pt, "
                                "ROOT/ViT-B-32/MNISTVal/nonlinear_zeroshot.pt, ROOT/ViT-B-32/head_{Task}Val.pt)")
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:
        raise UnsafeCheckpoint(
            f"{path} is not a plain state dict (torch.load(weights_only=True) refused it: "
            f"{type(err).__name__}); it is probably a pickled module, which acetools never unpickles. On a trusted "
            "machine convert it: torch.save(torch.load(p, weights_only=False).state_dict(), p)") from None
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise UnsafeCheckpoint(f"{path}: expected a state dict of tensors, got {type(obj).__name__}")
    return dict(obj)


def load_openclip_state(path: Path) -> StateDict:
    """The ``visual.*`` keys of an open_clip image-encoder checkpoint (prefix ``model.`` dropped)."""
    raw = _load_safe(path)
    out = {}
    for k, v in raw.items():
        k2 = k[6:] if k.startswith("model.") else k
        if k2.startswith("visual."):
            out[k2] = v.float().contiguous() if v.is_floating_point() else v
    if not out:
        raise InputError(f"{path}: no visual.* (or model.visual.*) keys; keys start {sorted(raw)[:3]}")
    return out


def load_openclip_head(path: Path) -> tuple[Tensor, Tensor | None]:
    """``(weight, bias)`` of a ``head_{Task}Val.pt`` (a ClassificationHead's state dict: ``weight``, ``bias``)."""
    raw = _load_safe(path)
    if "weight" not in raw or raw["weight"].ndim != 2:
        raise InputError(f"{path}: a head needs a 2-D 'weight'; keys {sorted(raw)}")
    return raw["weight"].float(), (raw["bias"].float() if "bias" in raw else None)


def openclip_encoder(state: Mapping[str, Tensor]):
    """An :class:`acetools.world.vision.models.ImageEncoder` shaped like ``state`` (width,
    layers, patch and image size, MLP ratio, output dim read from the shapes; heads of width 64;
    QuickGELU, as OpenAI's weights)."""
    from ..vision.models import ImageEncoder, vision_tower

    try:
        conv = state["visual.conv1.weight"]
        pos = state["visual.positional_embedding"]
        proj = state["visual.proj"]
        fc = state["visual.transformer.resblocks.0.mlp.c_fc.weight"]
    except KeyError as err:
        raise InputError(f"open_clip checkpoint lacks {err.args[0]!r} (a ViT image encoder's key)") from None
    width, patch = int(conv.shape[0]), int(conv.shape[-1])
    grid = int(round((pos.shape[0] - 1) ** 0.5))
    layers = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"visual\.transformer\.resblocks\.(\d+)\.", k)))
    cfg = {"embed_dim": int(proj.shape[1]), "quick_gelu": True,  # OpenAI's CLIP weights use QuickGELU
           "vision_cfg": {"width": width, "layers": layers, "patch_size": patch, "image_size": grid * patch,
                          "head_width": min(64, width), "mlp_ratio": fc.shape[0] / width}}
    enc = ImageEncoder(vision_tower(cfg), grid * patch, name="open_clip ViT")
    missing, unexpected = enc.load_state_dict(dict(state), strict=False)
    if missing or unexpected:
        raise InputError(f"open_clip checkpoint does not fit a ViT: missing {missing[:2]}, unexpected {unexpected[:2]}")
    return enc.eval()
