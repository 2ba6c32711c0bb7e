"""Diagnose your models: the data-free signals of a base and its experts as tables (:func:`diagnose`) and a
report (:func:`run_report`); docs/diagnose.md §The signals says how to read each.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..diagnostics import effective_rank, energy_fraction
from ..errors import InputError, InputKeyError, InputTypeError
from ..keys import block_index, layer_type
from ..layouts import TensorMeta, get_layout
from ..merging import METHODS, check_finite, confirmed_ties
from ..merging.ace import ace_matrix, heterogeneity
from ..merging.driver import is_finite
from ..merging.linalg import gram_spectrum
from ..merging.svd import tsv_rank
from ..notebooks import run_notebook  # the one papermill runner (an undeclared parameter is an error)
from ..utils import atomic_write, cpu_threads, progress
from .buffers import carry_missing_buffers
from .checkpoints import Checkpoint, as_checkpoint, check_compatible, check_output_folder
from .heads import expert_names, plan_heads
from .lora import is_adapter, open_expert
from .vocab import plan_vocab

__all__ = ["Diagnosis", "diagnose", "check_inputs", "REPORT_NOTEBOOK", "run_report"]

log = logging.getLogger("acetools.files.diagnose")

#: The report notebook (package data), run by :func:`run_report`.
REPORT_NOTEBOOK = Path(__file__).resolve().parents[1] / "reports" / "diagnose.ipynb"

#: Entries read at a time from a non-matrix key larger than this (an embedding table): diagnose holds float64
#: copies of one part of it, not of the whole key (docs/your-models.md §Memory: streaming and what each
#: method holds).
PART = 1 << 18
#: Keys of at most this many entries (and the parts of larger non-matrix keys) are diagnosed on one CPU thread:
#: threads gain little on them, and on a busy machine their waits made ``diagnose`` many times slower
#: (docs/performance.md §diagnose). Float32 spectra differ in their last bits with the thread count.
ONE_THREAD = 1 << 22

_TABLES = ("summary", "layers", "norms", "cosine", "cosine_per_layer", "overlap", "spectra")


@dataclass
class Diagnosis:
    """The tables of :func:`diagnose` and what was measured (``meta``)."""

    summary: pd.DataFrame
    layers: pd.DataFrame
    norms: pd.DataFrame
    cosine: pd.DataFrame
    cosine_per_layer: pd.DataFrame
    overlap: pd.DataFrame
    spectra: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def by_layer_type(self) -> pd.DataFrame:
        """``layers`` averaged per layer type (mean over blocks; the gate as the flagged share)."""
        cols = [c for c in ("tau_ratio", "energy", "gamma", "energy_topk", "energy_top5", "effective_rank",
                            "overlap_topk", "overlap_random", "cosine_mean", "sum_energy_ratio", "wpre_top5_energy")
                if c in self.layers.columns]
        g = self.layers.groupby("layer_type", sort=False)
        out = g[cols].mean()
        out.insert(0, "n_matrices", g.size())
        out.insert(cols.index("gamma") + 2 if "gamma" in cols else 1, "gated_fraction", g["flag"].mean())
        return out.reset_index()

    def save(self, folder: str | os.PathLike) -> dict[str, Path]:
        """Write every table as ``<name>.csv`` and ``meta.json`` into ``folder``, atomically."""
        folder = Path(folder)
        paths = {}
        for name in _TABLES:
            paths[name] = folder / f"{name}.csv"
            with atomic_write(paths[name], "w") as fh:
                getattr(self, name).to_csv(fh, index=(name == "cosine"), float_format="%.6g")
        paths["meta"] = folder / "meta.json"
        with atomic_write(paths["meta"], "w") as fh:
            json.dump(self.meta, fh, indent=1, default=str)
        return paths

    @classmethod
    def load(cls, folder: str | os.PathLike) -> Diagnosis:
        """Read the tables written by :meth:`save`."""
        folder = Path(folder)
        if not (folder / "meta.json").is_file():
            raise FileNotFoundError(f"no diagnosis in {folder} (meta.json missing); write one with Diagnosis.save")
        tables = {n: pd.read_csv(folder / f"{n}.csv", index_col=0 if n == "cosine" else None) for n in _TABLES}
        return cls(**tables, meta=json.loads((folder / "meta.json").read_text()))


# --------------------------------------------------------------------------- sources
def _what(i: int, labels: Sequence[str]) -> str:
    return f"experts[{i}] ({labels[i]})"


def _names(experts: Sequence[Checkpoint], names: Sequence[str] | None) -> list[str]:
    if names is None:
        return expert_names(experts)
    names = [str(n) for n in names]
    if len(names) != len(experts):
        raise InputError(f"{len(names)} names for {len(experts)} experts")
    if len(set(names)) != len(names):
        raise InputError(f"expert names must be distinct, got {names}")
    return names


def _open_sources(base: Any, experts: Sequence[Any], names: Sequence[str] | None, layout: Any = "auto",
                  heads: str = "auto"):
    """The base and the experts as lazily read sources with the experts' labels and the layout, heads and
    base-model prefix handled as the merge does (:func:`acetools.files.heads.plan_heads`), checked against
    each other."""
    if isinstance(experts, (Mapping, str, os.PathLike)) or not isinstance(experts, Sequence) or not experts:
        raise InputTypeError("experts must be a non-empty list of state dicts or checkpoint paths, one per expert")
    src = as_checkpoint(base, "base")
    exs = [open_expert(e, src) if isinstance(e, (str, os.PathLike)) and is_adapter(e)  # folded (lora.py)
           else as_checkpoint(e, f"experts[{i}]") for i, e in enumerate(experts)]
    labels = _names(exs, names)
    lay = get_layout(layout, keys=src.keys(), config=src.config)
    vocab = plan_vocab("base", src, exs, lay)  # the rows of the base's tokens (docs/your-models.md §Vocabularies)
    if vocab.mode != "same":
        log.info("diagnose: %s", vocab.summary())
    src, exs = vocab.views(src, exs)
    plan = plan_heads(heads, src, exs, lay, write=False)
    if plan.alignment is not None:
        log.info("diagnose: %s", plan.alignment.describe())
    src, exs, _ = plan.views(src, exs, lay)
    who = [_what(i, labels) for i in range(len(exs))]
    src, exs, _ = carry_missing_buffers(src, exs, who=who)  # non-persistent buffers one side did not save
    check_compatible(src, exs, who, "base", layout=lay)
    return src, exs, labels, get_layout(layout, keys=src.keys(), config=src.config)  # the layout of the view


def check_inputs(base: Any, experts: Sequence[Any], *, names: Sequence[str] | None = None,
                 layout: Any = "auto", heads: str = "auto") -> dict[str, Any]:
    """Check, from the headers only, that ``experts`` can be diagnosed against ``base`` (the checks of
    :func:`diagnose`, and some key takes the matrix path under ``layout``); errors name the file, key or
    shape. Returns ``{"n_tasks", "names", "layout", "n_keys", "n_matrices"}``."""
    src, exs, labels, lay = _open_sources(base, experts, names, layout, heads)
    metas = src.metas()
    n_mat = sum(m.dtype.is_floating_point and k not in lay.tied and lay.is_matrix(k, m) for k, m in metas.items())
    if n_mat == 0:
        raise InputError(f"no key takes the matrix path under layout {lay.name!r}; nothing to diagnose "
                         "(check --layout)")
    return {"n_tasks": len(exs), "names": labels, "layout": lay.name, "n_keys": len(metas), "n_matrices": int(n_mat)}


# --------------------------------------------------------------------------- per matrix
def _nanmean(values) -> float:
    """Mean of the finite values; NaN (without a warning) when there are none."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def _energy_share(S: Tensor, k: int) -> float:
    tot = float((S ** 2).sum())
    return float((S[:k] ** 2).sum()) / tot if tot > 0 and k > 0 else math.nan


