"""The papers' own benchmark behind the world interface: CLIP ViT-B/32, the public fine-tuned experts
and FusionBench's datasets (:class:`ClipWorld`, world ``"clip-vit-b32"``, suites ``clip8`` / ``clip14`` /
``clip20``). Layouts, what is merged, heads, caches and time: docs/clip-world.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from ...errors import InputError, InputKeyError
from ...files.checkpoints import config_hash, save_checkpoint, state_hash
from ...utils import atomic_write, make_generator, progress, resolve_device
from ..base import StateDict, WorldBase, cache_dir, cached_checkpoint
from ..vision.zoo import VISION_MATRICES
from .data import ImageSource, cached_pixels, hf_source, image_folder, normalize
from .tasks import BASE_ID, CLIP_SUITES, CLIP_TASKS, TASK_SOURCE, ClipTask

__all__ = ["ClipWorld", "CLIP_WORLD_VERSION"]

log = logging.getLogger(__name__)
CLIP_WORLD_VERSION = 1
#: ESM's and RegMean's target matrices in the HF layout: the encoder layers' q/k/v/out_proj, fc1 and fc2
#: (open_clip: the vision world's, :data:`~acetools.world.vision.zoo.VISION_MATRICES`).
_HF_MATRIX = r"^vision_model\.encoder\.layers\.\d+\.(self_attn\.(q|k|v|out)_proj|mlp\.fc[12])\.weight$"


def _cap(n: int | None, name: str) -> int | None:
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
        raise InputError(f"{name}={n!r} must be None or a positive int")
    return None if n is None else int(n)


class ClipWorld(WorldBase):
    """CLIP ViT-B/32 and its public experts on one suite (see the module docstring).

    Parameters
    ----------
    suite: ``"clip8"``, ``"clip14"`` or ``"clip20"``; tasks: a subset of the suite's tasks.
    seed: the experts' seed; the public experts are one fine-tuning run, so only 0.
    models_root: ``DIR/<repo id>/`` folders instead of the Hugging Face cache.
    data_root: ImageFolder tasks ``DIR/<task>/<split>/<class name>/*.png`` instead of ``datasets``.
    openclip_root: read the open_clip layout (``{root}/ViT-B-32/...``) instead of the HF models.
    n_test, n_val: images per task (None: the whole split).
    device: ``"auto"``, ``"cuda"`` or ``"cpu"``; root: the cache folder (:func:`acetools.world.base.cache_dir`);
    batch_size: images per forward pass; cache: write heads, images and features to ``root``.
    """

    kind = "clip"
    size = "clip-vit-b32"
    base_label = "base (zero-shot heads)"

    def __init__(self, suite: str = "clip8", seed: int = 0, *, tasks: Sequence[str] | None = None,
                 models_root: str | os.PathLike | None = None, data_root: str | os.PathLike | None = None,
                 openclip_root: str | os.PathLike | None = None, n_test: int | None = None,
                 n_val: int | None = None, device: str | torch.device = "auto", batch_size: int = 256,
                 root: str | os.PathLike | None = None, cache: bool = True):
        if suite not in CLIP_SUITES:
            raise InputError(f"unknown CLIP suite {suite!r}; valid: {sorted(CLIP_SUITES)}")
        if seed != 0:
            raise InputError(f"seed={seed!r}: the public CLIP experts are one fine-tuning run; use seed 0")
        names = list(CLIP_SUITES[suite]) if tasks is None else list(tasks)
        bad = [t for t in names if t not in CLIP_SUITES[suite]]
        if bad or not names or len(set(names)) != len(names):
            raise InputError(f"tasks must be distinct tasks of {suite} ({', '.join(CLIP_SUITES[suite])}); "
                             f"got {names}" + (f" ({bad[0]!r} is not one)" if bad else ""))
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size={batch_size!r} must be a positive int")
        self.suite = suite
        self.tasks: list[str] = names
        self.specs: dict[str, ClipTask] = {t: CLIP_TASKS[t] for t in names}
        self.seed = 0
        self.n_test, self.n_val = _cap(n_test, "n_test"), _cap(n_val, "n_val")
        self.models_root = None if models_root is None else Path(models_root).expanduser()
        self.data_root = None if data_root is None else Path(data_root).expanduser()
        self.openclip_root = None if openclip_root is None else Path(openclip_root).expanduser()
        for opt, p in (("models_root", self.models_root), ("data_root", self.data_root),
                       ("openclip_root", self.openclip_root)):
            if p is not None and not p.is_dir():
                raise FileNotFoundError(f"{opt}: no folder {p}")
        self.layout = "open_clip" if self.openclip_root is not None else "hf_clip"
        self.matrix_pattern = VISION_MATRICES if self.openclip_root is not None else _HF_MATRIX
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.root = cache_dir("clip", root)
        self.cache = bool(cache)
        self.profile = "quick" if (self.n_test or self.n_val) else "full"
        self._base_model = None
        self._base_folder: Path | None = None
        self._base: StateDict | None = None
        self._hashes: dict[str, str] = {}
        self._experts: dict[str, StateDict] = {}
        self._records: dict[str, dict] = {}
        self._sources: dict[tuple[str, str], ImageSource] = {}
        self._splits: dict[tuple[str, str], tuple[ImageSource, np.ndarray]] = {}
        self._pixels: dict[tuple, tuple[np.ndarray, str]] = {}
        self._heads: dict[str, tuple[Tensor, float, Tensor | None]] = {}
        self._encoder: nn.Module | None = None
        self._loaded: Mapping[str, Tensor] | None = None

    # ----------------------------------------------------------------- identity
    @property
    def name(self) -> str:
        if self.tasks == list(CLIP_SUITES[self.suite]):
            return self.suite
        return f"{self.suite}-" + "-".join(self.tasks)

    def describe(self) -> str:
        where = f"--models-root {self.models_root}" if self.models_root else "HF cache"
        src = f"open_clip layout {self.openclip_root}" if self.openclip_root else \
            f"{BASE_ID} + tanganke experts ({where})"
        caps = ", ".join(f"{k} {v}" for k, v in (("n_test", self.n_test), ("n_val", self.n_val)) if v)
        return (f"CLIP ViT-B/32 world {self.name!r}: {len(self.tasks)} tasks, {src}, merged part: the vision tower, "
                f"device {self.device}" + (f", {caps}" if caps else ""))

    def __repr__(self) -> str:
        return f"ClipWorld({self.name!r}, layout={self.layout!r}, device={str(self.device)!r})"

    # ----------------------------------------------------------------- models
    def _base_hf(self):
        if self._base_model is None:
            from .hub import model_folder
            from .models import load_hf_base

            self._base_folder = model_folder(BASE_ID, self.models_root)
            self._base_model = load_hf_base(self._base_folder)
        return self._base_model

    def base_state(self) -> StateDict:
        """W0 of the merged part (on ``device``)."""
        if self._base is None:
            if self.openclip_root is not None:
                from .models import load_openclip_state, openclip_paths

                path = openclip_paths(self.openclip_root, None)["state"]
                state, src = load_openclip_state(path), str(path)
            else:
                full = self._base_hf().state_dict()
                state = {k: v.detach().float().clone() for k, v in full.items()
                         if k.startswith("vision_model.") and not k.endswith("position_ids")}
                src = str(self._base_folder)
            self._hashes["base"] = state_hash(state)
            self._records["base"] = {"kind": "clip_base", "id": BASE_ID, "layout": self.layout, "path": src,
                                     "content_sha256": self._hashes["base"]}
            self._base = {k: v.to(self.device) for k, v in state.items()}
        return self._base

    def expert_state(self, task: str) -> StateDict:
        """Task ``task``'s expert (the same keys as :meth:`base_state`, on ``device``)."""
        self._check_task(task)
        if task not in self._experts:
            base = self.base_state()
            if self.openclip_root is not None:
                from .models import load_openclip_state, openclip_paths

                path = openclip_paths(self.openclip_root, task)["state"]
                state = self._check_keys(load_openclip_state(path), f"{path}")
                src, rid = str(path), f"open_clip {task}"
            else:
                from .hub import model_folder
                from .models import load_hf_expert

                folder = model_folder(self.specs[task].expert, self.models_root)
                state = load_hf_expert(folder, base)
                src, rid = str(folder), self.specs[task].expert
            self._hashes[task] = state_hash(state)
            self._records[task] = {"kind": "clip_expert", "task": task, "id": rid, "layout": self.layout,
                                   "path": src, "content_sha256": self._hashes[task]}
            self._experts[task] = {k: v.to(self.device) for k, v in state.items()}
        return self._experts[task]

    def build(self, progress_bar: bool | None = None) -> ClipWorld:
        """Load the base, every expert and every head (what a benchmark needs before merging)."""
        self.base_state()
        for t in progress(self.tasks, desc=f"{self.name}: experts and heads", enabled=progress_bar):
            self.expert_state(t)
            self.head(t)
        return self

    def records(self) -> list[dict]:
        return [self._records[k] for k in ["base", *self.tasks] if k in self._records]

    # ----------------------------------------------------------------- encoder
    def _image_size(self) -> int:
        if self.openclip_root is not None:
            pos = self.base_state()["visual.positional_embedding"]
            patch = self.base_state()["visual.conv1.weight"].shape[-1]
            return int(round((pos.shape[0] - 1) ** 0.5)) * int(patch)
        # transformers types a config's parts loosely (dict | config | None, size int | pair); the loaded
        # CLIPModel's vision_config is a CLIPVisionConfig with an int image_size
        return int(cast(Any, self._base_hf().config).vision_config.image_size)

    def encoder(self, state: Mapping[str, Tensor] | None = None) -> nn.Module:
        """The image encoder on ``device`` with ``state`` (a merged part; None: the base) loaded; one
        instance, reused."""
        if self._encoder is None:
            if self.openclip_root is not None:
                from .models import openclip_encoder

                enc = openclip_encoder({k: v.cpu() for k, v in self.base_state().items()})
            else:
                from .models import HFImageEncoder

                enc = HFImageEncoder(self._base_hf())
            self._encoder = enc.to(self.device).eval().requires_grad_(False)
        state = self.base_state() if state is None else state
        if self._loaded is not state:
            prefix = "visual" if self.openclip_root is not None else "vision_model"
            with torch.no_grad():
                self._encoder.get_submodule(prefix).load_state_dict(
                    {k[len(prefix) + 1:]: v for k, v in self._check_keys(state, "state for the CLIP world").items()})
            self._loaded = state
        return self._encoder

    def _check_keys(self, state: Mapping[str, Tensor], what: str) -> Mapping[str, Tensor]:
        """``state``, or a KeyError naming a key that it lacks or has beyond the base's."""
        base = self.base_state()
        missing = [k for k in base if k not in state]
        extra = [k for k in state if k not in base]
        if missing or extra:
            odd = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}"
            raise InputKeyError(f"{what} {odd} (the merged part is {self.layout}'s vision tower, {len(base)} keys)")
        return state

    def _batches(self, pixels):
        """Batches of uint8 crops (N, 3, S, S) as the encoder's input on ``device``; images of another
        size (e.g. the mini-world's 32-px pool in notebook 03) are resized bicubically first."""
        size = self._image_size()
        for i in range(0, len(pixels), self.batch_size):
            chunk = np.asarray(pixels[i:i + self.batch_size])
            if self.openclip_root is not None:  # open_clip's ImageEncoder normalises (and resizes) uint8 itself
                yield torch.as_tensor(chunk).to(self.device)
            elif chunk.shape[-2:] != (size, size):
                x = torch.from_numpy(np.array(chunk, dtype=np.uint8)).to(self.device, torch.float32)
                x = nn.functional.interpolate(x, size=(size, size), mode="bicubic", align_corners=False)
                yield normalize(x.clamp(0, 255).round().to(torch.uint8).cpu().numpy(), self.device)
            else:
                yield normalize(chunk, self.device)

    @torch.no_grad()
    def _features(self, pixels: np.ndarray, desc: str) -> Tensor:
        enc = self._encoder
        if enc is None:
            raise RuntimeError("ClipWorld._features before encoder(): no encoder is loaded")
        n_batches = -(-len(pixels) // self.batch_size)
        out = [enc(x).float() for x in progress(self._batches(pixels), desc=desc, total=n_batches)]
        return torch.cat(out) if out else torch.empty(0)

    # ----------------------------------------------------------------- data
    def _source(self, task: str, which: str) -> ImageSource | None:
        """The raw ``"test"``, ``"train"`` (never None: missing is an error) or ``"val"`` (ImageFolder
        only) source of ``task``."""
        key = (task, which)
        if key not in self._sources:
            spec = self.specs[task]
            if self.data_root is not None:
                names = {"test": ("test", spec.test_split), "train": ("train", spec.train_split),
                         "val": ("val",)}[which]
                folder = next((n for n in names if (self.data_root / task / n).is_dir()), None)
                if folder is None:
                    if which == "val":
                        return None  # carve from train
                    from .hub import MissingResource

                    raise MissingResource(f"dataset {task}: no folder {self.data_root / task / names[0]} under "
                                          f"--data-root (layout DIR/<task>/<split>/<class name>/*.png); "
                                          "see docs/clip-world.md")
                self._sources[key] = image_folder(self.data_root, spec, folder)
            else:
                if which == "val":
                    return None
                self._sources[key] = hf_source(spec, spec.test_split if which == "test" else spec.train_split)
        return self._sources[key]

    def split_indices(self, task: str, split: str) -> tuple[ImageSource, np.ndarray]:
        """``(source, indices)`` of a whole split: test as is; val and train from the training
        split by FusionBench's rule (``random_split`` seeded ``val_seed``, ``val_fraction`` of it
        to val, at least one image), unless an ImageFolder has its own ``val`` folder."""
        self._check_task(task, split)
        key = (task, split)
        if key not in self._splits:
            if split == "test":
                src = cast(ImageSource, self._source(task, "test"))
                self._splits[key] = (src, np.arange(len(src)))
            else:
                own_val = self._source(task, "val")
                if own_val is not None and self.data_root is not None and not any(
                        (self.data_root / task / n).is_dir() for n in ("train", self.specs[task].train_split)):
                    log.warning("%s: no train folder; RegMean's training images are the val folder's", task)
                    self._sources[(task, "train")] = own_val
                train = cast(ImageSource, self._source(task, "train"))
                if own_val is not None:
                    self._splits[(task, "val")] = (own_val, np.arange(len(own_val)))
                    self._splits[(task, "train")] = (train, np.arange(len(train)))
                else:
                    spec = self.specs[task]
                    n = len(train)
                    n_val = max(1, int(n * spec.val_fraction))
                    if n_val >= n:
                        raise InputError(f"task {task}: {n} training image(s) cannot give a validation split; "
                                         f"add a val folder under {self.data_root or 'the data root'}/{task}/")
                    perm = torch.randperm(n, generator=torch.Generator().manual_seed(spec.val_seed)).numpy()
                    self._splits[(task, "train")] = (train, perm[: n - n_val])
                    self._splits[(task, "val")] = (train, perm[n - n_val:])
        return self._splits[key]

    def eval_indices(self, task: str, split: str, n: int | None = None) -> tuple[ImageSource, np.ndarray]:
        """The evaluated images: the whole split, or ``min(n, n_test/n_val)`` drawn once with seed 0."""
        src, idx = self.split_indices(task, split)
        caps = [c for c in (n, {"val": self.n_val, "test": self.n_test}.get(split)) if c is not None]
        cap = min(caps) if caps else None
        if cap is not None and cap < len(idx):
            idx = idx[torch.randperm(len(idx), generator=make_generator(0)).numpy()[:cap]]
        return src, idx

    def pixels(self, task: str, split: str, indices: np.ndarray | None = None, n: int | None = None):
        """``(uint8 crops, labels, sha256)`` of ``task``'s ``split`` (its evaluated images, or ``indices``)."""
        src, idx = self.eval_indices(task, split, n) if indices is None else (self.split_indices(task, split)[0],
                                                                               np.asarray(indices))
        key = (task, split, hash(np.asarray(idx).tobytes()), len(idx))
        if key not in self._pixels:
            self._pixels[key] = cached_pixels(src, idx, self._image_size(), self.root if self.cache else None,
                                              desc=f"{task}/{split}: preprocessing")
        arr, digest = self._pixels[key]
        return arr, src.labels[idx], digest

    def split(self, task: str, split: str = "train") -> SimpleNamespace:
        """A whole split as the mini-world's zoo gives it: ``x`` (uint8 crops, N x 3 x 224 x 224, a
        read-only memory map when cached), ``y`` (labels), ``class_names``; preprocessed on first use."""
        return self.data(task, split, indices=self.split_indices(task, split)[1])

    def data(self, task: str, split: str, n: int | None = None, indices: np.ndarray | None = None) -> SimpleNamespace:
        """The evaluated images of a split (:meth:`eval_indices`), or ``indices``, as :meth:`split` gives them."""
        x, y, digest = self.pixels(task, split, indices=indices, n=n)
        return SimpleNamespace(x=x, y=y, name=task, split=split, class_names=list(self.classnames(task)),
                               sha256=digest)

    def classnames(self, task: str) -> tuple[str, ...]:
        """The head's classes: the task's list, or an ImageFolder's folder names (see :mod:`.data`)."""
        return self.split_indices(task, "test")[0].classnames

    # ----------------------------------------------------------------- heads
    def head(self, task: str) -> tuple[Tensor, float, Tensor | None]:
        """``(W, scale, bias)`` on ``device``: logits = scale · normalize(f) @ Wᵀ (+ bias)."""
        self._check_task(task)
        if task not in self._heads:
            if self.openclip_root is not None:
                from .models import load_openclip_head, openclip_paths

                W, b = load_openclip_head(openclip_paths(self.openclip_root, task)["head"])
                self._heads[task] = (W.to(self.device), 1.0, None if b is None else b.to(self.device))
            else:
                self._heads[task] = self._zeroshot_head(task)
        return self._heads[task]

    def _zeroshot_head(self, task: str) -> tuple[Tensor, float, None]:
        spec, classes = self.specs[task], self.classnames(task)
        self.base_state()
        model = self._base_hf()
        base_folder = self._base_folder
        assert base_folder is not None, "set by _base_hf()"
        text_hash = self._hashes.get("text")
        if text_hash is None:
            text = {k: v for k, v in model.state_dict().items() if not k.startswith("vision_model.")}
            text_hash = self._hashes["text"] = state_hash(text)
        fields = {"text_tower": text_hash, "classes": list(classes), "templates": list(spec.templates),
                  "tokenizer": "hf" if (base_folder / "vocab.json").is_file() else "open_clip",
                  "version": CLIP_WORLD_VERSION}
        path, key, cached = cached_checkpoint(self.root / "heads" / task, fields, read=self.cache)
        if cached is not None:
            return cached[0]["weight"].to(self.device), float(cached[1]["scale"]), None
        from .models import zeroshot_head

        W, scale = zeroshot_head(model, base_folder, spec.prompts(classes), device=self.device,
                                 desc=f"{task}: zero-shot head")
        model.cpu()
        if self.cache:
            save_checkpoint(path, {"weight": W}, {"kind": "clip_head", "task": task, "key": key, "key_fields": fields,
                                                  "scale": scale, "source": TASK_SOURCE})
        return W.to(self.device), scale, None

    # ----------------------------------------------------------------- evaluation
    def features(self, state: Mapping[str, Tensor], task: str, split: str,
                 n: int | None = None) -> tuple[Tensor, np.ndarray]:
        """``(image embeddings on device, labels)``; the base's and the experts' are cached on disk
        keyed by the model's and the images' content hashes."""
        pixels, labels, digest = self.pixels(task, split, n=n)
        # the base's or an expert's state (by identity) has cached features; a merged state has not
        ident = "base" if state is self._base else next((t for t, s in self._experts.items() if s is state), None)
        path = None
        if ident is not None and self.cache:
            key = config_hash({"model": self._hashes[ident], "pixels": digest, "layout": self.layout,
                               "version": CLIP_WORLD_VERSION})
            path = self.root / "features" / f"{task}-{split}-{ident}-{key[:16]}.pt"
            if path.is_file():
                try:
                    from safetensors.torch import load_file

                    return load_file(str(path))["features"].to(self.device), labels
                except Exception as err:  # a truncated cache file: recompute
                    log.warning("recomputing features %s (%s)", path, err)
        self.encoder(state)
        f = self._features(pixels, desc=f"{task}/{split}: image features")
        if path is not None:
            from safetensors.torch import save

            with atomic_write(path) as fh:
                fh.write(save({"features": f.detach().cpu().contiguous()}))
        return f, labels

    def logits(self, features: Tensor, task: str) -> Tensor:
        W, scale, b = self.head(task)
        out = scale * nn.functional.normalize(features, dim=-1) @ W.t()
        return out if b is None else out + b

    def correctness(self, state: Mapping[str, Tensor], split: str = "test", n: int | None = None,
                    tasks: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Per-example correctness per task (:class:`~acetools.world.base.PerExample`)."""
        out = {}
        for t in tasks or self.tasks:
            f, y = self.features(state, t, split, n)
            if len(y) == 0:
                raise InputError(f"task {t} split {split} has no images")
            out[t] = self.logits(f, t).argmax(-1).cpu().numpy() == np.asarray(y)
        return out

    # ----------------------------------------------------------------- ESM's and RegMean's inputs
    def proxy_inputs(self, task: str, n: int, seed: int = 0) -> Tensor:
        """ESM's ``n`` proxy images of ``task`` (uint8 crops): validation images drawn without
        replacement with a generator seeded ``seed`` (docs/methods.md §ESM)."""
        _, idx = self.split_indices(task, "val")
        pick = idx[torch.randperm(len(idx), generator=make_generator(seed)).numpy()[:n]]
        return torch.from_numpy(np.array(self.pixels(task, "val", indices=pick)[0]))

    def gram_examples(self, task: str, n: int) -> Tensor:
        """RegMean's ``n`` training images of ``task`` (the first ``n`` of the shuffled train part)."""
        _, idx = self.split_indices(task, "train")
        return torch.from_numpy(np.array(self.pixels(task, "train", indices=idx[:n])[0]))
