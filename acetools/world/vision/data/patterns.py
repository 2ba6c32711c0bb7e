"""Full-field patterns: sine gratings (orientation / frequency), textures (family / scale) and the
pool's other texture families, on a rotated, shifted coordinate grid painted with two random colours.
"""

from __future__ import annotations

import math

import numpy as np

from ....errors import InputError
from ._core import IMAGE_SIZE
from .render import SUPERSAMPLE, box_reduce, downsample, new_mask, paint, pixel_grid

# ---------------------------------------------------------------- gratings
ORIENTATIONS: tuple[float, ...] = tuple(22.5 * k for k in range(8))  # degrees, 0 = vertical bars
ORIENT_JITTER = 4.0  # degrees; classes are 22.5° apart
PERIODS: tuple[float, ...] = (4.0, 6.0, 9.0, 13.5)  # px per cycle; ratio 1.5
PERIOD_JITTER = 0.06  # relative


def grating_image(rng: np.random.Generator, orient: int | None = None, freq: int | None = None) -> np.ndarray:
    """A sine grating with orientation class ``orient`` and period class ``freq``."""
    orient = int(rng.integers(len(ORIENTATIONS))) if orient is None else orient
    freq = int(rng.integers(len(PERIODS))) if freq is None else freq
    theta = math.radians(ORIENTATIONS[orient] + rng.uniform(-ORIENT_JITTER, ORIENT_JITTER))
    period = PERIODS[freq] * (1 + rng.uniform(-PERIOD_JITTER, PERIOD_JITTER))
    x, y = pixel_grid(1)
    phase = rng.uniform(0, 2 * math.pi)
    alpha = 0.5 + 0.5 * np.sin(2 * math.pi * (x * math.cos(theta) + y * math.sin(theta)) / period + phase)
    return paint(alpha, rng)


# ---------------------------------------------------------------- textures
# ("blobs", thresholded low-pass noise, was replaced by "maze": its scale was too loose for
# the texture-scale task, 53 % in the proxy calibration)
TEXTURES: tuple[str, ...] = ("checker", "polka", "bricks", "zigzag", "rings", "maze", "speckle", "crosses")
POOL_TEXTURES: tuple[str, ...] = ("stripes", "grid", "triangles", "scratches", "plaid", "clouds")
SCALE_BINS: tuple[tuple[float, float], ...] = ((6.0, 7.0), (9.5, 11.0), (15.0, 18.0))  # period, px; ratio >= 1.36
SCALE_NAMES: tuple[str, ...] = ("fine", "medium", "coarse")
_SS = SUPERSAMPLE  # for masks drawn with PIL
_GS = 2  # supersampling of the coordinate-grid patterns (periods >= 6 px)


def _uv(rng: np.random.Generator, ss: int) -> tuple[np.ndarray, np.ndarray]:
    """Rotated, shifted coordinates (px) on a grid supersampled ``ss``×."""
    x, y = pixel_grid(ss)
    a = rng.uniform(0, 2 * math.pi)
    c, s = math.cos(a), math.sin(a)
    ox, oy = rng.uniform(0, 64, 2)
    return c * x - s * y + ox, s * x + c * y + oy


def _smooth_field(rng: np.random.Generator, sigma: float, n: int = IMAGE_SIZE) -> np.ndarray:
    """A zero-mean, unit-variance Gaussian random field with correlation length ``sigma`` px."""
    noise = rng.standard_normal((n, n))
    k = np.fft.fftfreq(n)
    k2 = k[:, None] ** 2 + k[None, :] ** 2
    f = np.real(np.fft.ifft2(np.fft.fft2(noise) * np.exp(-2 * (math.pi * sigma) ** 2 * k2)))
    return (f - f.mean()) / (f.std() + 1e-12)


def _band_field(rng: np.random.Generator, period: float, n: int = IMAGE_SIZE) -> np.ndarray:
    """Zero-mean, unit-variance noise band-passed around one spatial period (a "maze")."""
    noise = rng.standard_normal((n, n))
    k = np.hypot(*np.meshgrid(np.fft.fftfreq(n), np.fft.fftfreq(n)))
    k0 = 1.0 / period
    f = np.real(np.fft.ifft2(np.fft.fft2(noise) * np.exp(-0.5 * ((k - k0) / (0.2 * k0)) ** 2)))
    return (f - f.mean()) / (f.std() + 1e-12)


def _dots_mask(rng: np.random.Generator, radius: float, coverage: float) -> np.ndarray:
    n = int(round(coverage * (IMAGE_SIZE + 2 * radius) ** 2 / (math.pi * radius ** 2)))
    mask, draw = new_mask()
    pts = rng.uniform(-radius, IMAGE_SIZE + radius, (n, 2))
    r = radius * rng.uniform(0.92, 1.08, n)
    for (x, y), ri in zip(pts, r):
        draw.ellipse([(x - ri) * _SS, (y - ri) * _SS, (x + ri) * _SS, (y + ri) * _SS], fill=255)
    return downsample(mask)


