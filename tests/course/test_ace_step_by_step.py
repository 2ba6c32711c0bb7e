"""acetools_course.lesson02_ace_step_by_step: the tables and the ablation runner of notebook 02."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import acetools
from acetools.diagnostics import heterogeneity_per_layer, subspace_similarity
from acetools.merging import task_vectors
from acetools.merging.ace import (
    ace_with_diagnostics,
    estimate_covariance,
    normalize_covariances,
    structural_prior,
)
from acetools_course import lesson02_ace_step_by_step as AC
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


# --------------------------------------------------------------------------- tables


def test_gamma_by_type_counts(world):
    base, experts = world
    gt = heterogeneity_per_layer(task_vectors(base, experts), tau=0.0)  # everything with gamma > 0 is flagged
    bt = AC.gamma_by_type(gt, tau=0.0)
    assert bt["matrices"].sum() == len(gt) and bt.shape[1] <= 6
    assert bt["flagged (γ > 0)"].sum() == int((gt.gamma > 0).sum())
    c_fc = bt.loc["c_fc"]
    rows = gt[gt.layer_type == "mlp.c_fc.weight"].gamma
    assert c_fc["median γ"] == pytest.approx(rows.median()) and c_fc["largest γ"] == pytest.approx(rows.max())
    assert AC.gamma_by_type(gt, tau=1e9)["flagged (γ > 1e+09)"].sum() == 0


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


@pytest.mark.parametrize("gate", ["on", "off"])
def test_ridge_over_prior_reads_the_librarys_prior(gate):
    """ridge_over_prior = sum_t ridge_t / ‖c‖₂, with c the prior (ACE.9) the library built."""
    dWs = _layer(T=3, shape=(9, 6), scales=[0.5, 1.0, 4.0])
    taus = [{"w.weight": d} for d in dWs]
    base = {"w.weight": torch.zeros(9, 6, dtype=torch.float64)}
    W, W_pre, diags = _tables(taus, base, gate=gate)
    covs = normalize_covariances([estimate_covariance(d) for d in dWs], normalize=gate == "on")
    e = float(np.mean([float(d.pow(2).sum()) for d in dWs]))
    C = structural_prior(covs.Sigma_tilde, energy=e if gate == "on" else None)
    row = AC.layer_table(taus, W_pre, W, diags).iloc[0]
    assert row.ridge_over_prior == pytest.approx(float(covs.ridge.sum()) / float(C[0].norm()), rel=1e-9)
    W, W_pre, diags = _tables(taus, base, gate=gate, prior=False)
    assert AC.layer_table(taus, W_pre, W, diags).ridge_over_prior.item() == math.inf  # no prior: the ridge alone


def _tables(taus, base, **hp):
    W, diags = ace_with_diagnostics(base, taus, **hp)
    W_pre, _ = ace_with_diagnostics(base, taus, refine=False, **hp)
    return W, W_pre, diags


def test_layer_table_direction_cosine_is_one_for_shared_directions():
    # every task vector is the same rank-2 matrix times a task scale: W_pre, the sum and the
    # experts share their principal directions
    g = torch.Generator().manual_seed(1)
    M = torch.randn(20, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 20, generator=g, dtype=torch.float64)
    M = M - M.mean(0)  # centred rows: the estimator sees M itself
    taus = [{"w.weight": c * M} for c in (0.5, 1.0, 2.0)]
    base = {"w.weight": torch.zeros(20, 20, dtype=torch.float64)}
    W, W_pre, diags = _tables(taus, base)
    st = AC.layer_table(taus, W_pre, W, diags, top_frac=0.1)
    assert st.k_dir.item() == 2
    assert st.cos_sum.item() == pytest.approx(1.0, abs=1e-6)
    assert st.cos_experts.item() == pytest.approx(1.0, abs=1e-6)
    assert st.top_energy_pre.item() == pytest.approx(1.0, abs=1e-6)


def test_layer_table_cos_hooked():
    base, experts = _hetero_world()
    taus = task_vectors(base, experts)
    W, W_pre, diags = _tables(taus, base)
    keys = list(diags)
    hooked, unhooked = keys[0], keys[1]
    # identity covariances: the closed form (ACE.1) is the task-vector mean, so cos_hooked = cos_sum exactly
    eye = [{hooked: torch.eye(taus[0][hooked].shape[1], dtype=torch.float64)} for _ in taus]
    given, _ = ace_with_diagnostics(base, taus, is_matrix=lambda k, t: k == hooked, estimator="given",
                                    covariances=eye)
    st = AC.layer_table(taus, W_pre, W, diags, hooked={hooked: given[hooked]}).set_index("key")
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
    given2, _ = ace_with_diagnostics(base, taus, is_matrix=lambda k, t: k == hooked, estimator="given",
                                     covariances=aniso)
    st2 = AC.layer_table(taus, W_pre, W, {hooked: diags[hooked]}, hooked={hooked: given2[hooked]})
    assert st2.cos_sum_hooked.item() < 0.99
    assert st2.cos_hooked.item() != pytest.approx(st2.cos_sum.item(), abs=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_layer_table_follows_the_tensors_device():
    """Notebook 02 keeps its tensors on the GPU: the table runs there and agrees with the CPU's."""
    base, experts = _hetero_world()
    taus = task_vectors(base, experts)
    W, W_pre, diags = _tables(taus, base)
    on_cpu = AC.layer_table(taus, W_pre, W, diags)
    gpu_taus = [{k: v.cuda() for k, v in tv.items()} for tv in taus]
    Wg, Wpg, dg = _tables(gpu_taus, {k: v.cuda() for k, v in base.items()})
    assert all(w.is_cuda for w in Wg.values())
    on_gpu = AC.layer_table(gpu_taus, Wpg, Wg, dg)
    for c in ("top_energy_pre", "cond_pre_trim", "cos_sum", "cos_experts", "ridge_over_prior"):
        np.testing.assert_allclose(on_gpu[c], on_cpu[c], rtol=1e-6)


