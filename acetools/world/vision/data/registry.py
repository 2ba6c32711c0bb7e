"""The offline task registry: every task's :class:`TaskInfo` and the prefix-stable function that builds
it from ``(split, n, root, allow_download)``; the suites ``tasks8`` / ``tasks14`` / ``tasks20``
(docs/vision-world.md §The tasks)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from . import glyphs, patterns, scenes, sources
from ._core import SampleStream, TaskInfo, balanced_labels, stable_int
from .render import paint

VERSION = 3  # bump when any builder's bytes change (it keys the cache)

Builder = Callable[[str, int, Path, bool], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class TaskSpec:
    info: TaskInfo
    build: Builder = field(repr=False)
    params: Mapping = field(default_factory=dict)  # everything that shapes the bytes
    cache: bool = True


def _stream(name: str, split: str, *extra) -> int:
    # "acetools.data" is part of the seed (the data on disk), not a module path: it stays as it is
    return stable_int("acetools.data", VERSION, name, split, *extra)


# ---------------------------------------------------------------- builders
def _sampled(name: str, n_classes: int, image: Callable, setup: Callable[[Path], Any] = lambda root: None) -> Builder:
    """Balanced labels; sample ``i`` is ``image(rng_i, label, setup(root))`` with its own generator."""

    def build(split: str, n: int, root: Path, allow_download: bool):
        ctx = setup(root)
        labels = balanced_labels(_stream(name, split), n, n_classes)
        ss = SampleStream(_stream(name, split, "samples"))
        x = np.stack([image(ss.rng(i), int(c), ctx) for i, c in enumerate(labels)]) \
            if n else np.zeros((0, 32, 32, 3), np.uint8)
        return x, labels

    return build


def procedural(name: str, image_fn: Callable, factor: str, n_classes: int, **fixed) -> Builder:
    """Label = the class index of ``factor`` of ``image_fn``; the other factors are random."""
    return _sampled(name, n_classes, lambda rng, c, _: image_fn(rng, **{factor: c}, **fixed))


def glyph_task(name: str, chars: tuple[str, ...], fonts: tuple[str, ...], **kw) -> Builder:
    return _sampled(name, len(chars), lambda rng, c, paths: glyphs.glyph_image(rng, chars[c], paths, **kw),
                    lambda root: glyphs.resolve_fonts(fonts, root))


QUARTER_TURNS: tuple[str, ...] = ("0", "90", "180", "270")
TURNED_LETTERS: tuple[str, ...] = tuple("KLPQRTUVWY")  # no rotational symmetry, no two alike when turned


def turned_letter_image(rng: np.random.Generator, paths: tuple[str, ...], letter: int | None = None,
                        turn: int | None = None) -> np.ndarray:
    """A letter of :data:`TURNED_LETTERS` turned by a quarter-turn multiple (plus ±8°)."""
    letter = int(rng.integers(len(TURNED_LETTERS))) if letter is None else letter
    turn = int(rng.integers(4)) if turn is None else turn
    path = paths[int(rng.integers(len(paths)))]
    alpha = glyphs.glyph_alpha(TURNED_LETTERS[letter], path, rng.uniform(22.0, 28.0),
                               90.0 * turn + rng.uniform(-8, 8), *rng.uniform(-2.5, 2.5, 2),
                               aspect=rng.uniform(0.9, 1.1))
    return paint(alpha, rng)


def turned_task(name: str, factor: str, n_classes: int) -> Builder:
    return _sampled(name, n_classes, lambda rng, c, paths: turned_letter_image(rng, paths, **{factor: c}),
                    lambda root: glyphs.resolve_fonts(glyphs.TASK_FONTS, root))


# -- real sources ---------------------------------------------------------------------------
# Fashion-MNIST: "Shirt" is dropped (at 28 px it is not separable from T-shirt, pullover
# and coat even for people) and pullover + coat are one class; see the calibration notes.
FASHION_TASK_CLASSES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("T-shirt/top", (0,)), ("Trouser", (1,)), ("Pullover/Coat", (2, 4)), ("Dress", (3,)),
    ("Sandal", (5,)), ("Sneaker", (7,)), ("Bag", (8,)), ("Ankle boot", (9,)),
)
FASHION_PER_CLASS = {"train": 625, "val": 63, "test": 125}
ANIMAL_PER_CLASS = {"train": 400, "val": 50, "test": 100}
DIGIT_FRACTIONS = {"train": 0.7, "val": 0.1, "test": 0.2}


@functools.lru_cache(maxsize=2)
def fashion_partition(root: Path, allow_download: bool) -> dict:
    """Task train/val from official train, task test from official test, per task class;
    ``pool`` = the official-train images in no task split (all ten original classes)."""
    f = sources.fashion_mnist(root, allow_download)
    n_test = len(f["test_y"])
    x_all = np.concatenate([f["test_x"], f["train_x"]])
    y_all = np.concatenate([f["test_y"], f["train_y"]])
    keep = sources.dedupe(x_all, y_all)
    test_idx, train_idx = keep[keep < n_test], keep[keep >= n_test]
    task_y = np.full(len(y_all), -1)
    for c, (_, members) in enumerate(FASHION_TASK_CLASSES):
        task_y[np.isin(y_all, members)] = c
    tr = sources.partition(task_y, train_idx[task_y[train_idx] >= 0],
                           {"train": FASHION_PER_CLASS["train"], "val": FASHION_PER_CLASS["val"]}, "fashion/train")
    te = sources.partition(task_y, test_idx[task_y[test_idx] >= 0], {"test": FASHION_PER_CLASS["test"]}, "fashion/test")
    used = np.concatenate([np.concatenate(tr[k]) for k in ("train", "val")])
    pool = np.setdiff1d(train_idx, used)
    return {"x": x_all, "y": y_all, "train": tr["train"], "val": tr["val"], "test": te["test"], "pool": pool}


def real_builder(name: str, partition: Callable[[Path, bool], dict], n_classes: int) -> Builder:
    """Balanced labels; the k-th image of a class is the k-th of that class in ``partition``'s split."""

    def build(split: str, n: int, root: Path, allow_download: bool):
        part = partition(root, allow_download)
        labels = balanced_labels(_stream(name, split), n, n_classes)
        idx = sources.take_balanced(part[split], labels, cycle=False)
        return sources.pad28(part["x"][idx]), labels

    return build


