"""Merge speed and peak memory per method on ViT-B/32-shaped task vectors.

Random structured task vectors in the shapes of open_clip ViT-B/32's visual tower
(12 blocks of attn.in_proj_weight 2304x768, attn.out_proj.weight 768x768,
mlp.c_fc.weight 3072x768, mlp.c_proj.weight 768x3072, plus biases and LayerNorms),
T experts. Each (method, T) runs in a fresh subprocess; times are wall-clock seconds of the
merge alone on precomputed task vectors (tensors are generated before the clock
starts), and memory is the peak resident memory above the level before the merge,
sampled every 5 ms. fusion-bench's TSV-M, Iso-CTS and WUDI run on the same
tensors and the table shows our/their time ratio.

    python benchmarks/merge_speed.py                      # T=8, every method, 12 blocks
    python benchmarks/merge_speed.py --tasks 8 14 20 --methods ace esm tsv_m
    python benchmarks/merge_speed.py --blocks 2 --quick   # a fast smoke run

Results are printed as a table and saved to benchmarks/results/merge_speed.{csv,json}.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import subprocess
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
WIDTH = 768

# fusion-bench functions that implement the same method (docs/methods.md §Oracles), by our method name.
THEIRS = {"tsv_m": "fb_tsv_m", "iso_cts": "fb_iso_cts", "wudi": "fb_wudi"}


def vit_b32_shapes(blocks: int, width: int = WIDTH) -> dict[str, tuple[int, ...]]:
    w = width
    shapes: dict[str, tuple[int, ...]] = {}
    for b in range(blocks):
        p = f"visual.transformer.resblocks.{b}."
        shapes.update({
            p + "ln_1.weight": (w,), p + "ln_1.bias": (w,),
            p + "attn.in_proj_weight": (3 * w, w), p + "attn.in_proj_bias": (3 * w,),
            p + "attn.out_proj.weight": (w, w), p + "attn.out_proj.bias": (w,),
            p + "ln_2.weight": (w,), p + "ln_2.bias": (w,),
            p + "mlp.c_fc.weight": (4 * w, w), p + "mlp.c_fc.bias": (4 * w,),
            p + "mlp.c_proj.weight": (w, 4 * w), p + "mlp.c_proj.bias": (w,),
        })
    return shapes


def make_world(n_tasks: int, blocks: int, seed: int = 0, rank: int = 16, rel: float = 0.02, width: int = WIDTH):
    """Base weights and experts whose task vectors are low rank plus small dense noise."""
    import torch

    g = torch.Generator().manual_seed(seed)
    shapes = vit_b32_shapes(blocks, width)
    base = {k: torch.randn(s, generator=g) * (0.02 if len(s) == 2 else 1.0) for k, s in shapes.items()}
    experts = []
    for _ in range(n_tasks):
        ex = {}
        for k, s in shapes.items():
            w0 = base[k]
            if len(s) == 2:
                tau = torch.randn(s[0], rank, generator=g) @ torch.randn(rank, s[1], generator=g) / rank**0.5
                tau = tau + 0.1 * torch.randn(s, generator=g)
            else:
                tau = torch.randn(s, generator=g)
            tau = tau * (rel * w0.norm() / tau.norm())
            ex[k] = w0 + tau
        experts.append(ex)
    return base, experts


def esm_activations(n_tokens: int, seed: int = 0, width: int = WIDTH):
    """A deterministic callable (t, key) -> N x d_in proxy activations (ESM's X)."""
    import torch

    def fn(t: int, key: str):
        d_in = 4 * width if "c_proj" in key else width
        g = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{t}/{key}".encode()))
        mix = torch.randn(32, d_in, generator=g) / 32**0.5
        return torch.randn(n_tokens, 32, generator=g) @ mix + 0.1 * torch.randn(n_tokens, d_in, generator=g)

    return fn


def regmean_grams(base, n_tasks: int, seed: int = 0):
    import torch

    grams = []
    for t in range(n_tasks):
        g = torch.Generator().manual_seed(seed * 1000 + t)
        d = {}
        for k, w in base.items():
            if w.ndim == 2:
                A = torch.randn(w.shape[1], 64, generator=g)
                d[k] = A @ A.T / 64 + 0.01 * torch.eye(w.shape[1])
        grams.append(d)
    return grams


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRSS:
    """Samples this process's resident memory every few milliseconds in a thread; ``peak``
    is the highest value seen (MiB). ru_maxrss cannot be reset, so it cannot isolate a phase."""

    def __init__(self, interval: float = 0.005):
        import threading

        self.interval, self.peak = interval, _rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb())
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())


