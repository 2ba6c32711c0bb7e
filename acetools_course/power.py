"""Power before deciding and paired rows from result files (docs/course.md §Margin, power and rivals).

:func:`paired_rows` pairs two rows of a suite example by example (:func:`acetools_course.stats.paired_bootstrap`
on the runs' ``<stem>_correct.npz``); :func:`ceiling_prediction` caps a paper's scaled effect by the
headroom; :func:`has_power` says whether a predicted effect can be decided at a margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from acetools.errors import InputError
from acetools.results import ResultFiles, load_correctness

from .stats import Correctness, PairedDifference, paired_bootstrap

#: A claim is decided only where ``|predicted| >= POWER_FACTOR * margin``: with the margin at
#: 1.96 standard errors, a true effect of twice the margin is measured above the margin with
#: probability ``Phi(1.96) = 0.975`` (normal approximation), where one at the margin is measured
#: above it only half the time.
POWER_FACTOR: float = 2.0


def correctness(files: Mapping[int, str | Path | None], row: str,
                tasks: Sequence[str] | None = None) -> Correctness | None:
    """``row``'s per-example correctness ``{seed: {task: array}}`` from each seed's ``<stem>_correct.npz``
    (``files``: ``{seed: path}``, None for none), restricted to ``tasks``; None where a file or the row is
    missing (a result written before per-example results were saved, or a world that does not score examples)."""
    out = {}
    for s, path in files.items():
        if path is None or not Path(path).is_file():
            return None
        hits = load_correctness(path).get(row)
        if hits is None or (tasks is not None and not set(tasks) <= set(hits)):
            return None
        out[int(s)] = {t: hits[t] for t in (tasks if tasks is not None else hits)}
    return out or None


def paired_rows(runs: Sequence[ResultFiles], suite: str, a: str, b: str, *, per_task: pd.DataFrame | None = None,
                **kw) -> PairedDifference | None:
    """:func:`acetools_course.stats.paired_bootstrap` of rows ``a`` and ``b`` on ``suite`` from the runs'
    ``<stem>_correct.npz`` (:func:`acetools.results.find_results`); None where a seed lacks them. With
    ``per_task`` (:func:`acetools.results.load_per_task`) the difference is in normalized points, each
    seed's and task's experts as the scale; without, in absolute points."""
    files = {r.seed: r.correct for r in runs if r.suite == suite}
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


def paired_runs(a: Mapping[str, np.ndarray] | None, b: Mapping[str, np.ndarray] | None,
                scale: Mapping[str, float] | None = None, **kw) -> PairedDifference | None:
    """Two runs on one seed's world (an ablation's rows), ``{task: correctness}`` each, paired example by
    example (:func:`acetools_course.stats.paired_bootstrap` with one seed: the test examples resampled); ``scale``
    ``{task: expert accuracy}`` for normalized points. None where either run lacks per-example results."""
    if a is None or b is None:
        return None
    return paired_bootstrap({0: a}, {0: b}, scale=scale, **kw)


def paired_se(a: Mapping[str, np.ndarray] | None, b: Mapping[str, np.ndarray] | None,
              scale: Mapping[str, float] | None = None) -> float | None:
    """The standard error of :func:`paired_runs` (points: absolute, or normalized with ``scale``); None where
    either run lacks per-example results."""
    pb = paired_runs(a, b, scale)
    return None if pb is None else pb.se


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


#: The stage ablations' per-example results a lesson saves in its full profile, ``<figures>/<name>_correct.npz``
#: (:func:`save_stage_results`), by lesson folder (02: one file per suite): the rows are
#: ``"<suite>|<variant>"`` (02, 03), ``"<order>|<norms>"`` (03's norm order) or ``"eps <eps>|<setting>"`` (07), so
#: that their verdicts are recomputable from committed files.
STAGE_RESULTS: dict[str, tuple[str, ...]] = {"02_ace_step_by_step": ("ablation_tasks8", "ablation_tasks20"),
                                             "03_esm_step_by_step": ("ablation_grid", "proxy", "norm_order"),
                                             "07_language": ("stage_ablation",)}


def stage_hits(table: pd.DataFrame, keys: Sequence[str] = ("suite", "variant")) -> dict[str, dict[str, np.ndarray]]:
    """``{"<key>|<key>": {task: correctness}}`` from a stage ablation's table: one row per run with a ``correct``
    dict (lessons 03 and 07), or one row per run and ``task`` with a ``correct`` array (lesson 02's
    ``per_task``); rows without per-example results are left out. A key column ``eps`` reads ``eps <eps:g>``."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for r in table.to_dict("records"):
        c = r.get("correct")
        if c is None:
            continue
        key = "|".join(f"eps {float(r[k]):g}" if k == "eps" else str(r[k]) for k in keys)
        got = {str(r["task"]): np.asarray(c, dtype=bool)} if "task" in r else \
            {str(t): np.asarray(v, dtype=bool) for t, v in c.items()}
        out.setdefault(key, {}).update(got)
    return out


def save_stage_results(folder: str | Path, name: str, hits: Mapping[str, Mapping[str, np.ndarray]],
                       experts: Mapping[str, float] | None = None) -> Path:
    """Write a stage ablation's per-example results to ``<folder>/<name>_correct.npz``
    (:func:`acetools.results.save_correctness`) and, with ``experts`` (``{task: expert test accuracy}``, a
    fraction: the scale of normalized points), ``<folder>/<name>_experts.json``; both atomically."""
    import json

    from acetools.results import save_correctness
    from acetools.utils import atomic_write

    if not hits:
        raise InputError(f"save_stage_results({name!r}): no row has per-example results (a 'correct' column)")
    folder = Path(folder)
    if experts is not None:
        with atomic_write(folder / f"{name}_experts.json", "w") as fh:
            json.dump({str(t): float(v) for t, v in experts.items()}, fh, indent=1, sort_keys=True)
    return save_correctness(folder / f"{name}_correct.npz", hits)


def load_stage_results(folder: str | Path, name: str
                       ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, float] | None] | None:
    """:func:`save_stage_results`' files back: ``(hits, experts)``, None where ``<name>_correct.npz`` is absent."""
    import json

    folder = Path(folder)
    if not (folder / f"{name}_correct.npz").is_file():
        return None
    ex = folder / f"{name}_experts.json"
    return load_correctness(folder / f"{name}_correct.npz"), json.loads(ex.read_text()) if ex.is_file() else None


def stage_difference(hits: Mapping[str, Mapping[str, np.ndarray]], experts: Mapping[str, float] | None, a: str,
                     b: str) -> tuple[float, float | None]:
    """Row ``a`` minus row ``b`` of a stage ablation's per-example results: the mean over tasks of the accuracy
    difference in points (normalized by ``experts`` where given) and its paired standard error."""
    if a not in hits or b not in hits:
        raise InputError(f"stage results lack row {a if a not in hits else b!r}; rows: {sorted(hits)}")
    tasks = sorted(set(hits[a]) & set(hits[b]))
    scale = {t: float(experts[t]) for t in tasks} if experts is not None else {t: 1.0 for t in tasks}
    diff = 100 * float(np.mean([(hits[a][t].mean() - hits[b][t].mean()) / scale[t] for t in tasks]))
    return diff, paired_se({t: hits[a][t] for t in tasks}, {t: hits[b][t] for t in tasks},
                           scale if experts is not None else None)
