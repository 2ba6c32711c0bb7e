"""acetools_course.lesson06_mergeable_world: the regime targets of notebook 06."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from acetools.regime import RegimeCard
from acetools_course import lesson06_mergeable_world as MV
from tests.course.test_mergeable_world import fake_card


def _target_card(**values):
    rows = [{"metric": m, "label": m, "value": v, "clip": math.nan, "clip_note": "", "unit": "", "how": ""}
            for m, v in {"experts_abs": 80.0, "base_abs": 50.0, "tsv_norm": 86.0, "ta_norm": 75.0, "ta_lambda": 0.3,
                         "ace_gated_fraction": 20.0, **values}.items()]
    timing = {"base": 600.0, "head/a": 5.0, "expert/a": 300.0, "expert/b": 360.0}
    return RegimeCard(rows, pd.DataFrame(), pd.DataFrame(),
                      {"timing": timing, "recipe": {"base_recipe": {"seconds": 7300.0}}})


def test_targets_compare_with_the_issue_thresholds():
    t = MV.targets(fake_card()).set_index("target")
    room = t.loc["TSV-M − task arithmetic (normalized points)"].set_index("suite")
    assert room.loc["tasks8", "measured"] == pytest.approx(4.0) and not room.loc["tasks8", "passed"]
    assert room.loc["tasks20", "passed"] is None  # needs the benchmark
    assert t.loc["ACE's gate off (γ ≤ τ = 0.3), % of matrices", "measured"] == pytest.approx(27.0)
    good = MV.targets(fake_card(experts_abs=90.0, base_abs=60.0, tsv_norm=90.0, ta_norm=78.0,
                                    ace_gated_fraction=10.0)).set_index("target")
    assert good.loc[["experts (absolute, %)", "base below the experts (points)", "TSV-M (normalized, %)",
                     "ACE's gate off (γ ≤ τ = 0.3), % of matrices"], "passed"].all()
    assert good.loc["TSV-M − task arithmetic (normalized points)"].set_index("suite").loc["tasks8", "passed"]


def test_targets_from_the_card_alone():
    t = MV.targets(_target_card()).set_index("target")
    assert t.loc["experts (absolute, %)", "measured"] == 80.0 and not t.loc["experts (absolute, %)", "passed"]
    assert t.loc["base below the experts (points)", "passed"]  # 30 >= 20
    assert t.loc["TSV-M (normalized, %)", "passed"]  # 86 >= 85
    room = t.loc["TSV-M − task arithmetic (normalized points)"]
    assert list(room["suite"]) == ["tasks8", "tasks20"] and list(room["measured"])[0] == 11.0
    assert list(room["passed"]) == [True, None]  # tasks20 needs the benchmark
    assert t.loc["ACE's gate off (γ ≤ τ = 0.3), % of matrices", "measured"] == 80.0
    assert t.loc["building a tasks8 expert set (min, as recorded)", "measured"] == 11.0  # (300 + 360) / 60
    assert not t.loc["pretraining the base once (h, as recorded)", "passed"]  # 7300 s > 2 h
    assert (t["source"].iloc[:3] == "regime card").all()


def test_targets_take_accuracies_from_the_benchmark_over_seeds():
    rows = []
    for suite, n, ta, tsv, lams in (("tasks8", 8, (70.0, 72.0), (81.0, 83.0), (0.3, 0.4)),
                                    ("tasks20", 20, (64.0, 64.0), (71.0, 73.0), (0.2, 0.7))):
        for seed in (0, 1):
            for m, v, coef in (("experts (individual)", 90.0, math.nan), ("base (frozen heads)", 60.0, math.nan),
                               ("task_arithmetic", ta[seed], lams[seed]), ("tsv_m", tsv[seed], 1.0)):
                rows.append({"suite": suite, "n_tasks": n, "seed": seed, "method": m,
                             "kind": "method" if "(" not in m else "reference", "coef": coef,
                             "test_acc": v, "test_normalized": v})
    t = MV.targets(_target_card(), pd.DataFrame(rows))
    room = t[t["target"].str.startswith("TSV-M −")].set_index("suite")
    assert room.loc["tasks8", "measured"] == 11.0 and room.loc["tasks8", "passed"]
    assert room.loc["tasks20", "measured"] == 8.0 and room.loc["tasks20", "passed"]
    drop = t[t["target"].str.startswith("task arithmetic on")].iloc[0]
    assert drop["measured"] == 7.0 and drop["passed"]
    lam = t[t["target"].str.startswith("task arithmetic's λ")].set_index("target")["passed"]
    assert list(lam) == [True, False]  # the largest λ over runs is 0.7 > 0.6
    assert t.iloc[0]["source"] == "benchmark, 2 seed(s)" and t.iloc[0]["measured"] == 90.0
