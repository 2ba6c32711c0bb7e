"""Why WUDI falls below the base in the mini-world: how far Adam gets in 300 steps.

WUDI (docs/methods.md §WUDI) starts every matrix at the **sum** of the task vectors and runs 300 Adam
steps at lr 1e-5. An Adam step moves each entry by about lr, so 300 steps move an entry by at
most ~3e-3. On CLIP ViT-B/32 the task vectors' entries are small enough for that; if the
sum's entries are larger than Adam's reach, the result stays near the sum, i.e. task
arithmetic with lambda = 1. This script measures it on a mini-world suite:

* per WUDI target matrix: RMS entry of the sum (the start), RMS of the move Adam made, and
  the interference loss after the run relative to the loss at the start;
* accuracy (val and test, absolute and normalized) of task arithmetic at lambda = 1 (the
  start), WUDI at its default lr and at larger learning rates (same 300 steps).

    python3 benchmarks/wudi_step_size.py                           # tasks8, seed 0
    python3 benchmarks/wudi_step_size.py --suite tasks20 --lrs 1e-5 1e-4 1e-3 3e-3

Needs the suite's experts in the zoo cache (``python3 -m acetools zoo build --suite ...``).
Saves figures/benchmark/wudi_step_size_<suite>_small_seed<k>.csv (``--out``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from acetools.benchmark import Benchmark
from acetools.errors import InputError
from acetools.merging import METHODS, is_matrix_param, task_vectors
from acetools.merging.wudi import is_wudi_target, wudi_loss
from acetools.utils import atomic_write
from acetools.utils import progress as bar
from acetools.world.vision.zoo import Zoo

ROOT = Path(__file__).resolve().parents[1]


def wudi_step_size(bench: Benchmark, lrs: Sequence[float] = (1e-5, 1e-4, 1e-3), *, steps: int = 300,
                   progress: bool | None = None) -> pd.DataFrame:
    """How far WUDI's Adam gets from its start: one row for its starting point (task
    arithmetic at lambda = 1, the sum of the task vectors) and one per learning rate in
    ``lrs`` (WUDI with ``steps`` Adam steps, other settings at their defaults).

    Columns: ``variant``, ``method``, ``lam`` / ``lr``, ``merge_seconds``, for WUDI rows the
    medians over its target matrices of ``rms_start`` (RMS entry of the sum),
    ``rms_move`` (RMS entry of the change Adam made) and ``loss_ratio`` (interference loss
    after / at the start), and val / test accuracy (``*_acc``, ``*_normalized``, percent,
    averaged over tasks). An Adam step moves an entry by about ``lr``, so ``rms_move`` stays
    below about ``steps * lr``: when that is small against ``rms_start`` WUDI ends near its
    start.
    """
    lrs = [float(lr) for lr in lrs]
    if not lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in lrs):
        raise InputError(f"lrs={lrs!r}: give one or more positive learning rates")
    base = bench.base
    taus = task_vectors(base, bench.experts)
    variants = [("task arithmetic, lambda = 1 (WUDI's start)", "task_arithmetic", {"lam": 1.0})]
    variants += [(f"wudi, lr {lr:g}" + (" (default)" if lr == METHODS["wudi"].hparams["lr"] else ""), "wudi",
                  {"lr": lr, "steps": steps}) for lr in lrs]
    rows = []
    for label, method, hp in bar(variants, desc="WUDI step size", enabled=progress):
        t0 = time.perf_counter()
        merged = bench._merge(method, hp)
        row: dict[str, Any] = {"variant": label, "method": method, **hp, "merge_seconds": time.perf_counter() - t0}
        if method == "wudi":
            stats = []
            for k, W0 in base.items():
                if is_wudi_target(k, W0, "matrix", is_matrix_param):
                    X = torch.stack([t[k] for t in taus]).double()
                    start, tau_m = X.sum(0), (merged[k] - W0).double()
                    stats.append({"rms_start": float(start.pow(2).mean().sqrt()),
                                  "rms_move": float((tau_m - start).pow(2).mean().sqrt()),
                                  "loss_ratio": float(wudi_loss(tau_m, X) / wudi_loss(start, X))})
            row.update({str(c): v for c, v in pd.DataFrame(stats).median().items()})
        for split in ("val", "test"):
            acc = bench.evaluate(merged, split)
            norm = bench.normalized(acc, split)
            row[f"{split}_acc"] = 100 * float(np.mean(list(acc.values())))
            row[f"{split}_normalized"] = 100 * float(np.mean(list(norm.values())))
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default="tasks8")
    ap.add_argument("--size", default="small")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 1e-4, 1e-3])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--n-val", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--root", default=None, help="zoo cache folder (default $ACETOOLS_CACHE or ~/.cache/acetools)")
    ap.add_argument("--out", default=str(ROOT / "figures" / "benchmark"))
    args = ap.parse_args(argv)

    zoo = Zoo(args.suite, size=args.size, seed=args.seed, root=args.root, mtl=False, threads=args.threads)
    todo = zoo.missing(mtl=False)
    if todo:
        raise SystemExit(f"the zoo lacks {len(todo)} entries for {args.suite} seed {args.seed}; build them first: "
                         f"python3 -m acetools zoo build --suite {args.suite} --size {args.size} "
                         f"--seeds {args.seed} --no-mtl")
    bench = Benchmark(zoo, n_val=args.n_val, n_test=args.n_test, threads=args.threads)
    df = wudi_step_size(bench, args.lrs, steps=args.steps)
    df.insert(0, "suite", args.suite)
    df.insert(1, "n_tasks", len(zoo.tasks))
    df.insert(2, "seed", args.seed)
    out = Path(args.out) / f"wudi_step_size_{args.suite}_{args.size}_seed{args.seed}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out, "w") as fh:
        df.to_csv(fh, index=False)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
