"""Peak memory and time of ``acetools merge`` on files: streamed vs a plain loop vs in memory vs mergekit.

T experts (default 8) in the shapes of open_clip ViT-B/32's visual tower (87.8 M parameters,
351 MB in float32 per model) are written to disk as safetensors (random: base ~ N(0, 0.02^2),
experts = base + N(0, 0.001^2)); then every measurement runs in its own fresh subprocess, so
its peak resident memory (``ru_maxrss``) is its own:

- ``stream``: :func:`acetools.files.merge_files.merge_files` with ``mode="stream"`` (what
  ``acetools merge`` does for these methods), files read one tensor at a time;
- ``plain``: the I/O floor, a plain loop over the same files: ``safetensors.safe_open`` per
  file, the method's arithmetic per key (task arithmetic; TIES per tensor with the stage
  functions of :mod:`acetools.merging.ties`; DARE with the same masks), ``save_file`` at the
  end; no checks, no hashing, no layout. ``stream / plain`` is the ratio the project keeps
  within 1.5x (both measured in the same run, back to back);
- ``memory``: the same call with ``mode="memory"`` (load every model, :func:`acetools.merge`);
- ``mergekit``: mergekit's own merge functions (``mergekit.merge_methods.api.merge_tensors``,
  task arithmetic and per-tensor TIES) called key by key on the same lazily read files and
  written the same way (its ``mergekit-yaml`` command is timed instead when it runs here).

Every acetools run includes reading, hashing the inputs (sha256, as the CLI does), merging and
writing the output; ``idle`` is the resident memory of the same subprocess after importing torch and
acetools, so ``peak - idle`` is what the merge itself held. The streamed and in-memory outputs
are compared for bitwise equality.

    python benchmarks/merge_files.py                      # T=8, ta ties tsv_m ace, ~30 min on 1 core
    python benchmarks/merge_files.py --quick              # 1 block, T=3: a smoke run
    python benchmarks/merge_files.py --only "ties (global)" "ties (tensor)" --blocks 2 \
        --out benchmarks/results/merge_files_ties          # streamed global vs per-tensor TIES (~1 min)
    python benchmarks/merge_files.py --floor --blocks 4 --repeats 3   # stream vs plain loop, TA/TIES/DARE
    python benchmarks/merge_files.py --floor --acetools /path/to/older/checkout --out /tmp/before
                                                          # the same rows with another checkout's acetools

The README line "streamed global TIES / per-tensor TIES" is the ratio the project keeps within 2x
(global TIES reads every file four times; each key's finiteness is checked on the first read only).

Results: benchmarks/results/merge_files/{results.json,results.csv,README.md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shapes import vit_b32_visual_shapes  # benchmarks/_shapes.py, beside this script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WIDTH = 768

# (label, method, driver, hyperparameters); mergekit's TIES is per tensor, so ours is run that way too
RUNS = [
    ("task_arithmetic", "task_arithmetic", "plain", {"lam": 0.3}),
    ("task_arithmetic", "task_arithmetic", "stream", {"lam": 0.3}),
    ("task_arithmetic", "task_arithmetic", "stream, no hash", {"lam": 0.3}),
    ("task_arithmetic", "task_arithmetic", "memory", {"lam": 0.3}),
    ("task_arithmetic", "task_arithmetic", "mergekit", {"lam": 0.3}),
    ("ties (global)", "ties", "stream", {"k": 20}),
    ("ties (global)", "ties", "memory", {"k": 20}),
    ("ties (tensor)", "ties", "plain", {"k": 20, "scope": "tensor"}),
    ("ties (tensor)", "ties", "stream", {"k": 20, "scope": "tensor"}),
    ("ties (tensor)", "ties", "mergekit", {"k": 20, "scope": "tensor"}),
    ("dare", "dare", "plain", {"p": 0.5, "lam": 0.3}),
    ("dare", "dare", "stream", {"p": 0.5, "lam": 0.3}),
    ("tsv_m", "tsv_m", "stream", {}),
    ("tsv_m", "tsv_m", "memory", {}),
    ("ace", "ace", "stream", {}),
    ("ace", "ace", "memory", {}),
]


def write_world(work: Path, n_tasks: int, blocks: int, width: int, seed: int = 0) -> dict:
    """Base and experts as safetensors files, written one tensor at a time."""
    import torch

    from acetools.files.checkpoints import ShardedWriter

    shapes = vit_b32_visual_shapes(blocks, width)
    for i, name in enumerate(["base"] + [f"expert{t}" for t in range(n_tasks)]):
        with ShardedWriter(work / name, shard_size="100GB") as w:
            for j, (k, s) in enumerate(shapes.items()):
                g = torch.Generator().manual_seed(seed * 100_003 + j)  # the base, the same in every file
                W0 = 0.02 * torch.randn(s, generator=g)
                if i:
                    W0 += 1e-3 * torch.randn(s, generator=torch.Generator().manual_seed(seed * 7919 + i * 1009 + j))
                w.add(k, W0)
    n = sum(_numel(s) for s in shapes.values())
    return {"params": n, "model_bytes": 4 * n, "tensors": len(shapes)}


def _numel(s):
    n = 1
    for x in s:
        n *= x
    return n


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _mergekit_stream(method: str, hp: dict, base: Path, experts: list[Path], out: Path) -> None:
    """mergekit's merge functions key by key over lazily read files, written like ours."""
    import torch
    from mergekit.merge_methods.api import merge_tensors

    from acetools.files.checkpoints import ShardedWriter, open_checkpoint

    b = open_checkpoint(base)
    ex = [open_checkpoint(e) for e in experts]
    for ck in [b, *ex]:
        ck.sha256()
    if method == "task_arithmetic":
        name, params = "task_arithmetic", {"weight": 1.0, "lambda": hp["lam"]}
    else:
        name, params = "ties", {"weight": 1.0, "density": hp["k"] / 100, "lambda": 1.0}
    with ShardedWriter(out, shard_size="5GB") as w:
        for k in b.keys():
            ts = [b.get(k)] + [e.get(k) for e in ex]
            w.add(k, merge_tensors(ts, name, base_index=0, parameters=params).to(torch.float32))


