"""Is the base the experts' parent? A cheap check before a merge (docs/your-models.md §Bases and experts are checked).

On a few sampled matrices: per expert ‖τ_t‖/‖W0‖ and the task-vector cosines (an unrelated base); per model
given, its summed distance to the others (a swapped base is not the most central); and what the configs say
the experts were fine-tuned from. :func:`check_lineage` refuses (or, with ``force``, warns) on the limits below.
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
#: An expert whose summed distance to the other models is below the base's by more than this fraction of
#: the base's is more central than the base: the base is refused as swapped.
CENTRAL_MARGIN = 0.05
#: Path components that name no model (and a hub snapshot's commit hash).
_GENERIC = frozenset("|model|models|base|pretrained|weights|checkpoint|checkpoints|main|hf|snapshots|final|output|"
                     "outputs|out|tmp|save|saved|merged".split("|"))
_TAIL = "(docs/your-models.md §Bases and experts are checked); check --base, or merge anyway with --force (force=True)"


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
    """``[(field, value)]``: what ``ck``'s folder says it was fine-tuned from (config.json ``_name_or_path``,
    which transformers 4 wrote and 5 does not; adapter_config.json ``base_model_name_or_path``)."""
    adapter = ck.folder / "adapter_config.json" if ck.folder is not None else None
    try:
        peft = json.loads(adapter.read_text()) if adapter is not None and adapter.is_file() else {}
    except (OSError, ValueError):
        peft = {}
    found = [("config.json _name_or_path", ck.config.get("_name_or_path") if isinstance(ck.config, dict) else None),
             ("adapter_config.json base_model_name_or_path",
              peft.get("base_model_name_or_path") if isinstance(peft, dict) else None)]
    return [(f, v.strip()) for f, v in found if isinstance(v, str) and v.strip()]


def _name(text: str) -> str:
    """The name a path or hub id gives its model, lower case, letters and digits: a hub cache folder's
    repository (``models--org--name``), else its last component that is not generic (``model``, a commit)."""
    parts = re.split(r"[/\\]+", text)
    hub = [q.split("--")[-1] for q in parts if q.startswith("models--")]
    names = [re.sub(r"[^a-z0-9]", "", q.lower()) for q in (hub[:1] or parts[::-1])]
    return next((n for n in names if n not in _GENERIC and not re.fullmatch(r"[0-9a-f]{40}", n)), "")


def _where(ck: Checkpoint) -> Path | None:
    return ck.folder if ck.folder is not None else ck.path if ck.files else None


def _is(text: str, ck: Checkpoint) -> bool:
    """Whether the path ``text`` (relative to the working folder) exists and is ``ck``'s file or folder."""
    where = _where(ck)
    try:
        return where is not None and os.path.samefile(Path(text).expanduser(), where)
    except (OSError, ValueError):
        return False


def names_same_model(text: str, ck: Checkpoint) -> bool:
    """Whether ``text`` (a path or hub id) can name ``ck``'s model: its file or folder, or the same name as
    its folder's, its parent folder's or its own ``_name_or_path``, one containing the other; a generic
    name (``model``, ``base``) can name any (docs/your-models.md §Bases and experts are checked)."""
    name, where = _name(text), _where(ck)
    known = {_name(str(w)) for w in ([where, where.parent, where.resolve()] if where else [])}
    known |= {_name(v) for _, v in claimed_parents(ck)}
    return _is(text, ck) or not name or any(k == name or min(len(k), len(name)) >= 4 and (k in name or name in k)
                                            for k in known if k)


def _contradiction(base: Checkpoint, experts: Sequence[Checkpoint], names: Sequence[str], base_name: str
                   ) -> str | None:
    """The one-line reason when the base's config names an expert as its parent, or an expert's names
    another model than the base (not its own save path: its folder, a run's ``checkpoint-500``)."""
    for f, value in claimed_parents(base):
        hit = next((t for t, ck in enumerate(experts) if _is(value, ck)), None)
        if hit is not None and not _is(value, base):
            return f"{base_name} says it was fine-tuned from {names[hit]} ({f} {value!r}): is it the base? {_TAIL}"
    for t, ck in enumerate(experts):
        for f, value in claimed_parents(ck):
            last = re.split(r"[/\\]+", value.rstrip("/\\"))[-1]
            if names_same_model(value, base) or _is(value, ck) or _name(value) == _name(str(_where(ck))) \
                    or re.fullmatch(r"(checkpoint|ckpt|step|epoch)[-_]?\d+", last, re.IGNORECASE):
                continue
            other = next((f", given as {names[s]}" for s, e in enumerate(experts) if s != t and _is(value, e)), "")
            return f"{names[t]} says it was fine-tuned from {value!r}{other} ({f}), not from {base_name} {_TAIL}"
    return None


