"""The speed-up of ``--executor ray`` over ``serial`` on this machine (docs/performance.md §Executors).

Two cases, each run serially, on a local Ray cluster of 2 workers and on one of 1 worker (Ray's overhead),
every job with 1 torch thread (``Executor(threads=1)``), so the comparison is of parallelism alone:

- ``search``: ``acetools merge --search`` (:func:`acetools.files.search_merge.search_merge`, the grid with
  early stopping) of ``--method`` on the text world's quick profile (the 3-expert MiniLM fixture of
  benchmarks/tpe_search.py, written to safetensors files), the evaluation hook scoring a candidate's merged
  weights on each task's validation set (``--n-val`` texts) with the world's trained heads;
- ``bench``: ``acetools bench``'s rows (:meth:`acetools.benchmark.Benchmark.run_all`, ``--methods``) on the
  micro vision zoo (the ``tiny`` suite, built into ``--root`` once, before any timing) for each of ``--seeds``.

Each case runs ``--repeat`` times on each cluster (the first run includes Ray starting its worker processes,
which import torch and acetools; a later one finds them running). Per run: the wall time of the case (Ray's
start-up, ``ray.init``, timed apart: the first run's wall is given without and with it), the CPU seconds of
this process and every process it started (Ray's GCS, raylet and workers; psutil over the process tree), the
CPU utilisation (CPU s / wall / cores) and the speed-up (serial wall / Ray wall, run for run). A Ray run's
results are checked against the serial run's: the chosen merge's weights bit for bit and the same trace
(search); the same coefficients, scores and per-example correctness (bench).

    python3 benchmarks/executor_speed.py             # the table of docs/performance.md
    python3 benchmarks/executor_speed.py --quick     # a small run that shows the script works (tests)

Results: benchmarks/results/executor_speed/runs.csv and meta.json (machine, load averages, versions).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acetools.search import PATIENCE

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "executor_speed"

#: The runs: (name, executor kind, Ray workers).
CONFIGS: dict[str, tuple[str, int | None]] = {"serial": ("serial", None), "ray-2": ("ray", 2), "ray-1": ("ray", 1)}

#: The evaluation hook of the ``search`` case, written beside the checkpoints: mean validation accuracy of the
#: merged weights with the task's trained head. The world is loaded once per process (the driver, or a Ray
#: worker) and kept in a process-wide module, as a user's hook keeps its validation data.
HOOK = '''
import sys
import types

from safetensors.torch import load_file

ROOT = {root!r}
N_VAL = {n_val!r}


def _world():
    cache = sys.modules.setdefault("_executor_speed_world", types.ModuleType("_executor_speed_world"))
    if not hasattr(cache, "world"):
        from acetools.world.text.world import TextWorld

        cache.world = TextWorld("fixture", seed=0, profile="quick", root=ROOT, threads=1).build(progress_bar=False)
    return cache.world


def evaluate(model, task):
    state = load_file(f"{{model}}/{file}")
    return float(_world().correctness(state, "val", n=N_VAL, tasks=[task])[task].mean())
'''


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["search", "bench"], choices=["search", "bench"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--method", default="iso_c", help="the search case's method (iso_c: 11 candidates here)")
    ap.add_argument("--patience", type=int, default=PATIENCE, help="the search's early stop (candidates past the "
                                                                   "best; default the CLI's, %(default)s)")
    ap.add_argument("--n-val", type=int, default=None, help="validation texts per task in the search (default all)")
    ap.add_argument("--methods", nargs="+", default=["weight_averaging", "task_arithmetic", "ties", "tsv_m"],
                    help="the bench case's rows")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="the bench case's zoo seeds")
    ap.add_argument("--root", default=None, help="the cache folder (default $ACETOOLS_CACHE or ~/.cache/acetools)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each case on each cluster: the first includes "
                                                          "Ray's worker processes starting, a later one not")
    ap.add_argument("--quick", action="store_true", help="a small run: serial and ray-2 once, 1 candidate past the "
                                                         "best, 2 rows of one seed, 10 validation texts")
    ap.add_argument("--out", default=str(OUT))
    return ap


# --------------------------------------------------------------------------- measuring

def cpu_seconds(baseline: dict[int, float] | None = None) -> tuple[float, dict[int, float]]:
    """CPU seconds (user + system) this process and every process under it spent since ``baseline`` (a
    process started since counts whole), and the new baseline."""
    import psutil

    me = psutil.Process()
    now: dict[int, float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            now[p.pid] = t.user + t.system
        except psutil.Error:  # it ended in between
            continue
    base = baseline or {}
    return sum(v - base.get(pid, 0.0) for pid, v in now.items()), now


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its wall seconds and the CPU seconds of the process tree."""
    _, before = cpu_seconds()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    cpu, _ = cpu_seconds(before)
    return out, wall, cpu


