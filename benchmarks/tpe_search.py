"""TPE (acetools/tpe.py) against the full grid over two hyperparameters at once, on the text world's quick profile.

Per method, the grid evaluates every pair of its two searched hyperparameters (TIES: k x λ, ACE: scaling x
ε; :data:`GRIDS`) on validation; TPE (Optuna, seeded) gets at most a fifth of the grid's evaluations
(``--fraction``), for each of ``--seeds``. The grid's best and TPE's best are compared example by example
on the validation set: the difference counts as a tie when it is within the paired margin
max(0.5 points, 1.96 x the paired bootstrap standard error) (acetools_course/verdicts.py:margin,
docs/course.md §Margin, power and rivals). Scores are mean absolute validation accuracy over the tasks.

    python3 benchmarks/tpe_search.py                        # the table of docs/performance.md
    python3 benchmarks/tpe_search.py --methods ties --seeds 0

Results: benchmarks/results/tpe_search/tpe_search.csv and .json (every evaluation of both searchers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from acetools.benchmark import ACE_SCALED, Benchmark
from acetools.search import LAMBDA_GRID
from acetools.tpe import tpe_search

ROOT = Path(__file__).resolve().parents[1]

#: The grid per method: its two searched hyperparameters (acetools.tpe.SPACES), every third value of the registry's
#: coefficient grid (every second of ACE's scaling grid) by two values of the other: one evaluation (a merge of the
#: whole MiniLM-shaped model and the validation sets) took about 15 s on the loaded 2-core machine.
GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    "ties": {"k": (20, 50), "lam": LAMBDA_GRID[2::3]},  # λ = 0.1, 0.2, ..., 1.0
    "ace": {"scaling": ACE_SCALED.grid[1::2], "eps": (1e-3, 1e-2)},  # scaling = 0.2, 0.4, ..., 2.0
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="TPE seeds")
    ap.add_argument("--fraction", type=float, default=0.2, help="TPE's trials as a fraction of the grid's")
    ap.add_argument("--n-val", type=int, default=None, help="validation examples per task (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--root", default=None, help="the world's cache folder (default: the project's)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tpe_search"))
    return ap


def main(argv: list[str] | None = None) -> int:
    import itertools

    import pandas as pd

    from acetools.world.text.world import TextWorld
    from acetools_course.power import paired_se
    from acetools_course.verdicts import margin

    args = _parser().parse_args(argv)
    t0 = time.perf_counter()
    world = TextWorld("fixture", seed=0, profile="quick", root=args.root, threads=args.threads).build(
        progress_bar=False)
    bench = Benchmark(world, n_val=args.n_val, threads=args.threads)
    print(f"text world, quick profile: tasks {', '.join(bench.tasks)} (built/loaded in "
          f"{time.perf_counter() - t0:.0f} s)", flush=True)
    log: list[dict] = []
    hits: dict[int, dict] = {}

    def evaluate(searcher: str, seed: int | None, method: str, hp: dict) -> dict[str, float]:
        t = time.perf_counter()
        hp = {k: int(v) if k == "k" else float(v) for k, v in hp.items()}
        acc, h = bench.scored(bench._merge(method, hp), "val")
        hits[len(log)] = h
        log.append({"searcher": searcher, "seed": seed, "method": method, **hp, "mean": float(np.mean(list(
            acc.values()))), "seconds": time.perf_counter() - t})
        if len(log) % 10 == 0:
            print(f"  {len(log)} evaluations, the last {log[-1]['seconds']:.1f} s", flush=True)
        return acc

    rows = []
    for method in args.methods:
        names = list(GRIDS[method])
        t = time.perf_counter()
        first = len(log)
        for values in itertools.product(*GRIDS[method].values()):
            evaluate("grid", None, method, dict(zip(names, values)))
        grid_rows = list(range(first, len(log)))
        grid_best = max(grid_rows, key=lambda i: log[i]["mean"])  # the first maximum
        grid_s = time.perf_counter() - t
        n_grid = len(grid_rows)
        trials = max(1, int(n_grid * args.fraction))
        print(f"{method}: grid of {n_grid}: best {log[grid_best]['mean']:.4f} at "
              f"{ {k: log[grid_best][k] for k in names} } ({grid_s:.0f} s)", flush=True)
        for seed in args.seeds:
            t = time.perf_counter()
            first = len(log)
            tpe_search(lambda m, hp, s=seed: evaluate("tpe", s, m, hp), method, trials, seed=seed)
            tpe_rows = list(range(first, len(log)))
            tpe_best = max(tpe_rows, key=lambda i: log[i]["mean"])
            se = paired_se(hits[grid_best], hits[tpe_best])
            diff = 100 * (log[grid_best]["mean"] - log[tpe_best]["mean"])  # points
            m = margin(se=se)
            # the first trial at which TPE was within the margin of the grid's best
            reach = next((j + 1 for j, i in enumerate(tpe_rows)
                          if 100 * (log[grid_best]["mean"] - log[i]["mean"]) <= m), None)
            rows.append({"method": method, "grid_evals": n_grid, "grid_best": 100 * log[grid_best]["mean"],
                         "seed": seed, "tpe_evals": trials, "tpe_best": 100 * log[tpe_best]["mean"],
                         "diff_points": diff, "margin_points": m, "within": diff <= m, "evals_to_reach": reach,
                         "grid_s": grid_s, "tpe_s": time.perf_counter() - t,
                         **{f"tpe_{k}": log[tpe_best][k] for k in names},
                         **{f"grid_{k}": log[grid_best][k] for k in names}})
            print(f"  TPE seed {seed}: {trials} trials, best {log[tpe_best]['mean']:.4f} at "
                  f"{ {k: round(log[tpe_best][k], 4) for k in names} }; grid - TPE {diff:+.2f} points, margin "
                  f"{m:.2f}: {'within' if diff <= m else 'NOT within'}; reached at trial {reach}", flush=True)
    df = pd.DataFrame(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "tpe_search.csv", index=False)
    (out / "tpe_search.json").write_text(json.dumps({"argv": sys.argv[1:] if argv is None else argv,
                                                     "tasks": bench.tasks, "rows": rows, "evaluations": log,
                                                     "seconds": time.perf_counter() - t0}, indent=1))
    cols = ["method", "grid_evals", "grid_best", "seed", "tpe_evals", "tpe_best", "diff_points", "margin_points",
            "within", "evals_to_reach"]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"{time.perf_counter() - t0:.0f} s; saved {out / 'tpe_search.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
