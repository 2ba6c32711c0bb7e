"""Paired differences with their test-set and seed noise (docs/course.md §Margin, power and rivals).

The worlds' test sets are fixed across seeds, so the seed spread holds no test-sampling noise:
:func:`paired_bootstrap` resamples the test examples and adds the seeds' spread by a t interval ((V.8)), pairing
two rows example by example (their
``<stem>_correct.npz``). It is the claims' margin; the power rule that uses it is :mod:`acetools_course.power`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from acetools.errors import InputError
from acetools.utils import make_generator

__all__ = ["PairedDifference", "paired_bootstrap", "Correctness", "Z_95"]

#: The normal quantile of a two-sided 95 % interval: the margin is ``Z_95`` standard errors.
Z_95: float = 1.959964

#: Correctness of one row: ``{seed: {task: bool array over the task's test examples}}``.
Correctness = Mapping[int, Mapping[str, "np.ndarray"]]


@dataclass(frozen=True)
class PairedDifference:
    """``diff`` = A - B in points and its 95 % interval of (V.8) (docs/course.md §Margin, power and rivals):
    ``se_test`` the bootstrap standard error over the test examples, ``se_seed`` the t standard error over the
    seeds (0 with one seed), ``df`` their Welch–Satterthwaite degrees of freedom (inf with one seed). ``se`` is the
    normal-equivalent standard error, the 95 % half-width over ``Z_95``, so that every margin
    ``max(NOISE, Z_95 se)`` is that half-width; ``low``/``high`` the interval at ``level``; the counts it rests on."""

    diff: float
    se: float
    low: float
    high: float
    level: float
    n_seeds: int
    n_examples: int
    n_boot: int
    se_test: float = 0.0
    se_seed: float = 0.0
    df: float = math.inf


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (the normal's for ``df`` = inf)."""
    from scipy.stats import norm, t

    return float(norm.ppf(q) if math.isinf(df) else t.ppf(q, df))


def combined_interval(diff: float, se_test: float, per_seed: np.ndarray, level: float = 0.95
                      ) -> tuple[float, float, float, float]:
    """(V.8): the test examples' bootstrap standard error ``se_test`` combined with the t standard error of the
    ``per_seed`` differences, ``se_seed = sd(per_seed) / sqrt(S)``: ``se^2 = se_seed^2 + se_test^2`` with the
    Welch–Satterthwaite degrees of freedom ``df = se^4 (S - 1) / se_seed^4`` (the bootstrap part counts as
    infinite). Returns ``(half_width at level, se_seed, df, half_width at 95 %)``."""
    S = int(np.size(per_seed))
    se_seed = float(np.std(per_seed, ddof=1) / math.sqrt(S)) if S > 1 else 0.0
    var = se_seed**2 + float(se_test) ** 2
    df = math.inf if se_seed == 0.0 else var**2 * (S - 1) / se_seed**4
    half = t_quantile((1 + level) / 2, df) * math.sqrt(var)
    return half, se_seed, df, t_quantile(0.975, df) * math.sqrt(var)


def _stack(a: Correctness, b: Correctness) -> tuple[list[int], list[str], list[np.ndarray]]:
    """Per task, the paired difference ``A - B`` as a float array (n_seeds, n_examples)."""
    seeds = sorted(a)
    if not seeds:
        raise InputError("paired_bootstrap: no seeds given")
    if sorted(b) != seeds:
        raise InputError(f"paired_bootstrap: the two rows have different seeds: {seeds} and {sorted(b)}")
    tasks = sorted(a[seeds[0]])
    if not tasks:
        raise InputError(f"paired_bootstrap: seed {seeds[0]} has no tasks")
    diffs = []
    for t in tasks:
        rows = []
        for s in seeds:
            for who, c in (("A", a), ("B", b)):
                if sorted(c[s]) != tasks:
                    raise InputError(f"paired_bootstrap: row {who} at seed {s} has tasks {sorted(c[s])}, "
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


def _weights(scale: Mapping | None, seeds: list[int], tasks: list[str]) -> np.ndarray:
    """``100 / scale`` per (seed, task), divided by the number of tasks: (n_seeds, n_tasks)."""
    if not scale:
        return np.full((len(seeds), len(tasks)), 100.0 / len(tasks))
    per_seed = all(isinstance(v, Mapping) for v in scale.values())
    w = np.empty((len(seeds), len(tasks)))
    for i, s in enumerate(seeds):
        row = scale.get(s) if per_seed else scale
        if row is None:
            raise InputError(f"paired_bootstrap: scale has no entry for seed {s}")
        for j, t in enumerate(tasks):
            if t not in row:
                raise InputError(f"paired_bootstrap: scale has no entry for task {t!r}")
            w[i, j] = 100.0 / float(row[t]) / len(tasks) if float(row[t]) != 0 else math.inf
    if not np.all(np.isfinite(w)):
        raise InputError(f"paired_bootstrap: scale must be finite and non-zero; got {dict(scale)}")
    return w


def paired_bootstrap(a: Correctness, b: Correctness, *, scale: Mapping | None = None, n_boot: int = 2000,
                     level: float = 0.95, seed: int = 0) -> PairedDifference:
    """The paired difference (V.3) of two rows' accuracy with test-set and seed noise, (V.8) of
    docs/course.md §Margin, power and rivals: the test examples resampled (the same for A, B and every seed),
    the seeds by a t interval (:func:`combined_interval`). ``a`` and ``b`` are per-example correctness
    ``{seed: {task: array}}`` of the same tasks, seeds and examples; ``scale`` is ``{task: x}`` or
    ``{seed: {task: x}}`` (the experts' accuracy for normalized points; 1 by default). Deterministic
    for a given ``seed``."""
    if n_boot < 2:
        raise InputError(f"n_boot={n_boot}: at least 2 bootstrap draws are needed")
    if not 0 < level < 1:
        raise InputError(f"level={level}: choose a number between 0 and 1")
    seeds, tasks, diffs = _stack(a, b)
    w = _weights(scale, seeds, tasks)  # (n_seeds, n_tasks)
    g = make_generator(seed)
    n_s = len(seeds)
    per_seed = np.zeros((n_boot, n_s))  # (n_boot, n_seeds): the task-weighted difference per seed
    for j, d in enumerate(diffs):  # d: (n_seeds, n_examples)
        idx = torch.randint(0, d.shape[1], (n_boot, d.shape[1]), generator=g).numpy()  # one draw per bootstrap
        per_seed += w[:, j] * d[:, idx].mean(axis=2).T  # d[:, idx]: (n_seeds, n_boot, n_examples)
    se_test = float(per_seed.mean(axis=1).std(ddof=1))  # the test examples resampled, the seeds as they are
    point = sum(w[:, j] * d.mean(axis=1) for j, d in enumerate(diffs))  # (n_seeds,) each seed's difference
    diff = float(np.mean(point))
    half, se_seed, df, half95 = combined_interval(diff, se_test, np.asarray(point), level)
    return PairedDifference(diff, half95 / Z_95, diff - half, diff + half, float(level), n_s,
                            int(sum(d.shape[1] for d in diffs)), int(n_boot), se_test, se_seed, df)
