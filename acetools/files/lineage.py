"""Is the base the experts' parent? A cheap check before a merge (docs/your-models.md §Bases and experts are checked).

Per expert, on a few sampled matrices: ‖τ_t‖/‖W0‖ and the task-vector cosines (an unrelated base); per
model given, its summed distance to the others and the mean cosine of the task vectors taken from it (a
swapped base: not the most central model); and what the configs say each expert was fine-tuned from
(``_name_or_path``, an adapter's ``base_model_name_or_path``). :func:`check_lineage` refuses (or, with
``force``, warns) on the limits below.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..keys import block_index
from ..layouts import Layout
from .checkpoints import Checkpoint, as_checkpoint

__all__ = ["SAMPLE_KEYS", "SAMPLE_ENTRIES", "RATIO_LIMIT", "SHARED_RATIO_LIMIT", "COSINE_LIMIT", "CENTRAL_MARGIN",
           "Lineage", "sample_keys", "claimed_parents", "names_same_model", "measure_lineage", "check_lineage"]

#: How many matrix keys are read per model for the check (spread evenly over the model's depth).
SAMPLE_KEYS = 8
#: At most this many entries of each sampled key are read (whole rows, evenly spaced), so the check costs the
#: same on any model size.
SAMPLE_ENTRIES = 1 << 16
#: ‖τ_t‖/‖W0‖ above which an expert is refused whatever its cosines.
RATIO_LIMIT = 2.0
#: ‖τ_t‖/‖W0‖ above which an expert is refused when its task vector also points where the others' do.
SHARED_RATIO_LIMIT = 0.5
#: Mean cosine of an expert's task vector with the other experts' above which (with a ratio above
#: :data:`SHARED_RATIO_LIMIT`) the experts share one large displacement from the base.
COSINE_LIMIT = 0.9
#: A model given as an expert whose summed distance to the other models is smaller than the base's by
#: more than this fraction of the base's is more central than the base: the base is refused as swapped.
CENTRAL_MARGIN = 0.05
#: Path components that name no model (a folder's generic name, a hub snapshot's commit).
_GENERIC = frozenset({"", "model", "models", "base", "pretrained", "weights", "checkpoint", "checkpoints", "main",
                      "hf", "snapshots", "final", "output", "outputs", "out", "tmp", "save", "saved", "merged"})
_SELF = re.compile(r"^(checkpoint|ckpt|step|epoch)[-_]?\d+$", re.IGNORECASE)  # a training run's own save folder


def _rows(t: torch.Tensor) -> torch.Tensor:
    """At most :data:`SAMPLE_ENTRIES` entries of ``t``: whole rows, evenly spaced."""
    m = t.reshape(t.shape[0], -1) if t.ndim >= 2 else t.reshape(1, -1)
    n = max(1, min(m.shape[0], SAMPLE_ENTRIES // max(1, m.shape[1])))
    return m[torch.linspace(0, m.shape[0] - 1, n).round().long()]  # every row when they fit


def sample_keys(base: Any, layout: Layout, n: int = SAMPLE_KEYS) -> list[str]:
    """At most ``n`` matrix keys of ``base`` (a Checkpoint or a state dict), evenly spaced over its blocks,
    tied aliases skipped; 2-D float keys, then any float keys, when the layout names no matrix."""
    base = as_checkpoint(base)
    metas = base.metas()
    floats = [k for k in base.keys() if k not in layout.tied and metas[k].dtype.is_floating_point]
    mats = ([k for k in floats if layout.is_matrix(k, metas[k])] or [k for k in floats if metas[k].ndim == 2]
            or [k for k in floats if metas[k].ndim >= 1])
    mats.sort(key=lambda k: (block_index(k) is not None, block_index(k) or 0))
    if len(mats) <= n:
        return mats
    return [mats[round(i * (len(mats) - 1) / (n - 1))] for i in range(n)] if n > 1 else [mats[len(mats) // 2]]


# --------------------------------------------------------------------------- what the configs say
def claimed_parents(ck: Checkpoint) -> list[tuple[str, str]]:
    """What ``ck``'s folder says it was fine-tuned from: ``[(field, value)]`` of its config.json's
    ``_name_or_path`` (transformers 4 wrote the name or path the model was loaded from; transformers 5
    writes none) and its adapter_config.json's ``base_model_name_or_path``; empty values are left out."""
    found = []
    if isinstance(ck.config, dict) and isinstance(ck.config.get("_name_or_path"), str):
        found.append(("config.json _name_or_path", ck.config["_name_or_path"].strip()))
    adapter = ck.folder / "adapter_config.json" if ck.folder is not None else None
    if adapter is not None and adapter.is_file():
        try:
            value = json.loads(adapter.read_text()).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            value = None
        if isinstance(value, str):
            found.append(("adapter_config.json base_model_name_or_path", value.strip()))
    return [(f, v) for f, v in found if v]


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _model_name(text: str) -> str:
    """The normalised name a path or hub id gives its model: a hub cache folder's repository
    (``models--org--name``), else the last component that is not generic (``model``, a commit hash)."""
    parts = [q for q in re.split(r"[/\\]+", text.strip()) if q not in ("", ".", "..", "~")]
    for q in parts:
        if q.startswith("models--"):
            return _norm(q.split("--")[-1])
    for q in reversed(parts):
        n = _norm(q)
        if n not in _GENERIC and not re.fullmatch(r"[0-9a-f]{40}", n):
            return n
    return ""


