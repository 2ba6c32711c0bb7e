"""The measurements of notebook ``03_esm_step_by_step`` (docs/course.md §03_esm_step_by_step).

The lesson writes ESM's stages itself (docs/methods.md §ESM); this module composes no merge: ESD vs SVD,
proxy data, runs with alpha chosen on validation, the norm order (the verdicts: below).

Figures of notebook 03: pure functions ``(ax, data, ...) -> ax`` on the tables of
this module's experiments.

Notebook 03's claim verdicts: ESD against SVD, proxy data, the ablation grid and the norm order
(docs/course.md §Claim rules); the tables they read come from this module's experiments."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from acetools.benchmark import MethodRun
from acetools.diagnostics import layer_type, linear_cka, principal_subspace, subspace_similarity
from acetools.errors import InputError, InputKeyError
from acetools.keys import short_label
from acetools.merging import esm as E
from acetools.merging import is_matrix_param, merge
from acetools.plotting import finish, track_drawing
from acetools.search import check_patience, climb_search, esm_search, grid_search
from acetools.utils import progress as bar

from .paper_tables import ESM_ABLATION, paper_room
from .power import paired_se, stage_difference, stage_hits  # lesson 03 calls paired_se here (esm_claims.paired_se)
from .verdicts import NOISE, TIE, UNDECIDABLE, Verdict, agreement, compare, decide, effect, margin

# ---- Experiments: the tables and runs -------------------------------------------------------------

StateDict = dict[str, Tensor]


# --------------------------------------------------------------------------- ESD vs SVD
def _work(M: Tensor) -> Tensor:
    """The update in its own precision, at least float32 (as the merge); energies are summed in float64."""
    return M.detach().to(torch.promote_types(M.dtype, torch.float32))


def _rows(X: Tensor, d_in: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return X.detach().to(device, dtype).reshape(-1, d_in)


def _esd_basis(X_fit: Tensor, delta_W: Tensor) -> tuple[Tensor, Tensor]:
    """``(P, P_full)``: the essential subspace's genuine directions (first min(N, d_out) columns) and the
    identity-completed basis ESM uses (:func:`acetools.merging.esm.essential_subspace`, Eq. (ESM.1))."""
    sub = E.essential_subspace(X_fit, delta_W, "esd")
    return sub.P[:, : min(X_fit.shape[0], delta_W.shape[0])], sub.P


def rank_at(frac: float, r: int) -> int:
    """The number of components kept at retention ``frac`` of r: max(1, round(frac * r))."""
    return max(1, min(r, int(round(frac * r))))


def components_for(energy: np.ndarray, level: float = 0.9) -> int:
    """The smallest rank whose cumulative energy reaches ``level`` (len+1 if never)."""
    hit = np.nonzero(np.asarray(energy) >= level - 1e-12)[0]
    return int(hit[0]) + 1 if hit.size else len(energy) + 1


def _kept(dO: Tensor, B: Tensor, total: float) -> np.ndarray:
    """Cumulative share of ||dO||_F² kept by the first 1, 2, ... columns of the orthonormal basis ``B``."""
    return np.cumsum((dO @ B).double().square().sum(0).cpu().numpy()) / total


def esd_vs_svd(
    task_vectors: Sequence[Mapping[str, Tensor]],
    activations: Mapping[str, Sequence[Tensor]],
    tasks: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    frac: float = 0.05,
    heldout: Mapping[str, Sequence[Tensor]] | None = None,
    level: float = 0.9,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """ESD's basis P against SVD's U for every task and key (docs/methods.md §ESM, Eq. (ESM.1)): the energy kept,
    ||dO B_k||_F² / ||dO||_F² with dO = X tau^T, and the CKA of dO with its rank-k reconstruction, on the fit rows
    (``"in-sample"``) and on ``heldout`` inputs. Returns ``(curves, table)``: curves per k, and per task/key/data
    the values at k = :func:`rank_at` ``(frac, r)``, ``k90_*`` and ``coord_norm`` = ||P_tᵀ tau_t||_F (Eq. (ESM.4))."""
    keys = list(activations) if keys is None else list(keys)
    sources: dict[str, Mapping[str, Sequence[Tensor]] | None] = {"in-sample": None}
    if heldout is not None:
        sources["held-out"] = heldout
    curves, rows = [], []
    for t, task in enumerate(tasks):
        for key in keys:
            dW = _work(task_vectors[t][key])
            Xf = _rows(activations[key][t], dW.shape[1], dW.dtype, dW.device)
            P, P_full = _esd_basis(Xf, dW)
            U = torch.linalg.svd(dW, full_matrices=False).U
            r = min(dW.shape)
            kmax = min(r, P.shape[1])
            k = min(rank_at(frac, r), kmax)
            P, U = P[:, :kmax], U[:, :kmax]
            info = {"task": task, "key": key, "layer_type": layer_type(key)}
            for data, src in sources.items():
                X = Xf if src is None else _rows(src[key][t], dW.shape[1], dW.dtype, dW.device)
                dO = X @ dW.T
                total = float(dO.double().square().sum())
                if total == 0:
                    raise InputError(f"{key}, task {task}: X @ tau.T is zero: no activation shift to decompose")
                esd, svd = _kept(dO, P, total), _kept(dO, U, total)
                ks = np.arange(1, kmax + 1)
                curves.append(pd.DataFrame({**info, "data": data, "k": ks, "frac": ks / r, "esd": esd, "svd": svd}))
                Pk, Uk = P[:, :k], U[:, :k]
                rows.append({**info, "data": data, "r": r, "k": k, "energy_esd": float(esd[k - 1]),
                             "energy_svd": float(svd[k - 1]), "cka_esd": linear_cka(dO, dO @ Pk @ Pk.T),
                             "cka_svd": linear_cka(dO, dO @ Uk @ Uk.T), "k90_esd": components_for(esd, level),
                             "k90_svd": components_for(svd, level),
                             "coord_norm": float(torch.linalg.norm(E.task_coordinates(P_full, dW)))})
    return pd.concat(curves, ignore_index=True), pd.DataFrame(rows)


# --------------------------------------------------------------------------- proxy data
#: The proxy sets of the robustness study: the paper's 32 in-distribution images, another
#: task's images, generic pretraining-pool images (our ImageNet stand-in), images of a single
#: class, and only 4 images.
PROXY_VARIANTS: tuple[str, ...] = ("in-distribution", "other task", "pretraining pool", "one class", "4 samples")


def _draw(n_avail: int, n: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(int(seed))
    return torch.randperm(n_avail, generator=g)[:n]


def _is_text(bench) -> bool:
    return getattr(getattr(bench, "world", None), "kind", "vision") == "text"


def proxy_variants(bench) -> tuple[str, ...]:
    """The proxy sets of :data:`PROXY_VARIANTS` a world has (the text world has no pretraining pool)."""
    return tuple(v for v in PROXY_VARIANTS if not (_is_text(bench) and v == "pretraining pool"))


def _take(x: Any, idx: Tensor) -> Any:
    """Rows ``idx`` of ``x``: a tensor's rows, or the items of a list (texts)."""
    return x[idx] if isinstance(x, Tensor) else [x[i] for i in idx.tolist()]


def heldout_inputs(bench, n: int | None = None) -> dict[str, Any]:
    """The first ``n`` (default ``bench.n_proxy``) test inputs of each task, which ESD never sees."""
    n = bench.n_proxy if n is None else int(n)
    if _is_text(bench):
        return {t: bench.world.split(t, "test").texts[:n] for t in bench.tasks}
    return {t: torch.as_tensor(np.asarray(bench.data(t, "test").x[:n])) for t in bench.tasks}


