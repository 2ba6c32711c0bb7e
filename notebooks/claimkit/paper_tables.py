"""The papers' numbers only the claims read (docs/methods.md §Published numbers): ablations, the language
headline, the claimed vision ordering and the room and lead of a paper column (the vision tables themselves:
:mod:`acetools.course.paper_tables`)."""

from __future__ import annotations

import pandas as pd

from acetools.course.paper_tables import comparison_columns
from acetools.errors import InputKeyError

#: ESM's ablation (ViT-B/16, absolute accuracy %): decomposition × polarized scaling.
ESM_ABLATION: pd.DataFrame = pd.DataFrame(
    [
        {"decomposition": "SVD", "scaling": "none", "tasks8": 89.0, "tasks20": 80.6, "note": "baseline (TSV-M)"},
        {"decomposition": "SVD", "scaling": "all", "tasks8": 89.6, "tasks20": 82.1, "note": "PS helps SVD too"},
        {"decomposition": "ESD", "scaling": "none", "tasks8": 90.9, "tasks20": 82.8, "note": "ESD alone +1.9/+2.2"},
        {"decomposition": "ESD", "scaling": "layer", "tasks8": 91.4, "tasks20": 83.7,
         "note": "layer level matters most"},
        {"decomposition": "ESD", "scaling": "all", "tasks8": 91.8, "tasks20": 84.9, "note": "ESM"},
    ]
)

#: ACE's language headline numbers (not testable in the mini-world: no language models).
LANGUAGE: pd.DataFrame = pd.DataFrame(
    [
        ("GPT-2", "GLUE (7 tasks)", "average", "ACE-Merging", 74.1, "seed 001"),
        ("GPT-2", "GLUE (7 tasks)", "average", "TSV-M", 70.2,
         "74.1 - 3.9 (seed 001; docs/methods.md §Published numbers)"),
        ("GPT-2", "GLUE (7 tasks)", "average", "TIES", 70.0,
         "74.1 - 4.1 (seed 001 names TIES, docs/methods.md §Published numbers names TA)"),
        ("RoBERTa-Base", "GLUE", "normalized", "ACE-Merging", 90.4, "seed 001"),
        ("RoBERTa-Base", "GLUE", "normalized", "WUDI-Merging", 85.3,
         "90.4 - 5.1 (seed 001; docs/methods.md §Published numbers)"),
        ("RoBERTa-Large", "GLUE", "normalized", "ACE-Merging", 91.7, "seed 001"),
        ("RoBERTa-Large", "GLUE", "normalized", "WUDI-Merging", 88.8, "91.7 - 2.9 (derived from seed 001)"),
    ],
    columns=["model", "benchmark", "metric", "method_paper", "value", "note"],
)

#: The vision ordering the ACE claim states in words ("weight averaging < task arithmetic <
#: CART ≈ TSV-M < ACE"), as ranks (1 = worst); CART and TSV-M share the mean rank 3.5.
ACE_CLAIMED_RANKS: pd.Series = pd.Series(
    {"weight_averaging": 1.0, "task_arithmetic": 2.0, "cart": 3.5, "tsv_m": 3.5, "ace": 5.0},
    name="ACE claim: WA < TA < CART ≈ TSV-M < ACE",
)


#: ACE's stage ablation as the paper reports it for ViT-B/16 (8 tasks): spectral refinement
#: changes nothing (90.60 → 90.60), and with gamma < 0.25 the gate never normalises a ViT
#: layer (docs/methods.md §ACE): the effect a stage claim predicts on a ViT is 0.
ACE_STAGE_ABLATION: dict[str, dict[str, float]] = {
    "refinement": {"with": 90.60, "without": 90.60, "effect": 0.0},
}


def paper_room(table: str, n_tasks: int) -> float:
    """The paper's room at ``n_tasks`` in ``table``: TSV-M − task arithmetic in the column our
    ``n_tasks``-task suite is compared with (:func:`comparison_columns`), in that table's
    absolute points. The denominator of the course's scaling rule
    (``claimkit.verdicts.SCALING_RULE``)."""
    col = comparison_columns(table, n_tasks)
    missing = [m for m in ("tsv_m", "task_arithmetic") if m not in col.index]
    if missing:
        raise InputKeyError(f"{col.name} has no {missing}: no room to scale by")
    return float(col["tsv_m"] - col["task_arithmetic"])


def table_rivals(table: str, n_tasks: int, winner: str) -> list[str]:
    """The methods of the paper's own table column (for our ``n_tasks``) other than ``winner``:
    exactly the rivals the paper's claim is made against."""
    return [m for m in comparison_columns(table, n_tasks).index if m != winner]


def paper_lead(table: str, n_tasks: int, winner: str, rivals: list[str] | None = None) -> tuple[float, str]:
    """``winner`` minus the best of ``rivals`` (default: :func:`table_rivals`) in the paper's
    column for ``n_tasks``, and that rival's name."""
    col = comparison_columns(table, n_tasks)
    rv = [m for m in (rivals if rivals is not None else table_rivals(table, n_tasks, winner)) if m in col.index]
    if winner not in col.index or not rv:
        raise InputKeyError(f"{col.name}: need {winner} and one of {rivals}; has {list(col.index)}")
    best = max(rv, key=lambda m: col[m])
    return float(col[winner] - col[best]), best