def worker(method: str, n_tasks: int, blocks: int, wudi_steps: int, esm_tokens: int, width: int = WIDTH) -> dict:
    """Run one merge in this process and return its time and peak memory."""
    import acetools
    from acetools.merging import METHODS

    base, experts = make_world(n_tasks, blocks, width=width)
    tvs = acetools.task_vectors(base, experts)
    kwargs = {}
    if method in ("wudi", "fb_wudi"):
        kwargs["steps"] = wudi_steps
    if method == "esm":
        kwargs["activations"] = esm_activations(esm_tokens, width=width)
    if method == "regmean":
        kwargs["grams"] = regmean_grams(base, n_tasks)
    del experts
    W0 = {k: v.float() for k, v in base.items()}
    info = None if method.startswith("fb_") else METHODS[method]
    hp = {} if info is None else info.resolve(kwargs)
    theirs = _fusion_bench_fn(method) if info is None else None
    rss0 = _rss_mb()
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        if theirs is not None:
            with contextlib.redirect_stdout(io.StringIO()):  # fusion-bench prints progress
                theirs(tvs, kwargs)
        else:
            info.func(W0, tvs, is_matrix=acetools.merging.is_matrix_param, **hp)
        wall = time.perf_counter() - t0
    return {"method": method, "n_tasks": n_tasks, "blocks": blocks, "width": width, "seconds": wall,
            "peak_extra_mb": max(0.0, mem.peak - rss0)}


def _fusion_bench_fn(method: str):
    """Import fusion-bench's function (outside the timed region: the import takes seconds)."""
    if method == "fb_tsv_m":
        from fusion_bench.method.task_singular_vector.utils.TSVM_utils import compute_and_sum_svd_mem_reduction

        return lambda tvs, kw: compute_and_sum_svd_mem_reduction(tvs, accelerator="cpu")
    if method == "fb_iso_cts":
        from fusion_bench.method.isotropic_merging.iso_utils import iso_cts

        return lambda tvs, kw: iso_cts(tvs, common_space_fraction=0.8, accelerator="cpu")
    if method == "fb_wudi":
        from fusion_bench.method.wudi.wudi import wudi_merging

        return lambda tvs, kw: wudi_merging(tvs, accelerator="cpu", iter_num=kw["steps"])
    raise ValueError(method)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[8], help="numbers of experts T")
    ap.add_argument("--methods", nargs="+", default=None, help="our methods (default: all registered)")
    ap.add_argument("--blocks", type=int, default=12, help="transformer blocks (ViT-B/32 has 12)")
    ap.add_argument("--width", type=int, default=WIDTH, help="model width (ViT-B/32: 768)")
    ap.add_argument("--wudi-steps", type=int, default=300, help="Adam steps for WUDI (ours and fusion-bench's)")
    ap.add_argument("--esm-tokens", type=int, default=1600, help="proxy rows per task for ESM (32 images x 50 tokens)")
    ap.add_argument("--no-theirs", action="store_true", help="skip the fusion-bench runs")
    ap.add_argument("--quick", action="store_true", help="1 block of width 192, 5 WUDI steps: a smoke run")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="folder for the CSV/JSON")
    ap.add_argument("--worker", nargs=6, metavar=("METHOD", "T", "BLOCKS", "WUDI", "TOKENS", "WIDTH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        m, t, b, w, n, width = args.worker
        print(json.dumps(worker(m, int(t), int(b), int(w), int(n), int(width))))
        return 0
    if args.quick:
        args.blocks, args.width, args.wudi_steps = 1, min(args.width, 192), min(args.wudi_steps, 5)
        args.esm_tokens = min(args.esm_tokens, 400)

    import acetools  # noqa: F401  (fail early if the package is missing)
    from acetools.merging import METHODS

    methods = args.methods or list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose from {sorted(METHODS)}")
    # ours and theirs back to back, so that both see the same machine load
    runs = []
    for t in args.tasks:
        for m in methods:
            runs.append((m, t))
            if m in THEIRS and not args.no_theirs:
                runs.append((THEIRS[m], t))
    rows = []
    for m, t in runs:
        cmd = [sys.executable, __file__, "--worker", m, str(t), str(args.blocks), str(args.wudi_steps),
               str(args.esm_tokens), str(args.width)]
        print(f"  running {m} T={t} ...", file=sys.stderr, flush=True)
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"  {m} T={t} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
            rows.append({"method": m, "n_tasks": t, "blocks": args.blocks, "width": args.width, "seconds": float("nan"), "peak_extra_mb": float("nan"), "error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "failed"})
            continue
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))

    import pandas as pd

    df = pd.DataFrame(rows)
    ours = df[~df.method.str.startswith("fb_")].copy()
    theirs = df[df.method.str.startswith("fb_")].set_index(["method", "n_tasks"]).seconds
    ours["fusion_bench_seconds"] = [theirs.get((THEIRS.get(m, ""), t), float("nan")) for m, t in zip(ours.method, ours.n_tasks)]
    ours["ours/theirs"] = ours.seconds / ours.fusion_bench_seconds
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "merge_speed_raw.csv", index=False)
    ours.to_csv(args.out / "merge_speed.csv", index=False)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "blocks": args.blocks, "width": args.width, "wudi_steps": args.wudi_steps, "esm_tokens": args.esm_tokens}
    try:
        import torch

        meta.update(torch=torch.__version__, threads=torch.get_num_threads())
    except Exception:
        pass
    (args.out / "merge_speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(ours.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