def proxy_images(bench, variant: str, *, pool: Tensor | None = None, n: int | None = None,
                 n_few: int = 4, seed: int | None = None) -> dict[str, Any]:
    """The proxy inputs each task's expert sees under ``variant`` (:data:`PROXY_VARIANTS`): ``n`` per task drawn
    with ``seed`` (defaults: the bench's) from the task's validation inputs, the next task's, ``pool`` (required
    for "pretraining pool"), its most frequent class, or ``n_few`` of them (docs/course.md §03_esm_step_by_step)."""
    if variant not in PROXY_VARIANTS:
        raise InputError(f"unknown proxy variant {variant!r}; variants: {list(PROXY_VARIANTS)}")
    n = bench.n_proxy if n is None else int(n)
    seed = bench.proxy_seed if seed is None else int(seed)
    tasks = list(bench.tasks)

    text = _is_text(bench)
    if text and variant == "pretraining pool":
        raise InputError("the text world has no pretraining pool of texts: proxy variants there are "
                         f"{list(proxy_variants(bench))}")

    def val(task):
        d = bench.world.split(task, "val")
        x = list(d.texts) if text else torch.as_tensor(np.asarray(d.x))
        return x, torch.as_tensor(np.asarray(d.y))

    out: dict[str, Any] = {}
    for i, task in enumerate(tasks):
        if variant in ("in-distribution", "4 samples", "other task"):
            x, _ = val(tasks[(i + 1) % len(tasks)] if variant == "other task" else task)
            m = min(n_few, n) if variant == "4 samples" else n
            out[task] = _take(x, _draw(len(x), n, seed)[:m])
        elif variant == "pretraining pool":
            if pool is None:
                raise InputError("proxy variant 'pretraining pool' needs pool= (images N x C x H x W), e.g. "
                                 "acetools.world.vision.data.pretraining_pool(seed=zoo.pool_seed, **zoo.pool_kwargs).x")
            px = torch.as_tensor(np.asarray(pool))
            out[task] = px[_draw(len(px), n, seed)]
        else:  # one class
            x, y = val(task)
            labels, counts = torch.unique(y, return_counts=True)
            c = labels[int(torch.argmax(counts))]  # argmax returns the first maximum: smallest label
            idx = torch.nonzero(y == c).flatten()
            out[task] = _take(x, idx[_draw(len(idx), n, seed)])
    return out


def proxy_activations(bench, images: Mapping[str, Tensor],
                      keys: Sequence[str] | None = None) -> dict[str, list[Tensor]]:
    """Input activations of ``keys`` (default ``bench.matrix_keys()``) in each task's expert on ``images[task]``:
    ``merge("esm", activations=...)``'s input, as ``bench.esm_activations()`` (docs/methods.md §ESM)."""
    keys = list(bench.matrix_keys() if keys is None else keys)
    acts: dict[str, list[Tensor]] = {k: [] for k in keys}
    for task, state in zip(bench.tasks, bench.experts):
        got = bench.world.layer_inputs(state, images[task], keys)  # any world (the vision world: capture_inputs)
        for k in keys:
            acts[k].append(got[k].float())
    return acts


def timed_activations(bench, images: Mapping[str, Tensor] | None = None,
                      keys: Sequence[str] | None = None) -> tuple[dict[str, list[Tensor]], float]:
    """ESM's proxy capture, timed: ``(activations, seconds)``, of ``images`` (:func:`proxy_activations`) or
    else ``bench.esm_activations()`` (0 s once the bench holds them)."""
    t0 = time.perf_counter()
    if images is None:
        if keys is not None:
            raise InputError("keys= needs images=: the bench's own activations cover bench.matrix_keys()")
        acts = bench.esm_activations()
    else:
        acts = proxy_activations(bench, images, keys)
    return acts, time.perf_counter() - t0


def subspace_overlap(X_a: Tensor, delta_W: Tensor, k: int, X_b: Tensor | None = None) -> float:
    """Mean cos² of the principal angles between the rank-k essential subspace from ``X_a`` and the
    one from ``X_b`` or, without it, the SVD basis of ``delta_W`` (:func:`acetools.diagnostics.subspace_similarity`)."""
    dW = _work(delta_W)
    Xa = _rows(X_a, dW.shape[1], dW.dtype, dW.device)
    if X_b is not None:
        Xb = _rows(X_b, dW.shape[1], dW.dtype, dW.device)
        k = max(1, min(k, *dW.shape, Xa.shape[0], Xb.shape[0]))
        return subspace_similarity(Xa @ dW.T, Xb @ dW.T, k, side="right")
    k = max(1, min(k, *dW.shape, Xa.shape[0]))
    Pa, Pb = principal_subspace(Xa @ dW.T, k, side="right"), principal_subspace(dW, k, side="left")
    return float(((Pa.T @ Pb) ** 2).sum() / k)


# --------------------------------------------------------------------------- runs and ablation
#: The paper's ablation grid (SVD/ESD x PS none / layer only / all) plus the reciprocal exponent, as
#: switches of the registered ``"esm"`` method (everything not named keeps ESM's default).
_LEVELS = {"no scaling": (False, False), "layer only": (False, True), "all levels": (True, True)}  # (task/dim, layer)
ABLATION: dict[str, dict[str, Any]] = {
    f"{d.upper()}, {level}": {"decomposition": d, "task_scaling": td, "dim_scaling": td, "layer_scaling": layer}
    for d in ("svd", "esd") for level, (td, layer) in _LEVELS.items()}
ABLATION["ESD, reciprocal (-1)"] = {**ABLATION["ESD, all levels"], "task_power": -1.0, "dim_power": -1.0,
                                    "layer_power": -1.0}


def ablation_hparams(name: str) -> dict[str, Any]:
    """The ``esm`` switches of ablation row ``name`` (a copy)."""
    try:
        return dict(ABLATION[name])
    except KeyError:
        raise InputKeyError(f"unknown ablation row {name!r}; rows: {list(ABLATION)}") from None


def alpha_keys(base: Mapping[str, Tensor], hparams: Mapping[str, Any]) -> list[str]:
    """The keys alpha multiplies in ``esm`` with ``hparams``: the ESD layers (``alpha_scope="esd"``) or all."""
    if hparams.get("alpha_scope", "esd") == "all":
        return list(base)
    targets = hparams.get("targets", E.DEFAULT_TARGETS)
    return [k for k in base if is_matrix_param(k, base[k]) and any(re.search(p, k) for p in targets)]


def esm_path(bench, *, activations: Mapping[str, Sequence[Tensor]] | None = None, **hparams: Any):
    """Merge with ``esm`` once at alpha = 1: ``(at, merge_seconds)``, ``at(alpha)`` the merge at any alpha
    (alpha is linear on :func:`alpha_keys`, docs/methods.md §ESM, Eqs. (ESM.11)-(ESM.12))."""
    if "alpha" in hparams:
        raise InputError("esm_path varies alpha itself; do not pass it")
    targets = bench.esm_targets()  # the world's layer names (None: ESM's open_clip defaults)
    hp = {**bench.layout_kwargs(), **({"targets": targets} if targets else {}), **hparams}
    if hp.get("decomposition", "esd") == "esd":
        hp["activations"] = bench.esm_activations() if activations is None else activations
    base = bench.base
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        m1 = merge("esm", base, bench.experts, alpha=1.0, **hp)
    merge_s = time.perf_counter() - t0
    scaled = set(alpha_keys(base, {k: v for k, v in hp.items() if k != "layout"}))
    slope = {k: (m1[k] - base[k]) for k in scaled}

    def at(alpha: float) -> StateDict:
        return {k: (base[k] + alpha * slope[k] if k in scaled else v) for k, v in m1.items()}

    return at, merge_s


