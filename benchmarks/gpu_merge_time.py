"""Merge wall time per method against its flop and memory-traffic bounds, on a GPU or a CPU.

Synthetic task vectors (low rank plus dense noise, log-normal norms per expert, as
benchmarks/merge_speed.py's world) in the shapes of one transformer block of CLIP ViT-B/32
(width 768), CLIP ViT-L/14 (width 1024) and one decoder layer of Llama-3-8B (4096, 14336 MLP,
8 key-value heads; benchmarks/_shapes.py), T = 8 / 14 / 20 experts, every registered method,
float32 and float64, on ``--device cuda`` or ``cpu``. Each method's registered function runs on
task vectors already on the device (the merge alone, no file reading), after an untimed warm-up run
of the same method on the smallest world (CUDA context, cuSOLVER handles); CUDA is synchronised
around the clock. Each world (shape, T, dtype) is made once on the device and every method runs on
it in a row; an out-of-memory or other runtime error is recorded in the run's ``status`` and the
other runs go on.

Per run it prints the wall time, the flop bound (the method's flops, :func:`matrix_flops`, at the
device's peak rate for the dtype) and the memory-traffic bound (the bytes its algorithm must move,
:func:`matrix_bytes`, at the peak bandwidth), and ``ratio`` = wall / the larger bound (1 would be
a merge at the device's peak; the whole model takes about ``blocks`` x the block's time). The peaks
are measured at the start (a GEMM of the dtype and a large copy, on the device: what it achieves,
not the data sheet), or given (``--peak-gflops``, ``--peak-gbs``); :data:`DATASHEET` is printed
beside them for the GPUs it knows.

The GPU run (3 shapes x 3 T x 2 dtypes x every method; small worlds and cheap methods first) stops
starting new runs after ``--budget`` seconds (default 450, so it ends within 8 minutes; ``--quick``
150) and skips a world whose tensors would not fit in 60 % of the device's memory; both are listed
as not run, and the CSV is written after every run. WUDI runs ``--wudi-steps`` Adam
steps (default 20; the official 300 take 15 x as long: its time is linear in the steps).

    python benchmarks/gpu_merge_time.py --device cuda                 # the GPU table (<= 8 min)
    python benchmarks/gpu_merge_time.py --device cpu --quick          # the CPU table of docs/performance.md

Results: benchmarks/results/gpu_merge_time/<device>[_quick].csv, .json and .md (the table).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import sys
import time
import zlib
from pathlib import Path

from _shapes import llama3_8b_layer_shapes, vit_b32_visual_shapes  # benchmarks/_shapes.py, beside this script

HERE = Path(__file__).resolve().parent

#: One block (layer) per architecture, and the blocks the whole model has.
ARCHS = {
    "clip-vit-b32": (lambda: vit_b32_visual_shapes(1, 768, whole=False), 12, "open_clip"),
    "clip-vit-l14": (lambda: vit_b32_visual_shapes(1, 1024, whole=False), 24, "open_clip"),
    "llama-3-8b": (llama3_8b_layer_shapes, 32, "llama"),
}
N_TASKS = (8, 14, 20)
DTYPES = ("float32", "float64")
#: Data-sheet peaks (dense, no sparsity): GFLOP/s for float32 / float64 (the FP64 tensor-core rate that cuBLAS'
#: DGEMM reaches; float32 without TF32) and memory bandwidth in GB/s, by a substring of the device's name.
DATASHEET = {
    "H200": {"float32": 67e3, "float64": 67e3, "gbs": 4800},
    "H100 80GB HBM3": {"float32": 67e3, "float64": 67e3, "gbs": 3350},  # SXM
    "H100 PCIe": {"float32": 51e3, "float64": 51e3, "gbs": 2000},
    "A100": {"float32": 19.5e3, "float64": 19.5e3, "gbs": 2039},
}
ESM_TOKENS = 1600  # activation rows per expert and matrix (ESM's N)


def make_world(shapes: dict, n_tasks: int, dtype, device, seed: int = 0, rank: int = 16, rel: float = 0.02):
    """Base W0 and task vectors (low rank + 0.1 dense noise, norm rel x ||W0|| x exp(z_t)), made on the CPU in
    float32 from ``seed`` (the same numbers on every device), then moved."""
    import torch

    g = torch.Generator().manual_seed(seed)
    base = {k: torch.randn(s, generator=g) * (0.02 if len(s) == 2 else 1.0) for k, s in shapes.items()}
    factors = torch.exp(torch.randn(n_tasks, generator=g)).tolist()
    tvs = []
    for t in range(n_tasks):
        tv = {}
        for k, s in shapes.items():
            if len(s) == 2:
                tau = torch.randn(s[0], rank, generator=g) @ torch.randn(rank, s[1], generator=g) / rank**0.5
                tau += 0.1 * torch.randn(s, generator=g)
            else:
                tau = torch.randn(s, generator=g)
            tau *= factors[t] * rel * base[k].norm() / tau.norm()
            tv[k] = tau.to(device=device, dtype=dtype)
        tvs.append(tv)
    return {k: v.to(device=device, dtype=dtype) for k, v in base.items()}, tvs


def data_inputs(method: str, base: dict, n_tasks: int, dtype, device) -> dict:
    """ESM's activations (a callable (t, key) -> N x d_in) and RegMean's Gram matrices, deterministic."""
    import torch

    if method == "esm":
        def acts(t: int, key: str):
            d_in = base[key].shape[1]
            g = torch.Generator().manual_seed(zlib.crc32(f"{t}/{key}".encode()))
            mix = torch.randn(32, d_in, generator=g) / 32**0.5
            x = torch.randn(ESM_TOKENS, 32, generator=g) @ mix + 0.1 * torch.randn(ESM_TOKENS, d_in, generator=g)
            return x.to(device=device, dtype=dtype)

        return {"activations": acts}
    if method == "regmean":
        grams = []
        for t in range(n_tasks):
            g = torch.Generator().manual_seed(1000 + t)
            d = {}
            for k, w in base.items():
                if w.ndim == 2:
                    A = torch.randn(w.shape[1], 64, generator=g).to(device=device, dtype=dtype)
                    d[k] = A @ A.T / 64 + 0.01 * torch.eye(w.shape[1], device=device, dtype=dtype)
            grams.append(d)
        return {"grams": grams}
    return {}


def matrix_flops(method: str, m: int, n: int, T: int, wudi_steps: int) -> float:
    """Flops of ``method`` on one m x n matrix of T experts (benchmarks/merge_speed.py's conventions: a product
    m x k by k x n 2mnk; a Gram m x n -> n x n mn²; a symmetric eigendecomposition 4n³; Cholesky n³/3; a thin
    SVD by the Gram route 2·lo²·hi + 4·lo³). Elementwise passes count one flop per entry and pass."""
    lo, hi, mn = min(m, n), max(m, n), m * n
    svd = 2 * lo * lo * hi + 4 * lo**3
    if method in ("weight_averaging", "task_arithmetic"):
        return 2.0 * T * mn
    if method == "ties":  # |tau| and the global threshold, sign election, the agreeing mean
        return 8.0 * T * mn
    if method == "dare":  # a random mask, drop and rescale, then task arithmetic
        return 5.0 * T * mn
    if method in ("tsv_m", "iso_c", "iso_cts"):
        r = lo
        polar = 2 * (2 * r * r * hi + 4 * r**3 + 2 * r**3 + 2 * r * r * hi)  # orthogonalise U and V
        per_task = svd + 2 * lo * hi * max(1, r // T)
        if method == "iso_c":  # one SVD of the sum, its spectrum flattened
            return svd + 2 * m * r * n + T * mn
        f = T * per_task + polar + 2 * m * r * n
        if method == "iso_cts":  # the common subspace and the projections of every task vector on it
            f += svd + T * 4 * mn * int(0.8 * r)
        return f
    if method == "cart":  # the mean, a low-rank SVD of each centred task vector, its rank-k reconstruction
        k = max(1, int(0.12 * lo))
        return T * (svd + 2 * mn * k) + 2 * T * mn
    if method == "ace":  # merge_speed.model_flops' streamed route, every matrix on the flagged path
        per_task = m * n * n + (4 * m * m * n if 2 * m < n else 2 * m * n * n)
        k = int(0.3 * lo)
        return T * per_task + n**3 / 3 + 2 * m * n * n + 2 * m * n * n + 2 * lo * lo * hi + 4 * lo**3 + 4 * lo * hi * k
    if method == "esm":  # per task: the activations' shift and its SVD; whitening of the concatenations
        N = ESM_TOKENS
        k = max(1, m // T)
        per_task = 2 * N * n * m + 2 * min(N, m) ** 2 * max(N, m) + 4 * min(N, m) ** 3 + 2 * k * mn
        Tk = T * k
        a_lo, a_hi = min(Tk, n), max(Tk, n)
        return T * per_task + 3 * a_lo**2 * a_hi + 6 * a_lo**3 + m * Tk * Tk + 4 * Tk**3 + 2 * m * Tk * n
    if method == "regmean":  # sum of the Grams, T products W_t G_t, one Cholesky solve
        return T * n * n + T * 2 * m * n * n + n**3 / 3 + 2 * m * n * n
    if method == "wudi":  # S = sum_t w_t tau_tᵀ tau_t and C = sum_t w_t tau_t S_t... once (in float64), then per
        # Adam step the gradient 2 (x S - C): one m x n by n x n product and about 12 elementwise passes
        return 2 * T * m * n * n + wudi_steps * (2 * m * n * n + 12 * mn)
    return math.nan


#: Times the stack of T task vectors is read by each method's algorithm (the rest of the traffic is W0 read once
#: and the update written once); WUDI reads it once, then moves x, S, C and Adam's m and v every step.
PASSES = {"weight_averaging": 1, "task_arithmetic": 1, "ties": 4, "dare": 2, "tsv_m": 2, "iso_c": 1, "iso_cts": 3,
          "cart": 2, "ace": 2, "esm": 2, "regmean": 2}


def matrix_bytes(method: str, m: int, n: int, T: int, itemsize: int, wudi_steps: int) -> float:
    """Bytes one m x n matrix's merge must move through memory at least."""
    if method == "wudi":
        return float((T * m * n + 2 * m * n + n * n + wudi_steps * (8 * m * n + n * n)) * itemsize)
    extra = T * n * n if method == "regmean" else 0  # the Grams
    return float((PASSES.get(method, 1) * T * m * n + 2 * m * n + extra) * itemsize)


