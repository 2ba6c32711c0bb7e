"""What the course notebooks share: the world they run on and where their figures go.

Every notebook has the same core parameters (``quick``, ``suite``, ``size``, ``seed``,
``device``, ``interactive``, ``figures_dir``) and calls :func:`world` and :func:`benchmark`
with them, so a lesson reads the same at the full size and in the tests::

    zoo = course.world(suite, size, seed=seed, quick=quick)       # built or loaded from the cache
    bench = course.benchmark(zoo, quick=quick)

``quick=True`` swaps in the fixture world (:data:`QUICK`): the three ``tiny`` procedural
tasks at size ``micro`` with its own small pretrained base, built from nothing in well
under a minute on 2 CPU cores. The numbers it gives are for checking that the notebook
runs, not for reading.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import InputError

__all__ = ["QUICK", "FULL_EVAL", "QUICK_EVAL", "world", "benchmark", "figures_path", "suite_tasks", "describe"]

#: The quick profile's world: fixture suite, micro model, recipes sized for seconds.
QUICK: dict[str, Any] = {
    "suite": "tiny",
    "size": "micro",
    "base": "train",
    "pool_kwargs": {"n_per_source": 200},
    "pretrain": {"epochs": 4, "batch_size": 64, "lr": 3e-3},
    "finetune": {"lr": 3e-3, "epochs": 6, "batch_size": 32},
}
#: Evaluation sizes (images per task) of the full profile and of the quick one.
FULL_EVAL: dict[str, int] = {"n_val": 100, "n_test": 500}
QUICK_EVAL: dict[str, int] = {"n_val": 40, "n_test": 60}


def suite_tasks(suite: str, quick: bool = False) -> list[str]:
    """The task names of ``suite`` (the fixture suite when ``quick``)."""
    from ..world.vision.data import SUITES

    name = QUICK["suite"] if quick else suite
    if name not in SUITES:
        raise InputError(f"unknown suite {name!r}; suites: {sorted(SUITES)}")
    return list(SUITES[name])


def world(
    suite: str = "tasks8",
    size: str = "small",
    *,
    seed: int = 0,
    quick: bool = False,
    root: str | os.PathLike | None = None,
    mtl: bool = False,
    device: str = "cpu",
    threads: int | None = None,
    progress: bool | None = None,
):
    """The built :class:`~acetools.world.vision.zoo.Zoo` of ``suite`` at ``size`` (expert seed ``seed``).

    Loads what the cache holds and builds the rest (the full-size base is shipped; experts
    take about a minute each on 2 CPU cores). ``quick`` ignores ``suite``/``size`` and
    uses :data:`QUICK`. ``device``: where to train anything missing (``"auto"`` allowed).
    """
    from ..utils import resolve_device
    from ..world.vision.zoo import Zoo

    dev = resolve_device(device)
    if quick:
        q = QUICK
        zoo = Zoo(q["suite"], size=q["size"], seed=seed, root=root, base=q["base"], pool_kwargs=q["pool_kwargs"],
                  pretrain=q["pretrain"], finetune=q["finetune"], mtl=mtl, device=dev, threads=threads)
    else:
        zoo = Zoo(suite, size=size, seed=seed, root=root, mtl=mtl, device=dev, threads=threads)
    return zoo.build(progress=progress)


def benchmark(zoo, *, quick: bool = False, **overrides: Any):
    """A :class:`~acetools.benchmark.Benchmark` on ``zoo`` with the profile's evaluation sizes."""
    from ..benchmark import Benchmark

    kw = dict(QUICK_EVAL if quick else FULL_EVAL)
    if quick:
        kw.update(n_proxy=8, n_gram=64)
    kw.update(overrides)
    return Benchmark(zoo, **kw)


def figures_path(figures_dir: str | os.PathLike) -> Path:
    """``figures_dir`` as an absolute path, created if missing."""
    p = Path(figures_dir).expanduser().resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p


def describe(zoo, quick: bool) -> str:
    """One sentence saying which world a notebook runs on: the quick profile's fixture world
    (how many tasks, which) or the mini-world's suite, with the model size."""
    tasks = ", ".join(zoo.tasks)
    if quick:
        return (f"The quick profile's fixture world: {len(zoo.tasks)} procedural tasks ({tasks}) at model size "
                f"{zoo.size}, built from nothing in seconds. Its numbers check that the lesson runs; they are not "
                "results to read (the full profile runs the mini-world).")
    text = f"The mini-world's suite {zoo.suite}: {len(zoo.tasks)} tasks ({tasks}) at model size {zoo.size}"
    cfg = getattr(zoo, "finetune_config", None)
    if cfg is None:
        return text + "."
    return (f"{text}; experts fine-tuned with AdamW at lr {cfg.lr:g} for {cfg.epochs} epochs ({cfg.precision}), "
            f"seed {getattr(zoo, 'seed', 0)}.")
