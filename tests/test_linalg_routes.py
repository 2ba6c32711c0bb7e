"""The cheap exact routes of acetools.merging.linalg and where the methods take them."""

from __future__ import annotations

import pytest
import torch

from acetools.merging import linalg as L
from acetools.merging.svd import iso_c_matrix, iso_cts_matrix, tsv_merge_matrix

F64 = torch.float64


def rand(shape, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=F64).to(dtype)


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("shape", [(40, 25), (25, 40)])
def test_gram_top_svd_matches_the_svd(shape):
    M = rand(shape, 0)
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    Uk, Sk, Vhk = L.gram_top_svd(M, 7)
    assert rel(Sk, S[:7]) < 1e-12
    assert rel(Uk @ torch.diag(Sk) @ Vhk, U[:, :7] @ torch.diag(S[:7]) @ Vh[:7]) < 1e-11


def test_gram_routes_refuse_ill_conditioned_spectra():
    M = rand((30, 10), 1) @ torch.diag(torch.logspace(0, -6, 10, dtype=F64))
    assert L.gram_top_svd(M, 10) is None  # sigma_1 / sigma_10 = 1e6 > 1e4
    assert L.gram_top_svd(M, 3) is not None
    assert L.gram_polar(M) is None
    assert L.gram_polar(torch.cat([M[:, :3], torch.zeros(30, 2, dtype=F64)], 1)) is None  # rank-deficient


@pytest.mark.parametrize("shape", [(30, 12), (12, 30), (15, 15)])
def test_gram_polar_matches_the_svd_polar(shape):
    M = rand(shape, 2)
    P, S = L.gram_polar(M)
    assert rel(P, L.polar(M)) < 1e-12
    assert rel(S, torch.linalg.svdvals(M)) < 1e-12


@pytest.mark.parametrize("shape,p", [((30, 12), 5), ((30, 12), 20), ((15, 15), 6), ((15, 15), 15), ((12, 30), 4)])
def test_gram_polar_times_equals_the_svd_polar_times_b(shape, p):
    """Both associations (factored for p < n, formed factor otherwise) and the wide case."""
    M = rand(shape, 9)
    B = rand((shape[1], p), 10)
    Y, S = L.gram_polar_times(M, B)
    assert rel(Y, L.polar(M) @ B) < 1e-12
    assert rel(S, torch.linalg.svdvals(M)) < 1e-12


def test_gram_polar_times_refuses_ill_conditioned_and_checks_shapes():
    Q1, Q2 = torch.linalg.qr(rand((20, 20), 11)).Q, torch.linalg.qr(rand((20, 20), 14)).Q
    M = (Q1 * torch.logspace(0, -6, 20, dtype=F64)) @ Q2.T  # kappa = 1e6
    B = rand((20, 3), 12)
    assert L.gram_polar_times(M, B) is None  # above the default 1e4
    Y, _ = L.gram_polar_times(M, B, max_ratio=1e8)
    assert rel(Y, L.polar(M) @ B) < 1e-3  # Gram error ~ eps64 kappa²
    with pytest.raises(ValueError, match="B is"):
        L.gram_polar_times(M, rand((7, 3), 13))


@pytest.mark.parametrize("top", [5, 30])  # LAPACK's subset driver (<= n/4), the full one sliced (> n/4)
def test_sym_eig_top_subset_equals_full(top):
    A = rand((50, 50), 3)
    G = A @ A.T
    G0 = G.clone()
    lam, Q = L.sym_eig(G)
    lt, Qt = L.sym_eig(G, top=top)
    assert torch.equal(G, G0)  # read only without overwrite=True
    lo, Qo = L.sym_eig(G.tril(), top=top, overwrite=True)  # only the lower triangle is read
    assert rel(lo, lam[:top]) < 1e-12 and rel(Qo.abs(), Q[:, :top].abs()) < 1e-8
    assert lt.shape == (top,) and Qt.shape == (50, top)
    assert torch.all(lam[:-1] >= lam[1:]) and torch.all(lt[:-1] >= lt[1:])  # descending
    assert rel(lt, lam[:top]) < 1e-12
    assert rel((Qt * lt) @ Qt.T, (Q[:, :top] * lam[:top]) @ Q[:, :top].T) < 1e-10


def test_solve_spd_rank_one_matches_lu():
    A = rand((20, 20), 4)
    M = A @ A.T + torch.eye(20, dtype=F64)
    c = rand((20,), 5).abs()
    B = rand((7, 20), 6)
    X = L.solve_spd_rank_one(B, M.clone(), c)
    assert rel(X, B @ torch.linalg.inv(M + torch.ones(20, 1, dtype=F64) @ c[None])) < 1e-11
    assert rel(L.solve_spd_rank_one(B, M.clone()), B @ torch.linalg.inv(M)) < 1e-11
    M2 = M.clone()
    L.solve_spd_rank_one(B, M2, overwrite=True)
    assert torch.allclose(M2, torch.linalg.cholesky(M))  # the factor replaced M
    assert L.solve_spd_rank_one(B, -M.clone()) is None  # not positive definite: the caller takes LU


