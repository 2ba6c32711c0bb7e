"""The margin with test noise, power before deciding, the ceiling on a prediction and the rivals
that may judge (docs/course.md §Margin, power and rivals), run on the papers' own tables and on
synthetic result files with a known answer."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest

from acetools.results import find_results, save_correctness
from acetools_course import lesson04_benchmark as BV
from acetools_course import paper_tables as P
from acetools_course import verdicts as V
from acetools_course.paper_tables import table_rivals
from acetools_course.power import paired_rows
from acetools_course.stats import Z_95


def _summary(columns: dict[int, pd.Series], metric: str = "test_acc") -> pd.DataFrame:
    return pd.DataFrame([{"suite": f"tasks{n}", "n_tasks": n, "seed": 0, "method": m, metric: float(v)}
                         for n, col in columns.items() for m, v in col.items()])


def _beats(winner: str, rivals: list[str], columns: dict[int, pd.Series]) -> V.Verdict:
    """``winner`` against ``rivals`` in the paper's own world: its room is the paper's (1 where the column
    has no task arithmetic), so each prediction is the paper's lead."""
    room = {n: float(c["tsv_m"] - c["task_arithmetic"]) if "task_arithmetic" in c else 1.0 for n, c in columns.items()}
    paper = {f"tasks{n}": (float(c[winner] - c[rivals].max()), room[n]) for n, c in columns.items()}
    return BV.assess_beats(_summary(columns), winner, rivals, metric="test_acc", paper=paper,
                           world=V.World("the paper", "full", room))


def test_the_papers_own_tables_pass_the_power_rule():
    # ACE over its table's best rival: +2.0 / +1.5 / +1.6, every lead at least twice the 0.5 floor
    ace_cols = {n: P.comparison_columns("ace", n) for n in (8, 14, 20)}
    ace = _beats("ace", table_rivals("ace", 8, "ace"), ace_cols)
    assert ace.verdict == "reproduced" and [e.decidable for e in ace.effects] == [True, True, True]
    assert [round(e.predicted, 2) for e in ace.effects] == [2.0, 1.5, 1.6]
    # ESM over Iso-CTS on ViT-B/16: +0.7 (below 2 x 0.5: undecidable, a tie the table cannot resolve),
    # +1.0 and +2.5 decided and reproduced
    esm_cols = {n: P.comparison_columns("esm", n) for n in (8, 14, 20)}
    esm = _beats("esm", table_rivals("esm", 8, "esm"), esm_cols)
    assert [e.decidable for e in esm.effects] == [False, True, True] and esm.verdict == "reproduced"
    assert "needs" in esm.reason and "tasks8" in esm.reason
    # ESM on ViT-L/14: +0.1 / +0.3 / +0.3 over Iso-CTS, undecidable everywhere
    l14 = {n: P.paper_column("esm", "ViT-L/14", n) for n in (8, 14, 20)}
    assert _beats("esm", ["tsv_m", "iso_cts"], l14).verdict == "undecidable here"


def test_power_needs_twice_the_margin_and_the_prediction_stops_at_the_ceiling():
    e = V.effect("t8", 1.0, paper=2.0, paper_room=15.1, world_room=4.1)  # predicted 0.54 < 2 x 0.5
    assert not e.decidable and e.predicted == pytest.approx(2.0 * 4.1 / 15.1)
    assert V.effect("t8", 1.0, paper=2.0, paper_room=4.1, world_room=4.1).decidable  # 2.0 >= 1.0
    # text8's case: a RoBERTa-sized lead (+11.4 over TSV-M) where TSV-M leaves 4.5 points to the experts
    c = V.effect("tsv_m", 0.3, paper=11.4, paper_room=10.9, world_room=10.9, headroom=4.5)
    assert c.predicted == pytest.approx(4.5) and c.decidable
    # the floor with a standard error: max(NOISE, 1.96 se)
    s = V.effect("t8", 1.0, paper=2.0, paper_room=4.1, world_room=4.1, se=0.6)
    assert s.floor == pytest.approx(Z_95 * 0.6) and not s.decidable and s.se == 0.6
    # a unit-free prediction (Kendall tau against its chance floor) keeps the plain floor
    assert V.Effect("s", 0.95, None, None, 0.95, 0.9, 0.8).decidable


