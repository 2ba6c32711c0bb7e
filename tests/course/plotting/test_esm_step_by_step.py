"""acetools_course.lesson03_esm_step_by_step: every figure function draws what it is given on an Agg axes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from acetools_course import lesson03_esm_step_by_step as pe  # noqa: E402

K1 = "visual.transformer.resblocks.0.mlp.c_fc.weight"
K2 = "visual.transformer.resblocks.1.attn.in_proj_weight"


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def _curves():
    rows = []
    for data in ("in-sample", "held-out"):
        for lt in ("mlp.c_fc.weight", "attn.in_proj_weight"):
            for task in ("a", "b"):
                for k in range(1, 9):
                    rows.append({"task": task, "layer_type": lt, "data": data, "k": k, "frac": k / 8,
                                 "esd": min(1.0, k / 4), "svd": k / 8})
    return pd.DataFrame(rows)


def test_short_key():
    assert pe.short_key(K1) == "b0 c_fc"
    assert pe.short_key(K2) == "b1 in_proj"
    assert pe.short_key("visual.proj") == "visual.proj"


def test_energy_curves_draw_two_lines_per_layer_type(ax):
    pe.energy_curves(ax, _curves(), data="held-out", k_frac=0.25)
    labels = [ln.get_label() for ln in ax.lines]
    assert "mlp.c_fc.weight ESD" in labels and "attn.in_proj_weight SVD" in labels
    assert len(ax.lines) == 5  # 2 types x (ESD, SVD) + the k marker
    esd = next(ln for ln in ax.lines if ln.get_label() == "mlp.c_fc.weight ESD")
    assert np.allclose(esd.get_ydata(), [25, 50, 75, 100, 100, 100, 100, 100])
    with pytest.raises(ValueError, match="data"):
        pe.energy_curves(ax, _curves(), data="nope")
    with pytest.raises(ValueError, match="columns"):
        pe.energy_curves(ax, _curves().drop(columns="svd"))


def test_cka_bars_add_an_all_layers_group(ax):
    t = pd.DataFrame({"data": "held-out", "layer_type": ["x", "y", "x"], "cka_esd": [0.9, 0.8, 0.7],
                      "cka_svd": [0.5, 0.4, 0.3]})
    pe.cka_bars(ax, t)
    assert len(ax.patches) == 6  # 3 groups (x, y, all layers) x 2
    assert [tk.get_text() for tk in ax.get_xticklabels()] == ["x", "y", "all layers"]
    assert ax.patches[0].get_height() == pytest.approx(0.8)  # ESD mean of x


def test_gram_image_and_blocks(ax):
    G = np.eye(6) + 0.1
    pe.gram_image(ax, G, block=2, title="g")
    assert ax.get_title() == "g" and len(ax.images) == 1
    assert len(ax.lines) == 4  # 2 inner block boundaries, horizontal and vertical
    with pytest.raises(ValueError, match="square"):
        pe.gram_image(ax, np.ones((2, 3)))


def test_task_factor_heatmap_labels_layers(ax):
    f = pd.DataFrame([[1.2, 0.8], [0.8, 1.2]], index=["a", "b"], columns=[K1, K2])
    pe.task_factor_heatmap(ax, f)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["b0 c_fc", "b1 in_proj"]
    assert len(ax.texts) == 4  # annotated cells


def test_dimension_factor_plot_sorts(ax):
    pe.dimension_factor_plot(ax, {"b0 c_fc": [0.5, 2.0, 1.0]})
    assert list(ax.lines[0].get_ydata()) == [2.0, 1.0, 0.5]
    assert ax.get_yscale() == "log"


def test_layer_factor_bars_group_by_type(ax):
    t = pd.DataFrame({"layer_type": ["c_fc", "c_fc", "in_proj", "in_proj"], "block": [0, 1, 0, 1],
                      "beta": [0.5, 1.5, 1.2, 0.8]})
    pe.layer_factor_bars(ax, t)
    assert len(ax.patches) == 4
    assert sorted(p.get_height() for p in ax.patches) == [0.5, 0.8, 1.2, 1.5]


def test_accuracy_bars_baseline_and_noise_band(ax):
    pe.accuracy_bars(ax, {"in-distribution": 80.0, "other": 79.0}, baseline=78.0, reference="in-distribution",
                     noise=0.5)
    assert [p.get_height() for p in ax.patches[:2]] == [80.0, 79.0]
    assert any(ln.get_ydata()[0] == 78.0 for ln in ax.lines)
    lo, hi = ax.get_ylim()
    assert lo <= 78.0 and hi >= 80.0 and hi <= 100.0


def test_ablation_bars_one_colour_per_suite(ax):
    df = pd.DataFrame({"suite": ["t8", "t8", "t20", "t20"], "variant": ["SVD", "ESD", "SVD", "ESD"],
                       "test_acc": [70.0, 72.0, 60.0, 63.0]})
    pe.ablation_bars(ax, df)
    assert len(ax.patches) == 4
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["t8", "t20"]
    with pytest.raises(ValueError):
        pe.ablation_bars(ax, df, value="nope")


def test_search_traces_mark_the_chosen_alpha(ax):
    from types import SimpleNamespace

    tr = pd.DataFrame({"alpha": [1.0, 0.5, 1.5], "avg_normalized_top1": [0.9, 0.8, 0.85],
                       "is_best": [True, False, False]})
    pe.search_traces(ax, [SimpleNamespace(search=tr, name="ESD")])
    line, star = ax.lines
    assert list(line.get_xdata()) == [0.5, 1.0, 1.5]
    assert list(star.get_xdata()) == [1.0] and list(star.get_ydata()) == [90.0]


def test_norm_order_bars(ax):
    t = pd.DataFrame({"task": ["a"] * 6, "order": ["all", "none", "norm", "norm", "reverse", "reverse"],
                      "equal_norms": [False, False, False, True, False, True],
                      "normalized": [100.0, 40.0, 90.0, 85.0, 50.0, 60.0]})
    pe.norm_order_bars(ax, t)
    labels = [x.get_text() for x in ax.get_xticklabels()]
    assert labels == ["all", "none", "norm (raw norms)", "norm (equal norms)", "reverse (raw norms)",
                      "reverse (equal norms)"]
    assert [p.get_height() for p in ax.patches] == [100.0, 40.0, 90.0, 85.0, 50.0, 60.0]
