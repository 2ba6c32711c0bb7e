"""acetools_course.lesson04_benchmark: the pure plots draw what they are given; the explorers redraw."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from acetools import results  # noqa: E402
from acetools_course import lesson04_benchmark as bplot  # noqa: E402


@pytest.fixture
def agg():
    rows = []
    for suite, n in (("t8", 8), ("t14", 14)):
        for seed in (0, 1):
            for m, v in (("base (frozen heads)", 50), ("ace", 90 - n / 2), ("tsv_m", 85 - n / 2), ("ta", 70 - n)):
                rows.append({"suite": suite, "n_tasks": n, "seed": seed, "method": m,
                             "kind": "reference" if m.startswith("base") else "method", "coef": np.nan,
                             "test_acc": v + seed, "test_normalized": v + 2 * seed, "val_normalized": v,
                             "merge_seconds": 0.1 * n if m != "ta" else 0.01})
    return results.aggregate(pd.DataFrame(rows))


@pytest.fixture
def traces():
    rows = []
    for a in (0.1, 0.2, 0.3, 0.4):
        for t, off in (("mean", 0.0), ("x", -5.0), ("y", 5.0)):
            rows.append({"method": "ta", "coef_name": "lam", "alpha": a, "step": 0, "is_best": a == 0.3,
                         "task": t, "accuracy": 50 + 100 * a + off, "normalized": 60 + 100 * a + off})
    return pd.DataFrame(rows)


@pytest.fixture
def scores():
    return pd.DataFrame({"method": ["ace", "tsv_m", "ace", "tsv_m"], "task": ["x", "x", "y", "y"],
                         "mean": [90.0, 80.0, 70.0, 60.0], "sd": [1.0, np.nan, 2.0, 3.0]})


def _heights(ax):
    return [p.get_height() for p in ax.patches]


def test_method_bars_heights_and_errors(agg):
    fig, ax = plt.subplots()
    bplot.method_bars(ax, agg, "t8")
    assert _heights(ax) == pytest.approx([51.0, 87.0, 82.0, 63.0])  # means over seeds (+2 at seed 1)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["base (frozen heads)", "ace", "tsv_m", "ta"]
    assert "2 seed(s)" in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["51.0", "87.0", "82.0", "63.0"]  # values on the bars
    fig2, ax2 = plt.subplots()
    bplot.method_bars(ax2, agg, "t8", references=False)
    assert len(ax2.patches) == 3
    with pytest.raises(ValueError):
        bplot.method_bars(ax2, agg, "t99")
    plt.close("all")


def test_accuracy_vs_tasks_and_merge_time(agg):
    fig, ax = plt.subplots()
    bplot.accuracy_vs_tasks(ax, agg)
    lines = {c.get_label(): c.lines[0] for c in ax.containers}  # one errorbar container per method
    assert set(lines) == {"ace", "tsv_m", "ta"}  # references left out
    assert list(lines["ace"].get_xdata()) == [8, 14] and list(lines["ace"].get_ydata()) == pytest.approx([87.0, 84.0])
    assert ax.get_legend() is not None
    fig, ax = plt.subplots()
    bplot.accuracy_vs_tasks(ax, agg, legend=False)  # left panel of a row: no legend over the next panel's label
    assert ax.get_legend() is None
    fig, ax = plt.subplots()
    bplot.merge_time(ax, agg, methods=["ace"])
    assert ax.get_yscale() == "log"
    assert [c.get_label() for c in ax.containers] == ["ace"]
    assert not [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]  # no inputs_seconds: no capture line
    plt.close("all")


def test_merge_time_draws_the_capture_apart(agg):
    a = agg.assign(method=agg["method"].replace({"tsv_m": "esm"}),
                   inputs_seconds=np.where(agg["method"] == "tsv_m", 5.0, 1e-6))  # others: the harness's microseconds
    fig, ax = plt.subplots()
    bplot.merge_time(ax, a)
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert [ln.get_label() for ln in dashed] == ["esm: data capture (apart)"]
    assert list(dashed[0].get_ydata()) == [5.0, 5.0] and "capture" in ax.get_title()
    plt.close("all")


def test_per_task_heatmap_and_rank_scatter():
    fig, ax = plt.subplots()
    mat = pd.DataFrame([[90.0, 80.0], [70.0, 60.0]], index=["ace", "ta"], columns=["x", "y"])
    bplot.per_task_heatmap(ax, mat, title="T")
    assert ax.get_title() == "T" and [t.get_text() for t in ax.get_xticklabels()] == ["x", "y"]
    fig, ax = plt.subplots()
    bplot.rank_scatter(ax, pd.Series({"a": 1.0, "b": 2.0, "c": 3.0}), pd.Series({"a": 10.0, "b": 20.0, "z": 5.0}),
                       tau=1.0, title="s")
    offsets = ax.collections[0].get_offsets()
    assert np.asarray(offsets).tolist() == [[10.0, 1.0], [20.0, 2.0]]  # common methods only
    assert "τ = 1.00" in ax.get_title() and {t.get_text() for t in ax.texts} == {"a", "b"}
    with pytest.raises(ValueError):
        bplot.rank_scatter(ax, pd.Series({"a": 1.0}), pd.Series({"b": 1.0}))
    plt.close("all")


def test_sweep_at_marks_alpha(traces):
    fig, ax = plt.subplots()
    bplot.sweep_at(ax, traces, 0.2, method="ta")
    vlines = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [0.2, 0.2]]
    assert len(vlines) == 1
    assert "lam = 0.2" in ax.get_title() and "80.0 %" in ax.get_title()
    with pytest.raises(ValueError):
        bplot.sweep_at(ax, traces, 0.2, method="nope")
    plt.close("all")


def test_task_bars_and_verdict_counts(scores):
    fig, ax = plt.subplots()
    bplot.task_bars(ax, scores, "y")
    assert _heights(ax) == [70.0, 60.0] and ax.get_title() == "task: y"
    with pytest.raises(ValueError, match="unknown task"):
        bplot.task_bars(ax, scores, "z")
    fig, ax = plt.subplots()
    table = pd.DataFrame({"paper": ["ACE", "ACE", "ESM", "ESM", "ESM"],
                          "verdict": ["reproduced", "partly", "partly", "not measured", "partly"]})
    bplot.verdict_counts(ax, table)
    assert sum(_heights(ax)) == 5
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"reproduced", "partly", "not measured"}
    plt.close("all")


# ----------------------------------------------------------------------------- explorers
def test_alpha_slider_redraws_with_new_value(traces):
    pytest.importorskip("ipywidgets")
    from acetools_course import widgets

    ex = widgets.alpha_slider(bplot.sweep_at, [0.1, 0.2, 0.3, 0.4], value=0.3, traces=traces, method="ta")
    assert ex.values == {"alpha": 0.3} and "lam = 0.3" in ex.ax.get_title()
    draws = ex.draws
    ex.set(alpha=0.1)
    assert ex.values == {"alpha": 0.1} and ex.draws == draws + 1
    assert "lam = 0.1" in ex.ax.get_title() and "70.0 %" in ex.ax.get_title()
    assert [ln for ln in ex.ax.get_lines() if list(ln.get_xdata()) == [0.1, 0.1]]
    assert not [ln for ln in ex.ax.get_lines() if list(ln.get_xdata()) == [0.3, 0.3]]  # old marker cleared


def test_task_picker_redraws_bars(scores):
    pytest.importorskip("ipywidgets")
    from acetools_course import widgets

    ex = widgets.task_picker(bplot.task_bars, ["x", "y"], scores=scores)
    assert ex.values == {"task": "x"} and _heights(ex.ax) == [90.0, 80.0]
    ex.set(task="y")
    assert ex.values == {"task": "y"} and _heights(ex.ax) == [70.0, 60.0] and ex.ax.get_title() == "task: y"


def test_wudi_step_size_lines_start_and_default():
    df = pd.DataFrame({"suite": ["t8"] * 3 + ["t20"] * 3, "seed": 0,
                       "method": ["task_arithmetic", "wudi", "wudi"] * 2, "lr": [np.nan, 1e-5, 1e-3] * 2,
                       "test_normalized": [35.0, 50.0, 76.0, 27.0, 31.0, 69.0]})
    fig, ax = plt.subplots()
    bplot.wudi_step_size(ax, df)
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["t8 seed 0: WUDI"].get_ydata()) == [50.0, 76.0]
    assert list(lines["t20 seed 0: WUDI"].get_xdata()) == [1e-5, 1e-3]
    assert list(lines["t8: task arithmetic, lambda = 1 (WUDI's start)"].get_ydata()) == [35.0, 35.0]
    assert list(lines["default lr 1e-05"].get_xdata()) == [1e-5, 1e-5]  # the registry's default
    assert ax.get_xscale() == "log"
    plt.close(fig)
