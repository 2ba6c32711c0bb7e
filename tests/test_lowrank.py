"""Merging LoRA factors in their own rank (docs/methods.md §Low-rank updates) against the engine's full-space
merge of the folded updates B_t A_t (the brute force), on small random factors."""

from __future__ import annotations

import pytest
import torch

from acetools.errors import InputError
from acetools.merging import lowrank as lr
from acetools.merging.ace import ace_matrix
from acetools.merging.averaging import task_arithmetic, weight_averaging
from acetools.merging.linalg import polar, thin_svd
from acetools.merging.svd import iso_c_matrix, iso_cts_matrix, iso_cts_ranks, tsv_merge_matrix, tsv_rank

# (d_out, d_in, ranks): d_out < d_in and > d_in, r_t different per task
SHAPES = [(24, 40, (8, 9, 11)), (40, 24, (8, 10, 12)), (30, 20, (5, 6, 7, 8))]


def _factors(d_out, d_in, ranks, seed=0, dtype=torch.float32, scales=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for t, r in enumerate(ranks):
        c = 1.0 if scales is None else scales[t]
        out.append(((c * torch.randn(d_out, r, generator=g, dtype=torch.float64)).to(dtype),
                     torch.randn(r, d_in, generator=g, dtype=torch.float64).to(dtype)))
    return out


def _folded(factors):
    return [B.double() @ A.double() for B, A in factors]


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _annihilated(D, Q_B, Q_A):
    """||Q_Bᵀ D|| and ||D Q_A|| relative to ||D||: D lives outside both spans."""
    n = float(D.norm())
    return float((Q_B.mT @ D).norm()) / n, float((D @ Q_A).norm()) / n


@pytest.mark.parametrize("d_out,d_in,ranks", SHAPES)
def test_linear_rules_are_concatenated_factors(d_out, d_in, ranks):
    f = _factors(d_out, d_in, ranks)
    taus = [{"w": d.float()} for d in _folded(f)]
    base = {"w": torch.zeros(d_out, d_in)}
    for weights in (None, [0.5, 2.0, -1.0] + [1.0] * (len(ranks) - 3)):
        up = lr.task_arithmetic_lowrank(f, lam=0.7, weights=weights)
        assert up.rank == sum(ranks)
        full = task_arithmetic(base, taus, is_matrix=lambda k, w: True, lam=0.7, weights=weights)["w"]
        assert _rel(up.dense(), full) <= 1e-6
        wa = lr.weight_averaging_lowrank(f, weights=weights)
        assert _rel(wa.dense(), weight_averaging(base, taus, is_matrix=lambda k, w: True, weights=weights)["w"]) <= 1e-6


@pytest.mark.parametrize("d_out,d_in,ranks", SHAPES)
def test_tsv_m_equals_the_engine_where_k_is_within_each_rank(d_out, d_in, ranks):
    f = _factors(d_out, d_in, ranks, seed=1)
    assert tsv_rank(min(d_out, d_in), len(ranks)) <= min(ranks)  # the full-space result is determined
    up = lr.tsv_m_lowrank(f, alpha=1.3)
    assert up.rank == len(ranks) * tsv_rank(min(d_out, d_in), len(ranks))
    assert _rel(up.dense(), 1.3 * tsv_merge_matrix([d.float() for d in _folded(f)])) <= 1e-5
    # the order of the tasks does not matter
    assert _rel(lr.tsv_m_lowrank(f[::-1], alpha=1.3).dense(), up.dense()) <= 1e-6


def test_tsv_m_past_the_ranks_drops_the_null_slots_and_is_rotation_equivariant():
    """k = int(24 / 3) = 8 > r_t: the brute force keeps each task's non-zero triplets of the folded update (thin
    SVD); the full-space engine would add slots of LAPACK's null basis, so its result changes under a rotation of
    the problem while the low-rank one rotates with it."""
    d_out, d_in, ranks = 24, 40, (3, 5, 4)
    f = _factors(d_out, d_in, ranks, seed=2, dtype=torch.float64)
    trips = [thin_svd(d) for d in _folded(f)]
    U = torch.cat([u[:, :r] for (u, _, _), r in zip(trips, ranks)], 1)
    s = torch.cat([s[:r] for (_, s, _), r in zip(trips, ranks)])
    V = torch.cat([v[:r] for (_, _, v), r in zip(trips, ranks)], 0)
    brute = (polar(U) * s) @ polar(V)
    up = lr.tsv_m_lowrank(f)
    assert up.rank == sum(ranks)
    assert _rel(up.dense(), brute) <= 1e-10
    g = torch.Generator().manual_seed(3)
    P = torch.linalg.qr(torch.randn(d_out, d_out, generator=g, dtype=torch.float64)).Q
    Q = torch.linalg.qr(torch.randn(d_in, d_in, generator=g, dtype=torch.float64)).Q
    rotated = lr.tsv_m_lowrank([(P @ B, A @ Q) for B, A in f]).dense()
    assert _rel(P.mT @ rotated @ Q.mT, up.dense()) <= 1e-10
    engine = [tsv_merge_matrix(_folded(f)), P.mT @ tsv_merge_matrix([P @ d @ Q for d in _folded(f)]) @ Q.mT]
    assert _rel(engine[1], engine[0]) > 1e-3  # the full-space result is not a function of the updates here


@pytest.mark.parametrize("d_out,d_in,ranks", [*SHAPES, (30, 50, (3, 4, 5)), (50, 30, (2, 6, 4))])
def test_iso_c_equals_the_engine_on_the_span_and_the_rest_is_a_null_partial_isometry(d_out, d_in, ranks):
    f = _factors(d_out, d_in, ranks, seed=4, dtype=torch.float64)
    up = lr.iso_c_lowrank(f)
    engine = iso_c_matrix(_folded(f))
    R, m = sum(ranks), min(d_out, d_in)
    if R >= m:  # the summed update has full rank: the full-space result is determined
        assert _rel(up.dense(), engine) <= 1e-5
        return
    Q_B, Q_A = lr.span_bases(f)
    diff = engine - up.dense()
    sv = torch.linalg.svdvals(diff)
    sigma_bar = float(torch.linalg.svdvals(sum(_folded(f))).sum()) / m
    assert torch.allclose(sv[:m - R], torch.full((m - R,), sigma_bar, dtype=torch.float64), rtol=1e-5)
    assert float(sv[m - R:].max()) <= 1e-8 * sigma_bar
    assert max(_annihilated(diff, Q_B, Q_A)) <= 1e-8


def test_iso_c_with_full_rank_sum_equals_the_engine():
    f = _factors(12, 30, (5, 4, 6), seed=5)
    assert _rel(lr.iso_c_lowrank(f, alpha=0.5).dense(), 0.5 * iso_c_matrix([d.float() for d in _folded(f)])) <= 1e-5


@pytest.mark.parametrize("d_out,d_in,ranks,cf", [(24, 40, (8, 9, 11), 0.8), (40, 24, (8, 10, 12), 0.8),
                                                (30, 20, (5, 6, 7, 8), 0.8), (24, 40, (8, 9, 11), 0.5),
                                                (24, 40, (9, 9, 9), 1.0)])
def test_iso_cts_equals_the_engine_where_the_split_is_within_the_ranks(d_out, d_in, ranks, cf):
    """k_c <= rank of the sum and s <= every residual's rank: Eq. (LR.5b) is iso_cts_matrix of the folded updates
    (common_fraction 1.0: the common subspace alone, s = 0); the order of the tasks does not matter."""
    f = _factors(d_out, d_in, ranks, seed=9)
    k_c, s = iso_cts_ranks(min(d_out, d_in), len(ranks), cf)
    assert k_c <= sum(ranks) and (s > 0) == (cf < 1.0)
    up = lr.iso_cts_lowrank(f, alpha=1.3, common_fraction=cf)
    assert up.rank <= sum(ranks)
    assert _rel(up.dense(), 1.3 * iso_cts_matrix([d.float() for d in _folded(f)], cf)) <= 1e-5
    assert _rel(lr.iso_cts_lowrank(f[::-1], alpha=1.3, common_fraction=cf).dense(), up.dense()) <= 1e-6


@pytest.mark.parametrize("cf", [0.8, 0.25])
def test_iso_cts_past_the_ranks_keeps_the_brute_force_without_null_slots(cf):
    """R = 9 < k_c = 18 (cf 0.8: the common subspace is the whole span), or k_c = 6 < R and s = 6 above every
    residual's rank (cf 0.25): the brute force on the folded updates with the zero-singular-value slots dropped
    (Core Space's definition; the full-space engine fills them from LAPACK's null basis) and sigma_bar over
    min(d_out, d_in) slots; rotating the problem rotates the result."""
    d_out, d_in, ranks = 24, 40, (3, 4, 2)
    f = _factors(d_out, d_in, ranks, seed=10, dtype=torch.float64)
    k_c, s = iso_cts_ranks(24, 3, cf)
    D = sum(_folded(f))
    U, S, Vh = thin_svd(D)
    n = int((S > 1e-10 * S[0]).sum())
    U_c, S_c, V_c = U[:, :min(k_c, n)], S[:min(k_c, n)], Vh[:min(k_c, n)]
    tops = []
    for d in _folded(f):
        u, sv, vh = thin_svd(d - U_c @ (U_c.mT @ d))
        m = min(s, int((sv > 1e-10 * float(torch.linalg.matrix_norm(d, 2))).sum()))  # zero against the task's scale
        tops.append((u[:, :m], sv[:m], vh[:m]))
    U_all = torch.cat([*(u for u, _, _ in tops), U_c], 1)
    V_all = torch.cat([*(v for _, _, v in tops), V_c], 0)
    s_all = torch.cat([*(sv for _, sv, _ in tops), S_c])

    def ranked_polar(M):
        u, sv, vh = thin_svd(M)
        m = int((sv > 1e-10 * sv[0]).sum())
        return u[:, :m] @ vh[:m]

    brute = float(s_all.sum()) / 24 * ranked_polar(U_all) @ ranked_polar(V_all)
    up = lr.iso_cts_lowrank(f, common_fraction=cf)
    assert _rel(up.dense(), brute) <= 1e-10
    g = torch.Generator().manual_seed(11)
    P = torch.linalg.qr(torch.randn(d_out, d_out, generator=g, dtype=torch.float64)).Q
    Q = torch.linalg.qr(torch.randn(d_in, d_in, generator=g, dtype=torch.float64)).Q
    rotated = lr.iso_cts_lowrank([(P @ B, A @ Q) for B, A in f], common_fraction=cf).dense()
    assert _rel(P.mT @ rotated @ Q.mT, up.dense()) <= 1e-10


def test_iso_cts_refuses_a_split_the_engine_refuses():
    with pytest.raises(InputError, match="key 'w': Iso-CTS rank split failed"):
        lr.iso_cts_lowrank(_factors(4, 6, (2, 2, 2, 2, 2, 2)), common_fraction=0.0, key="w")


ACE_CASES = [
    dict(),  # the defaults (gate "auto": these tasks' spread of norms flags the layer; refinement with k <= R)
    dict(gate="off"),  # the unflagged closed form with the prior
    dict(gate="on"),  # trace normalisation, the flagged prior, the refinement (k <= rank)
    dict(gate="on", refine=False, prior=False),
    dict(gate="on", numerator="raw", eps_mode="relative"),
    dict(gate="off", prior=True, eps=0.3),
    dict(estimator="wudi"),
    dict(estimator="wudi", gate="on", prior=True, numerator="centered"),
    dict(gate="on", trace_norm=False, scaling=0.8),
]


@pytest.mark.parametrize("d_out,d_in,ranks", SHAPES)
@pytest.mark.parametrize("hp", ACE_CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "defaults"
                                                for c in ACE_CASES])