#: The rows of ``--floor``: each method's plain loop and stream, back to back.
FLOOR = ("task_arithmetic", "ties (tensor)", "dare")


def _tag(label: str, driver: str) -> str:
    return f"{label}-{driver}".replace(" ", "").replace(",", "-").replace("(", "-").replace(")", "")


def _plain(method: str, hp: dict, base: Path, experts: list[Path], out: Path) -> None:
    """The I/O floor: safe_open, the method's arithmetic per key, save_file (see the module docstring)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from acetools.merging.ties import dare_mask, disjoint_merge, elect_sign, resolve_zero_signs, trim_threshold

    files = [safe_open(str(p / "model.safetensors"), "pt") for p in [base, *experts]]
    merged = {}
    for key in files[0].keys():
        w0 = files[0].get_tensor(key)
        taus = [f.get_tensor(key) - w0 for f in files[1:]]
        if method == "ties":
            trimmed = torch.stack([torch.where(t.abs() >= trim_threshold(t, hp["k"]), t, 0) for t in taus])
            gamma = elect_sign(trimmed)
            gamma = resolve_zero_signs(gamma, int(torch.sign(gamma.sum())))
            update = disjoint_merge(trimmed, gamma, "mean")
        else:
            if method == "dare":
                taus = [torch.where(dare_mask(t.shape, hp["p"], 0, i, key), 0, t) / (1 - hp["p"])
                        for i, t in enumerate(taus)]
            update = taus[0]
            for t in taus[1:]:
                update = update + t
            update = hp["lam"] * update
        merged[key] = w0 + update
    out.mkdir(parents=True, exist_ok=True)
    save_file(merged, str(out / "model.safetensors"))


def child(args) -> None:
    """One measurement, in this process: prints a JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    import acetools  # noqa: F401
    from acetools.files.merge_files import merge_files

    idle = _peak_rss()
    work = Path(args.work)
    base, experts = work / "base", [work / f"expert{t}" for t in range(args.tasks)]
    out = work / f"out-{args.label}"
    shutil.rmtree(out, ignore_errors=True)
    hp = json.loads(args.hp)
    t0 = time.perf_counter()
    how = args.driver
    if args.driver == "plain":
        how = "safe_open + save_file loop"
        _plain(args.method, hp, base, experts, out)
    elif args.driver == "mergekit":
        if shutil.which("mergekit-yaml") and _mergekit_cli_runs():
            how = "mergekit-yaml"
            _mergekit_yaml(args.method, hp, base, experts, out)
        else:
            how = "mergekit merge_tensors (mergekit-yaml does not run here)"
            _mergekit_stream(args.method, hp, base, experts, out)
    elif args.driver == "stream, no hash":  # what the hashing of the inputs costs
        merge_files(args.method, base, experts, out, hparams=hp, mode="stream", progress=False, hash_inputs=False)
    else:
        merge_files(args.method, base, experts, out, hparams=hp, mode=args.driver, progress=False)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak_rss": _peak_rss(), "idle_rss": idle, "how": how}))


