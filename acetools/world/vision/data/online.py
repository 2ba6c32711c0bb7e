"""The online suites: torchvision datasets as 32×32 RGB uint8 tasks (``SUITES["online8"]`` ...), the papers'
benchmarks for users with internet and a GPU. Nothing downloads unless ``allow_download=True``; a missing
dataset raises :class:`DataSourceError` saying how to get it (splits: docs/vision-world.md §The tasks).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import torch
from PIL import Image

from ....errors import InputError
from ._core import (
    SPLITS,
    DataSourceError,
    TaskData,
    TaskInfo,
    cache_path,
    digest_arrays,
    load_npz,
    save_npz,
    stable_int,
)

ONLINE_VERSION = 1
VAL_MAX, TEST_FRACTION = 5000, 0.2  # val: a tenth of the training data, at most VAL_MAX
#: The suites and their datasets as data: the papers' 8, 14 and 20 (RESISC45 is not in torchvision:
#: Country211 stands in).
_FILE = Path(__file__).with_name("online.json")


@dataclass(frozen=True)
class OnlineSpec:
    info: TaskInfo
    cls: str  # torchvision.datasets class
    train: tuple[Mapping, ...]  # constructor kwargs of the parts that make the training data
    test: tuple[Mapping, ...] | None  # None: hold out TEST_FRACTION of the training data
    how: str = ""  # how to get it by hand when torchvision cannot download it
    label_offset: int = 0  # added to torchvision's targets (EMNIST letters count from 1)
    transpose: bool = False  # EMNIST stores images transposed

    @property
    def params(self) -> dict:
        return {"version": ONLINE_VERSION, "cls": self.cls, "train": [dict(k) for k in self.train],
                "test": None if self.test is None else [dict(k) for k in self.test]}

    @property
    def key_params(self) -> dict:
        return {"task": self.info.name, **self.params}


def _spec(t: dict) -> OnlineSpec:
    """A task of ``online.json``; ``classes`` as a count stands for torchvision's names, read at load time."""
    classes = t["classes"]
    if isinstance(classes, int):
        classes = tuple(f"class {i}" for i in range(classes))
    cls = t["cls"]
    info = TaskInfo(name=t["name"], n_classes=len(classes), class_names=tuple(classes), domain=t["domain"],
                    source=f"torchvision.datasets.{cls}", description=f"torchvision {cls}, resized to 32x32 RGB.",
                    generator=f"torchvision:{cls}", sizes=MappingProxyType({}), online=True)
    test = None if t["test"] is None else tuple(t["test"])
    return OnlineSpec(info, cls, tuple(t["train"]), test, t.get("how", ""), t.get("label_offset", 0),
                      t.get("transpose", False))


_RAW = json.loads(_FILE.read_text(encoding="utf-8"))
ONLINE_SPECS: Mapping[str, OnlineSpec] = MappingProxyType({t["name"]: _spec(t) for t in _RAW["tasks"]})
ONLINE_TASKS: Mapping[str, TaskInfo] = MappingProxyType({k: s.info for k, s in ONLINE_SPECS.items()})
ONLINE_SUITES: dict[str, list[str]] = dict(_RAW["suites"])


# ---------------------------------------------------------------- conversion
def to_32px_rgb(img) -> np.ndarray:
    """A PIL image (or array) → 32×32×3 uint8: RGB, shorter side to 32 with antialiasing,
    centre crop."""
    if not isinstance(img, Image.Image):
        img = Image.fromarray(np.asarray(img))
    img = img.convert("RGB")
    w, h = img.size
    if (w, h) != (32, 32):
        s = 32 / min(w, h)
        nw, nh = max(32, round(w * s)), max(32, round(h * s))
        img = img.resize((nw, nh), Image.Resampling.BICUBIC, reducing_gap=3.0 if min(w, h) > 96 else None)
        left, top = (nw - 32) // 2, (nh - 32) // 2
        img = img.crop((left, top, left + 32, top + 32))
    return np.asarray(img, dtype=np.uint8)


def _open(spec: OnlineSpec, kwargs: Mapping, tv_root: Path, allow_download: bool):
    import torchvision.datasets as tvd

    cls = getattr(tvd, spec.cls)
    try:
        return cls(str(tv_root), download=allow_download, **kwargs)
    except TypeError:
        if allow_download:
            raise
        return cls(str(tv_root), **kwargs)  # classes without a download argument (FER2013)


