"""Merge speed, arithmetic rate and peak memory per method on ViT-B/32-shaped task vectors.

Random structured task vectors (low rank plus dense noise) in the shapes of open_clip
ViT-B/32's visual tower (``--blocks 12``: all 12 blocks of attn.in_proj_weight 2304x768,
attn.out_proj.weight 768x768, mlp.c_fc.weight 3072x768, mlp.c_proj.weight 768x3072, plus
biases and LayerNorms), T experts. Real task vectors have unequal norms: each expert's task
vector is scaled by a log-normal factor exp(s z), z ~ N(0, 1) (``--norm-spread s``, default 1),
so ACE's heterogeneity gate (gamma > 0.3) fires on most matrices and its flagged path
(trace normalisation + spectral refinement) is what gets timed. ACE also runs on a world of
equal norms ("equal", s = 0: gamma ~ 0, the unflagged path), so both gate paths are reported;
the ``flagged`` column gives the fraction of matrices that took the flagged path.

Each run is a fresh subprocess; times are wall-clock seconds of the merge alone on
precomputed task vectors (tensors are generated before the clock starts), ``cpu_seconds``
the process CPU time over the same span (steadier than wall time on a shared machine), and
memory (``peak_extra_mb``) the peak resident memory above the level before the merge. The peak is
the kernel's high-water mark of the worker process (VmHWM, reset just before the merge through
/proc/self/clear_refs), not a sample, so a busy machine cannot hide a short peak; and each worker
runs with glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_``, :data:`MALLOC_ENV`), so every
tensor buffer of 128 KiB or more is its own mapping, returned to the system when it is freed:
resident memory then counts the live tensors only. With glibc's default the threshold grows with
the buffers freed (up to 32 MiB), freed tensors stay in the heap of whichever malloc arena the
thread that freed them used, the level before the merge counts buffers the merge then reuses,
and the same run measured 101-345 MiB at a load of 10. ``--default-malloc`` keeps glibc's
default; ``peak_sampled_mb`` is the 5 ms sampler's peak, kept beside it (and the peak where
clear_refs is not available).
fusion-bench's TSV-M, Iso-CTS and WUDI run on the same tensors and the table shows our/their
time ratio (``ratio_vs_fb_tsv_m`` puts every method against fusion-bench's TSV-M, the
reference of the speed targets). ``gemm`` runs first in the same session and measures the
float64 and float32 GEMM rates with the same threads; ``gflop`` is a flop model of each
method's algorithm (:func:`model_flops`), ``gflops_per_s`` the achieved rate and
``pct_f64_gemm`` that rate against the measured float64 GEMM peak, ``pct_gemm_own_dtype``
against the GEMM peak of the run's own arithmetic (float32 for ``precision=float32`` and for
fusion-bench's float32 SVDs).

``--before TREE`` also runs the methods with the ``acetools`` package found in TREE (a folder, or a git
revision of this repository whose ``acetools`` is extracted to a temporary folder), labelled
``code=before``, so before/after ratios come from one session. ``--interleave N`` runs each
before/after pair N times alternately (now, before, now, before, ...: a shared machine's load
drifts alike over both) and saves the min and median per method, world and code with the
now/before ratios in merge_speed_interleaved.csv.

    python benchmarks/merge_speed.py --blocks 12 --methods ace tsv_m iso_cts esm    # the targets run
    python benchmarks/merge_speed.py --blocks 1 --tasks 20 --methods ace --no-theirs # ACE memory, one block
    python benchmarks/merge_speed.py --quick                                        # a fast smoke run
    python benchmarks/merge_speed.py --blocks 1 --methods ace esm --no-theirs --before 1bc37d5 --interleave 5

Results are printed as a table and saved to ``--out`` (default benchmarks/results/):
merge_speed.csv (ours, with ratios), merge_speed_raw.csv (every run) and merge_speed.json.
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
import tarfile
import tempfile
import time
import zlib
from pathlib import Path

from _shapes import vit_b32_visual_shapes  # benchmarks/_shapes.py, beside this script

HERE = Path(__file__).resolve().parent
WIDTH = 768

# fusion-bench functions that implement the same method (docs/methods.md §Oracles), by our method name.
THEIRS = {"tsv_m": "fb_tsv_m", "iso_cts": "fb_iso_cts", "wudi": "fb_wudi"}


def vit_b32_shapes(blocks: int, width: int = WIDTH) -> dict[str, tuple[int, ...]]:
    """The transformer blocks of ViT-B/32's visual tower (:mod:`_shapes`)."""
    return vit_b32_visual_shapes(blocks, width, whole=False)


