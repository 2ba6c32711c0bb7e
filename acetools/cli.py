"""The ``acetools`` command line: ``demo``, ``zoo build``, ``bench``, ``report``, ``diagnose``, ``merge``, ``regime``.

A bad argument ends in one line on stderr, ``acetools: error: <what> ...``, exit status 2 (``--debug``:
the traceback). A subcommand is one ``_add_<name>(sub)`` parser (listed in :func:`build_parser`, ending in
``set_defaults(func=_cmd_<name>)``) beside its ``_cmd_<name>(args) -> int``; it gets ``--debug`` /
``--quiet`` / ``--verbose`` and the one-line errors without asking. Validate at parse time where
argparse can (``choices=`` read lazily from the registries, ``type=`` :func:`positive_int` ...), else
raise :class:`acetools.errors.InputError` (or ``OSError``, :class:`CLIError`) naming the key, file or
parameter. Results go to stdout; progress and messages through ``logging`` / tqdm (stderr).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ._protocol import PATIENCE
from .errors import AcetoolsError, InputError

__all__ = ["main", "build_parser", "CLIError", "USER_ERRORS", "positive_int", "nonnegative_int"]

#: Exceptions that mean bad input (one line, exit 2): acetools' own and ``OSError`` (a file the user named).
#: A built-in ``ValueError`` / ``KeyError`` / ``TypeError`` from elsewhere is a bug and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (AcetoolsError, OSError)


class CLIError(AcetoolsError):
    """A bad argument found after parsing; printed as one line (exit 2)."""


# --------------------------------------------------------------------------- parsing helpers

class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``acetools: error: <sub>: <message>``."""

    #: the text after the options, read when the help is shown (``merge --help`` lists the methods)
    lazy_epilog: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.lazy_epilog is not None:
            self.epilog = self.lazy_epilog()
        return super().format_help()

    def error(self, message: str):
        sub = self.prog.partition(" ")[2]
        where = f"{sub}: " if sub else ""
        self.exit(2, f"acetools: error: {where}{_one_line(message)} (see '{self.prog} --help')\n")


class _Lazy(Sequence):
    """argparse ``choices=`` read from a registry on first use (building the parser imports nothing heavy)."""

    def __init__(self, load: Callable[[], Iterable[str]]):
        self._load = load

    @functools.cached_property
    def names(self) -> list[str]:
        return list(self._load())

    def __getitem__(self, i):
        return self.names[i]

    def __len__(self) -> int:
        return len(self.names)


def _registry(module: str, name: str) -> _Lazy:
    """The names in ``acetools.<module>.<name>``, read on first use."""
    return _Lazy(lambda: list(getattr(importlib.import_module(f".{module}", __package__), name)))


def _methods_epilog() -> str:
    """``merge --help``'s list of the registered methods: name, scope, description."""
    from .merging import METHODS

    lines = ["methods (acetools.METHODS; streamed: merged key by key from disk):"]
    for name, info in METHODS.items():
        how = {"key": "streamed", "global_ties": "streamed in extra passes", "model": "in memory"}[info.scope_label()]
        lines.append(f"  {name} ({how}): {info.description}")
    return "\n".join(lines)


#: The vision suites and merge methods ``--suite`` and ``--methods`` accept.
SUITE_CHOICES, METHOD_CHOICES = _registry("world.vision.data", "SUITES"), _registry("merging", "METHODS")


def _open_clip_names() -> list[str]:
    """open_clip's built-in model names, from its ``model_configs`` folder (importing it takes seconds)."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(p.stem for loc in spec.submodule_search_locations
                  for p in (Path(loc) / "model_configs").glob("*.json"))


def model_size(text: str) -> str:
    """``--size``: a registered mini-world size or an open_clip model name (``ViT-B-32``), checked without torch."""
    from .world.vision.sizes import SIZES

    if text in SIZES or text.removeprefix("acetools-") in SIZES or text in _open_clip_names():
        return text
    raise argparse.ArgumentTypeError(
        f"unknown model size {text!r}: use one of {sorted(SIZES)} or an open_clip model name such as 'ViT-B-32' "
        "(open_clip.list_models())")


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be {what}, got {v}")
    return v


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    """argparse ``type=``: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


class _Once(argparse.Action):
    """``nargs="+"`` given once: ``--experts a --experts b`` is an error (argparse would keep the last list)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, f"_seen_{self.dest}", False):
            parser.error(f"{option_string} given twice; list every value after one {option_string} "
                         f"(e.g. {option_string} a b c)")
        setattr(namespace, f"_seen_{self.dest}", True)
        setattr(namespace, self.dest, values)


def _add_output_options(p: argparse.ArgumentParser, *, top: bool) -> None:
    """``--debug`` / ``--quiet`` / ``--verbose``; SUPPRESS below the top level, so a subcommand never
    undoes a flag given before it."""
    default = False if top else argparse.SUPPRESS
    p.add_argument("--debug", action="store_true", default=default,
                   help="show the full traceback of an error instead of one line")
    v = p.add_mutually_exclusive_group()
    v.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="only warnings and errors from the library; no progress bars")
    v.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="the library's debug messages too")


def _add_output_options_everywhere(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)subcommand the output options (:func:`main` calls this on :func:`build_parser`'s result)."""
    for action in parser._actions:  # argparse keeps subcommands in a _SubParsersAction
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                _add_output_options(sub, top=False)
                _add_output_options_everywhere(sub)