def test_no_rival_at_or_below_weight_averaging_judges():
    # plain cart on BERT is weight averaging (its name rule misses every block weight)
    col = pd.Series({"weight_averaging": 70.0, "task_arithmetic": 72.0, "cart": 70.0, "tsv_m": 74.0, "ace": 75.0})
    summ = _summary({8: col}, "test_normalized")
    v = BV.assess_beats(summ, "ace", ["weight_averaging", "task_arithmetic", "cart", "tsv_m"])
    judged = {c["b"] for c in v.numbers["comparisons"]}
    assert judged == {"tsv_m"} and v.numbers["left_out"] == {"tasks8": ["cart"]} and "cart" in v.reason
    # a rival row below weight averaging, the best of the rivals left: it never judges, the suite is not judged
    low = _summary({8: pd.Series({"weight_averaging": 70.0, "iso_cts": 69.0, "esm": 60.0})}, "test_normalized")
    with pytest.raises(ValueError, match="weight averaging"):
        BV.assess_beats(low, "esm", ["iso_cts"])
    for rows in (v.numbers["comparisons"],):
        for r in rows:
            mean_b = summ.set_index("method").loc[r["b"], "test_normalized"]
            assert mean_b > summ.set_index("method").loc["weight_averaging", "test_normalized"]


def _files(tmp_path, n: int, p: dict[str, float], seeds=(0, 1, 2)) -> pd.DataFrame:
    """Result files of suite tasks2 with per-example correctness: the rows share most outcomes (one base)."""
    rng = np.random.default_rng(0)
    rows, per_task = [], []
    common = {t: rng.random(n) for t in ("t", "u")}  # one test set, the same outcomes for every seed
    for s in seeds:
        hits = {m: {t: common[t] < q for t in common} for m, q in p.items()}
        for m in p:
            acc = 100 * np.mean([hits[m][t].mean() for t in common])
            rows.append({"suite": "tasks2", "n_tasks": 2, "seed": s, "method": m, "test_normalized": acc})
        rows.append({"suite": "tasks2", "n_tasks": 2, "seed": s, "method": "experts (individual)",
                     "test_normalized": 100.0})
        per_task += [{"suite": "tasks2", "seed": s, "method": "experts (individual)", "task": t, "split": "test",
                      "accuracy": 100.0, "normalized": 100.0} for t in common]
        (tmp_path / f"tasks2_tiny_seed{s}_summary.csv").write_text("method\n")
        save_correctness(tmp_path / f"tasks2_tiny_seed{s}_correct.npz", hits)
    pd.DataFrame(per_task).to_csv(tmp_path / "per_task.csv", index=False)
    return pd.DataFrame(rows)


def test_the_margin_takes_the_test_noise_and_the_record_carries_it(tmp_path):
    # the same test set for every seed: the seeds agree, but 80 examples per task leave ~3 points of noise
    summ = _files(tmp_path, 80, {"ace": 0.74, "tsv_m": 0.70, "weight_averaging": 0.6})
    runs = find_results(tmp_path)
    pairs = functools.partial(paired_rows, runs, per_task=pd.read_csv(tmp_path / "per_task.csv"))
    seeds_only = BV.paired_difference(summ, "tasks2", "ace", "tsv_m")
    paired = BV.paired_difference(summ, "tasks2", "ace", "tsv_m", pairs=pairs)
    assert seeds_only["margin_source"] == "seeds" and seeds_only["se"] is None
    assert seeds_only["margin"] == 0.5  # the seeds' spread is zero: the old rule calls +4 a gain
    assert paired["margin_source"] == "paired bootstrap" and paired["se"] > 0
    assert paired["margin"] == pytest.approx(Z_95 * paired["se"]) and paired["margin"] > 1.0
    lo, hi = paired["interval"]
    assert lo < paired["diff"] < hi
    v = BV.assess_beats(summ, "ace", ["weight_averaging", "tsv_m"], pairs=pairs)
    rec = v.record_fields()
    assert rec["standard_error"] == pytest.approx(paired["se"]) and "bootstrap" in rec["margin_rule"]
    assert v.numbers["comparisons"][0]["interval"] == [lo, hi]
    old = BV.assess_beats(summ, "ace", ["weight_averaging", "tsv_m"]).record_fields()
    assert old["standard_error"] is None and "no per-example results" in old["margin_rule"]


