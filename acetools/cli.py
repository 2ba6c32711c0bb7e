"""The ``acetools`` command line: ``demo``, ``zoo build``, ``bench``, ``regime`` and ``report``."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    df = run_demo(n_tasks=args.tasks, seed=args.seed, methods=args.methods, select=not args.defaults)
    print(f"Merging {args.tasks} linear-regression experts (seed {args.seed}); "
          "gain = 100*(L_base - L_merged)/(L_base - L_expert) on test data, 100 = expert level;\n"
          "coefficients chosen on validation data; ms = merge + search time.")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return 0


def _zoo(args: argparse.Namespace, seed: int):
    from .zoo import Zoo

    return Zoo(args.suite, size=args.size, seed=seed, root=args.root, mtl=not args.no_mtl, threads=args.threads)


def _cmd_zoo_build(args: argparse.Namespace) -> int:
    import pandas as pd

    if args.check:
        short = 0
        for seed in args.seeds:
            zoo = _zoo(args, seed)
            todo = zoo.missing()
            short += len(todo)
            what = ", ".join(f"{k}{'/' + t if t else ''}" for k, t in todo) or "nothing"
            print(f"zoo {args.suite} size={args.size} seed={seed}: {len(todo)} to build ({what}); cache {zoo.folder}")
        return 1 if short else 0
    for seed in args.seeds:
        zoo = _zoo(args, seed).build(progress=True)
        rows = [{"kind": r["kind"], "task": r["task"] or "", "seconds": r["seconds"],
                 **{k: v for k, v in (r["metrics"] or {}).items() if not isinstance(v, dict)}}
                for r in zoo.records()]
        print(f"zoo {args.suite} size={args.size} seed={seed}: built {len(zoo.built)}, loaded {len(zoo.loaded)} "
              f"(cache {zoo.folder})")
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .benchmark import ACE_SCALED, Benchmark, aggregate_seeds
    from .utils import atomic_write

    for seed in args.seeds:
        zoo = _zoo(args, seed).build(progress=True)
        bench = Benchmark(zoo, n_val=args.n_val, n_test=args.n_test, threads=args.threads, patience=args.patience)
        extra = {"ace (scaling on val)": {"method": "ace", "search": ACE_SCALED}} if args.ace_scaled else None
        runs = bench.run_all(args.methods, progress=True, extra=extra)
        stem = f"{args.suite}_{args.size}_seed{seed}"
        if args.out:
            bench.save(runs, Path(args.out), stem)
        df = bench.summary(runs).assign(seed=seed)
        print(f"\n{stem}")
        print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.out:
        agg = aggregate_seeds(args.out, args.suite, args.size)
        path = Path(args.out) / f"{args.suite}_{args.size}_seeds.csv"
        with atomic_write(path, "w") as fh:
            agg.to_csv(fh, index=False)
        print(f"\n{args.suite} ({args.size}) over every seed in {args.out}: {path}")
        print(agg.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .course.report import notebook_paths, parse_parameter, run_report

    if args.list:
        for p in notebook_paths(args.notebooks):
            print(p.stem)
        return 0
    params = dict(parse_parameter(p) for p in args.parameter)

    def show(rec):
        print(f"{rec['notebook']:<24} {rec['seconds']:>7.1f} s  {rec.get('html', rec['executed'])}", flush=True)

    recs = run_report(args.profile, only=args.only, parameters=params, out=args.out, figures=args.figures,
                      notebooks=args.notebooks, html=not args.no_html, timeout=args.cell_timeout,
                      start_timeout=args.start_timeout, on_result=show)
    print(f"{len(recs)} notebook(s) ran in {sum(r['seconds'] for r in recs):.0f} s ({args.profile} profile)")
    return 0


def _cmd_regime(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .regime import regime_card
    from .zoo import Zoo

    zoo = Zoo(args.suite, size=args.size, seed=args.seed, root=args.root, mtl=False, threads=args.threads)
    zoo.build(progress=True)
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
    ap = argparse.ArgumentParser(prog="acetools", description="Data-free model merging: ACE, ESM and baselines.")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="merge small generated experts with every method and print a table")
    d.add_argument("--tasks", type=int, default=6, help="number of experts (default 6)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--methods", nargs="+", default=None, help="methods to run (default: all)")
    d.add_argument("--defaults", action="store_true", help="keep default coefficients (no validation search)")
    d.set_defaults(func=_cmd_demo)

    def world_args(p):
        p.add_argument("--suite", default="tasks8", help="task suite (tasks8, tasks14, tasks20, ...)")
        p.add_argument("--size", default="small", help="model size: micro, tiny, small")
        p.add_argument("--seeds", type=int, nargs="+", default=[0], help="expert fine-tuning seeds")
        p.add_argument("--root", default=None, help="cache folder (default $ACETOOLS_CACHE or ~/.cache/acetools)")
        p.add_argument("--no-mtl", action="store_true", help="skip the multi-task reference model")
        p.add_argument("--threads", type=int, default=None, help="CPU threads for training/evaluation")

    z = sub.add_parser("zoo", help="build the mini-world's base, heads and experts")
    zsub = z.add_subparsers(dest="zoo_command", required=True)
    zb = zsub.add_parser("build", help="build (or load from the cache) a suite's zoo")
    world_args(zb)
    zb.add_argument("--check", action="store_true",
                    help="build nothing: list what is missing from the cache (exit 1 if anything is)")
    zb.set_defaults(func=_cmd_zoo_build)

    b = sub.add_parser("bench", help="merge a zoo with methods, select coefficients on val, report test")
    world_args(b)
    b.add_argument("--methods", nargs="+", default=None, help="methods (default: all registered)")
    b.add_argument("--n-val", type=int, default=None, help="validation images per task for the search")
    b.add_argument("--n-test", type=int, default=None, help="test images per task")
    b.add_argument("--patience", type=int, default=None,
                   help="stop a grid search after this many points without improvement (default: whole grid)")
    b.add_argument("--ace-scaled", action="store_true", help="also run ACE with its scaling chosen on val")
    b.add_argument("--out", default=None, help="folder for CSV/JSON results (e.g. figures/benchmark)")
    b.set_defaults(func=_cmd_bench)

    g = sub.add_parser("regime", help="measure a zoo's regime card (room for structured merges) beside CLIP's")
    g.add_argument("--suite", default="tasks8", help="task suite (tasks8, tasks14, tasks20, ...)")
    g.add_argument("--size", default="small", help="model size: micro, tiny, small, wide")
    g.add_argument("--seed", type=int, default=0, help="expert fine-tuning seed")
    g.add_argument("--root", default=None, help="cache folder (default $ACETOOLS_CACHE or ~/.cache/acetools)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads for training/evaluation")
    g.add_argument("--n-val", type=int, default=100, help="validation images per task for the searches (default 100)")
    g.add_argument("--n-test", type=int, default=500, help="test images per task (default 500)")
    g.add_argument("--patience", type=int, default=3, help="grid-search patience (default 3)")
    g.add_argument("--tau", type=float, default=0.3, help="ACE's gate threshold on gamma (default 0.3, the paper's)")
    g.add_argument("--out", default=None, help="folder for card.csv/json (default figures/regime/<suite>_<size>_seed<k>)")
    g.set_defaults(func=_cmd_regime)

    r = sub.add_parser("report", help="run the course notebooks with papermill and render HTML reports")
    r.add_argument("--profile", choices=["quick", "full"], default="quick",
                   help="quick: fixture world, minutes (CI); full: the mini-world at its default size")
    r.add_argument("--only", nargs="+", default=None, help="notebooks to run (stem, number or name)")
    r.add_argument("-p", "--parameter", action="append", default=[], metavar="KEY=VALUE",
                   help="set a notebook parameter (repeatable); unknown names are an error")
    r.add_argument("--out", default=None, help="build folder (default build/report/<profile>)")
    r.add_argument("--figures", default=None, help="figure root (default figures/ for full, <out>/figures for quick)")
    r.add_argument("--notebooks", default=None, help="notebooks folder (default the repository's notebooks/)")
    r.add_argument("--no-html", action="store_true", help="skip the HTML rendering")
    r.add_argument("--cell-timeout", type=int, default=None, metavar="S",
                   help="fail a notebook when one cell runs longer than S seconds (default: no limit)")
    r.add_argument("--start-timeout", type=int, default=300, metavar="S",
                   help="seconds to wait for a notebook kernel to start (default 300)")
    r.add_argument("--list", action="store_true", help="list the notebooks and exit")
    r.set_defaults(func=_cmd_report)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
