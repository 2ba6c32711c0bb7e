"""Lesson 08 (docs/course.md §08_lora_experts): merging LoRA experts of the text world
(:class:`acetools.world.text.lora.TextLoraWorld`) in their own rank (:mod:`acetools.merging.lowrank`), beside the
full fine-tunes' merges on the same tasks; the lesson's tables and figures."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from acetools.merging import lowrank, merge
from acetools.merging.lowrank import LowRankUpdate
from acetools.plotting import track_drawing
from acetools.utils import progress as bar

#: The merges compared (docs/methods.md §Low-rank updates): the full fine-tunes' in full space, the LoRA experts'
#: in their factors' span.
METHODS = ("task_arithmetic", "tsv_m")
_LOWRANK = {"task_arithmetic": lowrank.task_arithmetic_lowrank, "tsv_m": lowrank.tsv_m_lowrank}


def expert_table(full, lora) -> pd.DataFrame:
    """Per task: the full fine-tune's and the LoRA expert's validation accuracy (%), what each trained (millions of
    numbers, the head left out) and the LoRA's training time (s)."""
    n_full = sum(v.numel() for v in full.base_state().values()) / 1e6
    rows = []
    for t in full.tasks:
        full.expert_state(t)
        lora.expert_state(t)
        mf, ml = full._sides[t]["metrics"], lora._sides[t]["metrics"]
        rows.append({"task": t, "full fine-tune, val (%)": 100 * mf["val_acc"], "LoRA, val (%)": 100 * ml["val_acc"],
                     "trained, full (M)": n_full, "trained, LoRA (M)": ml["trainable_parameters"] / 1e6,
                     "LoRA training (s)": ml["seconds"]})
    return pd.DataFrame(rows)


def lora_factors(lora, key: str) -> list[tuple[Tensor, Tensor]]:
    """The experts' factors of one matrix with the adapter's scale folded into B: ``[(scale_t B_t, A_t)]``
    (the input of :mod:`acetools.merging.lowrank`, Eq. (LR.1))."""
    return [(f.scale * f.B, f.A) for f in (lora.factors(t)[key] for t in lora.tasks)]


def merged_updates(full, lora, method: str, *, device: str | torch.device = "cpu"
                   ) -> tuple[dict[str, Tensor], dict[str, LowRankUpdate]]:
    """``method``'s merged update at coefficient 1, per matrix: the full fine-tunes' in full space
    (``acetools.merge`` minus W0) and the LoRA experts' as factors (:mod:`acetools.merging.lowrank`)."""
    base = {k: v.to(device) for k, v in full.base_state().items()}
    experts = [{k: v.to(device) for k, v in full.expert_state(t).items()} for t in full.tasks]
    coef: dict[str, Any] = {"task_arithmetic": {"lam": 1.0}, "tsv_m": {"alpha": 1.0}}[method]
    merged = merge(method, base, experts, layout=full.layout, device=device, **coef)
    dense = {k: merged[k] - base[k] for k in base}
    low = {k: _LOWRANK[method](lora_factors(lora, k), key=k, **coef) for k in lora.factors(lora.tasks[0])}
    return dense, low


def _score(world, base: Mapping[str, Tensor], delta: Mapping[str, Tensor], grid: Sequence[float], *,
           n_val: int | None, n_test: int | None) -> dict[str, Any]:
    """The coefficient of ``grid`` with the best mean validation accuracy, and the test accuracy there (each task
    normalized by its own expert's test accuracy)."""
    val = [float(np.mean(list(world.evaluate_all({k: base[k] + c * delta[k] for k in delta}, "val", n_val).values())))
           for c in grid]
    best = float(grid[int(np.argmax(val))])
    test = world.evaluate_all({k: base[k] + best * delta[k] for k in delta}, "test", n_test)
    experts = {t: world.evaluate(world.expert_state(t), t, "test", n_test) for t in world.tasks}
    norm = [100 * test[t] / experts[t] if experts[t] > 0 else np.nan for t in world.tasks]
    return {"coef": best, "test_acc": 100 * float(np.mean(list(test.values()))),
            "test_normalized": float(np.nanmean(norm))}


def _rank(M: Tensor) -> int:
    return lowrank.numerical_rank(torch.linalg.svdvals(M.double()))


