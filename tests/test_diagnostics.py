"""Diagnostics on matrices with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from acetools.diagnostics import (
    compare_covariances,
    condition_number,
    effective_rank,
    energy_capture,
    energy_fraction,
    heterogeneity_per_layer,
    linear_cka,
    subspace_similarity,
    task_vector_cosine,
)
from acetools.merging import task_vectors
from acetools.merging.ace import heterogeneity

F64 = torch.float64


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def random_orthogonal(n, seed=0):
    return torch.linalg.qr(torch.randn(n, n, generator=gen(seed), dtype=F64))[0]


def test_energy_fraction_on_a_diagonal_matrix():
    D = torch.diag(torch.tensor([4.0, 2.0, 1.0, 1.0, 0.0] + [0.0] * 15, dtype=F64))  # r = 20
    assert energy_fraction(D, 0.05) == pytest.approx(16 / 22)  # top ceil(1) value
    assert energy_fraction(D, 0.10) == pytest.approx(20 / 22)  # top 2
    assert energy_fraction(D, 1.0) == pytest.approx(1.0)
    assert energy_fraction(torch.tensor([1.0, 3.0]), 0.5) == pytest.approx(0.9)  # 1-D = a spectrum
    with pytest.raises(ValueError, match="frac"):
        energy_fraction(D, 0.0)


def test_condition_number_and_effective_rank():
    Q = random_orthogonal(6, 1)
    D = torch.diag(torch.tensor([10.0, 5.0, 2.0, 1.0, 1.0, 0.5], dtype=F64))
    assert condition_number(Q @ D @ Q.T) == pytest.approx(20.0)
    assert condition_number(torch.diag(torch.tensor([1.0, 0.0]))) == math.inf
    assert effective_rank(torch.eye(7)) == pytest.approx(7.0)
    assert effective_rank(3.0 * random_orthogonal(5, 2)) == pytest.approx(5.0)
    assert effective_rank(torch.outer(torch.arange(1.0, 5.0), torch.ones(3))) == pytest.approx(1.0)
    p = torch.tensor([3.0, 1.0]) / 4
    assert effective_rank(torch.diag(torch.tensor([3.0, 1.0]))) == pytest.approx(float(torch.exp(-(p * p.log()).sum())))
    assert effective_rank(torch.zeros(3, 3)) == 0.0


@pytest.mark.parametrize("reduction", ["projection", "mean_cos"])
def test_subspace_similarity(reduction):
    Q = random_orthogonal(8, 3)
    A = Q[:, :3] @ torch.diag(torch.tensor([5.0, 4.0, 3.0], dtype=F64)) @ random_orthogonal(6, 4)[:3]
    B = Q[:, :3] @ torch.diag(torch.tensor([1.0, 7.0, 2.0], dtype=F64)) @ random_orthogonal(6, 5)[:3]
    C = Q[:, 3:6] @ torch.randn(3, 6, generator=gen(6), dtype=F64)
    assert subspace_similarity(A, B, 3, reduction=reduction) == pytest.approx(1.0)
    assert subspace_similarity(A, C, 3, reduction=reduction) == pytest.approx(0.0, abs=1e-12)
    assert subspace_similarity(A, 2.5 * A, 2, reduction=reduction) == pytest.approx(1.0)
    # one shared direction out of two: cos angles (1, 0)
    S = torch.diag(torch.tensor([9.0, 8.0], dtype=F64))
    E = torch.stack([Q[:, 0], Q[:, 5]], 1) @ S @ torch.eye(2, 6, dtype=F64)
    F = torch.stack([Q[:, 0], Q[:, 6]], 1) @ S @ torch.eye(2, 6, dtype=F64)
    assert subspace_similarity(E, F, 2, reduction=reduction) == pytest.approx(0.5)
    # a 45-degree rotation of a 1-d subspace: cos = 1/sqrt(2)
    u, v = Q[:, 0], (Q[:, 0] + Q[:, 1]) / math.sqrt(2)
    val = subspace_similarity(torch.outer(u, u), torch.outer(v, v), 1, reduction=reduction)
    assert val == pytest.approx(0.5 if reduction == "projection" else 1 / math.sqrt(2))


def test_subspace_similarity_right_side_and_errors():
    A = torch.randn(5, 7, generator=gen(7), dtype=F64)
    assert subspace_similarity(A, random_orthogonal(5, 8) @ A, 3, side="right") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="k=6"):
        subspace_similarity(A, A, 6)
    with pytest.raises(ValueError, match="different spaces"):
        subspace_similarity(A, torch.randn(4, 7, generator=gen(9), dtype=F64), 2)


def test_energy_capture_esd_vs_svd():
    g = gen(10)
    dW = torch.randn(6, 5, generator=g, dtype=F64)
    # isotropic inputs: XᵀX = 4 I, ESD and SVD capture the same energy
    X = 2.0 * torch.linalg.qr(torch.randn(40, 5, generator=g, dtype=F64))[0]
    out = energy_capture(X, dW, 2)
    S = torch.linalg.svdvals(dW)
    assert out["esd"] == pytest.approx(out["svd"]) == pytest.approx(float((S[:2] ** 2).sum() / (S**2).sum()))
    # inputs concentrated on the direction of dW's smallest right singular vector: ESD wins
    U, S, Vh = torch.linalg.svd(dW, full_matrices=False)
    X = torch.randn(200, 5, generator=g, dtype=F64) * 1e-3 + torch.randn(200, 1, generator=g, dtype=F64) * Vh[-1]
    out = energy_capture(X, dW, 1)
    assert out["esd"] > 0.99 and out["svd"] < 0.05
    curve = pd.DataFrame([energy_capture(X, dW, k) for k in (1, 2, 6)])
    assert list(curve["k"]) == [1, 2, 6]
    assert (curve["esd"] >= curve["svd"] - 1e-12).all() and curve["esd"].iloc[-1] == pytest.approx(1.0)
    assert curve["svd"].iloc[-1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="d_in"):
        energy_capture(torch.ones(3, 4), dW, 1)


def test_linear_cka():
    g = gen(11)
    X = torch.randn(50, 8, generator=g, dtype=F64)
    Q = random_orthogonal(8, 12)
    assert linear_cka(X, X) == pytest.approx(1.0)
    assert linear_cka(X, X @ Q) == pytest.approx(1.0)
    assert linear_cka(X, 7.0 * X + 3.0) == pytest.approx(1.0)  # isotropic scaling and shift
    Y = torch.randn(50, 3, generator=g, dtype=F64)
    val = linear_cka(X, Y)
    assert 0.0 < val < 1.0
    assert linear_cka(Y, X) == pytest.approx(val)
    # the Gram form (N < p + q) agrees with the feature form
    Xs, Ys = X[:9], torch.randn(9, 4, generator=g, dtype=F64)
    Xc, Yc = Xs - Xs.mean(0), Ys - Ys.mean(0)
    feat = float(((Yc.T @ Xc) ** 2).sum() / (torch.linalg.matrix_norm(Xc.T @ Xc) * torch.linalg.matrix_norm(Yc.T @ Yc)))
    assert linear_cka(Xs, Ys) == pytest.approx(feat)
    # not invariant to an anisotropic map
    assert linear_cka(X, X * torch.tensor([100.0] + [1.0] * 7, dtype=F64)) < 0.9
    with pytest.raises(ValueError, match="same number of rows"):
        linear_cka(X, Y[:10])


def test_task_vector_cosines():
    e1 = {"w": torch.tensor([[1.0, 0.0]]), "b": torch.tensor([0.0])}
    e2 = {"w": torch.tensor([[0.0, 2.0]]), "b": torch.tensor([0.0])}
    e3 = {"w": torch.tensor([[3.0, 3.0]]), "b": torch.tensor([0.0])}
    df = task_vector_cosine([e1, e2, e3], names=["A", "B", "C"])
    assert list(df.index) == ["A", "B", "C"]
    assert df.loc["A", "B"] == pytest.approx(0.0) and df.loc["A", "C"] == pytest.approx(1 / math.sqrt(2))
    assert df.loc["C", "C"] == pytest.approx(1.0) and df.loc["B", "C"] == df.loc["C", "B"]


def test_task_vector_cosine_matches_flattened(world):
    base, experts = world
    tvs = task_vectors(base, experts)
    flat = torch.stack([torch.cat([tv[k].double().reshape(-1) for k in base]) for tv in tvs])
    flat = flat / flat.norm(dim=1, keepdim=True)
    df = task_vector_cosine(tvs)
    assert torch.allclose(torch.tensor(df.values), flat @ flat.T, atol=1e-12)


def test_heterogeneity_per_layer_reuses_ace(world):
    base, experts = world
    tvs = task_vectors(base, experts)
    df = heterogeneity_per_layer(tvs)
    assert "text_projection" not in set(df["key"]) and "visual.ln_pre.weight" not in set(df["key"])
    assert len(df) == 6
    key = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    row = df.set_index("key").loc[key]
    assert row["gamma"] == heterogeneity([tv[key] for tv in tvs])
    assert row["flag"] == (row["gamma"] > 0.3)
    assert list(heterogeneity_per_layer(tvs, keys=["visual.ln_pre.weight"])["key"]) == ["visual.ln_pre.weight"]


def test_compare_covariances_known_cases():
    Q = random_orthogonal(10, 13)
    lam = torch.linspace(10, 1, 10, dtype=F64)
    Sigma = Q @ torch.diag(lam) @ Q.T
    same = compare_covariances(3.0 * Sigma, Sigma, k=3)  # Theorem 1: only proportionality matters
    assert same.cosine == pytest.approx(1.0) and same.subspace_overlap == pytest.approx(1.0)
    assert same.spectrum_pearson == pytest.approx(1.0) and same.direction_spearman == pytest.approx(1.0)
    # same eigenvectors, reversed importance: subspace gone, spectrum shape kept, ranking reversed
    rev = compare_covariances(Q @ torch.diag(lam.flip(0)) @ Q.T, Sigma, k=3)
    assert rev.subspace_overlap == pytest.approx(0.0, abs=1e-12)
    assert rev.spectrum_pearson == pytest.approx(1.0)
    assert rev.direction_spearman == pytest.approx(-1.0)
    expected_cos = float((lam * lam.flip(0)).sum() / (lam**2).sum())
    assert rev.cosine == pytest.approx(expected_cos)
    assert set(rev.to_dict()) == {"cosine", "subspace_overlap", "k", "spectrum_pearson", "direction_spearman"}
    with pytest.raises(ValueError, match="not symmetric"):
        compare_covariances(torch.triu(torch.ones(3, 3)), torch.eye(3))
    with pytest.raises(ValueError, match="shape"):
        compare_covariances(torch.eye(3), torch.eye(4))


def test_flat_spectra_give_nan_correlations_and_ties_share_ranks():
    Sigma = torch.diag(torch.linspace(5, 1, 5, dtype=F64))
    flat = compare_covariances(torch.eye(5, dtype=F64), Sigma, k=2)
    assert math.isnan(flat.spectrum_pearson) and math.isnan(flat.direction_spearman)
    assert flat.cosine == pytest.approx(15 / (math.sqrt(5) * math.sqrt(55)))
    # an estimate that ties the two weakest directions still ranks the others right
    est = torch.diag(torch.tensor([9.0, 7.0, 4.0, 1.0, 1.0], dtype=F64))
    ranks_true, ranks_est = [5, 4, 3, 2, 1], [5, 4, 3, 1.5, 1.5]
    mt, me = sum(ranks_true) / 5, sum(ranks_est) / 5
    num = sum((a - mt) * (b - me) for a, b in zip(ranks_true, ranks_est))
    den = math.sqrt(sum((a - mt) ** 2 for a in ranks_true) * sum((b - me) ** 2 for b in ranks_est))
    assert compare_covariances(est, Sigma, k=2).direction_spearman == pytest.approx(num / den)


def test_layer_type_strips_block_index_and_prefix():
    from acetools.diagnostics import layer_type

    assert layer_type("visual.transformer.resblocks.11.mlp.c_fc.weight") == "mlp.c_fc.weight"
    assert layer_type("visual.transformer.resblocks.0.attn.in_proj_weight") == "attn.in_proj_weight"
    assert layer_type("visual.conv1.weight") == "conv1.weight"
    assert layer_type("text_projection") == "text_projection"


def test_relative_update_norms_brute_force():
    import math

    from acetools.diagnostics import relative_update_norms

    g = torch.Generator().manual_seed(0)
    base = {"a.weight": torch.randn(4, 3, generator=g), "z": torch.zeros(2)}
    taus = [{k: torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(2)]
    df = relative_update_norms(base, taus, ["p", "q"])
    assert len(df) == 4
    r = df[(df.task == "q") & (df.key == "a.weight")].iloc[0]
    assert r.ratio == pytest.approx(float(taus[1]["a.weight"].norm() / base["a.weight"].norm()))
    assert math.isnan(df[(df.key == "z")].ratio.iloc[0])
    with pytest.raises(ValueError, match="shape"):
        relative_update_norms(base, [{"a.weight": torch.zeros(3, 4), "z": torch.zeros(2)}])
    with pytest.raises(KeyError, match="base has no key"):
        relative_update_norms({"z": torch.zeros(2)}, taus)
