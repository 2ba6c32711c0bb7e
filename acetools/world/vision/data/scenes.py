"""Object scenes: one shape (shape / size / position tasks), dots (count / dot size), and the pool's
polygons and counted squares. Each ``*_image`` draws the factors it is not told at random, so tasks that
label one generator by different factors share its input distribution.
"""

from __future__ import annotations

import math

import numpy as np

from .render import SUPERSAMPLE, downsample, new_mask, paint

# ---------------------------------------------------------------- shapes
SHAPES: tuple[str, ...] = ("circle", "triangle", "square", "star", "cross", "ring", "crescent", "semicircle")
# circumradius (px, about the shape's centroid) of the three size classes: gaps of 1.5 px
SIZE_BINS: tuple[tuple[float, float], ...] = ((5.5, 6.5), (8.0, 9.0), (10.5, 11.5))
SIZE_NAMES: tuple[str, ...] = ("small", "medium", "large")
QUADRANTS: tuple[str, ...] = ("top-left", "top-right", "bottom-left", "bottom-right")
MIN_OFFSET = 2.0  # px: the centroid is at least this far from the image's mid-lines
EDGE = 15.0  # px: shapes stay inside the central 30×30


def _regular(n: int, phase: float = math.pi / 2, r: float = 1.0) -> np.ndarray:
    a = phase + 2 * math.pi * np.arange(n) / n
    return np.stack([r * np.cos(a), -r * np.sin(a)], axis=1)


def _star(points: int = 5, inner: float = 0.45) -> np.ndarray:
    a = math.pi / 2 + math.pi * np.arange(2 * points) / points
    r = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    return np.stack([r * np.cos(a), -r * np.sin(a)], axis=1)


def _cross(w: float = 0.32) -> np.ndarray:
    return np.array([(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1),
                     (-w, w), (-1, w), (-1, -w), (-w, -w)], dtype=np.float64)


def _crescent(d: float = 0.5, r2: float = 0.85, n: int = 160) -> np.ndarray:
    a = np.linspace(0, 2 * math.pi, n, endpoint=False)
    outer = np.stack([np.cos(a), np.sin(a)], 1)
    keep = np.hypot(outer[:, 0] - d, outer[:, 1]) > r2
    # rotate the outer arc so the kept points are contiguous
    start = int(np.argmax(keep & ~np.roll(keep, 1)))
    outer = np.roll(outer, -start, axis=0)[np.roll(keep, -start)]
    b0, b1 = math.atan2(outer[-1, 1], outer[-1, 0] - d), math.atan2(outer[0, 1], outer[0, 0] - d)
    if b1 < b0:
        b1 += 2 * math.pi
    b = np.linspace(b0, b1, n // 2)
    inner = np.stack([d + r2 * np.cos(b), r2 * np.sin(b)], 1)
    # inner arc runs the short way inside the big disc; pick the direction that stays inside
    if np.mean(np.hypot(inner[:, 0], inner[:, 1])) > 1.0:
        b = np.linspace(b0, b1 - 2 * math.pi, n // 2)
        inner = np.stack([d + r2 * np.cos(b), r2 * np.sin(b)], 1)
    return np.concatenate([outer, inner])


def _semicircle(n: int = 64) -> np.ndarray:
    a = np.linspace(0, math.pi, n)
    return np.stack([np.cos(a), -np.sin(a)], 1)  # the arc; the polygon closes along the diameter


def _centroid(p: np.ndarray) -> np.ndarray:
    x, y = p[:, 0], p[:, 1]
    x1, y1 = np.roll(x, -1), np.roll(y, -1)
    c = x * y1 - x1 * y
    a = c.sum() / 2
    return np.array([((x + x1) * c).sum(), ((y + y1) * c).sum()]) / (6 * a)


def _normalise(parts: list[tuple[np.ndarray, int]]) -> list[tuple[np.ndarray, int]]:
    """Centroid of the outer outline at the origin, circumradius 1."""
    outer = parts[0][0]
    c = _centroid(outer)
    r = np.hypot(*(outer - c).T).max()
    return [((p - c) / r, fill) for p, fill in parts]


_UNIT: dict[str, list[tuple[np.ndarray, int]]] = {
    k: _normalise(v) for k, v in {
        "circle": [(_regular(96), 255)],
        "triangle": [(_regular(3), 255)],
        "square": [(_regular(4, math.pi / 4), 255)],
        "star": [(_star(), 255)],
        "cross": [(_cross(), 255)],
        "ring": [(_regular(96), 255), (_regular(96, r=0.52), 0)],
        "crescent": [(_crescent(), 255)],
        # (a heart was tried first: at 6-px radius it was confused with the square 20 % of the time)
        "semicircle": [(_semicircle(), 255)],
    }.items()
}


def _draw_parts(draw, parts, angle: float, radius: float, cx: float, cy: float) -> None:
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, -s], [s, c]])
    for p, fill in parts:
        q = (p @ rot.T) * radius + np.array([16.0 + cx, 16.0 + cy])
        draw.polygon((q * SUPERSAMPLE).ravel().tolist(), fill=fill)


