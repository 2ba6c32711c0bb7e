"""The CLIP world's images: sources (ImageFolder or ``datasets``), CLIP's preprocessing (bicubic
short-side resize, centre crop, kept as uint8; :func:`normalize` on the device) and the content-hashed
cache of crops (docs/clip-world.md §Heads and preprocessing, §Caches).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...errors import InputError
from ...utils import atomic_write, progress
from ..vision.models import IMAGE_MEAN, IMAGE_STD

__all__ = ["IMAGE_EXTENSIONS", "ImageSource", "image_folder", "hf_source", "preprocess",
           "normalize", "cached_pixels", "PREPROCESS_VERSION"]

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
PREPROCESS_VERSION = 1


def _norm_name(s: str) -> str:
    return s.replace("_", " ").strip().lower()


@dataclass
class ImageSource:
    """One split of one task: ``len(labels)`` images read by index, their labels and class names.

    ``fingerprint`` identifies the content (file names and sizes, or the dataset's fingerprint).
    """

    task: str
    split: str
    labels: np.ndarray
    classnames: tuple[str, ...]
    fingerprint: str
    _get: Callable[[int], Any]  # index -> PIL image

    def __len__(self) -> int:
        return len(self.labels)

    def image(self, i: int):
        return self._get(int(i))


def image_folder(root: Path, task, split: str) -> ImageSource:
    """``root/<task>/<split>/<class>/*.png|jpg``. When every class folder is one of the task's
    class names (underscores read as spaces, any case), labels follow the task's list and the
    head has all its classes; otherwise the sorted folder names are the classes (logged)."""
    folder = Path(root) / task.name / split
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder {folder} (--data-root layout: DIR/<task>/<split>/<class name>/*.png)")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if not classes:
        raise FileNotFoundError(f"{folder} has no class folders (<class name>/*.png)")
    own = {_norm_name(c): i for i, c in enumerate(task.classnames)}
    if all(_norm_name(c) in own for c in classes):
        names, index = task.classnames, {c: own[_norm_name(c)] for c in classes}
    else:
        log.warning("%s/%s: class folders are not %s's class names; using the %d folder names as classes",
                    task.name, split, task.name, len(classes))
        names, index = tuple(classes), {c: i for i, c in enumerate(classes)}
    files, labels = [], []
    for c in classes:
        for f in sorted((folder / c).iterdir()):
            if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file():
                files.append(f)
                labels.append(index[c])
    if not files:
        raise FileNotFoundError(f"{folder} has no images ({', '.join(IMAGE_EXTENSIONS)})")
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(folder)}\0{f.stat().st_size}\n".encode())
    h.update(json.dumps(names).encode())

    def get(i: int):
        from PIL import Image

        with Image.open(files[i]) as im:
            return im.convert("RGB")

    return ImageSource(task.name, split, np.asarray(labels, dtype=np.int64), tuple(names), h.hexdigest(), get)


def hf_source(task, split: str) -> ImageSource:
    """``task``'s split through ``datasets`` (see :func:`acetools.world.clip.hub.load_hf_dataset`)."""
    from .hub import load_hf_dataset

    ds = load_hf_dataset(task, split)
    img_col = "image" if "image" in ds.column_names else "img" if "img" in ds.column_names else None
    lab_col = next((c for c in ("label", "fine_label", "labels") if c in ds.column_names), None)
    if img_col is None or lab_col is None:
        raise InputError(f"dataset {task.dataset} split {split}: no image/label columns in {ds.column_names}")
    labels = np.asarray([int(v) for v in ds[lab_col]], dtype=np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= task.n_classes):
        raise InputError(f"dataset {task.dataset} split {split}: labels span {labels.min()}..{labels.max()}, "
                         f"but {task.name} has {task.n_classes} class names")
    fp = hashlib.sha256(f"{task.dataset}\0{task.config}\0{split}\0{getattr(ds, '_fingerprint', '')}\0"
                        f"{len(ds)}".encode()).hexdigest()

    def get(i: int):
        return ds[i][img_col].convert("RGB")

    return ImageSource(task.name, split, labels, task.classnames, fp, get)


def preprocess(image, size: int = 224) -> np.ndarray:
    """CLIP's resize (bicubic, short side ``size``) and centre crop, as uint8 (3, size, size)."""
    from PIL import Image

    im = image.convert("RGB")
    w, h = im.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    im = im.resize((nw, nh), Image.Resampling.BICUBIC)
    left, top = (nw - size) // 2, (nh - size) // 2
    im = im.crop((left, top, left + size, top + size))
    return np.asarray(im, dtype=np.uint8).transpose(2, 0, 1).copy()


def normalize(pixels: np.ndarray, device: torch.device | str, dtype: torch.dtype = torch.float32) -> Tensor:
    """uint8 crops (N, 3, S, S) as CLIP's normalised input on ``device`` (OpenAI CLIP's mean and std)."""
    x = torch.from_numpy(np.array(pixels, dtype=np.uint8))  # a copy: the cache is a read-only memory map
    x = x.to(device=device, dtype=dtype) / 255.0
    mean = torch.tensor(IMAGE_MEAN, device=device, dtype=dtype).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD, device=device, dtype=dtype).view(1, 3, 1, 1)
    return (x - mean) / std


def cached_pixels(source: ImageSource, indices: np.ndarray, size: int, root: Path | None, *,
                  desc: str | None = None) -> tuple[np.ndarray, str]:
    """The crops of ``source``'s images at ``indices`` and their SHA-256, from the cache or built
    (and written atomically) with a progress bar. ``root=None``: no disk cache."""
    indices = np.asarray(indices, dtype=np.int64)
    key = hashlib.sha256(json.dumps({"source": source.fingerprint, "size": size, "version": PREPROCESS_VERSION,
                                     "indices": hashlib.sha256(indices.tobytes()).hexdigest()}).encode()).hexdigest()
    path = side = None
    if root is not None:
        path = Path(root) / "pixels" / f"{source.task}-{source.split}-{len(indices)}-{key[:16]}.npy"
        side = path.with_suffix(".json")
        if path.is_file() and side.is_file():
            try:
                meta = json.loads(side.read_text())
                arr = np.load(path, mmap_mode="r")
                if meta.get("key") == key and arr.shape == (len(indices), 3, size, size):
                    return arr, meta["content_sha256"]
            except (OSError, ValueError, KeyError) as err:
                log.warning("rebuilding the unreadable pixel cache %s (%s)", path, err)
    arr = np.empty((len(indices), 3, size, size), dtype=np.uint8)
    for j, i in enumerate(progress(indices, desc=desc or f"{source.task}/{source.split} images", total=len(indices))):
        arr[j] = preprocess(source.image(int(i)), size)
    digest = hashlib.sha256(arr.tobytes()).hexdigest()
    if path is not None and side is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as fh:
            np.save(fh, arr)
        with atomic_write(side, "w") as fh:
            json.dump({"key": key, "content_sha256": digest, "task": source.task, "split": source.split,
                       "n": len(indices), "size": size}, fh)
    return arr, digest
