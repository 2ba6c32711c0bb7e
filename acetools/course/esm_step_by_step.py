"""The measurements of notebook ``03_esm_step_by_step`` (docs/course.md §03_esm_step_by_step).

The lesson writes ESM's stages itself (docs/methods.md §ESM); this module composes no merge: ESD vs SVD,
proxy data, runs with alpha chosen on validation, the norm order (verdicts: ``claimkit.esm_step_by_step``)."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..benchmark import MethodRun
from ..diagnostics import layer_type, linear_cka, principal_subspace, subspace_similarity
from ..errors import InputError, InputKeyError
from ..merging import esm as E
from ..merging import is_matrix_param, merge
from ..search import check_patience, climb_search, esm_search, grid_search
from ..utils import progress as bar

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
    equal norms (:func:`load_components`), scored on its own task, beside the references ``"none"`` and ``"all"``."""
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
            acc = ref[task] if state is None else bench.evaluate(state, split, tasks=[task])[task]
            rows.append({"task": task, "order": order, "equal_norms": eq, "accuracy": 100 * acc,
                         "normalized": 100 * acc / ref[task] if ref[task] > 0 else math.nan})
    return pd.DataFrame(rows)