def bounds(method: str, shapes: dict, T: int, itemsize: int, wudi_steps: int) -> tuple[float, float]:
    """(GFLOP, GB) of one block: matrices by the models above, vectors as T-term averages."""
    flops = byts = 0.0
    for s in shapes.values():
        if len(s) == 2:
            flops += matrix_flops(method, s[0], s[1], T, wudi_steps)
            byts += matrix_bytes(method, s[0], s[1], T, itemsize, wudi_steps)
        else:
            flops += 2 * T * s[0]
            byts += (T + 2) * s[0] * itemsize
    return flops / 1e9, byts / 1e9


def measure_peaks(device, dtype_name: str) -> tuple[float, float]:
    """(GFLOP/s of an n = 4096 GEMM (2048 on a CPU), GB/s of a 512 MiB copy) on ``device``: the best of 3."""
    import torch

    dtype = getattr(torch, dtype_name)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n = 4096 if cuda else 2048
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    x = torch.empty(2**27 // (dtype.itemsize // 4), device=device, dtype=dtype)  # 512 MiB
    y = torch.empty_like(x)
    torch.mm(a, b)
    y.copy_(x)
    sync()
    gemm = copy = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        gemm = min(gemm, time.perf_counter() - t0)
        t0 = time.perf_counter()
        y.copy_(x)
        sync()
        copy = min(copy, time.perf_counter() - t0)
    return 2 * n**3 / gemm / 1e9, 2 * x.numel() * x.element_size() / copy / 1e9


#: The last world made, ``(arch, T, dtype) -> (base, task vectors)`` on the device: the plan is sorted so every
#: method of one world runs in a row, and the methods leave their inputs untouched (the registry's contract).
_WORLD: dict = {}


def world_for(key: tuple, shapes: dict, T: int, dtype, device):
    """:func:`make_world` once per ``key``; the previous world is freed first."""
    if key not in _WORLD:
        _WORLD.clear()
        gc.collect()
        _WORLD[key] = make_world(shapes, T, dtype, device)
    return _WORLD[key]


def run_one(method: str, shapes: dict, T: int, dtype_name: str, device, wudi_steps: int,
            layout: str, key: tuple | None = None) -> tuple[float, float]:
    """Wall and process CPU seconds of ``method``'s registered function on one block of T experts (tensors made
    first; on a loaded CPU the CPU seconds are the steadier figure)."""
    import torch

    import acetools
    from acetools.merging import METHODS

    dtype = getattr(torch, dtype_name)
    base, tvs = make_world(shapes, T, dtype, device) if key is None else world_for(key, shapes, T, dtype, device)
    kwargs = data_inputs(method, base, T, dtype, device)
    if method == "wudi":
        kwargs["steps"] = wudi_steps
    if method == "ace":
        kwargs["precision"] = dtype_name
    info = METHODS[method]
    hp = info.resolve(kwargs, layout=layout)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    c0, t0 = time.process_time(), time.perf_counter()
    out = info.func(base, tvs, is_matrix=acetools.merging.is_matrix_param, **hp)
    sync()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    del out, base, tvs, kwargs
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return wall, cpu


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="ViT-B/32, T = 8, float32 (the CPU table)")
    ap.add_argument("--archs", nargs="+", default=None, choices=list(ARCHS))
    ap.add_argument("--tasks", nargs="+", type=int, default=None, help=f"T values (default {N_TASKS})")
    ap.add_argument("--dtypes", nargs="+", default=None, choices=list(DTYPES))
    ap.add_argument("--methods", nargs="+", default=None, help="default: every registered method")
    ap.add_argument("--wudi-steps", type=int, default=20, help="WUDI's Adam steps (official 300; time is linear)")
    ap.add_argument("--peak-gflops", type=float, default=None, help="the device's peak GFLOP/s (default: measured)")
    ap.add_argument("--peak-gbs", type=float, default=None, help="the device's peak GB/s (default: measured)")
    ap.add_argument("--budget", type=float, default=None,
                    help="start no run after this many seconds (default 450; --quick 150)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--out", default=str(HERE / "results" / "gpu_merge_time"))
    ap.add_argument("--note", default="", help="a note saved with the results (e.g. the machine's load)")
    return ap


