"""Coefficient search shared by every merge method (docs/methods.md §Benchmark protocol, §ESM).

``score_fn(alpha) -> {task: absolute accuracy}``; with ``reference`` (task -> expert accuracy)
normalized accuracies too. The first evaluated coefficient with the best ``select`` metric wins
(strict ``>``, as the official ``find_optimal_coef``); every evaluation is in :attr:`SearchResult.trace`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from ._protocol import PATIENCE, SHORT_GRID
from .errors import InputError, InputKeyError, InputTypeError

__all__ = ["PATIENCE", "SHORT_GRID", "LAMBDA_GRID", "ALPHA_GRID", "ESM_BRACKET", "Evaluation", "SearchResult",
           "check_patience", "grid_search", "golden_section_search", "esm_search", "climb_search"]


#: Task arithmetic, TIES and similar: linspace(0, 1, 31)[1:] = {1/30, ..., 1} (docs/methods.md §Benchmark protocol).
LAMBDA_GRID: tuple[float, ...] = tuple(np.linspace(0.0, 1.0, 31)[1:].tolist())
#: TSV-M, Iso-C, Iso-CTS: linspace(0, 3, 31)[1:] = {0.1, ..., 3.0} (docs/methods.md §Benchmark protocol).
ALPHA_GRID: tuple[float, ...] = tuple(np.linspace(0.0, 3.0, 31)[1:].tolist())
#: ESM's golden-section bracket [0, 2] (docs/methods.md §ESM, Eqs. (ESM.11)-(ESM.12)).
ESM_BRACKET: tuple[float, float] = (0.0, 2.0)

ScoreFn = Callable[[float], Mapping[str, float]]
_METRICS = {"normalized": "avg_normalized", "absolute": "avg_absolute"}


@dataclass(frozen=True)
class Evaluation:
    """One call of ``score_fn``: the coefficient and what it scored."""

    alpha: float
    scores: dict[str, float]  # task -> absolute accuracy
    normalized: dict[str, float] | None  # task -> acc / reference[task]; None without reference
    avg_absolute: float
    avg_normalized: float | None

    def metric(self, name: str) -> float:
        return getattr(self, _METRICS[name])  # a normalized one needs reference= (_check_metric)


@dataclass
class SearchResult:
    """The outcome of a search: ``best`` coefficient, its score, and every evaluation."""

    best: float
    best_score: float  # value of the ``select`` metric at ``best``
    objective: str  # metric that drove the search
    select: str  # metric that picked ``best``
    method: str  # "grid" or "golden_section"
    trace: list[Evaluation] = field(default_factory=list)  # in evaluation order
    stopped_early: bool = False

    @property
    def best_evaluation(self) -> Evaluation:
        return next(e for e in self.trace if e.alpha == self.best)

    @property
    def alphas(self) -> list[float]:
        return [e.alpha for e in self.trace]

    def to_frame(self):
        """The trace, one row per coefficient: ``step``, ``alpha``, ``avg_top1``, ``avg_normalized_top1``,
        ``is_best``, ``<task>:top1``, ``<task>:normalized_top1`` (the official code's columns)."""
        import pandas as pd

        rows = []
        for i, e in enumerate(self.trace):
            avg_norm = math.nan if e.avg_normalized is None else e.avg_normalized
            row: dict[str, Any] = {"step": i, "alpha": e.alpha, "avg_top1": e.avg_absolute,
                                   "avg_normalized_top1": avg_norm, "is_best": e.alpha == self.best}
            row.update({f"{t}:top1": v for t, v in e.scores.items()})
            if e.normalized is not None:
                row.update({f"{t}:normalized_top1": v for t, v in e.normalized.items()})
            rows.append(row)
        return pd.DataFrame(rows)


class _Evaluator:
    """Calls score_fn once per distinct alpha, validates and records the result."""

    def __init__(self, score_fn: ScoreFn, reference: Mapping[str, float] | None):
        if not callable(score_fn):
            raise InputTypeError("score_fn must be a callable alpha -> {task: accuracy}")
        self.score_fn = score_fn
        if reference is not None and not isinstance(reference, Mapping):
            raise InputTypeError("reference must be a dict task -> fine-tuned expert accuracy")
        for t, v in (reference or {}).items():
            if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or v <= 0:
                raise InputError(f"reference[{t!r}] = {v!r}; expert accuracies must be positive finite numbers")
        self.reference = None if reference is None else {str(t): float(v) for t, v in reference.items()}
        self.trace: list[Evaluation] = []
        self._cache: dict[float, Evaluation] = {}
        self._tasks: set[str] | None = None

    def __call__(self, alpha: float) -> Evaluation:
        alpha = float(alpha)
        if alpha in self._cache:
            return self._cache[alpha]
        raw = self.score_fn(alpha)
        if not isinstance(raw, Mapping) or len(raw) == 0:
            raise InputTypeError(
                f"score_fn({alpha}) returned {type(raw).__name__}; it must return a non-empty dict task -> accuracy"
            )
        scores = {}
        for task, v in raw.items():
            if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v):
                raise InputError(f"score_fn({alpha}) gave {v!r} for task {task!r}; accuracies must be finite numbers")
            scores[str(task)] = float(v)
        if self._tasks is None:
            self._tasks = set(scores)
        elif set(scores) != self._tasks:
            diff = sorted(self._tasks ^ set(scores))
            raise InputError(f"score_fn({alpha}) returned a different set of tasks than before (differs in {diff})")
        normalized = avg_norm = None
        if self.reference is not None:
            missing = sorted(set(scores) - set(self.reference))
            if missing:
                raise InputKeyError(f"reference has no expert accuracy for task {missing[0]!r}; add it to reference=")
            normalized = {t: v / self.reference[t] for t, v in scores.items()}
            avg_norm = float(np.mean(list(normalized.values())))
        ev = Evaluation(alpha, scores, normalized, float(np.mean(list(scores.values()))), avg_norm)
        self._cache[alpha] = ev
        self.trace.append(ev)
        return ev


