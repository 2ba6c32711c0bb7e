"""The papers' published result tables as data, their method names mapped to ours (docs/methods.md §Published numbers).

The numbers live in ``paper_tables.json`` (average absolute test accuracy in percent, each with its ``source``).
:data:`NAME_MAP` / :data:`REFERENCE_MAP` map the papers' names to :data:`acetools.merging.METHODS` and our reference
rows; :data:`COMPARISONS` says which paper column each of our suites is compared with.

The papers' numbers only the claims read (docs/methods.md §Published numbers): ablations, the language
headline, the claimed vision ordering and the room and lead of a paper column (the vision tables themselves:
:mod:`acetools_course.paper_tables`)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from acetools.errors import InputError, InputKeyError

# ---- The vision tables and the name maps ----------------------------------------------------------

_DATA = json.loads(Path(__file__).with_name("paper_tables.json").read_text(encoding="utf-8"))
#: Paper method name -> our registry name (``None``: not in acetools).
NAME_MAP: dict[str, str | None] = _DATA["names"]
#: Paper reference rows -> our reference rows (as written by ``Benchmark.reference_rows``).
REFERENCE_MAP: dict[str, str] = _DATA["references"]
#: RoBERTa-base on 8 GLUE tasks, normalized accuracy (ESM's table; WUDI's README agrees); ACE's 90.4 is
#: ACE-Merging's own table (docs/text-world.md). Lesson 07's anchor (:mod:`acetools_course.lesson07_language`).
ROBERTA_GLUE: dict[str, float] = _DATA["roberta_glue"]


def registry_name(paper_name: str) -> str | None:
    """Our name for the paper's method or reference row ``paper_name`` (KeyError if unknown)."""
    if paper_name in NAME_MAP:
        return NAME_MAP[paper_name]
    if paper_name in REFERENCE_MAP:
        return REFERENCE_MAP[paper_name]
    raise InputKeyError(f"unknown paper method {paper_name!r}; known: {sorted(NAME_MAP) + sorted(REFERENCE_MAP)}")


def _rows(part: dict) -> list[dict]:
    """One ``tables`` entry of paper_tables.json in long format (a ``None`` cell: not published)."""
    out = []
    for method, values in part["rows"].items():
        if len(values) != len(part["columns"]):  # pragma: no cover - guards the data file
            raise InputError(f"paper_tables.json, {part['table']}/{method}: {len(values)} values for "
                             f"{len(part['columns'])} columns")
        for (backbone, n_tasks), v in zip(part["columns"], values):
            if v is None:
                continue
            out.append({"table": part["table"], "source": part["source"], "backbone": backbone, "n_tasks": n_tasks,
                        "method_paper": method, "method": registry_name(method), "accuracy": float(v)})
    return out


#: Every vision number, long format: table, source, backbone, n_tasks, method_paper, method, accuracy.
VISION: pd.DataFrame = pd.DataFrame([row for part in _DATA["tables"] for row in _rows(part)])

#: For each paper table, which (backbone, n_tasks) column our suite of that many tasks is
#: compared with: ACE's table has one suite per backbone; ESM's and docs/methods.md §Published numbers use ViT-B/16,
#: the only backbone with every method at 8, 14 and 20 tasks.
COMPARISONS: dict[str, dict[int, tuple[str, int]]] = {
    "ace": {8: ("ViT-B/32", 8), 14: ("ViT-B/16", 14), 20: ("ViT-L/14", 20)},
    "esm": {8: ("ViT-B/16", 8), 14: ("ViT-B/16", 14), 20: ("ViT-B/16", 20)},
    "spec": {8: ("ViT-B/16", 8), 14: ("ViT-B/16", 14), 20: ("ViT-B/16", 20)},
}

def vision_long(table: str | None = None) -> pd.DataFrame:
    """:data:`VISION` (a copy), optionally only ``table`` (``"ace"``, ``"esm"`` or ``"spec"``)."""
    if table is None:
        return VISION.copy()
    if table not in set(VISION["table"]):
        raise InputError(f"unknown table {table!r}; tables: {sorted(set(VISION['table']))}")
    return VISION[VISION["table"] == table].reset_index(drop=True)


def paper_column(table: str, backbone: str, n_tasks: int, *, methods_only: bool = True) -> pd.Series:
    """One column of a paper table as a Series ``registry name -> accuracy``.

    ``methods_only`` drops reference rows (zero-shot, fine-tuned) and methods without a
    registry name (Consensus TA). Raises ``KeyError`` when the table has no such column.
    """
    df = vision_long(table)
    df = df[(df["backbone"] == backbone) & (df["n_tasks"] == n_tasks)]
    if df.empty:
        raise InputKeyError(f"table {table!r} has no column {backbone} {n_tasks} tasks")
    if methods_only:
        df = df[df["method"].notna() & ~df["method_paper"].isin(list(REFERENCE_MAP))]
    s = df.set_index("method")["accuracy"]
    if s.index.has_duplicates:  # pragma: no cover - two paper names for one method in one column
        raise InputError(f"duplicate methods in {table} {backbone} {n_tasks}: {list(s.index)}")
    s.name = f"{table}: {backbone} {n_tasks} tasks"
    return s


def comparison_columns(table: str, n_tasks: int) -> pd.Series:
    """The column of ``table`` that our ``n_tasks``-task suite is compared with (see
    :data:`COMPARISONS`), as :func:`paper_column` returns it."""
    try:
        backbone, n = COMPARISONS[table][n_tasks]
    except KeyError:
        raise InputKeyError(f"no comparison of table {table!r} at {n_tasks} tasks; "
                       f"have {{{', '.join(f'{k}: {sorted(v)}' for k, v in COMPARISONS.items())}}}") from None
    return paper_column(table, backbone, n)


def beside_papers(summary: pd.DataFrame, n_tasks: int, backbone: str = "ViT-B/32", table: str = "spec",
                  base_label: str = "base (zero-shot heads)") -> pd.DataFrame:
    """The measured summary beside the papers' numbers of ``backbone`` at ``n_tasks`` tasks: ``method``,
    ``test_acc``, ``paper_acc``, ``diff`` and ``paper`` (docs/methods.md §Published numbers; for the
    CLIP world the two should agree, docs/clip-world.md)."""
    df = vision_long(table)
    df = df[(df["backbone"] == backbone) & (df["n_tasks"] == n_tasks)]
    paper: dict[str, float] = {}
    for _, r in df.iterrows():
        if r["method_paper"] == "Zero-shot":
            paper[base_label] = r["accuracy"]
        elif r["method_paper"] == "Fine-tuned":
            paper[REFERENCE_MAP["Fine-tuned"]] = r["accuracy"]
        elif r["method"] is not None:
            paper.setdefault(r["method"], r["accuracy"])
    out = pd.DataFrame({"method": summary["method"], "test_acc": summary["test_acc"].astype(float)})
    out["paper_acc"] = [paper.get(m, float("nan")) for m in out["method"]]
    out["diff"] = out["test_acc"] - out["paper_acc"]
    out["paper"] = f"{table}: {backbone} {n_tasks} tasks" if not df.empty else f"none at {n_tasks} tasks"
    return out


# ---- The numbers only the claims read -------------------------------------------------------------

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
    (``acetools_course.verdicts.SCALING_RULE``)."""
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
