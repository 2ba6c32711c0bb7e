"""acetools_course.stats: the paired bootstrap on synthetic data with a known answer (docs/course.md §Claim rules)."""

import math

import numpy as np
import pytest

from acetools.errors import InputError
from acetools_course import verdicts as V
from acetools_course.stats import Z_95, paired_bootstrap


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
    # the verdict's margin takes this se (acetools_course.verdicts.margin)
    assert V.margin(noise=0.5, se=r.se) == pytest.approx(max(0.5, Z_95 * r.se))
    assert V.margin(noise=99.0, se=r.se) == 99.0


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


def _seeded_rows(rng, n: int, S: int, seed_sd: float) -> tuple[dict, dict, float]:
    """Two rows on one test set of ``n`` examples at ``S`` seeds: example difficulty z_i shared by the seeds and
    the rows, a seed effect u_s on the difference (sd ``seed_sd`` in probit units), Bernoulli outcomes. The true
    difference (points) over examples and seeds is 100 (Phi(0.7 / k) - Phi(0.6 / k)), k = sqrt(2 + seed_sd^2 / 4)."""
    from scipy.stats import norm

    z, u = rng.standard_normal(n), seed_sd * rng.standard_normal(S)
    a = {s: {"t": rng.random(n) < norm.cdf(0.7 + u[s] / 2 - z)} for s in range(S)}
    b = {s: {"t": rng.random(n) < norm.cdf(0.6 - u[s] / 2 - z)} for s in range(S)}
    k = math.sqrt(2 + seed_sd**2 / 4)
    return a, b, 100 * float(norm.cdf(0.7 / k) - norm.cdf(0.6 / k))


@pytest.mark.parametrize("seed_sd, low, high, dominate", [(0.3, 0.9, 0.99, True), (0.0, 0.93, 1.0, False)],
                         ids=["seeds dominate", "no seed effect"])
def test_three_seeds_the_t_interval_covers_about_95_percent(seed_sd, low, high, dominate):
    """(V.8) with 3 seeds on synthetic rows with a known difference: near 95 % where the seeds dominate (the seed
    standard error twice the test one), wide (never short) where they add nothing; the seed part's t quantile
    at few degrees of freedom is wider than the normal one in every draw."""
    rng, covered, reps, t_wider, ratio = np.random.default_rng(11), 0, 200, 0, []
    for k in range(reps):
        a, b, true = _seeded_rows(rng, 300, 3, seed_sd)
        r = paired_bootstrap(a, b, n_boot=200, seed=k)
        covered += r.low <= true <= r.high
        assert r.n_seeds == 3 and math.isfinite(r.df) and r.df >= 2 and r.se_seed > 0 and r.se_test > 0
        normal = Z_95 * math.hypot(r.se_seed, r.se_test)
        t_wider += r.high - r.diff > normal
        ratio.append(r.se_seed / r.se_test)
    # the case is what its name says: the seeds' standard error about twice the test one (3 seeds estimate it
    # noisily, so the median over draws), or, without a seed effect, not above it
    if dominate:
        assert np.median(ratio) > 1.5, np.median(ratio)
    else:
        assert np.median(ratio) < 1.0, np.median(ratio)
    assert low <= covered / reps <= high
    assert t_wider == reps  # the t quantile at df < inf is always wider than the normal one


def test_one_seed_the_interval_is_the_bootstrap_over_examples():
    rng = np.random.default_rng(4)
    a, b, _ = _seeded_rows(rng, 200, 1, 0.3)
    r = paired_bootstrap(a, b, n_boot=300)
    assert r.se_seed == 0.0 and math.isinf(r.df) and r.se == pytest.approx(r.se_test)
    assert (r.low, r.high) == pytest.approx((r.diff - Z_95 * r.se_test, r.diff + Z_95 * r.se_test))
