"""A searcher that needs fewer evaluations: Optuna's TPE over several hyperparameters at once, and over the
method too (docs/your-models.md §Several hyperparameters at once: TPE).

:mod:`acetools.search` chooses one coefficient on a grid or by golden section; here each trial draws a
method (``method="auto"``: a categorical over :func:`auto_methods`) and that method's hyperparameters
from :data:`SPACES`, the one place that declares what is searched, and ``score_fn(method, hparams)``
returns ``{task: score}`` (higher is better). The sampler is seeded through
:func:`acetools.utils.seed_everything`, so one seed gives the same trials. Optuna is optional
(``pip install 'acetools[search]'``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError, InputTypeError
from .merging import METHODS
from .utils import seed_everything

__all__ = ["Dim", "SPACES", "Trial", "TPEResult", "auto_methods", "require_optuna", "tpe_search"]


@dataclass(frozen=True)
class Dim:
    """One searched hyperparameter: a float (``log``: on a log scale) or an ``integer`` in [low, high]."""

    low: float
    high: float
    log: bool = False
    integer: bool = False


#: The searched space per method: each coefficient's range is that of its grid (docs/methods.md §Benchmark
#: protocol: λ in (0, 1] for task arithmetic and TIES, α in (0, 3] for TSV-M and Iso-C/CTS, ACE's scaling on
#: ACE_SCALED's [0.1, 2]), with the method's other hyperparameter(s) beside it.
SPACES: Mapping[str, Mapping[str, Dim]] = {
    "task_arithmetic": {"lam": Dim(1 / 30, 1.0)},
    "ties": {"lam": Dim(1 / 30, 1.0), "k": Dim(5, 100, integer=True)},  # k: % of entries kept
    "dare": {"lam": Dim(1 / 30, 1.0), "p": Dim(0.1, 0.9)},
    "tsv_m": {"alpha": Dim(0.1, 3.0)},
    "iso_c": {"alpha": Dim(0.1, 3.0)},
    "iso_cts": {"alpha": Dim(0.1, 3.0), "common_fraction": Dim(0.5, 0.95)},
    "cart": {"lam": Dim(0.1, 3.0), "rank_ratio": Dim(0.02, 0.5, log=True)},
    "ace": {"scaling": Dim(0.1, 2.0), "eps": Dim(1e-4, 1e-1, log=True)},
}


def require_optuna():
    """The ``optuna`` module, or a one-line error saying how to install it."""
    try:
        import optuna
    except ImportError:
        raise InputError("the TPE searcher needs optuna: pip install 'acetools[search]' (or pip install optuna)"
                         ) from None
    return optuna


def auto_methods() -> list[str]:
    """The methods ``method="auto"`` chooses among: those with a searched space that take no data input
    (RegMean's Gram matrices, ESM's activations), in :data:`SPACES`' order."""
    return [m for m in SPACES if m in METHODS and not METHODS[m].data_inputs]


@dataclass(frozen=True)
class Trial:
    """One evaluation: the method, its searched hyperparameters and the scores per task."""

    number: int
    method: str
    hparams: dict[str, float]
    scores: dict[str, float]

    @property
    def mean(self) -> float:
        return sum(self.scores.values()) / len(self.scores)


@dataclass
class TPEResult:
    """The outcome of :func:`tpe_search`: every trial in order; the best one (the first highest mean)."""

    methods: list[str]
    seed: int
    trials: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Trial:
        return max(self.trials, key=lambda t: t.mean)  # the first maximum wins, as acetools.search

    def per_method(self) -> dict[str, dict[str, Any]]:
        """Per method tried: its best mean, the hyperparameters that gave it and its number of trials."""
        out: dict[str, dict[str, Any]] = {}
        for m in self.methods:
            mine = [t for t in self.trials if t.method == m]
            if mine:
                top = max(mine, key=lambda t: t.mean)
                out[m] = {"best_mean": top.mean, "hparams": top.hparams, "trials": len(mine)}
        return out


def _check_methods(methods: str | Sequence[str]) -> list[str]:
    names = auto_methods() if methods == "auto" else [methods] if isinstance(methods, str) else list(methods)
    if not names:
        raise InputError("tpe_search needs at least one method (or 'auto')")
    for m in names:
        if m not in SPACES:
            raise InputError(f"{m} has no TPE search space; the TPE searcher works with {', '.join(SPACES)} "
                             "(acetools.tpe.SPACES)")
    return names


