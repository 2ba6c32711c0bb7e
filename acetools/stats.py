"""Paired differences with their test-set and seed noise, and the power rule (docs/course.md §Claim rules).

The worlds' test sets are fixed across seeds, so the seed spread holds no test-sampling noise:
:func:`paired_bootstrap` resamples both, pairing two rows example by example (their
``<stem>_correct.npz``, :func:`correctness`). :func:`ceiling_prediction` caps a paper's scaled
effect by the headroom; :func:`has_power` says whether a predicted effect can be decided at a margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .errors import InputError
from .utils import make_generator

if TYPE_CHECKING:
    import pandas as pd

    from .results import ResultFiles

__all__ = ["PairedDifference", "paired_bootstrap", "correctness", "paired_rows", "ceiling_prediction", "has_power",
           "POWER_FACTOR", "Z_95"]

#: The normal quantile of a two-sided 95 % interval: the margin is ``Z_95`` standard errors.
Z_95: float = 1.959964

#: A claim is decided only where ``|predicted| >= POWER_FACTOR * margin``: with the margin at
#: 1.96 standard errors, a true effect of twice the margin is measured above the margin with
#: probability ``Phi(1.96) = 0.975`` (normal approximation), where one at the margin is measured
#: above it only half the time.
POWER_FACTOR: float = 2.0

#: Correctness of one row: ``{seed: {task: bool array over the task's test examples}}``.
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

    def margin(self, noise: float) -> float:
        """The margin a difference must exceed to count: ``max(noise, Z_95 * se)``."""
        return max(float(noise), Z_95 * self.se)

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


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
    """The paired difference of two rows' accuracy, with test-set and seed noise.

    ``a`` and ``b`` hold per-example correctness ``{seed: {task: array}}`` of the same tasks,
    seeds and examples. The statistic is ``100 * mean_seed mean_task (acc_A - acc_B) / scale``,
    ``scale`` = ``{task: x}`` or ``{seed: {task: x}}`` (the experts' accuracy for normalized
    points; 1 by default). Each bootstrap draw resamples the seeds with replacement and, per task,
    the test examples with replacement, the same examples for both rows and for every seed (the
    test set is one sample, shared by the seeds). Deterministic for a given ``seed``.
    """
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
    pick = torch.randint(0, n_s, (n_boot, n_s), generator=g).numpy()  # seeds drawn with replacement
    boot = np.take_along_axis(per_seed, pick, axis=1).mean(axis=1)  # (n_boot,)
    diff = float(sum((w[:, j] * d.mean(axis=1)).mean() for j, d in enumerate(diffs)))
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return PairedDifference(diff, float(boot.std(ddof=1)), float(lo), float(hi), float(level), n_s,
                            int(sum(d.shape[1] for d in diffs)), int(n_boot))


def correctness(files: Mapping[int, str | Path], row: str, tasks: Sequence[str] | None = None) -> Correctness | None:
    """``row``'s per-example correctness ``{seed: {task: array}}`` from each seed's ``<stem>_correct.npz``
    (``files``: ``{seed: path}``), restricted to ``tasks``; None where a file or the row is missing (a
    result written before per-example results were saved, or a world that does not score examples)."""
    from .results import load_correctness

    out = {}
    for s, path in files.items():
        if not Path(path).is_file():
            return None
        hits = load_correctness(path).get(row)
        if hits is None or (tasks is not None and not set(tasks) <= set(hits)):
            return None
        out[int(s)] = {t: hits[t] for t in (tasks if tasks is not None else hits)}
    return out or None


def paired_rows(runs: Sequence[ResultFiles], suite: str, a: str, b: str, *, per_task: pd.DataFrame | None = None,
                **kw) -> PairedDifference | None:
    """:func:`paired_bootstrap` of rows ``a`` and ``b`` on ``suite`` from the runs' ``<stem>_correct.npz``
    (:func:`acetools.results.find_results`); None where a seed lacks them. With ``per_task``
    (:func:`acetools.results.load_per_task`) the difference is in normalized points, each seed's and
    task's experts as the scale; without, in absolute points. ``kw`` go to :func:`paired_bootstrap`."""
    files = {r.seed: r.summary.with_name(f"{r.stem}_correct.npz") for r in runs if r.suite == suite}
    ca, cb = correctness(files, a), correctness(files, b)
    if ca is None or cb is None:
        return None
    scale = None
    if per_task is not None:
        e = per_task[(per_task["suite"] == suite) & (per_task["method"] == "experts (individual)")
                     & (per_task["split"] == "test")]
        scale = {int(s): dict(zip(g["task"], g["accuracy"] / 100.0)) for s, g in e.groupby("seed")}
        if not scale:
            raise InputError(f"paired_rows: per_task has no test rows of 'experts (individual)' on suite {suite!r}: "
                             "no scale for normalized points")
    return paired_bootstrap(ca, cb, scale=scale, **kw)


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
