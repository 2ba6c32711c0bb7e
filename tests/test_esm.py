"""ESM (docs/methods.md §ESM): stages, the full method against a NumPy transcription of Steps A-D, properties, bad
inputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import acetools
from acetools.merging import METHODS, task_vectors
from acetools.merging.esm import (
    CLIP_LAYER_TYPES,
    DEFAULT_TARGETS,
    concatenate_factors,
    eigen_weights,
    esm_merge_matrix,
    essential_subspace,
    layer_scales,
    polar_scales,
    polarize_dimensions,
    polarize_layers,
    polarize_tasks,
    rank_budget,
    task_coordinates,
    truncate_factors,
    whiten,
)
from tests.conftest import SHAPES, make_world

# two blocks, so that the inter-layer polarization compares something
SHAPES2 = dict(SHAPES)
SHAPES2.update({k.replace("resblocks.0.", "resblocks.1."): s for k, s in SHAPES.items() if "resblocks.0." in k})
# For T = 1 the budget k = d_out must not exceed rank(X dW^T) <= d_in: ESD layers with d_in >= d_out.
SHAPES_WIDE = {}
for _i in range(2):
    _b = f"visual.transformer.resblocks.{_i}."
    SHAPES_WIDE.update({_b + "attn.in_proj_weight": (12, 16), _b + "attn.out_proj.weight": (16, 16),
                        _b + "mlp.c_fc.weight": (16, 16), _b + "mlp.c_proj.weight": (16, 20),
                        _b + "ln_1.weight": (16,)})
SHAPES_WIDE.update({"visual.proj": (16, 8), "visual.class_embedding": (16,)})
N_ROWS = 80  # >= every d_out (64): no null-space ambiguity (docs/methods.md §ESM, Step A)


def world(n_tasks=4, seed=0, dtype=torch.float64, n_rows=N_ROWS, shapes=None):
    """Full-rank task vectors (rank >= k at every ESD layer) and activations for every ESD key."""
    base, experts = make_world(n_tasks=n_tasks, seed=seed, rank=64, dtype=dtype, shapes=shapes or SHAPES2)
    g = torch.Generator().manual_seed(seed + 100)
    acts = {}
    for k, w in base.items():
        if w.ndim == 2 and any(p in k for p in DEFAULT_TARGETS):
            acts[k] = [torch.randn(n_rows, w.shape[1], generator=g, dtype=torch.float64).to(dtype) for _ in experts]
    return base, experts, acts


def update(merged, base):
    return {k: merged[k].double() - base[k].double() for k in base}


# --------------------------------------------------------------------------- NumPy transcription
def np_polar_scaled(M):
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    return U @ Vt * S.mean()


def np_basis(X, dW, decomposition):
    """Step A by another route: eigh of the uncentred second moment of dO (ESD) or SVD of dW."""
    d_out = dW.shape[0]
    if decomposition == "esd":
        dO = X @ dW.T
        lam, V = np.linalg.eigh(dO.T @ dO / (X.shape[0] - 1))
        order = np.argsort(-lam)
        return V[:, order], lam[order]
    U, S, _ = np.linalg.svd(dW)  # full U: d_out x d_out; but ESM pads with identity columns
    r = S.shape[0]
    P = np.eye(d_out)
    P[:, :r] = U[:, :r]
    lam = np.zeros(d_out)
    lam[:r] = S ** 2
    return P, lam


def np_esd_layer(taus, Xs, decomposition="esd", task_power=2.0, dim_power=2.0, eig=0.15, const=2.0):
    T = len(taus)
    d_out = taus[0].shape[0]
    k = int(d_out * (1 / T))
    bases = [np_basis(X, dW, decomposition) for X, dW in zip(Xs, taus)]
    norms = [np.linalg.norm(P.T @ dW) for (P, _), dW in zip(bases, taus)]
    P_cols, A_rows = [], []
    for (P, lam), dW, n in zip(bases, taus, norms):
        A = (P.T @ dW) * n ** task_power  # Step B1: x n_t^2 ...
        e = (lam[:k] / lam[:k].mean()) ** eig
        e = e / e.mean()
        P_cols.append(P[:, :k] * e[None, :])
        A_rows.append(A[:k, :] * e[:, None])
    P_cat = np.hstack(P_cols)
    A_cat = np.vstack(A_rows) / np.mean(norms) ** task_power  # ... and / (mean n)^2 after concatenation
    c = np.linalg.norm(A_cat, axis=0)
    A_cat = A_cat * (c / c.mean())[None, :] ** dim_power
    return const * np_polar_scaled(P_cat) @ np_polar_scaled(A_cat)


def np_tsvm(taus):
    T = len(taus)
    d_out, d_in = taus[0].shape
    r = min(d_out, d_in)
    k = int(r * (1 / T))
    U_cat, s_cat, V_cat = np.zeros((d_out, r)), np.zeros(r), np.zeros((r, d_in))
    for t, tau in enumerate(taus):
        U, S, Vt = np.linalg.svd(tau, full_matrices=False)
        U_cat[:, t * k:(t + 1) * k] = U[:, :k]
        s_cat[t * k:(t + 1) * k] = S[:k]
        V_cat[t * k:(t + 1) * k] = Vt[:k]
    pu = np.linalg.svd(U_cat, full_matrices=False)
    pv = np.linalg.svd(V_cat, full_matrices=False)
    return (pu[0] @ pu[2]) @ np.diag(s_cat) @ (pv[0] @ pv[2])


def np_esm(base, experts, acts, alpha=1.0, decomposition="esd", layer_power=2.0):
    taus = {k: [(ex[k].double() - base[k].double()).numpy() for ex in experts] for k in base}
    out, esd_keys = {}, []
    for k, w in base.items():
        if w.ndim != 2 or "text_projection" in k:
            out[k] = np.mean(taus[k], axis=0)
        elif any(p in k for p in DEFAULT_TARGETS):
            Xs = [x.double().numpy() for x in acts[k]] if decomposition == "esd" else [None] * len(experts)
            out[k] = np_esd_layer(taus[k], Xs, decomposition)
            esd_keys.append(k)
        else:
            out[k] = np_tsvm(taus[k])
    for ty in CLIP_LAYER_TYPES:  # Step C
        members = [k for k in out if ty in k]
        m = np.mean([np.linalg.norm(out[k]) for k in members])
        for k in members:
            out[k] = out[k] * (np.linalg.norm(out[k]) / m) ** layer_power
    for k in esd_keys:  # Step D, evaluation-code scope
        out[k] = alpha * out[k]
    return out


def assert_close_dict(got, want, atol=1e-9, rtol=1e-7):
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k].numpy(), want[k], atol=atol, rtol=rtol, err_msg=k)


# --------------------------------------------------------------------------- full method vs docs/methods.md §ESM
def test_registered_with_documented_defaults():
    info = METHODS["esm"]
    hp = info.hparams
    assert hp["alpha"] == 1.0 and hp["decomposition"] == "esd" and hp["alpha_scope"] == "esd"
    assert hp["task_power"] == hp["dim_power"] == hp["layer_power"] == 2.0
    assert hp["eig_power"] == 0.15 and hp["const"] == 2.0
    assert hp["targets"] == ("attn.in_proj_weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    assert set(hp["layer_types"]) == {"attn.in_proj_weight", "attn.out_proj.weight",
                                      "mlp.c_fc.weight", "mlp.c_proj.weight"}


@pytest.mark.parametrize("n_tasks, shapes", [(4, SHAPES2), (1, SHAPES_WIDE), (3, SHAPES_WIDE)])
def test_matches_spec_transcription(n_tasks, shapes):
    base, experts, acts = world(n_tasks=n_tasks, shapes=shapes)
    got = update(acetools.merge("esm", base, experts, activations=acts, alpha=0.7), base)
    assert_close_dict(got, np_esm(base, experts, acts, alpha=0.7))


def test_svd_decomposition_matches_transcription_without_activations():
    base, experts, _ = world()
    got = update(acetools.merge("esm", base, experts, decomposition="svd"), base)
    assert_close_dict(got, np_esm(base, experts, None, decomposition="svd"))


def test_esd_and_svd_paths_differ():
    base, experts, acts = world()
    a = update(acetools.merge("esm", base, experts, activations=acts), base)
    b = update(acetools.merge("esm", base, experts, decomposition="svd"), base)
    # c_proj keeps k = 4 of 16 directions: the two bases choose different ones
    key = "visual.transformer.resblocks.0.mlp.c_proj.weight"
    assert (a[key] - b[key]).norm() > 0.3 * a[key].norm()
    for k in ("visual.transformer.resblocks.0.attn.out_proj.weight", "visual.proj", "visual.ln_pre.bias"):
        torch.testing.assert_close(a[k], b[k])  # non-ESD keys do not depend on the basis


def test_callable_activations_equal_mapping_and_inputs_untouched():
    base, experts, acts = world()
    copies = ({k: v.clone() for k, v in base.items()}, [{k: v.clone() for k, v in e.items()} for e in experts],
              {k: [x.clone() for x in xs] for k, xs in acts.items()})
    calls = []

    def fn(t, key):
        calls.append((t, key))
        return acts[key][t]

    a = acetools.merge("esm", base, experts, activations=acts)
    b = acetools.merge("esm", base, experts, activations=fn)
    for k in base:
        assert torch.equal(a[k], b[k]), k
    assert set(calls) == {(t, k) for k in acts for t in range(len(experts))}
    for k in base:
        assert torch.equal(base[k], copies[0][k])
        for e, c in zip(experts, copies[1]):
            assert torch.equal(e[k], c[k])
    for k, xs in acts.items():
        assert all(torch.equal(x, c) for x, c in zip(xs, copies[2][k]))


def test_expert_order_invariance():
    base, experts, acts = world(seed=3)
    perm = [2, 0, 3, 1]
    a = update(acetools.merge("esm", base, experts, activations=acts), base)
    b = update(acetools.merge("esm", base, [experts[i] for i in perm],
                              activations={k: [xs[i] for i in perm] for k, xs in acts.items()}), base)
    for k in base:
        torch.testing.assert_close(a[k], b[k], atol=1e-10, rtol=1e-8)


def test_float32_close_to_float64():
    base, experts, acts = world(dtype=torch.float64)
    b32 = {k: v.float() for k, v in base.items()}
    e32 = [{k: v.float() for k, v in e.items()} for e in experts]
    a32 = {k: [x.float() for x in xs] for k, xs in acts.items()}
    d64 = update(acetools.merge("esm", base, experts, activations=acts), base)
    d32 = update(acetools.merge("esm", b32, e32, activations=a32), b32)
    for k in base:
        assert (d32[k] - d64[k]).norm() <= 1e-3 * d64[k].norm() + 1e-6, k


# --------------------------------------------------------------------------- Step D and the switches
def test_rank_notes_warn_once_per_merge_naming_the_other_layers():
    """Budgets k = 4-16 above the shift's rank (3 rows) on all 6 ESD layers: merge() warns once, naming the
    other five layers; esm_merge_matrix alone warns for its layer."""
    base, experts, acts = world(n_rows=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acetools.merge("esm", base, experts, activations=acts)
    notes = [str(w.message) for w in caught if "exceeds the rank" in str(w.message)]
    assert len(notes) == 1 and "[and 5 more like it: " in notes[0], notes
    assert all(k in notes[0] for k in acts)
    key = next(iter(acts))
    with pytest.warns(RuntimeWarning, match=rf"'{key}'.*exceeds the rank"):
        esm_merge_matrix([e[key] - base[key] for e in experts], acts[key], name=key)


def test_alpha_scope_switch():
    base, experts, acts = world()
    one = update(acetools.merge("esm", base, experts, activations=acts), base)
    esd = update(acetools.merge("esm", base, experts, activations=acts, alpha=0.5), base)
    allk = update(acetools.merge("esm", base, experts, activations=acts, alpha=0.5, alpha_scope="all"), base)
    esd_keys = [k for k in base if base[k].ndim == 2 and any(p in k for p in DEFAULT_TARGETS)]
    assert len(esd_keys) == 6
    for k in base:
        torch.testing.assert_close(allk[k], 0.5 * one[k])
        torch.testing.assert_close(esd[k], 0.5 * one[k] if k in esd_keys else one[k])
    # out_proj, proj and the 1-D means are not ESD layers: unscaled by default
    assert torch.equal(esd["visual.proj"], one["visual.proj"])
    assert one["visual.proj"].norm() > 0


def test_const_scales_esd_layers_only():
    base, experts, acts = world()
    two = update(acetools.merge("esm", base, experts, activations=acts), base)
    one = update(acetools.merge("esm", base, experts, activations=acts, const=1.0), base)
    for k in base:
        esd = base[k].ndim == 2 and any(p in k for p in DEFAULT_TARGETS)
        torch.testing.assert_close(one[k], 0.5 * two[k] if esd else two[k])


def test_layer_scaling_off_equals_empty_layer_types_and_power_zero():
    base, experts, acts = world()
    off = acetools.merge("esm", base, experts, activations=acts, layer_scaling=False)
    empty = acetools.merge("esm", base, experts, activations=acts, layer_types=())
    zero = acetools.merge("esm", base, experts, activations=acts, layer_power=0.0)
    on = acetools.merge("esm", base, experts, activations=acts)
    key = "visual.transformer.resblocks.1.mlp.c_fc.weight"
    for k in base:
        assert torch.equal(off[k], empty[k])
        torch.testing.assert_close(off[k], zero[k])
    assert not torch.allclose(off[key], on[key])


def test_reciprocal_layer_power_equalizes_norms_within_a_type():
    base, experts, acts = world(seed=5)
    d = {p: update(acetools.merge("esm", base, experts, activations=acts, layer_power=p), base) for p in (2.0, -1.0)}
    off = update(acetools.merge("esm", base, experts, activations=acts, layer_scaling=False), base)
    for ty in CLIP_LAYER_TYPES:
        k0, k1 = (f"visual.transformer.resblocks.{i}.{ty}" for i in (0, 1))
        n0, n1 = off[k0].norm(), off[k1].norm()
        m = (n0 + n1) / 2
        # power -1: beta * n = m for every layer; power 2: n' = n^3 / m^2 (the larger one grows)
        torch.testing.assert_close(d[-1.0][k0].norm(), m)
        torch.testing.assert_close(d[-1.0][k1].norm(), m)
        torch.testing.assert_close(d[2.0][k0].norm(), n0 ** 3 / m ** 2)
        big, small = (k0, k1) if n0 > n1 else (k1, k0)
        assert d[2.0][big].norm() / d[2.0][small].norm() > off[big].norm() / off[small].norm()


def test_rank_budget_respected():
    T, d_out, d_in = 3, 16, 24
    key = "blk.mlp.c_fc.weight"
    g = torch.Generator().manual_seed(0)
    base = {key: torch.randn(d_out, d_in, generator=g, dtype=torch.float64)}
    experts = [{key: base[key] + 0.1 * torch.randn(d_out, d_in, generator=g, dtype=torch.float64)} for _ in range(T)]
    acts = {key: [torch.randn(40, d_in, generator=g, dtype=torch.float64) for _ in range(T)]}
    k = rank_budget(d_out, T)
    assert k == 5
    for decomposition in ("esd", "svd"):
        dW = update(acetools.merge("esm", base, experts, activations=acts, decomposition=decomposition), base)[key]
        rank = int(torch.linalg.matrix_rank(dW))
        assert rank <= T * k < d_out
        assert rank == T * k  # generic data: the budget is used in full


def test_rank_budget_is_the_codes_int_of_a_product():
    assert rank_budget(3072, 20) == 153 and rank_budget(2304, 8) == 288 and rank_budget(768, 14) == 54
    assert rank_budget(98, 49) == 1  # int(98 * (1/49)) = int(1.999...) = 1, not floor(98/49) = 2
    assert rank_budget(3, 5) == 1  # raised from 0
    with pytest.raises(ValueError, match="n_tasks"):
        rank_budget(8, 0)


def test_targets_are_patterns_that_can_exclude_a_tower():
    base, experts, acts = world()
    text = "transformer.resblocks.0.mlp.c_fc.weight"  # a text-tower leftover, zero task vectors
    base = {**base, text: torch.randn(64, 16, dtype=torch.float64)}
    experts = [{**e, text: base[text].clone()} for e in experts]
    with pytest.raises(KeyError, match=r"'transformer\.resblocks\.0\.mlp\.c_fc\.weight'.*targets"):
        acetools.merge("esm", base, experts, activations=acts)
    visual = tuple(r"^visual\..*" + p.replace(".", r"\.") for p in DEFAULT_TARGETS)
    d = update(acetools.merge("esm", base, experts, activations=acts, targets=visual, layer_types=()), base)
    base_v = {k: v for k, v in base.items() if k != text}
    ref = update(acetools.merge("esm", base_v, [{k: v for k, v in e.items() if k != text} for e in experts],
                                activations=acts, layer_types=()), base_v)
    assert torch.count_nonzero(d[text]) == 0  # TSV-M of zero task vectors
    for k in ref:
        torch.testing.assert_close(d[k], ref[k])


def test_zero_task_vectors_give_zero_update_without_nan():
    base, experts, acts = world()
    key = "visual.transformer.resblocks.1.mlp.c_fc.weight"
    experts = [{**e, key: base[key].clone()} for e in experts]
    d = update(acetools.merge("esm", base, experts, activations=acts), base)
    assert torch.count_nonzero(d[key]) == 0
    assert all(torch.isfinite(v).all() for v in d.values())


# --------------------------------------------------------------------------- Step A
def test_essential_subspace_is_uncentred_pca_of_the_activation_shift():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(30, 6, generator=g, dtype=torch.float64) + 3.0  # non-zero mean: must not be removed
    dW = torch.randn(5, 6, generator=g, dtype=torch.float64)
    P, lam = essential_subspace(X, dW)
    dO = X @ dW.T
    C = dO.T @ dO / 29
    assert P.shape == (5, 5) and lam.shape == (5,)
    torch.testing.assert_close(P.T @ P, torch.eye(5, dtype=torch.float64))
    torch.testing.assert_close(P @ torch.diag(lam) @ P.T, C)  # uncentred: the mean stays in
    assert torch.all(lam[:-1] >= lam[1:])
    torch.testing.assert_close(task_coordinates(P, dW), P.T @ dW)


def test_essential_subspace_pads_with_identity_columns_when_n_lt_d_out():
    g = torch.Generator().manual_seed(2)
    N, d_out, d_in = 4, 9, 7
    X = torch.randn(N, d_in, generator=g, dtype=torch.float64)
    dW = torch.randn(d_out, d_in, generator=g, dtype=torch.float64)
    P, lam = essential_subspace(X, dW)
    assert P.shape == (d_out, d_out)
    assert torch.equal(P[:, N:], torch.eye(d_out, dtype=torch.float64)[:, N:])
    assert torch.equal(lam[N:], torch.zeros(d_out - N, dtype=torch.float64))
    dO = X @ dW.T
    torch.testing.assert_close(lam[:N], torch.linalg.svdvals(dO) ** 2 / (N - 1))
    torch.testing.assert_close(P[:, :N].T @ P[:, :N], torch.eye(N, dtype=torch.float64))
    # the leading N columns span the rows of dO
    torch.testing.assert_close(P[:, :N] @ (P[:, :N].T @ dO.T), dO.T)


def test_svd_decomposition_basis_and_padding():
    g = torch.Generator().manual_seed(3)
    dW = torch.randn(10, 4, generator=g, dtype=torch.float64)
    P, lam = essential_subspace(None, dW, decomposition="svd")
    U, S, _ = torch.linalg.svd(dW, full_matrices=False)
    torch.testing.assert_close(torch.abs(torch.sum(P[:, :4] * U, 0)), torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(lam, torch.cat([S ** 2, torch.zeros(6, dtype=torch.float64)]))
    assert torch.equal(P[:, 4:], torch.eye(10, dtype=torch.float64)[:, 4:])
    # X is ignored on this path
    P2, _ = essential_subspace(torch.randn(3, 4, generator=g, dtype=torch.float64), dW, "svd")
    assert torch.equal(P, P2)


def test_esd_captures_a_planted_activation_subspace_with_fewer_components():
    g = torch.Generator().manual_seed(4)
    d, k = 12, 2
    U, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    dW = U @ torch.diag(torch.linspace(10, 1, d, dtype=torch.float64)) @ V.T
    # inputs live (almost) in the span of the two *smallest* right singular vectors of dW
    X = torch.randn(200, k, generator=g, dtype=torch.float64) @ V[:, -k:].T
    X = X + 0.01 * torch.randn(200, d, generator=g, dtype=torch.float64)
    dO = X @ dW.T

    def energy(P, r):
        return float((dO @ P[:, :r]).square().sum() / dO.square().sum())

    P_esd, _ = essential_subspace(X, dW, "esd")
    P_svd, _ = essential_subspace(X, dW, "svd")
    assert energy(P_esd, k) > 0.99
    assert energy(P_svd, k) < 0.05
    # PCA of dO is optimal at every rank (Eckart-Young): never below the SVD basis
    for r in range(1, d + 1):
        assert energy(P_esd, r) >= energy(P_svd, r) - 1e-12
    # the SVD basis needs the full rank to reach what ESD gets with k components
    assert min(r for r in range(1, d + 1) if energy(P_svd, r) > 0.99) == d


# --------------------------------------------------------------------------- Step B stages
def test_polar_scales_and_reciprocal():
    n = torch.tensor([1.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(polar_scales(n, 2.0), torch.tensor([0.25, 2.25], dtype=torch.float64))
    rec = polar_scales(n, -1.0)
    torch.testing.assert_close(rec, torch.tensor([2.0, 2 / 3], dtype=torch.float64))
    assert rec[1] < rec[0]  # reciprocal: the larger norm gets the smaller weight
    torch.testing.assert_close(polar_scales(n, 0.0), torch.ones(2, dtype=torch.float64))
    z = polar_scales(torch.tensor([0.0, 2.0], dtype=torch.float64), -1.0)
    assert torch.isfinite(z).all() and z[0] == 0
    assert torch.equal(polar_scales(torch.zeros(3), 2.0), torch.zeros(3))


def test_polarize_tasks_uses_full_norms_and_reverses_with_reciprocal():
    g = torch.Generator().manual_seed(5)
    A1 = torch.randn(4, 3, generator=g, dtype=torch.float64)
    A2 = 3 * torch.randn(4, 3, generator=g, dtype=torch.float64)
    n1, n2 = A1.norm(), A2.norm()
    m = (n1 + n2) / 2
    out = polarize_tasks([A1, A2], 2.0)
    torch.testing.assert_close(out[0], A1 * (n1 / m) ** 2)
    torch.testing.assert_close(out[1], A2 * (n2 / m) ** 2)
    # truncated factors with the full norms passed in == truncating after the scaling
    cut = polarize_tasks([A1[:2], A2[:2]], 2.0, norms=[n1, n2])
    torch.testing.assert_close(cut[0], out[0][:2])
    torch.testing.assert_close(cut[1], out[1][:2])
    with pytest.raises(ValueError, match="one value per task"):
        polarize_tasks([A1, A2], 2.0, norms=[1.0])
    rec = polarize_tasks([A1, A2], -1.0)
    assert rec[1].norm() / A2.norm() < rec[0].norm() / A1.norm()  # the larger task is damped
    torch.testing.assert_close(rec[0].norm(), m)
    torch.testing.assert_close(rec[1].norm(), m)


def test_eigen_weights():
    lam = torch.tensor([8.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    e = eigen_weights(lam, 0.15)
    raw = (lam / lam.mean()) ** 0.15
    torch.testing.assert_close(e, raw / raw.mean())
    torch.testing.assert_close(e.mean(), torch.tensor(1.0, dtype=torch.float64))
    assert torch.all(e[:-1] > e[1:])
    torch.testing.assert_close(eigen_weights(lam, 0.0), torch.ones(4, dtype=torch.float64))
    assert torch.equal(eigen_weights(torch.zeros(3), 0.15), torch.ones(3))


def test_truncate_concatenate_polarize_dimensions():
    g = torch.Generator().manual_seed(6)
    X = torch.randn(20, 5, generator=g, dtype=torch.float64)
    dWs = [torch.randn(8, 5, generator=g, dtype=torch.float64) for _ in range(2)]
    subs = [essential_subspace(X, dW) for dW in dWs]
    k = rank_budget(8, 2)
    parts = [truncate_factors(s, task_coordinates(s.P, dW), k) for s, dW in zip(subs, dWs)]
    for (P_hat, A_hat), s, dW in zip(parts, subs, dWs):
        e = eigen_weights(s.lam[:k])
        torch.testing.assert_close(P_hat, s.P[:, :k] @ torch.diag(e))
        torch.testing.assert_close(A_hat, torch.diag(e) @ (s.P[:, :k].T @ dW))
    P_cat, A_cat = concatenate_factors(*zip(*parts))
    assert P_cat.shape == (8, 2 * k) and A_cat.shape == (2 * k, 5)
    torch.testing.assert_close(A_cat[k:], parts[1][1])
    out = polarize_dimensions(A_cat, 2.0)
    c = A_cat.norm(dim=0)
    torch.testing.assert_close(out, A_cat * ((c / c.mean()) ** 2)[None, :])
    rec = polarize_dimensions(A_cat, -1.0)
    j_big, j_small = int(c.argmax()), int(c.argmin())
    assert rec[:, j_big].norm() / c[j_big] < rec[:, j_small].norm() / c[j_small]


def test_whitened_factors_are_orthonormal_up_to_scale():
    g = torch.Generator().manual_seed(7)
    P_cat = torch.randn(12, 6, generator=g, dtype=torch.float64)
    A_cat = torch.randn(6, 9, generator=g, dtype=torch.float64)
    for M, gram in ((P_cat, lambda W: W.T @ W), (A_cat, lambda W: W @ W.T)):
        W = whiten(M)
        c = torch.linalg.svdvals(M).mean()
        torch.testing.assert_close(gram(W), c ** 2 * torch.eye(6, dtype=torch.float64))
        # the closest such matrix: same singular vectors as M
        torch.testing.assert_close(torch.linalg.svdvals(W), c * torch.ones(6, dtype=torch.float64))
    assert torch.equal(whiten(torch.zeros(4, 2)), torch.zeros(4, 2))


def _overlapping_factors(n, T, seed):
    """P_cat from T orthonormal n x n/T bases that share directions (kappa ~ 1e3-1e5, as ESM's P_cat on real
    task vectors), and a wide A_cat: float64."""
    g = torch.Generator().manual_seed(seed)
    k = n // T
    common = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64)).Q
    Ps = []
    for _ in range(T):
        Z = common + 3e-3 * torch.randn(n, k, generator=g, dtype=torch.float64)
        Ps.append(torch.linalg.qr(Z).Q * torch.linspace(1.5, 0.7, k, dtype=torch.float64))
    A = torch.randn(T * k, n // 3, generator=g, dtype=torch.float64)
    A = A * torch.logspace(0, -2, n // 3, dtype=torch.float64)
    return torch.cat(Ps, dim=1), A


def test_whiten_times_float32_takes_the_gram_and_beats_the_float32_svd(monkeypatch):
    """ESM's whitening of a square, ill-conditioned P_cat (docs/performance.md, ESM section): the float64 Gram route
    (never forming polar(P_cat)) is closer to the float64 SVD than the float32 SVD route it replaces."""
    from acetools.merging import esm as E

    P64, A64 = _overlapping_factors(96, 4, 21)
    s = torch.linalg.svdvals(P64)
    assert 1e3 < float(s[0] / s[-1]) < E.WHITEN_GRAM_MAX_RATIO  # inside the Gram route's range
    ref = whiten(P64) @ whiten(A64)  # float64: SVDs
    calls = []
    orig = E.gram_polar_times
    monkeypatch.setattr(E, "gram_polar_times", lambda *a, **k: calls.append(a[0].shape) or orig(*a, **k))

    def product(P, A):  # Step B5 as esm_merge_matrix runs it
        return E.whiten(P, times=E.whiten(A, dtype=torch.float64))

    now = product(P64.float(), A64.float())
    assert calls == [(96, 96)] and now.dtype == torch.float32
    monkeypatch.setattr(E, "_GRAM_WHITEN", False)
    before = product(P64.float(), A64.float())  # the float32 SVDs
    err_now = float((now.double() - ref).abs().max() / ref.abs().max())
    err_before = float((before.double() - ref).abs().max() / ref.abs().max())
    assert err_now < 1e-5 and err_now < err_before


def test_whiten_falls_back_to_the_svd_past_its_gram_limit():
    from acetools.merging import esm as E

    g = torch.Generator().manual_seed(22)
    Q1 = torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64)).Q
    Q2 = torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64)).Q
    for kappa, gram in ((1e5, True), (1e6 * 0.99, True), (1e8, False)):
        M = (Q1 * torch.logspace(0, -np.log10(kappa), 12, dtype=torch.float64)) @ Q2.T
        assert (E.gram_polar(M.float(), max_ratio=E.WHITEN_GRAM_MAX_RATIO) is not None) == gram
        if gram:
            W = whiten(M.float())
            eye = torch.eye(12, dtype=torch.float64)
        else:  # sigma below float32 rounding (12 eps32 sigma_1): no unique polar factor; the rank-r part, warned
            with pytest.warns(RuntimeWarning, match="'b0.c_fc'.*rank 9 < 12"):
                W = whiten(M.float(), name="b0.c_fc")
            V = Q2[:, :9]
            eye = V @ V.T  # W^T W = c^2 times the projector onto the top right singular vectors
        assert W.dtype == torch.float32 and torch.isfinite(W).all()
        torch.testing.assert_close(W.double().T @ W.double(), torch.linalg.svdvals(M.float().double()).mean() ** 2
                                   * eye, atol=1e-4, rtol=0)


def test_esm_merge_matrix_stage_composition():
    g = torch.Generator().manual_seed(8)
    taus = [torch.randn(10, 7, generator=g, dtype=torch.float64) for _ in range(3)]
    Xs = [torch.randn(15, 7, generator=g, dtype=torch.float64) for _ in range(3)]
    want = np_esd_layer([t.numpy() for t in taus], [x.numpy() for x in Xs], eig=0.3, const=1.5,
                        task_power=1.0, dim_power=3.0)
    got = esm_merge_matrix(taus, Xs, eig_power=0.3, const=1.5, task_power=1.0, dim_power=3.0)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-10)
    # switching a level off equals exponent 0
    a = esm_merge_matrix(taus, Xs, task_scaling=False, dim_scaling=False)
    b = esm_merge_matrix(taus, Xs, task_power=0.0, dim_power=0.0)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, esm_merge_matrix(taus, Xs))


def test_single_task_ignores_task_scaling():
    g = torch.Generator().manual_seed(9)
    tau = [torch.randn(6, 6, generator=g, dtype=torch.float64)]
    X = [torch.randn(12, 6, generator=g, dtype=torch.float64)]
    torch.testing.assert_close(esm_merge_matrix(tau, X), esm_merge_matrix(tau, X, task_scaling=False))


def test_layer_scales_per_type():
    u = {
        "b.0.attn.in_proj_weight": torch.full((2, 2), 1.0),
        "b.1.attn.in_proj_weight": torch.full((2, 2), 3.0),
        "b.0.mlp.c_fc.weight": torch.full((2, 2), 5.0),
        "visual.proj": torch.full((2, 2), 7.0),
    }
    betas = layer_scales(u)
    assert set(betas) == {"b.0.attn.in_proj_weight", "b.1.attn.in_proj_weight", "b.0.mlp.c_fc.weight"}
    assert betas["b.0.attn.in_proj_weight"] == pytest.approx(0.25)
    assert betas["b.1.attn.in_proj_weight"] == pytest.approx(2.25)
    assert betas["b.0.mlp.c_fc.weight"] == pytest.approx(1.0)
    out = polarize_layers(u)
    assert torch.equal(out["visual.proj"], u["visual.proj"])
    torch.testing.assert_close(out["b.1.attn.in_proj_weight"], torch.full((2, 2), 6.75))
    assert torch.equal(u["b.1.attn.in_proj_weight"], torch.full((2, 2), 3.0))  # input untouched


# --------------------------------------------------------------------------- bad inputs
def test_missing_activations_names_the_fix():
    base, experts, _ = world()
    with pytest.raises(TypeError, match="activations"):
        acetools.merge("esm", base, experts)


def test_bad_activations_name_key_and_task():
    base, experts, acts = world()
    key = "visual.transformer.resblocks.1.mlp.c_proj.weight"
    missing = {k: v for k, v in acts.items() if k != key}
    with pytest.raises(KeyError, match="resblocks.1.mlp.c_proj.weight"):
        acetools.merge("esm", base, experts, activations=missing)
    short = {**acts, key: acts[key][:3]}
    with pytest.raises(ValueError, match=r"has 3 tensors for 4 experts"):
        acetools.merge("esm", base, experts, activations=short)
    wrong = {**acts, key: [*acts[key][:2], torch.randn(10, 16, dtype=torch.float64), acts[key][3]]}
    with pytest.raises(ValueError, match=r"c_proj\.weight.*task 2.*d_in=16.*expects d_in=64"):
        acetools.merge("esm", base, experts, activations=wrong)
    empty = {**acts, key: [torch.zeros(0, 64, dtype=torch.float64)] * 4}
    with pytest.raises(ValueError, match="N=0"):
        acetools.merge("esm", base, experts, activations=empty)
    nan = {**acts, key: [torch.full((5, 64), float("nan"), dtype=torch.float64)] * 4}
    with pytest.raises(ValueError, match=r"c_proj\.weight.*task 0.*NaN"):
        acetools.merge("esm", base, experts, activations=nan)
    with pytest.raises(TypeError, match="list with one"):
        acetools.merge("esm", base, experts, activations={**acts, key: acts[key][0]})

    def bad_fn(t, k):
        return acts[k][t] if t != 1 else torch.randn(7, 3, dtype=torch.float64)

    with pytest.raises(ValueError, match=r"key '.*', task 1.*d_in=3"):
        acetools.merge("esm", base, experts, activations=bad_fn)


@pytest.mark.parametrize("hp, err", [
    ({"decomposition": "pca"}, ValueError),
    ({"alpha_scope": "some"}, ValueError),
    ({"eig_power": -0.1}, ValueError),
    ({"alpha": -1.0}, ValueError),
    ({"task_power": float("nan")}, ValueError),
    ({"const": "2"}, ValueError),
    ({"targets": ()}, ValueError),
    ({"targets": "mlp.c_fc.weight"}, ValueError),
    ({"layer_types": ("",)}, ValueError),
    ({"targets": ("mlp.(c_fc",)}, ValueError),
    ({"task_scaling": 1}, TypeError),
    ({"activations": [1, 2]}, ValueError),
    ({"rank": 3}, TypeError),
])
def test_bad_hyperparameters(hp, err):
    base, experts, acts = world(n_tasks=2)
    kw = {"activations": acts, **hp}
    name = next(iter(hp))
    with pytest.raises(err, match=name):
        acetools.merge("esm", base, experts, **kw)


def test_stage_functions_reject_bad_inputs():
    dW = torch.randn(4, 3)
    with pytest.raises(TypeError, match="needs the input activations"):
        essential_subspace(None, dW)
    with pytest.raises(ValueError, match="d_in=5"):
        essential_subspace(torch.randn(6, 5), dW)
    with pytest.raises(ValueError, match="decomposition"):
        essential_subspace(torch.randn(6, 3), dW, decomposition="pca")
    with pytest.raises(ValueError, match="one activation tensor per task"):
        esm_merge_matrix([dW, dW], [torch.randn(6, 3)])


def test_n_equal_one_and_leading_dims():
    g = torch.Generator().manual_seed(10)
    dW = torch.randn(4, 3, generator=g, dtype=torch.float64)
    x = torch.randn(1, 3, generator=g, dtype=torch.float64)
    P, lam = essential_subspace(x, dW)
    assert torch.isfinite(lam).all() and torch.isfinite(P).all()
    X = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)  # (batch, tokens, d_in)
    torch.testing.assert_close(essential_subspace(X, dW).lam, essential_subspace(X.reshape(10, 3), dW).lam)


def test_task_vectors_helper_round_trip():
    # the method protocol: the registered function returns an update for every key
    base, experts, acts = world(n_tasks=2)
    tvs = task_vectors(base, experts)
    from acetools.merging.esm import esm
    out = esm(base, tvs, is_matrix=lambda k, t: t.ndim == 2 and "text_projection" not in k, activations=acts)
    assert set(out) == set(base)
    for k, v in out.items():
        assert v.shape == base[k].shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_cuda_matches_cpu():
    base, experts, acts = world(dtype=torch.float32)  # activations stay on the CPU: moved per layer
    g = acetools.merge("esm", base, experts, activations=acts, device="cuda")
    c = acetools.merge("esm", base, experts, activations=acts)
    for k in base:
        assert g[k].device.type == "cuda"
        assert ((g[k].cpu().double() - c[k].double()).norm()
                <= 1e-4 * (c[k].double() - base[k].double()).norm() + 1e-6), k


# --------------------------------------------------------------------------- the RoBERTa variant
BERT_TYPES = ("attention.self.query.weight", "attention.self.key.weight", "attention.self.value.weight",
              "attention.output.dense.weight", "intermediate.dense.weight", "output.dense.weight")  # merge.py's order
BERT_SHAPES = {}
for _i in range(2):
    _b = f"encoder.layer.{_i}."
    BERT_SHAPES.update({_b + t: (8, 8) for t in BERT_TYPES[:4]})
    BERT_SHAPES.update({_b + "intermediate.dense.weight": (16, 8), _b + "output.dense.weight": (8, 16),
                        _b + "output.LayerNorm.weight": (8,)})


def np_esm_roberta(base, experts, acts, alpha):
    """[ESM-code] ESM-RoBERTa/merge.py as docs/methods.md §ESM states it: per matrix P_hat = P[:, :k] diag(e),
    A_hat = diag(e) (P^T dW)[:k], Procrustes x mean sigma on both concatenations, no polarization, no x2;
    1-D: the mean; inter-layer beta over the six types (first match in merge.py's order); alpha on every key."""
    out = {}
    for key, w in base.items():
        taus = [(ex[key] - w).double().numpy() for ex in experts]
        if w.ndim != 2:
            out[key] = np.mean(taus, axis=0)
            continue
        k = max(1, int(w.shape[0] * (1 / len(taus))))
        Ps, As = [], []
        for dW, X in zip(taus, acts[key]):
            P, lam = np_basis(X.double().numpy(), dW, "esd")
            e = (lam[:k] / lam[:k].mean()) ** 0.15
            e = e / e.mean()
            Ps.append(P[:, :k] * e[None, :])
            As.append((P.T @ dW)[:k] * e[:, None])
        out[key] = np_polar_scaled(np.hstack(Ps)) @ np_polar_scaled(np.vstack(As))
    groups = {}
    for key in out:
        ty = next((t for t in BERT_TYPES if t in key), None)
        if ty is not None and base[key].ndim == 2:
            groups.setdefault(ty, []).append(key)
    for members in groups.values():
        m = np.mean([np.linalg.norm(out[k]) for k in members])
        for k in members:
            out[k] = out[k] * (np.linalg.norm(out[k]) / m) ** 2
    return {k: alpha * v for k, v in out.items()}


def test_roberta_variant_matches_the_roberta_codes_equations():
    from acetools.merging.esm import ROBERTA, ROBERTA_ALPHA_GRID

    base, experts = make_world(n_tasks=4, seed=3, rank=64, dtype=torch.float64, shapes=BERT_SHAPES)
    g = torch.Generator().manual_seed(7)
    acts = {k: [torch.randn(40, w.shape[1], generator=g, dtype=torch.float64) for _ in experts]
            for k, w in base.items() if w.ndim == 2}
    got = update(acetools.merge("esm", base, experts, activations=acts, alpha=1.7, **ROBERTA), base)
    want = np_esm_roberta(base, experts, acts, alpha=1.7)
    assert_close_dict(got, want)
    # attention.output.dense is an ESD layer here (not TSV-M, as with the ViT targets); the ViT row differs
    assert len([k for k in acts if "attention.output.dense" in k]) == 2
    vit = update(acetools.merge("esm", base, experts, activations=acts, alpha=1.7, targets=ROBERTA["targets"],
                                layer_types=ROBERTA["layer_types"]), base)
    assert not np.allclose(vit["encoder.layer.0.intermediate.dense.weight"].numpy(),
                           want["encoder.layer.0.intermediate.dense.weight"])
    # alpha multiplies every key, the 1-D mean too; its grid is the official search's (0, 5] at step 0.1
    assert not np.allclose(want["encoder.layer.1.output.LayerNorm.weight"], 0)
    assert ROBERTA_ALPHA_GRID[0] == 0.1 and ROBERTA_ALPHA_GRID[-1] == 5.0 and len(ROBERTA_ALPHA_GRID) == 50