def texture_alpha(family: str, period: float, rng: np.random.Generator) -> np.ndarray:
    """Coverage in ``[0, 1]`` of texture ``family`` (task or pool family) at ``period`` px."""
    p = period
    if family == "maze":
        f = _band_field(rng, p)
        return np.clip(0.5 + f / 0.4, 0.0, 1.0)  # steep but soft threshold
    if family == "clouds":
        f = _smooth_field(rng, p / 3.0)
        return np.clip(0.5 + 0.25 * f, 0.0, 1.0)
    if family == "speckle":
        return _dots_mask(rng, 0.25 * p, 0.2)
    if family == "scratches":
        mask, draw = new_mask()
        n = int(round(10 * 8.0 / p * 4))
        w = max(1.0, 0.12 * p) * _SS
        for _ in range(n):
            x0, y0 = rng.uniform(-4, IMAGE_SIZE + 4, 2)
            a = rng.uniform(0, math.pi)
            ln = rng.uniform(0.8, 2.0) * p
            x1, y1 = x0 + ln * math.cos(a), y0 + ln * math.sin(a)
            draw.line([x0 * _SS, y0 * _SS, x1 * _SS, y1 * _SS], fill=255, width=int(round(w)))
        return downsample(mask)
    if family == "rings":
        x, y = pixel_grid(_GS)
        cx, cy = rng.uniform(-16, 16, 2)
        r = np.hypot(x - cx, y - cy) + rng.uniform(0, p)
        return box_reduce((r % p < 0.45 * p).astype(np.float64), _GS)
    u, v = _uv(rng, _GS)
    if family == "checker":
        h = p / 2
        m = (np.floor(u / h) + np.floor(v / h)) % 2
    elif family == "polka":
        a, b = u % p - p / 2, v % p - p / 2
        m = a * a + b * b < (0.3 * p) ** 2
    elif family == "bricks":
        h, w = p / 2, max(0.12 * p, 0.9)
        row = np.floor(v / h)
        m = (v % h < w) | ((u + (row % 2) * p / 2) % p < w)
    elif family == "zigzag":
        t = (u / p) % 1.0
        tri = 2 * np.minimum(t, 1 - t)  # 0..1..0
        m = (v - 0.5 * p * tri) % p < 0.4 * p
    elif family == "crosses":
        a, b = np.abs(u % p - p / 2), np.abs(v % p - p / 2)
        m = ((a < 0.1 * p) & (b < 0.35 * p)) | ((b < 0.1 * p) & (a < 0.35 * p))
    elif family == "stripes":
        m = v % p < 0.5 * p
    elif family == "grid":
        m = (u % p < 0.15 * p) | (v % p < 0.15 * p)
    elif family == "triangles":
        w = 0.12 * p
        d1 = v
        d2 = 0.5 * v + (math.sqrt(3) / 2) * u
        d3 = 0.5 * v - (math.sqrt(3) / 2) * u
        m = (d1 % p < w) | (d2 % p < w) | (d3 % p < w)
    elif family == "plaid":
        return box_reduce(0.5 + 0.25 * np.sin(2 * math.pi * u / p) + 0.25 * np.sin(2 * math.pi * v / (1.7 * p)), _GS)
    else:
        raise InputError(f"unknown texture family {family!r}")
    return box_reduce(m.astype(np.float64), _GS)


def texture_image(rng: np.random.Generator, family: int | None = None, scale: int | None = None) -> np.ndarray:
    """A task texture: family class ``family`` (of :data:`TEXTURES`) at scale class ``scale``."""
    family = int(rng.integers(len(TEXTURES))) if family is None else family
    scale = int(rng.integers(len(SCALE_BINS))) if scale is None else scale
    period = rng.uniform(*SCALE_BINS[scale])
    alpha = texture_alpha(TEXTURES[family], period, rng)
    return paint(alpha, rng)


def pool_texture_image(rng: np.random.Generator, family: int | None = None) -> np.ndarray:
    """A pretraining-pool texture (families of :data:`POOL_TEXTURES`, none shared with tasks)."""
    family = int(rng.integers(len(POOL_TEXTURES))) if family is None else family
    period = rng.uniform(5.0, 16.0)
    alpha = texture_alpha(POOL_TEXTURES[family], period, rng)
    return paint(alpha, rng)


__all__ = ["grating_image", "texture_image", "pool_texture_image", "texture_alpha", "ORIENTATIONS", "PERIODS",
           "TEXTURES", "POOL_TEXTURES", "SCALE_BINS", "SCALE_NAMES"]
