"""acetools_course.lesson06_mergeable_world: cards side by side, the room budget, the targets."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from acetools.regime import RegimeCard
from acetools_course import lesson06_mergeable_world as lesson


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


