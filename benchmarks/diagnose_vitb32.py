"""Time `acetools.files.diagnose` on a ViT-B/32-sized set: random tensors with the visual tower's shapes.

    python3 benchmarks/diagnose_vitb32.py [--tasks 8] [--dir DIR] [--ace] [--report]

Writes a base and ``--tasks`` experts as safetensors (the open_clip ViT-B/32 visual tower's 152
keys, 88 M parameters; task vectors = a rank-16 part plus dense noise, ||tau||/||W0|| ~ 0.03),
then times :func:`acetools.files.diagnose.diagnose` reading them from disk (and, with ``--report``,
the whole report: papermill + HTML). Prints seconds and the peak resident memory. The
numbers depend on the machine and its load; say both when quoting them.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
from _shapes import vit_b32_visual_shapes  # benchmarks/_shapes.py, beside this script

WIDTH, LAYERS, MLP, PATCH, GRID, EMBED = 768, 12, 3072, 32, 7, 512


def vitb32_shapes() -> dict[str, tuple[int, ...]]:
    """The open_clip ViT-B/32 visual tower's parameter shapes (prefix ``visual.``)."""
    return vit_b32_visual_shapes(LAYERS, WIDTH)


def write_set(folder: Path, n_tasks: int, seed: int = 0) -> tuple[Path, list[Path]]:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    shapes = vitb32_shapes()
    base = {k: torch.randn(s, generator=g) * (0.02 if len(s) > 1 else 1.0) for k, s in shapes.items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(base, str(folder / "base.safetensors"))
    paths = []
    for t in range(n_tasks):
        ex = {}
        for k, w in base.items():
            if w.ndim == 2:
                r = 16
                low = torch.randn(w.shape[0], r, generator=g) @ torch.randn(r, w.shape[1], generator=g)
                tau = low / low.norm() * 0.03 * w.norm() + 1e-4 * torch.randn(w.shape, generator=g)
            else:
                tau = 1e-3 * torch.randn(w.shape, generator=g)
            ex[k] = (w + tau).contiguous()
        p = folder / f"task{t}.safetensors"
        save_file(ex, str(p))
        paths.append(p)
    return folder / "base.safetensors", paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the set (default: a temporary folder)")
    ap.add_argument("--ace", action="store_true", help="also ACE's W_pre spectrum per matrix")
    ap.add_argument("--report", action="store_true", help="time the whole report (papermill + HTML) too")
    args = ap.parse_args(argv)
    from acetools.files.diagnose import diagnose, run_report

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        t0 = time.perf_counter()
        base, experts = write_set(folder, args.tasks)
        print(f"wrote base + {args.tasks} experts in {time.perf_counter() - t0:.1f} s to {folder}", flush=True)
        t0 = time.perf_counter()
        d = diagnose(str(base), [str(p) for p in experts], layout="open_clip", ace=args.ace)
        secs = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"diagnose: {len(d.layers)} matrices, {args.tasks} tasks, ace={args.ace}: {secs:.1f} s, "
              f"peak RSS {rss:.0f} MiB, torch threads {torch.get_num_threads()}", flush=True)
        print(d.summary[["metric", "value"]].to_string(index=False))
        if args.report:
            rec = run_report(base, experts, folder / "report", layout="open_clip", ace=args.ace)
            print(f"report (papermill + HTML): {rec['seconds']:.1f} s -> {rec['html']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
