"""acetools_course.power: the rows paired from result files, the ceiling-aware prediction and the power rule
(docs/course.md §Margin, power and rivals), on synthetic data with a known answer."""

import numpy as np
import pandas as pd
import pytest

from acetools.errors import InputError
from acetools.results import find_results, save_correctness
from acetools_course.power import POWER_FACTOR, ceiling_prediction, correctness, has_power, paired_rows
from acetools_course.stats import Z_95


def test_correctness_reads_the_saved_rows_and_says_none_where_they_lack(tmp_path):
    hits = {"ace": {"t": np.array([1, 0, 1], bool), "u": np.array([0, 1], bool)}, "tsv_m": {"t": np.ones(3, bool)}}
    files = {0: save_correctness(tmp_path / "s_seed0_correct.npz", hits),
             1: save_correctness(tmp_path / "s_seed1_correct.npz", hits)}
    got = correctness(files, "ace", ["t"])
    assert got is not None and sorted(got) == [0, 1] and list(got[1]) == ["t"]
    np.testing.assert_array_equal(got[0]["t"], hits["ace"]["t"])
    assert correctness(files, "tsv_m", ["t", "u"]) is None  # a task the row lacks
    assert correctness(files, "wudi") is None  # a row the files lack
    assert correctness({**files, 2: tmp_path / "s_seed2_correct.npz"}, "ace") is None  # an old result: no file


def test_ceiling_prediction_caps_at_the_headroom_and_keeps_the_sign():
    assert ceiling_prediction(2.0, 10.0, 5.0) == pytest.approx(1.0)
    # text8's case: a RoBERTa-sized lead predicted where only 4.5 points are left above TSV-M
    assert ceiling_prediction(11.4, 10.9, 10.9, headroom=4.5) == pytest.approx(4.5)
    assert ceiling_prediction(-3.0, 1.0, 1.0, headroom=2.0) == pytest.approx(-2.0)
    assert ceiling_prediction(2.0, 10.0, -1.0) == 0.0
    with pytest.raises(InputError, match="paper_room"):
        ceiling_prediction(1.0, 0.0, 1.0)


def test_power_needs_twice_the_margin():
    assert POWER_FACTOR == 2.0 and Z_95 == pytest.approx(1.96, abs=1e-3)
    assert has_power(1.0, 0.5) and not has_power(0.99, 0.5) and has_power(-1.2, 0.5)
    # the two cases: predicted 0.56 and 0.548 against a 0.50 margin lack power
    assert not has_power(0.56, 0.5) and not has_power(0.548, 0.5)
    assert not has_power(None, 0.5)
    with pytest.raises(InputError, match="margin"):
        has_power(1.0, float("nan"))


def test_paired_rows_pairs_a_suites_saved_rows_in_normalized_points(tmp_path):
    rng = np.random.default_rng(5)
    tasks, rows = ("t", "u"), []
    hits = {s: {m: {t: rng.random(60) < p for t in tasks} for m, p in (("ace", 0.8), ("tsv_m", 0.7))} for s in (0, 1)}
    for s in (0, 1):
        (tmp_path / f"tasks2_tiny_seed{s}_summary.csv").write_text("method\nace\n")
        save_correctness(tmp_path / f"tasks2_tiny_seed{s}_correct.npz", hits[s])
        rows += [{"suite": "tasks2", "seed": s, "method": "experts (individual)", "task": t, "split": "test",
                  "accuracy": 90.0 - 10 * s} for t in tasks]
    runs = find_results(tmp_path)
    expected = np.mean([np.mean([(hits[s]["ace"][t].mean() - hits[s]["tsv_m"][t].mean()) / (0.9 - 0.1 * s)
                                 for t in tasks]) for s in (0, 1)])
    r = paired_rows(runs, "tasks2", "ace", "tsv_m", per_task=pd.DataFrame(rows), n_boot=200)
    assert r is not None and r.diff == pytest.approx(100 * expected) and r.n_seeds == 2 and r.n_examples == 120
    absolute = paired_rows(runs, "tasks2", "ace", "tsv_m", n_boot=200)
    assert absolute is not None and absolute.diff < r.diff  # experts below 100 % stretch normalized points
    assert paired_rows(runs, "tasks2", "ace", "wudi") is None
    with pytest.raises(InputError, match="experts"):
        paired_rows(runs, "tasks2", "ace", "tsv_m", per_task=pd.DataFrame(rows).assign(suite="other"))
