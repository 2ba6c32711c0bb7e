"""What the course notebooks share: their world and where their figures go (docs/course.md §Running the course).

Every notebook calls :func:`world` and :func:`benchmark` with its core parameters::

    zoo = course.world(suite, size, seed=seed, quick=quick)       # built or loaded from the cache
    bench = course.benchmark(zoo, quick=quick)

``world`` picks the mini-world, the papers' CLIP ViT-B/32 (docs/clip-world.md) or a text world
(docs/text-world.md); ``quick=True`` swaps in the fixture world, whose numbers check the code."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from acetools.benchmark import Benchmark
from acetools.errors import InputError
from acetools.utils import atomic_write, resolve_device

#: The file in each figures folder that says which notebook, profile and world wrote it.
MANIFEST: str = "figures.json"

#: The notebooks' ``world`` parameter: the mini-world, or the papers' CLIP ViT-B/32; or a text
#: world (:func:`text_worlds`: its suites are read from the text world, not listed here).
WORLDS = ("mini", "clip-vit-b32")


def text_worlds() -> list[str]:
    """The text worlds a notebook's ``world`` parameter takes: ``"text"`` (the default suite) and every suite."""
    from acetools.world.text.tasks import SUITES

    return ["text", *SUITES]


def is_text_world(world: str) -> bool:
    """Whether a notebook's ``world`` parameter names the text world (:func:`text_worlds`)."""
    return isinstance(world, str) and world.startswith("text") and world in text_worlds()


def text_suite(world: str) -> str:
    """The text suite of a notebook's ``world`` parameter (``"text"``: the registry's default)."""
    from acetools.world import WORLDS as REGISTRY

    if not is_text_world(world):
        raise InputError(f"world={world!r} is not a text world; text worlds: {', '.join(text_worlds())}")
    return REGISTRY["text"].default_suite if world == "text" else world


def _check_world(world: str) -> None:
    if world not in WORLDS and not is_text_world(world):
        raise InputError(f"world={world!r}: choose one of {', '.join([*WORLDS, *text_worlds()])}")

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
#: The text world's evaluation sizes (texts per task) in the full profile: its benchmark's
#: (``benchmarks/text_world.py bench``), so a lesson and the room its claims are judged by agree.
TEXT_EVAL: dict[str, int] = {"n_val": 100, "n_test": 300}


def suite_tasks(suite: str, quick: bool = False) -> list[str]:
    """The task names of ``suite`` (the fixture suite when ``quick``)."""
    from acetools.world.vision.data import SUITES

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
    kind: str = "mini",
    models_root: str | os.PathLike | None = None,
    data_root: str | os.PathLike | None = None,
):
    """The built world of ``suite`` at ``size`` (expert seed ``seed``): the vision
    :class:`~acetools.world.vision.zoo.Zoo`, or by ``kind`` the CLIP world of :func:`clip_suite` or the text
    world of :func:`text_suite`. ``quick``: the fixture world; ``device``: where to train anything missing."""
    from acetools.world.vision.zoo import Zoo

    _check_world(kind)
    if is_text_world(kind):
        from acetools.world.text.world import TextWorld

        w = TextWorld("fixture" if quick else text_suite(kind), seed, profile="quick" if quick else "full",
                      device=device, threads=threads, root=None if root is None else Path(root) / "text")
        return w.build(progress)
    if kind == "clip-vit-b32":
        from acetools.world.clip.world import ClipWorld

        caps = QUICK_EVAL if quick else {}
        w = ClipWorld(clip_suite(suite), seed, models_root=models_root or None, data_root=data_root or None,
                      n_test=caps.get("n_test"), n_val=caps.get("n_val"), device=device,
                      root=None if root is None else Path(root) / "clip")
        return w.build(progress)
    recipe: dict[str, Any] = dict(QUICK) if quick else {"suite": suite, "size": size}
    zoo = Zoo(recipe.pop("suite"), seed=seed, root=root, mtl=mtl, device=resolve_device(device), threads=threads,
              **recipe)
    return zoo.build(progress=progress)


def clip_suite(suite: str) -> str:
    """The CLIP suite for a notebook's ``suite``: ``clip8``/``clip14``/``clip20`` as is, a mini-world
    suite ``tasks8``/``tasks14``/``tasks20`` as the CLIP suite of as many tasks."""
    from acetools.world.clip.tasks import CLIP_SUITES

    name = {"tasks8": "clip8", "tasks14": "clip14", "tasks20": "clip20"}.get(suite, suite)
    if name not in CLIP_SUITES:
        raise InputError(f"suite {suite!r} has no CLIP ViT-B/32 counterpart; use one of {sorted(CLIP_SUITES)}")
    return name


