"""Lesson 06, ``acetools_course.lesson06_mergeable_world``: its experiments, figures and claims' verdicts.

Experiments: cards side by side, the room budget, the targets.

Figures: the plots draw what they are given.

Verdicts: the regime targets of notebook 06.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from acetools.regime import RegimeCard  # noqa: E402
from acetools_course import lesson06_mergeable_world as lesson  # noqa: E402

# --------------------------------------------------------------------------- experiments


def fake_card(**values) -> RegimeCard:
    base = {"experts_abs": 80.0, "base_abs": 50.0, "base_norm": 63.0, "ta_norm": 72.0, "ta_lambda": 0.3,
            "tsv_norm": 76.0, "iso_cts_norm": 77.0, "tsv_minus_ta": 4.0, "tsv_gap_share": 37.0,
            "ace_gamma_median": 0.9, "ace_gated_fraction": 73.0, "tau_ratio": 0.08, "wpre_top5_energy": 60.0,
            "cosine_mean": 0.03, "cosine_max": 0.08, "trunc_norm": 99.0, "scaled_norm": 77.0,
            "ta_interference": 5.0, "overlap_topk": 0.37, "overlap_left": 0.26, "overlap_right": 0.48,
            "overlap_random": 0.09, "act_overlap": 0.72, "act_topk_energy": 90.0, "tau_in_act": 0.58,
            "trunc_energy": 87.0, "log_energy_mean": 0.2, "log_energy_sd": 0.3}
    base.update(values)
    clip = {"ta_norm": 76.3, "tsv_norm": 92.6, "tsv_minus_ta": 16.3}
    rows = [{"metric": k, "label": k.replace("_", " "), "value": v, "clip": clip.get(k, math.nan), "clip_note": "",
             "unit": "", "how": ""} for k, v in base.items()]
    return RegimeCard(rows, pd.DataFrame(), pd.DataFrame(), {"n_tasks": 8})


def test_card_table_puts_recipes_side_by_side_with_clip():
    cards = {"first": fake_card(), "gentle": fake_card(tsv_norm=82.0, tsv_minus_ta=5.0)}
    t = lesson.card_table(cards, ["ta_norm", "tsv_norm", "tsv_minus_ta"])
    assert list(t.columns) == ["first", "gentle", "CLIP ViT-B/32"]
    assert t.loc["tsv norm", "gentle"] == 82.0 and t.loc["tsv minus ta", "CLIP ViT-B/32"] == 16.3
    with pytest.raises(KeyError, match="nope"):
        lesson.card_table(cards, ["nope"])
    with pytest.raises(ValueError, match="at least one"):
        lesson.card_table({}, ["ta_norm"])


def test_room_budget_steps_and_costs_add_up():
    b = lesson.room_budget(fake_card())
    ta = b[b.path == "task arithmetic"]
    tsv = b[b.path == "TSV-M"]
    assert ta["normalized"].tolist() == [100.0, 77.0, 72.0]
    assert ta["cost"].iloc[1:].tolist() == pytest.approx([23.0, 5.0])
    assert tsv["normalized"].tolist() == [100.0, 99.0, 76.0]
    assert tsv["cost"].iloc[1:].sum() == pytest.approx(100 - 76.0)


def test_benchmark_summary_reads_result_files_or_says_none(tmp_path):
    from tests.test_results import write_run

    assert lesson.benchmark_summary(tmp_path) is None
    write_run(tmp_path, "tasks8", 0, {"task_arithmetic": (60.0, 75.0, 1.0), "tsv_m": (65.0, 81.0, 2.0)})
    s = lesson.benchmark_summary(tmp_path)
    assert set(s["method"]) == {"task_arithmetic", "tsv_m"} and set(s["suite"]) == {"tasks8"}


def test_load_cards_orders_and_explains_a_missing_folder(tmp_path):
    fake_card().save(tmp_path / "b")
    fake_card(tsv_norm=90.0).save(tmp_path / "a")
    fake_card().save(tmp_path / "c")
    cards = lesson.load_cards(tmp_path, order=["c", "zzz"])
    assert list(cards) == ["c", "a", "b"]
    assert cards["a"].value("tsv_norm") == 90.0
    with pytest.raises(FileNotFoundError, match="recipe_study.py"):
        lesson.load_cards(tmp_path / "none")


# --------------------------------------------------------------------------- figures


def test_merges_vs_clip_draws_three_bars_per_recipe_and_the_room():
    fig, ax = plt.subplots()
    cards = {"first": fake_card(), "wide": fake_card(tsv_minus_ta=12.0)}
    lesson.merges_vs_clip(ax, cards)
    assert len(ax.patches) == 6
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["room 4.0", "room 12.0"]
    assert len(ax.lines) == 2  # CLIP lines for TA and TSV-M (Iso-CTS has no clip value in the fake)
    with pytest.raises(ValueError):
        lesson.merges_vs_clip(ax, {})
    plt.close(fig)


def test_room_budget_and_overlap_plots():
    fig, (a, b) = plt.subplots(1, 2)
    lesson.plot_room_budget(a, lesson.room_budget(fake_card()))
    assert len(a.lines) == 2 and [round(v, 1) for v in a.lines[1].get_ydata()] == [100.0, 99.0, 76.0]
    lesson.subspace_overlap(b, {"first": fake_card()})
    assert [p.get_height() for p in b.patches] == pytest.approx([0.26, 0.48, 0.72, 0.09])
    plt.close(fig)


# --------------------------------------------------------------------------- verdicts


def _target_card(**values):
    rows = [{"metric": m, "label": m, "value": v, "clip": math.nan, "clip_note": "", "unit": "", "how": ""}
            for m, v in {"experts_abs": 80.0, "base_abs": 50.0, "tsv_norm": 86.0, "ta_norm": 75.0, "ta_lambda": 0.3,
                         "ace_gated_fraction": 20.0, **values}.items()]
    timing = {"base": 600.0, "head/a": 5.0, "expert/a": 300.0, "expert/b": 360.0}
    return RegimeCard(rows, pd.DataFrame(), pd.DataFrame(),
                      {"timing": timing, "recipe": {"base_recipe": {"seconds": 7300.0}}})


def test_targets_compare_with_the_issue_thresholds():
    t = lesson.targets(fake_card()).set_index("target")
    room = t.loc["TSV-M − task arithmetic (normalized points)"].set_index("suite")
    assert room.loc["tasks8", "measured"] == pytest.approx(4.0) and not room.loc["tasks8", "passed"]
    assert room.loc["tasks20", "passed"] is None  # needs the benchmark
    assert t.loc["ACE's gate off (γ ≤ τ = 0.3), % of matrices", "measured"] == pytest.approx(27.0)
    good = lesson.targets(fake_card(experts_abs=90.0, base_abs=60.0, tsv_norm=90.0, ta_norm=78.0,
                                    ace_gated_fraction=10.0)).set_index("target")
    assert good.loc[["experts (absolute, %)", "base below the experts (points)", "TSV-M (normalized, %)",
                     "ACE's gate off (γ ≤ τ = 0.3), % of matrices"], "passed"].all()
    assert good.loc["TSV-M − task arithmetic (normalized points)"].set_index("suite").loc["tasks8", "passed"]


def test_targets_from_the_card_alone():
    t = lesson.targets(_target_card()).set_index("target")
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
    t = lesson.targets(_target_card(), pd.DataFrame(rows))
    room = t[t["target"].str.startswith("TSV-M −")].set_index("suite")
    assert room.loc["tasks8", "measured"] == 11.0 and room.loc["tasks8", "passed"]
    assert room.loc["tasks20", "measured"] == 8.0 and room.loc["tasks20", "passed"]
    drop = t[t["target"].str.startswith("task arithmetic on")].iloc[0]
    assert drop["measured"] == 7.0 and drop["passed"]
    lam = t[t["target"].str.startswith("task arithmetic's λ")].set_index("target")["passed"]
    assert list(lam) == [True, False]  # the largest λ over runs is 0.7 > 0.6
    assert t.iloc[0]["source"] == "benchmark, 2 seed(s)" and t.iloc[0]["measured"] == 90.0
