"""The text world's recipe study (issue 19, item 3): which expert recipe, measured by its regime card?

The vision world's study is ``benchmarks/recipe_study.py``; this one asks the same question of
the text world (docs/text-world.md §Recipe): each recipe is a fine-tuning choice of the MiniLM
experts (heads, what is tuned and merged, learning rate and epochs, sequence length, bf16).
For each recipe the script builds the experts of a four-task study suite at seed 0 (cached per
expert, so a stopped run resumes with the next expert) and measures their regime card
(:func:`acetools.regime.regime_card`) into ``figures/regime/text_recipes/<recipe>/``. Finally
it collects every card found there into ``figures/regime/text_recipes/recipe_study.csv`` and
``recipe_study.png``.

    python3 benchmarks/text_recipe_study.py --list
    python3 benchmarks/text_recipe_study.py shipped trained_heads     # build + card, in order
    python3 benchmarks/text_recipe_study.py --summary                 # only the CSV + figure

The study suite is four of text8's tasks with short texts (so that a recipe costs minutes, not
an hour): ``emoji_group``, ``wordnet_domain``, ``code_language``, ``wordnet_artifact``. The
shipped recipe's experts are text8's own, so its card reuses them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from acetools.regime import RegimeCard, regime_card
from acetools.search import PATIENCE
from acetools.world.text.world import TextWorld

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "figures" / "regime" / "text_recipes"
STUDY_TASKS = ("emoji_group", "wordnet_domain", "code_language", "wordnet_artifact")

#: name -> (what it tests, TextFinetuneConfig overrides). `shipped` is the text world's recipe.
RECIPES: dict[str, tuple[str, dict]] = {
    "shipped": ("the shipped recipe: frozen zero-shot heads, the 36 weight matrices tuned and merged, AdamW lr "
                "1e-4 x 3 epochs, at most 48 tokens, bf16", {}),
    "trained_heads": ("the GLUE protocol: a linear head per task, trained with the encoder (head lr 1e-3); the "
                      "base is evaluated with the experts' heads", {"heads": "trained"}),
    "layers": ("biases and LayerNorms tuned and merged as well (embeddings frozen): the set the papers' vision "
               "code merges", {"params": "layers"}),
    "probe_recipe": ("the feasibility probe's optimiser: lr 5e-5 x 2 epochs (shipped heads and parameters)",
                     {"lr": 5e-5, "epochs": 2.0}),
    "short_fp32": ("at most 32 tokens and float32 (no bf16 autocast): the cost and effect of both", {
        "max_length": 32, "bf16": False}),
}


def make_world(name: str, *, seed: int = 0, threads: int | None = 2, root=None) -> TextWorld:
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; recipes: {list(RECIPES)}")
    return TextWorld(list(STUDY_TASKS), seed=seed, finetune=RECIPES[name][1], threads=threads, root=root)


def run_recipe(name: str, *, seed: int, threads: int | None, root, out: Path, n_val: int, n_test: int,
               patience: int | None) -> RegimeCard:
    log = logging.getLogger("text_recipe_study")
    world = make_world(name, seed=seed, threads=threads, root=root)
    t0 = time.perf_counter()
    world.build(progress_bar=True)
    build_s = time.perf_counter() - t0
    log.info("%s: experts ready in %.0f s (built %s)", name, build_s, world.built)
    card = regime_card(world, n_val=n_val, n_test=n_test, patience=patience, threads=threads, progress=True)
    card.meta["recipe_name"] = name
    card.meta["recipe_description"] = RECIPES[name][0]
    card.meta["recipe"] = world.config.to_dict() | {"params": world.config.params}
    card.meta["build_seconds_this_run"] = round(build_s, 1)
    card.meta["command"] = f"python3 benchmarks/text_recipe_study.py {name}"
    card.meta["timing"] = {r["task"]: r.get("metrics", {}).get("seconds") for r in world.records()}
    card.meta["expert_val_acc"] = {r["task"]: r.get("metrics", {}).get("val_acc") for r in world.records()}
    card.save(out / name)
    log.info("%s: card saved to %s (%.0f s)", name, out / name, card.meta["seconds"])
    return card


def _vision_study():
    """``benchmarks/recipe_study.py``, whose summary and command line this study shares."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("recipe_study", Path(__file__).resolve().parent / "recipe_study.py")
    vision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vision)
    return vision


def summarize(out: Path):
    """The vision study's summary (``benchmarks/recipe_study.py``) of the text cards under ``out``."""
    return _vision_study().summarize(out, RECIPES, title=f"text world, {len(STUDY_TASKS)} tasks, seed 0")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipes", nargs="*", help="recipes to build and measure, in order (see --list)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--root", default=None, help="text world cache (default ~/.cache/acetools/text)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--n-val", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--patience", type=int, default=PATIENCE, help=f"grid patience (default {PATIENCE}, the course's)")
    ap.add_argument("--list", action="store_true", help="list the recipes and exit")
    ap.add_argument("--summary", action="store_true", help="only collect the cards into the CSV and figure")
    args = ap.parse_args(argv)
    return _vision_study().run_study(
        args, RECIPES, lambda name, out: run_recipe(name, seed=args.seed, threads=args.threads, root=args.root,
                                                    out=out, n_val=args.n_val, n_test=args.n_test,
                                                    patience=args.patience), summarize)


if __name__ == "__main__":
    sys.exit(main())