def start_ray(workers: int, tries: int = 5) -> float:
    """A local Ray cluster of ``workers`` CPUs; the seconds ``ray.init`` took (a try that timed out during
    start-up, as Ray's agents can on a loaded machine, is made again and counted)."""
    import ray

    t0 = time.perf_counter()
    for i in range(tries):
        try:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            break
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            if "timed out during startup" not in str(e) or i == tries - 1:
                raise
            ray.shutdown()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- the cases

def search_files(work: Path, root: str | None, n_val: int | None) -> tuple[Path, list[Path], str]:
    """The text world's quick profile as checkpoint files (the merged part of the base and of each expert) in
    ``work``, and the evaluation hook's ``file:function``."""
    from safetensors.torch import save_file

    from acetools.world.text.world import TextWorld

    world = TextWorld("fixture", seed=0, profile="quick", root=root, threads=1).build(progress_bar=False)
    base = work / "base.safetensors"
    save_file({k: v.contiguous() for k, v in world.base_state().items()}, str(base))
    experts = []
    for t in world.tasks:
        experts.append(work / f"{t}.safetensors")
        save_file({k: v.contiguous() for k, v in world.expert_state(t).items()}, str(experts[-1]))
    hook = work / "hook.py"
    hook.write_text(HOOK.format(root=str(world.root), n_val=n_val, file="model.safetensors"))
    return base, experts, f"{hook}:evaluate"


def run_search(executor, work: Path, files: tuple, method: str, patience: int, tag: str):
    from acetools.files.search_merge import load_evaluation, search_merge

    base, experts, spec = files
    return search_merge(method, base, experts, work / f"merged-{tag}", load_evaluation(spec), patience=patience,
                        executor=executor)