def shape_alpha(shape: str, radius: float, cx: float = 0.0, cy: float = 0.0, angle: float = 0.0) -> np.ndarray:
    """Coverage mask of ``shape`` with circumradius ``radius`` px, centroid offset
    ``(cx, cy)`` px from the image centre, rotated by ``angle`` radians."""
    mask, draw = new_mask()
    _draw_parts(draw, _UNIT[shape], angle, radius, cx, cy)
    return downsample(mask)


def shapes_image(rng: np.random.Generator, shape: int | None = None, size: int | None = None,
                 quadrant: int | None = None) -> np.ndarray:
    """One shape; ``shape``/``size``/``quadrant`` are class indices (random when None)."""
    shape = int(rng.integers(len(SHAPES))) if shape is None else shape
    size = int(rng.integers(len(SIZE_BINS))) if size is None else size
    quadrant = int(rng.integers(4)) if quadrant is None else quadrant
    radius = rng.uniform(*SIZE_BINS[size])
    sx = -1.0 if quadrant in (0, 2) else 1.0
    sy = -1.0 if quadrant in (0, 1) else 1.0
    cx = sx * rng.uniform(MIN_OFFSET, EDGE - radius)
    cy = sy * rng.uniform(MIN_OFFSET, EDGE - radius)
    angle = rng.uniform(0, 2 * math.pi)
    return paint(shape_alpha(SHAPES[shape], radius, cx, cy, angle), rng)


# ---------------------------------------------------------------- dots
COUNTS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
DOT_BINS: tuple[tuple[float, float], ...] = ((1.6, 2.0), (2.6, 3.0), (3.6, 4.0))


def _scatter(rng: np.random.Generator, k: int, radius: float, edge: float, gap: float) -> np.ndarray:
    """``k`` centres in ``[-edge+radius, edge-radius]²`` at least ``2 radius + gap`` apart."""
    lim = edge - radius
    d2 = (2 * radius + gap) ** 2
    for _ in range(200):
        pts: list[tuple[float, float]] = []
        for x, y in rng.uniform(-lim, lim, (128, 2)).tolist():
            if all((x - px) ** 2 + (y - py) ** 2 >= d2 for px, py in pts):
                pts.append((x, y))
                if len(pts) == k:
                    return np.array(pts)
    raise RuntimeError(f"could not place {k} objects of radius {radius}")  # pragma: no cover


def dots_image(rng: np.random.Generator, count: int | None = None, dot_size: int | None = None) -> np.ndarray:
    """``COUNTS[count]`` discs of radius class ``dot_size`` (class indices; random when None)."""
    count = int(rng.integers(len(COUNTS))) if count is None else count
    dot_size = int(rng.integers(len(DOT_BINS))) if dot_size is None else dot_size
    r = rng.uniform(*DOT_BINS[dot_size])
    centres = _scatter(rng, COUNTS[count], r, EDGE, gap=2.0)
    mask, draw = new_mask()
    for x, y in centres:
        r_i = r * rng.uniform(0.95, 1.05)
        box = [(16 + x - r_i) * SUPERSAMPLE, (16 + y - r_i) * SUPERSAMPLE,
               (16 + x + r_i) * SUPERSAMPLE, (16 + y + r_i) * SUPERSAMPLE]
        draw.ellipse(box, fill=255)
    return paint(downsample(mask), rng)


# ---------------------------------------------------------------- pretraining-pool scenes
POLYGON_SIDES: tuple[int, ...] = (3, 4, 5, 6, 7, 8)


def polygon_image(rng: np.random.Generator, sides: int | None = None) -> np.ndarray:
    """A regular polygon with ``POLYGON_SIDES[sides]`` sides (pool only), any size/place."""
    sides = int(rng.integers(len(POLYGON_SIDES))) if sides is None else sides
    radius = rng.uniform(7.0, 13.0)
    lim = EDGE - radius
    cx, cy = rng.uniform(-lim, lim, 2)
    parts = [(_regular(POLYGON_SIDES[sides]), 255)]
    mask, draw = new_mask()
    _draw_parts(draw, parts, rng.uniform(0, 2 * math.pi), radius, cx, cy)
    return paint(downsample(mask), rng)


COARSE_COUNTS: tuple[str, ...] = ("1-3", "4-6", "7-9")


def squares_count_image(rng: np.random.Generator, coarse: int | None = None) -> np.ndarray:
    """1–9 small rotated squares (pool only); the label is the coarse count class."""
    coarse = int(rng.integers(3)) if coarse is None else coarse
    k = 3 * coarse + 1 + int(rng.integers(3))
    half = rng.uniform(1.3, 2.0)
    centres = _scatter(rng, k, half * 1.42, EDGE, gap=1.5)
    mask, draw = new_mask()
    square = [(_regular(4, math.pi / 4), 255)]
    for x, y in centres:
        _draw_parts(draw, square, rng.uniform(0, 2 * math.pi), half * 1.42, x, y)
    return paint(downsample(mask), rng)