def _where(ck: Checkpoint) -> Path | None:
    return ck.folder if ck.folder is not None else (ck.path if ck.files else None)


def _local(text: str) -> Path | None:
    """``text`` as an existing local path (relative to the working folder), else ``None``."""
    try:
        p = Path(text).expanduser()
        return p if p.exists() else None
    except (OSError, ValueError):
        return None


def _same_path(p: Path, ck: Checkpoint) -> bool:
    where = _where(ck)
    try:
        return where is not None and (os.path.samefile(p, where) or (p.is_dir() and ck.path.parent.exists()
                                                                     and os.path.samefile(p, ck.path.parent)))
    except OSError:
        return False


def names_same_model(text: str, ck: Checkpoint) -> bool:
    """Whether the name or path ``text`` can name the model of ``ck``: the same file or folder, or the
    same name (``ck``'s folder name, its parent's, its hub id from a cache path, its own ``_name_or_path``),
    compared without case or punctuation, one containing the other (docs/your-models.md §Bases and experts
    are checked)."""
    p = _local(text)
    if p is not None and _same_path(p, ck):
        return True
    name = _model_name(text)
    if not name:
        return True  # nothing to compare: no evidence against
    where = _where(ck)
    known = [] if where is None else [_model_name(str(where)), _model_name(str(where.resolve())),
                                      _norm(where.name), _norm(where.parent.name)]
    known += [_model_name(v) for _, v in claimed_parents(ck)]
    known = [k for k in known if k and k not in _GENERIC]
    return any(name == k or (min(len(name), len(k)) >= 4 and (name in k or k in name)) for k in known)


def _names_itself(text: str, ck: Checkpoint) -> bool:
    """Whether ``text`` looks like ``ck``'s own save path (a model loaded from its own folder and saved again):
    the same folder, its folder's name, or a training run's ``checkpoint-500``."""
    p = _local(text)
    if p is not None:
        return _same_path(p, ck)
    where = _where(ck)
    last = re.split(r"[/\\]+", text.strip().rstrip("/\\"))[-1]
    own = {_norm(where.name), _norm(where.parent.name)} - _GENERIC if where is not None else set()
    return bool(_SELF.match(last)) or _model_name(text) in own


def _contradiction(base: Checkpoint, experts: Sequence[Checkpoint], names: Sequence[str]) -> str | None:
    """The one-line reason when a config names another model than ``base`` as an expert's parent, or names
    one of the experts as the base's own parent; ``None`` when the configs agree or say nothing."""
    base_name = f"the base ({base.path})" if base.files else "the base"
    for field_, value in claimed_parents(base):
        p = _local(value)
        if p is None or _same_path(p, base):
            continue
        hit = next((t for t, ck in enumerate(experts) if _same_path(p, ck)), None)
        if hit is not None:
            return (f"{base_name} says it was fine-tuned from {names[hit]} ({field_} {value!r}): is {names[hit]} "
                    "the base? (docs/your-models.md §Bases and experts are checked); check --base, or merge "
                    "anyway with --force (force=True)")
    for t, ck in enumerate(experts):
        for field_, value in claimed_parents(ck):
            if names_same_model(value, base) or _names_itself(value, ck):
                continue
            p = _local(value)
            other = next((names[s] for s, e in enumerate(experts) if s != t and p is not None and _same_path(p, e)),
                         None)
            what = f"{value!r}, given as {other}" if other else repr(value)
            return (f"{names[t]} says it was fine-tuned from {what} ({field_}), not from {base_name} "
                    "(docs/your-models.md §Bases and experts are checked); check --base, or merge anyway with "
                    "--force (force=True)")
    return None


