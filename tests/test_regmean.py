"""RegMean (docs/methods.md §RegMean): transcription, least-squares property, special cases, Gram validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import acetools
from acetools.merging import is_matrix_param
from acetools.merging.regmean import regmean, regmean_matrix, shrink_gram, validate_grams

KEY = "blocks.0.mlp.c_fc.weight"


def _world(T=3, d_out=5, d_in=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    base = {
        KEY: torch.randn(d_out, d_in, generator=g, dtype=dtype),
        "blocks.0.mlp.c_fc.bias": torch.randn(d_out, generator=g, dtype=dtype),
        "blocks.0.attn.out_proj.weight": torch.randn(d_in, d_in, generator=g, dtype=dtype),
    }
    experts = [{k: v + 0.1 * torch.randn(v.shape, generator=g, dtype=dtype) for k, v in base.items()} for _ in range(T)]
    return base, experts


def _grams(T, d, seed=1, n=12, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(T):
        X = torch.randn(n, d, generator=g, dtype=dtype)
        out.append(X.T @ X / n)
    return out


def _run(base, experts, grams, alpha=0.95):
    return acetools.merge("regmean", base, experts, grams=grams, alpha=alpha)


def test_matches_loop_transcription():
    base, experts = _world()
    G = _grams(3, 4)
    alpha = 0.7
    Gs = []
    for Gt in G:  # shrink with explicit loops
        a = Gt.numpy().copy()
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                if i != j:
                    a[i, j] *= alpha
        Gs.append(a)
    Ws = [e[KEY].numpy() for e in experts]
    want = (np.linalg.inv(sum(Gs)) @ sum(Gt @ W.T for Gt, W in zip(Gs, Ws))).T
    out = _run(base, experts, [{KEY: Gt} for Gt in G], alpha)
    assert np.allclose(out[KEY].numpy(), want, rtol=1e-10, atol=1e-12)
    assert torch.allclose(shrink_gram(G[0], alpha), torch.from_numpy(Gs[0]), atol=1e-15)
    assert torch.allclose(regmean_matrix([e[KEY] for e in experts], G, alpha), torch.from_numpy(want), atol=1e-12)


def test_equal_grams_give_the_average():
    base, experts = _world()
    mean = torch.stack([e[KEY] for e in experts]).mean(0)
    eye = [{KEY: torch.eye(4, dtype=torch.float64)} for _ in range(3)]
    assert torch.allclose(_run(base, experts, eye)[KEY], mean, atol=1e-12)
    G = _grams(1, 4)[0]  # any shared Gram and any alpha: (T G)^-1 sum G W_t^T = mean W_t^T
    for alpha in (0.0, 0.3, 1.0):
        assert torch.allclose(_run(base, experts, [{KEY: G}] * 3, alpha)[KEY], mean, atol=1e-12)


def test_alpha_one_exact_grams_solve_joint_least_squares():
    # T linear-regression tasks y = W_t x; with alpha = 1 and G_t = X_t^T X_t / N_t, RegMean is
    # the joint least-squares fit min_W sum_t (1/N_t) ||X_t W^T - X_t W_t^T||^2
    base, experts = _world(T=3, d_out=3, d_in=5, seed=2)
    g = torch.Generator().manual_seed(3)
    Ns = [7, 11, 20]
    Xs = [torch.randn(n, 5, generator=g, dtype=torch.float64) for n in Ns]
    rows = torch.cat([X / n**0.5 for X, n in zip(Xs, Ns)])
    targets = torch.cat([X @ e[KEY].T / n**0.5 for X, e, n in zip(Xs, experts, Ns)])
    W_ls = torch.linalg.lstsq(rows, targets).solution.T
    grams = [{KEY: X.T @ X / n} for X, n in zip(Xs, Ns)]
    assert torch.allclose(_run(base, experts, grams, alpha=1.0)[KEY], W_ls, atol=1e-10)


def test_alpha_zero_is_a_per_column_weighted_mean():
    base, experts = _world()
    G = _grams(3, 4, seed=4)
    out = _run(base, experts, [{KEY: Gt} for Gt in G], alpha=0.0)[KEY]
    d = torch.stack([torch.diagonal(Gt) for Gt in G])  # T x d_in
    W = torch.stack([e[KEY] for e in experts])  # T x d_out x d_in
    want = (W * d[:, None, :]).sum(0) / d.sum(0)
    assert torch.allclose(out, want, atol=1e-12)


def test_keys_without_grams_take_the_mean_and_invariances():
    base, experts = _world()
    G = _grams(3, 4, seed=5)
    grams = [{KEY: Gt} for Gt in G]
    out = _run(base, experts, grams)
    for k in base:
        if k != KEY:
            assert torch.allclose(out[k], torch.stack([e[k] for e in experts]).mean(0), atol=1e-12), k
    # task order and a common scale of the Grams do not matter
    perm = [2, 0, 1]
    out_p = _run(base, [experts[i] for i in perm], [grams[i] for i in perm])
    out_s = _run(base, experts, [{KEY: 7.0 * Gt} for Gt in G])
    assert torch.allclose(out_p[KEY], out[KEY], atol=1e-12)
    assert torch.allclose(out_s[KEY], out[KEY], atol=1e-12)
    # one task's Gram scaled up pulls the merge towards that expert
    heavy = _run(base, experts, [{KEY: 1e6 * G[0]}, grams[1], grams[2]])
    assert torch.allclose(heavy[KEY], experts[0][KEY], atol=1e-4)


def test_update_is_full_weight_merge_and_inputs_untouched():
    base, experts = _world(dtype=torch.float32)
    G = _grams(3, 4, seed=6, dtype=torch.float32)
    grams = [{KEY: Gt} for Gt in G]
    copies = [{k: v.clone() for k, v in sd.items()} for sd in [base, *experts]]
    gcopies = [Gt.clone() for Gt in G]
    tvs = acetools.task_vectors(base, experts)
    upd = regmean(base, tvs, is_matrix=is_matrix_param, grams=grams, alpha=0.95)
    W_star = regmean_matrix([e[KEY].double() for e in experts], G, 0.95)
    assert upd[KEY].dtype == torch.float32
    assert torch.allclose(upd[KEY].double(), W_star - base[KEY].double(), atol=1e-6)
    for orig, sd in zip(copies, [base, *experts]):
        assert all(torch.equal(orig[k], sd[k]) for k in orig)
    assert all(torch.equal(a, b) for a, b in zip(gcopies, G))


def test_singular_sum_warns_with_layer_name_and_uses_pinv():
    base, experts = _world()
    G = torch.zeros(4, 4, dtype=torch.float64)
    G[:2, :2] = torch.tensor([[2.0, 0.5], [0.5, 1.0]])  # inputs 2 and 3 never active
    with pytest.warns(RuntimeWarning, match=KEY):
        out = _run(base, experts, [{KEY: G}] * 3, alpha=1.0)
    assert torch.isfinite(out[KEY]).all()
    mean = torch.stack([e[KEY] for e in experts]).mean(0)
    assert torch.allclose(out[KEY][:, :2], mean[:, :2], atol=1e-10)  # the observed columns still average


def test_bad_grams():
    base, experts = _world()
    G = _grams(3, 4)
    good = [{KEY: Gt} for Gt in G]
    with pytest.raises(TypeError, match="grams"):
        _run(base, experts, {KEY: G[0]})
    with pytest.raises(TypeError, match="missing required hyperparameter 'grams'"):
        acetools.merge("regmean", base, experts)
    with pytest.raises(ValueError, match="2 Gram dicts for 3 experts"):
        _run(base, experts, good[:2])
    with pytest.raises(KeyError, match=r"grams\[1\].*'blocks.0.attn.out_proj.weight'"):
        _run(base, experts, [{**good[0], "blocks.0.attn.out_proj.weight": torch.eye(4)}, good[1], good[2]])
    with pytest.raises(KeyError, match="did you mean 'blocks.0.mlp.c_fc.weight'"):
        _run(base, experts, [{"blocks.0.mlp.c_fc": Gt} for Gt in G])
    with pytest.raises(ValueError, match="2-D"):
        _run(base, experts, [{"blocks.0.mlp.c_fc.bias": torch.eye(5)} for _ in G])
    with pytest.raises(ValueError, match=r"grams\[2\]\['blocks.0.mlp.c_fc.weight'\] has shape \(5, 5\)"):
        _run(base, experts, [good[0], good[1], {KEY: torch.eye(5, dtype=torch.float64)}])
    bad = G[1].clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"grams\[1\].*NaN"):
        _run(base, experts, [good[0], {KEY: bad}, good[2]])
    with pytest.raises(TypeError, match="not a torch.Tensor"):
        _run(base, experts, [good[0], {KEY: G[1].numpy()}, good[2]])
    with pytest.raises(TypeError, match=r"grams\[0\]"):
        _run(base, experts, [None, good[1], good[2]])
    with pytest.raises(ValueError, match="alpha"):
        _run(base, experts, good, alpha=1.5)
    assert validate_grams(base, good, 3) == [KEY]
    assert validate_grams(base, [{}, {}, {}], 3) == []