def _convert(ds, spec: OnlineSpec) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for i in range(len(ds)):
        img, t = ds[i]
        if spec.transpose:
            img = Image.fromarray(np.asarray(img).T)
        xs.append(to_32px_rgb(img))
        ys.append(int(t) + spec.label_offset)
    x = np.stack(xs) if xs else np.zeros((0, 32, 32, 3), np.uint8)
    return x, np.asarray(ys, dtype=np.int64)


def _class_names(ds, spec: OnlineSpec) -> tuple[str, ...]:
    if not spec.info.class_names[0].startswith("class "):
        return spec.info.class_names
    names = getattr(ds, "classes", None)
    if names is not None and len(names) == spec.info.n_classes:
        return tuple(str(c) for c in names)
    return spec.info.class_names


def build_online(name: str, root: Path, allow_download: bool = False) -> tuple[dict[str, np.ndarray], dict]:
    """Open (or, if allowed, download) the torchvision dataset, convert, split; returns the
    arrays (NCHW) and a meta record."""
    spec = ONLINE_SPECS[name]
    tv_root = root / "torchvision"
    t0 = time.perf_counter()
    parts = {}
    names = None
    for part, kwlist in (("train", spec.train), ("test", spec.test or ())):
        xs, ys = [], []
        for kw in kwlist:
            try:
                ds = _open(spec, kw, tv_root, allow_download)
            except (RuntimeError, FileNotFoundError, OSError, ImportError) as e:
                if allow_download:
                    raise DataSourceError(f"{name}: torchvision.datasets.{spec.cls}({kw}) failed even with "
                                          f"allow_download=True: {e}. {spec.how}".strip()) from e
                raise DataSourceError(
                    f"{name}: torchvision.datasets.{spec.cls} found no data under {tv_root} ({e}). Pass "
                    f"allow_download=True to let torchvision download it there, or copy the files that "
                    f"torchvision.datasets.{spec.cls}(root={str(tv_root)!r}) expects. {spec.how}".strip()
                ) from e
            names = names or _class_names(ds, spec)
            x, y = _convert(ds, spec)
            xs.append(x)
            ys.append(y)
        if xs:
            parts[part] = (np.concatenate(xs), np.concatenate(ys))
    x_tr, y_tr = parts["train"]
    def perm(n, what):
        return np.random.Generator(np.random.PCG64(stable_int("online", what, name))).permutation(n)

    if spec.test is None:
        p = perm(len(y_tr), "test-holdout")
        n_test = int(round(TEST_FRACTION * len(y_tr)))
        te, tr = np.sort(p[:n_test]), np.sort(p[n_test:])
        parts["test"] = (x_tr[te], y_tr[te])
        x_tr, y_tr = x_tr[tr], y_tr[tr]
    p = perm(len(y_tr), "val")
    n_val = min(VAL_MAX, len(y_tr) // 10)
    va, tr = p[:n_val], p[n_val:]  # seeded order, so the first n rows are a random sample
    x_te, y_te = parts["test"]
    te = perm(len(y_te), "test-order")
    splits = {"train": (x_tr[tr], y_tr[tr]), "val": (x_tr[va], y_tr[va]), "test": (x_te[te], y_te[te])}
    arrays = {}
    for s in SPLITS:
        x, y = splits[s]
        arrays[f"x_{s}"] = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        arrays[f"y_{s}"] = y
    meta = {"params": spec.params, "class_names": list(names or spec.info.class_names),
            "seconds": round(time.perf_counter() - t0, 3),
            "digests": {s: digest_arrays(arrays[f"x_{s}"], arrays[f"y_{s}"]) for s in SPLITS}}
    return arrays, meta


def _cached(name: str, root: Path, allow_download: bool) -> tuple[dict[str, np.ndarray], dict]:
    spec = ONLINE_SPECS[name]
    path = cache_path(root, name, spec.key_params)
    if path.is_file():
        return load_npz(path)
    arrays, meta = build_online(name, root, allow_download)
    with contextlib.suppress(OSError):  # a read-only data folder
        save_npz(path, arrays, meta)
    return arrays, meta


def load_split(name: str, split: str, *, root: Path, allow_download: bool = False, n: int | None = None) -> TaskData:
    arrays, meta = _cached(name, root, allow_download)
    x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
    if n is not None:
        if n > len(y):
            raise InputError(f"task {name!r} has {len(y)} {split} images; n={n} asks for more")
        x, y = x[:n], y[:n]
    return TaskData(x=torch.from_numpy(np.ascontiguousarray(x)), y=torch.from_numpy(np.ascontiguousarray(y)),
                    class_names=tuple(meta.get("class_names") or ONLINE_SPECS[name].info.class_names),
                    name=name, split=split)
