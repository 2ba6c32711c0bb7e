"""Where the tasks' shared input directions come from: the card's activation rows, raw and centred, for
the shipped base against a randomly initialised encoder of the same size (docs/regime.md).

    python3 benchmarks/token_rows_random_init.py            # figures/regime/token_rows_random_init.csv

Each row is one encoder (the shipped ``small`` base, or random initialisations with seeds 0 and 1)
and one set of matrices (every hooked matrix, or ``in_proj`` and ``c_fc`` only, the two types
docs/regime.md quotes): the raw ``act_overlap`` / ``act_topk_energy`` (uncentred Grams over all
tokens) beside the centred, token-aware ``act_overlap_centred`` / ``act_topk_energy_centred`` and
the shares of the input energy in the global mean, the positional component and the CLS rows
(:func:`acetools.regime.regime_card`'s rows), on 128 training images per ``tasks8`` task. Only
the base or the random encoder runs: no expert is needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from acetools.benchmark import Benchmark
from acetools.regime import activation_rows
from acetools.utils import atomic_write
from acetools.world.vision.models import build_encoder
from acetools.world.vision.zoo import Zoo

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "figures" / "regime" / "token_rows_random_init.csv"
SETS = {"every hooked matrix": None, "in_proj and c_fc": ("attn.in_proj_weight", "mlp.c_fc.weight")}


class _Keys:
    """A benchmark whose ``matrix_keys`` is a subset (the rows' functions read it)."""

    def __init__(self, bench, keys):
        self._bench, self._keys = bench, list(keys)

    def __getattr__(self, name):
        return getattr(self._bench, name)

    def matrix_keys(self):
        return self._keys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="tasks8")
    ap.add_argument("--size", default="small")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="random-initialisation seeds")
    ap.add_argument("--n-act", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    zoo = Zoo(args.suite, size=args.size, seed=0, mtl=False, threads=args.threads)
    bench = Benchmark(zoo, threads=args.threads)
    base = bench.base
    encoders = {"shipped base": base}
    for s in args.seeds:
        state = build_encoder(args.size, seed=s).state_dict()
        encoders[f"random init (seed {s})"] = {k: state[k].to(base[k].dtype) for k in base}
    tasks, rows = list(bench.tasks), []
    for name, state in encoders.items():
        for what, types in SETS.items():
            keys = [k for k in bench.matrix_keys() if types is None or any(t in k for t in types)]
            b = _Keys(bench, keys)
            no_update = [{k: torch.zeros(()) for k in keys} for _ in tasks]
            act = activation_rows(b, state, no_update, tasks, n_images=args.n_act)
            rows.append({"encoder": name, "matrices": what, "n_matrices": len(keys),
                         **{k: act[k] for k in ("act_overlap", "act_overlap_centred", "act_topk_energy",
                                                "act_topk_energy_centred", "act_mean_share", "act_pos_share",
                                                "act_cls_share")}})
    df = pd.DataFrame(rows)
    with atomic_write(Path(args.out), "w") as fh:
        df.to_csv(fh, index=False, float_format="%.4g")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