# --------------------------------------------------------------------------- ablation


class StubBench:
    """A benchmark double: evaluate() scores a state by a number derived from its weights and
    remembers what it was given; run() records its arguments."""

    def __init__(self, base, experts):
        self.base, self.experts = base, experts
        self.evaluated: list[dict] = []
        self.runs: list[tuple] = []
        self.world = SimpleNamespace(suite="stub")

    def evaluate(self, state, split="test"):
        assert split == "test"
        self.evaluated.append(state)
        v = float(sum(w.double().abs().sum() for w in state.values()))
        return {"a": (v % 1.0) / 2, "b": 0.5}

    def scored(self, state, split="test"):
        """Per task, which of 10 examples are right (the first 10·acc of evaluate()), and their accuracy."""
        hits = {t: np.arange(10) < round(10 * a) for t, a in self.evaluate(state, split).items()}
        return {t: float(h.mean()) for t, h in hits.items()}, hits

    def expert_accuracy(self, split="test"):
        return {"a": 0.8, "b": 0.8}

    def normalized(self, acc, split):
        return {t: a / 0.8 for t, a in acc.items()}

    def layout_kwargs(self):
        return {}

    def run(self, method, *, search="default", label=None, **hparams):
        self.runs.append((method, search, label, hparams))
        return SimpleNamespace(coef_name="scaling", coef=1.3, test={"a": 0.4, "b": 0.6},
                               test_normalized={"a": 0.5, "b": 0.75},
                               test_correct={"a": np.arange(10) < 4, "b": np.arange(10) < 6})


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
    # each test example's correctness and the experts' accuracy travel with the per-task rows (paired margins)
    for _, r in ab.per_task.iterrows():
        assert r.expert == 80.0 and r.correct.dtype == bool and r.correct.mean() == pytest.approx(r.accuracy / 100)
    row = ab.table.set_index("variant").loc["no prior"]
    assert row.hparams == "prior=False" and row.suite == "stub"
    accs = [bench.evaluate(s)["a"] for s in list(bench.evaluated)]
    np.testing.assert_allclose(ab.table.test_acc, [100 * (round(10 * a) / 10 + 0.5) / 2 for a in accs])
    np.testing.assert_allclose(ab.table.test_normalized, ab.table.test_acc / 0.8)