def tpe_search(score_fn: Callable[[str, dict[str, float]], Mapping[str, float]], methods: str | Sequence[str],
               trials: int, *, seed: int = 0, fixed: Mapping[str, Any] | None = None,
               report: Callable[[Trial], None] | None = None, batch: int = 1,
               score_many: Callable[[list[tuple[str, dict[str, float]]]], Sequence[Mapping[str, float]]] | None = None
               ) -> TPEResult:
    """Run ``trials`` evaluations chosen by Optuna's TPE sampler (seeded with ``seed``).

    ``methods``: one method, a list, or ``"auto"`` (:func:`auto_methods`); with more than one the method is
    a categorical and each has its own hyperparameters (:data:`SPACES`). ``fixed``: hyperparameters the
    user gave, left out of the space. ``score_fn(method, hparams) -> {task: score}``. ``batch``: trials
    asked for together and scored by ``score_many([(method, hparams), ...])`` (e.g. in parallel) before
    any is told; a batch of N > 1 draws other trials than N = 1, the same ones for the same N and seed
    (docs/your-models.md §On a Ray cluster).
    """
    if not callable(score_fn):
        raise InputTypeError("score_fn must be a callable (method, hparams) -> {task: score}")
    for name, n in (("trials", trials), ("batch", batch)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"{name}={n!r} must be a positive int")
    names = _check_methods(methods)
    fixed = dict(fixed or {})
    for m in names:
        both = sorted(set(fixed) & set(SPACES[m]))
        if len(names) == 1 and len(both) == len(SPACES[m]):
            raise InputError(f"--searcher tpe chooses {m}'s {', '.join(both)}; do not also give -p {both[0]}=...")
    optuna = require_optuna()
    seed_everything(seed)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # the first trials are random (n_startup_trials), then TPE; multivariate: the hyperparameters jointly
    with warnings.catch_warnings():  # multivariate and group are marked experimental in optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, max(1, trials // 3)),
                                             multivariate=True, group=len(names) > 1)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    result = TPEResult(names, seed)
    tasks: list[set[str]] = []
    for start in range(0, trials, batch):
        asked = [_ask(study, names, fixed) for _ in range(min(batch, trials - start))]
        raws = (score_many([(m, dict(hp)) for _, m, hp in asked]) if score_many is not None
                else [score_fn(m, dict(hp)) for _, m, hp in asked])
        for number, (trial, method, hp), raw in zip(range(start, trials), asked, raws):
            done = Trial(number, method, hp, _checked(raw, method, hp, tasks))
            study.tell(trial, done.mean)
            result.trials.append(done)
            if report is not None:
                report(done)
    return result


def _ask(study: Any, names: list[str], fixed: Mapping[str, Any]) -> tuple[Any, str, dict[str, float]]:
    """One trial asked of ``study``: its method (a categorical when there are several) and hyperparameters."""
    trial = study.ask()
    method = trial.suggest_categorical("method", names) if len(names) > 1 else names[0]
    hp: dict[str, float] = {}
    for name, d in SPACES[method].items():
        if name in fixed:
            continue
        label = f"{method}.{name}"
        hp[name] = (trial.suggest_int(label, int(d.low), int(d.high), log=d.log) if d.integer else
                    trial.suggest_float(label, d.low, d.high, log=d.log))
    return trial, method, hp


def _checked(raw: Any, method: str, hp: dict[str, float], tasks: list[set[str]]) -> dict[str, float]:
    """``score_fn``'s answer as ``{task: float}``: a non-empty mapping of finite numbers over the same tasks as
    the first trial's (``tasks``: that set, once known)."""
    if not isinstance(raw, Mapping) or not raw:
        raise InputTypeError(f"score_fn({method}, {hp}) returned {type(raw).__name__}; it must return a "
                             "non-empty dict task -> score")
    scores = {}
    for task, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(f"score_fn({method}, {hp}) gave {v!r} for task {task!r}; scores must be finite "
                             "numbers")
        scores[str(task)] = float(v)
    if not tasks:
        tasks.append(set(scores))
    elif set(scores) != tasks[0]:
        raise InputError(f"score_fn({method}, {hp}) returned a different set of tasks than before "
                         f"(differs in {sorted(tasks[0] ^ set(scores))})")
    return scores
