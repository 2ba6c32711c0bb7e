"""Choose a method's coefficient with your own evaluation: ``acetools merge --search eval.py:function``
(docs/your-models.md §Coefficients chosen by your evaluation), by the protocol of :mod:`acetools.search`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ..errors import InputError, InputTypeError
from ..executor import Executor, as_executor
from ..merging import METHODS, Search
from ..search import PATIENCE, golden_section_search, grid_search
from ..utils import atomic_write
from .checkpoints import check_output_folder
from .heads import expert_names
from .lineage import check_lineage
from .merge_files import merge_files, plan_merge
from .staging import SEARCH_MARK, lock_output, remove_stale_stages

__all__ = ["Evaluate", "load_evaluation", "searched", "SearchMerge", "search_merge", "score_candidate", "PLAN_KEYS",
           "on_storage"]

#: The options of a merge that its plan reads (:func:`acetools.files.merge_files.plan_merge`), which a search
#: checks once before its candidates (``force``: an adapter's base name, docs/your-models.md §LoRA adapters as experts).
PLAN_KEYS = ("layout", "heads", "names", "mode", "force_layout", "vocab", "force", "lowrank")

#: The signature of a user's evaluation: (merged folder, task name) -> score (higher is better).
Evaluate = Callable[[Path, str], float]


def load_evaluation(spec: str) -> Evaluate:
    """``"path/to/eval.py:function"`` -> that function (the file is imported as a module)."""
    path, sep, name = str(spec).rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise InputError(f"--search {spec!r}: write it as path/to/eval.py:function")
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"--search: no evaluation file {file}")
    module_spec = importlib.util.spec_from_file_location(f"acetools_user_eval_{file.stem}", file)
    if module_spec is None or module_spec.loader is None:
        raise InputError(f"--search: {file} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"--search: {file} has no function {name!r}")
    return cast(Evaluate, fn)


def searched(method: str) -> Search:
    """The coefficient ``method``'s search chooses (its registry entry; ACE: ``scaling`` on
    :data:`acetools.benchmark.ACE_SCALED`'s grid). An error for methods without one."""
    if method not in METHODS:
        raise InputError(f"unknown merge method {method!r}; valid methods are: {', '.join(sorted(METHODS))}")
    from ..benchmark import ACE_SCALED_ROW

    # the registry's entry, else a searched variant the benchmark declares (ACE's scaling, ACE_SCALED_ROW)
    declared = {row["method"]: row["search"] for row in ACE_SCALED_ROW.values()}
    found = METHODS[method].search or declared.get(method)
    if found is not None:
        return found
    with_search = sorted(m for m in METHODS if METHODS[m].search is not None or m in declared)
    raise InputError(f"{method} has no searched coefficient (its coefficient is fixed); --search works with "
                     f"{', '.join(with_search)}")


@dataclass
class SearchMerge:
    """The outcome of :func:`search_merge`: the coefficient, its chosen value, the search and the merge."""

    param: str
    value: float
    result: Any  # acetools.search.SearchResult
    merge: Any  # acetools.files.merge_files.MergeResult of the chosen merge

    def record(self) -> dict[str, Any]:
        """What goes into ``acetools_merge.json`` under ``"search"``."""
        return {"param": self.param, "value": self.value, "objective": "mean of the user's scores over the tasks",
                "kind": self.result.method, "stopped_early": self.result.stopped_early,
                "trace": [{"value": e.alpha, "mean": e.avg_absolute, "scores": e.scores} for e in self.result.trace]}

    def table(self) -> str:
        """The trace as text: one line per evaluated value, the chosen one marked."""
        tasks = list(self.result.trace[0].scores) if self.result.trace else []
        lines = [f"{self.param:>8}  {'mean':>8}  " + "  ".join(f"{t:>10}" for t in tasks)]
        for e in self.result.trace:
            mark = "  <- chosen" if e.alpha == self.value else ""
            lines.append(f"{e.alpha:>8.4g}  {e.avg_absolute:>8.4f}  "
                         + "  ".join(f"{e.scores[t]:>10.4f}" for t in tasks) + mark)
        return "\n".join(lines)


def on_storage(path: Any) -> Any:
    """A checkpoint given as a path, made absolute (a Ray worker's working folder is not this one's); other
    inputs as they are."""
    found = isinstance(path, (str, os.PathLike)) and Path(path).expanduser().exists()
    return Path(path).expanduser().resolve() if found else path


