"""Small generated data for tests and the ``micro`` world: ``SUITES["tiny"]``, three easy procedural tasks
through ``load_split``, never cached."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from . import patterns, scenes
from ._core import TaskInfo
from .registry import TaskSpec, procedural

__all__ = ["FIXTURE_SPECS", "FIXTURE_TASKS", "FIXTURE_SUITES"]

TINY_SIZES = MappingProxyType({"train": 240, "val": 60, "test": 120})
_TINY_ORIENT = (0, 3, 6)  # indices into patterns.ORIENTATIONS: 0, 67.5, 135 degrees


def _fixture(name, fn, classes, description) -> TaskSpec:
    info = TaskInfo(name=name, n_classes=len(classes), class_names=tuple(classes), domain="fixture",
                    source="procedural", description=description, generator=name, sizes=TINY_SIZES)
    return TaskSpec(info, procedural(name, fn, "label", len(classes)), {"version": 1}, cache=False)


FIXTURE_SPECS: Mapping[str, TaskSpec] = MappingProxyType({s.info.name: s for s in [
    _fixture("tiny_shapes", lambda rng, label: scenes.shapes_image(rng, shape=label, size=2), scenes.SHAPES[:3],
             "large circle / triangle / square (test fixture)"),
    _fixture("tiny_orient", lambda rng, label: patterns.grating_image(rng, orient=_TINY_ORIENT[label], freq=2),
             tuple(f"{patterns.ORIENTATIONS[i]:g} deg" for i in _TINY_ORIENT),
             "gratings at three orientations (test fixture)"),
    _fixture("tiny_count", lambda rng, label: scenes.dots_image(rng, count=label, dot_size=2), ("1", "2", "3"),
             "one to three large dots (test fixture)"),
]})
FIXTURE_TASKS: Mapping[str, TaskInfo] = MappingProxyType({k: s.info for k, s in FIXTURE_SPECS.items()})
FIXTURE_SUITES = {"tiny": list(FIXTURE_SPECS)}
