"""Paired differences with their test-set and seed noise (docs/course.md §Claim rules).

The worlds' test sets are fixed across seeds, so the seed spread holds no test-sampling noise;
:func:`paired_bootstrap` resamples both, pairing two methods example by example.
:func:`ceiling_prediction` caps a paper's scaled effect by the headroom; :func:`has_power` says
whether a predicted effect can be decided at a margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from .errors import InputError

__all__ = ["PairedDifference", "paired_bootstrap", "ceiling_prediction", "has_power", "POWER_FACTOR", "Z_95"]

#: The normal quantile of a two-sided 95 % interval: the margin is ``Z_95`` standard errors.
Z_95: float = 1.959964

#: A claim is decided only where ``|predicted| >= POWER_FACTOR * margin``: with the margin at
#: 1.96 standard errors, a true effect of twice the margin is measured above the margin with
#: probability ``Phi(1.96) = 0.975`` (normal approximation), where one at the margin is measured
#: above it only half the time.
POWER_FACTOR: float = 2.0

#: Correctness of one method: ``{seed: {task: bool array over the task's test examples}}``.
Correctness = Mapping[int, Mapping[str, "np.ndarray"]]


@dataclass(frozen=True)
class PairedDifference:
    """``diff`` = A - B in points; ``se`` its bootstrap standard error; ``low``/``high`` the
    percentile interval at ``level``; the counts it rests on."""

    diff: float
    se: float
    low: float
    high: float
    level: float
    n_seeds: int
    n_examples: int
    n_boot: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _stack(a: Correctness, b: Correctness) -> tuple[list[int], list[str], list[np.ndarray]]:
    """Per task, the paired difference ``A - B`` as a float array (n_seeds, n_examples)."""
    seeds = sorted(a)
    if not seeds:
        raise InputError("paired_bootstrap: no seeds given")
    if sorted(b) != seeds:
        raise InputError(f"paired_bootstrap: the two methods have different seeds: {seeds} and {sorted(b)}")
    tasks = sorted(a[seeds[0]])
    if not tasks:
        raise InputError(f"paired_bootstrap: seed {seeds[0]} has no tasks")
    diffs = []
    for t in tasks:
        rows = []
        for s in seeds:
            for who, c in (("A", a), ("B", b)):
                if sorted(c[s]) != tasks:
                    raise InputError(f"paired_bootstrap: method {who} at seed {s} has tasks {sorted(c[s])}, "
                                     f"expected {tasks}")
            xa, xb = np.asarray(a[s][t], dtype=float), np.asarray(b[s][t], dtype=float)
            if xa.ndim != 1 or xa.shape != xb.shape or xa.size == 0:
                raise InputError(f"paired_bootstrap: task {t!r} seed {s}: correctness of shapes {xa.shape} and "
                                 f"{xb.shape}; both must be the same non-empty 1-D array (one entry per example)")
            rows.append(xa - xb)
        if len({r.size for r in rows}) != 1:
            raise InputError(f"paired_bootstrap: task {t!r} has test sets of different sizes across seeds "
                             f"({sorted({r.size for r in rows})}); the worlds' test sets are fixed across seeds")
        diffs.append(np.stack(rows))
    return seeds, tasks, diffs


def paired_bootstrap(a: Correctness, b: Correctness, *, scale: Mapping[str, float] | None = None,
                     n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> PairedDifference:
    """The paired difference of two methods' accuracy, with test-set and seed noise.

    ``a`` and ``b`` hold per-example correctness ``{seed: {task: array}}`` of the same tasks,
    seeds and examples. The statistic is ``100 * mean_seed mean_task (acc_A - acc_B) / scale[task]``
    (``scale`` the experts' accuracy per task for normalized points; 1 by default). Each bootstrap
    draw resamples the seeds with replacement and, per task, the test examples with replacement,
    the same examples for both methods and for every seed (the test set is one sample, shared by
    the seeds). Deterministic for a given ``seed``.
    """
    if n_boot < 2:
        raise InputError(f"n_boot={n_boot}: at least 2 bootstrap draws are needed")
    if not 0 < level < 1:
        raise InputError(f"level={level}: choose a number between 0 and 1")
    seeds, tasks, diffs = _stack(a, b)
    scale = dict(scale or {})
    missing = [t for t in tasks if scale and t not in scale]
    if missing:
        raise InputError(f"paired_bootstrap: scale has no entry for task {missing[0]!r}")
    w = np.array([100.0 / float(scale.get(t, 1.0)) for t in tasks]) / len(tasks)  # (n_tasks,)
    if not np.all(np.isfinite(w)):
        raise InputError(f"paired_bootstrap: scale must be finite and non-zero; got {scale}")
    rng = np.random.default_rng(seed)
    n_s = len(seeds)
    per_seed = np.zeros((n_boot, n_s))  # (n_boot, n_seeds): the task-weighted difference per seed
    for w_t, d in zip(w, diffs):  # d: (n_seeds, n_examples)
        idx = rng.integers(0, d.shape[1], size=(n_boot, d.shape[1]))  # one example draw per bootstrap
        per_seed += w_t * d[:, idx].mean(axis=2).T  # d[:, idx]: (n_seeds, n_boot, n_examples)
    pick = rng.integers(0, n_s, size=(n_boot, n_s))  # seeds drawn with replacement
    boot = np.take_along_axis(per_seed, pick, axis=1).mean(axis=1)  # (n_boot,)
    diff = float(sum(w_t * d.mean() for w_t, d in zip(w, diffs)))
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return PairedDifference(diff, float(boot.std(ddof=1)), float(lo), float(hi), float(level), n_s,
                            int(sum(d.shape[1] for d in diffs)), int(n_boot))


def ceiling_prediction(paper_effect: float, paper_room: float, world_room: float,
                       headroom: float | None = None) -> float:
    """A paper's effect scaled to a world, ``paper_effect * world_room / paper_room``, with its
    size capped at ``headroom`` (the points left above the rival, e.g. 100 minus the rival's
    normalized accuracy): a method cannot beat its rival by more than the rival leaves.
    ``paper_room`` must be positive; a world without room predicts no effect."""
    for name, v in (("paper_effect", paper_effect), ("paper_room", paper_room), ("world_room", world_room)):
        if not math.isfinite(v):
            raise InputError(f"{name}={v!r} is not a finite number")
    if paper_room <= 0:
        raise InputError(f"paper_room={paper_room!r} must be positive")
    pred = float(paper_effect) * max(float(world_room), 0.0) / float(paper_room)
    if headroom is None:
        return pred
    if not math.isfinite(headroom):
        raise InputError(f"headroom={headroom!r} is not a finite number")
    return math.copysign(min(abs(pred), max(float(headroom), 0.0)), pred)


def has_power(predicted: float | None, margin: float, factor: float = POWER_FACTOR) -> bool:
    """Whether a claim predicted at ``predicted`` can be decided at ``margin``:
    ``|predicted| >= factor * margin`` (:data:`POWER_FACTOR`)."""
    if predicted is None or not math.isfinite(predicted):
        return False
    if not (math.isfinite(margin) and margin >= 0):
        raise InputError(f"margin={margin!r} must be a non-negative number")
    return abs(float(predicted)) >= factor * float(margin)
