"""The CLIP ViT-B/32 world (``"clip-vit-b32"``): the papers' own benchmark, for users with a GPU.

:mod:`.tasks` (FusionBench's task table as data), :mod:`.hub` (models and datasets: the
Hugging Face caches, ``--models-root`` / ``--data-root``), :mod:`.data` (CLIP preprocessing,
image cache), :mod:`.models` (HF CLIP, zero-shot heads, the open_clip checkpoint layout) and
:mod:`.world` (:class:`ClipWorld`). docs/clip-world.md says how to run it.
"""

from .tasks import BASE_ID, CLIP_SUITES, CLIP_TASKS

__all__ = ["BASE_ID", "CLIP_SUITES", "CLIP_TASKS", "ClipWorld"]


def __getattr__(name: str):
    if name == "ClipWorld":  # torch and transformers load only when the world is used
        from .world import ClipWorld

        return ClipWorld
    raise AttributeError(name)
