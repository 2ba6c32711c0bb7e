"""LoRA updates merged in their own rank against folding then merging in full space, at Llama-3-8B shapes.

Synthetic adapters: ``--tasks`` (6) adapters of rank ``--rank`` (16) on every attention and MLP matrix of one
Llama-3-8B layer, stored d_out x d_in: q_proj and o_proj 4096 x 4096, k_proj and v_proj 1024 x 4096 (grouped-query
attention: 8 key/value heads of 128), gate_proj and up_proj 14336 x 4096, down_proj 4096 x 14336. B_t ~ N(0, 0.02²)
(the scale folded in), A_t ~ N(0, 1/d_in), float32. For each distinct shape, method (task arithmetic, TSV-M,
Iso-CTS, ACE with its defaults) and path a fresh subprocess times one matrix:

* ``lowrank``: :mod:`acetools.merging.lowrank` on the factors (the merged update stays factors);
* ``full``: fold ΔW_t = B_t A_t (timed) and run the engine's function (``task_arithmetic``, ``tsv_merge_matrix``,
  ``iso_cts_matrix``, ``ace_matrix``) on the d_out x d_in task vectors.

Wall and CPU seconds of that work alone (factors generated before the clock), and the peak resident memory above
the level before it (the kernel's VmHWM, reset through /proc/self/clear_refs; glibc's mmap threshold fixed as in
benchmarks/merge_speed.py, so freed tensors leave the resident set). The layer's time is the sum over its seven
matrices (each shape counted as often as it occurs). ``--threads`` (2) torch threads; the load average is saved.

    python benchmarks/lora_lowrank.py                                   # every shape, method and path
    python benchmarks/lora_lowrank.py --shapes q_proj k_proj --paths lowrank
    python benchmarks/lora_lowrank.py --skip-full tsv_m:q_proj tsv_m:gate_proj   # what a loaded machine allows
    python benchmarks/lora_lowrank.py --quick                           # 512-wide shapes, a smoke run

Results: printed, and saved to ``--out`` (benchmarks/results/lora_lowrank/): runs.csv (every case), layer.csv
(per method and path, the layer's totals and the full/lowrank ratios) and meta.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "lora_lowrank"

#: Llama-3-8B's attention and MLP matrices (d_out, d_in) and how often each shape occurs in one layer.
LLAMA3_8B = {"q_proj": ((4096, 4096), 2), "k_proj": ((1024, 4096), 2), "gate_proj": ((14336, 4096), 2),
             "down_proj": ((4096, 14336), 1)}
SHAPE_NAMES = {"q_proj": "q_proj, o_proj", "k_proj": "k_proj, v_proj", "gate_proj": "gate_proj, up_proj",
               "down_proj": "down_proj"}
QUICK = {"q_proj": ((512, 512), 2), "k_proj": ((128, 512), 2), "gate_proj": ((1792, 512), 2),
         "down_proj": ((512, 1792), 1)}
METHODS = ("task_arithmetic", "tsv_m", "iso_cts", "ace")
PATHS = ("lowrank", "full")
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # every tensor buffer its own mapping (benchmarks/merge_speed.py)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def worker(method: str, path: str, d_out: int, d_in: int, tasks: int, rank: int, threads: int, seed: int) -> dict:
    """Time one case in this process; returns its row."""
    import torch

    from acetools.merging import lowrank as lr
    from acetools.merging.ace import ace_matrix
    from acetools.merging.averaging import task_arithmetic
    from acetools.merging.svd import iso_cts_matrix, tsv_merge_matrix

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    factors = [(0.02 * torch.randn(d_out, rank, generator=g), torch.randn(rank, d_in, generator=g) / d_in ** 0.5)
               for _ in range(tasks)]
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    except OSError:
        pass
    before = _status_kb("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    info = ""
    if path == "lowrank":
        if method == "task_arithmetic":
            out = lr.task_arithmetic_lowrank(factors, lam=0.3)
        elif method == "tsv_m":
            out = lr.tsv_m_lowrank(factors)
        elif method == "iso_cts":
            out = lr.iso_cts_lowrank(factors)
        else:
            out, span = lr.ace_lowrank(factors)
            info = f"flag={span.flag}"
        out_rank = out.rank
    else:
        taus = [B @ A for B, A in factors]  # the fold, timed
        if method == "task_arithmetic":
            W = task_arithmetic({"w": taus[0]}, [{"w": t} for t in taus], is_matrix=lambda k, w: True,
                                lam=0.3, weights=None)["w"]
        elif method == "tsv_m":
            W = tsv_merge_matrix(taus)
        elif method == "iso_cts":
            W = iso_cts_matrix(taus)
        else:
            W, diag = ace_matrix(taus)
            info = f"flag={diag.flag}"
        out_rank = min(W.shape)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _status_kb("VmHWM")
    return dict(method=method, path=path, d_out=d_out, d_in=d_in, tasks=tasks, rank=rank, threads=threads,
                wall_s=round(wall, 4), cpu_s=round(cpu, 3), peak_extra_mb=round(max(peak - before, 0) / 1024, 1),
                out_rank=out_rank, info=info, status="ok")


def run_case(method: str, path: str, shape: tuple[int, int], args: argparse.Namespace) -> dict:
    spec = dict(method=method, path=path, d_out=shape[0], d_in=shape[1], tasks=args.tasks, rank=args.rank,
                threads=args.threads, seed=args.seed)
    env = {**os.environ, **MALLOC_ENV, "OMP_NUM_THREADS": str(args.threads)}
    try:
        p = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                           timeout=args.timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**spec, "status": f"timeout {args.timeout}s"}
    if p.returncode != 0:
        return {**spec, "status": "error: " + (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def layer_table(rows: list[dict], shapes: dict) -> list[dict]:
    """Per method and path: the layer's wall seconds and peak memory over its matrices (None if a shape is missing)."""
    out = []
    for method in METHODS:
        row: dict = {"method": method}
        for path in PATHS:
            got = {(r["d_out"], r["d_in"]): r for r in rows if r["method"] == method and r["path"] == path
                   and r.get("status") == "ok"}
            complete = all(s in got for s, _ in shapes.values())
            row[f"{path}_s"] = round(sum(got[s]["wall_s"] * n for s, n in shapes.values()), 3) if complete else None
            row[f"{path}_peak_mb"] = max(got[s]["peak_extra_mb"] for s, _ in shapes.values()) if complete else None
        row["speedup"] = (round(row["full_s"] / row["lowrank_s"], 1) if row["full_s"] and row["lowrank_s"] else None)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--shapes", nargs="+", choices=list(LLAMA3_8B), default=list(LLAMA3_8B))
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    ap.add_argument("--skip-full", nargs="*", default=[], metavar="METHOD:SHAPE",
                    help="full-space cases not run (e.g. tsv_m:q_proj: hours on a loaded 2-core machine)")
    ap.add_argument("--quick", action="store_true", help="512-wide shapes (a smoke run)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(**json.loads(args.worker))))
        return
    shapes = {k: v for k, v in (QUICK if args.quick else LLAMA3_8B).items() if k in args.shapes}
    load = os.getloadavg()
    rows = []
    for name, (shape, _) in shapes.items():
        for method in args.methods:
            for path in args.paths:
                if path == "full" and f"{method}:{name}" in args.skip_full:
                    r = dict(method=method, path=path, d_out=shape[0], d_in=shape[1], status="skipped")
                else:
                    r = run_case(method, path, shape, args)
                rows.append(r)
                print(f"{SHAPE_NAMES[name]:18s} {shape[0]:>5} x {shape[1]:<5} {method:15s} {path:7s} "
                      f"{r.get('wall_s', '-'):>8} s  {r.get('peak_extra_mb', '-'):>8} MB  {r['status']} "
                      f"{r.get('info', '')}", flush=True)
    table = layer_table(rows, shapes)
    print("\nlayer (seven matrices):")
    for row in table:
        print(f"  {row['method']:15s} lowrank {row['lowrank_s']} s  full {row['full_s']} s  speedup {row['speedup']}")
    args.out.mkdir(parents=True, exist_ok=True)
    for fname, data in (("runs.csv", rows), ("layer.csv", table)):
        keys = list(dict.fromkeys(k for r in data for k in r))
        tmp = args.out / (fname + ".tmp")
        with tmp.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(data)
        tmp.replace(args.out / fname)
    meta = dict(load_before=load, load_after=os.getloadavg(), cpus=os.cpu_count(), machine=platform.machine(),
                python=platform.python_version(), argv=sys.argv[1:], shapes={k: v[0] for k, v in shapes.items()})
    tmp = args.out / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(args.out / "meta.json")


if __name__ == "__main__":
    main()