def test_the_language_claim_leaves_out_rivals_below_weight_averaging_and_caps_its_prediction():
    from acetools_course import lesson07_language as LV

    def per_seed(values: dict[str, float]) -> pd.DataFrame:
        return pd.DataFrame([{"suite": "text8", "seed": s, "method": m, "test_normalized": v + 0.1 * s}
                             for s in (0, 1, 2) for m, v in values.items()])

    # WUDI at its default step size below weight averaging: it does not judge the claim
    v = LV.verdict_sota(per_seed({"ace (eps 2e-4)": 80.0, "weight_averaging": 75.0, "wudi": 74.0, "ties": 76.0,
                                  "tsv_m": 78.0}))
    assert set(v.numbers["diffs"]) == {"ties", "tsv_m"} and v.numbers["left_out"] == ["wudi"] and "wudi" in v.reason
    # text8's case: RoBERTa's +11.4 over TSV-M at RoBERTa's room, where TSV-M leaves 4.5 points
    w = V.World("text", "full", {8: 10.9})
    c = LV.verdict_sota(per_seed({"ace (eps 2e-4)": 96.0, "wudi": 90.0, "ties": 80.0, "tsv_m": 95.5}), world=w)
    assert {e.setting: e.predicted for e in c.effects}["tsv_m"] == pytest.approx(4.5 - 0.1)  # 100 - 95.6


def test_wudi_with_its_step_size_on_validation_is_the_rival_where_the_files_have_it():
    from acetools_course import lesson07_language as LV
    from tests.test_results import summary_rows

    scores = {"ace": 80.0, "wudi": 70.0, BV.TUNED_WUDI_ROW: 82.0}
    sec = {("text8", m): t for m, t in (("ace", 1.0), ("wudi", 10.0), (BV.TUNED_WUDI_ROW, 30.0))}
    summ = summary_rows({("text8", 8): {m: [v + 0.1 * s for s in (0, 1, 2)] for m, v in scores.items()}}, seconds=sec)
    # WUDI at its default step size is 10 points behind; with its step size on validation it leads by 2
    assert BV.assess_vs_wudi(summ).numbers["criteria"]["not worse"] is False
    assert BV.assess_vs_wudi(summ, rival="wudi").numbers["criteria"]["not worse"] is True
    per_seed = summ.assign(method=summ["method"].replace({"ace": "ace (eps 2e-4)"}))
    per_seed = pd.concat([per_seed, per_seed[per_seed["method"] == "wudi"].assign(method="tsv_m")])
    v = LV.verdict_sota(per_seed, rivals=("wudi", "tsv_m"))
    assert set(v.numbers["diffs"]) == {BV.TUNED_WUDI_ROW, "tsv_m"} and v.verdict == "partly"


def test_wudi_at_or_below_weight_averaging_judges_no_accuracy():
    from tests.test_results import summary_rows

    sec = {(s, m): t for s in ("t8", "t20") for m, t in (("ace", 1.0), ("wudi", 10.0), ("weight_averaging", 0.1))}
    summ = summary_rows({("t8", 8): {"ace": [80, 80], "wudi": [79, 79], "weight_averaging": [70, 70]},
                         ("t20", 20): {"ace": [60, 60], "wudi": [50, 50], "weight_averaging": [65, 65]}}, seconds=sec)
    v = BV.assess_vs_wudi(summ)
    assert [r["competes"] for r in v.numbers["rows"]] == [True, False] and "t20" in v.reason
    assert v.numbers["criteria"]["not worse"] is True and v.verdict == "reproduced"
    below = summ[summ["suite"] == "t20"]
    assert "not worse" not in BV.assess_vs_wudi(below).numbers["criteria"]


