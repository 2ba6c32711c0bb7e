"""Replay a benchmark's grid searches at another patience (issue 23: one patience everywhere).

    python3 benchmarks/patience_replay.py figures/benchmark/text8_minilm_seed*.json --patience 3
    python3 benchmarks/patience_replay.py figures/benchmark/text8_minilm_seed*.json --patience 3 --apply

A benchmark JSON keeps every grid search's trace (each coefficient it evaluated, with every
task's validation accuracy). Evaluation is deterministic, so a search at a *smaller* patience
is the same search stopped earlier: :func:`replay_grid_search` runs
:func:`acetools.search.grid_search` on the recorded evaluations. Each searched row is

* ``same``: the replay picks the recorded coefficient, so the row (validation and test
  accuracies) is exactly what a run at the new patience gives; ``--apply`` cuts its trace to
  the coefficients that search evaluates;
* ``changed``: the replay picks another coefficient, whose test accuracy was never measured
  (or, at a larger patience, needs a coefficient the recorded search never evaluated).
  The row must be rerun; the script prints the command (``benchmarks/text_world.py bench --add``
  for the text world, ``benchmarks/merge_rows.py`` after ``acetools bench`` for the vision world).

First the replay at the recorded patience must give the recorded coefficient and trace, or the
file is refused (it was not written by this search). ``--apply`` sets the file's ``patience``
and adds a ``patience_replay`` entry (from, to, the rows replayed and the rows to rerun);
golden-section rows (ESM) and rows without a search do not depend on the patience.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from text_world import TEXT_VARIANTS  # benchmarks/text_world.py, beside this script

ROOT = Path(__file__).resolve().parents[1]


def replay_grid_search(trace: Sequence[Mapping[str, Any]], grid: Sequence[float], **search: Any):
    """:func:`acetools.search.grid_search` again, at another ``patience`` (or ``short``), on evaluations a search
    already made: ``trace`` is its record (:meth:`acetools.search.SearchResult.to_frame` rows, as a benchmark's
    JSON stores them, with ``alpha`` and ``<task>:top1`` columns), ``grid`` the grid it searched
    and ``search`` the keywords of ``grid_search`` (``reference``, ``objective``, ``patience``,
    ``short``).

    Evaluation is deterministic, so the result is what a fresh search at that patience gives
    whenever it only needs coefficients the trace holds: a smaller patience stops on a prefix of
    the same curve. When it needs one the first search never evaluated (a larger patience
    walking past its stop), this raises ``InputError`` naming it: rerun the search."""
    from acetools.errors import InputError
    from acetools.search import grid_search

    stored: dict[float, dict[str, float]] = {}
    for row in trace:
        if "alpha" not in row:
            raise InputError(f"trace row {dict(row)!r} has no 'alpha': pass the rows of SearchResult.to_frame()")
        scores = {k[: -len(":top1")]: float(v) for k, v in row.items() if k.endswith(":top1")}
        if not scores:
            raise InputError(f"trace row at alpha={row['alpha']} has no '<task>:top1' scores to replay")
        stored[float(row["alpha"])] = scores

    def score(alpha: float) -> dict[str, float]:
        if alpha not in stored:
            raise InputError(f"the replay needs alpha={alpha:g}, which the recorded search never evaluated "
                             f"(it stopped at {max(stored):g}): rerun the search at this patience instead")
        return stored[alpha]

    return grid_search(score, grid, **search)


def _base_method(label: str) -> tuple[str, Any]:
    """The registered method of a row label and its search (variant rows name theirs)."""
    from acetools.benchmark import ACE_SCALED_ROW, VARIANTS
    from acetools.merging import METHODS

    if label in METHODS:
        return label, METHODS[label].search
    for table in (TEXT_VARIANTS, VARIANTS, ACE_SCALED_ROW):
        if label in table:
            spec = table[label]
            search = spec.get("search", "default")
            return spec["method"], METHODS[spec["method"]].search if search == "default" else search
    raise SystemExit(f"row {label!r}: not a registered method or a known variant row; cannot find its grid")


def replay_file(path: Path, patience: int | None) -> tuple[dict, list[dict]]:
    """``(new record, report rows)`` for one benchmark JSON at ``patience``."""
    from acetools.errors import InputError

    rec = json.loads(path.read_text())
    old = rec.get("patience")
    experts = next((r for r in rec["runs"] if r["method"].startswith("experts")), None)
    if experts is None:
        raise SystemExit(f"{path}: no experts row, so no reference accuracies for the normalized search")
    reference = {t: v for t, v in experts["val"].items() if v > 0}
    report, runs = [], []
    for run in rec["runs"]:
        trace = run.get("search_trace")
        if not trace:
            runs.append(run)
            continue
        method, search = _base_method(run["method"])
        if search is None or search.kind != "grid":
            runs.append(run)
            report.append({"file": path.name, "row": run["method"], "status": "not a grid search"})
            continue
        tasks = {k[: -len(":top1")] for k in trace[0] if k.endswith(":top1")}
        ref = {t: reference[t] for t in tasks if t in reference} or None
        objective = "normalized" if ref else "absolute"
        try:
            again = replay_grid_search(trace, search.grid, reference=ref, objective=objective, patience=old)
        except InputError:  # the recorded patience walks past the recorded trace
            again = None
        if again is None or again.best != run["coef"] or len(again.alphas) != len(trace):
            found = ("needs coefficients beyond its trace" if again is None else
                     f"picks {again.best:g} after {len(again.alphas)} evaluations")
            raise SystemExit(f"{path}: row {run['method']!r}: the replay at the recorded patience {old} {found}, "
                             f"the record has {run['coef']:g} after {len(trace)}; this file was not written by "
                             "that search")
        try:
            new = replay_grid_search(trace, search.grid, reference=ref, objective=objective, patience=patience)
        except InputError:  # the new patience walks past where the recorded search stopped
            report.append({"file": path.name, "row": run["method"], "status": "changed", "coef": run["coef"],
                           "new_coef": None, "evaluated": len(trace), "new_evaluated": None})
            runs.append(run)
            continue
        same = new.best == run["coef"]
        report.append({"file": path.name, "row": run["method"], "status": "same" if same else "changed",
                       "coef": run["coef"], "new_coef": new.best, "evaluated": len(trace),
                       "new_evaluated": len(new.alphas)})
        runs.append({**run, "search_trace": trace[: len(new.alphas)]} if same else run)
    changed = [r["row"] for r in report if r["status"] == "changed"]
    out = {**rec, "runs": runs, "patience": patience,
           "patience_replay": {"from": old, "to": patience, "script": "benchmarks/patience_replay.py",
                               "replayed": [r["row"] for r in report if r["status"] == "same"],
                               "rerun": changed}}
    return out, report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="benchmark JSON files (figures/benchmark/<stem>.json)")
    ap.add_argument("--patience", type=int, required=True, help="the patience to replay at (0: the whole grid)")
    ap.add_argument("--apply", action="store_true", help="write the replayed files (default: only report)")
    args = ap.parse_args(argv)
    patience = args.patience or None
    import pandas as pd

    from acetools.utils import atomic_write

    reports = []
    for path in args.files:
        new, report = replay_file(path, patience)
        reports += report
        if args.apply:
            with atomic_write(path, "w") as fh:
                json.dump(new, fh, indent=1, default=str)
        rerun = new["patience_replay"]["rerun"]
        if rerun:
            print(f"{path.name}: rerun {rerun} at patience {patience}", file=sys.stderr)
    table = pd.DataFrame(reports)
    print(table.to_string(index=False))
    n = (table["status"] == "changed").sum() if len(table) else 0
    print(f"{n} of {(table['status'] != 'not a grid search').sum() if len(table) else 0} searched rows change "
          f"at patience {patience}" + ("" if args.apply else " (report only; --apply writes)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
