"""Helpers the merge tests share: experts made by perturbing a model, and random data inputs (RegMean's Grams,
ESM's proxy activations) for the methods that declare them."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping

import torch


def perturbed(model, seed: int, scale: float = 0.02):
    """A copy of ``model`` with N(0, scale²) added to every parameter (generator seeded with ``seed``)."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return m


def random_data_inputs(method: str, widths: Mapping[str, int], layout_name: str, n_tasks: int) -> dict:
    """Random Grams (RegMean) or proxy activations (ESM's target keys) for every matrix key of ``widths``
    (key -> d_in, as ``nn.Linear`` stores it), for whatever ``method`` declares; ``{}`` for the others."""
    from acetools.merging import METHODS

    g = torch.Generator().manual_seed(5)
    info = METHODS[method]
    out: dict = {}
    if "grams" in info.data_inputs:
        out["grams"] = [{k: (X := torch.randn(3 * d, d, generator=g)).T @ X / (3 * d) for k, d in widths.items()}
                        for _ in range(n_tasks)]
    if "activations" in info.data_inputs:
        targets = info.resolve({}, layout=layout_name)["targets"]
        out["activations"] = {k: [torch.randn(12, d, generator=g) for _ in range(n_tasks)] for k, d in widths.items()
                              if any(re.search(p, k) for p in targets)}
    return out