def test_ace_equals_the_engine(d_out, d_in, ranks, hp):
    f = _factors(d_out, d_in, ranks, seed=6, scales=[0.02 * (3.0 ** t) for t in range(len(ranks))])
    up, info = lr.ace_lowrank(f, **hp)
    scaling = hp.pop("scaling", 1.0)
    W, diag = ace_matrix([d.float() for d in _folded(f)], **hp)
    assert (info.flag, info.refined) == (diag.flag, diag.refined)
    assert abs(info.gamma - diag.gamma) <= 1e-6 * max(1.0, abs(diag.gamma))
    assert info.null_rank == 0
    assert up.rank == info.span_rank <= sum(ranks)
    assert _rel(up.dense(), scaling * W) <= 1e-5


def test_ace_refinement_past_the_rank_omits_only_a_null_partial_isometry():
    """k = floor(0.3 * 60) = 18 > R = 7: the engine's W_bar adds sigma_iso times k - R singular pairs of the
    null spaces of W_fused (LAPACK's choice); the low-rank path is the rest."""
    d_out, d_in, ranks = 60, 80, (2, 3, 2)
    f = _factors(d_out, d_in, ranks, seed=7, dtype=torch.float64, scales=[0.02, 0.5, 3.0])
    up, info = lr.ace_lowrank(f, gate="on")
    W, diag = ace_matrix(_folded(f), gate="on")
    assert info.refined and diag.refined and info.k == diag.k == 18
    assert info.null_rank == 18 - sum(ranks)
    assert abs(info.sigma_iso - diag.sigma_iso) <= 1e-8 * diag.sigma_iso
    diff = W - up.dense()
    sv = torch.linalg.svdvals(diff)
    n = info.null_rank
    assert torch.allclose(sv[:n], torch.full((n,), info.sigma_iso, dtype=torch.float64), rtol=1e-6)
    assert float(sv[n:].max()) <= 1e-8 * info.sigma_iso
    _, Q_A = lr.span_bases(f)
    assert float((diff @ Q_A).norm()) <= 1e-8 * float(diff.norm())


