"""The recipe study of issue 10: which mini-world recipe opens the room for structured merges?

Each recipe names a world (model size, base pretraining and its pool, expert fine-tuning);
for each one the script builds the ``tasks8`` seed-0 zoo (base pretraining checkpoints every
epoch and resumes; experts are cached per task, so a stopped run loses at most one epoch
or one expert) and measures its regime card (:func:`acetools.regime.regime_card`) into
``figures/regime/<recipe>/``. Finally it collects every card found there into
``figures/regime/recipe_study.csv`` and ``recipe_study.png``. docs/regime.md reports the
findings.

    python3 benchmarks/recipe_study.py --list
    python3 benchmarks/recipe_study.py first_world gentle_bf16      # build + card, in order
    python3 benchmarks/recipe_study.py --summary                    # only the CSV + figure

Run it in the background with one thread on a shared machine (``--threads 1``: with two
threads and other jobs on two cores, OpenMP's barriers made training ~20x slower here) and
rerun the same command to resume.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from acetools.regime import RegimeCard, regime_card
from acetools.utils import atomic_write
from acetools.world.vision.zoo import Zoo

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "figures" / "regime"

GENTLE = {"lr": 1e-4, "epochs": 5}
BF16 = {"precision": "bf16"}
#: The first world's expert recipe, pinned (the zoo's default for ``small`` is now ``gentle_fast``).
FIRST = {"lr": 4e-4, "precision": "fp32"}
BROAD_POOL = {"n_per_source": 8000}

#: name -> (what it tests, Zoo keyword arguments). `gentle_fast` is the shipped recipe (zoo.WORLD_FINETUNE).
RECIPES: dict[str, tuple[str, dict]] = {
    "first_world": ("the first shipped recipe: small (192 x 6), shipped 5-epoch base, experts lr 4e-4 x 3 epochs", {
        "size": "small", "finetune": FIRST}),
    "first_world_bf16": ("the first recipe with bf16 autocast in the experts' fine-tuning (its effect alone)", {
        "size": "small", "finetune": FIRST | BF16}),
    "gentle": ("gentle fine-tune at the first world's compute: shipped base, experts lr 1e-4 x 3 epochs (fp32); "
               "only the learning rate differs from first_world", {
        "size": "small", "finetune": {"lr": 1e-4, "precision": "fp32"}}),
    "gentle_fast": ("gentle fine-tune at half the first world's time: shipped base, experts lr 1e-4 x 3 epochs, bf16 "
                    "(gentle with bf16 autocast)", {
        "size": "small", "finetune": {"lr": 1e-4} | BF16}),
    "gentle_bf16": ("gentle fine-tune on the shipped base: lr 1e-4 x 5 epochs, bf16", {
        "size": "small", "finetune": GENTLE | BF16}),
    "broad_small": ("broader base at the shipped base's compute: small, base 3 epochs on a 1.5x pool (8,000 per "
                    "source) with crop + flip augmentation, bf16; experts lr 4e-4 x 3 epochs, bf16", {
        "size": "small", "base": "train", "pool_kwargs": BROAD_POOL,
        "pretrain": {"epochs": 3, "augment": True, "hflip": True} | BF16, "finetune": FIRST | BF16}),
    "wide_broad_gentle": ("capacity + broad base + gentle: wide (384 x 4), base 6 epochs with crop augmentation on "
                          "a 1.6x pool (8,000 per source), bf16; experts lr 1e-4 x 5 epochs, bf16", {
        "size": "wide", "base": "train", "pool_kwargs": BROAD_POOL,
        "pretrain": {"epochs": 6, "augment": True} | BF16, "finetune": GENTLE | BF16}),
    "wide_broad": ("the same wide broad base; experts at the first world's lr 4e-4 x 3 epochs, bf16", {
        "size": "wide", "base": "train", "pool_kwargs": BROAD_POOL,
        "pretrain": {"epochs": 6, "augment": True} | BF16, "finetune": FIRST | BF16}),
}

#: The rows of the study's summary table and figure.
SUMMARY_METRICS = ["experts_abs", "base_norm", "ta_norm", "ta_lambda", "tsv_norm", "iso_cts_norm", "tsv_minus_ta",
                   "tsv_gap_share", "ace_norm", "ace_gamma_median", "ace_gated_fraction", "tau_ratio",
                   "trunc_norm", "scaled_norm", "ta_interference", "trunc_energy", "overlap_topk", "overlap_left",
                   "overlap_right", "overlap_random", "act_overlap", "act_topk_energy", "tau_in_act",
                   "cosine_mean", "wpre_top5_energy"]


def summary_row(card: RegimeCard, name: str, metrics: list[str] | tuple[str, ...] | None = None) -> dict[str, Any]:
    """One flat row ``{"recipe": name, metric: value, ...}`` for a study's summary table."""
    wanted = set(metrics) if metrics is not None else None
    out: dict[str, Any] = {"recipe": name}
    for r in card.rows:
        if wanted is None or r["metric"] in wanted:
            out[r["metric"]] = r["value"]
    return out

def make_zoo(name: str, *, suite: str = "tasks8", seed: int = 0, threads: int | None = 1, root=None) -> Zoo:
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; recipes: {list(RECIPES)}")
    kw = dict(RECIPES[name][1])
    return Zoo(suite, seed=seed, root=root, mtl=False, threads=threads, **kw)


