"""Conditioning, not luck: every solve, inverse and factorisation of the engine decides singularity
from a measured quantity (docs/methods.md §Numerics), so no answer hangs on a CPU's kernels.

Tolerances are derived from each problem's condition number (``_tol``), not fixed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import acetools
from acetools.merging import linalg as L
from acetools.merging.ace import ace_matrix
from acetools.merging.esm import esm_merge_matrix, whiten
from acetools.merging.regmean import regmean_matrix

F64 = torch.float64
EPS64 = float(np.finfo(np.float64).eps)


def _tol(A: np.ndarray, X: np.ndarray, c: float = 10.0) -> float:
    """Forward-error bound of a backward-stable solve X = B A^-1: c · n · eps · cond(A) · max|X|."""
    return c * A.shape[0] * EPS64 * float(np.linalg.cond(A)) * float(np.abs(X).max())


def _rank_one_world(seed=3, d_out=6, d_in=5, T=3):
    g = torch.Generator().manual_seed(seed)
    base = {"l.weight": torch.randn(d_out, d_in, generator=g, dtype=F64)}
    experts = [{"l.weight": base["l.weight"] + 0.3 * torch.randn(d_out, d_in, generator=g, dtype=F64)}
               for _ in range(T)]
    vs = [torch.randn(d_in, 1, generator=g, dtype=F64) for _ in range(T)]
    return base, experts, [{"l.weight": v @ v.T} for v in vs]


def test_issue_example_given_rank_one_covariances_warns_and_returns_the_pseudo_inverse_answer():
    """The issue's case: estimator='given', a rank-1 PSD covariance per task, eps=0. MKL's LU found a pivot of
    1e-16 instead of 0 here and returned a finite wrong update (max 2.56 against 0.686) without a warning."""
    base, experts, covs = _rank_one_world()
    with pytest.warns(RuntimeWarning, match=r"'l\.weight'.*singular or ill-conditioned.*rcond"):
        out = acetools.merge("ace", base, experts, estimator="given", covariances=covs, eps=0.0)
    upd = (out["l.weight"] - base["l.weight"]).numpy()
    taus = [(e["l.weight"] - base["l.weight"]).numpy() for e in experts]
    S = [c["l.weight"].numpy() for c in covs]
    ref = sum(t @ s for t, s in zip(taus, S)) @ np.linalg.pinv(sum(S))  # the documented answer, by numpy
    np.testing.assert_allclose(upd, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def test_solve_right_decides_from_the_rcond_estimate_not_from_lapack():
    g = torch.Generator().manual_seed(1)
    Q1 = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=F64)).Q
    Q2 = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=F64)).Q
    B = torch.randn(4, 8, generator=g, dtype=F64)
    for smallest, singular in ((1e-3, False), (1e-8, False), (1e-13, True), (1e-17, True)):
        s = torch.tensor([1.0] * 7 + [smallest], dtype=F64)
        A = (Q1 * s) @ Q2.T
        LU, piv, info = torch.linalg.lu_factor_ex(A)
        assert int(info) == 0  # LAPACK finds no exact zero pivot: only the measurement can tell
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            X = L.solve_right(B, A, name="blocks.1.attn.q_proj.weight")
        warned = [w for w in rec if issubclass(w.category, RuntimeWarning)]
        assert bool(warned) == singular, (smallest, [str(w.message) for w in warned])
        if singular:
            assert "blocks.1.attn.q_proj.weight" in str(warned[0].message)
            ref = B.numpy() @ np.linalg.pinv(A.numpy(), rcond=L.RCOND_MIN)
            np.testing.assert_allclose(X.numpy(), ref, atol=1e-12 * np.abs(ref).max())
        else:
            ref = np.linalg.solve(A.numpy().T, B.numpy().T).T
            np.testing.assert_allclose(X.numpy(), ref, rtol=0, atol=_tol(A.numpy(), ref))


def test_rcond_estimate_tracks_the_true_one_norm_condition_number():
    g = torch.Generator().manual_seed(2)
    for n, decades in ((5, 2), (20, 6), (60, 9)):
        Q1 = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64)).Q
        Q2 = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64)).Q
        A = (Q1 * torch.logspace(0, -decades, n, dtype=F64)) @ Q2.T
        true = 1.0 / np.linalg.cond(A.numpy(), 1)
        est = L.rcond_estimate(A)
        slack = 1 + 10 * n * EPS64 / true  # both numbers carry an error ~ n eps cond
        assert true <= est * slack and est <= 10 * true, (n, true, est)  # a lower bound on ||A^-1||_1
    assert L.rcond_estimate(torch.zeros(3, 3, dtype=F64)) == 0.0
    assert L.rcond_estimate(torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=F64)) < L.RCOND_MIN
    assert L.rcond_estimate(torch.tensor([[1.0, float("nan")], [0.0, 1.0]], dtype=F64)) == 0.0


def test_cholesky_route_refuses_a_factorable_but_singular_matrix():
    """A PSD matrix of rank 2 plus 1e-14 I: the Cholesky succeeds (every pivot positive), the pivot ratio
    says cond ~ 1e14, so the Sherman–Morrison route declines and the LU route warns."""
    g = torch.Generator().manual_seed(4)
    V = torch.randn(6, 2, generator=g, dtype=F64)
    M = V @ V.T + 1e-14 * torch.eye(6, dtype=F64)
    assert int(torch.linalg.cholesky_ex(M)[1]) == 0
    B = torch.randn(3, 6, generator=g, dtype=F64)
    assert L.solve_spd_rank_one(B, M.clone()) is None
    assert L.solve_spd_rank_one(B, M.clone(), overwrite=True) is None
    good = M + torch.eye(6, dtype=F64)
    X = L.solve_spd_rank_one(B, good.clone(), torch.ones(6, dtype=F64))
    A = (good + torch.ones(6, 1, dtype=F64) @ torch.ones(1, 6, dtype=F64)).numpy()
    ref = np.linalg.solve(A.T, B.numpy().T).T
    np.testing.assert_allclose(X.numpy(), ref, rtol=0, atol=_tol(A, ref))


def test_cholesky_route_refuses_a_vanishing_sherman_morrison_denominator():
    M = torch.eye(3, dtype=F64)
    c = torch.full((3,), -1.0 / 3.0, dtype=F64)  # 1 + 1ᵀ M^-1 c = 0: M + 1 cᵀ is singular
    assert L.solve_spd_rank_one(torch.ones(2, 3, dtype=F64), M, c) is None


def test_ace_sherman_morrison_path_warns_with_the_layer_on_a_singular_system():
    """The 'ace' estimator with eps = 0 and d_in > T · d_out: sum_t Sigma_t has rank <= T d_out < d_in."""
    g = torch.Generator().manual_seed(5)
    dWs = [torch.randn(2, 9, generator=g, dtype=F64) for _ in range(3)]
    with pytest.warns(RuntimeWarning, match=r"'blocks\.2\.mlp\.fc1\.weight'.*pseudo-inverse"):
        W, _ = ace_matrix(dWs, eps=0.0, gate="off", refine=False, name="blocks.2.mlp.fc1.weight")
    assert torch.isfinite(W).all()


def test_regmean_singular_gram_warns_with_the_key_and_returns_the_pseudo_inverse():
    g = torch.Generator().manual_seed(6)
    W = [torch.randn(4, 5, generator=g, dtype=F64) for _ in range(2)]
    xs = [torch.randn(5, 1, generator=g, dtype=F64) for _ in range(2)]
    grams = [x @ x.T for x in xs]  # rank 1 each, and alpha = 1 keeps them singular
    with pytest.warns(RuntimeWarning, match=r"'enc\.0\.dense\.weight'"):
        got = regmean_matrix(W, grams, alpha=1.0, key="enc.0.dense.weight")
    A = sum(gr.numpy() for gr in grams)
    ref = sum(w.numpy() @ gr.numpy() for w, gr in zip(W, grams)) @ np.linalg.pinv(A, rcond=L.RCOND_MIN)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-12 * np.abs(ref).max())


def test_whitening_of_a_rank_deficient_matrix_is_the_partial_isometry_and_names_the_layer():
    g = torch.Generator().manual_seed(7)
    M = torch.randn(10, 3, generator=g, dtype=F64) @ torch.randn(3, 6, generator=g, dtype=F64)
    with pytest.warns(RuntimeWarning, match=r"'b3\.c_fc'.*rank 3 < 6"):
        W64 = whiten(M, name="b3.c_fc")
    with pytest.warns(RuntimeWarning, match=r"'b3\.c_fc'"):
        W32 = whiten(M.float(), name="b3.c_fc")
    U, S, Vh = np.linalg.svd(M.numpy(), full_matrices=False)
    ref = U[:, :3] @ Vh[:3] * S.mean()  # unique, whatever LAPACK's basis of the null space
    np.testing.assert_allclose(W64.numpy(), ref, atol=1e-12 * np.abs(ref).max())
    np.testing.assert_allclose(W32.double().numpy(), ref, atol=1e-5 * np.abs(ref).max())


def test_esm_with_k_above_the_shift_rank_warns_and_float32_matches_float64():
    """k = 8 > rank 7 of the shift: X is a centred (LayerNorm-like) output of width 8, so X ΔWᵀ has rank 7.
    Before, ESM kept an arbitrary null-space direction and float32 and float64 disagreed."""
    g = torch.Generator().manual_seed(8)
    taus = [0.1 * torch.randn(16, 8, generator=g, dtype=F64) for _ in range(2)]
    Xs = []
    for _ in range(2):
        X = torch.randn(40, 8, generator=g, dtype=F64)
        Xs.append(X - X.mean(dim=1, keepdim=True))  # every row sums to zero: rank 7
    with pytest.warns(RuntimeWarning, match=r"'h\.0\.mlp\.c_fc\.weight'.*k = 8 exceeds.*rank 7"):
        W64 = esm_merge_matrix(taus, Xs, name="h.0.mlp.c_fc.weight")
    with pytest.warns(RuntimeWarning, match=r"k = 8 exceeds"):
        W32 = esm_merge_matrix([t.float() for t in taus], [X.float() for X in Xs], name="h.0.mlp.c_fc.weight")
    rel = float((W32.double() - W64).abs().max() / W64.abs().max())
    assert rel < 1e-4, rel
