"""Glyphs rendered with PIL from matplotlib's TrueType fonts (tasks and pool use disjoint fonts), placed
with a random scale, aspect, rotation and shift by one affine resampling at 4× and box-filtered to 32 px.
Glyph bytes depend on PIL's FreeType build: the cache's content hash shows a different one.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ....errors import InputError
from ._core import DataSourceError
from .render import BIG, SUPERSAMPLE, downsample, paint

# Fonts of tasks (upright and a few italics) and of the pool (obliques and other cuts), the pool's by the
# typeface its glyphs are labelled with (pool.py).
TASK_FONTS: tuple[str, ...] = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf",
    "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf",
)
POOL_TYPEFACES: dict[str, tuple[str, ...]] = {
    "sans": ("DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf"),
    "mono": ("DejaVuSansMono-Oblique.ttf", "DejaVuSansMono-BoldOblique.ttf"),
    "serif": ("DejaVuSerif-BoldItalic.ttf", "STIXGeneralBolIta.ttf", "cmb10.ttf", "cmti10.ttf"),
}
POOL_FONTS: tuple[str, ...] = tuple(f for fonts in POOL_TYPEFACES.values() for f in fonts)
# Greek letters and symbols exist only in the DejaVu and STIX fonts (the Computer Modern
# fonts map them elsewhere). No task's Greek or symbol glyph is in the pool.
UNICODE_FONTS: tuple[str, ...] = tuple(f for f in TASK_FONTS + POOL_FONTS if not f.startswith("cm"))

BASE_SIZE = 100  # px of the cached master rendering (4× a 25-px font)


def matplotlib_font_dir() -> Path | None:
    """matplotlib's ``mpl-data/fonts/ttf`` folder, found without importing matplotlib."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "mpl-data" / "fonts" / "ttf"
    return d if d.is_dir() else None


def font_path(name: str, root: Path | None = None) -> Path:
    """Where font file ``name`` is: ``<root>/fonts/`` first, then matplotlib's fonts."""
    candidates = []
    if root is not None:
        candidates.append(Path(root) / "fonts" / name)
    d = matplotlib_font_dir()
    if d is not None:
        candidates.append(d / name)
    for c in candidates:
        if c.is_file():
            return c
    where = " or ".join(str(c.parent) for c in candidates) or "(matplotlib is not installed)"
    raise DataSourceError(
        f"font {name!r} not found in {where}. The glyph tasks render the TrueType fonts that "
        f"matplotlib ships: `pip install matplotlib`, or copy {name} into <root>/fonts/ "
        f"(root = the data folder, $ACETOOLS_DATA or ~/.cache/acetools/data)."
    )


@functools.lru_cache(maxsize=None)
def _font(path: str) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, BASE_SIZE)


@functools.lru_cache(maxsize=4096)
def _master(path: str, ch: str) -> tuple[Image.Image, float, float]:
    """The glyph ``ch`` at ``BASE_SIZE`` px, cropped to its ink, and its centre."""
    font = _font(path)
    left, top, right, bottom = font.getbbox(ch)
    w, h = int(math.ceil(right - left)) + 8, int(math.ceil(bottom - top)) + 8
    im = Image.new("L", (w, h), 0)
    ImageDraw.Draw(im).text((4 - left, 4 - top), ch, font=font, fill=255)
    box = im.getbbox()
    if box is None:
        raise InputError(f"glyph {ch!r} has no ink in font {os.path.basename(path)}")
    return im, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def glyph_alpha(ch: str, path: str | os.PathLike, font_px: float, angle_deg: float = 0.0,
                dx: float = 0.0, dy: float = 0.0, aspect: float = 1.0) -> np.ndarray:
    """Coverage mask of ``ch`` set in a ``font_px``-px font (32-px scale), its ink centred
    at ``(dx, dy)`` px from the image centre, rotated by ``angle_deg`` (counter-clockwise),
    stretched horizontally by ``aspect``."""
    im, cx, cy = _master(str(path), ch)
    s = font_px * SUPERSAMPLE / BASE_SIZE
    a = math.radians(angle_deg)
    c, si = math.cos(a), math.sin(a)
    # out = S R in, with R = [[c, s], [-s, c]] (counter-clockwise on screen, y down) and
    # S = diag(s * aspect, s); PIL wants the inverse map in = R^T S^-1 out.
    ox, oy = BIG / 2 + dx * SUPERSAMPLE, BIG / 2 + dy * SUPERSAMPLE
    sx, sy = s * aspect, s
    m00, m01 = c / sx, -si / sy
    m10, m11 = si / sx, c / sy
    coeffs = (m00, m01, cx - m00 * ox - m01 * oy, m10, m11, cy - m10 * ox - m11 * oy)
    out = im.transform((BIG, BIG), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)
    return downsample(out)


def resolve_fonts(names: tuple[str, ...], root: Path | None = None) -> tuple[str, ...]:
    """Paths of the font files ``names`` (see :func:`font_path`)."""
    return tuple(str(font_path(n, root)) for n in names)


def glyph_image(rng: np.random.Generator, ch: str, font_paths: tuple[str, ...],
                size: tuple[float, float] = (22.0, 28.0), max_angle: float = 10.0,
                max_shift: float = 2.5) -> np.ndarray:
    """``ch`` in a random font of ``font_paths`` (from :func:`resolve_fonts`) with random
    size, aspect, rotation, shift and colours."""
    path = font_paths[int(rng.integers(len(font_paths)))]
    alpha = glyph_alpha(ch, path, rng.uniform(*size), rng.uniform(-max_angle, max_angle),
                        *rng.uniform(-max_shift, max_shift, 2), aspect=rng.uniform(0.9, 1.1))
    return paint(alpha, rng)