def compare(full, lora, grids: Mapping[str, Sequence[float]], *, n_val: int | None = None, n_test: int | None = None,
            device: str | torch.device = "cpu", progress: bool | None = None) -> pd.DataFrame:
    """Each method of ``grids`` ({method: coefficients}) on the full fine-tunes (full space) and on the LoRA
    experts (in their rank), its coefficient chosen on validation: test accuracy (absolute and normalized, %), the
    median rank of a merged matrix and the numbers the merged update stores (millions)."""
    rows = []
    for method in bar(list(grids), desc="merges", enabled=progress):
        dense, low = merged_updates(full, lora, method, device=device)
        base = {k: v.to(device) for k, v in full.base_state().items()}
        f = _score(full, base, dense, grids[method], n_val=n_val, n_test=n_test)
        lo = _score(lora, base, {k: u.dense().to(device) for k, u in low.items()}, grids[method], n_val=n_val,
                    n_test=n_test)
        rows += [{"method": method, "experts": "full fine-tunes", **f,
                  "rank": int(np.median([_rank(d) for d in dense.values()])),
                  "stored (M)": sum(d.numel() for d in dense.values()) / 1e6},
                 {"method": method, "experts": "LoRA", **lo,
                  "rank": int(np.median([lowrank.numerical_rank(lowrank.to_rank(u, u.rank).S) for u in low.values()])),
                  "stored (M)": sum(u.B.numel() + u.A.numel() for u in low.values()) / 1e6}]
    return pd.DataFrame(rows)


def compare_view(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`compare` as method × {full fine-tunes, LoRA}: normalized accuracy, coefficient, rank and size."""
    wide = table.pivot(index="method", columns="experts")

    def both(col: str, fmt: str) -> list[str]:
        return [f"{fmt.format(a)} / {fmt.format(b)}" for a, b in zip(wide[(col, "full fine-tunes")],
                                                                     wide[(col, "LoRA")])]

    return pd.DataFrame({"method": wide.index, "full fine-tunes (%)": wide[("test_normalized", "full fine-tunes")],
                         "LoRA (%)": wide[("test_normalized", "LoRA")], "coefficient, full / LoRA":
                         both("coef", "{:.2f}"), "rank of a matrix, full / LoRA": both("rank", "{:d}"),
                         "stored numbers (M), full / LoRA": both("stored (M)", "{:.2f}")}).reset_index(drop=True)


# --------------------------------------------------------------------------- figures
def spectra(ax, s_full: Tensor, s_lora: Tensor, *, total_rank: int, title: str | None = None):
    """The singular values of one merged update (each divided by its largest): the full fine-tunes' task arithmetic
    against the LoRA experts', with the bound sum_t r_t marked (log y)."""
    for s, label in ((s_full, "full fine-tunes"), (s_lora, "LoRA experts")):
        s = s.double().cpu()
        s = s / s[0] if float(s[0]) > 0 else s
        keep = s > 1e-12
        ax.plot(np.arange(1, int(keep.sum()) + 1), s[keep].numpy(), label=label, lw=1.8)
    ax.axvline(total_rank, color="0.3", ls="--", lw=1)
    ax.annotate(f"$\\sum_t r_t$ = {total_rank}", (total_rank, 0.5), xytext=(6, 0), textcoords="offset points",
                fontsize=9, va="center")
    ax.set_yscale("log")
    ax.set_xlabel("singular value index")
    ax.set_ylabel(r"$\sigma_j / \sigma_1$")
    ax.legend(fontsize=9, loc="lower left")
    ax.set_title(title or "the spectrum of a merged update")
    return ax


def comparison_bars(ax, table: pd.DataFrame, *, title: str | None = None):
    """:func:`compare`'s normalized test accuracy, one group per method, full fine-tunes beside LoRA."""
    methods = list(dict.fromkeys(table["method"]))
    for i, who in enumerate(("full fine-tunes", "LoRA")):
        sub = table[table["experts"] == who].set_index("method").reindex(methods)
        ax.bar(np.arange(len(methods)) + (i - 0.5) * 0.4, sub["test_normalized"], width=0.4, label=who)
    ax.set_xticks(range(len(methods)), methods)
    ax.set_ylabel("test accuracy (% normalized)")
    lo = float(np.nanmin(table["test_normalized"]))
    ax.set_ylim(max(0.0, lo - 15), None)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or "merging full fine-tunes and LoRA experts")
    return ax


track_drawing([sys.modules[__name__]])  # each figure function notes itself on the figure it draws (the manifest)
