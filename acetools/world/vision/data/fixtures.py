"""Small generated data for tests and the ``micro`` world: :func:`tiny_task` (in-memory gratings from a
seed, in milliseconds) and ``SUITES["tiny"]`` (three easy procedural tasks through ``load_split``, never cached).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
import torch

from ....errors import InputError
from . import patterns, scenes
from ._core import SPLIT_ID, TaskData, TaskInfo
from .registry import TaskSpec, procedural

__all__ = ["tiny_task", "FIXTURE_SPECS", "FIXTURE_TASKS", "FIXTURE_SUITES"]

TINY_SIZES = MappingProxyType({"train": 240, "val": 60, "test": 120})


def tiny_task(n_classes: int = 3, n: int = 60, seed: int = 0, split: str = "train", size: int = 32) -> TaskData:
    """``n`` gratings whose class is their orientation (``n_classes`` evenly spaced in 180°),
    random phase and contrast, a little noise; balanced classes, ``x`` uint8 [n, 3, size, size].
    The same ``(n_classes, n, seed, split)`` always gives the same bytes."""
    if n_classes < 2:
        raise InputError("n_classes must be >= 2")
    rng = np.random.default_rng([seed, SPLIT_ID.get(split, 3), n_classes, size])
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    c = np.arange(size) + 0.5 - size / 2
    xx, yy = np.meshgrid(c, c)
    theta = y * math.pi / n_classes + rng.uniform(-0.1, 0.1, n)
    phase = rng.uniform(0, 2 * math.pi, n)
    proj = xx[None] * np.cos(theta)[:, None, None] + yy[None] * np.sin(theta)[:, None, None]
    g = 0.5 + 0.4 * np.sin(2 * math.pi * proj / 6.0 + phase[:, None, None])
    img = g[:, None] * rng.uniform(0.5, 1.0, (n, 3, 1, 1)) + rng.normal(0, 0.03, (n, 3, size, size))
    x = np.clip(np.rint(img * 255), 0, 255).astype(np.uint8)
    return TaskData(x=torch.from_numpy(x), y=torch.from_numpy(y.astype(np.int64)),
                    class_names=tuple(f"{180 * k / n_classes:g} deg" for k in range(n_classes)),
                    name=f"tiny_task{n_classes}", split=split)


def _tiny_shapes(rng, label):
    return scenes.shapes_image(rng, shape=label, size=2)


_TINY_ORIENT = (0, 3, 6)  # indices into patterns.ORIENTATIONS: 0, 67.5, 135 degrees


def _tiny_orient(rng, label):
    return patterns.grating_image(rng, orient=_TINY_ORIENT[label], freq=2)


def _tiny_count(rng, label):
    return scenes.dots_image(rng, count=label, dot_size=2)


def _fixture(name, fn, classes, description) -> TaskSpec:
    info = TaskInfo(name=name, n_classes=len(classes), class_names=tuple(classes), domain="fixture",
                    source="procedural", description=description, generator=name, sizes=TINY_SIZES)
    return TaskSpec(info, procedural(name, fn, "label", len(classes)), {"version": 1}, cache=False)


FIXTURE_SPECS: Mapping[str, TaskSpec] = MappingProxyType({s.info.name: s for s in [
    _fixture("tiny_shapes", _tiny_shapes, scenes.SHAPES[:3], "large circle / triangle / square (test fixture)"),
    _fixture("tiny_orient", _tiny_orient, tuple(f"{patterns.ORIENTATIONS[i]:g} deg" for i in _TINY_ORIENT),
             "gratings at three orientations (test fixture)"),
    _fixture("tiny_count", _tiny_count, ("1", "2", "3"), "one to three large dots (test fixture)"),
]})
FIXTURE_TASKS: Mapping[str, TaskInfo] = MappingProxyType({k: s.info for k, s in FIXTURE_SPECS.items()})
FIXTURE_SUITES = {"tiny": list(FIXTURE_SPECS)}
