"""The pretraining pool: images for the base model, disjoint from every task's val and test, labelled
with heads related to but not the same as the tasks' labels (docs/vision-world.md §The pretraining pool).
"""

from __future__ import annotations

import contextlib
import os
import string
import time

import numpy as np
import torch

from ....errors import InputError
from . import glyphs, patterns, scenes
from . import sources as _src
from ._core import (
    PretrainData,
    SampleStream,
    balanced_labels,
    cache_path,
    data_root,
    digest_arrays,
    load_npz,
    save_npz,
    stable_int,
    to_tensor_images,
)
from .registry import animal_partition, fashion_partition

__all__ = ["pretraining_pool", "POOL_SOURCES", "POOL_VERSION"]

POOL_VERSION = 3
POOL_SOURCES: tuple[str, ...] = ("fashion", "animals", "glyphs", "polygons", "counting", "textures")
GLYPHS62: tuple[str, ...] = tuple(string.ascii_letters + string.digits)
# The glyphs are labelled by typeface, not by character: with a character head (all 62, or
# only the 18 letters no task uses) the base's class-prototype heads already solved the
# glyph tasks in the proxy calibration (letters 91 %, symbols 97 %); with the typeface head
# they sit near the no-glyph level (see acetools/world/vision/data/CALIBRATION.md).
TYPEFACES: dict[str, tuple[str, ...]] = glyphs.POOL_TYPEFACES
FASHION_COARSE = ("top", "long", "footwear", "bag")
_FASHION_TO_COARSE = np.array([0, 1, 0, 1, 0, 2, 0, 2, 3, 2])  # T-shirt, trouser, pullover, dress, coat, ...
ANIMAL_COARSE = ("bird", "hoofed", "carnivore", "elephant")
_ANIMAL_TO_COARSE = np.array([2, 0, 2, 1, 2, 3, 1, 1, 1, 1])  # bear, bird, cat, cow, dog, elephant, giraffe, ...

HEADS: dict[str, tuple[str, ...]] = {
    "domain": POOL_SOURCES,
    "fashion_coarse": FASHION_COARSE,
    "animal_coarse": ANIMAL_COARSE,
    "typeface": tuple(TYPEFACES),
    "polygon": tuple(f"{k}-gon" for k in scenes.POLYGON_SIDES),
    "coarse_count": scenes.COARSE_COUNTS,
    "texture_pool": patterns.POOL_TEXTURES,
}
_SOURCE_HEAD = {"fashion": "fashion_coarse", "animals": "animal_coarse", "glyphs": "typeface", "polygons": "polygon",
                "counting": "coarse_count", "textures": "texture_pool"}


def _procedural(source: str, n: int, seed: int, root) -> tuple[np.ndarray, np.ndarray]:
    n_classes = len(HEADS[_SOURCE_HEAD[source]])
    stream = stable_int("acetools.pool", POOL_VERSION, source, seed)
    labels = balanced_labels(stream, n, n_classes)
    ss = SampleStream(stable_int("acetools.pool", POOL_VERSION, source, seed, "samples"))
    if source == "glyphs":
        paths = [glyphs.resolve_fonts(fonts, root) for fonts in TYPEFACES.values()]
        imgs = []
        for i, c in enumerate(labels):
            rng = ss.rng(i)
            ch = GLYPHS62[int(rng.integers(len(GLYPHS62)))]
            imgs.append(glyphs.glyph_image(rng, ch, paths[c], size=(18.0, 28.0), max_angle=15.0))
    else:
        fn = {"polygons": scenes.polygon_image, "counting": scenes.squares_count_image,
              "textures": patterns.pool_texture_image}[source]
        imgs = [fn(ss.rng(i), int(c)) for i, c in enumerate(labels)]
    return np.stack(imgs), labels


def _real(source: str, n: int, seed: int, root, allow_download: bool) -> tuple[np.ndarray, np.ndarray]:
    part = fashion_partition(root, allow_download) if source == "fashion" else animal_partition(root)
    idx = np.concatenate(part["pool"]) if isinstance(part["pool"], list) else part["pool"]
    rng = np.random.Generator(np.random.PCG64(stable_int("acetools.pool", POOL_VERSION, source, seed)))
    idx = idx[rng.permutation(len(idx))][:n]
    coarse = _FASHION_TO_COARSE if source == "fashion" else _ANIMAL_TO_COARSE
    return _src.pad28(part["x"][idx]), coarse[part["y"][idx]]


def pretraining_pool(*, root: str | os.PathLike | None = None, seed: int = 0, n_per_source: int = 5000,
                     allow_download: bool = False, sources: tuple[str, ...] = POOL_SOURCES) -> PretrainData:
    """The pool: ``n_per_source`` images per source (Animal-MNIST gives at most its ~4,200 spare ones),
    shuffled with ``seed``, cached like the tasks; ``labels[head]`` is -1 where a head does not apply."""
    unknown = set(sources) - set(POOL_SOURCES)
    if unknown:
        raise InputError(f"unknown pool sources {sorted(unknown)}; known: {POOL_SOURCES}")
    root_p = data_root(root)
    params = {"version": POOL_VERSION, "seed": seed, "n_per_source": n_per_source, "sources": list(sources)}
    path = cache_path(root_p, "pool", params)
    if path.is_file():
        arrays, _ = load_npz(path)
    else:
        t0 = time.perf_counter()
        xs, src, heads = [], [], {h: [] for h in HEADS}
        for source in sources:
            if source in ("fashion", "animals"):
                x, lab = _real(source, n_per_source, seed, root_p, allow_download)
            else:
                x, lab = _procedural(source, n_per_source, seed, root_p)
            x = to_tensor_images(x).numpy()
            xs.append(x)
            src.append(np.full(len(x), POOL_SOURCES.index(source), dtype=np.int64))
            for h in HEADS:
                if h == "domain":
                    heads[h].append(src[-1])
                elif h == _SOURCE_HEAD[source]:
                    heads[h].append(lab.astype(np.int64))
                else:
                    heads[h].append(np.full(len(x), -1, dtype=np.int64))
        order = np.random.Generator(np.random.PCG64(stable_int("acetools.pool.order", seed))).permutation(
            sum(len(x) for x in xs))
        arrays = {"x": np.concatenate(xs)[order], "source": np.concatenate(src)[order]}
        for h in HEADS:
            arrays[f"label_{h}"] = np.concatenate(heads[h])[order]
        meta = {"params": params, "seconds": round(time.perf_counter() - t0, 3),
                "digest": digest_arrays(arrays["x"])}
        with contextlib.suppress(OSError):  # a read-only data folder
            save_npz(path, arrays, meta)
    used_heads = ["domain"] + [_SOURCE_HEAD[s] for s in sources]
    return PretrainData(x=torch.from_numpy(arrays["x"]),
                        labels={h: torch.from_numpy(arrays[f"label_{h}"]) for h in used_heads},
                        head_classes={h: len(HEADS[h]) for h in used_heads},
                        head_class_names={h: HEADS[h] for h in used_heads},
                        source=torch.from_numpy(arrays["source"]), sources=POOL_SOURCES)
