"""ACE-Merging (docs/methods.md §ACE) against an independent float64 transcription of its equations,
plus the unified-framework identities (weight averaging, WUDI, RegMean), invariances and errors."""

from __future__ import annotations

import itertools
import math
import statistics
import warnings

import pytest
import torch

from acetools.merging import merge, task_vectors
from acetools.merging.ace import (
    ace_matrix,
    ace_with_diagnostics,
    closed_form,
    estimate_covariance,
    estimator_preset,
    heterogeneity,
    normalize_covariances,
    spectral_refine,
    structural_prior,
)
from tests.conftest import make_world

F64 = torch.float64


# ----------------------------------------------------------------- the reference transcription


def ref_ace(dWs, *, tau=0.3, eps=1e-2, k_frac=0.3, gate="auto", trace_norm=True, prior=True,
            refine=True, numerator="centered"):
    """docs/methods.md §ACE, Eqs. (ACE.3)-(ACE.14), line by line, in float64 (switches as documented in ace.py)."""
    dWs = [d.to(F64) for d in dWs]
    T, d_in = len(dWs), dWs[0].shape[1]
    eye = torch.eye(d_in, dtype=F64)
    e = torch.tensor([float((d**2).sum()) for d in dWs], dtype=F64)
    ell = torch.log(e + 1e-12)
    gamma = float(torch.var(ell) / (torch.mean(ell) ** 2 + 1e-12)) if T > 1 else 0.0
    hetero = {"auto": gamma > tau, "on": True, "off": False}[gate]
    norm = hetero and trace_norm
    Wc, Sc, R = [], [], []
    for d in dWs:
        wc = d - d.mean(dim=0)  # subtract the mean row
        S = wc.T @ wc
        tr = torch.trace(S) + 1e-12
        sc = S / tr if norm else S
        Wc.append(wc)
        Sc.append(sc)
        R.append(sc + (eps / tr if norm else eps) * eye)
    A = sum(R)
    if prior:
        colmean = (torch.ones(1, d_in, dtype=F64) @ sum(Sc)) / d_in
        C = torch.ones(d_in, 1, dtype=F64) @ colmean
        if hetero:
            C = C / (e.mean() + 1e-12)
        A = A + C
    N = Wc if numerator == "centered" else dWs
    B = sum(n @ r for n, r in zip(N, R))
    Wpre = B @ torch.linalg.inv(A)
    if hetero and refine:
        Rbar = sum(R) / T
        D = Wpre + sum(d @ (sc - Rbar) for d, sc in zip(dWs, Sc))
        U, S, Vh = torch.linalg.svd(D)
        k = math.floor(k_frac * min(D.shape))
        Wpre = Wpre + S[:k].mean() * U[:, :k] @ Vh[:k, :]
    return Wpre, gamma, hetero


