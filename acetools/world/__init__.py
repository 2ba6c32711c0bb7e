"""The worlds a benchmark runs on: vision (the mini-world), text (MiniLM), ...

The registry (:data:`WORLDS`, :func:`get_world`) names each world, the class that builds it
(``"module:attribute"``, imported only when the world is asked for, so listing worlds and
validating a command line stay light) and its suites:

- ``"vision"``: the image mini-world, :class:`acetools.world.vision.VisionWorld` around a
  :class:`~acetools.world.vision.zoo.Zoo` (suites of :data:`acetools.world.vision.data.SUITES`);
- ``"text"``: all-MiniLM-L6-v2 on offline text tasks, :class:`acetools.world.text.world.TextWorld`;
- ``"clip-vit-b32"``: the papers' CLIP ViT-B/32 with the public experts,
  :class:`acetools.world.clip.world.ClipWorld` (docs/clip-world.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

__all__ = ["WorldEntry", "WORLDS", "world_names", "world_suites", "get_world"]


@dataclass(frozen=True)
class WorldEntry:
    """One registered world: its class (``"module:attribute"``), its suites and one line about it."""

    name: str
    target: str
    suites: Callable[[], list[str]]
    default_suite: str
    about: str

    def load(self) -> Any:
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


def _vision_suites() -> list[str]:
    from .vision.data import SUITES

    return list(SUITES)


def _clip_suites() -> list[str]:
    from .clip.tasks import CLIP_SUITES  # JSON only: no torch

    return list(CLIP_SUITES)


WORLDS: dict[str, WorldEntry] = {
    "vision": WorldEntry("vision", "acetools.world.vision.world:VisionWorld", _vision_suites, "tasks8",
                         "the image mini-world (shipped ViT base, experts built and cached)"),
    # --- the text world (acetools/world/text), imported lazily
    "text": WorldEntry("text", "acetools.world.text.world:TextWorld", lambda: [*_text_suites(), "fixture"], "text8",
                       "all-MiniLM-L6-v2 on offline text tasks (fixture: profile='quick')"),
    "clip-vit-b32": WorldEntry("clip-vit-b32", "acetools.world.clip.world:ClipWorld", _clip_suites, "clip8",
                               "CLIP ViT-B/32 and the public fine-tuned experts (the papers' setting; a GPU)"),
}


def world_names() -> list[str]:
    return list(WORLDS)


def _entry(name: str) -> WorldEntry:
    if name not in WORLDS:
        raise InputError(f"unknown world {name!r}; valid: {', '.join(WORLDS)}")
    return WORLDS[name]


def world_suites(name: str) -> list[str]:
    """The suites of world ``name`` (ValueError naming the valid worlds for an unknown one)."""
    return _entry(name).suites()


def get_world(name: str, suite: str | None = None, seed: int = 0, **options: Any):
    """World ``name`` on ``suite`` (default: the world's first) with expert seed ``seed``.

    ``options`` go to the world's class: for ``"vision"`` to :class:`~acetools.world.vision.zoo.Zoo`
    (``size``, ``root``, ``mtl``, ...; the zoo is wrapped in a VisionWorld, not built: call
    ``world.zoo.build()``), for ``"text"`` to ``TextWorld`` (``profile``, ``root``, ``device``, ...),
    for ``"clip-vit-b32"`` to :class:`~acetools.world.clip.world.ClipWorld` (``models_root``,
    ``data_root``, ``n_test``, ``n_val``, ``device``, ``tasks``, ...).
    """
    entry = _entry(name)
    suite = entry.default_suite if suite is None else suite
    suites = entry.suites()
    if suite not in suites:
        raise InputError(f"unknown suite {suite!r} for world {name!r}; valid: {', '.join(suites)}")
    if name == "text" and suite == "fixture":
        options.setdefault("profile", "quick")
    if name == "vision":
        from .vision.world import VisionWorld
        from .vision.zoo import Zoo

        return VisionWorld(Zoo(suite, seed=seed, **options))
    return entry.load()(suite, seed, **options)


def _text_suites() -> list[str]:
    from .text.tasks import SUITES

    return list(SUITES)