def make_world(n_tasks: int, blocks: int, seed: int = 0, rank: int = 16, rel: float = 0.02, width: int = WIDTH,
               norm_spread: float = 1.0):
    """Base weights and experts whose task vectors are low rank plus small dense noise.

    Expert t's task vectors have norm rel * ||W0|| * exp(norm_spread * z_t), z_t ~ N(0, 1)
    (one factor per expert, as a task that moves one layer far tends to move all of them).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    shapes = vit_b32_shapes(blocks, width)
    base = {k: torch.randn(s, generator=g) * (0.02 if len(s) == 2 else 1.0) for k, s in shapes.items()}
    factors = torch.exp(norm_spread * torch.randn(n_tasks, generator=g)).tolist()
    experts = []
    for t in range(n_tasks):
        ex = {}
        for k, s in shapes.items():
            w0 = base[k]
            if len(s) == 2:
                tau = torch.randn(s[0], rank, generator=g) @ torch.randn(rank, s[1], generator=g) / rank**0.5
                tau = tau + 0.1 * torch.randn(s, generator=g)
            else:
                tau = torch.randn(s, generator=g)
            tau = tau * (factors[t] * rel * w0.norm() / tau.norm())
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


#: The workers' allocator: glibc's mmap threshold fixed at 128 KiB (setting it turns off its dynamic
#: growth), so freed tensors go back to the system at once and resident memory counts live tensors.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _hwm_mb() -> float:
    """The kernel's peak resident memory of this process since start or the last :func:`_reset_peak` (MiB)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> bool:
    """Reset the kernel's peak resident memory (VmHWM) to the current level; False where Linux does not let us."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


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


WORLDS = {"lognormal": None, "equal": 0.0}  # norm spread per world; None = --norm-spread


def gemm_rates(n: int = 2048, reps: int = 3) -> dict:
    """Best-of-``reps`` float64 and float32 GEMM rates (GFLOP/s) of an n x n product."""
    import torch

    out = {}
    for name, dt in (("gemm_f64", torch.float64), ("gemm_f32", torch.float32)):
        a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
        a @ b
        best = min(_timed(lambda a=a, b=b: a @ b) for _ in range(reps))
        out[name] = 2 * n**3 / best / 1e9
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def worker(method: str, n_tasks: int, blocks: int, wudi_steps: int, esm_tokens: int, width: int = WIDTH,
           world: str = "lognormal", tree: str = "-", norm_spread: float = 1.0, variant: str = "-",
           repeat: int = 1, entry: str = "func") -> dict:
    """Run one merge in this process (``repeat`` times: the fastest counts) and return its time and peak memory.

    ``entry="func"``: the registered function on precomputed task vectors (the merge alone);
    ``"merge"``: :func:`acetools.merge` on the base and expert state dicts (task vectors formed
    inside, as a user calls it), with ``largest_mb`` (the largest tensor in the compute dtype),
    ``out_mb`` (the merged weights returned) and ``bound_mb`` = (T + 2) x ``largest_mb``, the
    target for ``peak_extra_mb - out_mb`` beside the method's own work."""
    if method == "gemm":
        return {"method": "gemm", **gemm_rates()}
    import torch  # acetools: this checkout's or another's (``tree``), on the PYTHONPATH _execute gives the worker

    import acetools
    from acetools.merging import METHODS

    spread = WORLDS[world] if WORLDS[world] is not None else norm_spread
    base, experts = make_world(n_tasks, blocks, width=width, norm_spread=spread)
    tvs = acetools.task_vectors(base, experts)
    sizes = {}
    if entry == "merge":
        sizes = {"largest_mb": max(v.numel() * 4 for v in tvs[0].values()) / 2**20,
                 "out_mb": sum(v.numel() * v.element_size() for v in base.values()) / 2**20}
        sizes["bound_mb"] = (n_tasks + 2) * sizes["largest_mb"]
    kwargs = {}
    if method in ("wudi", "fb_wudi"):
        kwargs["steps"] = wudi_steps
    if method == "esm":
        kwargs["activations"] = esm_activations(esm_tokens, width=width)
    if method == "regmean":
        kwargs["grams"] = regmean_grams(base, n_tasks)
    if variant != "-":  # e.g. "precision=float32"
        name, value = variant.split("=", 1)
        kwargs[name] = value
    if entry == "func":
        del experts
    W0 = {k: v.float() for k, v in base.items()}
    info = None if method.startswith("fb_") else METHODS[method]
    hp = {} if info is None else info.resolve(kwargs)
    theirs = _fusion_bench_fn(method) if info is None else None
    flagged = float("nan")
    if method == "ace":
        from acetools.merging.ace import heterogeneity

        mats = [k for k in base if acetools.merging.is_matrix_param(k, base[k])]
        flagged = sum(heterogeneity([tv[k] for tv in tvs]) > hp["tau"] for k in mats) / len(mats)
    if entry == "merge":
        del tvs  # merge() forms its own
    best = None
    for _ in range(max(1, repeat)):
        rss0 = _rss_mb()
        exact = _reset_peak()
        with PeakRSS() as mem:
            c0 = time.process_time()
            t0 = time.perf_counter()
            if theirs is not None:
                with contextlib.redirect_stdout(io.StringIO()):  # fusion-bench prints progress
                    theirs(tvs, kwargs)
            elif entry == "merge":
                merged = acetools.merge(method, base, experts, progress=False, **kwargs)
                del merged
            else:
                info.func(W0, tvs, is_matrix=acetools.merging.is_matrix_param, **hp)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
        sampled = max(0.0, mem.peak - rss0)
        extra = max(0.0, _hwm_mb() - rss0) if exact else sampled
        if best is None or wall < best[0]:
            best = (wall, cpu, extra if best is None else min(extra, best[2]),
                    sampled if best is None else min(sampled, best[3]))
    wall, cpu, extra, sampled = best
    return {"method": method, "world": world, "code": "now" if tree == "-" else "before", "variant": variant,
            "entry": entry, "n_tasks": n_tasks, "blocks": blocks, "width": width, "seconds": wall, "cpu_seconds": cpu,
            "peak_extra_mb": extra, "peak_sampled_mb": sampled, "peak_source": "VmHWM" if exact else "sampled",
            "malloc": {k: os.environ.get(k) for k in MALLOC_ENV}, "flagged": flagged,
            "threads": torch.get_num_threads(), **sizes}


