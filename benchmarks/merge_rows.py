"""Put one method's rerun rows into the committed benchmark tables, leaving every other row as committed.

    python3 -m acetools bench --suite tasks8 --size small --seeds 0 --no-mtl --patience 3 --n-val 100 \\
        --n-test 500 --methods ties --out build/rerun          # the rerun, into a scratch folder
    python3 benchmarks/merge_rows.py --rerun build/rerun --suite tasks8 --seeds 0 --methods ties \\
        --why "issue 23's search protocol"                     # its rows into figures/benchmark

``acetools bench --methods M --out F`` writes whole files (M and the reference rows only), so it
cannot update a committed table in place. This script replaces the rows of ``--methods`` in
``<suite>_<size>_seed<k>_summary.csv``, ``..._per_task.csv`` and the ``runs`` of ``<...>.json``,
and rewrites ``<suite>_<size>_seeds.csv`` from the summaries (:func:`acetools.benchmark.aggregate_seeds`).
Every other row, the norms and the cosines stay as committed.

The rerun's world may not be bit-identical to the committed one (experts rebuilt on another
machine): the JSON gets a ``reruns`` entry with the rerun's checkpoints, its settings and its
reference rows (base, experts, and any other method it ran) beside the committed ones, so a reader
sees how far the two worlds differ. The script refuses a rerun with other settings (n_val, n_test,
patience, tasks, base) than the committed file's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from acetools.benchmark import aggregate_seeds
from acetools.utils import atomic_write

REPO = Path(__file__).resolve().parents[1]

#: Settings a rerun must share with the committed file for its rows to sit in the same table.
SAME = ("world", "suite", "tasks", "size", "expert_seed", "proxy_seed", "n_val", "n_test", "n_proxy", "n_gram",
        "patience")


def replace_rows(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], *,
                 key: str = "method") -> tuple[list[dict[str, Any]], list[str]]:
    """``(rows, appended)``: ``old``'s rows (a table's records or a JSON's runs) with the rows of
    each ``key`` value in ``new`` put where that value's rows were, so a table keeps its order
    when some of its methods are rerun; the values ``old`` has no rows of are appended at the
    end and listed in ``appended``."""
    fresh: dict[Any, list[dict[str, Any]]] = {}
    for r in new:
        fresh.setdefault(r[key], []).append(dict(r))
    rows: list[dict[str, Any]] = []
    done: set = set()
    for r in old:
        k = r.get(key)
        if k not in fresh:
            rows.append(dict(r))
        elif k not in done:
            rows += fresh[k]
            done.add(k)
    appended = [k for k in fresh if k not in done]
    return rows + [r for k in appended for r in fresh[k]], appended


def _replace_rows(committed: pd.DataFrame, rerun: pd.DataFrame, methods: list[str]) -> pd.DataFrame:
    """``committed`` with the rows of ``methods`` taken from ``rerun``, at their committed place."""
    missing = [m for m in methods if m not in set(committed["method"])]
    if missing:
        raise SystemExit(f"the committed table has no {sorted(missing)} rows to replace")
    for m in methods:
        if not (rerun["method"] == m).any():
            raise SystemExit(f"the rerun has no {m!r} rows")
    rows, _ = replace_rows(committed.to_dict(orient="records"),
                           rerun[rerun["method"].isin(methods)].to_dict(orient="records"))
    return pd.DataFrame(rows, columns=committed.columns)


def merge_seed(rerun_dir: Path, out_dir: Path, stem: str, methods: list[str], why: str) -> dict:
    old = json.loads((out_dir / f"{stem}.json").read_text())
    new = json.loads((rerun_dir / f"{stem}.json").read_text())
    for k in SAME:
        if k in old and old[k] != new.get(k):  # an older record may lack a field (world): not compared
            raise SystemExit(f"{stem}: the rerun's {k} = {new.get(k)!r}, the committed file's {old.get(k)!r}")
    base_old = next(c for c in old["checkpoints"] if c["kind"] == "base")["content_sha256"]
    base_new = next(c for c in new["checkpoints"] if c["kind"] == "base")["content_sha256"]
    if base_old != base_new:
        raise SystemExit(f"{stem}: the rerun's base {base_new[:12]} is not the committed base {base_old[:12]}")

    summary = _replace_rows(pd.read_csv(out_dir / f"{stem}_summary.csv"),
                            pd.read_csv(rerun_dir / f"{stem}_summary.csv"), methods)
    per_task = _replace_rows(pd.read_csv(out_dir / f"{stem}_per_task.csv"),
                             pd.read_csv(rerun_dir / f"{stem}_per_task.csv"), methods)

    new_runs = {r["method"]: r for r in new["runs"]}
    before = {r["method"]: r for r in old["runs"] if r["method"] in methods}
    old["runs"] = [new_runs[r["method"]] if r["method"] in methods else r for r in old["runs"]]
    old_runs = {r["method"]: r for r in old["runs"]}
    committed_hash = {(c["kind"], c.get("task")): c["content_sha256"] for c in old["checkpoints"]}
    changed = [f"{c['kind']} {c.get('task')}" for c in new["checkpoints"]
               if committed_hash.get((c["kind"], c.get("task"))) != c["content_sha256"]]
    beside = {m: {f"{which}_{col}": run[col] for which, run in (("rerun", r), ("committed", old_runs[m]))
                  for col in ("test_acc", "test_normalized")}
              for m, r in new_runs.items() if m not in methods and m in old_runs}
    entry = {
        "methods": methods, "why": why, "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "before": {m: {"coef": r["coef"], "test_normalized": r["test_normalized"],
                       "val_normalized": r["val_normalized"]} for m, r in before.items()},
        "versions": new["versions"], "checkpoints": new["checkpoints"],
        "not_bit_identical": changed,
        "reference_rows": beside,
    }
    old.setdefault("reruns", []).append(entry)

    with atomic_write(out_dir / f"{stem}_summary.csv", "w") as fh:
        summary.to_csv(fh, index=False)
    with atomic_write(out_dir / f"{stem}_per_task.csv", "w") as fh:
        per_task.to_csv(fh, index=False)
    with atomic_write(out_dir / f"{stem}.json", "w") as fh:
        json.dump(old, fh, indent=1, default=str)
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rerun", required=True, help="the scratch folder `acetools bench --out` wrote")
    ap.add_argument("--out", default=str(REPO / "figures" / "benchmark"), help="the committed tables")
    ap.add_argument("--suite", required=True)
    ap.add_argument("--size", default="small")
    ap.add_argument("--seeds", nargs="+", type=int, required=True)
    ap.add_argument("--methods", nargs="+", required=True, help="the rows to replace")
    ap.add_argument("--why", required=True, help="why the rows were rerun (stored in the JSON)")
    args = ap.parse_args(argv)
    rerun, out = Path(args.rerun), Path(args.out)
    for seed in args.seeds:
        stem = f"{args.suite}_{args.size}_seed{seed}"
        e = merge_seed(rerun, out, stem, args.methods, args.why)
        for m, b in e["before"].items():
            r = next(r for r in json.loads((out / f"{stem}.json").read_text())["runs"] if r["method"] == m)
            print(f"{stem} {m}: coef {b['coef']:.4g} -> {r['coef']:.4g}, test normalized "
                  f"{b['test_normalized']:.2f} -> {r['test_normalized']:.2f}")
        for m, d in e["reference_rows"].items():
            print(f"  {m} on the rerun's world: {d['rerun_test_acc']:.2f} % / "
                  f"{d['rerun_test_normalized']:.2f} normalized (committed {d['committed_test_acc']:.2f} / "
                  f"{d['committed_test_normalized']:.2f})")
        print(f"  checkpoints not bit-identical to the committed ones: {len(e['not_bit_identical'])} of "
              f"{len(e['checkpoints'])}")
    agg = aggregate_seeds(out, args.suite, args.size)
    with atomic_write(out / f"{args.suite}_{args.size}_seeds.csv", "w") as fh:
        agg.to_csv(fh, index=False)
    print(f"rewrote {out / f'{args.suite}_{args.size}_seeds.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