def score_candidate(folder: Path, method: str, base: Any, experts: Sequence[Any], hparams: Mapping[str, Any],
                    merge_options: Mapping[str, Any], tasks: Sequence[str], evaluate: Evaluate, where: str
                    ) -> dict[str, float]:
    """One candidate of a search: merged into the scratch ``folder`` (no input hashes, and no per-task folders,
    which only the chosen merge writes), scored by ``evaluate`` on every task, then removed; a score that is not
    a finite number is an error naming the task and the candidate (``where``)."""
    merge_files(method, base, experts, folder, hparams=dict(hparams), hash_inputs=False,
                **{**merge_options, "per_task_out": None})
    try:
        scores = {}
        for task in tasks:
            s = evaluate(folder, task)
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(float(s)):
                raise InputError(f"--search: the evaluation returned {s!r} for task {task!r} at {where}; it must "
                                 "return a finite number")
            scores[task] = float(s)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return scores


def search_merge(method: str, base: Any, experts: Sequence[Any], out: str | Path, evaluate: Evaluate, *,
                 hparams: Mapping[str, Any] | None = None, patience: int | None = None,
                 report: Callable[[str], None] | None = None, executor: str | Executor | None = None,
                 **merge_options: Any) -> SearchMerge:
    """Search ``method``'s coefficient (:func:`searched`) with ``evaluate(model folder, task) -> score`` (higher
    is better) and write the chosen merge to ``out``.

    Every candidate is merged with :func:`acetools.files.merge_files.merge_files` (``merge_options``)
    into a hidden temporary folder beside ``out``, scored on each task, and removed. ``patience``:
    the grid search's early stop. ``report(line)`` is called after each evaluation. The lineage check
    (``force``) runs once, before the candidates. ``executor``: where the candidates run
    (:mod:`acetools.executor`; ``"ray"``: a grid's next candidates run ahead in parallel, the search
    reads their scores in the grid's order, so it chooses as serially; docs/your-models.md §On a Ray cluster).
    """
    if not callable(evaluate):
        raise InputTypeError("evaluate must be a callable (model folder, task name) -> score")
    search = searched(method)
    hp = dict(hparams or {})
    if search.param in hp:
        raise InputError(f"--search chooses {method}'s {search.param}; do not also give -p {search.param}=...")
    plan_keys = {k: merge_options[k] for k in PLAN_KEYS if k in merge_options}
    plan = plan_merge(method, base, experts, hparams=hp, **plan_keys)
    # is the base the experts' parent? checked once here, not for every candidate
    check_lineage(plan.base, plan.experts, plan.layout, force=merge_options.get("force", False))
    merge_options = {**merge_options, "force": True}
    tasks = list(plan.heads.names) or expert_names(plan.experts)
    ex = as_executor(executor)
    where = on_storage(base), [on_storage(e) for e in experts]  # a worker's folder may be another
    out = check_output_folder(out, [plan.base, *plan.experts], overwrite=merge_options.get("overwrite", False))
    with lock_output(out):  # the whole search: a second merge into out is refused at once
        remove_stale_stages(out)
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}{SEARCH_MARK}{os.getpid()}-", dir=out.parent)).resolve()

        def job(i: int, value: float) -> tuple:  # score_candidate's arguments: paths and small values
            return (scratch / f"candidate-{i}", method, *where, {**hp, search.param: value}, merge_options,
                    tasks, evaluate, f"{search.param}={value:g}")

        def scored(value: float, scores: dict[str, float]) -> dict[str, float]:
            if report is not None:
                report(f"{search.param}={value:g}: mean {sum(scores.values()) / len(scores):.4f}")
            return scores

        try:
            if search.kind == "grid":
                name = {v: f"{search.param}={v:g}" for v in search.grid}
                jobs = ex.stream(score_candidate, {name[v]: job(i, v) for i, v in enumerate(search.grid)})
                try:
                    res = grid_search(lambda v: scored(v, jobs.get(name[v])), search.grid, objective="absolute",
                                      patience=PATIENCE if patience is None else patience)
                finally:
                    jobs.close()
            else:  # golden section on the bracket (ESM's rule without experts' reference scores): one at a time
                count = iter(range(10**6))
                res = golden_section_search(lambda v: scored(v, ex.one(score_candidate, job(next(count), v))),
                                            *search.bracket, objective="absolute")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        value = float(res.best)
        chosen = merge_files(method, base, experts, out, hparams={**hp, search.param: value}, **merge_options)
        outcome = SearchMerge(search.param, value, res, chosen)
        assert chosen.out is not None, "merge_files wrote no folder"
        chosen.info["search"] = outcome.record()  # chosen.info is what acetools_merge.json holds
        with atomic_write(chosen.out / "acetools_merge.json", "w") as fh:
            json.dump(chosen.info, fh, indent=2)
        return outcome