def world_options(world: str = "mini", models_root: str = "", data_root: str = "") -> dict[str, Any]:
    """The keyword arguments of :func:`world` for a notebook's ``world`` / ``models_root`` /
    ``data_root`` parameters (``{}`` for the mini-world; ``{"kind": world}`` for a text world)."""
    _check_world(world)
    if world == "mini":
        return {}
    if is_text_world(world):
        return {"kind": world}
    return {"kind": world, "models_root": models_root or None, "data_root": data_root or None}


def benchmark(zoo, *, quick: bool = False, **overrides: Any):
    """A :class:`~acetools.benchmark.Benchmark` on ``zoo`` with the profile's evaluation sizes
    (on the text world: :data:`TEXT_EVAL` in the full profile)."""
    full = TEXT_EVAL if getattr(zoo, "kind", None) == "text" else FULL_EVAL
    kw = {**QUICK_EVAL, "n_proxy": 8, "n_gram": 64} if quick else full
    return Benchmark(zoo, **{**kw, **overrides})


def repo_root(start: str | os.PathLike | None = None) -> Path:
    """The repository the notebooks live in: the first folder from ``start`` (default: the working directory)
    upwards with ``pyproject.toml`` and ``notebooks/``; else an editable install's; else ``start``."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents, Path(__file__).resolve().parents[1]):
        if (d / "pyproject.toml").is_file() and (d / "notebooks").is_dir():
            return d
    return here


def default_figures_root(quick: bool, start: str | os.PathLike | None = None) -> Path:
    """Where a profile's figures go by default: ``<repo>/figures`` (full) or
    ``<repo>/build/quick/figures`` (quick: ignored by git, never the committed results)."""
    root = repo_root(start)
    return root / "build" / "quick" / "figures" if quick else root / "figures"


def figures_path(figures_dir: str | os.PathLike = "", *, notebook: str | None = None, quick: bool | None = None,
                 world: str = "mini") -> Path:
    """The folder a notebook writes its figures to, created: ``figures_dir`` or the profile's default
    (``<folder>-<world>`` for a text world). A quick run into the committed ``<repo>/figures`` is refused."""
    _check_world(world)
    if str(figures_dir) == "":
        if notebook is None or quick is None:
            raise InputError("figures_path(''): an empty figures_dir needs notebook= and quick= to pick the "
                             "profile's folder")
        p = default_figures_root(quick) / notebook
    else:
        p = Path(figures_dir).expanduser().resolve()
    if is_text_world(world):
        p = p.with_name(f"{p.name}-{world}")
        notebook = notebook and f"{notebook}-{world}"
    if quick:
        committed = (repo_root() / "figures").resolve()
        if p == committed or committed in p.parents:
            raise InputError(f"figures_dir={str(figures_dir)!r} resolves to {p}, inside the committed figures "
                             f"{committed}: a quick run writes under {default_figures_root(True)} (leave "
                             "figures_dir empty)")
    p.mkdir(parents=True, exist_ok=True)
    if quick is not None:
        _write_manifest(p, {"notebook": notebook or p.name, "profile": "quick" if quick else "full"})
    return p


def _write_manifest(folder: Path, update: dict[str, Any]) -> None:
    path = folder / MANIFEST
    old = json.loads(path.read_text()) if path.is_file() else {}
    new = {**old, **update}
    if new != old:
        with atomic_write(path, "w") as fh:
            json.dump(new, fh, indent=1, sort_keys=True)


def note_world(folder: str | os.PathLike, world: Any) -> None:
    """Record ``world`` (a claim world, ``acetools_course.verdicts.World``) in ``folder``'s
    :data:`MANIFEST`, so that every figure saved there from now on carries it."""
    _write_manifest(Path(folder), {"world": world.name, "profile": world.profile, "fixture": world.fixture})


def display_path(path: str | os.PathLike) -> str:
    """``path`` as a page shows it: relative to the repository, else ``…/<parent>/<name>``."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(repo_root()))
    except ValueError:
        return f"…/{p.parent.name}/{p.name}"


def describe(zoo, quick: bool) -> str:
    """One sentence saying which world a notebook runs on."""
    tasks = ", ".join(zoo.tasks)
    if getattr(zoo, "kind", None) == "text":
        if quick:
            return (f"The quick profile's fixture text world ({zoo.describe()}; tasks {tasks}), built in seconds. "
                    "Its numbers check that the lesson runs on the text world; they are not results to read (the "
                    "full profile runs the text suite).")
        return f"The text world ({zoo.describe()}; tasks {tasks})."
    if getattr(zoo, "kind", None) == "clip":
        return (f"The papers' own world: {zoo.describe()}; zero-shot heads from CLIP's text tower"
                + (" (quick: few images per task, numbers for checking the code)." if quick else "."))
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
