"""ACE's two documented options that are not the paper's: eps_mode="relative" (a ridge in the
covariance's units) and gamma_mode="cv" (a scale-invariant heterogeneity)."""

from __future__ import annotations

import pytest
import torch

from acetools.merging import METHODS, merge
from acetools.merging import ace as A


def _tvs(T=4, d_out=12, d_in=9, seed=0, scales=None):
    g = torch.Generator().manual_seed(seed)
    scales = scales or [1.0] * T
    return [s * torch.randn(d_out, d_in, generator=g, dtype=torch.float64) for s in scales]


def test_options_are_registered_params_with_the_papers_defaults():
    p = METHODS["ace"].params
    assert p["eps_mode"].default == "absolute" and p["gamma_mode"].default == "paper"
    base = {"w": torch.zeros(12, 9, dtype=torch.float64)}
    experts = [{"w": t} for t in _tvs()]
    with pytest.raises(ValueError, match="eps_mode"):
        merge("ace", base, experts, eps_mode="percent")
    with pytest.raises(ValueError, match="gamma_mode"):
        merge("ace", base, experts, gamma_mode="log")


def test_relative_ridge_is_eps_times_the_mean_eigenvalue():
    tvs = _tvs(scales=[1.0, 3.0, 0.5, 2.0])
    S = [A.estimate_covariance(t) for t in tvs]
    rel = A.normalize_covariances(S, eps=0.1, eps_mode="relative")
    tr = torch.stack([torch.trace(s) for s in S])
    assert torch.allclose(rel.ridge, 0.1 * tr / 9, rtol=1e-12)
    reln = A.normalize_covariances(S, eps=0.1, normalize=True, eps_mode="relative")
    assert torch.allclose(reln.ridge, torch.full((4,), 0.1 / 9, dtype=torch.float64))
    with pytest.raises(ValueError, match="eps_mode"):
        A.normalize_covariances(S, eps_mode="nope")


def test_relative_eps_equals_the_absolute_eps_it_stands_for():
    # equal traces: the relative ridge eps·tr/d_in is one absolute eps for every task
    tvs = _tvs()
    tvs = [t / A.center_rows(t).norm() for t in tvs]  # tr(Sigma_hat_t) = 1 for every t
    rel, _ = A.ace_matrix(tvs, eps=0.5, eps_mode="relative", gate="off", refine=False)
    ab, _ = A.ace_matrix(tvs, eps=0.5 / 9, gate="off", refine=False)
    assert torch.allclose(rel, ab, rtol=1e-10, atol=1e-12)
    # flagged (normalised) layers: eps/d_in on the unit-trace covariances = the absolute eps/tr_t with eps' = eps/d_in
    reln, _ = A.ace_matrix(tvs, eps=0.5, eps_mode="relative", gate="on", refine=False)
    abn, _ = A.ace_matrix(tvs, eps=0.5 / 9, gate="on", refine=False)
    assert torch.allclose(reln, abn, rtol=1e-9, atol=1e-12)
    # normalised layers: eps/d_in on the unit-trace covariances, i.e. absolute eps' with eps'/tr_t = eps/d_in
    trs = [float(A.center_rows(t).norm() ** 2) for t in _tvs()]
    assert len(set(round(x, 6) for x in trs)) > 1  # unequal traces: the two modes differ there


def test_relative_eps_makes_the_closed_form_scale_equivariant():
    tvs = _tvs(scales=[1.0, 2.0, 0.7, 1.3])
    c = 1e-3  # a model whose updates are 1000x smaller
    w1, _ = A.ace_matrix(tvs, eps=0.05, eps_mode="relative", gate="off")
    wc, _ = A.ace_matrix([c * t for t in tvs], eps=0.05, eps_mode="relative", gate="off")
    # equal up to the 1e-12 trace floor, which is 1e-8 of these small traces
    assert float((wc - c * w1).norm() / (c * w1).norm()) < 1e-8
    a1, _ = A.ace_matrix(tvs, eps=0.05, gate="off")
    ac, _ = A.ace_matrix([c * t for t in tvs], eps=0.05, gate="off")
    assert float((ac - c * a1).norm() / (c * a1).norm()) > 0.1  # the absolute eps swamps the small model


def test_cv_gamma_is_scale_invariant_and_the_papers_is_not():
    tvs = _tvs(scales=[1.0, 1.5, 0.8, 1.2])
    for c in (1e-3, 1.0, 30.0):
        assert A.heterogeneity([c * t for t in tvs], mode="cv") == pytest.approx(A.heterogeneity(tvs, mode="cv"),
                                                                                 rel=1e-9)
    assert A.heterogeneity([1e-3 * t for t in tvs]) != pytest.approx(A.heterogeneity(tvs), rel=1e-3)
    e = A.task_energies(tvs)
    assert A.heterogeneity(tvs, mode="cv") == pytest.approx(float(e.var() / e.mean() ** 2), rel=1e-12)
    with pytest.raises(ValueError, match="mode"):
        A.heterogeneity(tvs, mode="nope")
    # the gate follows the chosen statistic
    _, d = A.ace_matrix(tvs, gamma_mode="cv", tau=1e-6)
    assert d.flag and d.gamma == pytest.approx(A.heterogeneity(tvs, mode="cv"), rel=1e-12)
