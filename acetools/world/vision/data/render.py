"""Drawing helpers of the procedural generators: a coverage mask drawn at ``SUPERSAMPLE``× and
box-filtered to 32 px, painted with a foreground over a background colour (random, with a minimum
luminance contrast, so colour carries no label), plus a little pixel noise.
"""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image, ImageDraw

from ._core import IMAGE_SIZE

SUPERSAMPLE = 4
BIG = IMAGE_SIZE * SUPERSAMPLE

_LUMA = np.array([0.299, 0.587, 0.114])


def random_colours(rng: np.random.Generator, min_contrast: float = 70.0) -> tuple[np.ndarray, np.ndarray]:
    """Foreground and background RGB colours (float, 0–255) whose luminances differ by at
    least ``min_contrast``. Either may be the brighter one."""
    for _ in range(8):
        fg, bg = rng.uniform(0, 255, (2, 16, 3))
        ok = np.flatnonzero(np.abs((fg - bg) @ _LUMA) >= min_contrast)
        if len(ok):
            return fg[ok[0]], bg[ok[0]]
    bg = rng.uniform(0, 80, 3)  # pragma: no cover - 128 misses in a row is vanishingly rare
    return 255.0 - bg, bg


def composite(alpha: np.ndarray, fg: np.ndarray, bg: np.ndarray, rng: np.random.Generator | None = None,
              noise: float = 0.0) -> np.ndarray:
    """``alpha`` (HxW, 0..1) painted with ``fg`` over ``bg``; Gaussian pixel noise of std
    ``noise`` (0–255 scale); returns HxWx3 uint8."""
    a = alpha.astype(np.float32)[..., None]
    img = bg.astype(np.float32) + a * (fg - bg).astype(np.float32)
    if noise > 0 and rng is not None:
        # luminance noise: one value per pixel, the same in the three channels
        img += np.float32(noise) * rng.standard_normal(img.shape[:2], dtype=np.float32)[..., None]
    np.clip(img, 0, 255, out=img)
    return np.rint(img, out=img).astype(np.uint8)


def paint(alpha: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``alpha`` in :func:`random_colours` with luminance noise of a random std in [0, 8)."""
    fg, bg = random_colours(rng)
    return composite(alpha, fg, bg, rng, noise=rng.uniform(0, 8))


def new_mask() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """A black ``BIG``×``BIG`` 8-bit mask and a drawing context for it."""
    m = Image.new("L", (BIG, BIG), 0)
    return m, ImageDraw.Draw(m)


def downsample(mask: Image.Image) -> np.ndarray:
    """Box-filter a supersampled mask to ``IMAGE_SIZE`` px; float coverage in ``[0, 1]``."""
    small = mask.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float64) / 255.0


@functools.lru_cache(maxsize=8)
def pixel_grid(supersample: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates (x, y) in 32-px units, origin at the image centre;
    ``supersample`` > 1 gives a finer grid to average down with :func:`box_reduce`."""
    s = supersample
    c = (np.arange(IMAGE_SIZE * s) + 0.5) / s - IMAGE_SIZE / 2
    x, y = np.meshgrid(c, c)  # x varies along columns, y along rows (y points down)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def box_reduce(a: np.ndarray, supersample: int) -> np.ndarray:
    if supersample == 1:
        return a
    s = supersample
    return a.reshape(IMAGE_SIZE, s, IMAGE_SIZE, s).mean(axis=(1, 3))