def same_search(a, b, folder_a: Path, folder_b: Path) -> bool:
    """The same trace and the chosen merge's weights equal bit for bit."""
    import torch
    from safetensors.torch import load_file

    if a.record()["trace"] != b.record()["trace"]:
        return False
    wa, wb = load_file(str(folder_a / "model.safetensors")), load_file(str(folder_b / "model.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def zoo_source(seed: int, root: str | None) -> Callable[..., Any]:
    """``acetools bench --suite tiny --size micro --no-mtl --threads 1``'s world source for ``seed``."""
    from acetools.cli import _built_world

    zoo = {"tasks": "tiny", "size": "micro", "seed": seed, "root": root, "mtl": False, "threads": 1}
    return functools.partial(_built_world, "vision", "tiny", seed, {"root": root}, zoo)


def run_bench(executor, sources: dict[int, Callable[..., Any]], methods: list[str], store: Path) -> dict:
    from acetools.benchmark import Benchmark

    rows = {}
    for seed, source in sources.items():
        bench = Benchmark(source(), threads=1, source=source)
        rows[seed] = bench.run_all(methods, references=False, progress=False, store=store / f"seed{seed}",
                                   executor=executor)
    return rows


def same_rows(a: dict, b: dict) -> bool:
    import numpy as np

    for seed in a:
        for x, y in zip(a[seed], b[seed], strict=True):
            if (x.name, x.coef, x.val, x.test) != (y.name, y.coef, y.val, y.test):
                return False
            if not all(np.array_equal(x.test_correct[t], y.test_correct[t]) for t in x.test_correct):
                return False
    return True


# --------------------------------------------------------------------------- main

def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    import pandas as pd
    import torch

    from acetools.benchmark import package_versions
    from acetools.executor import Executor
    from acetools.utils import atomic_write

    args = _parser().parse_args(argv)
    if args.quick:
        args.configs = [c for c in args.configs if c != "ray-1"]
        args.patience, args.n_val, args.methods, args.seeds, args.repeat = 1, 10, args.methods[:2], args.seeds[:1], 1
    if any(CONFIGS[c][0] == "ray" for c in args.configs):
        import ray  # noqa: F401 - fail before any work without Ray
    torch.set_num_threads(1)
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="executor_speed-"))
    rows: list[dict] = []
    try:
        prepared: dict[str, Any] = {}
        t0 = time.perf_counter()
        if "search" in args.cases:
            prepared["search"] = search_files(work, args.root, args.n_val)
        if "bench" in args.cases:
            prepared["bench"] = {s: zoo_source(s, args.root) for s in args.seeds}
            for source in prepared["bench"].values():
                source(progress=False)  # built into the cache now, not inside a timed run
        print(f"inputs ready in {time.perf_counter() - t0:.0f} s; load average {load_before[0]:.2f}", flush=True)
        results: dict[tuple[str, str], Any] = {}
        for config in args.configs:
            kind, workers = CONFIGS[config]
            startup = start_ray(workers or 1) if kind == "ray" else 0.0
            executor = Executor(kind, workers=workers, threads=1)
            try:
                for run, case in itertools.product(range(1, args.repeat + 1), args.cases):
                    case, tag = str(case), f"{config}-{run}"
                    if case == "search":
                        go = functools.partial(run_search, executor, work, prepared["search"], args.method,
                                               args.patience, tag)
                    else:
                        go = functools.partial(run_bench, executor, prepared["bench"], args.methods,
                                               work / f"store-{tag}")
                    out, wall, cpu = timed(go)
                    results[case, tag] = out
                    jobs = len(out.result.trace) if case == "search" else sum(len(r) for r in out.values())
                    rows.append({"case": case, "config": config, "run": run, "executor": kind,
                                 "workers": workers or 1, "jobs": jobs, "wall_s": wall, "startup_s": startup,
                                 "wall_with_startup_s": wall + (startup if run == 1 else 0.0), "cpu_s": cpu,
                                 "cpu_util": cpu / wall / cores})
                    print(f"{case} {config} run {run}: {jobs} jobs, {wall:.1f} s wall (+{startup:.1f} s start-up), "
                          f"{cpu:.1f} CPU s", flush=True)
            finally:
                if kind == "ray":
                    import ray

                    ray.shutdown()
        for row in rows:
            case, run, tag = row["case"], row["run"], f"{row['config']}-{row['run']}"
            serial = next((r for r in rows if (r["case"], r["run"], r["config"]) == (case, run, "serial")), None)
            row["speedup"] = serial["wall_s"] / row["wall_s"] if serial else float("nan")
            row["speedup_with_startup"] = serial["wall_s"] / row["wall_with_startup_s"] if serial else float("nan")
            if serial is None or row["config"] == "serial":
                row["identical"] = None
            elif case == "search":
                row["identical"] = same_search(results[case, f"serial-{run}"], results[case, tag],
                                               work / f"merged-serial-{run}", work / f"merged-{tag}")
            else:
                row["identical"] = same_rows(results[case, f"serial-{run}"], results[case, tag])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    df = pd.DataFrame(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "runs.csv", "w") as fh:
        df.to_csv(fh, index=False)
    meta = {"argv": sys.argv[1:] if argv is None else argv, "quick": args.quick, "cores": cores,
            "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine()},
            "load_before": load_before, "load_after": load_after, "search": {"method": args.method, "patience":
            args.patience, "n_val": args.n_val, "world": "text fixture (quick profile), seed 0"},
            "bench": {"methods": args.methods, "seeds": args.seeds, "world": "vision tiny suite, micro size"},
            "versions": {**package_versions(), "ray": _version("ray"), "psutil": _version("psutil")}}
    with atomic_write(out / "meta.json", "w") as fh:
        json.dump(meta, fh, indent=1)
    cols = ["case", "config", "run", "jobs", "wall_s", "startup_s", "wall_with_startup_s", "cpu_s", "cpu_util",
            "speedup", "speedup_with_startup", "identical"]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; {cores} cores; saved {out}")
    return 0 if all(r["identical"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