def test_vs_wudi_takes_the_tuned_row_per_suite_and_pairs_by_example():
    from acetools_course.stats import PairedDifference
    from tests.test_results import summary_rows

    sec = {(s, m): t for s in ("t8", "t20") for m, t in (("ace", 1.0), ("wudi", 10.0), (BV.TUNED_WUDI_ROW, 30.0),
                                                          ("weight_averaging", 0.1))}
    summ = summary_rows({("t8", 8): {"ace": [80, 80], "wudi": [70, 70], BV.TUNED_WUDI_ROW: [79, 79],
                                     "weight_averaging": [60, 60]},
                         ("t20", 20): {"ace": [60, 60], "wudi": [55, 55], "weight_averaging": [50, 50]}}, seconds=sec)
    calls = []

    def pairs(suite, a, b):  # a paired bootstrap's answer: se 1 point
        calls.append((suite, a, b))
        return PairedDifference(1.0, 1.0, -1.0, 3.0, 0.95, 2, 100, 2000)

    v = BV.assess_vs_wudi(summ, pairs=pairs)
    rows = {r["suite"]: r for r in v.numbers["rows"]}
    # t8 has WUDI with its step size on validation, t20 only the default: each suite its own rival
    assert rows["t8"]["rival"] == BV.TUNED_WUDI_ROW and rows["t20"]["rival"] == "wudi"
    assert calls == [("t8", "ace", BV.TUNED_WUDI_ROW), ("t20", "ace", "wudi")]
    # the margin is 1.96 se: +1 point over tuned WUDI is a tie, not a lead
    assert rows["t8"]["margin"] == pytest.approx(1.959964) and rows["t8"]["outcome"] == "tie"
    assert {e.setting: e.se for e in v.effects} == {"t8": 1.0, "t20": 1.0}


def test_stage_results_round_trip_and_give_the_tables_difference(tmp_path):
    """A stage ablation's per-example results (lessons 02, 03, 07 in the full profile) are saved and read back
    bit for bit, and the difference they give is the one its table's normalized accuracies give, with the
    paired standard error of acetools_course.power.paired_se."""
    import pandas as pd

    from acetools_course import power

    rng = np.random.default_rng(0)
    experts = {"a": 0.8, "b": 0.5}
    hits = {s: {t: rng.random(200) < p for t, p in (("a", 0.7 + d), ("b", 0.4 + d))}
            for s, d in (("on", 0.05), ("off", 0.0))}
    table = pd.DataFrame([{"eps": 2e-4, "setting": s, "correct": h,
                           "test_normalized": 100 * np.mean([h[t].mean() / experts[t] for t in h])}
                          for s, h in hits.items()])
    rows = power.stage_hits(table, ("eps", "setting"))
    assert sorted(rows) == ["eps 0.0002|off", "eps 0.0002|on"]
    power.save_stage_results(tmp_path, "stage_ablation", rows, experts=experts)
    got = power.load_stage_results(tmp_path, "stage_ablation")
    assert got is not None and got[1] == experts
    for k in rows:
        for t in rows[k]:
            np.testing.assert_array_equal(got[0][k][t], rows[k][t])
    d, se = power.stage_difference(got[0], got[1], "eps 0.0002|on", "eps 0.0002|off")
    assert d == pytest.approx(table["test_normalized"].iloc[0] - table["test_normalized"].iloc[1])
    assert se == pytest.approx(power.paired_se(hits["on"], hits["off"], experts))
    per_task = pd.DataFrame([{"suite": "s8", "variant": v, "task": t, "correct": c} for v, h in hits.items()
                             for t, c in h.items()])  # lesson 02's per-task rows
    assert sorted(power.stage_hits(per_task)) == ["s8|off", "s8|on"]
    assert power.load_stage_results(tmp_path, "nothing") is None
    with pytest.raises(ValueError, match="no row"):
        power.save_stage_results(tmp_path, "x", {})