def _wpre_top5(taus: Sequence[Tensor], key: str, tau: float) -> float:
    """Top-5 % energy of ACE's preliminary closed form W̄_pre (before spectral refinement)."""
    _, dg = ace_matrix(list(taus), name=key, spectra=True, tau=tau)
    s = dg.spectrum_pre
    if s is None or s.numel() == 0 or not bool((s > 0).any()):
        return math.nan
    return energy_fraction(s, 0.05)


# --------------------------------------------------------------------------- the walk
def diagnose(
    base: Mapping[str, Tensor] | str | os.PathLike,
    experts: Sequence[Mapping[str, Tensor] | str | os.PathLike],
    *,
    names: Sequence[str] | None = None,
    layout: Any = "auto",
    tau: float | None = None,
    ace: bool = False,
    keys: Sequence[str] | None = None,
    max_singular_values: int | None = 64,
    show_progress: bool | None = None,
    heads: str = "auto",
) -> Diagnosis:
    """The data-free diagnostics of ``experts`` fine-tuned from ``base`` (docs/diagnose.md §Which weights are
    analysed).

    ``base`` / ``experts``: state dicts or checkpoint paths (read one tensor at a time). ``names``: one
    per expert (default: :func:`acetools.files.heads.expert_names`). ``layout``: :func:`acetools.layouts.get_layout`.
    ``tau``: ACE's gate threshold (None: ACE's default). ``ace=True`` also runs ACE's closed form per
    matrix for W̄_pre's top-5 % energy (slower). ``keys``: restrict to these keys.
    ``max_singular_values``: per task and matrix in ``spectra`` (None: all). ``heads``: as
    ``acetools merge --heads`` (docs/your-models.md §Per-task heads).
    """
    t0 = time.perf_counter()
    gate_tau = METHODS["ace"].resolve({} if tau is None else {"tau": tau})["tau"]  # ACE's default and checks
    src, exs, labels, lay = _open_sources(base, experts, names, layout, heads)
    try:
        chosen = src.keys() if keys is None else list(keys)
        for k in chosen:
            if k not in src:
                raise InputKeyError(f"key {k!r} is not in the base")
        # block order: files may store keys sorted as text (0, 1, 10, 11, 2, ...); stable otherwise
        chosen.sort(key=lambda k: (block_index(k) is not None, block_index(k) or 0))
        walk = _Walk(labels, lay, tau=gate_tau, ace=ace, max_singular_values=max_singular_values)
        tied = confirmed_ties(lay.tied, src, exs)  # aliases equal to their key everywhere
        for key in progress(chosen, desc="diagnose", enabled=show_progress):
            m = src.meta(key)
            if not m.dtype.is_floating_point or key in tied:
                continue
            parts = math.prod(m.shape) > PART and not walk.is_matrix(key, m)
            with cpu_threads(1) if parts or math.prod(m.shape) <= ONE_THREAD else contextlib.nullcontext():
                if parts:
                    walk.add_norms(key, m, *_gram_in_parts(key, src, exs, lay, labels))
                else:
                    walk.add(key, m, *_w0_taus(key, src, exs, lay, labels))
    finally:
        src.close()
        for e in exs:
            e.close()
    return walk.diagnosis(src, exs, n_keys=len(chosen), seconds=round(time.perf_counter() - t0, 2))


