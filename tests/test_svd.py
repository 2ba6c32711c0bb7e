"""TSV-M, Iso-C, Iso-CTS and CART (docs/methods.md §TSV-M, §Iso-C, §Iso-CTS, §CART) against loop transcriptions and
properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import acetools
from acetools.merging import is_matrix_param
from acetools.merging.svd import (
    cart,
    cart_matrix,
    cart_rank,
    is_cart_key,
    iso_c,
    iso_c_matrix,
    iso_cts,
    iso_cts_matrix,
    iso_cts_ranks,
    low_rank,
    tsv_m,
    tsv_merge_matrix,
    tsv_rank,
)
from tests.conftest import make_world


def _taus(T, d_out, d_in, seed=0, rank=None, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    if rank is None:
        return [torch.randn(d_out, d_in, generator=g, dtype=torch.float64).to(dtype) for _ in range(T)]
    return [
        (torch.randn(d_out, rank, generator=g, dtype=torch.float64)
         @ torch.randn(rank, d_in, generator=g, dtype=torch.float64)).to(dtype)
        for _ in range(T)
    ]


def _np_polar(M):
    P, _, Qt = np.linalg.svd(M, full_matrices=False)
    return P @ Qt


def _np_polar_eigh(M):
    """polar(M) = M (M^T M)^(-1/2) for a full-column-rank M: independent of the SVD route."""
    wide = M.shape[0] < M.shape[1]
    A = M.T if wide else M
    lam, Q = np.linalg.eigh(A.T @ A)
    out = A @ (Q * lam ** -0.5) @ Q.T
    return out.T if wide else out


def _rel(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())


# ----------------------------------------------------------------------------- TSV-M
def _tsv_transcription(taus, polar_fn=_np_polar):
    """docs/methods.md §TSV-M, Eqs. (TSV-M.1)-(TSV-M.3), step by step, with explicit loops over tasks and slots (numpy,
    float64)."""
    X = [t.double().numpy() for t in taus]
    T = len(X)
    d_out, d_in = X[0].shape
    r = min(d_out, d_in)
    k = math.floor(r * (1 / T))
    U_cat = np.zeros((d_out, r))
    s_cat = np.zeros(r)
    V_cat = np.zeros((r, d_in))
    for t in range(T):
        U, S, Vt = np.linalg.svd(X[t], full_matrices=False)
        for j in range(k):
            U_cat[:, t * k + j] = U[:, j]
            s_cat[t * k + j] = S[j]
            V_cat[t * k + j, :] = Vt[j, :]
    return polar_fn(U_cat) @ np.diag(s_cat) @ polar_fn(V_cat)


@pytest.mark.parametrize("shape,T", [((12, 9), 3), ((9, 12), 3), ((10, 8), 2)])
def test_tsv_matches_transcription_full_budget(shape, T):
    # T k = r: U_cat and V_cat have full rank, so polar can be checked through M (M^T M)^-1/2
    taus = _taus(T, *shape, seed=1)
    assert tsv_rank(min(shape), T) * T == min(shape)
    want = _tsv_transcription(taus, _np_polar_eigh)
    got = tsv_merge_matrix(taus)
    assert _rel(got, want) < 1e-8  # the eigh route squares U_cat's condition number


def test_tsv_matches_transcription_with_zero_tail():
    taus = _taus(3, 13, 10, seed=2)  # r = 10, k = 3, slot 9 stays zero
    assert tsv_rank(10, 3) == 3
    assert _rel(tsv_merge_matrix(taus), _tsv_transcription(taus)) < 1e-10


def test_tsv_single_task_reproduces_tau():
    (tau,) = _taus(1, 11, 7, seed=3)
    assert torch.allclose(tsv_merge_matrix([tau]), tau, atol=1e-12, rtol=0)
    tau32 = tau.float()
    assert torch.allclose(tsv_merge_matrix([tau32]), tau32, atol=1e-5, rtol=0)


def test_tsv_orthogonal_tasks_sum_exactly():
    # task vectors on mutually orthogonal left and right subspaces, each of rank <= k:
    # U_cat and V_cat are already orthonormal, so TSV-M returns the plain sum
    g = torch.Generator().manual_seed(4)
    d_out, d_in, T, k = 16, 12, 3, 4
    P = torch.linalg.qr(torch.randn(d_out, d_out, generator=g, dtype=torch.float64))[0]
    Q = torch.linalg.qr(torch.randn(d_in, d_in, generator=g, dtype=torch.float64))[0]
    taus = []
    for t in range(T):
        s = torch.rand(k, generator=g, dtype=torch.float64) + 0.5
        taus.append((P[:, t * k:(t + 1) * k] * s) @ Q[:, t * k:(t + 1) * k].T)
    assert torch.allclose(tsv_merge_matrix(taus), sum(taus), atol=1e-12)


def test_tsv_task_order_invariance_and_scaling():
    taus = _taus(4, 20, 16, seed=5)
    ref = tsv_merge_matrix(taus)
    perm = [taus[i] for i in (2, 0, 3, 1)]
    assert _rel(tsv_merge_matrix(perm), ref) < 1e-10
    assert _rel(tsv_merge_matrix([2.5 * t for t in taus]), 2.5 * ref) < 1e-10
    # a stacked tensor input is the same as a list
    assert torch.equal(tsv_merge_matrix(torch.stack(taus)), ref)


def test_tsv_rank_rule():
    assert tsv_rank(768, 8) == 96 and tsv_rank(768, 14) == 54 and tsv_rank(768, 20) == 38
    assert tsv_rank(10, 1) == 10
    assert tsv_rank(49, 49) == 0  # int(49 * (1/49)) = int(0.999...) as in the official code
    with pytest.raises(ValueError, match="n_tasks"):
        tsv_rank(10, 0)


def test_tsv_zero_budget_warns_and_is_zero():
    taus = _taus(5, 3, 40, seed=6)  # r = 3 < T = 5
    with pytest.warns(RuntimeWarning, match="rank"):
        out = tsv_merge_matrix(taus, key="tiny")
    assert out.shape == (3, 40) and not out.any()


def test_zero_task_vectors_give_zero_without_svd(monkeypatch):
    import acetools.merging.svd as svd_module

    def no_svd(M):
        raise AssertionError("an SVD was computed for all-zero task vectors")

    monkeypatch.setattr(svd_module, "thin_svd", no_svd)
    z = [torch.zeros(30, 8) for _ in range(3)]
    for fn in (tsv_merge_matrix, iso_c_matrix, iso_cts_matrix):
        out = fn(z)
        assert out.shape == (30, 8) and out.dtype == torch.float32 and not out.any()
    assert not cart_matrix(z).any()


def test_tsv_m_method_alpha_scales_every_key(world):
    base, experts = world
    tvs = acetools.task_vectors(base, experts)
    W0 = {k: v.clone() for k, v in base.items()}
    one = tsv_m(W0, tvs, is_matrix=is_matrix_param, alpha=1.0)
    two = tsv_m(W0, tvs, is_matrix=is_matrix_param, alpha=2.0)
    for k in base:
        assert torch.allclose(two[k], 2 * one[k], atol=1e-7), k
        if is_matrix_param(k, base[k]):
            assert torch.allclose(one[k], tsv_merge_matrix([tv[k] for tv in tvs]), atol=1e-7)
        else:
            assert torch.allclose(one[k], torch.stack([tv[k] for tv in tvs]).mean(0), atol=1e-7), k
    assert not one["text_projection"].any()  # not a matrix (docs/methods.md §Matrix path); zero


def test_merge_end_to_end_and_inputs_untouched():
    base, experts = make_world(n_tasks=3, seed=7)
    copies = [{k: v.clone() for k, v in sd.items()} for sd in [base, *experts]]
    for method in ("tsv_m", "iso_c", "iso_cts", "cart"):
        out = acetools.merge(method, base, experts)
        assert set(out) == set(base)
        assert all(out[k].dtype == base[k].dtype for k in base)
        tvs = acetools.task_vectors(base, experts)
        upd = acetools.METHODS[method].func(
            {k: v.float() for k, v in base.items()}, tvs, is_matrix=is_matrix_param,
            **acetools.METHODS[method].resolve({}),
        )
        for k in base:
            assert torch.allclose(out[k], base[k] + upd[k], atol=1e-6), (method, k)
    for orig, sd in zip(copies, [base, *experts]):
        for k in orig:
            assert torch.equal(orig[k], sd[k])


def test_matrix_path_bad_inputs():
    a, b = _taus(2, 6, 5, seed=8)
    with pytest.raises(ValueError, match="shape"):
        tsv_merge_matrix([a, b[:, :4]], key="blk.w")
    with pytest.raises(ValueError, match="2-D"):
        iso_c_matrix([a[0], b[0]])
    with pytest.raises(ValueError, match="at least one"):
        cart_matrix([])
    with pytest.raises(TypeError, match="not a Tensor"):
        tsv_merge_matrix([a, b.numpy()])
    base, experts = make_world(n_tasks=2)
    tvs = acetools.task_vectors(base, experts)
    with pytest.raises(ValueError, match="visual.conv1.weight"):
        tsv_m(base, tvs, is_matrix=lambda k, t: True, alpha=1.0)
    with pytest.raises(ValueError, match="alpha"):
        acetools.merge("tsv_m", base, experts, alpha=-1.0)
    with pytest.raises(ValueError, match="common_fraction"):
        acetools.merge("iso_cts", base, experts, common_fraction=1.5)
    with pytest.raises(ValueError, match="rank_ratio"):
        acetools.merge("cart", base, experts, rank_ratio=0.0)


# ----------------------------------------------------------------------------- Iso-C
def test_iso_c_matches_transcription_and_is_isotropic():
    taus = _taus(4, 15, 9, seed=9, rank=3)
    D = sum(t.numpy() for t in taus)
    U, S, Vt = np.linalg.svd(D, full_matrices=False)
    want = S.mean() * U @ Vt
    got = iso_c_matrix(taus)
    assert _rel(got, want) < 1e-10
    sv = torch.linalg.svdvals(got)
    assert torch.allclose(sv, torch.full_like(sv, S.mean()), rtol=1e-10)
    assert _rel(iso_c_matrix(taus[::-1]), got) < 1e-10


def test_iso_c_method(world):
    base, experts = world
    tvs = acetools.task_vectors(base, experts)
    out = iso_c(base, tvs, is_matrix=is_matrix_param, alpha=1.5)
    key = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    assert torch.allclose(out[key], 1.5 * iso_c_matrix([tv[key] for tv in tvs]), atol=1e-7)
    b = "visual.transformer.resblocks.0.mlp.c_fc.bias"
    assert torch.allclose(out[b], 1.5 * torch.stack([tv[b] for tv in tvs]).mean(0), atol=1e-7)


# ----------------------------------------------------------------------------- Iso-CTS
def test_iso_cts_rank_examples():
    assert iso_cts_ranks(768, 8) == (616, 19)
    assert iso_cts_ranks(768, 14) == (614, 11)
    assert iso_cts_ranks(768, 20) == (608, 8)
    for r in (16, 33, 64, 512, 1024):
        for T in (1, 2, 3, 5, 8):
            for f in (0.5, 0.8, 1.0):
                k_c, s = iso_cts_ranks(r, T, f)
                assert k_c + T * s == r and k_c >= 0 and s >= 0
    assert iso_cts_ranks(10, 4, 1.0) == (10, 0)
    with pytest.raises(ValueError, match="common_fraction"):
        iso_cts_ranks(3, 2, 0.0)  # round(3/2) * 2 = 4 > 3


def _iso_cts_transcription(taus, f):
    X = [t.double().numpy() for t in taus]
    T = len(X)
    d_out, d_in = X[0].shape
    r = min(d_out, d_in)
    k_c = int(f * r)
    m = round((r - k_c) / T) * T
    k_c = r - m
    s = (r - k_c) // T
    U, S, Vt = np.linalg.svd(sum(X), full_matrices=False)
    U_c, S_c, V_c = U[:, :k_c], S[:k_c], Vt[:k_c]
    U_all = np.zeros((d_out, r))
    s_all = np.zeros(r)
    V_all = np.zeros((r, d_in))
    for t in range(T):
        R = X[t] - U_c @ U_c.T @ X[t]
        Ut, St, Vtt = np.linalg.svd(R, full_matrices=False)
        for j in range(s):
            U_all[:, t * s + j] = Ut[:, j]
            s_all[t * s + j] = St[j]
            V_all[t * s + j] = Vtt[j]
    for j in range(k_c):
        U_all[:, T * s + j] = U_c[:, j]
        s_all[T * s + j] = S_c[j]
        V_all[T * s + j] = V_c[j]
    return s_all.mean() * _np_polar(U_all) @ _np_polar(V_all)


@pytest.mark.parametrize("shape,T,f", [((20, 16), 4, 0.8), ((16, 21), 3, 0.5), ((30, 30), 4, 0.8)])
def test_iso_cts_matches_transcription(shape, T, f):
    taus = _taus(T, *shape, seed=10)
    got = iso_cts_matrix(taus, f)
    assert _rel(got, _iso_cts_transcription(taus, f)) < 1e-9
    r = min(shape)
    sv = torch.linalg.svdvals(got)
    assert torch.allclose(sv, sv.mean().expand(r), rtol=1e-9)  # isotropic spectrum
    assert _rel(iso_cts_matrix(taus[::-1], f), got) < 1e-9  # task order only permutes slots


def test_iso_cts_full_common_space_is_iso_c():
    taus = _taus(3, 14, 10, seed=11)
    assert _rel(iso_cts_matrix(taus, 1.0), iso_c_matrix(taus)) < 1e-10


def test_iso_cts_method_error_names_key():
    base = {"w": torch.zeros(3, 5), "b": torch.zeros(3)}
    g = torch.Generator().manual_seed(0)
    tvs = [{"w": torch.randn(3, 5, generator=g), "b": torch.randn(3, generator=g)} for _ in range(2)]
    with pytest.raises(ValueError, match="'w'"):
        iso_cts(base, tvs, is_matrix=is_matrix_param, alpha=1.0, common_fraction=0.0)


# ----------------------------------------------------------------------------- CART
def _cart_transcription(taus, rho, lam):
    X = [t.double().numpy() for t in taus]
    T = len(X)
    mean = sum(X) / T
    r = min(mean.shape)
    k = max(1, int(rho * r))
    acc = np.zeros_like(mean)
    for t in range(T):
        U, S, Vt = np.linalg.svd(X[t] - mean, full_matrices=False)
        for j in range(k):
            acc += S[j] * np.outer(U[:, j], Vt[j])
    return mean + lam * acc


def test_cart_matches_transcription_and_invariances():
    taus = _taus(4, 18, 12, seed=12)
    got = cart_matrix(taus, 0.25, 1.7)
    assert _rel(got, _cart_transcription(taus, 0.25, 1.7)) < 1e-10
    assert _rel(cart_matrix(taus[::-1], 0.25, 1.7), got) < 1e-10
    mean = torch.stack(taus).mean(0)
    # full rank: the centred vectors are kept exactly and sum to zero -> the average, any lam
    assert torch.allclose(cart_matrix(taus, 1.0, 3.0), mean, atol=1e-10)
    assert torch.allclose(cart_matrix(taus, 0.25, 0.0), mean, atol=1e-12)
    assert torch.allclose(cart_matrix(taus[:1], 0.25, 2.0), taus[0], atol=1e-12)


def test_cart_rank_and_key_rules():
    assert cart_rank(768, 0.12) == 92 and cart_rank(16, 0.01) == 1 and cart_rank(768, 0.32) == 245
    assert is_cart_key("visual.transformer.resblocks.3.attn.in_proj_weight")
    assert is_cart_key("visual.transformer.resblocks.3.mlp.c_proj.weight")
    assert not is_cart_key("visual.transformer.resblocks.3.attn.in_proj_bias")
    assert not is_cart_key("visual.transformer.resblocks.3.ln_1.weight")
    assert not is_cart_key("visual.proj")
    M = _taus(1, 9, 6, seed=13)[0]
    assert torch.linalg.matrix_rank(low_rank(M, 2)) == 2


def test_cart_method_keys(world):
    base, experts = world
    tvs = acetools.task_vectors(base, experts)
    out = cart(base, tvs, is_matrix=is_matrix_param, rank_ratio=0.12, lam=2.0, targets="names")
    blocks = cart(base, tvs, is_matrix=is_matrix_param, rank_ratio=0.12, lam=2.0, targets="blocks")
    assert all(torch.equal(out[k], blocks[k]) for k in base), "on open_clip both rules pick the same keys"
    for k in base:
        taus = [tv[k] for tv in tvs]
        mean = torch.stack(taus).mean(0)
        if is_cart_key(k) and base[k].ndim == 2:
            assert torch.allclose(out[k], cart_matrix(taus, 0.12, 2.0), atol=1e-7), k
            assert not torch.allclose(out[k], mean, atol=1e-4), k
        else:  # proj, positional embedding, biases, ln: the average
            assert torch.equal(out[k], mean), k