def test_run_ablation_reuses_identical_merges_and_adds_the_scaled_row():
    base, experts = make_world(scale=1e-3, dtype=torch.float64)  # energies far below 1: gamma low, nothing flagged
    assert not heterogeneity_per_layer(task_vectors(base, experts)).flag.any()
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
    scaled = ab.per_task[ab.per_task.variant == AC.SCALED_LABEL].set_index("task")["correct"]
    assert scaled["a"].sum() == 4 and scaled["b"].sum() == 6
    # a reused merge reuses its per-example results too
    pt = ab.per_task.set_index(["variant", "task"])["correct"]
    assert all(np.array_equal(pt[AC.GATE_OFF, t], pt[AC.FULL, t]) for t in ("a", "b"))
    assert (ab.table.suite == "mine").all()


def two_suite_ablation() -> AC.Ablation:
    """Two suites of the six ablation rows, 80 down to 75 points (s20 one point higher)."""
    rows = []
    for suite, shift in (("s8", 0.0), ("s20", 1.0)):
        for v, acc in ((AC.FULL, 80), (AC.GATE_ON, 79), (AC.GATE_ON_NO_REFINE, 78), (AC.GATE_OFF, 77),
                       (AC.NO_PRIOR, 76), (AC.NO_REFINE, 75)):
            rows.append({"suite": suite, "variant": v, "test_acc": acc, "test_normalized": acc + shift})
    return AC.Ablation(pd.DataFrame(rows), pd.DataFrame())


def test_layer_table_on_a_world():
    base, experts = _hetero_world()
    taus = task_vectors(base, experts)
    W, W_pre, diags = _tables(taus, base, eps=1e-2)
    st = AC.layer_table(taus, W_pre, W, diags)
    assert list(st.key) == list(diags) and st.flag.any() and not st.flag.all()
    for _, row in st.iterrows():
        assert row.flag == diags[row.key].flag and row.gamma == diags[row.key].gamma
        assert 0.0 < row.top_energy_pre <= 1.0 and 0.0 < row.cos_random < 1.0 and 0.0 <= row.cos_sum <= 1.0
        if row["shape"][0] <= row["shape"][1]:  # centred numerator: one structural zero singular value
            assert row.cond_pre > 1e8 * row.cond_pre_trim
        else:
            assert row.cond_pre == pytest.approx(row.cond_pre_trim)
        d = diags[row.key]
        assert row.ridge_over_prior == pytest.approx(sum(d.ridge) / d.prior_norm)
        assert math.isnan(row.cos_hooked)  # no hooked covariances given
    same = st[~st.flag]  # unflagged layers keep W_pre: the final spectrum is W_pre's
    np.testing.assert_allclose(same.top_energy_final, same.top_energy_pre)
    refined = st[st.flag]
    assert (refined.top_energy_final != refined.top_energy_pre).all()
    views = AC.spectrum_view(st), AC.direction_view(st)
    for v in views:  # a student's table: at most six plain columns, no code identifiers
        assert v.shape[1] <= 6 and not any(re.fullmatch(r"[a-z]+(_[a-z]+)+", c) for c in v.columns), list(v.columns)


def test_ablation_effect():
    ab = two_suite_ablation()
    assert ab.effect(AC.FULL, AC.GATE_OFF, suite="s8") == 3
    with pytest.raises(ValueError):
        ab.effect(AC.FULL, AC.GATE_OFF)  # two suites: which one?
    with pytest.raises(KeyError):
        ab.effect("nope", AC.FULL, suite="s8")
    both = AC.Ablation.concat([AC.Ablation(ab.table.iloc[:6], pd.DataFrame()),
                               AC.Ablation(ab.table.iloc[6:], pd.DataFrame())])
    assert len(both.table) == 12