def _w0_taus(key: str, src: Checkpoint, exs: Sequence[Checkpoint], lay, labels: Sequence[str]
             ) -> tuple[Tensor, list[Tensor]]:
    """W0 and the task vectors of ``key`` in float64, d_out x d_in; errors name the expert."""
    W0 = lay.to_canonical(key, src.get(key)).to(torch.float64)
    taus = [lay.to_canonical(key, e.get(key)).to(torch.float64) - W0 for e in exs]
    for i, t in enumerate(taus):
        check_finite(_what(i, labels), key, t)
    return W0, taus


def _gram_in_parts(key: str, src: Checkpoint, exs: Sequence[Checkpoint], lay, labels: Sequence[str]
                   ) -> tuple[Tensor, float]:
    """The Gram matrix of the task vectors of ``key`` and ||W0||, in float64 from :data:`PART` entries of every
    model at a time (the sums of :meth:`_Walk.add` in another order: equal to ~1e-15 relative)."""
    n, T = math.prod(src.meta(key).shape), len(exs)
    Gk = torch.zeros(T, T, dtype=torch.float64)
    w0_sq = torch.zeros((), dtype=torch.float64)
    for a in range(0, n, PART):
        w0 = src.get_flat(key, a, min(n, a + PART)).to(torch.float64)
        taus = [e.get_flat(key, a, min(n, a + PART)).to(torch.float64) - w0 for e in exs]
        if not all(is_finite(t) for t in taus):
            _w0_taus(key, src, exs, lay, labels)  # the error names the expert and counts the whole key
        F = torch.stack(taus)
        Gk += F @ F.T
        w0_sq += w0 @ w0
    return Gk, math.sqrt(float(w0_sq))


