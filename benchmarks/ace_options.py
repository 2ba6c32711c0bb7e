"""Benchmark rows for ACE's two options beyond the paper (issue 23): ``eps_mode="relative"`` and
``gamma_mode="cv"`` (docs/methods.md §ACE, "ε and γ in units"), beside ACE as published, on one zoo.

    python3 benchmarks/ace_options.py --suite tasks8 --seed 0      # figures/benchmark/ace_options/

Rows, all on the same zoo and evaluated as ``acetools bench`` does (n_val 100, n_test 500 per task):

* the references (base, experts), ``ace`` at the code's defaults (eps 1e-2) and ``ace (eps 1e-5)``,
  the paper's ViT eps, recomputed here so the option rows sit beside rows of the same zoo;
* ``ace (relative eps, on val)``: ``eps_mode="relative"``, its eps chosen on validation from
  ``--rel-grid`` (the average normalized validation accuracy, the first best in grid order); the
  validation score of every eps is in the JSON;
* ``ace (gamma cv)`` and ``ace (eps 1e-5, gamma cv)``: the gate on the scale-invariant γ at the
  code's eps and at the paper's.

Results: ``<suite>_<size>_seed<k>_summary.csv``, ``_per_task.csv`` and ``.json`` in a subfolder
of figures/benchmark, so the seed tables (``<suite>_<size>_seeds.csv``, the README's) never
mix them with the three-seed rows. The share of matrices each gate flags is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from acetools.benchmark import Benchmark
from acetools.merging import METHODS, merge, task_vectors
from acetools.merging.ace import ace_with_diagnostics
from acetools.utils import atomic_write
from acetools.world.vision.zoo import Zoo

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "figures" / "benchmark" / "ace_options"


def option_rows(bench: Benchmark, rel_grid) -> tuple[list, dict]:
    """The runs (references, ``ace`` and the rows above) on ``bench``, and what the JSON adds:
    the relative eps's validation search and the share of matrices each gate flags."""
    val_scores = []
    for eps in rel_grid:
        merged = merge("ace", bench.base, bench.experts, eps=eps, eps_mode="relative")
        norm = bench.normalized(bench.evaluate(merged, "val"), "val")
        val_scores.append({"eps": eps, "val_normalized": 100 * float(np.mean(list(norm.values())))})
    best = max(val_scores, key=lambda r: r["val_normalized"])  # max keeps the first best
    rows = {
        "ace (eps 1e-5)": {"method": "ace", "search": None, "eps": 1e-5},
        "ace (relative eps, on val)": {"method": "ace", "search": None, "eps": best["eps"], "eps_mode": "relative"},
        "ace (gamma cv)": {"method": "ace", "search": None, "gamma_mode": "cv"},
        "ace (eps 1e-5, gamma cv)": {"method": "ace", "search": None, "eps": 1e-5, "gamma_mode": "cv"},
    }
    runs = bench.run_all(["ace"], progress=False, extra=rows)
    taus = task_vectors(bench.base, bench.experts)
    tau = METHODS["ace"].params["tau"].default
    gate = {"tau": tau}
    for mode in ("paper", "cv"):
        _, diag = ace_with_diagnostics(bench.base, taus, gamma_mode=mode)
        g = [d.gamma for d in diag.values()]
        gate[mode] = {"n_matrices": len(g), "flagged": int(sum(d.flag for d in diag.values())),
                      "median_gamma": float(np.median(g)) if g else None}
    return runs, {"relative_eps_search": {"grid": list(rel_grid), "chosen": best["eps"], "val": val_scores},
                  "gate": gate}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="tasks8")
    ap.add_argument("--size", default="small")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-val", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--rel-grid", nargs="+", type=float, default=[1e-4, 1e-3, 1e-2, 1e-1, 1.0],
                    help="the relative eps values validation chooses from")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    zoo = Zoo(args.suite, size=args.size, seed=args.seed, mtl=False, threads=args.threads)
    zoo.build(progress=False)
    bench = Benchmark(zoo, n_val=args.n_val, n_test=args.n_test, threads=args.threads)
    runs, extra = option_rows(bench, args.rel_grid)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = bench.save(runs, folder, f"{args.suite}_{args.size}_seed{args.seed}", regime=False)
    rec = json.loads(paths["json"].read_text())
    rec.update(extra)
    rec["command"] = "python3 benchmarks/ace_options.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with atomic_write(paths["json"], "w") as fh:
        json.dump(rec, fh, indent=1, default=str)
    print(bench.summary(runs).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"relative eps on val: {extra['relative_eps_search']}; gate: {extra['gate']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