def model_flops(method: str, n_tasks: int, blocks: int, width: int = WIDTH, flagged: float = 0.0,
                esm_tokens: int = 1600) -> float:
    """Flops of each method's algorithm on the ViT-B/32 matrices (a model, in GFLOP).

    Conventions: a product m x k by k x n is 2mnk; a Gram (SYRK) m x n -> n x n is mn²;
    Cholesky n³/3; Householder QR of m x n (R only) 2mn² - 2n³/3; a symmetric
    eigendecomposition with vectors 4n³; a thin SVD of m x n (m >= n) with vectors 6mn² + 11n³
    (R-SVD, Golub & Van Loan). The model is that of the *current* algorithms (ACE's streamed
    route, the Gram routes; fusion-bench's Iso-CTS keeps the generic count, which forms every
    residual); the same count divides the "before" time, so its rate reads as "useful work per
    second". Vectors, LayerNorms and averaging are ignored. ACE's flagged
    share ``flagged`` (0..1) adds the refinement.
    """
    T, w = n_tasks, width
    mats = [(3 * w, w), (w, w), (4 * w, w), (w, 4 * w)]
    total = 0.0
    for m, n in mats:
        lo, hi = min(m, n), max(m, n)
        if method in ("ace", "ace_reference"):
            per_task = m * n * n + (4 * m * m * n if 2 * m < n else 2 * m * n * n)
            f = T * per_task + n**3 / 3 + 2 * m * n * n
            k = int(0.3 * lo)
            f += flagged * (2 * m * n * n + 2 * lo * lo * hi + 4 * lo**3 + 4 * lo * hi * k)
        elif method == "iso_cts":  # the float32 route (svd._iso_cts_gram)
            from acetools.merging.svd import iso_cts_ranks

            r = lo
            k_c, s = iso_cts_ranks(r, T)
            p = T * s
            f = lo * lo * hi + 4 * lo**3 + 2 * lo * hi * k_c  # common subspace: Gram, eigh, other side
            if m <= n:  # residual through the complement U_perp: p x n coordinates, p² Gram
                per_task = 2 * p * m * n + p * p * n + 4 * p**3 + 2 * p * n * s + 2 * m * p * s
            else:  # Rᵀ R = τᵀ τ - Yᵀ Y
                per_task = 2 * k_c * m * n + m * n * n + k_c * n * n + 4 * n**3 + 2 * m * n * s + 2 * m * k_c * s
            polar_v = 2 * r * r * n + 6 * r**3 + 2 * r * r * n
            polar_u = 2 * p * p * m + 6 * p**3 + 2 * p * p * m  # only the task block: U_c is already orthonormal
            f += T * per_task + polar_v + polar_u + 2 * m * r * n
        elif method in ("tsv_m", "fb_tsv_m", "fb_iso_cts", "iso_c"):
            r = lo
            per_task = 2 * lo * lo * hi + 4 * lo**3 + 2 * lo * hi * (r // T)
            polar = 2 * (2 * r * r * hi + 4 * r**3 + 2 * r**3 + 2 * r * r * hi)
            f = (T if method != "iso_c" else 0) * per_task + polar + 2 * m * r * n
            if method == "fb_iso_cts":
                f += 2 * lo * lo * hi + 4 * lo**3 + T * 4 * m * n * int(0.8 * r)  # common subspace + projections
        elif method == "esm":
            N = esm_tokens
            k = m // T
            if n <= N:  # QR-reduced shift
                lo_, hi_ = min(n, m), max(n, m)
                per_task = 2 * N * n * n - 2 * n**3 / 3 + 2 * n * n * m + 2 * lo_**2 * hi_ + 4 * lo_**3
            else:
                per_task = 2 * N * n * m + 2 * min(N, m) ** 2 * max(N, m) + 4 * min(N, m) ** 3
            per_task += 2 * k * m * n
            Tk = T * k
            a_lo, a_hi = min(Tk, n), max(Tk, n)
            whiten_a = 3 * a_lo**2 * a_hi + 6 * a_lo**3  # Gram, eigh, polar factor of A_cat
            whiten_p = m * Tk * Tk + 4 * Tk**3  # Gram and eigh of P_cat (its polar factor is never formed)
            if n < Tk:  # P_cat (Q (diag(1/sigma) (Qᵀ whiten(A_cat))))
                product = 4 * Tk * Tk * n + 2 * m * Tk * n
            else:  # (P_cat (Q diag(1/sigma) Qᵀ)) whiten(A_cat)
                product = 2 * Tk**3 + 2 * m * Tk * Tk + 2 * m * Tk * n
            f = T * per_task + whiten_a + whiten_p + product
            if (m, n) == (w, w):
                f = T * (2 * w**3 + 4 * w**3) + 2 * (4 * w**3 + 6 * w**3)  # out_proj takes TSV-M
        else:
            return float("nan")
        total += f
    return blocks * total / 1e9


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


def _pct_own_dtype(df, gemm: dict):
    """Achieved rate against the GEMM peak of the run's arithmetic: float32 for
    ``precision=float32`` variants and fusion-bench's float32 SVD methods, float64 otherwise."""
    f32 = df.variant.astype(str).str.contains("float32") | df.method.str.startswith("fb_")
    peak = f32.map({True: gemm.get("gemm_f32", float("nan")), False: gemm.get("gemm_f64", float("nan"))})
    return 100 * df.gflops_per_s / peak


def _run_key(row: dict) -> tuple:
    """What identifies one timed run (the GEMM probe is one run whatever its other fields)."""
    if row["method"] == "gemm":
        return ("gemm",)
    return (row["method"], int(row["n_tasks"]), row["world"], row["code"], row["variant"], row.get("entry", "func"),
            row.get("rep", 0))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[8], help="numbers of experts T")
    ap.add_argument("--methods", nargs="+", default=None, help="our methods (default: all registered)")
    ap.add_argument("--blocks", type=int, default=12, help="transformer blocks (ViT-B/32 has 12)")
    ap.add_argument("--width", type=int, default=WIDTH, help="model width (ViT-B/32: 768)")
    ap.add_argument("--wudi-steps", type=int, default=300, help="Adam steps for WUDI (ours and fusion-bench's)")
    ap.add_argument("--esm-tokens", type=int, default=1600, help="proxy rows per task for ESM (32 images x 50 tokens)")
    ap.add_argument("--no-theirs", action="store_true", help="skip the fusion-bench runs")
    ap.add_argument("--theirs", nargs="+", default=sorted(set(THEIRS.values())),
                    help="which fusion-bench runs to include (default: all that match a method; fb_tsv_m always)")
    ap.add_argument("--norm-spread", type=float, default=1.0,
                    help="s of the log-normal per-expert norm factors exp(s z) of the 'lognormal' world")
    ap.add_argument("--ace-worlds", nargs="+", default=["lognormal", "equal"], choices=list(WORLDS),
                    help="worlds ACE runs on (lognormal: flagged path; equal: unflagged path)")
    ap.add_argument("--ace-float32", action="store_true", help="also time ACE with precision='float32'")
    ap.add_argument("--before", default=None,
                    help="a folder holding another acetools package, or a git revision: also time its methods")
    ap.add_argument("--interleave", type=int, default=1,
                    help="with --before: N alternating now/before runs per method; min, median and ratios saved")
    ap.add_argument("--entry", nargs="+", default=["func"], choices=["func", "merge"],
                    help="func: the method on precomputed task vectors (default); merge: acetools.merge on the "
                         "state dicts, with its extra memory against (T + 2) x the largest tensor")
    ap.add_argument("--quick", action="store_true", help="1 block of width 192, 5 WUDI steps: a smoke run")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="folder for the CSV/JSON")
    ap.add_argument("--repeat", type=int, default=1,
                    help="merges per run; the fastest counts (steadier on a shared machine)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads per run (torch, OpenMP and OpenBLAS); default: the libraries' own choice")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows of OUT/merge_speed_partial.json from an interrupted run and time only the "
                         "rest (ratios then mix two runs: the JSON's meta says so)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="run the workers with glibc's default allocator settings instead of MALLOC_ENV (memory then "
                         "depends on what earlier frees left in the heap)")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    return ap


