"""The CLIP ViT-B/32 world (``"clip-vit-b32"``): the papers' own benchmark, for users with a GPU
(docs/clip-world.md): tasks, hub (models and datasets), data (preprocessing), models, world."""

from .tasks import BASE_ID, CLIP_SUITES, CLIP_TASKS

__all__ = ["BASE_ID", "CLIP_SUITES", "CLIP_TASKS", "ClipWorld"]


def __getattr__(name: str):
    if name == "ClipWorld":  # torch and transformers load only when the world is used
        from .world import ClipWorld

        return ClipWorld
    raise AttributeError(name)