def run_esm(bench, *, activations: Mapping[str, Sequence[Tensor]] | None = None,
            grid: Sequence[float] | None = None, search: str = "climb", patience: int | None = 1,
            label: str | None = None, inputs_seconds: float | None = None, **hparams: Any):
    """ESM on ``bench`` with alpha chosen on validation (``grid=None``: the paper's ``esm_search``; else a climb
    or grid over ``grid``), scored on test: a ``MethodRun``; ``inputs_seconds``: the proxy capture's."""
    if search not in ("climb", "grid"):
        raise InputError(f"search={search!r} must be 'climb' or 'grid'")
    if inputs_seconds is not None and not (math.isfinite(inputs_seconds) and inputs_seconds >= 0):
        raise InputError(f"inputs_seconds={inputs_seconds!r} must be a finite number >= 0")
    capture_s = 0.0
    if hparams.get("decomposition", "esd") == "esd":
        if activations is None:
            activations, capture_s = timed_activations(bench)
        if inputs_seconds is not None:
            capture_s = float(inputs_seconds)
    at, merge_s = esm_path(bench, activations=activations, **hparams)

    def score(alpha: float) -> dict[str, float]:
        return bench.evaluate(at(alpha), "val")

    ref = bench.expert_accuracy("val")
    if grid is None:
        res = esm_search(score, ref)
    elif search == "climb":
        res = climb_search(score, grid, reference=ref, patience=1 if patience is None else patience)
    else:
        res = grid_search(score, grid, reference=ref, patience=patience)
    alpha = float(res.best)
    val = dict(res.best_evaluation.scores)
    test, hits = bench.scored(at(alpha), "test")
    return MethodRun("esm", {**hparams, "alpha": alpha}, "alpha", alpha, val, test, bench.normalized(val, "val"),
                     bench.normalized(test, "test"), merge_s, res.to_frame(), label, inputs_seconds=capture_s,
                     test_correct=hits)


#: The label of TSV-M's row in the ablation table: the paper's "SVD" row (TSV-M's main-table numbers);
#: the in-pipeline rows "SVD, ..." of :data:`ABLATION` stay beside it.
TSV_M_ROW: str = "TSV-M (the paper's SVD row)"

#: The grid-search patience of TSV-M's alpha: the shipped benchmark's (``--patience 3``, as the Iso code).
TSV_M_PATIENCE: int | None = 3


def run_ablation(bench, names: Sequence[str] | None = None, *, activations=None, grid=None, search: str = "climb",
                 patience: int | None = 1, done: Mapping[str, Any] | None = None,
                 progress: bool | None = None, inputs_seconds: float | None = None,
                 tsv_m_patience: int | None = TSV_M_PATIENCE) -> list:
    """:func:`run_esm` for each row in ``names`` (default :data:`ABLATION`, then TSV-M's :data:`TSV_M_ROW`), reusing the
    runs of ``done`` (row -> MethodRun); the proxy capture is made once, every ESD row's ``inputs_seconds``."""
    check_patience(tsv_m_patience)
    names = list(ABLATION) + [TSV_M_ROW] if names is None else list(names)
    for name in names:
        if name != TSV_M_ROW:
            ablation_hparams(name)  # unknown rows fail before any run
    todo = [n for n in names if n != TSV_M_ROW and not (done is not None and n in done)]
    if activations is None and any(ABLATION[n].get("decomposition", "esd") == "esd" for n in todo):
        activations, secs = timed_activations(bench)
        inputs_seconds = secs if inputs_seconds is None else inputs_seconds
    runs = []
    for name in bar(names, desc="ablation", enabled=progress):
        if done is not None and name in done:
            runs.append(dataclasses.replace(done[name], label=name))
        elif name == TSV_M_ROW:  # as the benchmark runs it: alpha on ALPHA_GRID chosen on validation
            b = copy.copy(bench)  # shares the bench's caches; only the search's patience differs
            b.patience = tsv_m_patience
            runs.append(b.run("tsv_m", label=name))
        else:
            runs.append(run_esm(bench, activations=activations, grid=grid, search=search, patience=patience,
                                label=name, inputs_seconds=inputs_seconds, **ablation_hparams(name)))
    return runs


def runs_table(runs: Sequence[Any], **columns: Any) -> pd.DataFrame:
    """One row per run: label, alpha, test/validation accuracy (absolute and normalized, %), ``merge_seconds``,
    ``inputs_seconds`` (the proxy capture, timed apart) and ``correct`` (each test example's correctness per
    task, or None), plus constant ``columns`` (e.g. ``suite="tasks8"``)."""
    rows = []
    for r in runs:
        s = r.summary()
        rows.append({**columns, "variant": s["method"], "alpha": s["coef"],
                     "val_acc": 100 * float(np.mean(list(r.val.values()))), "val_normalized": s["val_normalized"],
                     "test_acc": s["test_acc"], "test_normalized": s["test_normalized"],
                     "merge_seconds": s["merge_seconds"], "inputs_seconds": float(s.get("inputs_seconds", 0.0)),
                     "correct": r.test_correct})
    return pd.DataFrame(rows)


def ablation_table(ablation: Mapping[str, Sequence[Any]]) -> pd.DataFrame:
    """:func:`runs_table` of every suite's ablation runs (``{suite: runs}``), with a ``suite`` column."""
    return pd.concat([runs_table(runs, suite=s) for s, runs in ablation.items()], ignore_index=True)


#: Plain headers, with units, for the tables a lesson shows of :func:`runs_table` (:func:`plain_runs`).
PLAIN_RUN_COLUMNS: dict[str, str] = {"suite": "suite", "variant": "run", "alpha": "alpha",
                                     "test_acc": "test accuracy (%)", "test_normalized": "normalized test accuracy (%)",
                                     "merge_seconds": "merge (s)", "inputs_seconds": "proxy capture (s)"}