def rand_taus(shape, scales, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return [s * torch.randn(shape, generator=g, dtype=F64).to(dtype) for s in scales]


HOMO = (0.01, 0.01, 0.01, 0.01)  # equal scales: gamma ~ 1e-3
HETERO = (1e-3, 3e-2, 0.3, 1.0)  # energies over 6 decades: gamma >> 0.3
SWITCHES = list(
    itertools.product(("auto", "on", "off"), (True, False), (True, False), (True, False), ("centered", "raw"))
)


def assert_matrix_close(a, b, rtol=1e-9):
    scale = max(float(b.abs().max()), 1e-300)
    err = float((a.to(F64) - b.to(F64)).abs().max())
    assert err <= rtol * scale, f"max error {err:.3e} vs scale {scale:.3e}"


@pytest.mark.parametrize("shape", [(12, 8), (5, 16)], ids=["tall", "wide"])  # wide: the d_out x d_out association
@pytest.mark.parametrize("scales", [HOMO, HETERO], ids=["homogeneous", "heterogeneous"])
@pytest.mark.parametrize("gate,trace_norm,prior,refine,numerator", SWITCHES)
def test_matches_spec_transcription_for_every_switch(shape, scales, gate, trace_norm, prior, refine, numerator):
    dWs = rand_taus(shape, scales, seed=1)
    W, diag = ace_matrix(
        dWs, gate=gate, trace_norm=trace_norm, prior=prior, refine=refine, numerator=numerator, name="L"
    )
    W_ref, gamma, hetero = ref_ace(
        dWs, gate=gate, trace_norm=trace_norm, prior=prior, refine=refine, numerator=numerator
    )
    assert diag.gamma == pytest.approx(gamma, rel=1e-12)
    assert diag.flag == hetero
    assert diag.refined == (hetero and refine)
    assert_matrix_close(W, W_ref)
    # float64 to 1e-12 absolute (entries up to ~200 here): the streamed sums, Cholesky and top-k Gram
    # route round like the transcription's dense sums, inverse and full SVD (docs/performance.md)
    assert float((W.double() - W_ref).abs().max()) <= 1e-12


@pytest.mark.parametrize("shape", [(8, 12), (10, 10), (48, 16), (5, 16)])
@pytest.mark.parametrize("scales", [HOMO, HETERO], ids=["homogeneous", "heterogeneous"])
def test_default_matches_spec_on_several_shapes(shape, scales):
    dWs = rand_taus(shape, scales, seed=2)
    W, _ = ace_matrix(dWs)
    W_ref = ref_ace(dWs)[0]
    assert_matrix_close(W, W_ref)
    assert float((W.double() - W_ref).abs().max()) <= 1e-12


def stagewise_ace(dWs, *, estimator="ace", Sigma=None, tau=0.3, eps=1e-2, k_frac=0.3, gate=None, trace_norm=True,
                  prior=None, refine=True, numerator=None, wudi_p=2.0):
    """The previous ace_matrix: the public stage functions called one after the other, every
    covariance held at once, LU solve, refinement products recomputed and a full SVD."""
    sw = estimator_preset(estimator, gate=gate, prior=prior, numerator=numerator)
    dWs = [d.double() for d in dWs]
    energies = torch.stack([d.pow(2).sum() for d in dWs])
    flag = {"auto": heterogeneity(dWs) > tau, "on": True, "off": False}[sw.gate]
    Sigma_hat = Sigma if estimator == "given" else [estimate_covariance(d, estimator, wudi_p=wudi_p) for d in dWs]
    covs = normalize_covariances(Sigma_hat, eps=eps, normalize=flag and trace_norm)
    C = structural_prior(covs.Sigma_tilde, energy=float(energies.mean()) if flag else None) if sw.prior else None
    nums = [d - d.mean(dim=0) for d in dWs] if sw.numerator == "centered" else dWs
    W = closed_form(nums, covs, C)
    if flag and refine:
        W = spectral_refine(W, dWs, covs.Sigma_tilde, covs.mean_reg(), k_frac=k_frac).W
    return W


def _given(shape, T, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(T):
        X = torch.randn(3 * shape[1], shape[1], generator=g, dtype=F64)
        out.append(X.T @ X)
    return out


@pytest.mark.parametrize("shape", [(12, 8), (8, 8), (5, 16), (7, 12)])
@pytest.mark.parametrize("estimator", ["ace", "identity", "wudi", "given"])
@pytest.mark.parametrize("gate,numerator", [("on", "centered"), ("on", "raw"), ("off", "centered"), ("auto", None)])
def test_streamed_route_equals_stagewise_composition(shape, estimator, gate, numerator):
    """Every estimator x gate x numerator, on shapes that take either association, with the
    prior switched on: the streamed single-pass route equals the stage-by-stage one."""
    dWs = rand_taus(shape, HETERO, seed=4)
    Sigma = _given(shape, len(dWs), 5) if estimator == "given" else None
    kw = dict(estimator=estimator, Sigma=Sigma, gate=gate, numerator=numerator, prior=True)
    W, diag = ace_matrix(dWs, **kw)
    assert diag.refined == (gate == "on" or (gate == "auto" and diag.flag))
    assert_matrix_close(W, stagewise_ace(dWs, **kw), rtol=1e-9)


def test_non_symmetric_given_covariances_are_rejected():
    """A given covariance must be symmetric PSD: a non-symmetric one is an error naming the task."""
    dWs = rand_taus((6, 5), HOMO, seed=6)
    g = torch.Generator().manual_seed(6)
    Sigma = [torch.randn(5, 5, generator=g, dtype=F64) + 5 * torch.eye(5, dtype=F64) for _ in dWs]
    with pytest.raises(ValueError, match="task 0.*not symmetric"):
        ace_matrix(dWs, estimator="given", Sigma=Sigma, prior=True)


def test_failed_cholesky_falls_back_to_the_lu_route(monkeypatch):
    """When the Cholesky factorisation reports failure, the solve takes the LU route and the
    result still equals the stage-by-stage composition."""
    import acetools.merging.linalg as L

    def failing(M, *args, **kwargs):
        return M, torch.ones((), dtype=torch.int32)

    dWs = rand_taus((6, 5), HETERO, seed=6)
    monkeypatch.setattr(L.torch.linalg, "cholesky_ex", failing)
    W, _ = ace_matrix(dWs, prior=True)
    monkeypatch.undo()
    assert_matrix_close(W, stagewise_ace(dWs, prior=True), rtol=1e-9)


@pytest.mark.parametrize("scales", [HOMO, HETERO], ids=["homogeneous", "heterogeneous"])
def test_float32_precision_error_is_small(scales):
    """precision="float32" runs the accumulation and the solve in float32; on these
    well-conditioned layers it stays within 1e-4 (relative to the largest entry) of float64."""
    dWs = rand_taus((40, 96), scales, seed=7)
    W64, _ = ace_matrix(dWs)
    W32, d32 = ace_matrix(dWs, precision="float32")
    assert W32.dtype == F64  # the input dtype comes back
    assert_matrix_close(W32, W64, rtol=1e-4)
    assert not torch.equal(W32, W64)  # it did run in float32


def test_non_default_numbers_match_spec():
    dWs = rand_taus((12, 9), HETERO, seed=3)
    kw = dict(tau=0.05, eps=0.3, k_frac=0.6)
    assert_matrix_close(ace_matrix(dWs, **kw)[0], ref_ace(dWs, **kw)[0])
    dWs = rand_taus((12, 9), (0.2, 0.25, 0.3), seed=3)
    assert_matrix_close(ace_matrix(dWs, eps=1e-5)[0], ref_ace(dWs, eps=1e-5)[0])


# ----------------------------------------------------------------- the gate


def test_gate_fires_on_heterogeneous_and_not_on_homogeneous():
    _, d_homo = ace_matrix(rand_taus((12, 8), HOMO))
    _, d_het = ace_matrix(rand_taus((12, 8), HETERO))
    assert d_homo.gamma < 0.01 and not d_homo.flag and not d_homo.normalized and not d_homo.refined
    assert d_het.gamma > 1.0 and d_het.flag and d_het.normalized and d_het.refined
    assert d_het.k == math.floor(0.3 * 8)


def test_gate_forced_on_and_off():
    homo, het = rand_taus((12, 8), HOMO), rand_taus((12, 8), HETERO)
    W_on, d_on = ace_matrix(homo, gate="on")
    assert d_on.flag and d_on.refined
    assert not torch.allclose(W_on, ace_matrix(homo)[0])
    W_off, d_off = ace_matrix(het, gate="off")
    assert not d_off.flag and not d_off.refined and d_off.gamma > 1.0
    assert_matrix_close(W_off, ref_ace(het, gate="off")[0])


def test_heterogeneity_is_unbiased_log_energy_ratio():
    energies = [0.5, 2.0, 7.0]
    dWs = [torch.full((4, 4), math.sqrt(e / 16), dtype=F64) for e in energies]
    ell = [math.log(e + 1e-12) for e in energies]
    expected = statistics.variance(ell) / (statistics.fmean(ell) ** 2 + 1e-12)  # T-1 variance
    assert heterogeneity(dWs) == pytest.approx(expected, rel=1e-12)
    assert heterogeneity(dWs[:1]) == 0.0


def test_task_energies_are_float64_sums_of_squares_for_any_dtype_and_shape():
    """The dot-product route with its reused float64 buffer (docs/performance.md, ACE section) equals the plain
    float64 sum of squares, also when shapes and dtypes change along the list (the buffer is re-made)."""
    from acetools.merging.ace import task_energies

    g = torch.Generator().manual_seed(31)
    mats = [torch.randn(6, 5, generator=g), torch.randn(3, 4, generator=g, dtype=F64), torch.randn(6, 5, generator=g),
            torch.randn(2, 2, generator=g).to(torch.bfloat16)]
    e = task_energies(mats)
    assert e.dtype == F64 and e.shape == (4,)
    want = torch.stack([m.double().pow(2).sum() for m in mats])
    assert torch.allclose(e, want, rtol=1e-14, atol=0)
    assert float(e[0]) != float(e[2])  # not a stale buffer


def test_single_task():
    (d,) = rand_taus((12, 8), (0.7,), seed=4)
    W, diag = ace_matrix([d], tau=0.0)  # gamma = 0 is not > 0: no flag even at tau = 0
    assert diag.gamma == 0.0 and not diag.flag
    assert_matrix_close(W, ref_ace([d])[0])
    # without the prior and with the raw numerator the closed form returns the task vector
    W_raw, _ = ace_matrix([d], prior=False, numerator="raw")
    assert_matrix_close(W_raw, d, rtol=1e-12)


# ----------------------------------------------------------------- stages


def test_refinement_adds_exactly_a_rank_k_isotropic_term():
    dWs = rand_taus((14, 10), HETERO, seed=5)
    covs = normalize_covariances([estimate_covariance(d) for d in dWs], eps=1e-2, normalize=True)
    C = structural_prior(covs.Sigma_tilde, energy=float(sum((d**2).sum() for d in dWs) / len(dWs)))
    from acetools.merging.ace import center_rows

    W_pre = closed_form([center_rows(d) for d in dWs], covs, C, name="L")
    ref = spectral_refine(W_pre, dWs, covs.Sigma_tilde, covs.mean_reg(), k_frac=0.3, name="L")
    assert ref.k == 3
    S = torch.linalg.svdvals(ref.W - W_pre)
    assert torch.allclose(S[:3], torch.full((3,), ref.sigma_iso, dtype=F64), rtol=1e-10)
    assert float(S[3:].max()) < 1e-10 * ref.sigma_iso
    # sigma_iso is the mean of the top-k singular values of W_pre + Δ_res (eq. 18)
    Rbar = sum(covs.Sigma_reg) / len(dWs)
    D = W_pre + sum(d @ (s - Rbar) for d, s in zip(dWs, covs.Sigma_tilde))
    assert ref.sigma_iso == pytest.approx(float(torch.linalg.svdvals(D)[:3].mean()), rel=1e-10)


def test_refinement_skipped_with_warning_when_k_is_zero():
    dWs = rand_taus((3, 3), HETERO, seed=6)
    with pytest.warns(RuntimeWarning, match="tiny.layer"):
        W, diag = ace_matrix(dWs, name="tiny.layer")
    assert diag.flag and not diag.refined and diag.k == 0
    assert torch.isfinite(W).all()
    assert_matrix_close(W, ace_matrix(dWs, refine=False)[0], rtol=1e-14)


def test_pinv_fallback_warns_with_layer_name():
    g = torch.Generator().manual_seed(7)
    nums = [torch.randn(6, 5, generator=g, dtype=F64) for _ in range(2)]
    vs = [torch.randn(5, 1, generator=g, dtype=F64) for _ in range(2)]
    regs = [v @ v.T for v in vs]  # rank 1 each: sum has rank 2 < d_in = 5, i.e. singular
    with pytest.warns(RuntimeWarning, match="blocks.3.mlp.c_fc.weight"):
        W = closed_form(nums, regs, name="blocks.3.mlp.c_fc.weight")
    B = sum(n @ r for n, r in zip(nums, regs))
    assert_matrix_close(W, B @ torch.linalg.pinv(sum(regs)), rtol=1e-8)


def test_no_warning_and_finite_when_eps_positive():
    dWs = [torch.zeros(6, 4, dtype=F64)] * 3  # e.g. CLIP's zero token_embedding task vector
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        W, diag = ace_matrix(dWs)
    assert torch.equal(W, torch.zeros(6, 4, dtype=F64)) and not diag.flag


def test_centered_numerator_gives_zero_column_sums_on_unflagged_path():
    dWs = rand_taus((12, 8), HOMO, seed=8)
    W, diag = ace_matrix(dWs)
    assert not diag.flag
    assert float(W.sum(0).abs().max()) < 1e-12 * float(W.abs().max())


def test_structural_prior_rows_are_column_means():
    g = torch.Generator().manual_seed(9)
    S = [(lambda m: m @ m.T)(torch.randn(4, 4, generator=g, dtype=F64)) for _ in range(3)]
    C = structural_prior(S)
    tot = S[0] + S[1] + S[2]
    for i in range(4):
        for j in range(4):
            assert C[i, j] == pytest.approx(float(tot[:, j].sum() / 4), rel=1e-12)
    assert torch.allclose(structural_prior(S, energy=3.0), C / (3.0 + 1e-12), rtol=1e-14)


def test_normalize_covariances_trace_and_ridge():
    S = [torch.diag(torch.tensor([1.0, 3.0], dtype=F64)), torch.diag(torch.tensor([2.0, 2.0], dtype=F64))]
    n = normalize_covariances(S, eps=0.1, normalize=True)
    assert torch.allclose(n.traces, torch.tensor([4.0, 4.0], dtype=F64))
    assert torch.allclose(n.Sigma_reg[0], torch.diag(torch.tensor([0.25 + 0.025, 0.75 + 0.025], dtype=F64)))
    u = normalize_covariances(S, eps=0.1, normalize=False)
    assert torch.allclose(u.Sigma_reg[1], torch.diag(torch.tensor([2.1, 2.1], dtype=F64)))
    assert torch.allclose(u.mean_reg(), (u.Sigma_reg[0] + u.Sigma_reg[1]) / 2)


# ----------------------------------------------------------------- the unified framework


def test_identity_estimator_is_weight_averaging(world, world64):
    for base, experts, tol in ((*world, 1e-6), (*world64, 1e-13)):
        a = merge("ace", base, experts, estimator="identity")
        w = merge("weight_averaging", base, experts)
        for k in base:
            assert torch.allclose(a[k], w[k], rtol=0, atol=tol * (1 + float(w[k].abs().max()))), k
    # the switches are what make it exact: adding the prior breaks it
    base, experts = world64
    a = merge("ace", base, experts, estimator="identity", prior=True)
    w = merge("weight_averaging", base, experts)
    key = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    assert not torch.allclose(a[key], w[key], atol=1e-6)


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_wudi_estimator_minimises_wudi_loss(p):
    dWs = rand_taus((10, 6), (0.5, 1.0, 2.0), seed=10)  # sum_t Sigma_t has full rank 6
    W, _ = ace_matrix(dWs, estimator="wudi", eps=0.0, wudi_p=p)

    def loss(Wm):
        return sum(((Wm - d) @ d.T).pow(2).sum() / torch.linalg.matrix_norm(d) ** p for d in dWs)

    Wv = W.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(Wv), Wv)
    assert float(grad.abs().max()) < 1e-10 * float(loss(torch.zeros_like(W)))
    # independent solve: W [d_tᵀ / s_t]_t = [d_t d_tᵀ / s_t]_t in least squares, s_t = ||d_t||^(p/2)
    s = [torch.linalg.matrix_norm(d) ** (p / 2) for d in dWs]
    M = torch.cat([d.T / si for d, si in zip(dWs, s)], dim=1)
    Y = torch.cat([d @ d.T / si for d, si in zip(dWs, s)], dim=1)
    W_ls = torch.linalg.lstsq(M.T, Y.T).solution.T
    assert_matrix_close(W, W_ls, rtol=1e-9)


def _regression_world(n_tasks=3, d_in=6, d_out=5, N=200, seed=11):
    g = torch.Generator().manual_seed(seed)
    W0 = torch.randn(d_out, d_in, generator=g, dtype=F64)
    W_star, X, Sig = [], [], []
    for t in range(n_tasks):
        W_star.append(torch.randn(d_out, d_in, generator=g, dtype=F64))
        L = torch.randn(d_in, d_in, generator=g, dtype=F64) * torch.logspace(0, -1 - t, d_in, dtype=F64)
        X.append(torch.randn(N, d_in, generator=g, dtype=F64) @ L)
        Sig.append(L.T @ L)  # population covariance of x = Lᵀ z
    return W0, W_star, X, Sig


def test_given_true_covariances_recover_joint_least_squares():
    W0, W_star, X, Sig = _regression_world()
    base = {"layer.weight": W0, "layer.bias": torch.zeros(5, dtype=F64)}
    experts = [{"layer.weight": W, "layer.bias": torch.full((5,), float(t), dtype=F64)} for t, W in enumerate(W_star)]
    # empirical Gram matrices: the answer is the least-squares fit on the pooled data
    grams = [{"layer.weight": x.T @ x} for x in X]
    merged = merge("ace", base, experts, estimator="given", covariances=grams, eps=0.0)
    Xall = torch.cat(X)
    Yall = torch.cat([x @ W.T for x, W in zip(X, W_star)])
    W_joint = torch.linalg.lstsq(Xall, Yall).solution.T
    assert_matrix_close(merged["layer.weight"], W_joint, rtol=1e-9)
    assert torch.allclose(merged["layer.bias"], torch.full((5,), 1.0, dtype=F64))  # non-matrix key: mean
    # population covariances: argmin sum_t E||W x - W_t x||^2 = (sum W_t Sigma_t)(sum Sigma_t)^-1
    merged = merge("ace", base, experts, estimator="given", covariances=[{"layer.weight": s} for s in Sig], eps=0.0)
    expected = sum(W @ s for W, s in zip(W_star, Sig)) @ torch.linalg.inv(sum(Sig))
    assert_matrix_close(merged["layer.weight"], expected, rtol=1e-9)
    # eps > 0 is a ridge: no longer exact
    ridge = merge("ace", base, experts, estimator="given", covariances=[{"layer.weight": s} for s in Sig], eps=1e-2)
    assert not torch.allclose(ridge["layer.weight"], expected, rtol=1e-6)


@pytest.mark.oracle
def test_given_matches_fusion_bench_regmean():
    regmean = pytest.importorskip("fusion_bench.method.regmean.regmean")
    W0, W_star, X, _ = _regression_world(seed=12)
    grams = [x.T @ x / x.shape[0] for x in X]
    base = {"lin.weight": W0}
    merged = merge("ace", base, [{"lin.weight": W} for W in W_star], estimator="given",
                   covariances=[{"lin.weight": G} for G in grams], eps=0.0)
    oracle = regmean.merging_with_regmean_weights({"lin.weight": list(W_star)}, [{"lin": G} for G in grams],
                                                  reduce_non_diagonal_ratio=1.0)
    assert_matrix_close(merged["lin.weight"], oracle["lin.weight"], rtol=1e-8)


# ----------------------------------------------------------------- state dicts


def hetero_world(seed=0, dtype=torch.float32):
    base, experts = make_world(n_tasks=4, seed=seed, dtype=dtype)
    scales = (0.05, 0.3, 1.0, 4.0)
    experts = [{k: base[k] + s * (ex[k] - base[k]) for k in base} for s, ex in zip(scales, experts)]
    return base, experts


def test_state_dict_path_matches_spec_per_key(world64):
    for base, experts in (world64, hetero_world(dtype=F64)):
        merged = merge("ace", base, experts)
        tvs = task_vectors(base, experts)
        flags = []
        for k, w0 in base.items():
            if w0.ndim == 2 and "text_projection" not in k:
                W_ref, _, hetero = ref_ace([tv[k] for tv in tvs])
                flags.append(hetero)
                assert_matrix_close(merged[k] - w0, W_ref, rtol=1e-8)
            else:
                assert torch.allclose(merged[k] - w0, torch.stack([tv[k] for tv in tvs]).mean(0), atol=1e-12), k
        assert any(flags)  # the flagged path is exercised too


def test_scaling_multiplies_every_key(world64):
    base, experts = world64
    tvs = task_vectors(base, experts)
    u1, _ = ace_with_diagnostics(base, tvs)
    u2, _ = ace_with_diagnostics(base, tvs, scaling=0.4)
    for k in base:
        assert torch.allclose(u2[k], 0.4 * u1[k], rtol=1e-12, atol=1e-15), k


def test_expert_order_invariance():
    base, experts = hetero_world(dtype=F64)
    a = merge("ace", base, experts)
    b = merge("ace", base, experts[::-1])
    c = merge("ace", base, [experts[i] for i in (2, 0, 3, 1)])
    for k in base:
        assert_matrix_close(b[k] - base[k], a[k] - base[k], rtol=1e-9)
        assert_matrix_close(c[k] - base[k], a[k] - base[k], rtol=1e-9)


def test_float32_inputs_computed_in_float64_returned_in_float32():
    b32, e32 = hetero_world(dtype=torch.float32)
    b64 = {k: v.double() for k, v in b32.items()}
    e64 = [{k: v.double() for k, v in ex.items()} for ex in e32]
    m32, m64 = merge("ace", b32, e32), merge("ace", b64, e64)
    for k in b32:
        assert m32[k].dtype == torch.float32
        assert torch.allclose(m32[k].double(), m64[k], rtol=1e-5, atol=1e-6), k


def test_inputs_are_not_modified(world):
    base, experts = world
    tvs = task_vectors(base, experts)
    snapshot = [{k: v.clone() for k, v in tv.items()} for tv in tvs]
    ace_with_diagnostics(base, tvs, gate="on")
    for tv, snap in zip(tvs, snapshot):
        for k in tv:
            assert torch.equal(tv[k], snap[k])


def test_in_x_out_matrices_take_a_layout_not_an_ace_option(world64):
    """ACE takes matrices as stored; a layout transposes in x out weights around it (docs/methods.md §ACE)."""
    from acetools.layouts import Layout

    base, experts = world64
    with pytest.raises(TypeError, match="unknown hyperparameter.*in_out_keys"):
        merge("ace", base, experts, in_out_keys=("visual.proj",))
    key = "visual.proj"
    by_layout = merge("ace", base, experts, layout=Layout("proj in x out", in_out=(r"^visual\.proj$",)))
    W, diag = ace_matrix([(ex[key] - base[key]).T for ex in experts], name=key)
    assert_matrix_close(by_layout[key] - base[key], W.T, rtol=1e-12)
    assert diag.shape == (8, 16)
    as_stored = merge("ace", base, experts)
    assert not torch.allclose(as_stored[key], by_layout[key])
    other = "visual.transformer.resblocks.0.attn.out_proj.weight"
    assert torch.equal(as_stored[other], by_layout[other])


def test_diagnostics_record(world64):
    base, experts = hetero_world(dtype=F64)
    _, diags = ace_with_diagnostics(base, task_vectors(base, experts), spectra=True)
    assert "visual.ln_pre.weight" not in diags and "text_projection" not in diags
    d = diags["visual.transformer.resblocks.0.mlp.c_fc.weight"]
    assert d.shape == (64, 16) and d.n_tasks == 4 and d.flag and d.k == 4
    assert d.spectrum_pre.shape == (16,) and d.spectrum.shape == (16,) and d.cond >= 1.0


def test_presets():
    assert estimator_preset("ace") == ("auto", True, "centered")
    assert estimator_preset("identity") == ("off", False, "raw")
    assert estimator_preset("wudi", gate="on").gate == "on"


# ----------------------------------------------------------------- errors


def test_bad_hyperparameters_are_rejected(world):
    base, experts = world
    with pytest.raises(ValueError, match="gate"):
        merge("ace", base, experts, gate="maybe")
    with pytest.raises(ValueError, match="k_frac"):
        merge("ace", base, experts, k_frac=1.5)
    with pytest.raises(TypeError, match="prior"):
        merge("ace", base, experts, prior="yes")
    with pytest.raises(ValueError, match="estimator"):
        merge("ace", base, experts, estimator="fisher")


def test_given_covariances_are_validated(world):
    base, experts = world
    key = "visual.transformer.resblocks.0.mlp.c_proj.weight"  # 16 x 64: d_in = 64
    good = [{key: torch.eye(64)} for _ in experts]
    merge("ace", base, experts, estimator="given", covariances=good)
    with pytest.raises(ValueError, match="needs covariances"):
        merge("ace", base, experts, estimator="given")
    with pytest.raises(ValueError, match="only used with estimator='given'"):
        merge("ace", base, experts, covariances=good)
    with pytest.raises(ValueError, match="3 entries for 4 experts"):
        merge("ace", base, experts, estimator="given", covariances=good[:3])
    bad = [dict(c) for c in good]
    bad[2] = {key: torch.eye(16)}
    with pytest.raises(
        ValueError, match=r"covariances\[2\]\['visual.transformer.resblocks.0.mlp.c_proj.weight'\].*64 x 64"
    ):
        merge("ace", base, experts, estimator="given", covariances=bad)
    with pytest.raises(KeyError, match="covariances\\[1\\] lacks key"):
        merge("ace", base, experts, estimator="given", covariances=[good[0], {}, good[2], good[3]])
    with pytest.raises(KeyError, match="'no.such.key'"):
        merge("ace", base, experts, estimator="given", covariances=[{"no.such.key": torch.eye(2)}] * 4)
    with pytest.raises(ValueError, match="not a matrix"):
        merge("ace", base, experts, estimator="given", covariances=[{"visual.ln_pre.weight": torch.eye(16)}] * 4)
    with pytest.raises(ValueError, match="one \\{key: Sigma_t\\} dict per expert"):
        merge("ace", base, experts, estimator="given", covariances={key: torch.eye(64)})


def test_ace_matrix_input_errors():
    with pytest.raises(ValueError, match="layer 'L', task 1: shape"):
        ace_matrix([torch.zeros(4, 3), torch.zeros(3, 4)], name="L")
    with pytest.raises(ValueError, match="non-empty list"):
        ace_matrix([], name="L")
    with pytest.raises(ValueError, match=r"covariance of task 0 \(expert 0\) for layer 'L' has shape"):
        ace_matrix([torch.ones(4, 3)], estimator="given", Sigma=[torch.eye(4)], name="L")
    with pytest.raises(ValueError, match="'given' has no estimate"):
        estimate_covariance(torch.ones(4, 3), "given")


# ----------------------------------------------------------------- device parity


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    base, experts = hetero_world(dtype=F64)
    cpu = merge("ace", base, experts)
    gpu = merge("ace", base, experts, device="cuda")
    for k in base:
        assert gpu[k].device.type == "cuda"
        assert_matrix_close(gpu[k].cpu() - base[k], cpu[k] - base[k], rtol=1e-9)
    b32, e32 = hetero_world(dtype=torch.float32)
    cpu32, gpu32 = merge("ace", b32, e32), merge("ace", b32, e32, device="cuda")
    for k in b32:
        assert torch.allclose(gpu32[k].cpu(), cpu32[k], rtol=1e-5, atol=1e-6), k


def test_blocked_syrk_equals_the_gram():
    from acetools.merging.linalg import symmetrize_lower_, syrk_lower_

    g = torch.Generator().manual_seed(8)
    F = torch.randn(30, 1000, generator=g, dtype=F64)  # 3 column blocks
    S = symmetrize_lower_(syrk_lower_(torch.eye(1000, dtype=F64), F, alpha=0.5))
    assert_matrix_close(S, torch.eye(1000, dtype=F64) + 0.5 * F.T @ F, rtol=1e-13)
    assert torch.equal(S, S.T)


@pytest.mark.parametrize("shape", [(40, 900), (850, 800)], ids=["rows-first", "gram"])
def test_streamed_route_on_blocked_shapes(shape):
    dWs = rand_taus(shape, HETERO[:3], seed=9)
    for gate in ("on", "off"):
        W, _ = ace_matrix(dWs, gate=gate)
        assert_matrix_close(W, stagewise_ace(dWs, gate=gate), rtol=1e-9)