def test_to_rank_is_the_best_approximation_and_reports_the_discarded_energy():
    f = _factors(30, 50, (6, 7, 5), seed=8, dtype=torch.float64)
    up = lr.task_arithmetic_lowrank(f, lam=1.0)
    dense = up.dense()
    S = torch.linalg.svdvals(dense)
    for k in (0, 4, 10, 18, 40):
        cut = lr.to_rank(up, k)
        assert cut.update.rank == min(k, 18)
        U, s, Vh = thin_svd(dense)
        assert _rel(cut.update.dense(), (U[:, :k] * s[:k]) @ Vh[:k]) <= 1e-10 if k > 0 else cut.update.rank == 0
        want = float(S[k:].square().sum() / S.square().sum())
        assert abs(cut.discarded - want) <= 1e-12
    assert lr.to_rank(up, 18).discarded <= 1e-24
    with pytest.raises(InputError, match="rank=-1"):
        lr.to_rank(up, -1)


def test_bad_inputs_are_one_line_errors():
    f = _factors(10, 12, (2, 3))
    with pytest.raises(InputError, match="task 1: B_t A_t is 10 x 13"):
        lr.tsv_m_lowrank([f[0], (f[1][0], torch.randn(3, 13))], key="q_proj")
    with pytest.raises(InputError, match="task 0: B_t .* must be d_out x r_t"):
        lr.iso_c_lowrank([(f[0][0], f[1][1])])
    with pytest.raises(InputError, match="no factors"):
        lr.task_arithmetic_lowrank([])
    with pytest.raises(InputError, match="eps=0.0"):
        lr.ace_lowrank(f, eps=0.0)
    with pytest.raises(InputError, match="estimator='identity'"):
        lr.ace_lowrank(f, estimator="identity")
    with pytest.raises(InputError, match="weights"):
        lr.weight_averaging_lowrank(f, weights=[1.0, -1.0])


def test_the_benchmark_times_both_paths_and_sums_the_layer():
    from tests.conftest import load_script

    bench = load_script("lora_lowrank")
    rows = [bench.worker(m, p, 24, 40, 3, 4, 1, 0) for m in bench.METHODS for p in bench.PATHS]
    assert all(r["status"] == "ok" and r["wall_s"] >= 0 for r in rows)
    assert {r["out_rank"] for r in rows if r["path"] == "lowrank" and r["method"] == "task_arithmetic"} == {12}
    table = bench.layer_table(rows, {"x": ((24, 40), 3)})
    for row in table:
        got = {r["path"]: r["wall_s"] for r in rows if r["method"] == row["method"]}
        assert row["lowrank_s"] == pytest.approx(3 * got["lowrank"], abs=1e-3)
        assert row["full_s"] == pytest.approx(3 * got["full"], abs=1e-3)
    assert bench.layer_table(rows[:1], {"x": ((24, 40), 1)})[0]["full_s"] is None  # a missing case: no total
