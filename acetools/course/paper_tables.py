"""The papers' published result tables as data, their method names mapped to ours (docs/methods.md §Published numbers).

Every number is an average absolute test accuracy in percent (the language table: see its
``metric`` column), with its ``source``. :data:`NAME_MAP` / :data:`REFERENCE_MAP` map the papers'
names to :data:`acetools.merging.METHODS` and our reference rows; :data:`COMPARISONS` says which
paper column each of our suites is compared with."""

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
        {"model": "GPT-2", "benchmark": "GLUE (7 tasks)", "metric": "average", "method_paper": "ACE-Merging",
         "value": 74.1, "note": "seed 001"},
        {"model": "GPT-2", "benchmark": "GLUE (7 tasks)", "metric": "average", "method_paper": "TSV-M",
         "value": 70.2, "note": "74.1 - 3.9 (seed 001; docs/methods.md §Published numbers)"},
        {"model": "GPT-2", "benchmark": "GLUE (7 tasks)", "metric": "average", "method_paper": "TIES",
         "value": 70.0, "note": "74.1 - 4.1 (seed 001 names TIES, docs/methods.md §Published numbers names TA)"},
        {"model": "RoBERTa-Base", "benchmark": "GLUE", "metric": "normalized", "method_paper": "ACE-Merging",
         "value": 90.4, "note": "seed 001"},
        {"model": "RoBERTa-Base", "benchmark": "GLUE", "metric": "normalized", "method_paper": "WUDI-Merging",
         "value": 85.3, "note": "90.4 - 5.1 (seed 001; docs/methods.md §Published numbers)"},
        {"model": "RoBERTa-Large", "benchmark": "GLUE", "metric": "normalized", "method_paper": "ACE-Merging",
         "value": 91.7, "note": "seed 001"},
        {"model": "RoBERTa-Large", "benchmark": "GLUE", "metric": "normalized", "method_paper": "WUDI-Merging",
         "value": 88.8, "note": "91.7 - 2.9 (derived from seed 001)"},
    ]
)

#: For each paper table, which (backbone, n_tasks) column our suite of that many tasks is
#: compared with: ACE's table has one suite per backbone; ESM's and docs/methods.md §Published numbers use ViT-B/16,
#: the only backbone with every method at 8, 14 and 20 tasks.
COMPARISONS: dict[str, dict[int, tuple[str, int]]] = {
    "ace": {8: ("ViT-B/32", 8), 14: ("ViT-B/16", 14), 20: ("ViT-L/14", 20)},
    "esm": {8: ("ViT-B/16", 8), 14: ("ViT-B/16", 14), 20: ("ViT-B/16", 20)},
    "spec": {8: ("ViT-B/16", 8), 14: ("ViT-B/16", 14), 20: ("ViT-B/16", 20)},
}

#: The vision ordering the ACE claim states in words ("weight averaging < task arithmetic <
#: CART ≈ TSV-M < ACE"), as ranks (1 = worst); CART and TSV-M share the mean rank 3.5.
ACE_CLAIMED_RANKS: pd.Series = pd.Series(
    {"weight_averaging": 1.0, "task_arithmetic": 2.0, "cart": 3.5, "tsv_m": 3.5, "ace": 5.0},
    name="ACE claim: WA < TA < CART ≈ TSV-M < ACE",
)


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


#: ACE's stage ablation as the paper reports it for ViT-B/16 (8 tasks): spectral refinement
#: changes nothing (90.60 → 90.60), and with gamma < 0.25 the gate never normalises a ViT
#: layer (docs/methods.md §ACE): the effect a stage claim predicts on a ViT is 0.
ACE_STAGE_ABLATION: dict[str, dict[str, float]] = {
    "refinement": {"with": 90.60, "without": 90.60, "effect": 0.0},
}


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
