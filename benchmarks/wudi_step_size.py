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
from pathlib import Path

from acetools.benchmark import Benchmark, wudi_step_size
from acetools.utils import atomic_write
from acetools.world.vision.zoo import Zoo

ROOT = Path(__file__).resolve().parents[1]


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