class _Walk:
    """The tables :func:`diagnose` fills key by key, and the :class:`Diagnosis` they make."""

    def __init__(self, labels: list[str], lay, *, tau: float, ace: bool, max_singular_values: int | None):
        self.labels, self.lay, self.tau, self.ace, self.max_sv = labels, lay, tau, ace, max_singular_values
        T = len(labels)
        self.norm_rows, self.layer_rows, self.cos_rows, self.ov_rows, self.spec_rows = [], [], [], [], []
        self.G = torch.zeros(T, T, dtype=torch.float64)
        self.iu = torch.triu_indices(T, T, 1).T.tolist()

    def is_matrix(self, key: str, m: TensorMeta) -> bool:
        """Whether ``key`` gets the per-matrix tables."""
        return bool(self.lay.is_matrix(key, m)) and len(m.shape) == 2

    def add(self, key: str, m: TensorMeta, W0: Tensor, taus: list[Tensor]) -> None:
        """Norm rows for every float key; the per-matrix tables for matrices."""
        F = torch.stack([t.reshape(-1) for t in taus])
        Gk = F @ F.T
        b = float(W0.norm())
        self.add_norms(key, m, Gk, b)
        if self.is_matrix(key, m):
            self._matrix(key, W0.shape, b, taus, Gk)

    def add_norms(self, key: str, m: TensorMeta, Gk: Tensor, b: float) -> None:
        """The norm rows of ``key`` from its task vectors' Gram matrix ``Gk`` and ``b`` = ||W0||."""
        self.G += Gk
        role = self.lay.role(key, m)
        for name, e2 in zip(self.labels, Gk.diagonal().tolist()):
            tn = math.sqrt(e2)
            self.norm_rows.append({"task": name, "key": key, "layer_type": layer_type(key), "block": block_index(key),
                                   "role": role, "tau_norm": tn, "base_norm": b,
                                   "ratio": tn / b if b > 0 else math.nan, "energy": e2})

    def _where(self, key: str) -> dict[str, Any]:
        return {"key": key, "layer_type": layer_type(key), "block": block_index(key)}

    def _pairs(self, key: str, Gk: Tensor, spectra, k: int, d_out: int, d_in: int) -> tuple[list, list]:
        """Pairwise cosines of the task vectors and overlaps of their top-k singular subspaces."""
        n = Gk.diagonal().sqrt()
        cos = Gk / torch.outer(n, n).clamp(min=1e-300)
        cos_pairs = [float(cos[i, j]) if n[i] > 0 and n[j] > 0 else math.nan for i, j in self.iu]
        for (i, j), c in zip(self.iu, cos_pairs):
            self.cos_rows.append({**self._where(key), "task_i": self.labels[i], "task_j": self.labels[j],
                                  "cosine": c})
        overlaps = []
        for i, j in self.iu if k > 0 else ():
            if n[i] == 0 or n[j] == 0:
                continue
            left = float((spectra[i][1].T @ spectra[j][1]).pow(2).sum()) / k
            right = float((spectra[i][2].T @ spectra[j][2]).pow(2).sum()) / k
            overlaps.append((left + right) / 2)
            self.ov_rows.append({**self._where(key), "task_i": self.labels[i], "task_j": self.labels[j], "k": k,
                                 "overlap_left": left, "overlap_right": right, "overlap": (left + right) / 2,
                                 "random": (k / d_out + k / d_in) / 2})
        return cos_pairs, overlaps

    def _matrix(self, key: str, shape, b: float, taus: list[Tensor], Gk: Tensor) -> None:
        d_out, d_in = shape
        r, T = min(d_out, d_in), len(taus)
        k = tsv_rank(r, T)
        spectra = [gram_spectrum(t, max(k, 1)) for t in taus]
        cos_pairs, overlaps = self._pairs(key, Gk, spectra, k, d_out, d_in)
        for name, (S, _, _) in zip(self.labels, spectra):
            top = S[:self.max_sv or r].tolist()
            s1 = top[0] if top and top[0] > 0 else math.nan
            self.spec_rows += [{**self._where(key), "task": name, "index": i + 1, "sigma": s, "sigma_rel": s / s1}
                               for i, s in enumerate(top)]
        energies = Gk.diagonal()
        logs = torch.log(energies + 1e-12)
        gamma = heterogeneity(taus)
        tot = float(energies.sum())
        row = {
            **self._where(key), "shape": f"{d_out}x{d_in}", "orientation": self.lay.orientation(key), "base_norm": b,
            "tau_ratio": float(np.mean([math.sqrt(float(e)) / b for e in energies])) if b > 0 else math.nan,
            "energy": float(energies.mean()), "energy_min": float(energies.min()),
            "energy_max": float(energies.max()),
            "log_energy_mean": float(logs.mean()),
            "log_energy_sd": float(logs.std(unbiased=False)) if T > 1 else 0.0,
            "gamma": gamma, "flag": gamma > self.tau, "gate": "on" if gamma > self.tau else "off",
            "tsv_k": k, "energy_topk": _nanmean([_energy_share(S, k) for S, _, _ in spectra]),
            "energy_top5": _nanmean([_energy_share(S, max(1, math.ceil(0.05 * r))) for S, _, _ in spectra]),
            "effective_rank": float(np.mean([effective_rank(S) for S, _, _ in spectra])),
            "overlap_topk": float(np.mean(overlaps)) if overlaps else math.nan,
            "overlap_random": (k / d_out + k / d_in) / 2 if k > 0 else math.nan,
            "cosine_mean": _nanmean(cos_pairs),
            "sum_energy_ratio": float(Gk.sum()) / tot if tot > 0 else math.nan,
        }
        if self.ace:
            row["wpre_top5_energy"] = _wpre_top5(taus, key, self.tau)
        self.layer_rows.append(row)

    def diagnosis(self, src: Checkpoint, exs: Sequence[Checkpoint], *, n_keys: int, seconds: float) -> Diagnosis:
        if not self.layer_rows:
            raise InputError(f"no key takes the matrix path under layout {self.lay.name!r}; nothing to diagnose "
                             "(check --layout, or the keys you selected)")
        labels, G = self.labels, self.G
        n = G.diagonal().sqrt()
        C = G / torch.outer(n, n).clamp(min=1e-300)
        C[(n == 0)[:, None] | (n == 0)[None, :]] = math.nan
        layers = pd.DataFrame(self.layer_rows)
        meta = {"n_tasks": len(labels), "names": labels, "layout": self.lay.name, "tau": self.tau, "ace": self.ace,
                "n_keys": n_keys, "n_matrices": len(layers), "seconds": seconds,
                "base": _path(src), "experts": [_path(e) for e in exs]}
        pair = ["key", "layer_type", "block", "task_i", "task_j"]
        d = Diagnosis(
            summary=pd.DataFrame(), layers=layers,
            norms=pd.DataFrame(self.norm_rows, columns=["task", "key", "layer_type", "block", "role", "tau_norm",
                                                        "base_norm", "ratio", "energy"]),
            cosine=pd.DataFrame(C.numpy(), index=labels, columns=labels),
            cosine_per_layer=pd.DataFrame(self.cos_rows, columns=[*pair, "cosine"]),
            overlap=pd.DataFrame(self.ov_rows, columns=[*pair, "k", "overlap_left", "overlap_right", "overlap",
                                                        "random"]),
            spectra=pd.DataFrame(self.spec_rows, columns=["key", "layer_type", "block", "task", "index", "sigma",
                                                          "sigma_rel"]),
            meta=meta,
        )
        d.summary = _summary(d)
        log.info("diagnose: %d matrices of %d tasks in %.1f s", len(layers), len(labels), seconds)
        return d