def _folder_for_output(path: str | None, option: str) -> None:
    """Fail before any work when ``path`` cannot become a writable folder (a file, or no permission)."""
    if path is None:
        return
    full = p = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(p) and os.path.dirname(p) != p:  # up to the nearest thing that exists
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        what = "is a file" if p == full else f"is inside the file {p!r}"
        raise CLIError(f"{option} {path!r} {what}, not a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise CLIError(f"{option} {path!r}: no permission to write in {p!r}")


def _check_split_sizes(suite: str, **wanted: int | None) -> None:
    """``n_val=100`` etc. must not exceed any task's split whose size is known (else the results would
    record the number asked for while the whole split was used)."""
    from .world.vision.data import SUITES, get_task

    for option, n in wanted.items():
        if n is None:
            continue
        split = option.split("_", 1)[1]
        for task in SUITES[suite]:
            size = dict(get_task(task).sizes).get(split)
            if size is not None and n > size:
                raise CLIError(f"--{option.replace('_', '-')} {n} is more than task {task!r} of suite {suite!r} "
                               f"has ({size} {split} images)")


def _one_line(text: str) -> str:
    """One line, without terminal escape sequences (an error message may quote a library's coloured text)."""
    return " ".join(re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", str(text)).split())


def _message(err: BaseException) -> str:
    """The one-line text of an exception (a KeyError's without repr quotes, an OSError's with its file)."""
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        text = err.args[0]
    elif isinstance(err, OSError) and err.strerror and err.filename is not None:
        text = f"{err.strerror}: {str(err.filename)!r}"
    else:
        text = str(err) or type(err).__name__
    return _one_line(text)


# --------------------------------------------------------------------------- commands

def _add_executor_options(p: argparse.ArgumentParser) -> None:
    """``--executor``, ``--address``, ``--workers`` (acetools/executor.py; docs/performance.md §Executors)."""
    p.add_argument("--executor", default="serial", choices=["serial", "ray"],
                   help="where the independent jobs run: serial (default, here) or ray (one task per job; "
                        "pip install 'acetools[scale]')")
    p.add_argument("--address", default=None, metavar="ADDRESS",
                   help="with --executor ray: a running cluster (auto, ray://host:10001; default: start a local one)")
    p.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="with --executor ray: jobs run at once (default: the cluster's CPUs)")


def _executor(args: argparse.Namespace):
    """The :class:`acetools.executor.Executor` of ``--executor`` / ``--address`` / ``--workers``."""
    from .executor import as_executor

    if args.executor == "serial" and args.workers is not None:
        raise CLIError("--workers sets how many Ray jobs run at once: add --executor ray")
    return as_executor(args.executor, address=args.address, workers=args.workers)


def _add_demo(sub) -> None:
    d = sub.add_parser("demo", help="merge small generated experts with every method and print a table")
    d.add_argument("--tasks", type=positive_int, default=6, help="number of experts (default 6)")
    d.add_argument("--seed", type=nonnegative_int, default=0)
    d.add_argument("--methods", nargs="+", default=None, choices=METHOD_CHOICES, metavar="METHOD",
                   help="methods to run (default: all): %(choices)s")
    d.add_argument("--defaults", action="store_true", help="keep default coefficients (no validation search)")
    d.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    df = run_demo(n_tasks=args.tasks, seed=args.seed, methods=args.methods, select=not args.defaults)
    print(f"Merging {args.tasks} linear-regression experts (seed {args.seed}); "
          "gain = 100*(L_base - L_merged)/(L_base - L_expert) on test data, 100 = expert level;\n"
          "coefficients chosen on validation data; ms = merge + search time.")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return 0


def _zoo_options(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The :class:`acetools.world.vision.zoo.Zoo` arguments of ``zoo build`` / ``bench`` for ``seed``."""
    return {"tasks": args.suite, "size": args.size, "seed": seed, "root": args.root, "mtl": not args.no_mtl,
            "threads": args.threads}


def _zoo(args: argparse.Namespace, seed: int):
    from .world.vision.zoo import Zoo

    return Zoo(**_zoo_options(args, seed))


def _world_args(p: argparse.ArgumentParser, *, one_seed: bool = False) -> None:
    """The world options of ``zoo build``, ``bench`` and (``one_seed``: ``--seed``, no ``--no-mtl``) ``regime``."""
    p.add_argument("--suite", default="tasks8", choices=SUITE_CHOICES, metavar="SUITE",
                   help="task suite (default tasks8): %(choices)s")
    p.add_argument("--size", default="small", type=model_size, metavar="SIZE",
                   help="model size (default small): micro, tiny, small (acetools.world.vision.models.SIZES), "
                        "or an open_clip model name such as ViT-B-32 (pretrained CLIP, for the online suites)")
    if one_seed:
        p.add_argument("--seed", type=nonnegative_int, default=0, help="expert fine-tuning seed (default 0)")
    else:
        p.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0], help="expert fine-tuning seeds")
    p.add_argument("--root", default=None, help="cache folder (default $ACETOOLS_CACHE or ~/.cache/acetools)")
    if not one_seed:
        p.add_argument("--no-mtl", action="store_true", help="skip the multi-task reference model")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads for training/evaluation")


def _add_zoo(sub) -> None:
    z = sub.add_parser("zoo", help="build the mini-world's base, heads and experts")
    zsub = z.add_subparsers(dest="zoo_command", required=True, metavar="COMMAND")
    zb = zsub.add_parser("build", help="build (or load from the cache) a suite's zoo")
    _world_args(zb)
    zb.add_argument("--check", action="store_true",
                    help="build nothing: list what is missing from the cache (exit 1 if anything is)")
    _add_executor_options(zb)  # the experts of every seed are the jobs
    zb.set_defaults(func=_cmd_zoo_build)


def _cmd_zoo_build(args: argparse.Namespace) -> int:
    import pandas as pd

    from .world.vision.zoo import build_zoos

    _folder_for_output(args.root, "--root")
    if args.check:
        return _zoo_check(args)
    zoos = build_zoos([_zoo(args, seed) for seed in args.seeds], executor=_executor(args), progress=not args.quiet)
    for seed, zoo in zip(args.seeds, zoos):
        rows = [{"kind": r["kind"], "task": r["task"] or "", "seconds": r["seconds"],
                 **{k: v for k, v in (r["metrics"] or {}).items() if not isinstance(v, dict)}}
                for r in zoo.records()]
        print(f"zoo {args.suite} size={args.size} seed={seed}: built {len(zoo.built)}, loaded {len(zoo.loaded)} "
              f"(cache {zoo.folder})")
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


def _zoo_check(args: argparse.Namespace) -> int:
    """``zoo build --check``: one line per seed, never a traceback (exit 1 when anything is
    missing or cannot be checked, e.g. a data source that is not installed)."""
    short = 0
    for seed in args.seeds:
        head = f"zoo {args.suite} size={args.size} seed={seed}"
        try:
            zoo = _zoo(args, seed)
            todo = zoo.missing()
        except Exception as err:  # noqa: BLE001 - --check reports, it never raises
            if args.debug:
                raise
            short += 1
            print(f"{head}: cannot check ({type(err).__name__}: {_message(err)})")
            continue
        short += len(todo)
        what = ", ".join(f"{k}{'/' + t if t else ''}" for k, t in todo) or "nothing"
        print(f"{head}: {len(todo)} to build ({what}); cache {zoo.folder}")
    return 1 if short else 0


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="merge a zoo with methods, select coefficients on val, report test")
    _world_args(b)
    b.add_argument("--methods", nargs="+", default=None, choices=METHOD_CHOICES, metavar="METHOD",
                   help="methods (default: all registered): %(choices)s")
    b.add_argument("--n-val", type=positive_int, default=None, help="validation images per task for the search")
    b.add_argument("--n-test", type=positive_int, default=None, help="test images per task")
    b.add_argument("--patience", type=positive_int, default=PATIENCE,
                   help="stop a grid search after this many points without improvement, counted once the "
                        f"validation curve has risen (default {PATIENCE}, the course's one patience)")
    b.add_argument("--whole-grid", action="store_true", help="search every coefficient of the grid (no patience)")
    b.add_argument("--ace-scaled", action="store_true", help="also run ACE with its scaling chosen on val")
    b.add_argument("--variants", action="store_true",
                   help="also run the variant rows (ACE with the gate off, ACE at eps 1e-5, WUDI at lr 1e-4 "
                        "and 1e-3, and WUDI at the lr chosen on validation)")
    b.add_argument("--out", default=None, help="folder for CSV/JSON results (e.g. figures/benchmark)")
    b.add_argument("--store", default=None, metavar="DIR",
                   help="keep each finished row in DIR/<suite>_<size>_seed<k>/ and skip the rows found there "
                        "(a stopped run resumes, under either executor)")
    _add_executor_options(b)
    _bench_world_options(b)
    b.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    """``acetools bench``: the same tables in every world, one run per seed (the papers' numbers
    beside them are the course's: notebook 04, ``paper_tables.beside_papers``)."""
    from .benchmark import ACE_SCALED_ROW, VARIANTS, Benchmark, aggregate_seeds, picked_rows
    from .utils import atomic_write

    _bench_world_check(args)
    _folder_for_output(args.out, "--out")
    _folder_for_output(args.root, "--root")
    vision = args.world == "vision"
    options: dict = {"root": args.root, "device": args.device}
    if vision:
        _check_split_sizes(args.suite, n_val=args.n_val, n_test=args.n_test)
    if args.world == "clip-vit-b32":
        options |= {"models_root": args.models_root, "data_root": args.data_root,
                    "openclip_root": args.openclip_root, "n_test": args.n_test, "n_val": args.n_val,
                    "tasks": args.tasks}
    extra = (dict(ACE_SCALED_ROW) if args.ace_scaled else {}) | (VARIANTS if args.variants else {})
    name, size = args.suite, args.size
    executor = _executor(args)
    _folder_for_output(args.store, "--store")
    for seed in args.seeds:
        source = functools.partial(_built_world, args.world, args.suite, seed, options,
                                   _zoo_options(args, seed) if vision else None)
        world = source(progress=not args.quiet) if vision else source(progress=False if args.quiet else None)
        if not vision:
            name, size = world.name, world.size
        bench = Benchmark(world, n_val=args.n_val, n_test=args.n_test, threads=args.threads,
                          patience=None if args.whole_grid else args.patience, source=source)
        store = Path(args.store) / f"{name}_{size}_seed{seed}" if args.store else None
        runs = bench.run_all(args.methods, progress=not args.quiet, extra=extra, store=store, executor=executor)
        runs += picked_rows(runs)  # e.g. WUDI at the step size of its variant rows chosen on validation
        stem = f"{name}_{size}_seed{seed}"
        if args.out:
            bench.save(runs, Path(args.out), stem)
        print(f"\n{stem}: {bench.world.describe()}")
        print(bench.summary(runs).assign(seed=seed).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.out:
        agg = aggregate_seeds(args.out, name, size)
        path = Path(args.out) / f"{name}_{size}_seeds.csv"
        with atomic_write(path, "w") as fh:
            agg.to_csv(fh, index=False)
        print(f"\n{name} ({size}) over every seed in {args.out}: {path}")
        print(agg.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


def _built_world(world: str, suite: str, seed: int, options: dict, zoo: dict | None, progress: bool | None = False):
    """``acetools bench``'s world, built or loaded from the cache (a Ray worker loads it so: the benchmark's
    ``source``): the vision zoo of ``zoo`` (:class:`acetools.world.vision.zoo.Zoo`'s arguments) or ``world``'s."""
    if zoo is not None:
        from .world.vision.zoo import Zoo

        return Zoo(**zoo).build(progress=progress)
    from .world import get_world

    built: Any = get_world(world, suite, seed, **options)  # a text or CLIP world
    return built.build(progress)


#: ``acetools bench`` options that only the CLIP world reads, and the vision-only ones.
_CLIP_ONLY = ("models_root", "data_root", "openclip_root", "tasks")
_VISION_ONLY = ("no_mtl", "threads")


def _bench_world_check(args: argparse.Namespace) -> None:
    """``bench --world``: the suite belongs to the world and the options to it (before any heavy import)."""
    from .world import world_suites

    suites = world_suites(args.world)
    if args.suite is None:
        args.suite = suites[0]
    if args.suite not in suites:
        raise CLIError(f"--suite {args.suite!r} is not a suite of --world {args.world}; its suites: "
                       f"{', '.join(suites)}")
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    if args.world != "clip-vit-b32":
        used = [o for o in _CLIP_ONLY if getattr(args, o) is not None]
        if used:
            raise CLIError(f"{flag(used[0])} needs --world clip-vit-b32")
    if args.world != "vision":
        used = [o for o in _VISION_ONLY if getattr(args, o)]
        if args.size != "small":
            used.insert(0, "size")
        if used:
            raise CLIError(f"{flag(used[0])} is an option of the vision mini-world, not of --world {args.world}")
    if args.world == "clip-vit-b32" and args.seeds != [0]:
        raise CLIError(f"--seeds {' '.join(map(str, args.seeds))}: the public CLIP experts are one fine-tuning "
                       "run; use seed 0")
    for opt in ("models_root", "data_root", "openclip_root"):
        p = getattr(args, opt, None)
        if p is not None and not os.path.isdir(os.path.expanduser(p)):
            raise CLIError(f"{flag(opt)} {p!r} is not a folder")


def _all_suites() -> list[str]:
    from .world import WORLDS

    return list(dict.fromkeys(s for w in WORLDS.values() for s in w.suites()))


def _bench_world_options(b: argparse.ArgumentParser) -> None:
    """``bench``'s world options: ``--world`` and the CLIP world's folders and caps. ``--suite``
    takes any world's suite (checked against ``--world`` by :func:`_bench_world_check`)."""
    for action in b._actions:  # world_args' --suite lists the vision suites; bench takes every world's
        if action.dest == "suite":
            action.choices, action.default = _Lazy(_all_suites), None
            action.help = "task suite (default: the world's first; vision tasks8, clip-vit-b32 clip8): %(choices)s"
    b.add_argument("--world", default="vision", choices=_registry("world", "WORLDS"), metavar="WORLD",
                   help="the world to merge in (default vision, the mini-world): %(choices)s")
    b.add_argument("--models-root", default=None, metavar="DIR",
                   help="clip-vit-b32: read DIR/<model id>/ (DIR/openai/clip-vit-base-patch32/, "
                        "DIR/tanganke/clip-vit-base-patch32_<task>/) instead of the Hugging Face cache")
    b.add_argument("--data-root", default=None, metavar="DIR",
                   help="clip-vit-b32: read DIR/<task>/<split>/<class name>/*.png|jpg instead of `datasets`")
    b.add_argument("--openclip-root", default=None, metavar="DIR",
                   help="clip-vit-b32: the open_clip checkpoints DIR/ViT-B-32/{Task}Val/nonlinear_finetuned.pt, "
                        "MNISTVal/nonlinear_zeroshot.pt, head_{Task}Val.pt (state dicts only)")
    b.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                   help="clip-vit-b32: a subset of the suite's tasks (e.g. --tasks mnist eurosat)")
    b.add_argument("--device", default="auto", help="text / clip-vit-b32: auto (CUDA when present), cuda or cpu")


def _add_report(sub) -> None:
    r = sub.add_parser("report", help="run the course notebooks with papermill and render HTML reports")
    r.add_argument("--profile", choices=["quick", "full"], default="quick",
                   help="quick: fixture world, minutes (CI); full: the mini-world at its default size")
    r.add_argument("--only", nargs="+", default=None, metavar="NOTEBOOK",
                   help="notebooks to run (stem, number or name; see --list)")
    r.add_argument("-p", "--parameter", action="append", default=[], metavar="KEY=VALUE",
                   help="set a notebook parameter (repeatable); checked against the notebooks' parameters cells "
                        "(name and type) before anything runs")
    r.add_argument("--out", default=None, help="build folder (default build/report/<profile>)")
    r.add_argument("--figures", default=None, help="figure root (default figures/ for full, <out>/figures for quick)")
    r.add_argument("--notebooks", default=None, help="notebooks folder (default the repository's notebooks/)")
    r.add_argument("--no-html", action="store_true", help="skip the HTML rendering")
    r.add_argument("--cell-timeout", type=positive_int, default=None, metavar="S",
                   help="fail a notebook when one cell runs longer than S seconds (default: no limit)")
    r.add_argument("--start-timeout", type=positive_int, default=300, metavar="S",
                   help="seconds to wait for a notebook kernel to start (default 300)")
    r.add_argument("--list", action="store_true", help="list the notebooks and exit")
    r.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from .notebooks import notebook_paths, parse_parameter, run_report

    if args.list:
        for p in notebook_paths(args.notebooks):
            print(p.stem)
        return 0
    params = dict(parse_parameter(p, literal=False) for p in args.parameter)  # typed by run_report's check
    _folder_for_output(args.out, "--out")
    _folder_for_output(args.figures, "--figures")

    def show(rec):
        print(f"{rec['notebook']:<24} {rec['seconds']:>7.1f} s  {rec.get('html', rec['executed'])}", flush=True)

    from papermill.exceptions import PapermillExecutionError

    try:
        recs = run_report(args.profile, only=args.only, parameters=params, out=args.out, figures=args.figures,
                          notebooks=args.notebooks, html=not args.no_html, timeout=args.cell_timeout,
                          start_timeout=args.start_timeout, on_result=show)
    except PapermillExecutionError as err:  # a failing notebook: not a bad argument (exit 1), still one line
        if args.debug:
            raise
        print(f"acetools: error: a notebook failed in cell [{err.exec_count}]: {err.ename}: {_one_line(err.evalue)} "
              "(the partly executed notebook is in the build folder; run with --debug for the traceback)",
              file=sys.stderr)
        return 1
    print(f"{len(recs)} notebook(s) ran in {sum(r['seconds'] for r in recs):.0f} s ({args.profile} profile)")
    return 0


def _add_diagnose(sub) -> None:
    g = sub.add_parser("diagnose",
                       help="diagnose a base and its experts from their checkpoints: tables and an HTML report")
    g.add_argument("--base", required=True,
                   help="base checkpoint (safetensors file, HF or open_clip folder, state dict)")
    g.add_argument("--experts", required=True, nargs="+", action=_Once, help="fine-tuned checkpoints, one per task")
    g.add_argument("--out", required=True, help="output folder: diagnose.html, the executed notebook, CSV tables")
    g.add_argument("--layout", default="auto", metavar="LAYOUT",
                   choices=_Lazy(lambda: ["auto", *_registry("layouts", "PRESETS")]),
                   help="layout preset (default auto: detected from the config or key names): %(choices)s")
    g.add_argument("--names", nargs="+", default=None, help="one name per expert (default: the file names)")
    g.add_argument("--heads", default="auto", choices=["auto", "merge", "per-task", "drop"],
                   help="classifier heads (classifier.*, score.weight), as for merge: auto (default: left out for "
                        "*ForSequenceClassification experts), merge (diagnosed like every key; same shapes only), "
                        "per-task or drop (left out)")
    g.add_argument("--tau", type=float, default=None,
                   help="ACE's gate threshold on gamma (default: ACE's registered tau, acetools.METHODS['ace'])")
    g.add_argument("--ace", action="store_true",
                   help="also run ACE's closed form per matrix (W_pre's spectrum; slower)")
    g.add_argument("--tables-only", action="store_true", help="write the CSV tables and print the summary; no notebook")
    g.add_argument("--no-html", action="store_true", help="skip the HTML rendering")
    g.add_argument("--cell-timeout", type=positive_int, default=None, metavar="S",
                   help="fail when one notebook cell runs longer than S seconds (default: no limit)")
    g.set_defaults(func=_cmd_diagnose)


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from .files.checkpoints import check_output_folder
    from .files.diagnose import check_inputs, diagnose, run_report

    _folder_for_output(args.out, "--out")
    check_output_folder(args.out, [args.base, *args.experts], weights=False)  # merge's check: never inside an input
    # every file, key and shape is checked before a kernel starts (one-line errors)
    info = check_inputs(args.base, args.experts, names=args.names, layout=args.layout, heads=args.heads)
    print(f"{info['n_tasks']} experts, layout {info['layout']!r}, {info['n_matrices']} matrices of "
          f"{info['n_keys']} keys", flush=True)
    if args.tables_only:
        d = diagnose(args.base, args.experts, names=args.names, layout=args.layout, tau=args.tau, ace=args.ace,
                     heads=args.heads)
        paths = d.save(args.out)
        print(d.summary[["label", "value", "unit"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(f"tables in {os.path.dirname(os.path.abspath(paths['summary']))} ({d.meta['seconds']:.0f} s)")
        return 0
    rec = run_report(args.base, args.experts, args.out, names=args.names, layout=args.layout, tau=args.tau,
                     ace=args.ace, html=not args.no_html, timeout=args.cell_timeout, heads=args.heads)
    print(f"report in {rec['seconds']:.0f} s: {rec.get('html', rec['executed'])}")
    return 0


def _add_merge(sub) -> None:
    m = sub.add_parser("merge", help="merge checkpoints on disk (safetensors, HF folders, open_clip) into safetensors",
                       description="Merge expert checkpoints fine-tuned from one base; streams key by key when the "
                                   "method allows. Options override a config file's values. See docs/your-models.md.")
    m.formatter_class = argparse.RawDescriptionHelpFormatter
    m.lazy_epilog = _methods_epilog
    m.add_argument("config", nargs="?", default=None,
                   help="YAML config (method, base, experts, out, hyperparameters, ...)")
    m.add_argument("--method", default=None, choices=_Lazy(lambda: [*METHOD_CHOICES, "auto"]), metavar="METHOD",
                   help="merge method (acetools.METHODS), e.g. ace, ties, tsv_m; auto: chosen by --search with "
                        "--searcher tpe")
    m.add_argument("--base", default=None, help="pretrained checkpoint: file or folder")
    m.add_argument("--experts", nargs="+", default=None, action=_Once,
                   help="fine-tuned checkpoints, files or folders (after one --experts)")
    m.add_argument("--out", default=None, help="output folder (must not hold an input)")
    m.add_argument("--lora-out", dest="lora_out", default=None, metavar="DIR",
                   help="LoRA adapter experts: write the merge as one peft adapter to DIR (instead of --out, or "
                        "beside it): task_arithmetic / weight_averaging exactly, of rank sum_t r_t; with --lora-rank, "
                        "of that rank (docs/your-models.md §LoRA adapters as experts)")
    m.add_argument("--lora-rank", dest="lora_rank", type=positive_int, default=None, metavar="R",
                   help="with --lora-out: write the merge as an adapter of rank R, for every method with a form in "
                        "the adapters' span (task_arithmetic, weight_averaging, tsv_m, iso_c, iso_cts, ace): the best "
                        "rank-R factors of each module's merge; prints the energy discarded per module and in total")
    m.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="method hyperparameter (repeatable), e.g. -p lam=0.3 -p scope=tensor; per expert: "
                        "-p weights=[0.7,0.3] (docs/your-models.md §Coming from mergekit)")
    m.add_argument("--layout", default=None, help="auto (default), open_clip, hf_clip, gpt2, bert, llama, generic")
    m.add_argument("--force-layout", dest="force_layout", action="store_true",
                   help="use --layout even where it contradicts the base's config.json")
    m.add_argument("--dtype", default=None,
                   help="output dtype of float tensors: base (default), float32, bf16, fp16; the written config.json "
                        "records it (dtype, and torch_dtype where the base's config has it)")
    m.add_argument("--device", default=None, help="where each key is merged: cpu (default), cuda, auto")
    m.add_argument("--shard-size", dest="shard_size", default=None, help="largest output file, e.g. 5GB (default)")
    m.add_argument("--mode", default=None, choices=["auto", "stream", "memory"],
                   help="auto (default): stream when the method allows; memory: load everything")
    m.add_argument("--heads", default=None, choices=["auto", "merge", "per-task", "drop"],
                   help="classifier heads (classifier.*, score.weight): auto (default: per-task for "
                        "*ForSequenceClassification experts, else merge), merge (like every key; same shapes only), "
                        "per-task (merge the backbone, write each expert's head to OUT/heads/NAME/), "
                        "drop (the backbone only)")
    m.add_argument("--names", nargs="+", default=None, metavar="NAME",
                   help="with --heads per-task: one head folder name per expert (default: the experts' folder names)")
    m.add_argument("--per-task-out", dest="per_task_out", default=None, metavar="DIR",
                   help="with --heads per-task: also write DIR/NAME/, one full model per task (merged backbone, "
                        "that task's head, config and tokenizer) that AutoModelForSequenceClassification."
                        "from_pretrained(DIR/NAME) loads")
    m.add_argument("--vocab", default=None, choices=["base", "union"],
                   help="experts with tokens the base lacks (added tokens): base (default: the base's vocabulary, "
                        "their extra rows left out) or union (every token kept, with a tokenizer that has them)")
    m.add_argument("--lowrank", default=None, choices=["auto", "never"],
                   help="LoRA adapter experts: auto (default) merges the keys every expert updates as a LoRA in the "
                        "span of their factors, no d_out x d_in task vector formed; never: from the folded task "
                        "vectors (docs/methods.md §Low-rank updates)")
    m.add_argument("--overwrite", action="store_true", help="replace the weights of an earlier merge in --out")
    m.add_argument("--force", action="store_true",
                   help="merge even when the base does not look like the experts' parent: unrelated (relative update "
                        "size and task-vector cosines on a sample of matrices), swapped (another model given is more "
                        "central) or contradicted by a config's _name_or_path (docs/your-models.md)")
    m.add_argument("--search", default=None, metavar="FILE.py:FUNCTION",
                   help="choose the method's coefficient (lambda, alpha, ACE's scaling) with your evaluation "
                        "FUNCTION(model_folder, task) -> score, by the library's search protocol")
    m.add_argument("--searcher", default="grid", choices=["grid", "tpe"],
                   help="with --search: grid (default: the method's one coefficient, its grid or golden section) "
                        "or tpe (Optuna's TPE over several hyperparameters, and the method with --method auto; "
                        "pip install 'acetools[search]')")
    m.add_argument("--trials", type=positive_int, default=None,
                   help="with --searcher tpe: evaluations (default 6 per method searched)")
    m.add_argument("--seed", type=nonnegative_int, default=0, help="with --searcher tpe: the sampler's seed")
    m.add_argument("--batch", type=positive_int, default=None, metavar="N",
                   help="with --searcher tpe: trials asked for and run together (default: as many as the executor "
                        "runs at once, 1 serially); a batch > 1 draws other trials than 1")
    _add_executor_options(m)
    m.add_argument("--dry-run", action="store_true", help="print the layout and the path of every key; write nothing")
    m.set_defaults(func=_cmd_merge)


#: ``acetools merge``'s options that a config file may set too, with their defaults.
_MERGE_DEFAULTS: dict[str, Any] = {"layout": "auto", "dtype": None, "device": "cpu", "shard_size": "5GB",
                                   "mode": "auto", "heads": "auto", "names": None, "vocab": None,
                                   "per_task_out": None, "lowrank": "auto"}


def _merge_config(args: argparse.Namespace) -> dict[str, Any]:
    """The merge's settings: the config file's, overridden by the options given."""
    from .files.merge_files import load_config, parse_hparam
    from .files.per_expert import per_expert_hparams

    cfg: dict[str, Any] = load_config(args.config) if args.config else {"hyperparameters": {}}
    if args.experts is not None and cfg.get("per_expert"):
        raise InputError(f"--experts replaces the experts of {args.config}, whose {' and '.join(cfg['per_expert'])} "
                         "would no longer match them; give them per expert with -p weights=[...] instead")
    for name in ("method", "base", "experts", "out", *_MERGE_DEFAULTS):
        if getattr(args, name) is not None:
            cfg[name] = getattr(args, name)
    if cfg.get("per_expert") and cfg.get("method"):  # the experts' weight/density (docs/your-models.md)
        cfg["hyperparameters"] = per_expert_hparams(cfg["method"], cfg.pop("per_expert"), cfg["hyperparameters"],
                                                    str(args.config))
    cfg["hyperparameters"].update(dict(parse_hparam(p) for p in args.param))
    for name in ("method", "base", "experts"):
        if not cfg.get(name):
            raise InputError(f"merge needs --{name} (or '{name}:' in a config file)")
    if args.lora_out is not None:
        cfg["lora_out"] = args.lora_out
    if args.lora_rank is not None:
        cfg["lora_rank"] = args.lora_rank
    if not cfg.get("out") and not cfg.get("lora_out") and not args.dry_run:
        raise InputError("merge needs --out (or 'out:' in a config file), or --dry-run")
    if args.search and cfg.get("lora_out"):
        raise InputError("--search writes the full model of the chosen coefficient; it cannot write --lora-out "
                         "(merge again with the chosen coefficient and --lora-out)")
    if args.search and args.dry_run:
        raise InputError("--search merges and evaluates; it cannot be combined with --dry-run")
    if cfg["method"] == "auto" and not (args.search and args.searcher == "tpe"):
        raise InputError("--method auto is chosen by your evaluation: add --search FILE.py:FUNCTION --searcher tpe")
    if (args.searcher != "grid" or args.trials is not None) and not args.search:
        raise InputError("--searcher and --trials choose how --search searches; add --search FILE.py:FUNCTION")
    if (args.executor != "serial" or args.batch is not None) and not args.search:
        raise InputError("--executor and --batch choose how --search runs its candidates; add --search "
                         "FILE.py:FUNCTION")
    return cfg


def _collapse_warnings(caught: list) -> None:
    """Re-emit ``caught`` warnings, one per kind: warnings that differ only in a quoted name and numbers
    (ESM's per-layer rank notes) become one, naming the other layers."""
    groups: dict[tuple, list[str]] = {}
    for w in caught:
        text = str(w.message)
        groups.setdefault((w.category, re.sub(r"\d+", "#", re.sub(r"'[^']*'", "'…'", text))), []).append(text)
    for (category, _), texts in groups.items():
        if len(texts) > 1:
            names = [m.group(1) for t in texts[1:] if (m := re.search(r"'([^']*)'", t))]
            texts[0] += f" [and {len(texts) - 1} more like it: {', '.join(names)}]"
        warnings.warn(texts[0], category, stacklevel=3)


def _cmd_merge(args: argparse.Namespace) -> int:
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            return _merge(args)
    finally:
        _collapse_warnings(caught)  # after the block: the warnings go where they would have gone


def _print_discarded(record: dict[str, Any]) -> None:
    """The energy an adapter of a chosen rank (``--lora-rank``) discards, per module and in total."""
    if "discarded_total" not in record:
        return
    for key, share in record["discarded"].items():
        print(f"  {key}: {100 * share:.2f} % of its merged update's energy discarded")
    print(f"rank {record['lora_rank']}: {100 * record['discarded_total']:.2f} % of the merged updates' energy "
          f"discarded in total ({len(record['discarded'])} modules)")


def _merge(args: argparse.Namespace) -> int:
    from .files.merge_files import merge_files
    from .files.staging import STAGE_MARK
    from .layouts import format_table

    cfg = _merge_config(args)
    options: dict[str, Any] = {k: cfg.get(k, default) for k, default in _MERGE_DEFAULTS.items()} | {"progress": None}
    options |= {k: getattr(args, k) or bool(cfg.get(k)) for k in ("overwrite", "force_layout", "force")}
    if args.search:  # search_merge checks the lineage once, before its candidates
        return _search_merge(args, cfg, options)
    try:
        res = merge_files(cfg["method"], cfg["base"], cfg["experts"], cfg.get("out"),
                          hparams=cfg["hyperparameters"], dry_run=args.dry_run, lora_out=cfg.get("lora_out"),
                          lora_rank=cfg.get("lora_rank"),
                          **options)
    except PermissionError as e:  # name the user's --out, not the hidden staging folder
        if STAGE_MARK not in str(e.filename or ""):
            raise
        raise PermissionError(e.errno, f"cannot write the merge output {cfg['out']} ({e.strerror})",
                              str(cfg["out"])) from None
    print(res.plan.summary())
    if args.dry_run:
        print(format_table(res.plan.rows))
        return 0
    assert res.out is not None, "merge_files wrote no folder outside a dry run"
    if cfg.get("lora_out"):
        print(f"wrote the merged LoRA adapter to {cfg['lora_out']}")
        _print_discarded(res.info["lora_record"])
    print(f"wrote {', '.join(f.name for f in res.files)} to {res.out} in {res.seconds:.1f} s")
    if res.info["heads"]["tasks"]:
        print(f"heads of {len(res.info['heads']['tasks'])} tasks in {res.out / 'heads'}: "
              f"{', '.join(res.info['heads']['tasks'])} (acetools.files.heads.load_with_head)")
    if res.info.get("per_task_out"):  # absent when only --lora-out is written
        print(f"one model per task (from_pretrained): {', '.join(res.info['per_task_out'])}")
    return 0


def _search_merge(args: argparse.Namespace, cfg: dict[str, Any], options: dict[str, Any]) -> int:
    """``acetools merge --search FILE.py:FUNCTION``: the coefficient chosen by the user's evaluation."""
    from .files.search_merge import load_evaluation, search_merge, searched

    evaluate = load_evaluation(args.search)
    if args.searcher == "tpe":
        return _tpe_search_merge(args, cfg, options, evaluate)
    param = searched(cfg["method"]).param
    print(f"searching {cfg['method']}'s {param} with {args.search}", flush=True)
    if args.batch is not None:
        raise InputError("--batch is a --searcher tpe option (the grid's candidates run --workers at a time)")
    found = search_merge(cfg["method"], cfg["base"], cfg["experts"], cfg["out"], evaluate,
                         hparams=cfg["hyperparameters"], report=lambda line: print(line, flush=True),
                         executor=_executor(args), **options)
    print(found.table())
    print(f"chosen {param}={found.value:g}; wrote {', '.join(f.name for f in found.merge.files)} to "
          f"{found.merge.out} (the search is in acetools_merge.json)")
    return 0


def _tpe_search_merge(args: argparse.Namespace, cfg: dict[str, Any], options: dict[str, Any], evaluate) -> int:
    """``acetools merge --search FILE.py:FUNCTION --searcher tpe``: hyperparameters (and with ``--method auto``
    the method) chosen by the user's evaluation (docs/your-models.md §Several hyperparameters at once: TPE)."""
    from .files.tpe_merge import tpe_search_merge

    print(f"searching {cfg['method']} with {args.search} (TPE, seed {args.seed})", flush=True)
    found = tpe_search_merge(cfg["method"], cfg["base"], cfg["experts"], cfg["out"], evaluate, trials=args.trials,
                             seed=args.seed, hparams=cfg["hyperparameters"],
                             report=lambda line: print(line, flush=True), executor=_executor(args),
                             batch=args.batch, **options)
    print(found.table())
    hp = ", ".join(f"{k}={v:g}" for k, v in found.hparams.items())
    print(f"chosen {found.method} {hp}; wrote {', '.join(f.name for f in found.merge.files)} to {found.merge.out} "
          "(the search is in acetools_merge.json)")
    return 0


def _add_regime(sub) -> None:
    rg = sub.add_parser("regime", help="measure a zoo's regime card (room for structured merges) beside CLIP's")
    _world_args(rg, one_seed=True)
    rg.add_argument("--n-val", type=positive_int, default=100, help="validation images per task (default 100)")
    rg.add_argument("--n-test", type=positive_int, default=500, help="test images per task (default 500)")
    rg.add_argument("--patience", type=positive_int, default=PATIENCE,
                    help=f"grid-search patience (default {PATIENCE})")
    rg.add_argument("--tau", type=float, default=None,
                    help="ACE's gate threshold on gamma (default: ACE's registered tau, the paper's)")
    rg.add_argument("--out", default=None,
                    help="folder for card.csv/json (default figures/regime/<suite>_<size>_seed<k>)")
    rg.set_defaults(func=_cmd_regime, no_mtl=True)  # the card needs no multi-task model


def _cmd_regime(args: argparse.Namespace) -> int:
    from .regime import regime_card

    _folder_for_output(args.out, "--out")
    zoo = _zoo(args, args.seed).build(progress=True)
    card = regime_card(zoo, n_val=args.n_val, n_test=args.n_test, patience=args.patience, tau=args.tau,
                       threads=args.threads, progress=True)
    out = Path(args.out) if args.out else Path("figures") / "regime" / f"{args.suite}_{args.size}_seed{args.seed}"
    paths = card.save(out)
    df = card.to_frame()[["label", "value", "clip", "unit"]]
    print(f"regime card: {args.suite} size={args.size} seed={args.seed} ({card.meta['seconds']:.0f} s)")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"written: {paths['card']} (+ per_task, per_layer, json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line: one ``_add_<name>`` per subcommand, each beside its ``_cmd_<name>`` handler."""
    ap = _Parser(prog="acetools", description="Data-free model merging: ACE, ESM and baselines.")
    _add_output_options(ap, top=True)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_demo, _add_zoo, _add_bench, _add_report, _add_diagnose, _add_merge, _add_regime):
        add(sub)
    return ap


# --------------------------------------------------------------------------- entry point

def configure_logging(quiet: bool = False, verbose: bool = False) -> logging.Handler:
    """Send the ``acetools`` loggers to stderr: INFO by default, WARNING with ``quiet``,
    DEBUG with ``verbose``; returns the handler. Only the command line calls this (and takes
    the handler off again when it returns); the library itself stays silent (a NullHandler)
    unless an application configures logging."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    logger = logging.getLogger("acetools")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s" if not verbose
                                           else "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 ``zoo build --check`` found
    something missing, 2 bad argument, 130 interrupted)."""
    parser = build_parser()
    _add_output_options_everywhere(parser)  # every subcommand, whoever added it
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # a bad argument (2, one line already printed) or --help (0)
        return stop.code if isinstance(stop.code, int) else 2
    logger = logging.getLogger("acetools")
    old_level = logger.level
    # main() may run inside a test or a notebook: the handler holds this call's stderr, which
    # may be closed afterwards, so it goes again when main() returns
    handler = configure_logging(quiet=args.quiet, verbose=args.verbose)
    old_progress = os.environ.get("ACETOOLS_PROGRESS")
    if args.quiet:  # no progress bars either (restored afterwards: main() may run inside a test or a notebook)
        os.environ["ACETOOLS_PROGRESS"] = "0"
    try:
        return args.func(args)
    except USER_ERRORS as err:  # CLIError among them
        if args.debug:
            raise
        print(f"acetools: error: {_message(err)} (run with --debug for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("acetools: interrupted", file=sys.stderr)
        return 130
    finally:
        if old_progress is None:
            os.environ.pop("ACETOOLS_PROGRESS", None)
        else:
            os.environ["ACETOOLS_PROGRESS"] = old_progress
        logger.removeHandler(handler)
        logger.setLevel(old_level)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