def _mergekit_cli_runs() -> bool:
    r = subprocess.run(["mergekit-yaml", "--help"], capture_output=True, text=True)
    return r.returncode == 0


def _mergekit_yaml(method, hp, base, experts, out):  # pragma: no cover - only where mergekit's CLI runs
    import yaml

    params = {"weight": 1.0} if method == "task_arithmetic" else {"weight": 1.0, "density": hp["k"] / 100}
    cfg = {"merge_method": method, "base_model": str(base), "dtype": "float32",
           "models": [{"model": str(e), "parameters": params} for e in experts],
           "parameters": {"lambda": hp.get("lam", 1.0)}}
    conf = out.parent / f"{out.name}.yml"
    conf.write_text(yaml.safe_dump(cfg))
    subprocess.run(["mergekit-yaml", str(conf), str(out), "--lazy-unpickle"], check=True)


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip()


def _max_diff(a: Path, b: Path) -> float:
    from acetools.files.checkpoints import open_checkpoint

    x, y = open_checkpoint(a), open_checkpoint(b)
    return max(float((x.get(k).double() - y.get(k).double()).abs().max()) for k in x.keys())


def _equal(a: Path, b: Path) -> bool:
    import torch

    from acetools.files.checkpoints import open_checkpoint

    x, y = open_checkpoint(a), open_checkpoint(b)
    return x.keys() == y.keys() and all(torch.equal(x.get(k), y.get(k)) for k in x.keys())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--width", type=int, default=WIDTH)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    ap.add_argument("--only", nargs="+", default=None, help="labels/methods to run (default all)")
    ap.add_argument("--work", default=None, help="folder for the files (default a temp dir, removed after)")
    ap.add_argument("--out", default=str(HERE / "results" / "merge_files"))
    ap.add_argument("--quick", action="store_true", help="1 block, width 64, T=3: a smoke run")
    ap.add_argument("--floor", action="store_true", help="only the plain-loop and streamed rows of " + ", ".join(FLOOR))
    ap.add_argument("--drivers", nargs="+", default=None, help="only these drivers (plain, stream, memory, mergekit)")
    ap.add_argument("--reuse", action="store_true", help="reuse the files an earlier run wrote to --work")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each row (the fastest is reported; default 1)")
    ap.add_argument("--acetools", default=str(ROOT),
                    help="the checkout whose acetools the rows import (default this one)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    ap.add_argument("--method", default="", help=argparse.SUPPRESS)
    ap.add_argument("--driver", default="", help=argparse.SUPPRESS)
    ap.add_argument("--hp", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        args.tasks, args.blocks, args.width = 3, 1, 64
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="acetools-merge-files-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(Path(args.acetools).resolve()),
               ACETOOLS_PROGRESS="0")
    if args.floor:
        args.only = list(FLOOR)
    try:
        t0 = time.perf_counter()
        if args.reuse and (work / "world.json").is_file():  # the files of an earlier run with the same --work
            world = json.loads((work / "world.json").read_text())
        else:
            world = write_world(work, args.tasks, args.blocks, args.width)
            (work / "world.json").write_text(json.dumps(world))
        world["write_seconds"] = time.perf_counter() - t0
        print(f"wrote base + {args.tasks} experts ({world['params'] / 1e6:.1f} M params, "
              f"{world['model_bytes'] / 1e6:.0f} MB each) in {world['write_seconds']:.0f} s to {work}", flush=True)
        selected = [run for run in RUNS if not args.only or run[0] in args.only or run[1] in args.only]
        if args.floor:
            selected = [run for run in selected if run[2] in ("plain", "stream", "stream, no hash", "mergekit")]
        if args.drivers:
            selected = [run for run in selected if run[2] in args.drivers]
        best: dict[str, dict] = {}
        errors: dict[str, dict] = {}
        for _ in range(args.repeats):  # round robin, so that a busy spell of the machine hits every row alike
            for label, method, driver, hp in selected:
                tag = _tag(label, driver)
                cmd = [sys.executable, __file__, "--child", "--label", tag, "--method", method, "--driver", driver,
                       "--hp", json.dumps(hp), "--work", str(work), "--tasks", str(args.tasks),
                       "--threads", str(args.threads)]
                r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
                if r.returncode != 0:
                    print(f"{tag}: FAILED\n{r.stderr[-3000:]}", flush=True)
                    errors[tag] = {"method": label, "driver": driver, "error": r.stderr.strip().splitlines()[-1]}
                    continue
                res = json.loads(r.stdout.strip().splitlines()[-1])
                row = {"method": label, "driver": driver, "hparams": hp, "seconds": round(res["seconds"], 2),
                       "peak_rss_mb": round(res["peak_rss"] / 1e6), "idle_rss_mb": round(res["idle_rss"] / 1e6),
                       "held_mb": round((res["peak_rss"] - res["idle_rss"]) / 1e6),
                       "held_models": round((res["peak_rss"] - res["idle_rss"]) / world["model_bytes"], 2),
                       "how": res["how"], "out": tag, "all_seconds": [round(res["seconds"], 2)]}
                print(f"{label:16s} {driver:9s} {row['seconds']:8.1f} s  peak {row['peak_rss_mb']:6d} MB  "
                      f"held {row['held_mb']:6d} MB = {row['held_models']:5.2f} models", flush=True)
                old = best.get(tag)
                if old is not None:
                    row["all_seconds"] = old["all_seconds"] + row["all_seconds"]
                    row["held_mb"] = max(row["held_mb"], old["held_mb"])
                    row["held_models"] = max(row["held_models"], old["held_models"])
                    row["peak_rss_mb"] = max(row["peak_rss_mb"], old["peak_rss_mb"])
                    row["seconds"] = min(row["seconds"], old["seconds"])
                best[tag] = row
        rows = [best.get(t) or errors[t] for t in dict.fromkeys(
            _tag(label, driver) for label, _, driver, _ in selected) if t in best or t in errors]
        # streamed == in memory, bitwise
        by = {(r["method"], r["driver"]): r for r in rows if "error" not in r}
        for (label, driver), r in by.items():
            if driver == "stream" and (label, "memory") in by:
                r["equal_to_memory"] = _equal(work / f"out-{r['out']}", work / f"out-{by[(label, 'memory')]['out']}")
        floor = {}
        for (label, driver), r in by.items():
            plain = by.get((label, "plain"))
            if plain and driver != "plain":
                r["over_plain"] = round(r["seconds"] / plain["seconds"], 2)
                r["max_abs_diff_to_plain"] = _max_diff(work / f"out-{r['out']}", work / f"out-{plain['out']}")
                floor[f"{label} {driver} / plain"] = r["over_plain"]
        meta = {"over_plain": floor, "repeats": args.repeats, "acetools_from": str(Path(args.acetools).resolve()),
                "tasks": args.tasks, "blocks": args.blocks, "width": args.width, "threads": args.threads, **world,
                "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                "torch": __import__("torch").__version__, "commit": _commit(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "note": "shared 2-core machine with other jobs running: times are indicative; memory is exact"}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        import csv

        cols = ["method", "driver", "seconds", "peak_rss_mb", "idle_rss_mb", "held_mb", "held_models",
                "over_plain", "equal_to_memory", "how"]
        with open(out / "results.csv", "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
            wr.writeheader()
            wr.writerows(rows)
        lines = [f"# acetools merge on files: T = {args.tasks}, ViT-B/32 visual tower shapes",
                 "", f"{world['params'] / 1e6:.1f} M parameters, {world['model_bytes'] / 1e6:.0f} MB per model "
                 f"(float32); {args.threads} torch thread(s); {meta['date']}; {meta['note']}.", "",
                 "| method | driver | time (s) | peak RSS (MB) | held above idle (MB) | held / one model | "
                 "time / plain loop | stream == memory |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['method']} | {r['driver']} | failed: {r['error']} | | | | | |")
                continue
            eq = {True: "yes", False: "NO"}.get(r.get("equal_to_memory"), "")
            ratio = f"{r['over_plain']:.2f}" if "over_plain" in r else ""
            lines.append(f"| {r['method']} | {r['driver']} | {r['seconds']:.1f} | {r['peak_rss_mb']} | "
                         f"{r['held_mb']} | {r['held_models']:.2f} | {ratio} | {eq} |")
        lines += ["", "mergekit rows: " + "; ".join(sorted({r['how'] for r in rows if r.get('driver') == 'mergekit'}))]
        if floor:
            lines += ["", "Against the plain safe_open/save_file loop of the same run (fastest of "
                      f"{args.repeats} run(s) each): " + "; ".join(f"{k} = {v:.2f}x" for k, v in floor.items()) + "."]
        g, t = by.get(("ties (global)", "stream")), by.get(("ties (tensor)", "stream"))
        if g and t:
            meta["ties_global_over_tensor"] = round(g["seconds"] / t["seconds"], 2)
            lines += ["", f"streamed global TIES / per-tensor TIES: {g['seconds']:.1f} s / {t['seconds']:.1f} s = "
                          f"{meta['ties_global_over_tensor']:.2f}x"]
        (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        (out / "README.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