def _taus(shape, T, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape[0], 4, generator=g, dtype=F64) @ torch.randn(4, shape[1], generator=g, dtype=F64)
             + 0.3 * torch.randn(shape, generator=g, dtype=F64)).to(dtype) for _ in range(T)]


@pytest.mark.parametrize("fn", [tsv_merge_matrix, iso_c_matrix, iso_cts_matrix], ids=["tsv_m", "iso_c", "iso_cts"])
@pytest.mark.parametrize("shape", [(96, 32), (32, 96)])
def test_float32_inputs_take_the_gram_route_and_stay_close_to_float64(fn, shape, monkeypatch):
    t64 = _taus(shape, 4, 7, F64)
    ref = fn(t64)
    calls = []
    for where, name in (("linalg", "gram_top_svd"), ("svd", "gram_polar")):  # top_svd calls linalg's
        orig = getattr(L, name)
        monkeypatch.setattr(f"acetools.merging.{where}.{name}",
                            lambda *a, _o=orig, _n=name, **k: calls.append(_n) or _o(*a, **k))
    out = fn([t.float() for t in t64])
    assert out.dtype == torch.float32
    assert "gram_polar" in calls
    assert rel(out, ref) < 1e-5


def test_float32_rank_deficient_tasks_fall_back_to_the_svd(monkeypatch):
    t = _taus((40, 16), 1, 8, F64)[0]
    taus = [t, t, 2 * t, t]  # identical directions: U_cat is rank-deficient, the Gram polar refuses
    results = []
    orig = L.gram_polar
    monkeypatch.setattr("acetools.merging.svd.gram_polar", lambda *a, **k: results.append(orig(*a, **k)) or results[-1])
    out = tsv_merge_matrix([x.float() for x in taus])
    assert results and all(r is None for r in results)  # both polar factors went through the SVD
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("shape", [(96, 40), (40, 96), (48, 48)], ids=["tall", "wide", "square"])
@pytest.mark.parametrize("T", [2, 5])
def test_iso_cts_gram_route_equals_the_svd_route_in_float64(shape, T):
    """The float32 route (complement from D Dᵀ's eigenvectors for wide/square, Rᵀ R = Xᵀ X - Yᵀ Y
    for tall, block polar of U) is the same maths: on float64 inputs it matches the SVD route."""
    from acetools.merging.svd import _iso_cts_gram, iso_cts_ranks

    taus = _taus(shape, T, 20 + T, F64)
    ref = iso_cts_matrix(taus)  # float64 inputs take the SVD route
    out = _iso_cts_gram(torch.stack(taus), *iso_cts_ranks(min(shape), T))
    assert out is not None and out.dtype == F64
    assert rel(out, ref) < 1e-10


def test_iso_cts_tall_residual_falls_back_when_the_subtraction_would_lose_too_much():
    """A residual 1e-6 of the task vector: Xᵀ X - Yᵀ Y would cancel to noise, so the route refuses
    and R is formed explicitly; the result still matches the float64 SVD route."""
    from acetools.merging.svd import _tall_residual_top

    Q = torch.linalg.qr(rand((60, 60), 30)).Q
    U_c, U_perp = Q[:, :40], Q[:, 40:]
    X = U_c @ rand((40, 20), 31) + 1e-6 * U_perp @ rand((20, 20), 32)
    assert _tall_residual_top(X, U_c, 3) is None
    assert _tall_residual_top(U_c @ rand((40, 20), 31) + U_perp @ rand((20, 20), 32), U_c, 3) is not None
    Us, Ss, Vhs = _tall_residual_top(X + 0.1 * U_perp @ rand((20, 20), 33), U_c, 3)
    R = (X + 0.1 * U_perp @ rand((20, 20), 33))
    R = R - U_c @ (U_c.T @ R)
    U, S, Vh = torch.linalg.svd(R, full_matrices=False)
    assert rel(Ss, S[:3]) < 1e-10
    assert rel((Us * Ss) @ Vhs, (U[:, :3] * S[:3]) @ Vh[:3]) < 1e-8


def test_small_eigenproblems_hold_openblas_to_one_thread():
    """SciPy's OpenBLAS runs small eigenproblems on one thread (its idle workers would otherwise
    spin against PyTorch's products) and is restored afterwards; large ones keep its setting."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS)

    ctl = threadpoolctl.ThreadpoolController().select(internal_api="openblas")
    if not ctl.lib_controllers:
        pytest.skip("no OpenBLAS loaded")
    with ctl.limit(limits=2):
        before = [c.num_threads for c in ctl.lib_controllers]
        with L._blas_threads_for(64):
            inside = [c.get_num_threads() for c in ctl.lib_controllers]
        after = [c.get_num_threads() for c in ctl.lib_controllers]
        with L._blas_threads_for(L._ONE_THREAD_MAX_N + 1):
            large = [c.get_num_threads() for c in ctl.lib_controllers]
    assert inside == [1] * len(inside)
    assert after == before and large == before
