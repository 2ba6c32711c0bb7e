"""Figures of lesson 07 (merging language models): pure functions that draw on given axes."""

from __future__ import annotations

import numpy as np
import pandas as pd


def stage_bars(ax, abl: pd.DataFrame, *, title: str | None = None):
    """ACE's stage ablation (``stage_ablation``): test normalized accuracy per setting, one group per eps."""
    settings = list(dict.fromkeys(abl["setting"]))
    eps = list(dict.fromkeys(abl["eps"]))
    w = 0.8 / len(eps)
    for i, e in enumerate(eps):
        sub = abl[abl["eps"] == e].set_index("setting").reindex(settings)
        ax.bar(np.arange(len(settings)) + (i - (len(eps) - 1) / 2) * w, sub["test_normalized"], width=w,
               label=f"eps {e:g}")
    ax.set_xticks(range(len(settings)), settings, rotation=25, ha="right")
    ax.set_ylabel("test accuracy (% normalized)")
    lo = float(np.nanmin(abl["test_normalized"]))
    ax.set_ylim(max(0.0, lo - 10), None)
    ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=True, title="ridge")
    ax.set_title(title or "ACE's stages on the text world")
    return ax


def anchor_bars(ax, beside: pd.DataFrame, *, title: str | None = None):
    """The text world's normalized accuracies beside RoBERTa-base GLUE's (``beside_anchor``, without the rooms)."""
    df = beside[~beside["method"].str.contains("−")]
    x = np.arange(len(df))
    ax.bar(x - 0.2, df["text world"], width=0.4, label="text world (MiniLM)")
    ax.bar(x + 0.2, df["RoBERTa-base GLUE"], width=0.4, label="RoBERTa-base GLUE (papers)")
    ax.set_xticks(x, df["method"], rotation=25, ha="right")
    ax.set_ylabel("test accuracy (% normalized)")
    ax.legend(fontsize=10, loc="upper left", frameon=True)
    ax.set_title(title or "the text world beside RoBERTa-base on GLUE")
    return ax
