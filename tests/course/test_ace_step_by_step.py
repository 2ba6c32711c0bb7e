"""acetools.course.ace_step_by_step: the stage tables, the ablation runner and the claim verdicts of notebook 02."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import acetools
from acetools.course import ace_step_by_step as AC
from acetools.diagnostics import subspace_similarity
from acetools.merging import task_vectors
from acetools.merging.ace import ace_matrix, ace_with_diagnostics, heterogeneity, structural_prior
from tests.conftest import make_world

BLOCK = "visual.transformer.resblocks.0."


def _layer(T=4, shape=(12, 6), scales=None, seed=0):
    """T task vectors of one layer; ``scales`` multiplies task t (energies far apart -> gamma up)."""
    g = torch.Generator().manual_seed(seed)
    scales = scales or [1.0] * T
    return [s * torch.randn(*shape, generator=g, dtype=torch.float64) for s in scales]


def _hetero_world(seed=0):
    """base + experts whose task vectors differ in scale by task: many layers flagged (gamma > 0.3)."""
    base, experts = make_world(n_tasks=4, seed=seed, scale=1.0, dtype=torch.float64)
    out = []
    for t, ex in enumerate(experts):
        c = [0.3, 1.0, 3.0, 0.5][t]
        out.append({k: base[k] + c * (ex[k] - base[k]) for k in base})
    return base, out


# --------------------------------------------------------------------------- gamma


def test_gamma_table_matches_heterogeneity_per_key(world):
    base, experts = world
    taus = task_vectors(base, experts)
    gt = AC.gamma_table(taus, tau=0.3)
    # matrix keys only: 2-D and not text_projection
    assert list(gt.key) == [k for k in base if base[k].ndim == 2 and "text_projection" not in k]
    for _, row in gt.iterrows():
        mats = [tv[row.key] for tv in taus]
        assert row.gamma == pytest.approx(heterogeneity(mats), rel=1e-12)
        assert row.flag == (row.gamma > 0.3)
        assert row.below_vit == (row.gamma < 0.25)
        ell = np.log([float(m.double().pow(2).sum()) + 1e-12 for m in mats])
        assert row.log_energy_mean == pytest.approx(ell.mean())
        assert row.log_energy_sd == pytest.approx(ell.std(ddof=1))
        assert row.gamma == pytest.approx(row.log_energy_sd**2 / (row.log_energy_mean**2 + 1e-12), rel=1e-9)
    assert gt.set_index("key").loc[BLOCK + "mlp.c_fc.weight", "layer_type"] == "mlp.c_fc.weight"
    assert gt.set_index("key").loc[BLOCK + "mlp.c_fc.weight", "block"] == 0


def test_gamma_table_flags_follow_tau():
    taus = [{"a.weight": d} for d in _layer(scales=[0.1, 1.0, 10.0, 3.0])]
    g = heterogeneity([tv["a.weight"] for tv in taus])
    assert AC.gamma_table(taus, tau=g * 0.9).flag.item()
    assert not AC.gamma_table(taus, tau=g * 1.1).flag.item()


def test_gamma_by_type_counts(world):
    taus = task_vectors(*world)
    gt = AC.gamma_table(taus, tau=0.0)  # everything with gamma > 0 is flagged
    bt = AC.gamma_by_type(gt)
    assert bt["layers"].sum() == len(gt)
    assert bt.loc["mlp.c_fc.weight", "layers"] == 1
    assert bt["flagged"].sum() == int((gt.gamma > 0).sum())
    assert (bt["gamma_min"] <= bt["gamma_median"]).all() and (bt["gamma_median"] <= bt["gamma_max"]).all()


def test_gamma_scaling_is_not_scale_invariant():
    dWs = _layer(scales=[0.5, 1.0, 2.0, 1.5])
    df = AC.gamma_scaling(dWs, [0.01, 1.0, 100.0])
    assert df.gamma[1] == pytest.approx(heterogeneity(dWs))
    # the mean log-energy moves by 2 log c, the spread does not
    assert df.log_energy_mean[2] - df.log_energy_mean[1] == pytest.approx(2 * math.log(100.0))
    sd = math.sqrt(df.gamma[1] * (df.log_energy_mean[1] ** 2 + 1e-12))
    for i in (0, 2):
        assert math.sqrt(df.gamma[i] * (df.log_energy_mean[i] ** 2 + 1e-12)) == pytest.approx(sd, rel=1e-6)
    assert len(set(np.round(df.gamma, 12))) == 3


# --------------------------------------------------------------------------- one layer


@pytest.mark.parametrize("switches", [{}, {"gate": "on"}, {"gate": "off"}, {"prior": False}, {"refine": False},
                                      {"numerator": "raw"}, {"gate": "on", "trace_norm": False}])
@pytest.mark.parametrize("shape", [(12, 6), (6, 12)])
def test_layer_stages_compose_to_ace_matrix(switches, shape):
    dWs = _layer(shape=shape, scales=[0.2, 1.0, 4.0, 0.7])
    st = AC.layer_stages(dWs, eps=1e-2, k_frac=0.3, **switches)
    W, diag = ace_matrix(dWs, eps=1e-2, k_frac=0.3, **switches)
    torch.testing.assert_close(st.W, W, rtol=1e-9, atol=1e-12)
    assert st.flag == diag.flag and st.gamma == pytest.approx(diag.gamma)
    assert st.refined_by_ace == diag.refined and st.k == int(0.3 * min(shape))


def test_layer_stages_intermediates():
    dWs = _layer(scales=[0.2, 1.0, 4.0, 0.7])
    st = AC.layer_stages(dWs, gate="on")
    assert st.flag and st.refined_by_ace
    # refinement at ACE's k is ACE's output; k = 0 is W_pre
    torch.testing.assert_close(st.refined(st.k), st.W)
    torch.testing.assert_close(st.refined(0), st.W_pre)
    with pytest.raises(ValueError):
        st.refined(st.rank + 1)
    # the centred numerator makes every column of W_pre sum to zero
    assert float(st.W_pre.sum(0).abs().max()) < 1e-10
    # W_fused = U S Vh reproduces the refinement's input
    res = sum(d @ S for d, S in zip(st.delta_W, st.covs.Sigma_tilde)) - sum(st.delta_W) @ st.covs.mean_reg()
    torch.testing.assert_close(st.W_fused, st.W_pre + res)
    torch.testing.assert_close(st.task_sum, sum(st.delta_W))
    # normalised: every task weighs 1/T; raw shares follow the traces
    w = st.task_weights(["a", "b", "c", "d"])
    np.testing.assert_allclose(w.share_used, 0.25)
    tr = np.array([float(torch.linalg.matrix_norm(d - d.mean(0)) ** 2) for d in dWs])
    np.testing.assert_allclose(w.share_raw, tr / tr.sum(), rtol=1e-9)
    prof = st.prior_profile()
    np.testing.assert_allclose(prof.prior, st.C_agg[0].numpy())
    assert prof.ridge.nunique() == 1 and prof.ridge[0] == pytest.approx(float(st.covs.ridge.sum()))
    spec = st.spectra()
    assert set(spec) == {"W_pre (closed form)", "W_fused = W_pre + Δ_res", "W (ACE's output)", "sum_t ΔW_t"}
    rs = st.refined_spectra([1, st.k])
    np.testing.assert_allclose(rs[st.k], spec["W (ACE's output)"], rtol=1e-9)


def test_layer_stages_unnormalised_weights_follow_traces():
    dWs = _layer(scales=[0.2, 1.0, 4.0, 0.7])
    st = AC.layer_stages(dWs, gate="off")
    w = st.task_weights()
    np.testing.assert_allclose(w.share_used, w.share_raw)
    assert w.share_used.max() > 0.5  # the big task dominates without normalisation
    assert not st.refined_by_ace and torch.equal(st.W, st.W_pre)
    assert AC.layer_stages(dWs, prior=False).prior_profile().prior.abs().max() == 0
    torch.testing.assert_close(AC.layer_stages(dWs, gate="off").C_agg, structural_prior(st.covs.Sigma_tilde))


def test_pick_layer():
    gt = pd.DataFrame({"key": ["a", "b", "c"], "gamma": [0.1, 3.0, 0.2]})
    assert AC.pick_layer(gt) == "b"
    assert AC.pick_layer(gt, "c") == "c"
    with pytest.raises(KeyError):
        AC.pick_layer(gt, "zzz")


# --------------------------------------------------------------------------- directions


def test_direction_cosine_matches_subspace_similarity():
    A_, B = _layer(T=2, shape=(10, 7), seed=3)
    dc = AC.direction_cosine(A_, B, 3)
    assert dc["left"] == pytest.approx(subspace_similarity(A_, B, 3, side="left", reduction="mean_cos"))
    assert dc["right"] == pytest.approx(subspace_similarity(A_, B, 3, side="right", reduction="mean_cos"))
    assert dc["mean"] == pytest.approx((dc["left"] + dc["right"]) / 2)
    assert AC.direction_cosine(A_, 5.0 * A_, 3)["mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        AC.direction_cosine(A_, B, 8)


def test_random_subspace_cosine_chance_level():
    c = AC.random_subspace_cosine(64, 2)
    assert 0.0 < c < 0.4
    assert AC.random_subspace_cosine(5, 5) == pytest.approx(1.0)  # the whole space
    assert AC.random_subspace_cosine(64, 16) > c


def test_stage_table_on_a_world():
    base, experts = _hetero_world()
    taus = task_vectors(base, experts)
    ref, diags = ace_with_diagnostics(base, taus, eps=1e-2)
    st = AC.stage_table(taus, reference=ref, eps=1e-2)
    assert list(st.key) == list(diags)
    for _, row in st.iterrows():  # the two solve routes differ by the forward error of a stable solve
        ls = AC.layer_stages([tv[row.key] for tv in taus], eps=1e-2, name=row.key)
        A = ls.covs.sum_reg() + (ls.C_agg if ls.C_agg is not None else 0.0)
        tol = A.shape[0] * torch.finfo(torch.float64).eps * float(torch.linalg.cond(A)) * float(ls.W.abs().max())
        assert row.ref_err <= tol, (row.key, row.ref_err, tol)
    assert st.flag.any()
    for _, row in st.iterrows():
        assert row.flag == diags[row.key].flag and row.k == int(0.3 * min(row["shape"]))
        assert 0.0 < row.top_energy_pre <= 1.0 and 0.0 < row.cos_random < 1.0 and 0.0 <= row.cos_sum <= 1.0
        if row["shape"][0] <= row["shape"][1]:  # centred numerator: one structural zero singular value
            assert row.cond_pre > 1e8 * row.cond_pre_trim
        else:
            assert row.cond_pre == pytest.approx(row.cond_pre_trim)
        assert row.share_max >= 1 / 4
    # unflagged layers keep W_pre: the final spectrum is W_pre's
    same = st[~st.refined]
    np.testing.assert_allclose(same.top_energy_final, same.top_energy_pre)


def test_stage_table_direction_cosine_is_one_for_shared_directions():
    # every task vector is the same rank-2 matrix times a task scale: W_pre, the sum and the
    # experts share their principal directions
    g = torch.Generator().manual_seed(1)
    M = torch.randn(20, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 20, generator=g, dtype=torch.float64)
    M = M - M.mean(0)  # centred rows: the estimator sees M itself
    taus = [{"w.weight": c * M} for c in (0.5, 1.0, 2.0)]
    st = AC.stage_table(taus, top_frac=0.1)
    assert st.k_dir.item() == 2
    assert st.cos_sum.item() == pytest.approx(1.0, abs=1e-6)
    assert st.cos_experts.item() == pytest.approx(1.0, abs=1e-6)
    assert st.top_energy_pre.item() == pytest.approx(1.0, abs=1e-6)


def test_hooked_closed_form_is_the_given_covariance_solve():
    dWs = _layer(T=3, shape=(7, 5), scales=[0.5, 1.0, 2.0], seed=3)
    g = torch.Generator().manual_seed(4)
    X = [torch.randn(40, 5, generator=g, dtype=torch.float64) * torch.tensor([3.0, 1.0, 0.2, 0.2, 0.1]) for _ in dWs]
    Sig = [x.T @ x for x in X]
    eps = 1e-2
    I5 = torch.eye(5, dtype=torch.float64)
    brute = sum(d @ (S + eps * I5) for d, S in zip(dWs, Sig)) @ torch.linalg.inv(sum(S + eps * I5 for S in Sig))
    torch.testing.assert_close(AC.hooked_closed_form(dWs, Sig, eps=eps), brute, rtol=1e-9, atol=1e-12)


def test_stage_table_cos_hooked():
    base, experts = _hetero_world()
    taus = task_vectors(base, experts)
    keys = AC.matrix_keys(taus)
    hooked, unhooked = keys[0], keys[1]
    # identity covariances: the closed form is the task-vector mean, so cos_hooked = cos_sum exactly
    eye = [{hooked: torch.eye(taus[0][hooked].shape[1], dtype=torch.float64)} for _ in taus]
    st = AC.stage_table(taus, keys[:2], covariances=eye).set_index("key")
    assert st.loc[hooked, "cos_hooked"] == pytest.approx(st.loc[hooked, "cos_sum"], abs=1e-9)
    assert st.loc[hooked, "cos_sum_hooked"] == pytest.approx(1.0, abs=1e-9)
    assert math.isnan(st.loc[unhooked, "cos_hooked"]) and math.isnan(st.loc[unhooked, "cos_sum_hooked"])
    # covariances that concentrate each task on different inputs move the reference away from the sum
    d_in = taus[0][hooked].shape[1]
    aniso = []
    for t in range(len(taus)):
        w = torch.full((d_in,), 1e-3, dtype=torch.float64)
        w[t % d_in] = 1.0
        aniso.append({hooked: torch.diag(w)})
    st2 = AC.stage_table(taus, [hooked], covariances=aniso)
    assert st2.cos_sum_hooked.item() < 0.99
    assert st2.cos_hooked.item() != pytest.approx(st2.cos_sum.item(), abs=1e-3)
    assert AC.stage_table(taus, [hooked]).cos_hooked.isna().all()  # no covariances: NaN
    with pytest.raises(ValueError, match="one {key: Sigma_t} dict per task"):
        AC.stage_table(taus, [hooked], covariances=aniso[:2])


# --------------------------------------------------------------------------- ablation


class StubBench:
    """A benchmark double: evaluate() scores a state by a number derived from its weights and
    remembers what it was given; run() records its arguments."""

    def __init__(self, base, experts):
        self.base, self.experts = base, experts
        self.evaluated: list[dict] = []
        self.runs: list[tuple] = []
        self.zoo = SimpleNamespace(suite="stub")

    def evaluate(self, state, split="test"):
        assert split == "test"
        self.evaluated.append(state)
        v = float(sum(w.double().abs().sum() for w in state.values()))
        return {"a": (v % 1.0) / 2, "b": 0.5}

    def normalized(self, acc, split):
        return {t: a / 0.8 for t, a in acc.items()}

    def run(self, method, *, search="default", label=None, **hparams):
        self.runs.append((method, search, label, hparams))
        return SimpleNamespace(coef_name="scaling", coef=1.3, test={"a": 0.4, "b": 0.6},
                               test_normalized={"a": 0.5, "b": 0.75})


def test_run_ablation_passes_the_switches_through():
    base, experts = _hetero_world()
    bench = StubBench(base, experts)
    variants = {"full": {}, "no prior": {"prior": False}, "gate on": {"gate": "on"}, "raw": {"numerator": "raw"}}
    ab = AC.run_ablation(bench, variants, hparams={"eps": 0.05}, scaled=False)
    assert list(ab.table.variant) == list(variants)
    assert len(bench.evaluated) == len(variants)
    for state, hp in zip(bench.evaluated, variants.values()):
        want = acetools.merge("ace", base, experts, eps=0.05, **hp)
        assert all(torch.equal(state[k], want[k]) for k in want)
    # the shared eps is used: a different eps gives a different merge
    other = acetools.merge("ace", base, experts)
    assert not all(torch.equal(bench.evaluated[0][k], other[k]) for k in other)
    assert set(ab.per_task.task) == {"a", "b"} and len(ab.per_task) == 2 * len(variants)
    row = ab.table.set_index("variant").loc["no prior"]
    assert row.hparams == "prior=False" and row.suite == "stub"
    accs = [bench.evaluate(s)["a"] for s in list(bench.evaluated)]
    np.testing.assert_allclose(ab.table.test_acc, [100 * (a + 0.5) / 2 for a in accs])
    np.testing.assert_allclose(ab.table.test_normalized, ab.table.test_acc / 0.8)


def test_run_ablation_reuses_identical_merges_and_adds_the_scaled_row():
    base, experts = make_world(scale=1e-3, dtype=torch.float64)  # energies far below 1: gamma low, nothing flagged
    assert not AC.gamma_table(task_vectors(base, experts)).flag.any()
    bench = StubBench(base, experts)
    ab = AC.run_ablation(bench, hparams={"eps": 0.02}, suite="mine")
    t = ab.table.set_index("variant")
    # nothing is flagged: "gate off" and "no refinement" change no weight
    assert t.loc[AC.GATE_OFF, "same_as"] == AC.FULL and t.loc[AC.NO_REFINE, "same_as"] == AC.FULL
    assert t.loc[AC.NO_PRIOR, "same_as"] == ""
    assert t.loc[AC.GATE_OFF, "test_acc"] == t.loc[AC.FULL, "test_acc"]
    assert len(bench.evaluated) == len(AC.ABLATIONS) - 2
    # the scaled row: bench.run with ACE_SCALED and the shared hyperparameters
    from acetools.benchmark import ACE_SCALED

    assert bench.runs == [("ace", ACE_SCALED, AC.SCALED_LABEL, {"eps": 0.02})]
    assert t.loc[AC.SCALED_LABEL, "scaling"] == 1.3
    assert t.loc[AC.SCALED_LABEL, "test_normalized"] == pytest.approx(62.5)
    assert (ab.table.suite == "mine").all()


def test_ablation_effect_and_effects():
    rows = []
    for suite, shift in (("s8", 0.0), ("s20", 1.0)):
        for v, acc in ((AC.FULL, 80), (AC.GATE_ON, 79), (AC.GATE_ON_NO_REFINE, 78), (AC.GATE_OFF, 77),
                       (AC.NO_PRIOR, 76), (AC.NO_REFINE, 75)):
            rows.append({"suite": suite, "variant": v, "test_acc": acc, "test_normalized": acc + shift})
    ab = AC.Ablation(pd.DataFrame(rows), pd.DataFrame())
    assert ab.effect(AC.FULL, AC.GATE_OFF, suite="s8") == 3
    with pytest.raises(ValueError):
        ab.effect(AC.FULL, AC.GATE_OFF)  # two suites: which one?
    with pytest.raises(KeyError):
        ab.effect("nope", AC.FULL, suite="s8")
    eff = AC.ablation_effects(ab, {"s8": 0.0, "s20": 0.5})
    assert eff["normalization"][0] == {"suite": "s8", "frac_flagged": 0.0, "d_auto": -2.0, "d_forced": 1.0}
    assert eff["csp"][1]["d"] == 4.0
    # nothing flagged in s8: refinement is judged with the gate forced (labelled); s20 with ACE as is
    assert eff["refinement"][0]["d"] == 1.0 and "gate forced" in eff["refinement"][0]["what"]
    assert eff["refinement"][0]["gate_forced"] and eff["refinement"][0]["d_ace_gate"] == 5.0
    # a few flagged layers (8 %, under FLAG_FRACTION) is not where the stage runs: the gate is forced
    few = AC.ablation_effects(ab, {"s8": 0.08, "s20": 0.5})
    assert few["refinement"][0]["gate_forced"] and not few["refinement"][1]["gate_forced"]
    assert eff["refinement"][1]["d"] == 5.0 and eff["refinement"][1]["what"] == "full - no refinement"
    both = AC.Ablation.concat([AC.Ablation(ab.table.iloc[:6], pd.DataFrame()),
                               AC.Ablation(ab.table.iloc[6:], pd.DataFrame())])
    assert len(both.table) == 12


# --------------------------------------------------------------------------- verdicts


def test_verdicts_pass_the_papers_own_numbers():
    """ACE's own statements: ViT-B/16 gamma < 0.25; W_pre's top 5% hold 99%+ of the energy with
    condition number > 8.7e5; principal directions at cosine ≈ 1."""
    assert AC.verdict_gamma(pd.DataFrame({"gamma": [0.2] * 10})).verdict == "reproduced"
    paper = pd.DataFrame({"top_energy_pre": [0.99, 0.995], "cond_pre": [9e5, 1e6], "cond_pre_trim": [9e5, 1e6]})
    assert AC.verdict_spectrum(paper).verdict == "reproduced"
    d = pd.DataFrame({"cos_sum": [1.0, 0.99], "cos_fused": [1.0, 1.0], "cos_experts": [0.5, 0.6],
                      "cos_random": [0.1, 0.1]})
    assert AC.verdict_direction(d).verdict == "reproduced"
    paper = d.assign(cos_hooked=[1.0, 0.99], cos_sum_hooked=[0.9, 0.9])
    assert AC.verdict_direction(paper).verdict == "reproduced"


def test_verdict_gamma():
    low = pd.DataFrame({"gamma": [0.01] * 19 + [0.5]})
    assert AC.verdict_gamma(low).verdict == "reproduced"
    mid = pd.DataFrame({"gamma": [0.01] * 6 + [0.5] * 4})
    assert AC.verdict_gamma(mid).verdict == "partly"
    high = pd.DataFrame({"gamma": [0.01] * 4 + [0.5] * 6})
    r = AC.verdict_gamma(high)
    v, reason, nums = r.verdict, r.reason, r.numbers
    assert v == "not reproduced" and nums["frac_flagged"] == pytest.approx(0.6) and "RoBERTa" in reason


def test_verdict_normalization_rules():
    low_ok = {"suite": "a", "frac_flagged": 0.0, "d_auto": 0.0, "d_forced": 0.2}
    low_bad = {"suite": "b", "frac_flagged": 0.05, "d_auto": 0.0, "d_forced": 2.0}  # forcing it helps
    high_ok = {"suite": "c", "frac_flagged": 0.5, "d_auto": 1.0, "d_forced": -3.0}
    high_bad = {"suite": "d", "frac_flagged": 0.5, "d_auto": 0.1, "d_forced": 0.0}
    assert AC.verdict_normalization([low_ok, high_ok]).verdict == "reproduced"
    assert AC.verdict_normalization([low_ok, high_bad]).verdict == "partly"
    # a vision world alone: the high-gamma half is not testable here, so agreement is only partly
    vit = AC.verdict_normalization([low_ok])
    assert vit.verdict == "partly" and "high-gamma half is not testable here" in vit.reason
    assert "gate forced" in vit.reason
    r = AC.verdict_normalization([low_bad, high_bad])
    v, reason, nums = r.verdict, r.reason, r.numbers
    assert v == "not reproduced" and set(nums) == {"b", "d"} and "low gamma" in reason and "high gamma" in reason


def test_verdict_csp_and_refinement():
    assert AC.verdict_csp([{"suite": "a", "d": 0.8}, {"suite": "b", "d": 0.6}]).verdict == "reproduced"
    assert AC.verdict_csp([{"suite": "a", "d": 0.8}, {"suite": "b", "d": 0.4}]).verdict == "partly"
    assert AC.verdict_csp([{"suite": "a", "d": -2.0}]).verdict == "not reproduced"
    r = AC.verdict_refinement([{"suite": "a", "d": 0.0, "what": "gate forced: refined - not refined"}])
    v, reason, _ = r.verdict, r.reason, r.numbers
    assert v == "not reproduced" and "gate forced" in reason and "(tie)" in reason  # no world: the measurement decides
    # the ridge swamps the prior (eps 1e-2 in the mini-world): the stage does not act, nothing to decide
    sw = AC.verdict_csp([{"suite": "a", "d": 0.1}], ridge_over_prior=12.0, eps=1e-2)
    assert sw.verdict == "not testable here" and "12× the structural prior" in sw.reason
    assert AC.verdict_csp([{"suite": "a", "d": 0.8}], ridge_over_prior=0.01).verdict == "reproduced"


def test_refinement_in_a_vision_world_is_undecidable_as_the_papers_own_vit_row():
    from acetools.course import paper_tables
    from acetools.course.verdicts import World

    w = World("mini-world", "full", {8: 4.1, 20: 3.1})
    big = [{"suite": "s8", "d": 3.0, "what": "gate forced: refined - not refined"}]
    r = AC.verdict_refinement(big, world=w, n_tasks={"s8": 8})
    # the paper's own ViT-B/16 ablation: 90.60 -> 90.60, so a ViT predicts no effect: undecidable, never failed
    assert r.verdict == "undecidable here" and r.predicted_effect == 0.0 and r.measured_effect == 3.0
    abl = paper_tables.ACE_STAGE_ABLATION["refinement"]
    paper_row = [{"suite": "s8", "d": abl["with"] - abl["without"], "what": "full - no refinement"}]
    assert AC.verdict_refinement(paper_row, world=w, n_tasks={"s8": 8}).verdict == "undecidable here"
    # a world with a paper number to scale (a language world, later) decides on the measurement
    assert AC.verdict_refinement(big, world=w, n_tasks={"s8": 8}, paper_effect=None).verdict == "reproduced"
    with pytest.raises(KeyError, match="n_tasks"):
        AC.verdict_refinement(big, world=w)


def test_verdict_spectrum_and_direction():
    t = pd.DataFrame({"top_energy_pre": [0.995, 0.999], "cond_pre": [1e16, 1e16], "cond_pre_trim": [1e6, 2e6]})
    assert AC.verdict_spectrum(t).verdict == "reproduced"
    t2 = t.assign(cond_pre_trim=[10.0, 20.0])
    r = AC.verdict_spectrum(t2)
    v, nums = r.verdict, r.numbers
    assert v == "partly" and nums["median_cond_raw"] == 1e16
    assert AC.verdict_spectrum(t2.assign(top_energy_pre=[0.5, 0.6])).verdict == "not reproduced"
    d = pd.DataFrame({"cos_sum": [0.95, 0.92], "cos_fused": [1.0, 1.0], "cos_experts": [0.5, 0.6],
                      "cos_random": [0.1, 0.1]})
    assert AC.verdict_direction(d).verdict == "reproduced"
    assert AC.verdict_direction(d.assign(cos_sum=[0.6, 0.7])).verdict == "partly"
    assert AC.verdict_direction(d.assign(cos_sum=[0.2, 0.3])).verdict == "not reproduced"
    assert "no hooked" in AC.verdict_direction(d).reason


def test_verdict_direction_decides_on_the_hooked_reference():
    d = pd.DataFrame({"cos_sum": [0.95, 0.92, 0.97], "cos_fused": [1.0, 1.0, 1.0], "cos_experts": [0.5, 0.6, 0.5],
                      "cos_random": [0.1, 0.1, 0.1], "cos_hooked": [0.3, 0.2, math.nan],
                      "cos_sum_hooked": [0.4, 0.5, math.nan]})
    r = AC.verdict_direction(d)  # aligned with the task sum, not with the solution W_pre estimates
    assert r.verdict == "not reproduced" and r.numbers["decided_on"] == "cos_hooked"
    assert r.numbers["n_hooked"] == 2 and r.numbers["median_cos_hooked"] == pytest.approx(0.25)
    assert r.numbers["median_cos_sum"] == pytest.approx(0.95) and "0.95" in r.measured
    # NaN rows (attn.out_proj: no hook) are skipped, not counted as 0
    assert AC.verdict_direction(d.assign(cos_hooked=[0.95, 0.91, math.nan])).verdict == "reproduced"
    assert AC.verdict_direction(d.assign(cos_hooked=[0.6, 0.7, math.nan], cos_sum=[0.1, 0.1, 0.1])).verdict \
        == "partly"
    # every row NaN: the task-vector sum decides, and the reason says so
    r = AC.verdict_direction(d.assign(cos_hooked=math.nan))
    assert r.verdict == "reproduced" and r.numbers["decided_on"] == "cos_sum" and "no hooked" in r.reason


def test_diagnose_reports_from_the_tables():
    base, experts = _hetero_world()
    taus = task_vectors(base, experts)
    gt, st = AC.gamma_table(taus), AC.stage_table(taus)
    ab = AC.Ablation(pd.DataFrame([{"suite": "s", "variant": AC.GATE_OFF, "same_as": AC.FULL, "scaling": 1.0},
                                   {"suite": "s", "variant": AC.NO_PRIOR, "same_as": "", "scaling": 1.0},
                                   {"suite": "s", "variant": AC.SCALED_LABEL, "same_as": "", "scaling": 0.7}]),
                     pd.DataFrame())
    lines = AC.diagnose(gt, st, ab)
    assert not any("hooked" in ln for ln in lines)  # no covariances: no hooked sentence
    hooked = st.assign(cos_hooked=[0.4] + [math.nan] * (len(st) - 1), cos_sum_hooked=0.8)
    line = next(ln for ln in AC.diagnose(gt, hooked, ab) if "hooked" in ln)
    assert "1 hookable matrices" in line and "median cosine 0.40" in line
    assert "s = 0.7 in s" in lines[-2]
    assert lines[0].startswith(f"gamma: {int(gt.flag.sum())} of {len(gt)} matrices are flagged")
    n_wide = sum(s[0] <= s[1] for s in st["shape"])
    assert any(line.startswith(f"spectrum: {n_wide} of {len(st)} matrices have d_out <= d_in") for line in lines)
    assert lines[-1] == f"ablation: switches that changed no weight: s: {AC.GATE_OFF} (= {AC.FULL})."
    calm = AC.diagnose(gt.assign(flag=False), st)
    assert calm[0].startswith("gamma: no matrix is flagged") and not calm[-1].startswith("ablation")


def test_claim_verdicts_at_the_papers_eps_with_the_default_beside():
    from acetools.course.verdicts import World

    rows = []
    for v, acc in ((AC.FULL, 80), (AC.GATE_ON, 79), (AC.GATE_ON_NO_REFINE, 78), (AC.GATE_OFF, 77),
                   (AC.NO_PRIOR, 76), (AC.NO_REFINE, 75), (AC.FULL + " @ eps 0.01", 70),
                   (AC.NO_PRIOR + " @ eps 0.01", 70.1)):
        rows.append({"suite": "s8", "variant": v, "test_acc": acc, "test_normalized": acc})
    ab = AC.Ablation(pd.DataFrame(rows), pd.DataFrame())
    main, side = ab.main(), ab.beside(0.01)
    assert set(side.table["variant"]) == {AC.FULL, AC.NO_PRIOR} and len(main.table) == 6
    gt = pd.DataFrame({"gamma": [0.1] * 10, "flag": [False] * 10})
    st = pd.DataFrame({"top_energy_pre": [0.8], "cond_pre": [1e3], "cond_pre_trim": [1e2], "cos_sum": [0.9],
                       "cos_fused": [1.0], "cos_experts": [0.5], "cos_random": [0.1]})
    v = AC.claim_verdicts(gt, st, main, {"s8": 0.0}, world=World("w", "full", {8: 4.0}), n_tasks={"s8": 8},
                          eps=1e-5, beside={"eps": 0.01, "stable": st, "ablation": side})
    assert v["ace.csp"].verdict == "reproduced" and "eps 1e-05, the paper's ViT setting" in v["ace.csp"].reason
    assert v["ace.csp"].numbers["beside"]["verdict"] == "not reproduced"  # -0.1 at the default: a tie
    assert "beside it, the code default eps 0.01" in v["ace.csp"].reason
    assert v["ace.refinement"].verdict == "undecidable here"
