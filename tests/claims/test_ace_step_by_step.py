"""acetools_course.lesson02_ace_step_by_step: the claim verdicts of notebook 02."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from acetools_course import lesson02_ace_step_by_step as AC
from acetools_course import lesson02_ace_step_by_step as AV
from tests.course.test_ace_step_by_step import two_suite_ablation


def test_ablation_effects():
    ab = two_suite_ablation()
    eff = AV.ablation_effects(ab, {"s8": 0.0, "s20": 0.5})
    assert eff["normalization"][0] == {"suite": "s8", "frac_flagged": 0.0, "d_auto": -2.0, "d_forced": 1.0,
                                       "se_auto": None, "se_forced": None}  # no per-example results: no se
    assert eff["csp"][1]["d"] == 4.0
    # nothing flagged in s8: refinement is judged with the gate forced (labelled); s20 with ACE as is
    assert eff["refinement"][0]["d"] == 1.0 and "gate forced" in eff["refinement"][0]["what"]
    assert eff["refinement"][0]["gate_forced"] and eff["refinement"][0]["d_ace_gate"] == 5.0
    # a few flagged layers (8 %, under FLAG_FRACTION) is not where the stage runs: the gate is forced
    few = AV.ablation_effects(ab, {"s8": 0.08, "s20": 0.5})
    assert few["refinement"][0]["gate_forced"] and not few["refinement"][1]["gate_forced"]
    assert eff["refinement"][1]["d"] == 5.0 and eff["refinement"][1]["what"] == "full - no refinement"


def _paired_ablation(n: int) -> AC.Ablation:
    """One suite, one task of ``n`` test examples (expert accuracy 1): "ACE (full)" gets the first 60 % right,
    "no structural prior" the first 50 %: the prior gains 10 points on ``n / 10`` examples."""
    variants = (AC.FULL, AC.GATE_ON, AC.GATE_ON_NO_REFINE, AC.GATE_OFF, AC.NO_PRIOR, AC.NO_REFINE)
    right = {AC.FULL: 0.6, AC.NO_PRIOR: 0.5}
    table = pd.DataFrame([{"suite": "s", "variant": v, "test_normalized": 100 * right.get(v, 0.55)} for v in variants])
    per_task = pd.DataFrame([{"suite": "s", "variant": v, "task": "t", "expert": 100.0,
                              "correct": np.arange(n) < round(right.get(v, 0.55) * n)} for v in variants])
    return AC.Ablation(table, per_task)


def test_stage_margins_carry_the_test_noise():
    # 10 points gained on 2 of 20 examples: the paired se is 100 * sqrt(0.1 * 0.9 / 20) = 6.7, so the
    # margin (13.1) swallows the gain: a tie, where the bare 0.5-point floor would call it a gain
    small = AV.ablation_effects(_paired_ablation(20), {"s": 0.0})["csp"]
    assert small[0]["d"] == pytest.approx(10.0) and small[0]["se"] == pytest.approx(6.7, abs=1.0)
    v = AV.verdict_csp(small)
    assert v.verdict == "not reproduced" and "tie" in v.reason and v.effects[0].se == small[0]["se"]
    assert AV.verdict_csp([{**small[0], "se": None}]).verdict == "reproduced"
    # the same gain on 2,000 examples: se 0.67, margin 1.3: the gain counts
    large = AV.ablation_effects(_paired_ablation(2000), {"s": 0.0})["csp"]
    assert large[0]["se"] == pytest.approx(0.67, abs=0.1) and AV.verdict_csp(large).verdict == "reproduced"


def test_ridge_over_prior_is_the_median_over_matrices():
    st = pd.DataFrame({"ridge_over_prior": [1.0, 3.0, math.inf, 2.0]})  # inf: a matrix without prior, skipped
    assert AV.ridge_over_prior(st) == 2.0
    assert AV.ridge_over_prior(st.rename(columns={"ridge_over_prior": "x"})) is None


def test_verdicts_pass_the_papers_own_numbers():
    """ACE's own statements: ViT-B/16 gamma < 0.25; W_pre's top 5% hold 99%+ of the energy with
    condition number > 8.7e5; principal directions at cosine ≈ 1."""
    assert AV.verdict_gamma(pd.DataFrame({"gamma": [0.2] * 10})).verdict == "reproduced"
    paper = pd.DataFrame({"top_energy_pre": [0.99, 0.995], "cond_pre": [9e5, 1e6], "cond_pre_trim": [9e5, 1e6]})
    assert AV.verdict_spectrum(paper).verdict == "reproduced"
    d = pd.DataFrame({"cos_sum": [1.0, 0.99], "cos_experts": [0.5, 0.6],
                      "cos_random": [0.1, 0.1]})
    assert AV.verdict_direction(d).verdict == "reproduced"
    paper = d.assign(cos_hooked=[1.0, 0.99], cos_sum_hooked=[0.9, 0.9])
    assert AV.verdict_direction(paper).verdict == "reproduced"


def test_verdict_gamma():
    low = pd.DataFrame({"gamma": [0.01] * 19 + [0.5]})
    assert AV.verdict_gamma(low).verdict == "reproduced"
    mid = pd.DataFrame({"gamma": [0.01] * 6 + [0.5] * 4})
    assert AV.verdict_gamma(mid).verdict == "partly"
    high = pd.DataFrame({"gamma": [0.01] * 4 + [0.5] * 6})
    r = AV.verdict_gamma(high)
    v, reason, nums = r.verdict, r.reason, r.numbers
    assert v == "not reproduced" and nums["frac_flagged"] == pytest.approx(0.6) and "RoBERTa" in reason


def test_verdict_normalization_rules():
    low_ok = {"suite": "a", "frac_flagged": 0.0, "d_auto": 0.0, "d_forced": 0.2}
    low_bad = {"suite": "b", "frac_flagged": 0.05, "d_auto": 0.0, "d_forced": 2.0}  # forcing it helps
    high_ok = {"suite": "c", "frac_flagged": 0.5, "d_auto": 1.0, "d_forced": -3.0}
    high_bad = {"suite": "d", "frac_flagged": 0.5, "d_auto": 0.1, "d_forced": 0.0}
    assert AV.verdict_normalization([low_ok, high_ok]).verdict == "reproduced"
    assert AV.verdict_normalization([low_ok, high_bad]).verdict == "partly"
    # a vision world alone: the high-gamma half is not testable here, so agreement is only partly
    vit = AV.verdict_normalization([low_ok])
    assert vit.verdict == "partly" and "high-gamma half is not testable here" in vit.reason
    assert "gate forced" in vit.reason
    r = AV.verdict_normalization([low_bad, high_bad])
    v, reason, nums = r.verdict, r.reason, r.numbers
    assert v == "not reproduced" and set(nums) == {"b", "d"} and "low gamma" in reason and "high gamma" in reason


def test_verdict_csp_and_refinement():
    assert AV.verdict_csp([{"suite": "a", "d": 0.8}, {"suite": "b", "d": 0.6}]).verdict == "reproduced"
    assert AV.verdict_csp([{"suite": "a", "d": 0.8}, {"suite": "b", "d": 0.4}]).verdict == "partly"
    assert AV.verdict_csp([{"suite": "a", "d": -2.0}]).verdict == "not reproduced"
    r = AV.verdict_refinement([{"suite": "a", "d": 0.0, "what": "gate forced: refined - not refined"}])
    v, reason, _ = r.verdict, r.reason, r.numbers
    # no world: the measurement decides
    assert v == "not reproduced" and "gate forced" in reason and "(tie, margin 0.50)" in reason
    # the ridge swamps the prior (eps 1e-2 in the mini-world): the stage does not act, nothing to decide
    sw = AV.verdict_csp([{"suite": "a", "d": 0.1}], ridge_over_prior=12.0, eps=1e-2)
    assert sw.verdict == "not testable here" and "12× the structural prior" in sw.reason
    assert AV.verdict_csp([{"suite": "a", "d": 0.8}], ridge_over_prior=0.01).verdict == "reproduced"


def test_refinement_in_a_vision_world_is_undecidable_as_the_papers_own_vit_row():
    from acetools_course import paper_tables
    from acetools_course.verdicts import World

    w = World("mini-world", "full", {8: 4.1, 20: 3.1})
    big = [{"suite": "s8", "d": 3.0, "what": "gate forced: refined - not refined"}]
    r = AV.verdict_refinement(big, world=w, n_tasks={"s8": 8})
    # the paper's own ViT-B/16 ablation: 90.60 -> 90.60, so a ViT predicts no effect: undecidable, never failed
    assert r.verdict == "undecidable here" and r.predicted_effect == 0.0 and r.measured_effect == 3.0
    abl = paper_tables.ACE_STAGE_ABLATION["refinement"]
    paper_row = [{"suite": "s8", "d": abl["with"] - abl["without"], "what": "full - no refinement"}]
    assert AV.verdict_refinement(paper_row, world=w, n_tasks={"s8": 8}).verdict == "undecidable here"
    # a world with a paper number to scale (a language world, later) decides on the measurement
    assert AV.verdict_refinement(big, world=w, n_tasks={"s8": 8}, paper_effect=None).verdict == "reproduced"
    with pytest.raises(KeyError, match="n_tasks"):
        AV.verdict_refinement(big, world=w)


def test_verdict_spectrum_and_direction():
    t = pd.DataFrame({"top_energy_pre": [0.995, 0.999], "cond_pre": [1e16, 1e16], "cond_pre_trim": [1e6, 2e6]})
    assert AV.verdict_spectrum(t).verdict == "reproduced"
    t2 = t.assign(cond_pre_trim=[10.0, 20.0])
    r = AV.verdict_spectrum(t2)
    v, nums = r.verdict, r.numbers
    assert v == "partly" and nums["median_cond_raw"] == 1e16
    assert AV.verdict_spectrum(t2.assign(top_energy_pre=[0.5, 0.6])).verdict == "not reproduced"
    d = pd.DataFrame({"cos_sum": [0.95, 0.92], "cos_experts": [0.5, 0.6],
                      "cos_random": [0.1, 0.1]})
    assert AV.verdict_direction(d).verdict == "reproduced"
    assert AV.verdict_direction(d.assign(cos_sum=[0.6, 0.7])).verdict == "partly"
    assert AV.verdict_direction(d.assign(cos_sum=[0.2, 0.3])).verdict == "not reproduced"
    assert "no hooked" in AV.verdict_direction(d).reason


def test_verdict_direction_decides_on_the_hooked_reference():
    d = pd.DataFrame({"cos_sum": [0.95, 0.92, 0.97], "cos_experts": [0.5, 0.6, 0.5],
                      "cos_random": [0.1, 0.1, 0.1], "cos_hooked": [0.3, 0.2, math.nan],
                      "cos_sum_hooked": [0.4, 0.5, math.nan]})
    r = AV.verdict_direction(d)  # aligned with the task sum, not with the solution W_pre estimates
    assert r.verdict == "not reproduced" and r.numbers["decided_on"] == "cos_hooked"
    assert r.numbers["n_hooked"] == 2 and r.numbers["median_cos_hooked"] == pytest.approx(0.25)
    assert r.numbers["median_cos_sum"] == pytest.approx(0.95) and "0.95" in r.measured
    # NaN rows (attn.out_proj: no hook) are skipped, not counted as 0
    assert AV.verdict_direction(d.assign(cos_hooked=[0.95, 0.91, math.nan])).verdict == "reproduced"
    assert AV.verdict_direction(d.assign(cos_hooked=[0.6, 0.7, math.nan], cos_sum=[0.1, 0.1, 0.1])).verdict \
        == "partly"
    # every row NaN: the task-vector sum decides, and the reason says so
    r = AV.verdict_direction(d.assign(cos_hooked=math.nan))
    assert r.verdict == "reproduced" and r.numbers["decided_on"] == "cos_sum" and "no hooked" in r.reason


def test_claim_verdicts_at_the_papers_eps_with_the_default_beside():
    from acetools_course.verdicts import World

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
                       "cos_experts": [0.5], "cos_random": [0.1], "ridge_over_prior": [0.2]})
    v = AV.claim_verdicts(gt, st, main, {"s8": 0.0}, world=World("w", "full", {8: 4.0}), n_tasks={"s8": 8},
                          eps=1e-5, beside={"eps": 0.01, "stable": st, "ablation": side})
    assert v["ace.csp"].verdict == "reproduced" and "eps 1e-05, the paper's ViT setting" in v["ace.csp"].reason
    assert v["ace.csp"].numbers["beside"]["verdict"] == "not reproduced"  # -0.1 at the default: a tie
    assert "beside it, the code default eps 0.01" in v["ace.csp"].reason
    assert v["ace.refinement"].verdict == "undecidable here"