def main(argv: list[str] | None = None) -> int:
    import pandas as pd
    import torch

    from acetools.merging import METHODS

    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_merge_time: no CUDA device here; run with --device cpu", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    archs = args.archs or (["clip-vit-b32"] if args.quick else list(ARCHS))
    tasks = args.tasks or ([8] if args.quick else list(N_TASKS))
    dtypes = args.dtypes or (["float32"] if args.quick else list(DTYPES))
    methods = args.methods or list(METHODS)
    budget = args.budget if args.budget is not None else 150.0 if args.quick else 450.0
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    sheet = next((v for k, v in DATASHEET.items() if k in name), None)
    peaks = {}
    for dt in dtypes:
        gflops, gbs = measure_peaks(device, dt)
        peaks[dt] = {"gflops": args.peak_gflops or gflops, "gbs": args.peak_gbs or gbs,
                     "measured_gflops": gflops, "measured_gbs": gbs}
        print(f"{name} {dt}: peak {peaks[dt]['gflops']:.0f} GFLOP/s, {peaks[dt]['gbs']:.0f} GB/s "
              f"(measured {gflops:.0f} / {gbs:.0f}" + (f"; data sheet {sheet[dt]:.0f} / {sheet['gbs']:.0f})"
                                                        if sheet else ")"), flush=True)
    limit = torch.cuda.get_device_properties(device).total_memory * 0.6 if device.type == "cuda" else math.inf
    plan = [(a, T, dt, m) for a in archs for T in tasks for dt in dtypes for m in methods]
    # small worlds first, and within one the cheapest methods by their flop bound (so a budget cuts the dearest)
    plan.sort(key=lambda r: (sum(math.prod(s) for s in ARCHS[r[0]][0]().values()) * r[1], r[2],
                             bounds(r[3], ARCHS[r[0]][0](), r[1], 4, args.wudi_steps)[0]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.device}{'_quick' if args.quick else ''}"
    warmed: set[str] = set()
    rows, start = [], time.perf_counter()
    for arch, T, dt, method in plan:
        shapes_fn, blocks, layout = ARCHS[arch]
        shapes = shapes_fn()
        itemsize = getattr(torch, dt).itemsize
        gflop, gb = bounds(method, shapes, T, itemsize, args.wudi_steps)
        row = {"arch": arch, "n_tasks": T, "dtype": dt, "method": method, "blocks": blocks, "gflop": gflop, "gb": gb}
        need = (T + 3) * sum(math.prod(s) for s in shapes.values()) * itemsize
        if need > limit:
            rows.append({**row, "status": "skipped: memory"})
            continue
        if time.perf_counter() - start > budget:
            rows.append({**row, "status": "not run: budget"})
            continue
        try:
            if device.type == "cuda" and method not in warmed:  # CUDA context, cuSOLVER handles
                run_one(method, ARCHS["clip-vit-b32"][0](), 2, dt, device, min(args.wudi_steps, 2), "open_clip")
                warmed.add(method)
            wall, cpu = run_one(method, shapes, T, dt, device, args.wudi_steps, layout, key=(arch, T, dt))
        except torch.cuda.OutOfMemoryError:
            _WORLD.clear()
            gc.collect()
            torch.cuda.empty_cache()
            rows.append({**row, "status": "out of memory"})
            continue
        except RuntimeError as e:  # e.g. a cuSOLVER failure: recorded, the other runs go on
            rows.append({**row, "status": f"error: {str(e).splitlines()[0][:100]}"})
            print(f"{arch} T={T} {dt} {method}: {rows[-1]['status']}", flush=True)
            continue
        p = peaks[dt]
        t_flop, t_mem = gflop / p["gflops"], gb / p["gbs"]
        rows.append({**row, "status": "ok", "seconds": wall, "cpu_seconds": cpu, "flop_bound_s": t_flop,
                     "mem_bound_s": t_mem, "ratio": wall / max(t_flop, t_mem),
                     "bound": "flops" if t_flop >= t_mem else "memory"})
        print(f"{arch:>13} T={T:<2} {dt:<7} {method:>16}: {wall:8.3f} s  flop bound {t_flop:8.4f} s  "
              f"memory bound {t_mem:8.4f} s  ratio {rows[-1]['ratio']:8.1f}", flush=True)
        pd.DataFrame(rows).to_csv(out / f"{stem}.csv", index=False)  # after every run: a killed run keeps its rows
    df = pd.DataFrame(rows)
    df.to_csv(out / f"{stem}.csv", index=False)
    meta = {"device": name, "torch": torch.__version__, "threads": torch.get_num_threads(), "peaks": peaks,
            "datasheet": sheet, "wudi_steps": args.wudi_steps, "esm_tokens": ESM_TOKENS, "note": args.note,
            "seconds": time.perf_counter() - start, "argv": sys.argv[1:] if argv is None else argv}
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    ok = df[df["status"] == "ok"] if "status" in df else df
    cols = ["arch", "n_tasks", "dtype", "method", "seconds", "cpu_seconds", "flop_bound_s", "mem_bound_s", "ratio"]
    table = ok[cols].to_markdown(index=False, floatfmt=".4g") if len(ok) else "(no run)"
    (out / f"{stem}.md").write_text(f"{name}; {meta['threads']} threads; {args.note}\n\n{table}\n")
    print(table)
    left = df[df["status"] != "ok"]
    if len(left):
        print(f"{len(left)} not run: " + ", ".join(sorted(set(left["status"]))))
    print(f"{time.perf_counter() - start:.0f} s; saved {out / stem}.csv/.json/.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
