"""The image mini-world behind the world interface (:mod:`acetools.world.base`): a
:class:`~acetools.world.vision.zoo.Zoo` plus evaluation, ESM's and RegMean's inputs and the captured layers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...utils import make_generator
from ..base import WorldBase

__all__ = ["VisionWorld", "VISION_MATRICES"]

#: ESM's and RegMean's target matrices in the mini-world's ViT (open_clip names).
VISION_MATRICES = ("attn.in_proj_weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class VisionWorld(WorldBase):
    """A :class:`~acetools.world.vision.zoo.Zoo` as a world; ``zoo`` stays reachable for course code."""

    kind = "vision"
    layout = "open_clip"
    base_label = "base (frozen heads)"

    def __init__(self, zoo, *, batch_size: int = 512, threads: int | None = None):
        self.zoo = zoo
        self.batch_size, self.threads = batch_size, threads
        # the zoo's identity (fixed when the zoo is made; a duck-typed zoo may lack suite, mtl and device)
        self.tasks: list[str] = list(zoo.tasks)
        self.seed: int = zoo.seed
        self.size: str = zoo.size
        self.device: torch.device | str = getattr(zoo, "device", "cpu")
        self.suite: str | None = getattr(zoo, "suite", None)
        self.mtl: bool = getattr(zoo, "mtl", False)
        self.profile = "quick" if self.size in ("micro", "tiny") else "full"
        self.name = self.suite or "custom"

    def describe(self) -> str:
        return (f"vision mini-world {self.name!r}: {len(self.tasks)} tasks, ViT size {self.size}, "
                f"expert seed {self.seed}")

    def __repr__(self) -> str:
        return f"VisionWorld({self.zoo!r})"

    # states -------------------------------------------------------------------
    def base_state(self):
        return self.zoo.base_state()

    def expert_state(self, task: str):
        return self.zoo.expert_state(task)

    def mtl_state(self):
        return self.zoo.mtl_state()

    def records(self) -> list[dict]:
        return self.zoo.records()

    # evaluation ---------------------------------------------------------------
    def data(self, task: str, split: str, n: int | None = None):
        d = self.zoo.split(task, split)
        if n is None or n >= len(d.y):
            return d
        return SimpleNamespace(x=d.x[:n], y=d.y[:n], name=task, split=split)

    def correctness(self, state: Mapping[str, Tensor], split: str = "test", n: int | None = None,
                    tasks: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Per-example correctness per task, one encoder built for ``state`` (``world.base.PerExample``)."""
        from .finetune import correctness

        enc = self.zoo.encoder(state)
        return {t: correctness(enc, self.zoo.head(t), self.data(t, split, n), batch_size=self.batch_size,
                               threads=self.threads).numpy() for t in (tasks or self.tasks)}

    # data inputs --------------------------------------------------------------
    def matrix_keys(self) -> list[str]:
        return [k for k in self.base_state() if any(p in k for p in VISION_MATRICES)]

    def proxy_inputs(self, task: str, n: int, seed: int = 0) -> Tensor:
        """``n`` validation images of ``task`` drawn without replacement (docs/methods.md §ESM)."""
        d = self.zoo.split(task, "val")
        idx = torch.randperm(len(d.y), generator=make_generator(seed))[:n]
        return torch.as_tensor(np.asarray(d.x))[idx]

    def gram_examples(self, task: str, n: int) -> Tensor:
        return torch.as_tensor(np.asarray(self.zoo.split(task, "train").x[:n]))

    def layer_inputs(self, state: Mapping[str, Tensor], inputs: Any, keys: Sequence[str]) -> dict[str, Tensor]:
        from ...files.activations import capture_inputs

        return capture_inputs(self.zoo.encoder(state), inputs, list(keys))

    def gram_inputs(self, state: Mapping[str, Tensor], inputs: Any, keys: Sequence[str]) -> dict[str, Tensor]:
        from ...files.activations import gram_matrices

        return gram_matrices(self.zoo.encoder(state), inputs, list(keys), batch_size=128)