@functools.lru_cache(maxsize=2)
def animal_partition(root: Path) -> dict:
    a = sources.animal_mnist(root)
    keep = sources.dedupe(a["x"], a["y"])
    parts = sources.partition(a["y"], keep, {**ANIMAL_PER_CLASS, "pool": -1}, "animals")
    return {"x": a["x"], "y": a["y"], **parts}


@functools.lru_cache(maxsize=1)
def digit_partition() -> dict:
    d = sources.sklearn_digits()
    keep = sources.dedupe(d["x"], d["y"])
    return {"x": d["x"], "y": d["y"], **sources.partition(d["y"], keep, DIGIT_FRACTIONS, "sklearn-digits")}


def handwritten_builder(name: str, n_classes: int, digit_of: Callable[[int, int], int]) -> Builder:
    """Augmented scikit-learn digits; each split draws only on its own source images.

    Sample ``i`` first draws ``pick`` in 0..4, its digit is ``digit_of(label, pick)`` (the
    label itself for ``digits``, ``2 * pick + label`` for ``parity``), and the k-th sample
    of a digit uses the k-th source image of that digit in the split (cycling).
    """

    def build(split: str, n: int, root: Path, allow_download: bool):
        part = digit_partition()
        labels = balanced_labels(_stream(name, split), n, n_classes)
        ss = SampleStream(_stream(name, split, "samples"))
        per_digit = part[split]
        counters = np.zeros(10, dtype=np.int64)
        out = []
        for i, c in enumerate(labels):
            rng = ss.rng(i)
            d = digit_of(int(c), int(rng.integers(5)))
            members = per_digit[d]
            src = members[counters[d] % len(members)]
            counters[d] += 1
            out.append(sources.handwritten_digit(rng, part["x"][src]))
        return (np.stack(out) if out else np.zeros((0, 32, 32), np.uint8)), labels

    return build