def plain_runs(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`runs_table`'s columns a reader needs, under plain headers with units (:data:`PLAIN_RUN_COLUMNS`)."""
    cols = [c for c in PLAIN_RUN_COLUMNS if c in table.columns]
    return table[cols].rename(columns=PLAIN_RUN_COLUMNS)


# --------------------------------------------------------------------------- norm order
def essential_components(base: Mapping[str, Tensor], expert: Mapping[str, Tensor],
                         activations: Mapping[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """``{key: (P, A)}``: P (d_out x r) the genuine directions of the task's essential subspace from
    ``activations[key]``, A = P^T tau: tau's shift is sum_i p_i a_i^T (docs/methods.md §ESM, Eq. (ESM.1))."""
    out = {}
    for key, X in activations.items():
        tau = _work(expert[key]) - _work(base[key])
        d_out, d_in = tau.shape
        P = _esd_basis(_rows(X, d_in, tau.dtype, tau.device), tau)[0][:, : min(d_out, d_in)]
        out[key] = (P, P.T @ tau)
    return out


def load_components(base: Mapping[str, Tensor], expert: Mapping[str, Tensor],
                    components: Mapping[str, tuple[Tensor, Tensor]], budget: Mapping[str, int] | int, *,
                    order: str = "norm", equal_norms: bool = False) -> StateDict:
    """``expert`` with each layer of ``components`` cut to W0 plus ``budget`` components p_i a_i^T, largest ||a_i||
    first (``order="norm"``) or smallest (``"reverse"``); ``equal_norms`` gives every kept row the mean norm."""
    if order not in ("norm", "reverse"):
        raise InputError(f"order={order!r} must be 'norm' or 'reverse'")
    out = dict(expert)
    for key, (P, A) in components.items():
        norms = torch.linalg.norm(A, dim=1)
        k = budget[key] if isinstance(budget, Mapping) else int(budget)
        k = max(0, min(int(k), A.shape[0]))
        idx = torch.argsort(norms, descending=(order == "norm"), stable=True)[:k]
        A_k = A[idx]
        if equal_norms and k > 0:
            A_k = A_k * (norms.mean() / norms[idx].clamp_min(1e-30))[:, None]
        out[key] = (_work(base[key]) + P[:, idx] @ A_k).to(expert[key].dtype)
    return out


def norm_order_table(bench, activations: Mapping[str, Sequence[Tensor]] | None = None, *,
                     split: str = "test") -> pd.DataFrame:
    """Each expert with its ESD layers cut to ESM's rank budget int(d_out / T) in norm or reverse order, raw and
    equal norms (:func:`load_components`), scored on its own task, beside the references ``"none"`` and ``"all"``.
    ``norms`` says ``"raw"`` or ``"equal"``; ``correct`` holds each test example's correctness where the world scores
    examples (None for ``"all"``, the expert itself: its accuracy is the reference), so that two orders pair example
    by example (:func:`verdict_norm_importance`, the saved ``norm_order_correct.npz``)."""
    acts = bench.esm_activations() if activations is None else activations
    keys = list(acts)
    base, T = bench.base, len(bench.tasks)
    ks = {k: E.rank_budget(base[k].shape[0], T) for k in keys}
    ref = bench.expert_accuracy(split)
    rows = []
    for t, (task, expert) in enumerate(zip(bench.tasks, bench.experts)):
        comps = essential_components(base, expert, {k: acts[k][t] for k in keys})
        cases = [("all", False, None), ("none", False, load_components(base, expert, comps, 0))]
        for order in ("norm", "reverse"):
            for eq in (False, True):
                cases.append((order, eq, load_components(base, expert, comps, ks, order=order, equal_norms=eq)))
        for order, eq, state in cases:  # "all" is the expert: its accuracy is the reference
            acc, hits = (ref[task], None) if state is None else bench.scored(state, split, tasks=[task])
            acc = acc if state is None else acc[task]
            rows.append({"task": task, "order": order, "equal_norms": eq, "norms": "equal" if eq else "raw",
                         "accuracy": 100 * acc, "normalized": 100 * acc / ref[task] if ref[task] > 0 else math.nan,
                         "correct": None if hits is None else hits[task]})
    return pd.DataFrame(rows)


# ---- Figures: the lesson's plots, drawn on a given axes -------------------------------------------

#: Plot labels: ``visual.transformer.resblocks.3.mlp.c_fc.weight`` -> ``b3 c_fc``.
short_key = functools.partial(short_label, style="b")


def _check_columns(df, cols, what):
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise InputError(f"{what} needs columns {list(cols)}; missing {missing}")


def energy_curves_at_rank(ax, k: int, *, curves, r_max: int, data: str = "held-out"):
    """:func:`energy_curves` with the marker at rank ``k`` of ``r_max`` (the rank explorer's callback)."""
    return energy_curves(ax, curves, data=data, k_frac=k / r_max)


def energy_curves(ax, curves, *, data: str = "held-out", k_frac: float | None = None, title: str | None = None):
    """Mean activation-shift energy captured against the share of components kept (``esd_vs_svd``'s curves),
    one colour per layer type, ESD solid and SVD dashed; ``k_frac`` marks that retention."""
    _check_columns(curves, ["layer_type", "data", "frac", "esd", "svd"], "energy_curves")
    sub = curves[curves["data"] == data]
    if sub.empty:
        raise InputError(f"no rows with data == {data!r}; have {sorted(curves['data'].unique())}")
    for i, (lt, g) in enumerate(sub.groupby("layer_type", sort=False)):
        m = g.groupby("frac")[["esd", "svd"]].mean()
        x = 100 * m.index.to_numpy()
        ax.plot(x, 100 * m["esd"], color=f"C{i}", label=f"{lt} ESD")
        ax.plot(x, 100 * m["svd"], color=f"C{i}", ls="--", label=f"{lt} SVD")
    if k_frac is not None:
        ax.axvline(100 * k_frac, color="0.4", lw=1, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("components kept (% of rank)")
    ax.set_ylabel("energy captured (%)")
    ax.set_ylim(0, 101)
    return finish(ax, title or f"activation-shift energy ({data})", legend=True, fontsize=10)


def cka_bars(ax, table, *, data: str = "held-out", title: str | None = None):
    """Mean linear CKA of the rank-k reconstruction with the full shift, ESD vs SVD, per layer type and overall."""
    _check_columns(table, ["layer_type", "data", "cka_esd", "cka_svd"], "cka_bars")
    sub = table[table["data"] == data]
    if sub.empty:
        raise InputError(f"no rows with data == {data!r}")
    by = sub.groupby("layer_type", sort=False)[["cka_esd", "cka_svd"]].mean()
    by.loc["all layers"] = sub[["cka_esd", "cka_svd"]].mean()
    pos = np.arange(len(by))
    ax.bar(pos - 0.2, by["cka_esd"], 0.4, label="ESD")
    ax.bar(pos + 0.2, by["cka_svd"], 0.4, label="SVD")
    ax.set_xticks(pos, list(by.index), rotation=20, ha="right")
    ax.set_ylabel("linear CKA")
    lo = float(np.nanmin(by.to_numpy()))
    ax.set_ylim(max(0.0, lo - 0.5 * (1.0 - lo) - 0.005), 1.0 + 0.1 * (1.0 - lo) + 0.001)  # zoomed: CKAs sit near 1
    return finish(ax, title or f"CKA at the retention k ({data})", legend=True, fontsize=10)


def gram_image(ax, G, *, block: int | Sequence[int] | None = None, title: str | None = None,
               vmax: float | None = None):
    """A Gram matrix (e.g. P_cat^T P_cat) as an image centred at 0; ``block`` (the rank k, or each task's k_t)
    draws lines between the tasks' blocks."""
    G = np.asarray(G, dtype=float)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise InputError(f"gram_image needs a square matrix, got shape {G.shape}")
    v = float(np.abs(G).max()) if vmax is None else float(vmax)
    im = ax.imshow(G, cmap="RdBu_r", vmin=-v, vmax=v, interpolation="nearest")
    if block:
        ends = range(block, G.shape[0], block) if isinstance(block, int) else np.cumsum(list(block))[:-1]
        for b in ends:
            ax.axhline(b - 0.5, color="0.3", lw=0.4)
            ax.axvline(b - 0.5, color="0.3", lw=0.4)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks([])
    ax.set_yticks([])
    return finish(ax, title)


def task_factor_heatmap(ax, factors, *, title: str | None = None):
    """Inter-task factors s_t, a task x layer DataFrame (docs/methods.md §ESM, Eq. (ESM.4))."""
    import seaborn as sns

    data = factors.rename(columns=short_key)
    # numbers only where a cell can hold them legibly; the colour bar carries no label of its own
    # (the title names s_t), so it cannot run into the next panel's axis label
    sns.heatmap(data, ax=ax, cmap="vlag", center=1.0, annot=data.size <= 60, fmt=".2f", annot_kws={"size": 10})
    ax.set_xlabel("layer")
    ax.set_ylabel("task")
    ax.set_title(title or r"inter-task factors $s_t = (n_t / \bar n)^2$")
    return ax


def dimension_factor_plot(ax, factors: Mapping[str, Sequence[float]], *, title: str | None = None):
    """Inter-dimension factors c_j (label -> the layer's d_in factors), sorted descending, log scale."""
    for label, c in factors.items():
        c = np.sort(np.asarray(c, dtype=float))[::-1]
        ax.plot(np.arange(1, len(c) + 1), c, label=label)
    ax.axhline(1.0, color="0.4", lw=1, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("input dimension j (sorted)")
    ax.set_ylabel(r"$c_j$")
    return finish(ax, title or r"inter-dimension factors $c_j = (\Vert a_j \Vert / \mathrm{mean})^2$", legend=True,
                  fontsize=10)


def layer_factor_bars(ax, table, *, title: str | None = None):
    """Inter-layer factors beta per block (columns layer_type, block, beta), docs/methods.md §ESM, Eq. (ESM.10)."""
    _check_columns(table, ["layer_type", "block", "beta"], "layer_factor_bars")
    types = list(dict.fromkeys(table["layer_type"]))
    blocks = sorted(table["block"].unique())
    width = 0.8 / max(1, len(types))
    for i, lt in enumerate(types):
        g = table[table["layer_type"] == lt].set_index("block").reindex(blocks)
        ax.bar(np.arange(len(blocks)) + (i - (len(types) - 1) / 2) * width, g["beta"], width, label=lt)
    ax.axhline(1.0, color="0.4", lw=1, ls=":")
    ax.set_xticks(np.arange(len(blocks)), [f"block {b}" for b in blocks])
    ax.set_ylabel(r"$\beta_\ell$")
    top = float(np.nanmax(table["beta"].to_numpy(dtype=float))) if len(table) else 1.0
    ax.set_ylim(0, 1.45 * top)  # head room: the legend sits above the bars, not on them
    ax.legend(fontsize=10, loc="upper left", ncols=2, framealpha=0.9)
    default = r"inter-layer factors $\beta_\ell = (\Vert \Delta W_\ell \Vert / \mathrm{mean\ over\ type})^2$"
    return finish(ax, title or default)


def accuracy_bars(ax, values: Mapping[str, float], *, baseline: float | None = None, baseline_label: str = "baseline",
                  ylabel: str = "test accuracy (%)", title: str | None = None, noise: float | None = None,
                  reference: str | None = None):
    """Bars of ``values`` (label -> %), zoomed; a ``baseline`` line and a ±``noise`` band at ``values[reference]``."""
    labels, vals = list(values), np.array([float(v) for v in values.values()])
    pos = np.arange(len(vals))
    ax.bar(pos, vals, color=["C3" if lab == reference else "C0" for lab in labels])
    lo = [vals.min()] + ([baseline] if baseline is not None else [])
    hi = [vals.max()] + ([baseline] if baseline is not None else [])
    span = max(max(hi) - min(lo), 2.0)
    ax.set_ylim(max(0.0, min(lo) - span), min(100.0, max(hi) + 0.5 * span))
    if baseline is not None:
        ax.axhline(baseline, color="0.2", ls="--", lw=1, label=baseline_label)
        ax.legend(fontsize=10)
    if noise is not None and reference is not None:
        r = float(values[reference])
        ax.axhspan(r - noise, r + noise, color="C3", alpha=0.15, lw=0)
    ax.set_xticks(pos, labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    return finish(ax, title)


def ablation_bars(ax, df, *, value: str = "test_acc", hue: str = "suite", title: str | None = None,
                  ylabel: str | None = None):
    """Grouped bars of ``value`` per ablation variant (``runs_table`` rows), one colour per ``hue``."""
    _check_columns(df, ["variant", value, hue], "ablation_bars")
    variants = list(dict.fromkeys(df["variant"]))
    hues = list(dict.fromkeys(df[hue]))
    width = 0.8 / max(1, len(hues))
    for i, h in enumerate(hues):
        g = df[df[hue] == h].set_index("variant").reindex(variants)
        ax.bar(np.arange(len(variants)) + (i - (len(hues) - 1) / 2) * width, g[value], width, label=str(h))
    vals = df[value].to_numpy(dtype=float)
    span = max(np.nanmax(vals) - np.nanmin(vals), 2.0)
    top = np.nanmax(vals) + 0.3 * span
    ax.set_ylim(max(0.0, np.nanmin(vals) - 0.5 * span), min(100.0, top) if "acc" in value else top)
    ax.set_xticks(np.arange(len(variants)), variants, rotation=25, ha="right")
    ax.set_ylabel(ylabel or value)
    return finish(ax, title, legend=True, fontsize=10)


def search_traces(ax, runs, *, title: str | None = None):
    """Normalized validation accuracy against alpha of each run's search (``MethodRun``), the chosen alpha marked."""
    for i, r in enumerate(runs):
        tr = r.search.sort_values("alpha")
        ax.plot(tr["alpha"], 100 * tr["avg_normalized_top1"], marker=".", color=f"C{i % 10}", label=r.name)
        best = tr[tr["is_best"]]
        ax.plot(best["alpha"], 100 * best["avg_normalized_top1"], marker="*", ms=11, color=f"C{i % 10}", ls="")
    if all((r.search["alpha"] > 0).all() for r in runs):  # a log grid: ticks at the alphas tried
        ax.set_xscale("log")
        alphas = sorted({float(a) for r in runs for a in r.search["alpha"]})
        # a tick at every alpha tried, labelled where labels fit (TSV-M's 30-point grid would crowd them):
        # at most 9 labels, spread evenly in log alpha
        labelled = set(alphas)
        if len(alphas) > 9:
            targets = np.geomspace(alphas[0], alphas[-1], 9)
            labelled = {min(alphas, key=lambda a, t=t: abs(np.log(a / t))) for t in targets}
        ax.set_xticks(alphas, [f"{a:g}" if a in labelled else "" for a in alphas],
                      rotation=45 if len(labelled) > 4 else 0, ha="right" if len(labelled) > 4 else "center")
        ax.minorticks_off()
    ax.set_xlabel("alpha")
    ax.set_ylabel("val normalized accuracy (%)")
    return finish(ax, title or "alpha chosen on validation (star)", legend=True, fontsize=10)


def norm_order_bars(ax, table, *, title: str | None = None):
    """Mean normalized accuracy of the experts cut to ESM's budget in norm or reverse order (raw / equal norms),
    beside the ``none`` and ``all`` references (``norm_order_table``)."""
    _check_columns(table, ["order", "equal_norms", "normalized"], "norm_order_bars")
    m = table.groupby(["order", "equal_norms"], sort=False)["normalized"].mean()
    labels, vals, colors = [], [], []
    for (order, eq), v in m.items():
        lab = order if order in ("all", "none") else f"{order} ({'equal' if eq else 'raw'} norms)"
        labels.append(lab)
        vals.append(v)
        colors.append("0.6" if order in ("all", "none") else ("C0" if order == "norm" else "C1"))
    pos = np.arange(len(vals))
    ax.bar(pos, vals, color=colors)
    ax.set_xticks(pos, labels, rotation=20, ha="right")
    ax.set_ylabel("normalized accuracy on own task (%)")
    ax.set_title(title or "components loaded by norm order vs reverse")
    return ax


# ---- Verdicts: the lesson's claims, judged --------------------------------------------------------

def _mean_by(table: pd.DataFrame, data: str, cols: Sequence[str]) -> pd.DataFrame:
    t = table[table["data"] == data]
    by = t.groupby("layer_type", sort=False)[list(cols)].mean()
    by.loc["all layers"] = t[list(cols)].mean()
    return by


#: esm.energy: "far fewer components" for the same energy, read as at most this fraction of
#: SVD's components for 90 % of the energy (the paper gives no number, only "far fewer").
FEWER: float = 0.5


def _ladder(full: bool, better: bool, reproduced: str, partly: str, worse: str) -> tuple[str, str]:
    """``(verdict, reason)`` of an "ESD beats SVD" claim: reproduced when ``full`` holds, partly when
    only ``better`` does, else not reproduced."""
    if full:
        return "reproduced", reproduced
    return ("partly", partly) if better else ("not reproduced", worse)


def verdict_energy(table: pd.DataFrame, data: str = "held-out", *, retention: float | None = None) -> Verdict:
    """esm.energy (rule: docs/course.md §Claim rules), measured on ``data`` (held-out by default:
    in-sample, ESD >= SVD by construction; in-sample numbers are reported beside)."""
    def numbers(d: str) -> dict[str, Any]:
        m = _mean_by(table, d, ["energy_esd", "energy_svd", "k90_esd", "k90_svd"]).loc["all layers"]
        return {"energy_esd": float(100 * m["energy_esd"]), "energy_svd": float(100 * m["energy_svd"]),
                "diff_points": float(100 * (m["energy_esd"] - m["energy_svd"])), "k90_esd": float(m["k90_esd"]),
                "k90_svd": float(m["k90_svd"]), "k90_ratio": float(m["k90_esd"] / m["k90_svd"]), "data": d}

    nums = numbers(data)
    at = f" at {100 * retention:g} % of the components" if retention is not None else ""
    measured = (f"energy{at} ({data}): ESD {nums['energy_esd']:.1f} % vs SVD {nums['energy_svd']:.1f} %; components "
                f"for 90 %: {nums['k90_esd']:.1f} vs {nums['k90_svd']:.1f}")
    out = {"held_out": nums} if data == "held-out" else dict(nums)
    other = "in-sample" if data == "held-out" else None
    if other and (table["data"] == other).any():
        ins = numbers(other)
        measured += f" (in-sample: {ins['energy_esd']:.1f} % vs {ins['energy_svd']:.1f} %)"
        out["in_sample"] = ins
    return energy_verdict(out, measured)


def _no_paper_number(v: Verdict, settings: Mapping[str, float], se: Mapping[str, float | None] | None = None
                     ) -> Verdict:
    """``v`` with one :class:`~acetools_course.verdicts.Effect` per setting (its measured difference; the margin
    ``max(NOISE, 1.96 se)`` where ``se`` gives the setting's paired standard error), none with a prediction: the
    paper states the comparison without a number (docs/course.md §Claim rules), so by the one rule (docs/course.md
    §One rule, (V.7)) no setting decides and :func:`acetools_course.claims.record` makes it ``undecidable here``,
    the claim's own rule kept as ``numbers["power_rule"]["before"]``. The studies run on one expert seed."""
    se = se or {}
    return Verdict(v.measured, v.verdict, v.reason, v.numbers,
                   [effect(s, d, se=se.get(s), seeds=1) for s, d in settings.items()], value=v.value)


def energy_verdict(numbers: Mapping[str, Any], measured: str) -> Verdict:
    """esm.energy from the numbers :func:`verdict_energy` records (``held_out`` or one ``data``'s fields), with its
    one setting, the energy difference on that data (:func:`_no_paper_number`)."""
    nums = numbers.get("held_out", numbers)
    diff, ratio = float(nums["diff_points"]), float(nums["k90_ratio"])
    more = f"ESD keeps {diff:+.1f} points more energy"
    v, why = _ladder(compare(diff) == "better" and ratio <= FEWER, compare(diff) == "better",
                     f"{more} and needs {ratio:.2f}x the components for 90 %",
                     f"{more} but needs {ratio:.2f}x (not <= {FEWER}x) the components for 90 %",
                     f"ESD minus SVD energy {diff:+.1f} points is within noise or negative")
    return _no_paper_number(Verdict(measured, v, why, dict(numbers), value=diff), {f"energy ({nums['data']})": diff})


def verdict_cka(table: pd.DataFrame, data: str = "held-out", *, retention: float | None = None) -> Verdict:
    """esm.cka (rule: docs/course.md §Claim rules): ESD's mean CKA minus SVD's (points) per layer type
    of ``data`` in :func:`esd_vs_svd`'s table."""
    by = _mean_by(table, data, ["cka_esd", "cka_svd"])
    diffs = 100 * (by["cka_esd"] - by["cka_svd"])
    per_type = {k: float(v) for k, v in diffs.items() if k != "all layers"}
    avg = float(diffs["all layers"])
    nums = {"cka_esd": float(by["cka_esd"]["all layers"]), "cka_svd": float(by["cka_svd"]["all layers"]),
            "diff_points": avg, "diff_by_type": per_type, "data": data}
    at = f" at {100 * retention:g} %" if retention is not None else ""
    return cka_verdict(nums, f"linear CKA{at} ({data}): ESD {nums['cka_esd']:.3f} vs SVD {nums['cka_svd']:.3f}")


def cka_verdict(nums: Mapping[str, Any], measured: str) -> Verdict:
    """esm.cka from the numbers :func:`verdict_cka` records, with the settings its rule reads
    (:func:`_no_paper_number`): the CKA difference (points) over all layers, then per layer type."""
    per_type = {str(k): float(v) for k, v in nums["diff_by_type"].items()}
    avg = float(nums["diff_points"])
    v, why = _ladder(all(compare(d) == "better" for d in per_type.values()), compare(avg) == "better",
                     f"ESD's CKA is higher by {avg:+.1f} points on average and in every layer type",
                     f"ESD's CKA is higher by {avg:+.1f} points on average but not in every layer type",
                     f"ESD minus SVD CKA {avg:+.1f} points is within noise or negative")
    return _no_paper_number(Verdict(measured, v, why, dict(nums), value=avg), {"all layers": avg, **per_type})


def verdict_proxy(acc: Mapping[str, float], reference: str = "in-distribution",
                  others: Sequence[str] = ("other task", "pretraining pool", "one class")) -> Verdict:
    """esm.proxy (rule: docs/course.md §Claim rules). ``acc``: test accuracy per proxy variant."""
    diffs = {o: float(acc[o] - acc[reference]) for o in others}
    ties = [o for o, d in diffs.items() if compare(d) == TIE]
    worst = max(diffs, key=lambda o: abs(diffs[o]))
    nums = {"diffs": diffs, **{k: float(v) for k, v in acc.items()}}
    txt = ", ".join(f"{o} {d:+.2f}" for o, d in diffs.items())
    measured = "test accuracy (%): " + ", ".join(f"{k} {a:.2f}" for k, a in acc.items())
    gap = diffs[worst]
    if len(ties) == len(diffs):
        return Verdict(measured, "reproduced", f"all within ±{NOISE} points of in-distribution ({txt})", nums,
                       value=gap)
    if ties:
        return Verdict(measured, "partly", f"{len(ties)}/{len(diffs)} within ±{NOISE} points; largest gap {worst} "
                       f"({txt})", nums, value=gap)
    return Verdict(measured, "not reproduced", f"no alternative proxy within ±{NOISE} points ({txt})", nums,
                   value=gap)


def verdict_four(acc_four: float, acc_tsv_m: float, acc_inpipeline_svd: float | None = None,
                 se: float | None = None) -> Verdict:
    """esm.four (rule: docs/course.md §Claim rules): 4-sample ESM minus TSV-M (:data:`TSV_M_ROW`), at the
    margin ``max(NOISE, 1.96 se)`` with the difference's paired standard error ``se`` (:func:`paired_se`).
    ``acc_inpipeline_svd`` (the "SVD, no scaling" row) is reported beside it, not judged."""
    d = float(acc_four - acc_tsv_m)
    nums = {"esm_4_samples": float(acc_four), "tsv_m": float(acc_tsv_m), "diff_points": d, "se": se}
    c = compare(d, se=se)
    v = {"better": "reproduced", TIE: "partly", "worse": "not reproduced"}[c]
    measured = f"ESM with 4 proxy images {acc_four:.2f} % vs TSV-M (the paper's SVD baseline) {acc_tsv_m:.2f} %"
    why = f"4-sample ESM minus TSV-M: {d:+.2f} points ({c}, margin {margin(se=se):.2f})"
    if acc_inpipeline_svd is not None:
        d_in = float(acc_four - acc_inpipeline_svd)
        nums.update(svd_inpipeline=float(acc_inpipeline_svd), diff_vs_inpipeline_svd=d_in)
        measured += f" (in-pipeline SVD, no scaling {acc_inpipeline_svd:.2f} %)"
        why += f"; minus the in-pipeline SVD row {d_in:+.2f} (not judged)"
    why += "; the paper gives no 4-sample number to scale (V.7)"
    return Verdict(measured, v, why, nums, [effect("4 samples minus TSV-M", d, se=se, seeds=1)], value=d)


#: Per suite, the paired bootstrap standard error of a gain (None: no per-example results).
SEs = Mapping[str, "float | None"]


def verdict_gain(gains: Mapping[str, float], what: str, measured: str = "", se: SEs | None = None) -> Verdict:
    """esm.esd_alone / esm.ps_on_svd (rule: docs/course.md §Claim rules): ``gains`` per suite against
    TSV-M, the paper's "SVD" row; ``se`` their paired standard errors."""
    res = {s: compare(g, se=(se or {}).get(s)) for s, g in gains.items()}
    txt = ", ".join(f"{s} {g:+.2f}" for s, g in gains.items())
    nums = {f"gain_{s}": float(g) for s, g in gains.items()}
    v = agreement([c == "better" for c in res.values()])
    why = {"reproduced": f"{what}: {txt} points", "partly": f"{what} only on some suites: {txt} points",
           "not reproduced": f"{what}: {txt} points (within noise or negative)"}[v]
    return Verdict(measured or f"{what}: {txt} points", v, why, nums)


def verdict_layer_first(layer_gain: Mapping[str, float], all_gain: Mapping[str, float], measured: str = "",
                        se: SEs | None = None, se_all: SEs | None = None) -> Verdict:
    """esm.layer_first (rule: docs/course.md §Claim rules), per suite: ``layer_gain`` = (ESD, layer
    only) - (ESD, no scaling) against ``all_gain`` = (ESD, all levels) - (ESD, no scaling); ``se`` and
    ``se_all`` their paired standard errors."""
    nums, ok, some = {}, [], []
    for s in layer_gain:
        lg, tg = float(layer_gain[s]), float(all_gain[s])
        nums[f"layer_gain_{s}"], nums[f"all_gain_{s}"] = lg, tg
        holds = compare(tg, se=(se_all or {}).get(s)) == "better" and lg >= tg / 3
        ok.append(holds)
        some.append(holds or compare(lg, se=(se or {}).get(s)) == "better")
    txt = ", ".join(f"{s}: layer {layer_gain[s]:+.2f} of all three {all_gain[s]:+.2f}" for s in layer_gain)
    rule = "rule: all three levels gain and the layer level gives at least a third of it"
    v = "reproduced" if all(ok) else ("partly" if any(some) else "not reproduced")
    return Verdict(measured or txt, v, f"{txt} ({rule})", nums)


#: esm.reciprocal: the paper's drop with the reciprocal exponent, "5+ points".
RECIPROCAL_DROP: float = 5.0


def verdict_reciprocal(drops: Mapping[str, float], big: float = RECIPROCAL_DROP, measured: str = "",
                       se: SEs | None = None) -> Verdict:
    """esm.reciprocal (rule: docs/course.md §Claim rules): ``drops`` = (exponent +2) - (exponent -1)
    per suite, against the paper's ``big``; ``se`` their paired standard errors."""
    se = se or {}
    nums = {f"drop_{s}": float(d) for s, d in drops.items()}
    txt = ", ".join(f"{s} {d:+.2f}" for s, d in drops.items())
    what = f"the paper's exponent (+2) minus the reciprocal (-1): {txt} points"
    if all(d >= big for d in drops.values()):
        v, why = "reproduced", what
    elif all(compare(d, se=se.get(s)) == "better" for s, d in drops.items()):
        v, why = "partly", f"{what} (a drop, but less than {big:g} somewhere)"
    elif all(compare(d, se=se.get(s)) == "worse" for s, d in drops.items()):
        v, why = "not reproduced", f"{what}: the reciprocal exponent is better here"
    else:
        v, why = "not reproduced", f"{what} (no drop beyond noise)"
    return Verdict(measured or what, v, why, nums)


def verdict_norm_importance(table: pd.DataFrame, experts: Mapping[str, float] | None = None) -> Verdict:
    """esm.norm_importance from :func:`norm_order_table` (rule: docs/course.md §Claim rules); with ``experts``
    (``{task: expert test accuracy}``, fractions) and the table's ``correct`` column, each gap's paired standard
    error in normalized points (the two orders paired example by example on each expert's own task)."""
    m = table.groupby(["order", "equal_norms"])["normalized"].mean()
    nums: dict[str, float | None] = {
        "norm_raw": float(m[("norm", False)]), "reverse_raw": float(m[("reverse", False)]),
        "norm_equal": float(m[("norm", True)]), "reverse_equal": float(m[("reverse", True)]),
            "gap_raw": float(m[("norm", False)] - m[("reverse", False)]),
            "gap_equal": float(m[("norm", True)] - m[("reverse", True)])}
    if experts is not None and "correct" in table:
        hits = stage_hits(table[table["order"].isin(["norm", "reverse"])], NORM_ORDER_KEYS)
        if hits:
            nums.update(norm_gaps(hits, experts))
    return norm_gaps_verdict(nums)


#: The key columns of the norm-order study's saved per-example results (``"norm|raw"``, ``"reverse|equal"``, ...;
#: :func:`acetools_course.power.stage_hits`).
NORM_ORDER_KEYS: tuple[str, str] = ("order", "norms")


def norm_gaps(hits: Mapping[str, Mapping[str, np.ndarray]], experts: Mapping[str, float]) -> dict[str, float | None]:
    """The norm-order study's numbers from its per-example results (``norm_order_correct.npz``, rows
    ``"<order>|<norms>"``): each order's normalized accuracy (mean over the experts' own tasks) and each gap with
    its paired standard error (:func:`acetools_course.power.stage_difference`)."""
    out: dict[str, float | None] = {}
    for norms in ("raw", "equal"):
        for order in ("norm", "reverse"):
            h = hits[f"{order}|{norms}"]
            out[f"{order}_{norms}"] = 100 * float(np.mean([h[t].mean() / experts[t] for t in h]))
        out[f"gap_{norms}"], out[f"se_{norms}"] = stage_difference(hits, experts, f"norm|{norms}",
                                                                   f"reverse|{norms}")
    return out


def norm_gaps_verdict(nums: Mapping[str, Any]) -> Verdict:
    """esm.norm_importance from its numbers (:func:`verdict_norm_importance`, or :func:`norm_gaps` of the saved
    per-example results): two settings, raw and equal norms, each gap at the margin ``max(NOISE, 1.96 se)``
    (``se_raw``, ``se_equal``; NOISE without them); the paper gives no number (:func:`_no_paper_number`)."""
    nums = dict(nums)
    raw, eq = float(nums["gap_raw"]), float(nums["gap_equal"])
    se = {"raw norms": nums.get("se_raw"), "equal norms": nums.get("se_equal")}
    txt = f"norm minus reverse order: {raw:+.1f} points (raw norms), {eq:+.1f} (equal norms)"
    measured = (f"normalized accuracy on own task at ESM's budget: norm order {nums['norm_raw']:.1f} vs reverse "
                f"{nums['reverse_raw']:.1f} (raw norms), {nums['norm_equal']:.1f} vs {nums['reverse_equal']:.1f} "
                "(equal norms)")
    better = [compare(raw, se=se["raw norms"]) == "better", compare(eq, se=se["equal norms"]) == "better"]
    v = "reproduced" if all(better) else ("partly" if better[0] else "not reproduced")
    return _no_paper_number(Verdict(measured, v, txt, nums, value=raw), {"raw norms": raw, "equal norms": eq}, se)


#: The ablation claims of notebook 03: claim id -> (rows of the grid shown in the measurement).
#: The paper's "SVD" row is TSV-M (:data:`TSV_M_ROW`); the in-pipeline "SVD, no scaling" row is
#: shown beside it.
ABLATION_CLAIMS: dict[str, tuple[str, ...]] = {
    "esm.esd_alone": ("ESD, no scaling", TSV_M_ROW, "SVD, no scaling"),
    "esm.ps_on_svd": ("SVD, all levels", TSV_M_ROW, "SVD, no scaling"),
    "esm.layer_first": ("ESD, no scaling", "ESD, layer only", "ESD, all levels"),
    "esm.reciprocal": ("ESD, all levels", "ESD, reciprocal (-1)"),
}


def _also(v: Verdict, gains: Mapping[str, float], what: str) -> Verdict:
    """``v`` with an unjudged in-pipeline comparison added to its reason and its numbers
    (``gain_vs_inpipeline_svd_<suite>``)."""
    txt = ", ".join(f"{s} {g:+.2f}" for s, g in gains.items())
    nums = {**v.numbers, **{f"gain_vs_inpipeline_svd_{s}": float(g) for s, g in gains.items()}}
    return Verdict(v.measured, v.verdict, f"{v.reason}; {what}: {txt} (not judged)", nums)


def _ablation_gain(a: tuple[str, str], b: tuple[str, str]) -> dict[int, float]:
    """Row ``a`` minus row ``b`` of the paper's ESM ablation (:data:`acetools_course.paper_tables.ESM_ABLATION`)."""
    t = ESM_ABLATION.set_index(["decomposition", "scaling"])
    return {n: float(t.loc[a, f"tasks{n}"] - t.loc[b, f"tasks{n}"]) for n in (8, 20)}


#: The paper's ViT-B/16 ablation effects (absolute points at 8 / 20 tasks) the ablation claims predict.
PAPER_ABLATION_EFFECTS: dict[str, dict[int, float]] = {
    "esm.esd_alone": _ablation_gain(("ESD", "none"), ("SVD", "none")),
    "esm.ps_on_svd": _ablation_gain(("SVD", "all"), ("SVD", "none")),
    "esm.layer_first": _ablation_gain(("ESD", "layer"), ("ESD", "none")),
    "esm.reciprocal": {8: RECIPROCAL_DROP, 20: RECIPROCAL_DROP},
}


def _paper_n(n: int) -> int:
    """The paper's ablation column for our ``n``-task suite: 8 or 20 (a fixture world's few
    tasks stand for 8)."""
    return 20 if n >= 20 else 8


def _with_effects(v: Verdict, cid: str, gains: Mapping[str, float], world: Any, n_tasks: Mapping[str, int] | None,
                  noise: float = NOISE, se: SEs | None = None) -> Verdict:
    """``v`` with each suite's :class:`~acetools_course.verdicts.Effect` (the paper's
    ablation effect scaled to ``world``'s absolute room, :data:`PAPER_ABLATION_EFFECTS`), and
    the verdict ``undecidable here`` where no suite's prediction reaches twice the floor
    (otherwise the rule's verdict on the suites where it does, by the same agreement). ``se``: each
    suite's paired standard error (the floor ``max(noise, 1.96 se)``)."""
    se = dict(se or {})
    if world is None or n_tasks is None:
        return Verdict(v.measured, v.verdict, v.reason, v.numbers,
                       [effect(s, g, noise=noise, se=se.get(s), seeds=1) for s, g in gains.items()])
    effs, agree = [], []
    for s, g in gains.items():
        pn = _paper_n(int(n_tasks[s]))
        effs.append(effect(s, g, paper=PAPER_ABLATION_EFFECTS[cid][pn], paper_room=paper_room("esm", pn),
                           world_room=world.room_at(int(n_tasks[s]), "absolute"), noise=noise, se=se.get(s), seeds=1))
        agree.append(compare(g, noise=noise, se=se.get(s)) == "better")
    verdict, note = decide(effs, agree)
    if verdict == UNDECIDABLE:
        return Verdict(v.measured, UNDECIDABLE, f"the paper's ablation effect scaled to this world's room is below "
                       f"twice the floor on every suite ({note}); measured: {v.reason}", v.numbers, effs)
    if note:  # decided on fewer suites than the rule saw: re-decide on the decidable ones with the rule
        sub = {e.setting: g for e, g in zip(effs, gains.values()) if e.decidable}
        return Verdict(v.measured, v.verdict if len(sub) == len(gains) else _redecide(cid, sub, v, se),
                       f"{v.reason}; {note}", v.numbers, effs)
    return Verdict(v.measured, v.verdict, v.reason, v.numbers, effs)


def _redecide(cid: str, gains: Mapping[str, float], v: Verdict, se: SEs) -> str:
    """The rule of ``cid`` on the decidable suites' gains only."""
    if cid == "esm.reciprocal":
        return verdict_reciprocal(gains, se=se).verdict
    if cid == "esm.layer_first":
        allg = {s: v.numbers[f"all_gain_{s}"] for s in gains}
        se_all = {s: v.numbers.get(f"se_all_{s}") for s in gains}
        return verdict_layer_first(gains, allg, se=se, se_all=se_all).verdict
    return verdict_gain(gains, cid, se=se).verdict


def ablation_verdicts(ab_table: pd.DataFrame, *, world: Any = None,
                      n_tasks: Mapping[str, int] | None = None) -> dict[str, Verdict]:
    """The ablation-grid verdicts (:data:`ABLATION_CLAIMS`) from :func:`runs_table` rows with a ``suite`` column.

    The paper's "SVD" row is TSV-M (:data:`TSV_M_ROW`); "SVD + PS" is our "SVD, all levels" row
    (docs/course.md §Claim rules). With ``world`` and ``n_tasks`` (suite -> tasks) each paper effect
    is scaled to the world's room (docs/course.md §Scaling rule). The in-pipeline gains stay in the
    numbers as ``gain_vs_inpipeline_svd_<suite>``, not judged."""
    acc = ab_table.pivot(index="variant", columns="suite", values="test_acc")
    needed = list(dict.fromkeys(r for rows in ABLATION_CLAIMS.values() for r in rows))
    missing = [r for r in needed if r not in acc.index]
    if missing:
        raise InputError(f"ablation table lacks the rows {missing} (variant column); run_ablation() runs them all")
    if acc.loc[needed].isna().any().any():
        raise InputError(f"ablation table misses some suites of the rows {needed}: every row needs every suite")

    def gain(a: str, b: str) -> dict[str, float]:
        return {s: float(acc.loc[a, s] - acc.loc[b, s]) for s in acc.columns}

    hits = ab_table.set_index(["variant", "suite"])["correct"] if "correct" in ab_table else None

    def se(a: str, b: str) -> dict[str, float | None]:  # absolute points, the rows paired example by example
        return {s: None if hits is None else paired_se(hits.get((a, s)), hits.get((b, s))) for s in acc.columns}

    def words(cid: str) -> str:  # e.g. "test accuracy (%) tasks8: ESD, no scaling 70.10 / TSV-M ... 68.30"
        rows = ABLATION_CLAIMS[cid]
        return "test accuracy (%) " + "; ".join(f"{s}: " + " / ".join(f"{r} {acc.loc[r, s]:.2f}" for r in rows)
                                                for s in acc.columns)

    pairs = {"esm.esd_alone": ("ESD, no scaling", TSV_M_ROW), "esm.ps_on_svd": ("SVD, all levels", TSV_M_ROW),
             "esm.layer_first": ("ESD, layer only", "ESD, no scaling"),
             "esm.reciprocal": ("ESD, all levels", "ESD, reciprocal (-1)")}
    g = {cid: gain(*ab) for cid, ab in pairs.items()}
    ses = {cid: se(*ab) for cid, ab in pairs.items()}
    se_all = se("ESD, all levels", "ESD, no scaling")
    out = {
        "esm.esd_alone": _also(verdict_gain(g["esm.esd_alone"], "ESD (no scaling) minus TSV-M",
                                            words("esm.esd_alone"), ses["esm.esd_alone"]),
                               gain("ESD, no scaling", "SVD, no scaling"), "minus the in-pipeline SVD row"),
        "esm.ps_on_svd": _also(verdict_gain(g["esm.ps_on_svd"], "SVD with all levels minus TSV-M",
                                            words("esm.ps_on_svd"), ses["esm.ps_on_svd"]),
                               gain("SVD, all levels", "SVD, no scaling"), "minus the in-pipeline SVD, no scaling"),
        "esm.layer_first": verdict_layer_first(g["esm.layer_first"], gain("ESD, all levels", "ESD, no scaling"),
                                               words("esm.layer_first"), ses["esm.layer_first"], se_all),
        "esm.reciprocal": verdict_reciprocal(g["esm.reciprocal"], measured=words("esm.reciprocal"),
                                             se=ses["esm.reciprocal"]),
    }
    suites = list(acc.columns)
    extra = {f"se_all_{s}": x for s, x in se_all.items()}
    out = {k: Verdict(v.measured, v.verdict, v.reason,
                      {"suites": suites, **v.numbers, **{f"se_{s}": x for s, x in ses[k].items()},
                       **(extra if k == "esm.layer_first" else {})}) for k, v in out.items()}
    return {k: _with_effects(v, k, g[k], world, n_tasks, se=ses[k]) for k, v in out.items()}


track_drawing([sys.modules[__name__]])  # each figure function notes itself on the figure it draws (the manifest)