def _check_metric(argname: str, value: str, reference) -> None:
    if value not in _METRICS:
        raise InputError(f"{argname}={value!r} is not one of {list(_METRICS)}")
    if value == "normalized" and reference is None:
        raise InputError(
            f"{argname}='normalized' needs reference={{task: expert accuracy}}; pass it or use {argname}='absolute'"
        )


def _pick(trace: list[Evaluation], metric: str) -> Evaluation:
    return max(trace, key=lambda e: e.metric(metric))  # the first maximum wins (strict >), as find_optimal_coef


def _check_grid(grid: Sequence[float]) -> list[float]:
    grid = [float(a) for a in grid]
    if not grid:
        raise InputError("grid is empty: pass at least one coefficient (e.g. acetools.search.LAMBDA_GRID)")
    if not all(math.isfinite(a) for a in grid):
        raise InputError("grid contains a non-finite coefficient")
    return grid


def check_patience(patience: Any) -> None:
    """A grid search's ``patience`` is ``None`` or a positive int (``InputError`` naming it otherwise)."""
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
        raise InputError(f"patience={patience!r} must be None or a positive int (the ISO code uses 3)")


def grid_search(score_fn: ScoreFn, grid: Sequence[float], *, reference: Mapping[str, float] | None = None,
                objective: str = "normalized", patience: int | None = None, short: int = SHORT_GRID) -> SearchResult:
    """Evaluate ``score_fn`` on ``grid`` in order and keep the best coefficient (docs/methods.md §Benchmark protocol).

    ``patience``: stop after that many evaluations without a strict gain of the average absolute
    accuracy, counted only once the curve has risen above its first value (None: the whole grid).
    A grid of at most ``short`` coefficients is searched whole.
    """
    _check_metric("objective", objective, reference)
    grid = _check_grid(grid)
    check_patience(patience)
    if isinstance(short, bool) or not isinstance(short, int) or short < 0:
        raise InputError(f"short={short!r} must be an int >= 0")
    if len(grid) <= short:
        patience = None
    ev = _Evaluator(score_fn, reference)
    first, best_abs, bad, risen, stopped = None, -math.inf, 0, False, False
    for i, a in enumerate(grid):
        e = ev(a)
        if patience is None:
            continue
        if first is None:
            first = best_abs = e.avg_absolute
            continue
        if e.avg_absolute > best_abs:
            best_abs, bad, risen = e.avg_absolute, 0, True
        elif risen:  # patience counts only once the curve has risen above its start
            bad += 1
            if bad >= patience:
                stopped = i < len(grid) - 1
                break
    best = _pick(ev.trace, objective)
    return SearchResult(best.alpha, best.metric(objective), objective, objective, "grid", ev.trace, stopped)


