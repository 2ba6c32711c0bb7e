"""Contact sheets: look at a task's images, one row per class, before trusting its numbers."""

from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image, ImageDraw

__all__ = ["contact_sheet", "save_contact_sheet"]


def contact_sheet(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, class_names=None,
                  per_class: int = 12, scale: int = 3, label_width: int = 90) -> Image.Image:
    """A PIL image: for each class, its first ``per_class`` images (``x`` uint8 [N,3,H,W]),
    enlarged ``scale``× with nearest-neighbour, the class name on the left."""
    x = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    y = y.numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    n_classes = int(y.max()) + 1 if class_names is None else len(class_names)
    names = [str(c) for c in (class_names or range(n_classes))]
    h, w = x.shape[2] * scale, x.shape[3] * scale
    pad = 2
    sheet = Image.new("RGB", (label_width + per_class * (w + pad), n_classes * (h + pad)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for c in range(n_classes):
        idx = np.flatnonzero(y == c)[:per_class]
        top = c * (h + pad)
        draw.text((2, top + h // 2 - 6), names[c][:14], fill=(0, 0, 0))
        for j, i in enumerate(idx):
            tile = Image.fromarray(x[i].transpose(1, 2, 0)).resize((w, h), Image.Resampling.NEAREST)
            sheet.paste(tile, (label_width + j * (w + pad), top))
    return sheet


def save_contact_sheet(data, path: str | os.PathLike, per_class: int = 12, scale: int = 3) -> str:
    """Save the contact sheet of a :class:`~acetools.world.vision.data.TaskData` as a PNG; returns the path."""
    contact_sheet(data.x, data.y, data.class_names, per_class=per_class, scale=scale).save(path)
    return str(path)