def run_recipe(name: str, *, suite: str, seed: int, threads: int | None, root, out: Path) -> RegimeCard:
    log = logging.getLogger("recipe_study")
    zoo = make_zoo(name, suite=suite, seed=seed, threads=threads, root=root)
    t0 = time.perf_counter()
    zoo.build(progress=True)
    build_s = time.perf_counter() - t0
    log.info("%s: zoo ready in %.0f s (built %s)", name, build_s, zoo.built)
    card = regime_card(zoo, threads=threads, progress=True)
    card.meta["recipe_name"] = name
    card.meta["recipe_description"] = RECIPES[name][0]
    card.meta["build_seconds_this_run"] = round(build_s, 1)
    card.meta["command"] = f"python3 benchmarks/recipe_study.py {name}"
    card.meta["timing"] = {f"{r['kind']}{'/' + r['task'] if r['task'] else ''}": r["seconds"] for r in zoo.records()}
    card.save(out / name)
    log.info("%s: card saved to %s (%.0f s)", name, out / name, card.meta["seconds"])
    return card


def summarize(out: Path, recipes: dict | None = None, title: str = "tasks8, seed 0") -> pd.DataFrame:
    """Every card under ``out/<recipe>/card.json`` -> ``recipe_study.csv`` and ``.png``
    (rows in the order of ``recipes``, default :data:`RECIPES`; ``title`` names the world)."""
    recipes = RECIPES if recipes is None else recipes
    rows, clip = [], None
    for path in sorted(out.glob("*/card.json")):
        card = RegimeCard.load(path.parent)
        name = path.parent.name
        row = summary_row(card, name, SUMMARY_METRICS)
        row["description"] = card.meta.get("recipe_description") or (recipes.get(name, ("",))[0])
        row["size"] = card.meta.get("size")
        rows.append(row)
        if clip is None:
            clip = {"recipe": "CLIP ViT-B/32 (papers)", **{r["metric"]: r["clip"] for r in card.rows
                                                            if r["metric"] in SUMMARY_METRICS}}
    if not rows:
        raise FileNotFoundError(f"no card.json under {out}/*/; run a recipe first")
    order = {n: i for i, n in enumerate(recipes)}
    df = pd.DataFrame(rows).sort_values("recipe", key=lambda s: s.map(lambda n: order.get(n, 99)))
    df = pd.concat([df, pd.DataFrame([clip])], ignore_index=True)
    with atomic_write(out / "recipe_study.csv", "w") as fh:
        df.to_csv(fh, index=False, float_format="%.4g")
    plot(df, out / "recipe_study.png", title)
    return df


def plot(df: pd.DataFrame, path: Path, title: str = "tasks8, seed 0") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(df["recipe"])
    x = np.arange(len(names))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    w = 0.27
    for i, (m, lab) in enumerate([("ta_norm", "task arithmetic"), ("tsv_norm", "TSV-M"), ("iso_cts_norm", "Iso-CTS")]):
        ax.bar(x + (i - 1) * w, df[m], w, label=lab)
    ax.set_ylim(50, 100)
    ax.set_ylabel("normalized test accuracy (%)")
    ax.set_title(f"merges ({title})")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.bar(x, df["tsv_minus_ta"], color=["C3" if n.startswith("CLIP") else "C0" for n in names])
    ax.axhline(10, color="k", ls="--", lw=1, label="issue target (≥ 10)")
    ax.set_ylabel("TSV-M − task arithmetic (normalized points)")
    ax.set_title("the room for structured merges")
    ax.legend(fontsize=8)
    ax = axes[2]
    w4 = 0.2
    for i, (m, lab, c) in enumerate([("trunc_norm", "each expert truncated to rank r/T", "C1"),
                                     ("tsv_norm", "TSV-M", "C1"), ("scaled_norm", "each task alone at λ_TA", "C0"),
                                     ("ta_norm", "task arithmetic", "C0")]):
        ax.bar(x + (i - 1.5) * w4, df[m], w4, label=lab, color=c, alpha=0.45 if i in (0, 2) else 1.0)
    ax.set_ylim(50, 112)
    ax.set_ylabel("normalized test accuracy (%)")
    ax.set_title("two paths: truncate, then merge (TSV-M);\nscale, then add (TA)", fontsize=10)
    ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipes", nargs="*", help="recipes to build and measure, in order (see --list)")
    ap.add_argument("--suite", default="tasks8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--root", default=None, help="zoo cache (default ~/.cache/acetools)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--list", action="store_true", help="list the recipes and exit")
    ap.add_argument("--summary", action="store_true", help="only collect the cards into the CSV and figure")
    args = ap.parse_args(argv)
    return run_study(args, RECIPES, lambda name, out: run_recipe(name, suite=args.suite, seed=args.seed,
                                                                 threads=args.threads, root=args.root, out=out),
                     summarize)


def run_study(args, recipes: dict, run_one, summarize_fn) -> int:
    """A study's command line after parsing: ``--list``, or each recipe in order (``run_one(name,
    out)``, the summary rewritten after each), or ``--summary`` only. Shared with
    ``benchmarks/text_recipe_study.py``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.list:
        for n, (desc, kw) in recipes.items():
            print(f"{n:<20} {desc}\n{'':<20} {json.dumps(kw)}")
        return 0
    out = Path(args.out)
    for name in args.recipes:
        run_one(name, out)
        summarize_fn(out)
    if args.summary or not args.recipes:
        df = summarize_fn(out)
        print(df.drop(columns=["description"]).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
