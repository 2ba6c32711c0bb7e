"""The papers' published result tables as data, their method names mapped to ours (docs/methods.md §Published numbers).

The numbers live in ``paper_tables.json`` (average absolute test accuracy in percent, each with its ``source``).
:data:`NAME_MAP` / :data:`REFERENCE_MAP` map the papers' names to :data:`acetools.merging.METHODS` and our reference
rows; :data:`COMPARISONS` says which paper column each of our suites is compared with."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import InputError, InputKeyError

_DATA = json.loads(Path(__file__).with_name("paper_tables.json").read_text(encoding="utf-8"))
#: Paper method name -> our registry name (``None``: not in acetools).
NAME_MAP: dict[str, str | None] = _DATA["names"]
#: Paper reference rows -> our reference rows (as written by ``Benchmark.reference_rows``).
REFERENCE_MAP: dict[str, str] = _DATA["references"]
#: RoBERTa-base on 8 GLUE tasks, normalized accuracy (ESM's table; WUDI's README agrees); ACE's 90.4 is
#: ACE-Merging's own table (docs/text-world.md). Lesson 07's anchor (:mod:`acetools.course.language`).
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
