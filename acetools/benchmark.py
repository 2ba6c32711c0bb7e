"""The benchmark harness: merge a world's experts with any method and evaluate on every task.

:class:`Benchmark` wraps a world (:mod:`acetools.world.base`), collects the data inputs methods
declare (ESM's activations, RegMean's Grams) and chooses each method's coefficient on validation
by the papers' rule (docs/methods.md §Benchmark protocol), then reports test. Every coefficient
enters the merge affinely, so a search merges twice and evaluates many; :meth:`Benchmark.run`
checks that on each run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from torch import Tensor

from .diagnostics import relative_update_norms, task_vector_cosine
from .errors import InputError
from .executor import Executor, as_executor
from .merging import METHODS, Search, is_matrix_param, merge, task_vectors
from .results import aggregate, find_results, load_correctness, row_kind, save_correctness  # aggregate: over seeds
from .search import check_patience, golden_section_search
from .utils import atomic_write, jsonable
from .world.base import EvaluatesAll, MultiTaskWorld, PerExample, SplitData, World, as_world

__all__ = ["Benchmark", "MethodRun", "Search", "package_versions", "aggregate_seeds", "save_row", "load_row"]

StateDict = dict[str, Tensor]
log = logging.getLogger("acetools.benchmark")


#: A searched variant of ACE ("ace" + scaling chosen on validation): does a global scale help ACE?
ACE_SCALED = Search("scaling", "grid", tuple(np.round(np.linspace(0.1, 2.0, 20), 2).tolist()))
#: Its labelled row, as ``acetools bench --ace-scaled`` and the lesson's recompute add it.
ACE_SCALED_ROW: dict[str, dict[str, Any]] = {"ace (scaling on val)": {"method": "ace", "search": ACE_SCALED}}

#: The variant rows of ``acetools bench --variants``: ACE with the gate off (the paper's ViT setting) and at
#: the paper's eps = 1e-5 beside the code's 1e-2 (docs/methods.md §ACE); WUDI at two larger step sizes, which
#: :data:`PICKED` chooses among on validation.
VARIANTS: dict[str, dict[str, Any]] = {
    "ace (gate off)": {"method": "ace", "search": None, "gate": "off"},
    "ace (eps 1e-5)": {"method": "ace", "search": None, "eps": 1e-5},
    "wudi (lr 1e-4)": {"method": "wudi", "search": None, "lr": 1e-4},
    "wudi (lr 1e-3)": {"method": "wudi", "search": None, "lr": 1e-3},
}
#: Rows chosen on validation among variant rows of a hyperparameter that does not enter the merge affinely
#: (:func:`best_on_val`): label -> (hyperparameter, the rows it picks from).
PICKED = {"wudi (lr on val)": ("lr", ("wudi", "wudi (lr 1e-4)", "wudi (lr 1e-3)"))}


def package_versions() -> dict[str, str]:
    """Versions of the packages that shape a result (docs/style.md §14)."""
    out = {"python": platform.python_version()}
    for p in ("acetools", "torch", "open_clip_torch", "numpy"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:  # pragma: no cover
            out[p] = "not installed"
    return out


@dataclass
class MethodRun:
    """The result of one method on one benchmark: per-task scores and the search trace."""

    method: str
    hparams: dict[str, Any]
    coef_name: str | None
    coef: float | None
    val: dict[str, float]  # task -> absolute accuracy at the chosen coefficient
    test: dict[str, float]
    val_normalized: dict[str, float]
    test_normalized: dict[str, float]
    merge_seconds: float
    search: pd.DataFrame | None = field(default=None, repr=False)
    label: str | None = None
    #: seconds collecting the method's data inputs (not in ``merge_seconds``; 0 when cached or none)
    inputs_seconds: float = 0.0
    #: per task, the test examples' correctness where the world scores examples (``<stem>_correct.npz``)
    test_correct: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.label or self.method

    def summary(self) -> dict[str, Any]:
        mean = lambda d: 100 * float(np.mean(list(d.values())))  # noqa: E731
        return {"method": self.name, "coef_name": self.coef_name, "coef": self.coef, "test_acc": mean(self.test),
                "test_normalized": mean(self.test_normalized), "val_normalized": mean(self.val_normalized),
                "merge_seconds": self.merge_seconds, "inputs_seconds": self.inputs_seconds}


class Benchmark:
    """Merge-and-evaluate on one world: ``n_val``/``n_test`` cap the examples per task (None: all);
    ``n_proxy`` ESM's validation proxies per task (seed ``proxy_seed``), ``n_gram`` RegMean's training examples.
    ``source``: a picklable function that loads the same world from storage every worker reads (a module-level
    function and its arguments, e.g. ``functools.partial(load_zoo, root)`` that builds a ``Zoo`` from its cache),
    which :meth:`run_all` with ``executor="ray"`` needs (docs/performance.md §Executors)."""

    def __init__(self, world, *, n_val: int | None = None, n_test: int | None = None, n_proxy: int = 32,
                 n_gram: int = 256, proxy_seed: int = 0, batch_size: int = 512, threads: int | None = None,
                 patience: int | None = None, source: Callable[[], Any] | None = None):
        check_patience(patience)
        self.source = source
        self.options = {"n_val": n_val, "n_test": n_test, "n_proxy": n_proxy, "n_gram": n_gram,
                        "proxy_seed": proxy_seed, "batch_size": batch_size, "threads": threads, "patience": patience}
        self.world: World = as_world(world, batch_size=batch_size, threads=threads)
        self.patience = patience
        self.tasks: list[str] = list(self.world.tasks)
        self.n_val, self.n_test = n_val, n_test
        self.n_proxy, self.n_gram, self.proxy_seed = n_proxy, n_gram, proxy_seed
        self.batch_size, self.threads = batch_size, threads
        self._expert_acc: dict[str, dict[str, float]] = {}
        self._esm_acts: dict | None = None
        self._grams: list | None = None

    # ------------------------------------------------------------------ ingredients
    @property
    def base(self) -> StateDict:
        return self.world.base_state()

    @property
    def experts(self) -> list[StateDict]:
        return [self.world.expert_state(t) for t in self.tasks]

    def cap(self, split: str) -> int | None:
        """The examples per task evaluated on ``split`` (``n_val``/``n_test``; None: all)."""
        return {"val": self.n_val, "test": self.n_test}.get(split)

    def data(self, task: str, split: str):
        """A vision task's split, cut to ``n_val``/``n_test`` rows (prefix: deterministic)."""
        if not isinstance(self.world, SplitData):
            raise InputError(f"the {self.world.kind} world {self.world.name!r} has no data(task, split) "
                             "(acetools.world.base.SplitData): its splits cannot be read here")
        return self.world.data(task, split, self.cap(split))

    def proxy_batch(self, task: str):
        """ESM's proxies: ``n_proxy`` seeded validation inputs of ``task`` (docs/methods.md §ESM, Eq. (ESM.1))."""
        return self.world.proxy_inputs(task, self.n_proxy, self.proxy_seed)

    def matrix_keys(self) -> list[str]:
        return self.world.matrix_keys()

    def esm_activations(self) -> dict[str, list[Tensor]]:
        """Input activations of ESM's target layers inside each task's fine-tuned model."""
        if self._esm_acts is None:
            keys = self.matrix_keys()
            acts: dict[str, list[Tensor]] = {k: [] for k in keys}
            for t, state in zip(self.tasks, self.experts):
                got = self.world.layer_inputs(state, self.proxy_batch(t), keys)
                for k in keys:
                    acts[k].append(got[k].float())
            self._esm_acts = acts
        return self._esm_acts

    def grams(self) -> list[dict[str, Tensor]]:
        """RegMean's per-task Gram matrices of each hookable layer's inputs in the task's fine-tuned model
        (docs/methods.md §RegMean)."""
        if self._grams is None:
            keys = self.matrix_keys()
            out = []
            for t, state in zip(self.tasks, self.experts):
                task_grams = self.world.gram_inputs(state, self.world.gram_examples(t, self.n_gram), keys)
                out.append({k: v.float() for k, v in task_grams.items()})
            self._grams = out
        return self._grams

    def esm_targets(self) -> tuple[str, ...] | None:
        """The world's ESM target layers (``world.esm_targets``), or None: the method's default."""
        targets = getattr(self.world, "esm_targets", None)
        return tuple(targets) if targets else None

    def layout_kwargs(self) -> dict[str, Any]:
        """``{"layout": world.layout}`` for ``merge(...)`` (text: ``bert``, CLIP: ``hf_clip``); ``{}`` for vision."""
        layout = getattr(self.world, "layout", None)
        return {} if self.world.kind == "vision" or not layout else {"layout": layout}

    #: The collector of each data input a method declares (returning None leaves the method's default).
    DATA_INPUTS: Mapping[str, str] = {"activations": "esm_activations", "grams": "grams", "targets": "esm_targets"}

    def method_inputs(self, method: str) -> dict[str, Any]:
        """The data inputs ``method`` declares in the registry, collected from the world (cached)."""
        out = {}
        for name in METHODS[method].data_inputs:
            if name not in self.DATA_INPUTS:
                raise InputError(f"{method} declares the data input {name!r}, which the benchmark harness cannot "
                                 f"collect (it knows {sorted(self.DATA_INPUTS)})")
            value = getattr(self, self.DATA_INPUTS[name])()
            if value is not None:
                out[name] = value
        return out

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, state: Mapping[str, Tensor], split: str = "test",
                 tasks: Sequence[str] | None = None) -> dict[str, float]:
        """Absolute top-1 accuracy (fraction) per task of the merged part ``state``."""
        tasks = list(tasks or self.tasks)
        if isinstance(self.world, EvaluatesAll):
            return self.world.evaluate_all(state, split, self.cap(split), tasks)
        return {t: self.world.evaluate(state, t, split, self.cap(split)) for t in tasks}

    def scored(self, state: Mapping[str, Tensor], split: str = "test",
               tasks: Sequence[str] | None = None) -> tuple[dict[str, float], dict[str, np.ndarray] | None]:
        """Accuracy per task and, where the world scores examples, each example's correctness."""
        if not isinstance(self.world, PerExample):
            return self.evaluate(state, split, tasks), None
        hits = self.world.correctness(state, split, self.cap(split), list(tasks or self.tasks))
        return {t: int(h.sum()) / max(1, len(h)) for t, h in hits.items()}, hits

    def expert_accuracy(self, split: str = "test") -> dict[str, float]:
        """Each expert on its own task: the reference of normalized accuracy."""
        if split not in self._expert_acc:
            self._expert_acc[split] = {t: self.world.evaluate(s, t, split, self.cap(split))
                                       for t, s in zip(self.tasks, self.experts)}
        return self._expert_acc[split]

    def normalized(self, acc: Mapping[str, float], split: str) -> dict[str, float]:
        ref = self.expert_accuracy(split)
        return {t: acc[t] / ref[t] if ref[t] > 0 else float("nan") for t in acc}

    # ------------------------------------------------------------------ running methods
    def _merge(self, method: str, hparams: Mapping[str, Any]) -> StateDict:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            # a hyperparameter given (e.g. a variant's ESM targets) wins over the world's data input
            return merge(method, self.base, self.experts, **{**self.method_inputs(method), **self.layout_kwargs(),
                                                             **hparams})

    def run(self, method: str, *, search: Search | Literal["default"] | None = "default", label: str | None = None,
            **hparams: Any) -> MethodRun:
        """Merge with ``method``, choose its coefficient on validation (``"default"``: its registered search,
        ``METHODS[method].search``, the papers' rule of docs/methods.md §Benchmark protocol; None: the
        hyperparameters as given), evaluate on test."""
        if method not in METHODS:
            raise InputError(f"unknown method {method!r}; valid: {sorted(METHODS)}")
        if search == "default":
            search = METHODS[method].search
        elif search is not None and not isinstance(search, Search):
            raise InputError(f"{method}: search must be a Search, None or 'default', not {search!r}")
        # data inputs (ESM's activations, RegMean's Grams) are collected once and timed apart
        # from the merge itself
        t0 = time.perf_counter()
        inputs_s = time.perf_counter() - t0 if self.method_inputs(method) else 0.0
        t0 = time.perf_counter()
        trace = None
        if search is None:
            merged = self._merge(method, hparams)
            merge_s = time.perf_counter() - t0
            coef_name, coef = None, None
        else:
            if search.param in hparams:
                raise InputError(f"{method}: {search.param} is searched; pass search=None to fix it")
            m1 = self._merge(method, {**hparams, search.param: 1.0})
            m2 = self._merge(method, {**hparams, search.param: 2.0})
            merge_s = (time.perf_counter() - t0) / 2
            slope = {k: m2[k] - m1[k] for k in m1}
            self._check_affine(method, hparams, search.param, m1, slope)

            def at(c: float) -> StateDict:
                return {k: m1[k] + (c - 1.0) * slope[k] for k in m1}

            # a task whose expert scores 0 on validation has no normalized accuracy: the search
            # averages the others (none left: absolute accuracy), and says so
            ref_all = self.expert_accuracy("val")
            ref = {t: v for t, v in ref_all.items() if v > 0}
            if len(ref) < len(ref_all):
                zero = sorted(set(ref_all) - set(ref))
                log.warning("%s: the experts of %s score 0 on validation; the search %s", method, ", ".join(zero),
                            f"averages the normalized accuracy of {', '.join(ref)}" if ref
                            else "maximises the absolute accuracy")
            search_tasks = list(ref) or list(ref_all)

            def score(c: float) -> dict[str, float]:
                return self.evaluate(at(c), "val", tasks=search_tasks)

            opts = {"patience": self.patience} if search.kind == "grid" else {}
            if ref:
                res = search.run(score, ref, **opts)
            elif search.kind == "esm":  # no reference: ESM's bracket searched on the absolute accuracy
                res = golden_section_search(score, *search.bracket, objective="absolute")
            else:
                res = search.run(score, None, objective="absolute", **opts)
            coef_name, coef = search.param, float(res.best)
            merged = at(coef)
            trace = res.to_frame()
        # a search already evaluated validation at the chosen coefficient (on every task unless some
        # were left out above)
        if search is None or len(search_tasks) < len(self.tasks):
            val = self.evaluate(merged, "val")
        else:
            val = dict(res.best_evaluation.scores)
        test, hits = self.scored(merged, "test")
        hp = {**hparams, **({coef_name: coef} if coef_name else {})}
        return MethodRun(method, hp, coef_name, coef, val, test, self.normalized(val, "val"),
                         self.normalized(test, "test"), merge_s, trace, label, inputs_seconds=inputs_s,
                         test_correct=hits)

    def _check_affine(self, method, hparams, param, m1, slope, tol: float = 1e-3) -> None:
        """θ(0.5) must equal m1 - 0.5·slope if the coefficient enters affinely."""
        m_half = self._merge(method, {**hparams, param: 0.5})
        for k in m1:
            pred = m1[k] - 0.5 * slope[k]
            err = (m_half[k] - pred).abs().max()
            scale = slope[k].abs().max() + 1e-12
            if err > tol * scale and err > 1e-6:
                raise RuntimeError(f"{method}: {param} does not enter key {k!r} affinely; "
                                   "the fast search is invalid for this method")

    def reference_rows(self) -> list[MethodRun]:
        """Rows for the unmerged base (its frozen heads) and the individual experts."""
        def row(name: str, val: dict[str, float], test: dict[str, float], hits=None) -> MethodRun:
            return MethodRun(name, {}, None, None, val, test, self.normalized(val, "val"),
                             self.normalized(test, "test"), 0.0, test_correct=hits)

        rows = [row(getattr(self.world, "base_label", "base"), self.evaluate(self.base, "val"),
                    *self.scored(self.base, "test")),
                row("experts (individual)", self.expert_accuracy("val"), self.expert_accuracy("test"))]
        if not getattr(self.world, "mtl", False):
            return rows
        if not isinstance(self.world, MultiTaskWorld):
            raise InputError(f"the {self.world.kind} world {self.world.name!r} says mtl=True but has no mtl_state()")
        mtl = self.world.mtl_state()
        return [*rows, row("multi-task (MTL)", self.evaluate(mtl, "val"), self.evaluate(mtl, "test"))]

    def run_all(self, methods: Sequence[str] | None = None, *, references: bool = True,
                progress: bool | None = None, extra: Mapping[str, dict] | None = None,
                store: str | Path | None = None, executor: str | Executor | None = None) -> list[MethodRun]:
        """Run ``methods`` (default all) plus ``extra`` variants ``{label: {"method", "search", **hparams}}``.

        ``store``: a folder that keeps each finished row (:func:`save_row`: JSON, and the test examples'
        correctness in an ``.npz``; nothing that can run code) and hands it back on the next call, so a killed
        run resumes with the row it was on. Name it after everything the rows depend on (world, seed, protocol,
        code version): rows found there are not recomputed. A row an older version kept as a pickle is never
        loaded: it is computed again, with a warning. ``executor`` (:mod:`acetools.executor`): where the rows
        run, one job each (``"ray"``: a worker loads the world with ``source``; a row is bit-identical to the
        serial one); a row that fails is named after the others finished (and were kept)."""
        jobs: list[tuple[str, dict]] = [(m, {"method": m}) for m in (methods or list(METHODS))]
        jobs += [(label, dict(spec)) for label, spec in (extra or {}).items()]
        runs = self.reference_rows() if references else []
        todo: dict[str, tuple] = {}
        ex = as_executor(executor)
        if ex.kind != "serial" and self.source is None:
            raise InputError("run_all(executor='ray') needs Benchmark(..., source=...): a function that loads the "
                             "world from storage every worker reads")
        here = self if ex.kind == "serial" else (self.source, self.options)  # a worker gets no tensors
        for label, spec in jobs:
            kept = row_path(store, label) if store else None
            if kept is not None and kept.is_file():
                continue
            if kept is not None and kept.with_suffix(".pkl").is_file():
                warnings.warn(f"{kept.with_suffix('.pkl')}: a row kept as a pickle by an older acetools, which is "
                              "never loaded (a pickle can run code); computing the row again (delete the file)",
                              UserWarning, stacklevel=2)
            todo[label] = (here, label, spec, kept)
        made = ex.map(_row, todo, desc="methods", progress_bar=progress)
        return runs + [made[label] if label in made else load_row(row_path(store or "", label), label)
                       for label, _ in jobs]

    # ------------------------------------------------------------------ reporting
    @staticmethod
    def summary(runs: Sequence[MethodRun]) -> pd.DataFrame:
        return pd.DataFrame([r.summary() for r in runs])

    def per_task(self, runs: Sequence[MethodRun]) -> pd.DataFrame:
        rows = []
        for r in runs:
            for split, acc, norm in (("val", r.val, r.val_normalized), ("test", r.test, r.test_normalized)):
                rows += [{"method": r.name, "task": t, "split": split, "accuracy": 100 * acc[t],
                          "normalized": 100 * norm[t]} for t in acc]
        return pd.DataFrame(rows)

    def record(self, runs: Sequence[MethodRun]) -> dict[str, Any]:
        """Everything needed to reproduce the runs (docs/style.md §14)."""
        w = self.world
        return {
            "world": w.kind, "world_description": w.describe(), "profile": getattr(w, "profile", None),
            "suite": getattr(w, "suite", None),
            # the head protocol: "zeroshot" (frozen, from the base) or "trained" (docs/text-world.md §Benchmark)
            "heads": getattr(getattr(w, "config", None), "heads", None), "tasks": self.tasks, "size": w.size,
            "expert_seed": w.seed, "proxy_seed": self.proxy_seed, "n_val": self.n_val, "n_test": self.n_test,
            "n_proxy": self.n_proxy, "n_gram": self.n_gram, "patience": self.patience, "versions": package_versions(),
            "checkpoints": [{k: v for k, v in r.items() if k != "metrics"} for r in w.records()],
            "runs": [{**r.summary(), "hparams": jsonable(r.hparams, finite=True, summarize=True),
                      "search_trace": None if r.search is None else r.search.to_dict(orient="records"),
                      "val": r.val, "test": r.test} for r in runs],
        }

    def regime(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``(norms, cosine)``: mean ||tau_t||_F/||W0||_F per task and layer type (and ``all matrices``), and
        the T x T task-vector cosines (docs/regime.md)."""
        base = self.base
        taus = task_vectors(base, self.experts)
        mats = [k for k in base if is_matrix_param(k, base[k])]
        long = relative_update_norms(base, taus, self.tasks, keys=mats)
        norms = long.pivot_table(index="task", columns="layer_type", values="ratio", aggfunc="mean", sort=False)
        norms["all matrices"] = long.groupby("task", sort=False)["ratio"].mean()
        norms = norms.reindex(self.tasks)
        return norms, task_vector_cosine(taus, self.tasks)

    def save(self, runs: Sequence[MethodRun], folder: str | Path, stem: str, *, regime: bool = True) -> dict[str, Path]:
        """Write ``<stem>_summary.csv``, ``_per_task.csv``, ``.json``, ``_correct.npz`` and (``regime``)
        ``_norms.csv`` / ``_cosine.csv``, atomically."""
        folder = Path(folder)
        tables = {"summary": (self.summary(runs), False), "per_task": (self.per_task(runs), False)}  # (frame, index)
        if regime:
            norms, cos = self.regime()
            tables |= {"norms": (norms, True), "cosine": (cos, True)}
        paths = {name: folder / f"{stem}_{name}.csv" for name in tables} | {"json": folder / f"{stem}.json"}
        for name, (df, index) in tables.items():
            with atomic_write(paths[name], "w") as fh:
                df.to_csv(fh, index=index)
        with atomic_write(paths["json"], "w") as fh:
            json.dump(self.record(runs), fh, indent=1, default=str)
        hits = {r.name: r.test_correct for r in runs if r.test_correct is not None}
        if hits:
            paths["correct"] = save_correctness(folder / f"{stem}_correct.npz", hits)
        return paths


def aggregate_seeds(folder: str | Path, suite: str, size: str) -> pd.DataFrame:
    """Mean, sd (:func:`acetools.results.aggregate`), min and max over seeds of every method's row in
    ``folder``'s ``<suite>_<size>_seed<k>_summary.csv`` files."""
    runs = find_results(folder, [suite], size)
    if not runs:
        raise FileNotFoundError(f"no {suite}_{size}_seed*_summary.csv in {folder}; run `acetools bench "
                                f"--suite {suite} --size {size} --out {folder}` first")
    df = pd.concat([pd.read_csv(r.summary).assign(seed=r.seed) for r in runs], ignore_index=True)
    summary = df.assign(suite=suite, n_tasks=math.nan, kind=[row_kind(m) for m in df["method"]])
    agg = aggregate(summary).set_index("method")
    span = df.groupby("method", sort=False)["test_normalized"].agg(["min", "max"])
    out = pd.DataFrame({"n_seeds": agg["n_seeds"], "test_acc": agg["test_acc"], "test_acc_sd": agg["test_acc_sd"],
                        "test_normalized": agg["test_normalized"], "test_normalized_sd": agg["test_normalized_sd"],
                        "test_normalized_min": span["min"], "test_normalized_max": span["max"],
                        "coef_mean": agg["coef"], "merge_seconds": agg["merge_seconds"]})
    return out.rename_axis("method").reset_index()


def best_on_val(runs: Sequence[MethodRun], members: Sequence[str], label: str, param: str) -> MethodRun:
    """The row of ``members`` (run names, one method at several values of ``param``, a hyperparameter that does not
    enter the merge affinely, e.g. WUDI's step size) with the best mean normalized validation accuracy, as the
    row ``label``: its test is that row's, its coefficient that value of ``param``, its merge time the members'
    sum (choosing needed every merge)."""
    by_name = {r.name: r for r in runs}
    missing = [m for m in members if m not in by_name]
    if missing:
        raise InputError(f"best_on_val({label!r}): no run named {missing[0]!r} among {sorted(by_name)}")
    rows = [by_name[m] for m in members]
    best = max(rows, key=lambda r: float(np.mean(list(r.val_normalized.values()))))  # the first of equals
    value = best.hparams.get(param, METHODS[best.method].hparams[param])
    return replace(best, label=label, coef_name=param, coef=float(value), hparams={**best.hparams, param: value},
                   merge_seconds=sum(r.merge_seconds for r in rows), search=None)


def picked_rows(runs: Sequence[MethodRun]) -> list[MethodRun]:
    """The :data:`PICKED` rows whose members all ran (:func:`best_on_val`)."""
    names = {r.name for r in runs}
    return [best_on_val(runs, members, label, param) for label, (param, members) in PICKED.items()
            if names.issuperset(members)]


def _row(bench: Benchmark | tuple[Callable[[], Any], dict[str, Any]], label: str, spec: dict,
         kept: Path | None) -> MethodRun:
    """One job of :meth:`Benchmark.run_all`: the row ``label`` (``spec``: its method and options), kept at ``kept``
    when given; ``bench``: the benchmark, or (in a worker) the function that loads its world and its options."""
    if isinstance(bench, tuple):
        source, options = bench
        bench = Benchmark(source(), **options, source=source)
    spec = dict(spec)
    m = spec.pop("method")
    run = bench.run(m, label=None if label == m else label, **spec)
    if kept is not None:
        save_row(kept, run)
    return run


# --------------------------------------------------------------------------- the resume store of run_all
#: The version of :func:`save_row`'s format, recorded in each row's JSON.
ROW_FORMAT = "acetools.benchmark.row/1"


def row_path(store: str | Path, label: str) -> Path:
    """The JSON file that keeps the row ``label`` in the resume store ``store``."""
    return Path(store) / f"{re.sub(r'[^A-Za-z0-9.-]+', '_', label)}.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_row(path: str | Path, run: MethodRun) -> Path:
    """Keep a finished row: its fields as JSON at ``path`` and, where the world scores examples, the test
    examples' correctness beside it (``.npz``, :func:`acetools.results.save_correctness`, whose sha256 the
    JSON records); both atomic, the JSON last (a row counts as kept once its JSON is there)."""
    path = Path(path)
    values = {f.name: getattr(run, f.name) for f in fields(run)}
    search, hits = values.pop("search"), values.pop("test_correct")
    record: dict[str, Any] = {"format": ROW_FORMAT, "name": run.name, **jsonable(values)}
    if search is not None:
        record["search"] = {"columns": [str(c) for c in search.columns],
                            "dtypes": [str(t) for t in search.dtypes],
                            "data": jsonable(search.to_numpy(dtype=object).tolist())}
    if hits is not None:
        npz = save_correctness(path.with_suffix(".npz"), {run.name: hits})
        record["test_correct"] = {"file": npz.name, "sha256": _sha256(npz)}
    with atomic_write(path, "w") as fh:
        json.dump(record, fh, indent=1)
    return path


def load_row(path: str | Path, label: str) -> MethodRun:
    """The row ``label`` kept by :func:`save_row` at ``path`` (JSON and ``.npz``, never unpickled); a file that
    holds another row, another format or a correctness file that changed is an error naming it."""
    path = Path(path)
    fix = "delete it to recompute the row"
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a kept benchmark row ({type(e).__name__}); {fix}") from None
    if not isinstance(record, dict) or record.get("format") != ROW_FORMAT:
        raise InputError(f"{path}: not a kept benchmark row of format {ROW_FORMAT}; {fix}")
    if record.get("name") != label:
        raise InputError(f"{path} does not hold the row {label!r} (it holds {record.get('name')!r}); {fix}")
    search = record.pop("search", None)
    correct = record.pop("test_correct", None)
    hits = None
    if correct is not None:
        npz = path.parent / correct["file"]
        if not npz.is_file() or _sha256(npz) != correct["sha256"]:
            raise InputError(f"{npz}: the test correctness of the kept row {label!r} is missing or changed since "
                             f"{path.name} was written; {fix}")
        hits = load_correctness(npz).get(label)
    names = {f.name for f in fields(MethodRun)}
    frame = None
    if search is not None:
        frame = pd.DataFrame(search["data"], columns=search["columns"])
        frame = frame.astype(dict(zip(search["columns"], search["dtypes"])))
    try:
        return MethodRun(**{k: v for k, v in record.items() if k in names}, search=frame, test_correct=hits)
    except TypeError as e:
        raise InputError(f"{path}: not a kept benchmark row ({e}); {fix}") from None
