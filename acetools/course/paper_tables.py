"""The papers' published result tables as data, their method names mapped to ours (docs/methods.md §Published numbers).

Every number is an average absolute test accuracy in percent, with its ``source``. :data:`NAME_MAP` /
:data:`REFERENCE_MAP` map the papers' names to :data:`acetools.merging.METHODS` and our reference rows;
:data:`COMPARISONS` says which paper column each of our suites is compared with."""

from __future__ import annotations

import pandas as pd

from ..errors import InputError, InputKeyError

#: Paper method name -> our registry name (``None``: not in acetools).
NAME_MAP: dict[str, str | None] = {
    "Weight Averaging": "weight_averaging",
    "Weight Avg": "weight_averaging",
    "Task Arithmetic": "task_arithmetic",
    "TIES": "ties",
    "Ties-Merging": "ties",
    "DARE": "dare",
    "Consensus TA": None,
    "TSV-M": "tsv_m",
    "Iso-C": "iso_c",
    "Iso-CTS": "iso_cts",
    "CART": "cart",
    "WUDI-Merging": "wudi",
    "RegMean": "regmean",
    "ESM": "esm",
    "ESM (Ours)": "esm",
    "ACE-Merging": "ace",
}
#: Paper reference rows -> our reference rows (as written by ``Benchmark.reference_rows``).
REFERENCE_MAP: dict[str, str] = {
    "Zero-shot": "base (frozen heads)",
    "Fine-tuned": "experts (individual)",
}


def registry_name(paper_name: str) -> str | None:
    """Our name for the paper's method or reference row ``paper_name`` (KeyError if unknown)."""
    if paper_name in NAME_MAP:
        return NAME_MAP[paper_name]
    if paper_name in REFERENCE_MAP:
        return REFERENCE_MAP[paper_name]
    raise InputKeyError(f"unknown paper method {paper_name!r}; known: {sorted(NAME_MAP) + sorted(REFERENCE_MAP)}")


def _rows(table: str, source: str, backbones_tasks: list[tuple[str, int]], data: dict[str, list]) -> list[dict]:
    out = []
    for method, values in data.items():
        if len(values) != len(backbones_tasks):  # pragma: no cover - guards the literals below
            raise InputError(f"{table}/{method}: {len(values)} values for {len(backbones_tasks)} columns")
        for (backbone, n_tasks), v in zip(backbones_tasks, values):
            if v is None:
                continue
            out.append({"table": table, "source": source, "backbone": backbone, "n_tasks": n_tasks,
                        "method_paper": method, "method": registry_name(method), "accuracy": float(v)})
    return out


_ACE_COLS = [("ViT-B/32", 8), ("ViT-B/16", 14), ("ViT-L/14", 20)]
_ACE = {  # seed 000 (table) and 001 (20-task ViT-L/14 TSV-M gap)
    "Weight Avg": [66.3, 69.5, 71.6],
    "Task Arithmetic": [70.8, 70.5, 74.0],
    "CART": [84.7, 84.1, 87.9],
    "TSV-M": [85.9, 84.6, 87.7],
    "ACE-Merging": [87.9, 86.1, 89.5],
}
_ESM_B16 = {
    "Task Arithmetic": [75.4, 70.5, 65.8],
    "TSV-M": [89.0, 84.6, 80.6],
    "Iso-CTS": [91.1, 86.4, 82.4],
    "ESM (Ours)": [91.8, 87.4, 84.9],
}
_ESM_L14 = {
    "TSV-M": [93.0, 89.2, 87.7],
    "Iso-CTS": [94.7, 91.0, 90.1],
    "ESM (Ours)": [94.8, 91.3, 90.4],
}
_SPEC_COLS = [(b, n) for b in ("ViT-B/32", "ViT-B/16", "ViT-L/14") for n in (8, 14, 20)]
_SPEC = {  # docs/methods.md §Published numbers; CART's B/32 and L/14 cells use other 8-task checkpoints (note *)
    "Zero-shot": [48.3, 57.2, 56.1, 55.3, 61.3, 59.7, 64.7, 68.2, 65.2],
    "Fine-tuned": [92.8, 90.9, 91.3, 94.6, 92.8, 93.2, 95.8, 94.3, 94.7],
    "Weight Averaging": [66.3, 64.3, 61.0, 72.2, 69.5, 65.3, 79.6, 76.7, 71.6],
    "Task Arithmetic": [70.8, 65.3, 60.5, 75.4, 70.5, 65.8, 84.9, 79.4, 74.0],
    "TIES": [75.1, 68.0, 63.4, 79.7, 73.2, 68.2, 86.9, 79.5, 75.7],
    "Consensus TA": [75.0, 70.4, 65.4, 79.4, 74.4, 69.8, 86.3, 82.2, 79.0],
    "TSV-M": [85.9, 80.1, 77.1, 89.0, 84.6, 80.6, 93.0, 89.2, 87.7],
    "Iso-C": [86.3, 80.3, 75.5, 90.6, 84.8, 79.6, 94.2, 89.3, 87.6],
    "Iso-CTS": [86.2, 81.7, 78.1, 91.1, 86.4, 82.4, 94.7, 91.0, 90.1],
    "CART": [84.7, 79.5, 76.3, 88.3, 84.1, 80.5, 92.6, 88.7, 87.9],
    "ESM": [None, None, None, 91.8, 87.4, 84.9, 94.8, 91.3, 90.4],  # B/32 20 ≈81.3 is derived: left out
    "ACE-Merging": [87.9, None, None, 90.6, 86.1, 82.1, None, None, 89.5],
}

#: Every vision number, long format: table, source, backbone, n_tasks, method_paper, method, accuracy.
VISION: pd.DataFrame = pd.DataFrame(
    _rows("ace", "seed:ACE", _ACE_COLS, _ACE)
    + _rows("esm", "seed:ESM", [("ViT-B/16", n) for n in (8, 14, 20)], _ESM_B16)
    + _rows("esm", "seed:ESM", [("ViT-L/14", n) for n in (8, 14, 20)], _ESM_L14)
    + _rows("spec", "spec:5", _SPEC_COLS, _SPEC)
)

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