# --------------------------------------------------------------------------- what the weights say
def _2f(x: float) -> str:
    return f"{x:.2f}".replace("-0.00", "0.00")


@dataclass
class Lineage:
    """Per expert ‖τ_t‖/‖W0‖ and the T x T task-vector cosines over the sampled ``keys``; ``unchanged``:
    experts whose sampled keys equal the base. Per model given (0 the base, t + 1 expert t):
    ``dist_sum``, its summed distance to the other models, and ``cosine_from``, the mean pairwise cosine
    of the others' task vectors taken from it (NaN with fewer than two others). ``contradiction``: what
    the configs say against the base (:func:`claimed_parents`), or ``None``."""

    keys: list[str]
    ratio: list[float]
    cosine: list[list[float]]
    unchanged: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    dist_sum: list[float] = field(default_factory=list)
    cosine_from: list[float] = field(default_factory=list)
    base_name: str = "the base"
    contradiction: str | None = None

    def mean_cosine(self, t: int) -> float:
        """Mean cosine of expert ``t``'s task vector with the others' (NaN for one expert)."""
        others = [c for s, c in enumerate(self.cosine[t]) if s != t and math.isfinite(c)]
        return sum(others) / len(others) if others else math.nan

    def central_gap(self, t: int) -> float:
        """How much more central expert ``t`` is than the base: (s_base − s_t) / s_base of the summed
        distances (negative: the base is more central; 0 without distances)."""
        if not self.dist_sum or not self.dist_sum[0] > 0:
            return 0.0
        return (self.dist_sum[0] - self.dist_sum[t + 1]) / self.dist_sum[0]

    def most_central(self) -> int | None:
        """The expert most central by more than :data:`CENTRAL_MARGIN` over the base, or ``None``."""
        gaps = [self.central_gap(t) for t in range(len(self.ratio))]
        t = max(range(len(gaps)), key=gaps.__getitem__, default=None)
        return t if t is not None and gaps[t] > CENTRAL_MARGIN else None

    def refusal(self) -> str | None:
        """The one-line reason to refuse the merge, or ``None``: an unrelated base (the ratio, with the
        cosines), a swapped base (another model more central), a base the configs contradict."""
        for t, r in enumerate(self.ratio):
            c = self.mean_cosine(t)
            shared = math.isfinite(c) and c > COSINE_LIMIT and r > SHARED_RATIO_LIMIT
            if r > RATIO_LIMIT or shared:
                why = (f"‖τ‖/‖W0‖ = {r:.3g} and a mean task-vector cosine of {c:.3f} with the other experts "
                       f"(limits {SHARED_RATIO_LIMIT} and {COSINE_LIMIT})" if shared and r <= RATIO_LIMIT else
                       f"‖τ‖/‖W0‖ = {r:.3g} (limit {RATIO_LIMIT})")
                return (f"the base does not look like the parent of {self.names[t]}: {why} over {len(self.keys)} "
                        "sampled matrices, where fine-tunes of their own base measured 0.01-0.2 "
                        "(docs/your-models.md §Bases and experts are checked); check --base, or merge anyway with "
                        "--force (force=True)")
        t = self.most_central()
        if t is not None:
            s0, st = self.dist_sum[0], self.dist_sum[t + 1]
            return (f"{self.base_name} is not the most central of the models given: {self.names[t]} is (summed "
                    f"distance to the others {st:.4g} against the base's {s0:.4g}, {self.central_gap(t):.1%} less, "
                    f"limit {CENTRAL_MARGIN:.0%}; mean task-vector cosine {_2f(self.cosine_from[0])} from the base, "
                    f"{_2f(self.cosine_from[t + 1])} from it) over {len(self.keys)} sampled matrices: is it the "
                    "base, and the base one of its fine-tunes? "
                    "(docs/your-models.md §Bases and experts are checked); check --base, or merge anyway with "
                    "--force (force=True)")
        return self.contradiction

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready record (kept in ``acetools_merge.json``)."""
        def num(c: float) -> float | None:
            return round(c, 6) if math.isfinite(c) else None

        return {"keys": self.keys, "ratio": [round(r, 6) for r in self.ratio],
                "cosine": [[num(c) for c in row] for row in self.cosine],
                "unchanged": self.unchanged,
                "dist_sum": [num(d) for d in self.dist_sum], "cosine_from": [num(c) for c in self.cosine_from],
                "contradiction": self.contradiction,
                "limits": {"ratio": RATIO_LIMIT, "shared_ratio": SHARED_RATIO_LIMIT, "cosine": COSINE_LIMIT,
                           "central_margin": CENTRAL_MARGIN}}


def _centrality(G: torch.Tensor) -> tuple[list[float], list[float]]:
    """Summed distances and mean cosines from each model, from the T x T Gram matrix ``G`` of the task
    vectors (the base at the origin, so X below is the Gram matrix of all T + 1 models)."""
    T = G.shape[0]
    X = torch.zeros(T + 1, T + 1, dtype=torch.float64)
    X[1:, 1:] = G
    d = X.diagonal()
    D = (d[:, None] + d[None, :] - 2 * X).clamp(min=0).sqrt()  # D[i, j] = ‖model_i − model_j‖
    dist_sum = [float(x) for x in D.sum(1)]
    cos_from = []
    for i in range(T + 1):
        others = [j for j in range(T + 1) if j != i]
        Gi = X[others][:, others] - X[others, i][:, None] - X[i, others][None, :] + X[i, i]  # the others − model i
        n = Gi.diagonal().clamp(min=0).sqrt()
        C = Gi / torch.outer(n, n).clamp(min=1e-300)
        pairs = [float(C[a, b]) for a in range(T) for b in range(a + 1, T) if n[a] > 0 and n[b] > 0]
        cos_from.append(sum(pairs) / len(pairs) if pairs else math.nan)
    return dist_sum, cos_from


def measure_lineage(base: Any, experts: Sequence[Any], layout: Layout) -> Lineage:
    """:class:`Lineage` over :func:`sample_keys` in float64; ``base``/``experts``: Checkpoints
    or state dicts with the same keys."""
    base, experts = as_checkpoint(base), [as_checkpoint(e) for e in experts]
    keys = sample_keys(base, layout)
    T = len(experts)
    G = torch.zeros(T, T, dtype=torch.float64)
    b2 = 0.0
    unchanged = [True] * T
    for key in keys:
        W0 = _rows(base.get(key)).to(torch.float64).reshape(-1)
        b2 += float(W0.pow(2).sum())
        F = torch.empty(T, W0.numel(), dtype=torch.float64)  # the T task vectors, one row each
        for t, ck in enumerate(experts):
            F[t].copy_(_rows(ck.get(key)).reshape(-1)).sub_(W0)
            unchanged[t] = unchanged[t] and not bool(F[t].any())
        G += F @ F.T
    n = G.diagonal().sqrt()
    ratio = [float(x) / math.sqrt(b2) if b2 > 0 else math.inf for x in n]
    C = G / torch.outer(n, n).clamp(min=1e-300)
    cos = [[float(C[i, j]) if n[i] > 0 and n[j] > 0 else math.nan for j in range(T)] for i in range(T)]
    names = [f"expert {t} ({ck.path})" if ck.files else f"expert {t}" for t, ck in enumerate(experts)]
    dist_sum, cos_from = _centrality(G)
    return Lineage(keys, ratio, cos, [t for t, u in enumerate(unchanged) if u and keys], names, dist_sum, cos_from,
                   f"the base ({base.path})" if base.files else "the base", _contradiction(base, experts, names))


def check_lineage(base: Any, experts: Sequence[Any], layout: Layout, *, force: bool = False) -> Lineage:
    """:func:`measure_lineage`, then refuse a base that is not the experts' parent (unrelated, swapped or
    contradicted by the configs; with ``force`` a warning) and warn once about experts whose sampled keys
    equal the base (head-only fine-tunes)."""
    lin = measure_lineage(base, experts, layout)
    why = lin.refusal()
    if why is not None:
        if not force:
            raise InputError(why)
        warnings.warn(f"merging anyway (force): {why.split('; check --base')[0]}", UserWarning, stacklevel=2)
    if lin.unchanged:
        who = ", ".join(lin.names[t] for t in lin.unchanged)
        one = len(lin.unchanged) == 1
        warnings.warn(f"{who}: the merged part equals the base on all {len(lin.keys)} sampled matrices (only "
                      f"{'its head was' if one else 'their heads were'} fine-tuned?); the merge takes nothing from "
                      f"{'it' if one else 'them'} but {'its head' if one else 'their heads'}", UserWarning,
                      stacklevel=2)
    return lin
