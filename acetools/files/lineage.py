"""Is the base the experts' parent? A cheap check before a merge (docs/your-models.md §Bases and experts are checked).

Per expert, on a few sampled matrices: ‖τ_t‖/‖W0‖ and the task-vector cosines; :func:`check_lineage`
refuses (or, with ``force``, warns) on the limits below.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import InputError
from ..keys import block_index
from ..layouts import Layout
from .checkpoints import as_checkpoint

__all__ = ["SAMPLE_KEYS", "SAMPLE_ENTRIES", "RATIO_LIMIT", "SHARED_RATIO_LIMIT", "COSINE_LIMIT", "Lineage",
           "sample_keys", "measure_lineage", "check_lineage"]

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


@dataclass
class Lineage:
    """Per expert ‖τ_t‖/‖W0‖ and the T x T task-vector cosines over the sampled ``keys``; ``unchanged``:
    experts whose sampled keys equal the base."""

    keys: list[str]
    ratio: list[float]
    cosine: list[list[float]]
    unchanged: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def mean_cosine(self, t: int) -> float:
        """Mean cosine of expert ``t``'s task vector with the others' (NaN for one expert)."""
        others = [c for s, c in enumerate(self.cosine[t]) if s != t and math.isfinite(c)]
        return sum(others) / len(others) if others else math.nan

    def refusal(self) -> str | None:
        """The one-line reason to refuse the merge, or ``None``."""
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
        return None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready record (kept in ``acetools_merge.json``)."""
        return {"keys": self.keys, "ratio": [round(r, 6) for r in self.ratio],
                "cosine": [[round(c, 6) if math.isfinite(c) else None for c in row] for row in self.cosine],
                "unchanged": self.unchanged,
                "limits": {"ratio": RATIO_LIMIT, "shared_ratio": SHARED_RATIO_LIMIT, "cosine": COSINE_LIMIT}}


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
    return Lineage(keys, ratio, cos, [t for t, u in enumerate(unchanged) if u and keys], names)


def check_lineage(base: Any, experts: Sequence[Any], layout: Layout, *, force: bool = False) -> Lineage:
    """:func:`measure_lineage`, then refuse a base that is not the experts' parent (with ``force`` a
    warning) and warn once about experts whose sampled keys equal the base (head-only fine-tunes)."""
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
