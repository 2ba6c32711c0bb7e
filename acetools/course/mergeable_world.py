"""Lesson 06 (docs/course.md §06_mergeable_world): what makes a world mergeable, from the committed
regime cards of the recipe study (:mod:`acetools.regime`, docs/regime.md)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from ..errors import InputError, InputKeyError
from ..regime import RegimeCard, regime_card
from ..results import find_results, load_summary
from ..search import PATIENCE
from . import world as course

#: The card's key rows, in order (docs/regime.md §How the card is measured).
KEY_ROWS: tuple[str, ...] = ("experts_abs", "base_abs", "base_norm", "ta_norm", "ta_lambda", "tsv_norm",
                             "iso_cts_norm", "tsv_minus_ta", "tsv_gap_share", "ace_gamma_median",
                             "ace_gated_fraction", "tau_ratio", "wpre_top5_energy", "cosine_mean", "cosine_max")
#: The rows that explain the room.
EXPLAIN_ROWS: tuple[str, ...] = ("trunc_norm", "trunc_energy", "scaled_norm", "ta_interference", "overlap_topk",
                                 "overlap_left", "overlap_right", "overlap_random", "act_overlap", "act_topk_energy",
                                 "tau_in_act", "log_energy_mean", "log_energy_sd")


def load_cards(folder: str | os.PathLike, order: Sequence[str] | None = None) -> dict[str, RegimeCard]:
    """``{recipe: card}`` for every ``<folder>/<recipe>/card.json``, ``order`` first, the rest alphabetically."""
    folder = Path(folder)
    found = sorted(p.parent.name for p in folder.glob("*/card.json"))
    if not found:
        raise FileNotFoundError(f"no regime card under {folder}/*/card.json; measure one with "
                                "`python3 benchmarks/recipe_study.py first_world` or `python3 -m acetools regime`")
    names = [n for n in (order or []) if n in found] + [n for n in found if n not in (order or [])]
    return {n: RegimeCard.load(folder / n) for n in names}


def card_table(cards: Mapping[str, RegimeCard], rows: Sequence[str] = KEY_ROWS, *, clip: bool = True) -> pd.DataFrame:
    """Rows ``rows`` of every card as columns, plus the CLIP ViT-B/32 column (NaN where no number)."""
    if not cards:
        raise InputError("card_table needs at least one card")
    first = next(iter(cards.values())).to_frame().set_index("metric")
    missing = [r for r in rows if r not in first.index and not any(r in c.to_frame()["metric"].values
                                                                     for c in cards.values())]
    if missing:
        raise InputKeyError(f"no card has rows {missing}; rows: {list(first.index)}")
    out = {}
    labels = {}
    for name, card in cards.items():
        df = card.to_frame().set_index("metric")
        labels.update(df["label"].to_dict())
        out[name] = [float(df.loc[r, "value"]) if r in df.index else math.nan for r in rows]
    table = pd.DataFrame(out, index=[labels.get(r, r) for r in rows])
    if clip:
        table["CLIP ViT-B/32"] = [float(first.loc[r, "clip"]) if r in first.index else math.nan for r in rows]
    table.index.name = "row"
    return table


def room_budget(card: RegimeCard) -> pd.DataFrame:
    """The two paths from the experts (100 % normalized) to a merge, as steps with their cost: task
    arithmetic (each task alone at λ_TA, then with the others) and TSV-M (truncated to rank ⌊r/T⌋,
    then merged). Columns: path, step, normalized, cost (points lost; negative = gained)."""
    v = card.value
    rows = []
    for path, steps in (("task arithmetic", [("experts", 100.0), ("each task alone at λ_TA", v("scaled_norm")),
                                             ("task arithmetic", v("ta_norm"))]),
                        ("TSV-M", [("experts", 100.0), ("each task truncated to rank r/T", v("trunc_norm")),
                                   ("TSV-M", v("tsv_norm"))])):
        prev = None
        for step, val in steps:
            rows.append({"path": path, "step": step, "normalized": val,
                         "cost": math.nan if prev is None else prev - val})
            prev = val
    return pd.DataFrame(rows)


def benchmark_summary(results_dir: str | os.PathLike, suites: Sequence[str] = ("tasks8", "tasks14", "tasks20"),
                      size: str = "small") -> pd.DataFrame | None:
    """The benchmark's per-seed table from ``results_dir``, or ``None`` without results of ``suites``."""
    runs = find_results(results_dir, list(suites), size)
    return load_summary(runs) if runs else None


def fixture_card(*, seed: int = 0, device: str = "cpu", progress: bool | None = False) -> RegimeCard:
    """The regime card of the quick profile's fixture world: for checking that the lesson runs."""
    zoo = course.world(quick=True, seed=seed, device=device)
    bench = course.benchmark(zoo, quick=True, patience=PATIENCE)
    return regime_card(zoo, bench=bench, progress=progress, n_act=64)
