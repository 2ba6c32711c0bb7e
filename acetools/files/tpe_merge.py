"""``acetools merge --search eval.py:function --searcher tpe``: several hyperparameters (and, with ``--method auto``,
the method) chosen by the user's evaluation with Optuna's TPE (docs/your-models.md §Several hyperparameters at
once: TPE; the space is :data:`acetools.tpe.SPACES`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, InputTypeError
from ..executor import Executor, as_executor
from ..tpe import SPACES, TPEResult, Trial, auto_methods, require_optuna, tpe_search
from ..utils import atomic_write
from .checkpoints import check_output_folder
from .heads import expert_names
from .lineage import check_lineage
from .merge_files import merge_files, plan_merge
from .search_merge import PLAN_KEYS, Evaluate, on_storage, score_candidate
from .staging import SEARCH_MARK, lock_output, remove_stale_stages

__all__ = ["DEFAULT_TRIALS", "TPEMerge", "fitting_methods", "tpe_search_merge"]

#: Trials when none are given: a fifth of a 30-value grid, per method searched.
DEFAULT_TRIALS = 6


@dataclass
class TPEMerge:
    """The outcome of :func:`tpe_search_merge`: the search, the chosen method and hyperparameters, the merge."""

    result: TPEResult
    skipped: dict[str, str]  # method -> why it does not fit the inputs (method="auto")
    merge: Any  # acetools.files.merge_files.MergeResult of the chosen merge
    batch: int = 1  # trials asked for together (tpe_search's batch)

    @property
    def method(self) -> str:
        return self.result.best.method

    @property
    def hparams(self) -> dict[str, float]:
        return self.result.best.hparams

    def record(self) -> dict[str, Any]:
        """What goes into ``acetools_merge.json`` under ``"search"``."""
        best = self.result.best
        return {"searcher": "tpe", "seed": self.result.seed, "trials": len(self.result.trials), "batch": self.batch,
                "methods": self.result.methods, "skipped": self.skipped,
                "space": {m: {k: vars(d) for k, d in SPACES[m].items()} for m in self.result.methods},
                "objective": "mean of the user's scores over the tasks",
                "method": best.method, "hparams": best.hparams, "mean": best.mean,
                "per_method": self.result.per_method(),
                "trace": [{"trial": t.number, "method": t.method, "hparams": t.hparams, "mean": t.mean,
                           "scores": t.scores} for t in self.result.trials]}

    def table(self) -> str:
        """Per method tried: its best mean and hyperparameters, the chosen one marked."""
        lines = [f"{'method':>16}  {'trials':>6}  {'best mean':>10}  hyperparameters"]
        for m, row in sorted(self.result.per_method().items(), key=lambda kv: -kv[1]["best_mean"]):
            hp = ", ".join(f"{k}={v:.4g}" for k, v in row["hparams"].items())
            mark = "  <- chosen" if m == self.method else ""
            lines.append(f"{m:>16}  {row['trials']:>6}  {row['best_mean']:>10.4f}  {hp}{mark}")
        return "\n".join(lines)


def fitting_methods(base: Any, experts: Sequence[Any], **plan_keys: Any) -> tuple[list[str], dict[str, str]]:
    """The methods of :func:`acetools.tpe.auto_methods` that plan on these inputs (layout, shapes), and
    why each other one does not."""
    fit, skipped = [], {}
    for m in auto_methods():
        try:
            plan_merge(m, base, experts, **plan_keys)
        except InputError as e:
            skipped[m] = str(e)
        else:
            fit.append(m)
    return fit, skipped


def tpe_search_merge(method: str, base: Any, experts: Sequence[Any], out: str | Path, evaluate: Evaluate, *,
                     trials: int | None = None, seed: int = 0, hparams: Mapping[str, Any] | None = None,
                     report: Callable[[str], None] | None = None, executor: str | Executor | None = None,
                     batch: int | None = None, **merge_options: Any) -> TPEMerge:
    """Choose ``method``'s searched hyperparameters (``method="auto"``: the method too, among
    :func:`fitting_methods`) with ``evaluate(model folder, task) -> score`` in ``trials`` TPE trials
    (default :data:`DEFAULT_TRIALS` per method), seeded with ``seed``, and write the best merge to ``out``.

    Each candidate is merged into a hidden temporary folder beside ``out``, scored on each task, and
    removed, as :func:`acetools.files.search_merge.search_merge` does; the lineage check runs once.
    ``executor`` (:mod:`acetools.executor`) runs each ``batch`` of trials together (default: as many as it runs
    at once, 1 serially); a batch > 1 changes the trials TPE draws, the same for the same batch under either
    executor (docs/your-models.md §On a Ray cluster).
    """
    if not callable(evaluate):
        raise InputTypeError("evaluate must be a callable (model folder, task name) -> score")
    require_optuna()  # before any file is opened
    hp = dict(hparams or {})
    plan_keys = {k: merge_options[k] for k in PLAN_KEYS if k in merge_options}
    if method == "auto":
        if hp:
            raise InputError(f"--method auto chooses every method's hyperparameters; drop -p {next(iter(hp))}=...")
        names, skipped = fitting_methods(base, experts, **plan_keys)
        if not names:
            raise InputError("--method auto: no method fits these inputs (" + "; ".join(
                f"{m}: {why}" for m, why in skipped.items()) + ")")
    else:
        if method not in SPACES:
            raise InputError(f"{method} has no TPE search space; --searcher tpe works with {', '.join(SPACES)}")
        names, skipped = [method], {}
    plan = plan_merge(names[0], base, experts, hparams=hp, **plan_keys)
    check_lineage(plan.base, plan.experts, plan.layout, force=merge_options.get("force", False))
    merge_options = {**merge_options, "force": True}
    tasks = list(plan.heads.names) or expert_names(plan.experts)
    n_trials = DEFAULT_TRIALS * len(names) if trials is None else trials
    ex = as_executor(executor)
    out = check_output_folder(out, [plan.base, *plan.experts], overwrite=merge_options.get("overwrite", False))
    with lock_output(out):  # the whole search: a second merge into out is refused at once
        remove_stale_stages(out)
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}{SEARCH_MARK}{os.getpid()}-", dir=out.parent)).resolve()
        count = iter(range(10**6))
        where = on_storage(base), [on_storage(e) for e in experts]  # a worker's folder may be another

        def score_many(asked: list[tuple[str, dict[str, float]]]) -> list[dict[str, float]]:
            jobs = {}
            for m, values in asked:
                i = next(count)
                jobs[f"trial {i}: {m} {values}"] = (scratch / f"candidate-{i}", m, *where, {**hp, **values},
                                                    merge_options, tasks, evaluate, f"trial {i}: {m} {values}")
            if ex.kind == "serial" and len(jobs) == 1:  # one at a time: the candidate's own error
                return [ex.one(score_candidate, next(iter(jobs.values())))]
            return list(ex.map(score_candidate, jobs, progress_bar=False).values())

        def line(t: Trial) -> None:
            if report is not None:
                hp_text = ", ".join(f"{k}={v:.4g}" for k, v in t.hparams.items())
                report(f"trial {t.number}: {t.method} {hp_text}: mean {t.mean:.4f}")

        batch = ex.parallel if batch is None else batch
        try:
            res = tpe_search(lambda m, values: score_many([(m, values)])[0], names, n_trials, seed=seed, fixed=hp,
                             report=line, batch=batch, score_many=score_many)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        best = res.best
        chosen = merge_files(best.method, base, experts, out, hparams={**hp, **best.hparams}, **merge_options)
        outcome = TPEMerge(res, skipped, chosen, batch)
        assert chosen.out is not None, "merge_files wrote no folder"
        chosen.info["search"] = outcome.record()  # chosen.info is what acetools_merge.json holds
        with atomic_write(chosen.out / "acetools_merge.json", "w") as fh:
            json.dump(chosen.info, fh, indent=2)
        return outcome
