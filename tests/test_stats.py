"""acetools.stats: the paired bootstrap on synthetic data with a known answer, the ceiling-aware
prediction and the power rule (docs/course.md §Claim rules)."""

import math

import numpy as np
import pytest

from acetools.errors import InputError
from acetools.stats import (
    POWER_FACTOR,
    Z_95,
    ceiling_prediction,
    correctness,
    has_power,
    paired_bootstrap,
    paired_rows,
)


def _bernoulli(rng, p, n):
    return rng.random(n) < p


def test_one_seed_one_task_matches_the_analytic_paired_standard_error():
    rng = np.random.default_rng(1)
    n, n_boot, (pa, pb) = 400, 4000, (0.8, 0.7)
    a, b = _bernoulli(rng, pa, n), _bernoulli(rng, pb, n)
    r = paired_bootstrap({0: {"t": a}}, {0: {"t": b}}, n_boot=n_boot, seed=0)
    d = 100 * (a.astype(float) - b.astype(float))
    assert r.diff == pytest.approx(d.mean())
    # the bootstrap se estimates d.std(ddof=0) / sqrt(n); its own relative sd is 1 / sqrt(2 (B - 1)):
    # four of those, and the ddof factor, bound the distance
    analytic = d.std(ddof=1) / math.sqrt(n)
    assert r.se == pytest.approx(analytic, rel=4 / math.sqrt(2 * (n_boot - 1)) + 1 / n)
    # independent Bernoulli rows: the known difference is recovered within three standard errors
    true_se = 100 * math.sqrt((pa * (1 - pa) + pb * (1 - pb)) / n)
    assert abs(r.diff - 100 * (pa - pb)) < 3 * true_se
    assert r.low < r.diff < r.high and r.n_seeds == 1 and r.n_examples == n
    assert r.margin(0.5) == pytest.approx(max(0.5, Z_95 * r.se)) and r.margin(99.0) == 99.0


def test_the_interval_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    true, covered, reps = 100 * (0.75 - 0.70), 0, 200
    for k in range(reps):
        # the two methods share most examples' outcome (paired), as merges of one base do
        common = rng.random(300)
        a, b = common < 0.75, common < 0.70
        flip = rng.random(300) < 0.1
        a, b = np.where(flip, rng.random(300) < 0.75, a), np.where(flip, rng.random(300) < 0.70, b)
        r = paired_bootstrap({0: {"t": a}}, {0: {"t": b}}, n_boot=400, seed=k)
        covered += r.low <= true <= r.high
    assert 0.88 <= covered / reps <= 0.995


def test_seed_noise_adds_to_the_standard_error():
    rng = np.random.default_rng(3)
    n, tasks = 200, ("x", "y")
    base = {t: rng.random(n) for t in tasks}
    b = {s: {t: base[t] < 0.6 for t in tasks} for s in range(3)}
    same = {s: {t: base[t] < 0.65 for t in tasks} for s in range(3)}
    shifted = {s: {t: base[t] < 0.65 + 0.08 * (s - 1) for t in tasks} for s in range(3)}
    r_same = paired_bootstrap(same, b, n_boot=2000)
    r_shift = paired_bootstrap(shifted, b, n_boot=2000)
    assert r_same.diff == pytest.approx(r_shift.diff, abs=1.5)
    assert r_shift.se > 1.5 * r_same.se  # the seeds' spread of +-8 points now counts


def test_identical_methods_differ_by_zero_and_the_result_is_deterministic():
    rng = np.random.default_rng(4)
    a = {s: {"t": _bernoulli(rng, 0.7, 50), "u": _bernoulli(rng, 0.5, 30)} for s in (0, 1)}
    r = paired_bootstrap(a, a)
    assert (r.diff, r.se, r.low, r.high) == (0.0, 0.0, 0.0, 0.0)
    b = {s: {t: ~v for t, v in d.items()} for s, d in a.items()}
    assert paired_bootstrap(a, b, seed=7) == paired_bootstrap(a, b, seed=7)


def test_scale_gives_normalized_points():
    a, b = {0: {"t": np.array([1, 1, 1, 0])}}, {0: {"t": np.array([1, 0, 1, 0])}}
    assert paired_bootstrap(a, b, scale={"t": 0.5}).diff == pytest.approx(50.0)
    with pytest.raises(InputError, match="'t'"):
        paired_bootstrap(a, b, scale={"u": 0.5})
    # per seed: each seed's experts normalize that seed's difference (25 / 0.5 and 25 / 0.25)
    a2, b2 = {**a, 1: a[0]}, {**b, 1: b[0]}
    assert paired_bootstrap(a2, b2, scale={0: {"t": 0.5}, 1: {"t": 0.25}}).diff == pytest.approx(75.0)
    with pytest.raises(InputError, match="seed 1"):
        paired_bootstrap(a2, b2, scale={0: {"t": 0.5}})


def test_correctness_reads_the_saved_rows_and_says_none_where_they_lack(tmp_path):
    from acetools.results import save_correctness

    hits = {"ace": {"t": np.array([1, 0, 1], bool), "u": np.array([0, 1], bool)}, "tsv_m": {"t": np.ones(3, bool)}}
    files = {0: save_correctness(tmp_path / "s_seed0_correct.npz", hits),
             1: save_correctness(tmp_path / "s_seed1_correct.npz", hits)}
    got = correctness(files, "ace", ["t"])
    assert got is not None and sorted(got) == [0, 1] and list(got[1]) == ["t"]
    np.testing.assert_array_equal(got[0]["t"], hits["ace"]["t"])
    assert correctness(files, "tsv_m", ["t", "u"]) is None  # a task the row lacks
    assert correctness(files, "wudi") is None  # a row the files lack
    assert correctness({**files, 2: tmp_path / "s_seed2_correct.npz"}, "ace") is None  # an old result: no file


@pytest.mark.parametrize("b, match", [
    ({1: {"t": np.ones(4)}}, "different seeds"),
    ({0: {"u": np.ones(4)}}, "tasks"),
    ({0: {"t": np.ones(5)}}, "shapes"),
])
def test_mismatched_inputs_are_named(b, match):
    with pytest.raises(InputError, match=match):
        paired_bootstrap({0: {"t": np.ones(4)}}, b)


def test_test_sets_must_be_the_same_across_seeds():
    a = {0: {"t": np.ones(4)}, 1: {"t": np.ones(5)}}
    with pytest.raises(InputError, match="fixed across seeds"):
        paired_bootstrap(a, a)


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
    import pandas as pd

    from acetools.results import find_results, save_correctness

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
