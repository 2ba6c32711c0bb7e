"""The worlds a benchmark runs on, by name (:data:`WORLDS`, :func:`get_world`): ``"vision"`` (the image
mini-world, docs/vision-world.md), ``"text"`` (all-MiniLM-L6-v2, docs/text-world.md) and
``"clip-vit-b32"`` (the papers' CLIP ViT-B/32, docs/clip-world.md). Each entry names its class and its
suites as ``"module:attribute"``, imported only when asked for, so listing worlds stays light.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

__all__ = ["WorldEntry", "WORLDS", "world_suites", "get_world"]


@dataclass(frozen=True)
class WorldEntry:
    """One registered world: its class and its suite table (``"module:attribute"``), default and extra suites."""

    target: str
    suite_table: str
    default_suite: str
    extra_suites: tuple[str, ...] = ()

    def load(self) -> Any:
        return _resolve(self.target)

    def suites(self) -> list[str]:
        return [*_resolve(self.suite_table), *self.extra_suites]


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


WORLDS: dict[str, WorldEntry] = {
    "vision": WorldEntry("acetools.world.vision.zoo:Zoo", "acetools.world.vision.data:SUITES", "tasks8"),
    "text": WorldEntry("acetools.world.text.world:TextWorld", "acetools.world.text.tasks:SUITES", "text8",
                       ("fixture",)),
    "clip-vit-b32": WorldEntry("acetools.world.clip.world:ClipWorld", "acetools.world.clip.tasks:CLIP_SUITES", "clip8"),
}


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
    (``size``, ``root``, ``mtl``, ...; not built: call ``world.build()``), for ``"text"`` to ``TextWorld``
    (``profile``, ``root``, ``device``, ...), for ``"clip-vit-b32"`` to
    :class:`~acetools.world.clip.world.ClipWorld` (``models_root``, ``data_root``, ``n_test``, ``n_val``,
    ``device``, ``tasks``, ...).
    """
    entry = _entry(name)
    suite = entry.default_suite if suite is None else suite
    suites = entry.suites()
    if suite not in suites:
        raise InputError(f"unknown suite {suite!r} for world {name!r}; valid: {', '.join(suites)}")
    if name == "text" and suite == "fixture":
        options.setdefault("profile", "quick")
    return entry.load()(suite, seed=seed, **options)