def _path(ck: Checkpoint) -> str:
    return str(ck.path) if ck.files else "state dict"


def _summary(d: Diagnosis) -> pd.DataFrame:
    """One row per signal: metric, label, value, unit, reading (docs/diagnose.md)."""
    L, T = d.layers, d.meta["n_tasks"]
    off = d.cosine.to_numpy()[~np.eye(T, dtype=bool)] if T > 1 else np.array([math.nan])
    rows = []

    def row(metric, label, value, unit, reading):
        rows.append({"metric": metric, "label": label, "value": float(value), "unit": unit, "reading": reading})

    row("tau_ratio", "‖τ_t‖/‖W0‖ (median over matrices)", L["tau_ratio"].median(), "ratio",
        "how far the experts moved; small values are the regime where task vectors add almost linearly")
    row("energy", "‖ΔW_t‖²_F (median over matrices)", L["energy"].median(), "",
        "the size ACE's γ is computed from; near 1 the log-energies are near 0 and γ explodes")
    row("ace_gamma_median", "ACE's γ (median over matrices)", L["gamma"].median(), "",
        "spread of the tasks' log-energies (Eq. 7 of ACE-Merging); CLIP ViTs: < 0.25")
    row("ace_gated_fraction", f"matrices ACE gates (γ > τ = {d.meta['tau']})", 100 * L["flag"].mean(), "%",
        "share of matrices where ACE normalises the covariances and refines the spectrum")
    row("cosine_mean", "task-vector cosine (mean off the diagonal)", _nanmean(off), "",
        "≈ 0: nearly orthogonal task vectors, the usual case for fine-tunes of one base")
    finite = off[np.isfinite(off)]
    row("cosine_max", "task-vector cosine (max off the diagonal)", float(finite.max()) if finite.size else math.nan,
        "", "a large value names two experts that moved the same way (they reinforce in task arithmetic)")
    row("sum_energy_ratio", "‖Σ_t τ_t‖² / Σ_t ‖τ_t‖² (median over matrices)", L["sum_energy_ratio"].median(), "",
        f"1 for orthogonal task vectors, T = {T} for identical ones; between, how much they add up")
    row("trunc_energy", "energy of τ_t in its top-⌊r/T⌋ directions (mean)", 100 * L["energy_topk"].mean(), "%",
        "what TSV-M's per-task rank budget keeps; high: the task matrices are low-rank and TSV-M loses little")
    row("energy_top5", "energy of τ_t in its top 5 % directions (mean)", 100 * L["energy_top5"].mean(), "%",
        "energy concentration of each task's update")
    row("overlap_topk", "overlap of tasks' top-k subspaces (mean cos²)", L["overlap_topk"].mean(), "",
        "near the random value: tasks use different directions, so structured merges (TSV-M, ACE, ESM) have room "
        "over task arithmetic; near 1: they compete for the same directions")
    row("overlap_random", "…of random k-dim subspaces (k/d)", L["overlap_random"].mean(), "", "for scale")
    if "wpre_top5_energy" in L.columns:
        row("wpre_top5_energy", "W̄_pre's top-5 % energy (median)", 100 * L["wpre_top5_energy"].median(), "%",
            "ACE's preliminary closed form; CLIP ViTs: ≥ 99 % (ACE-Merging)")
    return pd.DataFrame(rows, columns=["metric", "label", "value", "unit", "reading"])