def _plan(args: argparse.Namespace, methods: list[str]) -> list[tuple]:
    """The runs, ``(method, T, world, tree, variant, entry)``: ours and theirs back to back, so that both see the
    same machine load; the GEMM probe first."""
    trees = ["-"] + ([args.before] if args.before else [])
    runs = [("gemm", 0, "lognormal", "-", "-", "func", 0)]
    pairs = []
    for t in args.tasks:
        for m in methods:
            worlds = args.ace_worlds if m == "ace" else ["lognormal"]
            for entry in args.entry:
                for world in worlds:
                    pairs.append([(m, t, world, tree, "-", entry) for tree in trees])
                    if m == "ace" and args.ace_float32:
                        pairs.append([(m, t, world, "-", "precision=float32", entry)])
            if m in THEIRS and not args.no_theirs and THEIRS[m] in args.theirs:
                pairs.append([(THEIRS[m], t, "lognormal", "-", "-", "func")])
        if not args.no_theirs and "fb_tsv_m" not in [p[0][0] for p in pairs]:
            pairs.append([("fb_tsv_m", t, "lognormal", "-", "-", "func")])
    for pair in pairs:  # now, before, now, before, ... for each pair in turn
        runs += [run + (i,) for i in range(max(1, args.interleave)) for run in pair]
    return runs


