"""acetools_course.lesson02_ace_step_by_step: the figures of notebook 02 draw what they say, on a given axes; the
rank slider redraws with the new k."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.collections import PathCollection

from acetools.diagnostics import heterogeneity_per_layer
from acetools.merging import ace as A
from acetools.merging import task_vectors
from acetools_course import lesson02_ace_step_by_step as AC
from acetools_course import lesson02_ace_step_by_step as P
from tests.conftest import make_world


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


@pytest.fixture(scope="module")
def stages():
    """One flagged layer's stages, from the library's stage functions (docs/methods.md §ACE), in the
    small frames notebook 02 builds from its own tensors."""
    g = torch.Generator().manual_seed(0)
    dWs = [s * torch.randn(12, 6, generator=g, dtype=torch.float64) for s in (0.2, 1.0, 4.0)]
    covs = A.normalize_covariances([A.estimate_covariance(d) for d in dWs], normalize=True)
    e = float(np.mean([float(d.pow(2).sum()) for d in dWs]))
    C = A.structural_prior(covs.Sigma_tilde, energy=e)
    W_pre = A.closed_form([A.center_rows(d) for d in dWs], covs, C)
    ref = A.spectral_refine(W_pre, dWs, covs.Sigma_tilde, covs.mean_reg(), k_frac=0.3)
    tr = covs.traces.numpy()
    used = np.array([float(S.trace()) for S in covs.Sigma_tilde])
    weights = pd.DataFrame({"task": ["a", "b", "c"], "share_raw": tr / tr.sum(), "share_used": used / used.sum()})
    profile = pd.DataFrame({"column": np.arange(6), "prior": C[0].numpy(),
                            "cov_diag": sum(covs.Sigma_tilde).diagonal().numpy(), "ridge": float(covs.ridge.sum())})
    sv = torch.linalg.svdvals
    spectra = {"W_pre (closed form)": sv(W_pre).numpy(), "W_fused": ref.S_fused.numpy(), "W": sv(ref.W).numpy()}
    refined = {k: sv(A.isotropic_update(W_pre, ref.U[:, :k] @ ref.Vh[:k, :], ref.S_fused[:k].mean())).numpy()
               for k in range(1, 7)}
    return SimpleNamespace(W_pre=W_pre, k=ref.k, rank=6, weights=weights, profile=profile, spectra=spectra,
                           refined=refined)


@pytest.fixture(scope="module")
def world_tables():
    base, experts = make_world(n_tasks=3, scale=1.0)
    taus = task_vectors(base, experts)
    W, diags = A.ace_with_diagnostics(base, taus)
    W_pre, _ = A.ace_with_diagnostics(base, taus, refine=False)
    return heterogeneity_per_layer(taus), AC.layer_table(taus, W_pre, W, diags)


def test_short_label():
    assert P.short_label("visual.transformer.resblocks.3.mlp.c_fc.weight") == "3.c_fc"
    assert P.short_label("visual.transformer.resblocks.11.attn.in_proj_weight") == "11.in_proj"
    assert P.short_label("visual.positional_embedding") == "pos_emb"
    assert P.short_label("visual.proj") == "proj"
    assert P.short_label("other.weight") == "other.weight"


def test_gamma_strip(ax):
    gt = pd.DataFrame({"key": list("abcde"), "layer_type": ["x", "x", "y", "y", "z"],
                       "gamma": [0.01, 0.02, 5.0, 0.1, 300.0]})
    out = P.gamma_strip(ax, gt, vit=0.25, tau=0.3, title="t")
    assert out is ax
    pcs = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert [len(c.get_offsets()) for c in pcs] == [3, 2]  # not flagged, flagged
    flagged_y = sorted(np.asarray(pcs[1].get_offsets())[:, 1])
    assert flagged_y == [5.0, 300.0]
    hlines = sorted(line.get_ydata()[0] for line in ax.get_lines())
    assert hlines == [0.25, 0.3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["x", "y", "z"]
    assert ax.get_yscale() == "log"  # four decades
    assert len(ax.get_legend().get_texts()) == 4 and ax.get_title() == "t"


def test_gamma_strip_linear_when_narrow(ax, world_tables):
    gt, _ = world_tables
    gt = gt.assign(gamma=np.linspace(0.1, 0.5, len(gt)))
    P.gamma_strip(ax, gt, logy=False)
    assert ax.get_yscale() == "linear"
    assert sum(len(c.get_offsets()) for c in ax.collections) == len(gt)


def test_gamma_scaling(ax):
    g = torch.Generator().manual_seed(0)
    dWs = [c * torch.randn(8, 4, generator=g) for c in (0.5, 1.0, 2.0)]
    scales = np.logspace(-1, 1, 5)
    df = pd.DataFrame({"scale": scales, "gamma": [A.heterogeneity([float(c) * d for d in dWs]) for c in scales]})
    P.gamma_scaling(ax, df, tau=0.3)
    lines = ax.get_lines()
    assert len(lines) == 3  # the curve, tau, c = 1
    np.testing.assert_allclose(lines[0].get_ydata(), df.sort_values("scale").gamma)
    assert ax.get_xscale() == "log"


def test_task_weights(ax, stages):
    w = stages.weights
    P.task_weights(ax, w)
    assert len(ax.patches) == 6
    heights = [p.get_height() for p in ax.patches]
    np.testing.assert_allclose(heights[3:], 1 / 3)  # normalised layer: equal shares
    np.testing.assert_allclose(heights[:3], w.share_raw)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert ax.get_lines()[0].get_ydata()[0] == pytest.approx(1 / 3)


def test_prior_profile(ax, stages):
    prof = stages.profile
    P.prior_profile(ax, prof)
    lines = ax.get_lines()
    assert len(lines) == 2  # covariance diagonal, ridge
    np.testing.assert_allclose(lines[0].get_ydata(), np.sort(prof.cov_diag)[::-1])
    pts = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(pts) == 2
    n_pos, n_neg = int((prof.prior > 0).sum()), int((prof.prior < 0).sum())
    assert [len(c.get_offsets()) for c in pts] == [n_pos, n_neg] and n_pos + n_neg == len(prof)
    assert (np.asarray(pts[1].get_offsets())[:, 1] > 0).all()  # negative values drawn as |c_j|
    assert ax.get_yscale() == "log"
    assert len(ax.get_legend().get_texts()) == 4


def test_spectra(ax, stages):
    sp = stages.spectra
    P.spectra(ax, sp, top_frac=0.5)
    lines = ax.get_lines()
    assert len(lines) == len(sp) + 1
    assert lines[-1].get_xdata()[0] == 3  # ceil(0.5 * 6)
    np.testing.assert_allclose(lines[0].get_ydata(), np.sort(sp["W_pre (closed form)"])[::-1])
    ax.clear()
    P.spectra(ax, sp, top_frac=None, logy=False)
    assert len(ax.get_lines()) == len(sp) and ax.get_yscale() == "linear"


def test_refined_spectrum(ax, stages):
    pre = torch.linalg.svdvals(stages.W_pre).numpy()
    refined = stages.refined
    P.refined_spectrum(ax, pre, refined, 2, k_ace=1)
    lines = ax.get_lines()
    assert len(lines) == 4  # W_pre, refined, k line, ACE's k
    np.testing.assert_allclose(lines[1].get_ydata(), refined[2])
    assert "k = 2" in ax.get_title()
    with pytest.raises(KeyError):
        P.refined_spectrum(ax, pre, {k: refined[k] for k in (1, 2, 3)}, 5)


def test_layer_metrics(ax, world_tables):
    _, st = world_tables
    P.layer_metrics(ax, st, {"cos_sum": "vs sum", "cos_random": "chance"}, hlines={"ref": 0.9}, ylabel="cos")
    lines = ax.get_lines()
    assert len(lines) == 3
    np.testing.assert_allclose(lines[0].get_ydata(), st.cos_sum)
    assert [t.get_text() for t in ax.get_xticklabels()] == [P.short_label(k) for k in st.key]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["vs sum", "chance", "ref"]


def test_ablation_bars(ax):
    rows = [{"suite": s, "variant": v, "test_normalized": 80 + i + j, "test_acc": 70 + i}
            for j, s in enumerate(["tasks8", "tasks20"]) for i, v in enumerate([AC.FULL, AC.NO_PRIOR, AC.IDENTITY])]
    table = pd.DataFrame(rows)
    P.ablation_bars(ax, table, noise=0.5)
    bars = [p for c in ax.containers for p in c]
    assert len(ax.containers) == 2 and len(bars) == 6  # one bar group per suite
    widths = sorted(round(p.get_width(), 6) for p in bars)
    assert widths == sorted(float(x) for x in table.test_normalized)
    assert [t.get_text() for t in ax.get_yticklabels()] == [AC.FULL, AC.NO_PRIOR, AC.IDENTITY]
    spans = [p for p in ax.patches if p not in bars]
    assert len(spans) == 2  # full ACE ± noise, per suite
    for span, ref in zip(spans, (80.0, 81.0)):
        x0, x1 = span.get_extents().x0, span.get_extents().x1  # display coords: compare in data coords
        xs = ax.transData.inverted().transform([[x0, 0], [x1, 0]])[:, 0]
        np.testing.assert_allclose(xs, [ref - 0.5, ref + 0.5], atol=1e-6)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["tasks8", "tasks20"]


def test_rank_slider_redraws_with_new_k(stages):
    from acetools_course import widgets

    pre = torch.linalg.svdvals(stages.W_pre).numpy()
    ks = list(range(1, stages.rank + 1))
    refined = stages.refined
    ex = widgets.rank_slider(P.refined_spectrum, ks, value=stages.k, pre=pre, refined=refined, k_ace=stages.k)
    assert ex.values["k"] == stages.k and ex.draws == 1
    ex.set(k=4)
    assert ex.values["k"] == 4 and ex.draws == 2
    assert "k = 4" in ex.ax.get_title()
    np.testing.assert_allclose(ex.ax.get_lines()[1].get_ydata(), refined[4])
    assert not np.allclose(refined[4], refined[stages.k])
    plt.close(ex.figure)
