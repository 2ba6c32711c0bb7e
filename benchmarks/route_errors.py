"""Float64 error of each merge route: the cheap routes against the LAPACK reference routes.

For every block shape of a ViT-B/32-like visual tower (attn.in_proj 3w x w, attn.out_proj w x w,
mlp.c_fc 4w x w, mlp.c_proj w x 4w) and T experts with low-rank-plus-noise task vectors of
log-normal norms, it computes each method's merged matrix three ways:

* ``reference``: float64 inputs through the float64 LAPACK routes (SVDs, LU; for ACE the
  stage-by-stage composition of the public stage functions, every covariance held at once);
* ``before``: what the library computed for float32 inputs before the cheap routes (float32
  SVDs: the same code with the Gram/QR shortcuts switched off); ACE was float64 already;
* ``now``: the library's default route for float32 inputs (ACE also with ``precision="float32"``).

and prints the relative error max|W - W_ref| / max|W_ref| of ``before`` and ``now``.

    python benchmarks/route_errors.py                 # width 384 (half of ViT-B/32), T = 8
    python benchmarks/route_errors.py --width 768     # the real shapes (slow: the float32 SVD routes)

Results: benchmarks/results/route_errors.csv (docs/performance.md quotes them).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch

from acetools.merging import ace as A
from acetools.merging import esm as E
from acetools.merging import svd as V

HERE = Path(__file__).resolve().parent


def taus_for(shape, T, g, spread=1.0, rank=16):
    scales = torch.exp(spread * torch.randn(T, generator=g, dtype=torch.float64))
    out = []
    for s in scales:
        f64 = dict(generator=g, dtype=torch.float64)
        L = torch.randn(shape[0], rank, **f64) @ torch.randn(rank, shape[1], **f64)
        out.append(float(s) * 1e-3 * (L / rank**0.5 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)))
    return out


def acts_for(d_in, T, n, g):
    mix = [torch.randn(32, d_in, generator=g, dtype=torch.float64) / 32**0.5 for _ in range(T)]
    f64 = dict(generator=g, dtype=torch.float64)
    return [torch.randn(n, 32, **f64) @ m + 0.1 * torch.randn(n, d_in, **f64) for m in mix]


@contextlib.contextmanager
def old_float32_routes():
    """Switch the cheap routes off: float32 SVDs everywhere, as before they existed."""
    saved = (V._gram_ok, E.top_shift_factors, E._GRAM_WHITEN)
    V._gram_ok, E.top_shift_factors, E._GRAM_WHITEN = (lambda X: False), (lambda *a: None), False
    try:
        yield
    finally:
        V._gram_ok, E.top_shift_factors, E._GRAM_WHITEN = saved


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def stagewise_ace(dWs, gate="auto"):
    """ACE as the library computed it before the streamed route: the stages one after another."""
    dtype = dWs[0].dtype
    dWs = [d.double() for d in dWs]
    e = A.task_energies(dWs)
    flag = A.heterogeneity(dWs) > 0.3 if gate == "auto" else gate == "on"
    covs = A.normalize_covariances([A.estimate_covariance(d) for d in dWs], eps=1e-2, normalize=flag)
    C = A.structural_prior(covs.Sigma_tilde, energy=float(e.mean()) if flag else None)
    W = A.closed_form([A.center_rows(d) for d in dWs], covs, C)
    if flag:
        W = A.spectral_refine(W, dWs, covs.Sigma_tilde, covs.mean_reg()).W
    return W.to(dtype), flag


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=None, help="ESM proxy rows (default: 1600 * width / 768)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "route_errors.csv")
    args = ap.parse_args(argv)
    w, T = args.width, args.tasks
    n_tok = args.tokens or 1600 * w // 768
    shapes = {"attn.in_proj": (3 * w, w), "attn.out_proj": (w, w), "mlp.c_fc": (4 * w, w), "mlp.c_proj": (w, 4 * w)}
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, shape in shapes.items():
        t64 = taus_for(shape, T, g)
        t32 = [t.float() for t in t64]
        for gate, taus64 in (("on", t64), ("off", [t / t.norm() * 0.05 for t in t64])):
            ref, _ = stagewise_ace(taus64, gate)
            taus32 = [t.float() for t in taus64]
            rows.append(dict(method=f"ace (gate {gate})", key=name,
                             before=rel(stagewise_ace(taus32, gate)[0], ref),
                             now=rel(A.ace_matrix(taus32, gate=gate)[0], ref),
                             now_float64_math=rel(A.ace_matrix(taus64, gate=gate)[0], ref),
                             now_precision_float32=rel(A.ace_matrix(taus32, gate=gate, precision="float32")[0], ref)))
        for mname, fn in (("tsv_m", V.tsv_merge_matrix), ("iso_c", V.iso_c_matrix), ("iso_cts", V.iso_cts_matrix)):
            ref = fn(t64)
            with old_float32_routes():
                before = fn(t32)
            row = dict(method=mname, key=name, before=rel(before, ref), now=rel(fn(t32), ref))
            if mname == "iso_cts":  # its float32 route's own maths, run on float64 inputs
                row["now_float64_math"] = rel(V._iso_cts_gram(torch.stack(t64), *V.iso_cts_ranks(min(shape), T)), ref)
            rows.append(row)
        if name != "attn.out_proj":
            X64 = acts_for(shape[1], T, n_tok, g)
            X32 = [x.float() for x in X64]
            ref = E.esm_merge_matrix(t64, X64)
            with old_float32_routes():
                ref_old_f64 = E.esm_merge_matrix(t64, X64)
                before = E.esm_merge_matrix(t32, X32)
            rows.append(dict(method="esm", key=name, before=rel(before, ref_old_f64),
                             now=rel(E.esm_merge_matrix(t32, X32), ref_old_f64),
                             now_float64_math=rel(ref, ref_old_f64)))
        print(*(f"{r['method']:16s} {r['key']:14s} before {r['before']:.1e}  now {r['now']:.1e}"
                for r in rows if r["key"] == name),
              sep="\n", flush=True)
    import pandas as pd

    df = pd.DataFrame(rows)
    df.insert(0, "width", w)
    df.insert(1, "n_tasks", T)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.1e}"))


if __name__ == "__main__":
    main()