def _before_tree(before: str | None) -> str | None:
    """``--before`` as a folder: itself; as a git revision: its ``acetools`` extracted to a temporary folder."""
    if before is None or Path(before).is_dir():
        return None if before is None else str(Path(before).resolve())
    tar = subprocess.run(["git", "-C", str(HERE.parent), "archive", before, "acetools"], capture_output=True)
    if tar.returncode != 0:
        raise SystemExit(f"--before {before}: neither a folder nor a git revision ({tar.stderr.decode().strip()})")
    tree = tempfile.mkdtemp(prefix=f"merge_speed_{before}_")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as tf:
        tf.extractall(tree, filter="data")
    return tree


def interleaved_summary(rows: list[dict]):
    """Min and median seconds, CPU seconds and peak per method, world, variant and code, with now/before ratios."""
    import pandas as pd

    df = pd.DataFrame([r for r in rows if r["method"] != "gemm" and "error" not in r])
    keys = ["method", "world", "variant", "entry", "n_tasks", "code"]
    out = df.groupby(keys).agg(runs=("seconds", "size"), **{f"{c}_{f}": (c, f) for c in
                               ("seconds", "cpu_seconds", "peak_extra_mb") for f in ("min", "median")}).reset_index()
    now, before = (out[out.code == c].set_index(keys[:-1]) for c in ("now", "before"))
    for c in ("seconds_min", "seconds_median", "cpu_seconds_min", "cpu_seconds_median", "peak_extra_mb_min"):
        out[f"ratio_{c}"] = [now[c].get(k, float("nan")) / before[c].get(k, float("nan")) if code == "now"
                             else float("nan") for k, code in zip(map(tuple, out[keys[:-1]].values), out.code)]
    return out