# ---------------------------------------------------------------- the registry
def _info(name, classes, domain, source, description, generator, conflicts=(), sizes=None) -> TaskInfo:
    kw: dict[str, Any] = {"sizes": MappingProxyType(dict(sizes))} if sizes else {}
    return TaskInfo(name=name, n_classes=len(classes), class_names=tuple(classes), domain=domain, source=source,
                    description=description, conflicts_with=tuple(conflicts), generator=generator, **kw)


def _specs() -> dict[str, TaskSpec]:
    S = scenes
    P = patterns
    G = glyphs
    digits10 = tuple(str(d) for d in range(10))
    specs: list[TaskSpec] = []

    def add(info: TaskInfo, build: Builder, **params):
        specs.append(TaskSpec(info, build, {"version": VERSION, **params}))

    # real images
    add(_info("fashion", [c for c, _ in FASHION_TASK_CLASSES], "clothing photos", "fashion-mnist",
              "Fashion-MNIST, 28 px grey padded to 32; Shirt dropped, Pullover+Coat merged (8 classes).",
              "fashion-mnist"), real_builder("fashion", fashion_partition, len(FASHION_TASK_CLASSES)),
        classes=FASHION_TASK_CLASSES, per_class=FASHION_PER_CLASS)
    add(_info("animals", sources.ANIMAL_CLASSES, "animal silhouettes", "animal-mnist",
              "Animal-MNIST silhouettes (PyPI animal-mnist data files), 28 px padded to 32.", "animal-mnist",
              sizes={"train": 4000, "val": 500, "test": 1000}),
        real_builder("animals", lambda root, _: animal_partition(root), len(sources.ANIMAL_CLASSES)),
        per_class=ANIMAL_PER_CLASS)
    add(_info("digits", digits10, "handwriting", "sklearn-digits",
              "scikit-learn's 8x8 handwritten digits upsampled to 32 px with random scale, rotation, shear and "
              "shift; train/val/test use disjoint source images (70/10/20 %).", "handwritten", conflicts=("parity",)),
        handwritten_builder("digits", 10, lambda c, pick: c), fractions=DIGIT_FRACTIONS)
    add(_info("parity", ("even", "odd"), "handwriting", "sklearn-digits",
              "The `digits` images labelled by parity of the digit (a label-changing transform).", "handwritten",
              conflicts=("digits",)),
        handwritten_builder("parity", 2, lambda c, pick: 2 * pick + c), fractions=DIGIT_FRACTIONS)

    # glyphs
    glyph_defs = [
        ("letters", tuple("ABCDEFGHIJ"), G.TASK_FONTS, "printed capitals A-J"),
        ("lowercase", tuple("abcdefghij"), G.TASK_FONTS, "printed lowercase a-j"),
        ("numerals", digits10, G.TASK_FONTS, "printed digits 0-9 (same labels as `digits`, another style)"),
        ("greek", tuple("αβγδθλπσφω"), G.UNICODE_FONTS, "printed Greek lowercase letters (never in the pool)"),
        ("symbols", tuple("+×÷=#%&@$?"), G.UNICODE_FONTS, "printed symbols (never in the pool)"),
    ]
    for name, chars, fonts, what in glyph_defs:
        add(_info(name, chars, "glyphs", "matplotlib-fonts",
                  f"{what} in {len(fonts)} matplotlib fonts, random size, aspect, rotation (±10°), shift, colours.",
                  f"glyphs:{name}"),
            glyph_task(name, chars, fonts), chars=chars, fonts=fonts)
    add(_info("rotation", tuple(f"{t} deg" for t in QUARTER_TURNS), "glyphs", "matplotlib-fonts",
              f"Capitals {''.join(TURNED_LETTERS)} turned by 0/90/180/270° (±8°), labelled by the turn.",
              "turned-letters", conflicts=("turned",)), turned_task("rotation", "turn", 4), letters=TURNED_LETTERS)
    add(_info("turned", TURNED_LETTERS, "glyphs", "matplotlib-fonts",
              "The `rotation` images labelled by the letter (a label-changing transform).", "turned-letters",
              conflicts=("rotation",)), turned_task("turned", "letter", len(TURNED_LETTERS)), letters=TURNED_LETTERS)

    # shapes
    shape_tasks = {"shapes": ("shape", S.SHAPES, "one filled shape; labelled by its shape"),
                   "size": ("size", S.SIZE_NAMES, "the `shapes` images labelled by the shape's circumradius "
                            f"(bins {S.SIZE_BINS} px)"),
                   "position": ("quadrant", S.QUADRANTS, "the `shapes` images labelled by the quadrant of the "
                                "shape's centroid (at least 2 px off each mid-line)")}
    dot_tasks = {"count": ("count", tuple(str(c) for c in S.COUNTS), "1-6 non-overlapping dots; labelled by count"),
                 "dotsize": ("dot_size", S.SIZE_NAMES,
                             f"the `count` images labelled by dot radius (bins {S.DOT_BINS} px)")}
    # patterns
    grating_tasks = {"orient": ("orient", tuple(f"{o:g} deg" for o in P.ORIENTATIONS),
                                "sine gratings; labelled by orientation (8 classes 22.5° apart, ±4° jitter)"),
                     "freq": ("freq", tuple(f"{p:g} px" for p in P.PERIODS),
                              "the `orient` images labelled by period (4 classes, ratio 1.5, ±6 % jitter)")}
    texture_tasks = {"texture": ("family", P.TEXTURES, "textures; labelled by family"),
                     "texscale": ("scale", P.SCALE_NAMES,
                                  f"the `texture` images labelled by period (bins {P.SCALE_BINS} px)")}
    # tasks that label one generator's images by different factors: (domain, generator, image function,
    # what else is random, the generator's parameters, {task: (factor, classes, what)})
    for domain, gen, image, rest, params, group in (
            ("geometry", "shapes", S.shapes_image, "colours, rotation", {"shapes": S.SHAPES, "size_bins": S.SIZE_BINS},
             shape_tasks),
            ("counting", "dots", S.dots_image, "colours", {"counts": S.COUNTS, "dot_bins": S.DOT_BINS}, dot_tasks),
            ("gratings", "gratings", P.grating_image, "phase, colours",
             {"orientations": P.ORIENTATIONS, "periods": P.PERIODS}, grating_tasks),
            ("textures", "textures", P.texture_image, "rotation, offset, colours",
             {"families": P.TEXTURES, "scale_bins": P.SCALE_BINS}, texture_tasks)):
        for name, (factor, classes, what) in group.items():
            add(_info(name, classes, domain, "procedural", f"{what}; random {rest}, noise.", gen,
                      conflicts=tuple(k for k in group if k != name)),
                procedural(name, image, factor, len(classes)), **params)
    return {s.info.name: s for s in specs}


SPECS: Mapping[str, TaskSpec] = MappingProxyType(_specs())
TASKS: Mapping[str, TaskInfo] = MappingProxyType({k: s.info for k, s in SPECS.items()})

_T8 = ["fashion", "animals", "digits", "letters", "shapes", "orient", "count", "texture"]
_T14 = _T8 + ["size", "freq", "parity", "dotsize", "numerals", "lowercase"]
_T20 = _T14 + ["position", "texscale", "rotation", "turned", "greek", "symbols"]
OFFLINE_SUITES = {"tasks8": _T8, "tasks14": _T14, "tasks20": _T20}