def golden_section_search(score_fn: ScoreFn, lo: float, hi: float, *, tol: float = 0.01, max_iter: int = 15,
                          reference: Mapping[str, float] | None = None, objective: str = "normalized",
                          select: str | None = None) -> SearchResult:
    """Golden-section search for the alpha in [lo, hi] maximising the ``objective`` average, as the ESM
    code's ``evaluate_task_vector_search`` (docs/methods.md §ESM, Eqs. (ESM.11)-(ESM.12)): at most
    ``max_iter + 2`` evaluations, stopping once the bracket is narrower than ``tol``. ``select``
    (default ``objective``) picks the reported ``best`` among all evaluated alphas.
    """
    select = objective if select is None else select
    _check_metric("objective", objective, reference)
    _check_metric("select", select, reference)
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise InputError(f"need finite lo < hi, got lo={lo}, hi={hi}")
    if not (isinstance(tol, Real) and tol > 0):
        raise InputError(f"tol={tol!r} must be > 0")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 0:
        raise InputError(f"max_iter={max_iter!r} must be an int >= 0")
    ev = _Evaluator(score_fn, reference)
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = ev(c).metric(objective), ev(d).metric(objective)
    for _ in range(max_iter):
        if fc > fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = ev(c).metric(objective)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = ev(d).metric(objective)
        if abs(b - a) < tol:
            break
    best = _pick(ev.trace, select)
    return SearchResult(best.alpha, best.metric(select), objective, select, "golden_section", ev.trace)


def esm_search(score_fn: ScoreFn, reference: Mapping[str, float], *, lo: float = ESM_BRACKET[0],
               hi: float = ESM_BRACKET[1], tol: float = 0.01, max_iter: int = 15) -> SearchResult:
    """ESM's alpha rule (docs/methods.md §ESM, Eqs. (ESM.11)-(ESM.12)): golden section driven by the
    average absolute accuracy, then the evaluated alpha with the best average normalized accuracy."""
    return golden_section_search(
        score_fn, lo, hi, tol=tol, max_iter=max_iter, reference=reference, objective="absolute", select="normalized"
    )


def climb_search(score_fn: ScoreFn, grid: Sequence[float], *, reference: Mapping[str, float] | None = None,
                 objective: str = "normalized", start: float = 1.0, patience: int = 1) -> SearchResult:
    """A hill climb over the sorted ``grid`` for a unimodal objective (not a paper's protocol; the
    notebooks use it where many merges each need an alpha): from the value nearest ``start`` towards
    the better neighbour, stopping after ``patience`` steps without a strict gain or at the grid's end.
    """
    _check_metric("objective", objective, reference)
    g = sorted(set(_check_grid(grid)))
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise InputError(f"patience={patience!r} must be a positive int")
    if isinstance(start, bool) or not isinstance(start, Real) or not math.isfinite(start):
        raise InputError(f"start={start!r} must be a finite number")
    ev = _Evaluator(score_fn, reference)

    def f(i: int) -> float:
        return ev(g[i]).metric(objective)

    i = min(range(len(g)), key=lambda j: abs(g[j] - start))
    best = f(i)
    nbrs = {d: f(i + d) for d in (-1, 1) if 0 <= i + d < len(g)}
    if nbrs and max(nbrs.values()) > best:
        step = max(nbrs, key=lambda d: nbrs[d])
        i, best, bad = i + step, nbrs[step], 0
        while 0 <= i + step < len(g) and bad < patience:
            i += step
            v = f(i)
            if v > best:
                best, bad = v, 0
            else:
                bad += 1
    top = _pick(ev.trace, objective)
    return SearchResult(top.alpha, top.metric(objective), objective, objective, "climb", ev.trace)