def _execute(args: argparse.Namespace, runs: list[tuple]) -> tuple[list[dict], set]:
    """Each run in a fresh subprocess; rows so far are kept in OUT/merge_speed_partial.json."""
    rows, done = [], set()
    partial = args.out / "merge_speed_partial.json"
    if args.resume and partial.exists():
        rows = [r for r in json.loads(partial.read_text()) if "error" not in r]
        done = {_run_key(r) for r in rows}
        print(f"  resuming: {len(rows)} row(s) kept from {partial}", file=sys.stderr, flush=True)
    env = dict(os.environ)
    if not args.default_malloc:
        env.update(MALLOC_ENV)
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
                   MKL_NUM_THREADS=str(args.threads))
    for m, t, world, tree, variant, entry, i in runs:
        code = "now" if tree == "-" else "before"
        if _run_key({"method": m, "n_tasks": t, "world": world, "code": code, "variant": variant,
                     "entry": entry, "rep": i}) in done:
            continue
        cmd = [sys.executable, __file__, "--worker", m, str(t), str(args.blocks), str(args.wudi_steps),
               str(args.esm_tokens), str(args.width), world, tree, str(args.norm_spread), variant, str(args.repeat),
               entry]
        label = f"{m} T={t} world={world} code={code} {variant} entry={entry} run={i}"
        print(f"  running {label} ...", file=sys.stderr, flush=True)
        # this checkout's acetools, or another checkout's (e.g. main's, for before/after)
        tree_path = os.pathsep.join(x for x in (str(HERE.parent) if tree == "-" else tree, env.get("PYTHONPATH")) if x)
        res = subprocess.run(cmd, capture_output=True, text=True, env={**env, "PYTHONPATH": tree_path})
        if res.returncode != 0:
            print(f"  {label} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
            rows.append({"method": m, "world": world, "code": code, "variant": variant, "entry": entry,
                         "n_tasks": t, "blocks": args.blocks, "width": args.width, "seconds": float("nan"),
                         "peak_extra_mb": float("nan"),
                         "error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "failed"})
            continue
        row = {**json.loads(res.stdout.strip().splitlines()[-1]), "rep": i}
        rows.append(row)
        args.out.mkdir(parents=True, exist_ok=True)  # rows so far, in case the session is cut short
        partial.write_text(json.dumps(rows, indent=2))
        if m != "gemm":
            print(f"    {row['seconds']:.1f} s wall, {row['cpu_seconds']:.1f} s cpu, {row['peak_extra_mb']:.0f} MiB",
                  file=sys.stderr, flush=True)
    return rows, done


def _table(args: argparse.Namespace, rows: list[dict], gemm: dict):
    """Every run with its ratios to fusion-bench and its arithmetic rate (a DataFrame)."""
    import pandas as pd

    df = pd.DataFrame([r for r in rows if r["method"] != "gemm"])
    if "entry" not in df:
        df["entry"] = "func"
    theirs = df[df.method.str.startswith("fb_")].groupby(["method", "n_tasks"]).seconds.min()
    df["fusion_bench_seconds"] = [theirs.get((THEIRS.get(m, ""), t), float("nan"))
                                  for m, t in zip(df.method, df.n_tasks)]
    df["ours/theirs"] = df.seconds / df.fusion_bench_seconds
    df["ratio_vs_fb_tsv_m"] = [s / theirs.get(("fb_tsv_m", t), float("nan")) for s, t in zip(df.seconds, df.n_tasks)]
    df["gflop"] = [model_flops(m, t, args.blocks, args.width, 0.0 if f != f else f, args.esm_tokens)
                   for m, t, f in zip(df.method, df.n_tasks, df.get("flagged", pd.Series([float("nan")] * len(df))))]
    df["gflops_per_s"] = df.gflop / df.seconds
    df["pct_f64_gemm"] = 100 * df.gflops_per_s / gemm.get("gemm_f64", float("nan"))
    df["pct_gemm_own_dtype"] = _pct_own_dtype(df, gemm)
    return df


def _save_and_print(args: argparse.Namespace, df, rows: list[dict], gemm: dict, resumed: int) -> None:
    import pandas as pd

    ours = df[~df.method.str.startswith("fb_")].copy()
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "merge_speed_raw.csv", index=False)
    ours.to_csv(args.out / "merge_speed.csv", index=False)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "blocks": args.blocks, "width": args.width, "wudi_steps": args.wudi_steps, "esm_tokens": args.esm_tokens,
            "norm_spread": args.norm_spread, "repeat": args.repeat, "threads_arg": args.threads,
            "before": str(args.before) if args.before else None, "resumed_rows": resumed,
            "load_average_at_end": os.getloadavg(), "malloc": "default" if args.default_malloc else MALLOC_ENV,
            **gemm}
    try:
        import torch

        meta.update(torch=torch.__version__, threads=torch.get_num_threads())
    except Exception:
        pass
    (args.out / "merge_speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    cols = [c for c in ("method", "world", "code", "variant", "entry", "n_tasks", "flagged", "seconds", "cpu_seconds",
                        "peak_extra_mb", "peak_sampled_mb", "out_mb", "bound_mb", "ours/theirs", "ratio_vs_fb_tsv_m",
                        "gflop", "gflops_per_s", "pct_f64_gemm", "pct_gemm_own_dtype")
            if c in df]
    if args.before and args.interleave > 1:
        summary = interleaved_summary(rows)
        summary.to_csv(args.out / "merge_speed_interleaved.csv", index=False)
        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(summary.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"GEMM peak: float64 {gemm.get('gemm_f64', float('nan')):.0f} GFLOP/s, "
          f"float32 {gemm.get('gemm_f32', float('nan')):.0f} GFLOP/s")
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.worker:
        m, t, b, w, n, width, world, tree, spread, variant, repeat, entry = (args.worker + ["1", "func"])[:12]
        print(json.dumps(worker(m, int(t), int(b), int(w), int(n), int(width), world, tree, float(spread), variant,
                                int(repeat), entry)))
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
    args.before = _before_tree(args.before)
    rows, done = _execute(args, _plan(args, methods))
    gemm = next((r for r in rows if r["method"] == "gemm" and "gemm_f64" in r), {})
    _save_and_print(args, _table(args, rows, gemm), rows, gemm, len(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