# --------------------------------------------------------------------------- what the weights say
@dataclass
class Lineage:
    """Per expert ‖τ_t‖/‖W0‖ and the T x T task-vector cosines over the sampled ``keys``; ``unchanged``:
    experts whose sampled keys equal the base. Per model given (0 the base, t + 1 expert t): ``dist_sum``,
    its summed distance to the others, and ``cosine_from``, the mean cosine of the others' task vectors
    taken from it. ``contradiction``: what the configs say against the base, or ``None``."""

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
        """(s_base − s_t) / s_base of the summed distances: how much more central expert ``t`` is than the base."""
        s = self.dist_sum
        return (s[0] - s[t + 1]) / s[0] if s and s[0] > 0 else 0.0

    def most_central(self) -> int | None:
        """The expert most central, when more than the base by over :data:`CENTRAL_MARGIN`; else ``None``."""
        t = max(range(len(self.ratio)), key=self.central_gap, default=None)
        return t if t is not None and self.central_gap(t) > CENTRAL_MARGIN else None

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
                        f"sampled matrices, where fine-tunes of their own base measured 0.01-0.2 {_TAIL}")
        t = self.most_central()
        if t is None:
            return self.contradiction
        c0, ct = (f"{self.cosine_from[i]:.2f}".replace("-0.00", "0.00") for i in (0, t + 1))
        return (f"{self.base_name} is not the most central of the models given: {self.names[t]} is (summed distance "
                f"to the others {self.dist_sum[t + 1]:.4g} against the base's {self.dist_sum[0]:.4g}, "
                f"{self.central_gap(t):.1%} less, limit {CENTRAL_MARGIN:.0%}; mean task-vector cosine {c0} from the "
                f"base, {ct} from it) over {len(self.keys)} sampled matrices: is it the base, and the base one of its "
                f"fine-tunes? {_TAIL}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready record (kept in ``acetools_merge.json``)."""
        def num(c: float) -> float | None:
            return round(c, 6) if math.isfinite(c) else None

        return {"keys": self.keys, "ratio": [round(r, 6) for r in self.ratio], "unchanged": self.unchanged,
                "cosine": [[num(c) for c in row] for row in self.cosine], "dist_sum": list(map(num, self.dist_sum)),
                "cosine_from": list(map(num, self.cosine_from)), "contradiction": self.contradiction,
                "limits": {"ratio": RATIO_LIMIT, "shared_ratio": SHARED_RATIO_LIMIT, "cosine": COSINE_LIMIT,
                           "central_margin": CENTRAL_MARGIN}}


def _centrality(G: torch.Tensor) -> tuple[list[float], list[float]]:
    """Summed distances and mean cosines from each model, from the Gram matrix ``G`` of the T task vectors:
    with the base at the origin, X is the Gram matrix of all T + 1 models."""
    X = torch.nn.functional.pad(G, (1, 0, 1, 0))
    d = X.diagonal()
    cos_from = []
    for i in range(len(X)):
        V = X - X[i][None, :] - X[:, i][:, None] + X[i, i]  # the Gram matrix of the models minus model i
        n = V.diagonal().clamp(min=0).sqrt()
        keep = (n[:, None] > 0) & (n[None, :] > 0) & torch.ones_like(V, dtype=torch.bool).triu(1)
        cos_from.append(float((V / torch.outer(n, n).clamp(min=1e-300))[keep].mean()) if keep.any() else math.nan)
    return [float(x) for x in (d[:, None] + d[None, :] - 2 * X).clamp(min=0).sqrt().sum(1)], cos_from


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
    who = f"the base ({base.path})" if base.files else "the base"
    return Lineage(keys, ratio, cos, [t for t, u in enumerate(unchanged) if u and keys], names, *_centrality(G), who,
                   _contradiction(base, experts, names, who))


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