# --------------------------------------------------------------------------- the report
def run_report(
    base: str | os.PathLike,
    experts: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    names: Sequence[str] | None = None,
    layout: str = "auto",
    tau: float | None = None,
    ace: bool = False,
    html: bool = True,
    timeout: int | None = None,
    start_timeout: int = 300,
    heads: str = "auto",
) -> dict[str, Any]:
    """Execute the report notebook into ``out`` (:func:`acetools.notebooks.run_notebook`), render
    ``diagnose.html`` without code and save the tables beside it. Returns ``{"executed", "html", "seconds"}``."""
    for p in [base, *experts]:
        if not Path(p).exists():
            raise FileNotFoundError(f"no checkpoint at {p}")
    out = check_output_folder(out, [base, *experts], weights=False)  # the merge command's check
    params = {"base": str(Path(base).resolve()), "experts": [str(Path(e).resolve()) for e in experts],
              "names": list(names) if names is not None else [], "layout": layout,
              "tau": float(METHODS["ace"].hparams["tau"] if tau is None else tau), "ace": bool(ace),
              "out_dir": str(out), "heads": heads}
    rec = run_notebook(REPORT_NOTEBOOK, out, params, html=html, timeout=timeout, start_timeout=start_timeout,
                       cwd=out, output_name="diagnose.ipynb", require_mathjax=False)
    return {k: rec[k] for k in ("executed", "html", "seconds") if k in rec}
