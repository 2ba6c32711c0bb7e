"""Coefficient search: grids, golden section, normalized accuracy, ESM's rule, early stopping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from acetools.errors import InputError
from acetools.search import (
    ALPHA_GRID,
    ESM_BRACKET,
    LAMBDA_GRID,
    climb_search,
    esm_search,
    golden_section_search,
    grid_search,
)

REF = {"a": 0.8, "b": 0.5}


def peaked(center_a, center_b, width=1.0):
    """Two tasks with accuracies peaking at different alphas; records the calls."""
    calls = []

    def score(alpha):
        calls.append(alpha)
        return {"a": 0.8 * math.exp(-((alpha - center_a) / width) ** 2),
                "b": 0.5 * math.exp(-((alpha - center_b) / width) ** 2)}

    score.calls = calls
    return score


def test_standard_grids():
    assert len(LAMBDA_GRID) == 30 and LAMBDA_GRID[0] == pytest.approx(1 / 30) and LAMBDA_GRID[-1] == 1.0
    assert len(ALPHA_GRID) == 30 and ALPHA_GRID[0] == pytest.approx(0.1) and ALPHA_GRID[-1] == 3.0
    assert np.allclose(ALPHA_GRID, np.arange(1, 31) / 10)
    assert ESM_BRACKET == (0.0, 2.0)


def test_grid_trace_is_complete_and_normalized_accuracy_right():
    score = peaked(0.4, 0.6)
    res = grid_search(score, LAMBDA_GRID, reference=REF)
    assert res.alphas == list(LAMBDA_GRID) and score.calls == list(LAMBDA_GRID)
    for e in res.trace:
        raw = {"a": 0.8 * math.exp(-((e.alpha - 0.4)) ** 2), "b": 0.5 * math.exp(-((e.alpha - 0.6)) ** 2)}
        assert e.normalized == pytest.approx({t: raw[t] / REF[t] for t in raw})
        assert e.avg_normalized == pytest.approx((raw["a"] / 0.8 + raw["b"] / 0.5) / 2)
        assert e.avg_absolute == pytest.approx((raw["a"] + raw["b"]) / 2)
    best = max(res.trace, key=lambda e: e.avg_normalized)
    assert res.best == best.alpha and res.best_score == best.avg_normalized
    assert res.best == pytest.approx(0.5, abs=1 / 30)  # normalized objective is symmetric around 0.5
    df = res.to_frame()
    assert len(df) == 30 and list(df["alpha"]) == list(LAMBDA_GRID)
    assert {"a:top1", "b:normalized_top1", "avg_top1", "avg_normalized_top1"} <= set(df.columns)
    assert df["is_best"].sum() == 1 and float(df.loc[df["is_best"], "alpha"].iloc[0]) == res.best
    assert df["b:normalized_top1"].iloc[3] == pytest.approx(df["b:top1"].iloc[3] / 0.5)


def test_objectives_can_disagree():
    # task a dominates the absolute average, the normalized average weighs the weaker task b up
    ref = {"a": 0.9, "b": 0.4}

    def score(alpha):
        return {"a": 0.9 - 0.3 * alpha, "b": 0.1 + 0.2 * alpha}

    abs_res = grid_search(score, [0.0, 1.0], reference=ref, objective="absolute")
    norm_res = grid_search(score, [0.0, 1.0], reference=ref)
    assert abs_res.best == 0.0 and abs_res.best_score == pytest.approx(0.5)  # vs 0.45 at alpha = 1
    assert norm_res.best == 1.0 and norm_res.best_score == pytest.approx((0.6 / 0.9 + 0.3 / 0.4) / 2)


def test_first_maximum_wins():
    res = grid_search(lambda a: {"t": 0.5}, [0.3, 0.1, 0.2], objective="absolute")
    assert res.best == 0.3


def test_grid_early_stopping_on_absolute_accuracy():
    # absolute average rises to alpha = 0.4 then falls; patience 3 stops after 0.7
    score = peaked(0.4, 0.4, width=0.3)
    grid = [round(0.1 * i, 1) for i in range(1, 11)]
    res = grid_search(score, grid, reference=REF, patience=3, short=0)
    assert score.calls == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    assert res.stopped_early and res.best == 0.4
    full = grid_search(peaked(0.4, 0.4, width=0.3), grid, reference=REF)
    assert len(full.trace) == 10 and not full.stopped_early
    # a short grid (<= SHORT_GRID coefficients) is searched whole, whatever the patience
    short = grid_search(peaked(0.4, 0.4, width=0.3), grid, reference=REF, patience=3)
    assert len(short.trace) == 10 and not short.stopped_early
    with pytest.raises(ValueError, match="short"):
        grid_search(score, grid, reference=REF, patience=3, short=-1)


def test_patience_counts_only_after_the_curve_has_risen():
    """TIES on the mini-world: flat at the base for small lambda, then a rise. The Iso rule (patience
    from the first coefficient) stops at the grid minimum and scores the base; ours finds the rise."""
    from acetools.search import LAMBDA_GRID, PATIENCE

    calls = []

    def ties_like(lam):
        calls.append(lam)
        v = 0.70 if lam < 0.3 else 0.70 + 0.2 - abs(lam - 0.5)  # flat 0.70 up to 0.3, peak 0.90 at 0.5
        return {"t": v}

    res = grid_search(ties_like, LAMBDA_GRID, objective="absolute", patience=PATIENCE)
    assert res.best == pytest.approx(0.5) and res.best != LAMBDA_GRID[0]
    assert res.stopped_early and max(calls) < 0.7  # and still stops PATIENCE steps after the peak
    assert PATIENCE == 3
    # a curve that never rises above its start is searched whole (no early stop at the minimum)
    never = grid_search(lambda a: {"t": 0.5 - a}, LAMBDA_GRID, objective="absolute", patience=PATIENCE)
    assert len(never.trace) == len(LAMBDA_GRID) and never.best == LAMBDA_GRID[0] and not never.stopped_early


def test_golden_section_finds_unimodal_maximum_within_tol():
    for x_star in (0.0731, 0.7317, 1.5, 1.97):
        calls = []

        def score(alpha, x_star=x_star, calls=calls):
            calls.append(alpha)
            return {"t": 1.0 - (alpha - x_star) ** 2}

        res = golden_section_search(score, 0.0, 2.0, objective="absolute")
        assert abs(res.best - x_star) < 0.01
        assert len(calls) == len(set(calls)) == len(res.trace) <= 17
    # the bracket shrinks by the golden ratio per step: 2 g^n < 0.01 needs n = 12 steps, 14 evaluations
    assert len(res.trace) == 14


def test_golden_section_respects_max_iter_and_tol():
    res = golden_section_search(lambda a: {"t": -abs(a - 0.3)}, 0.0, 1.0, objective="absolute", max_iter=3)
    assert len(res.trace) == 5
    coarse = golden_section_search(lambda a: {"t": -abs(a - 0.3)}, 0.0, 1.0, objective="absolute", tol=0.5)
    assert len(coarse.trace) == 4  # widths 1, 0.618, 0.382 < 0.5: two steps after the two interior points
    g = (math.sqrt(5) - 1) / 2
    assert res.alphas[:2] == pytest.approx([1 - g, g])


def test_esm_rule_searches_absolute_and_selects_normalized():
    # absolute average peaks near 0.63 (task a, large accuracies); normalized favours b's peak at 1.4
    def score(alpha):
        return {"a": 0.9 - 0.5 * (alpha - 0.6) ** 2, "b": 0.05 + 0.04 * math.exp(-((alpha - 1.4) / 0.6) ** 2)}

    ref = {"a": 0.95, "b": 0.1}
    res = esm_search(score, ref)
    assert res.objective == "absolute" and res.select == "normalized" and res.method == "golden_section"
    plain = golden_section_search(score, *ESM_BRACKET, reference=ref, objective="absolute")
    assert res.alphas == plain.alphas  # same evaluations: the search is driven by absolute accuracy
    fine = np.linspace(0, 2, 20001)
    x_abs = fine[np.argmax([np.mean(list(score(a).values())) for a in fine])]
    assert abs(plain.best - x_abs) < 0.01
    best_norm = max(res.trace, key=lambda e: e.avg_normalized)
    assert res.best == best_norm.alpha and res.best != plain.best
    assert res.best_score == best_norm.avg_normalized


def test_bad_inputs():
    with pytest.raises(ValueError, match="needs reference"):
        grid_search(lambda a: {"t": 1.0}, [0.1])
    with pytest.raises(ValueError, match="grid is empty"):
        grid_search(lambda a: {"t": 1.0}, [], objective="absolute")
    with pytest.raises(TypeError, match="dict task -> accuracy"):
        grid_search(lambda a: 0.5, [0.1], objective="absolute")
    with pytest.raises(ValueError, match="task 't'"):
        grid_search(lambda a: {"t": float("nan")}, [0.1], objective="absolute")
    with pytest.raises(KeyError, match="'b'"):
        grid_search(lambda a: {"a": 0.5, "b": 0.4}, [0.1], reference={"a": 0.9})
    with pytest.raises(ValueError, match="reference\\['a'\\]"):
        grid_search(lambda a: {"a": 0.5}, [0.1], reference={"a": 0.0})
    with pytest.raises(ValueError, match="different set of tasks"):
        grid_search(lambda a: {"a": 0.5} if a < 0.5 else {"b": 0.5}, [0.1, 0.9], objective="absolute")
    with pytest.raises(ValueError, match="patience"):
        grid_search(lambda a: {"t": 1.0}, [0.1], objective="absolute", patience=0)
    with pytest.raises(ValueError, match="lo < hi"):
        golden_section_search(lambda a: {"t": 1.0}, 1.0, 0.0, objective="absolute")
    with pytest.raises(ValueError, match="select"):
        golden_section_search(lambda a: {"t": 1.0}, 0.0, 1.0, objective="absolute", select="normalized")


def test_climb_search_walks_to_the_peak_and_stops():
    calls = []

    def score(alpha, peak=0.45):
        calls.append(alpha)
        v = 0.9 - (np.log(alpha) - np.log(peak)) ** 2  # unimodal in log alpha
        return {"a": v, "b": v / 2}

    grid = [0.1, 0.2, 0.3, 0.45, 0.65, 0.9, 1.25, 1.75, 2.5]
    res = climb_search(score, grid, reference={"a": 1.0, "b": 0.5})
    assert res.best == 0.45 and res.method == "climb"
    assert calls == [0.9, 0.65, 1.25, 0.45, 0.3]  # start, neighbours, walk down, one step past the peak
    assert res.best_evaluation.avg_normalized == pytest.approx(0.9)
    calls.clear()
    res = climb_search(lambda a: score(a, peak=5.0), grid, reference={"a": 1.0, "b": 0.5})
    assert res.best == 2.5 and calls == [0.9, 0.65, 1.25, 1.75, 2.5]  # stops at the grid's end
    calls.clear()
    res = climb_search(lambda a: score(a, peak=0.9), grid, reference={"a": 1.0, "b": 0.5}, patience=2)
    assert res.best == 0.9 and calls == [0.9, 0.65, 1.25]  # a local maximum at the start: no walk
    with pytest.raises(ValueError):
        climb_search(score, [], reference={"a": 1.0})
    with pytest.raises(ValueError, match="patience"):
        climb_search(score, grid, reference={"a": 1.0, "b": 0.5}, patience=0)
    with pytest.raises(ValueError, match="normalized"):
        climb_search(score, grid)  # the normalized objective needs a reference


def test_replay_at_a_smaller_patience_is_the_fresh_search_at_that_patience():
    """benchmarks/patience_replay.py's replay_grid_search on a patience-5 record equals grid_search run afresh
    at 3 and at 5 (a noisy curve that dips, rises again and falls, so patience 3 and 5 stop at different places)."""
    from tests.conftest import load_script

    replay_grid_search = load_script("patience_replay").replay_grid_search
    rng = np.random.default_rng(0)
    grid = [round(0.1 * i, 10) for i in range(1, 31)]
    curve = {a: 0.5 + 0.3 * np.sin(a) - 0.2 * (a > 1.2) * (a < 1.6) + 0.02 * rng.standard_normal() for a in grid}
    reference = {"a": 0.9, "b": 0.8}

    def score(a):
        return {"a": curve[a], "b": curve[a] - 0.05}

    for first, again in [(5, 3), (None, 3), (None, 1), (5, 5)]:
        rec = grid_search(score, grid, reference=reference, patience=first)
        rows = rec.to_frame().to_dict(orient="records")
        replay = replay_grid_search(rows, grid, reference=reference, patience=again)
        fresh = grid_search(score, grid, reference=reference, patience=again)
        assert (replay.best, replay.alphas, replay.stopped_early) == (fresh.best, fresh.alphas, fresh.stopped_early)
    p3, p5 = (grid_search(score, grid, reference=reference, patience=p) for p in (3, 5))
    assert len(p3.alphas) < len(p5.alphas)  # the two patiences really stop apart here


def test_replay_refuses_a_coefficient_the_record_never_evaluated():
    from tests.conftest import load_script

    replay_grid_search = load_script("patience_replay").replay_grid_search

    grid = [0.1 * i for i in range(1, 21)]

    def score(a):  # rises to 0.5, then falls: patience 1 stops right after the peak
        return {"a": 1.0 - abs(a - 0.5)}

    rows = grid_search(score, grid, patience=1, objective="absolute").to_frame().to_dict(orient="records")
    with pytest.raises(InputError, match=r"needs alpha=0\.7.*rerun the search"):
        replay_grid_search(rows, grid, patience=3, objective="absolute")
    with pytest.raises(InputError, match="no 'alpha'"):
        replay_grid_search([{"a:top1": 0.5}], grid, patience=3, objective="absolute")
