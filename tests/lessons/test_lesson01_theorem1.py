"""Lesson 01, ``acetools_course.lesson01_theorem1``: its experiments, figures and claims' verdicts.

Experiments and figures: Theorem 1 of ACE-Merging, measured.

Verdicts: the verdicts of ace.theorem1, ace.theorem1_vit and ace.unified.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from types import SimpleNamespace  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from acetools import merge  # noqa: E402
from acetools.merging.ace import estimate_covariance  # noqa: E402
from acetools.merging.wudi import wudi_grad  # noqa: E402
from acetools.synthetic import finetune_linear, joint_least_squares, make_regression_tasks  # noqa: E402
from acetools.utils import make_generator  # noqa: E402
from acetools_course import lesson01_theorem1 as lesson  # noqa: E402

# --------------------------------------------------------------------------- experiments


TINY = dict(n_tasks=2, d_in=8, d_out=24, d_hidden=24, subspace_dim=3, n_train=300)
KEY = "visual.transformer.resblocks.0.mlp.c_fc.weight"


def _spd(d: int, seed: int, spectrum: list[float] | None = None) -> torch.Tensor:
    g = make_generator(seed)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    if spectrum:
        lam = torch.tensor(spectrum, dtype=torch.float64)
    else:
        lam = torch.rand(d, generator=g, dtype=torch.float64) + 0.1
    return (Q * lam) @ Q.T


# --------------------------------------------------------------------------- agreement


def test_agreement_of_a_matrix_with_itself_and_its_square():
    S = _spd(10, 0)
    a = lesson.covariance_agreement(S, S, k=3)
    assert a["cosine"] == pytest.approx(1.0) and a["subspace_overlap"] == pytest.approx(1.0)
    assert a["spectrum_pearson"] == pytest.approx(1.0)
    assert lesson.covariance_agreement(7.0 * S @ S, S, k=3)["cosine_sq"] == pytest.approx(1.0)  # scale-free
    expected_identity = float(torch.trace(S) / (10**0.5 * torch.linalg.matrix_norm(S)))
    assert a["identity_cosine"] == pytest.approx(expected_identity)
    assert set(lesson.AGREEMENT_COLUMNS) <= set(a)


def test_agreement_rejects_non_square_inputs():
    with pytest.raises(ValueError, match="Sigma_hat must be a square matrix"):
        lesson.covariance_agreement(torch.ones(3, 4), torch.eye(3))
    with pytest.raises(ValueError, match="shapes"):
        lesson.matrix_cosine(torch.eye(2), torch.eye(3))


def _relative_variances(Sigma_hat, Sigma):
    """u_iᵀ Sigma_hat u_i / u_1ᵀ Sigma_hat u_1 along Sigma's eigenvectors u_i (descending)."""
    _, U = torch.linalg.eigh(Sigma)
    U = U.flip(1)
    v = ((Sigma_hat @ U) * U).sum(0)
    return v / v[0]


def test_noise_driven_sgd_update_estimates_sigma_itself():
    """Targets of zero-mean isotropic noise, W0 = 0: the update is 2 eta sum_i y_i x_iᵀ, whose
    rows have covariance ∝ Sigma (not Sigma²): Theorem 1 holds exactly in expectation."""
    d_in, d_out, n = 6, 400, 4000
    Sigma = _spd(d_in, 1, [1.0, 0.5, 0.25, 0.1, 0.05, 0.02])
    g = make_generator(2)
    X = torch.randn(n, d_in, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(Sigma).T
    Y = torch.randn(n, d_out, generator=g, dtype=torch.float64)
    W = finetune_linear(torch.zeros(d_out, d_in, dtype=torch.float64), X, Y, steps=20, lr=1e-3, batch_size=64)
    S_hat = estimate_covariance(W)
    a = lesson.covariance_agreement(S_hat, Sigma, k=2)
    assert a["cosine"] > 0.98 and a["cosine"] > a["cosine_sq"]
    rel = _relative_variances(S_hat, Sigma)
    assert 0.01 < rel[-1] < 0.04  # Sigma's ratio 0.02, not Sigma²'s 0.0004


def test_drift_driven_early_update_estimates_sigma_squared():
    """Noise-free targets, a few small steps: ΔW ≈ 2 eta N B Sigma, rows ~ Sigma b: Cov ∝ Sigma²."""
    df, est, truth = lesson.estimate_experiment(**dict(TINY, d_out=200), steps=5, lr=0.005, noise=0.0,
                                            return_estimates=True)
    assert (df["cosine_sq"] > 0.95).all()
    assert (df["cosine_sq"] > df["cosine"]).all()
    for S_hat, S in zip(est, truth):  # floor 0.02 of Sigma: Sigma² predicts 0.0004
        assert _relative_variances(S_hat, S)[-1] < 0.005


# --------------------------------------------------------------------------- sweeps


def test_estimate_experiment_columns_and_the_theorem_regime():
    df, est, truth = lesson.estimate_experiment(**TINY, steps=30, return_estimates=True)
    assert list(df.columns) == list(lesson.SWEEP_COLUMNS)
    assert len(df) == TINY["n_tasks"] == len(est) == len(truth)
    assert (df["cosine"] > 0.85).all()
    assert (df["cosine"] > df["identity_cosine"] + 0.3).all()
    assert ((df["progress"] > 0) & (df["progress"] < 1)).all()
    assert df["k"].eq(TINY["subspace_dim"]).all()


def test_long_training_loses_the_covariance():
    early = lesson.estimate_experiment(**TINY, steps=20)
    late = lesson.estimate_experiment(**TINY, steps=3000, lr=0.05)
    assert late["progress"].min() > 0.99
    assert late["cosine"].median() < early["cosine"].median() - 0.2


def test_sweep_is_tidy_and_names_its_knob():
    df = lesson.sweep("steps", [5, 20], **TINY)
    assert list(df.columns) == list(lesson.SWEEP_COLUMNS)
    assert len(df) == 2 * TINY["n_tasks"]
    assert set(df["param"]) == {"steps"} and list(df["value"]) == list(df["steps"])
    cat = lesson.sweep("optimizer", ["sgd", "adam"], **TINY, steps=5, lr=0.005)
    assert list(dict.fromkeys(cat["value"])) == ["sgd", "adam"]


@pytest.mark.parametrize("activation", ["linear", "tanh", "relu"])
def test_two_layer_experiment_runs_and_learns(activation):
    df = lesson.estimate_experiment(**TINY, steps=30, activation=activation)
    assert (df["progress"] > 0).all() and df["cosine"].between(-1, 1).all()


@pytest.mark.parametrize("call, exc, match", [
    (lambda: lesson.sweep("no_such_knob", [1]), ValueError, "not a setting"),
    (lambda: lesson.sweep("steps", [1], steps=3), TypeError, "is swept"),
    (lambda: lesson.sweep("steps", []), ValueError, "non-empty"),
    (lambda: lesson.sweep("steps", 5), ValueError, "non-empty"),
    (lambda: lesson.estimate_experiment(n_task=3), TypeError, "unknown setting"),
    (lambda: lesson.estimate_experiment(optimizer="rmsprop"), ValueError, "optimizer"),
    (lambda: lesson.estimate_experiment(activation="gelu"), ValueError, "activation"),
    (lambda: lesson.estimate_experiment(steps=0), ValueError, "steps=0 must be a positive int"),
    (lambda: lesson.estimate_experiment(lr=-1.0), ValueError, "lr"),
    (lambda: lesson.estimate_experiment(noise=-0.1), ValueError, "noise"),
    (lambda: lesson.estimate_experiment(d_in=4, subspace_dim=6), ValueError, "subspace_dim"),
])
def test_argument_errors_are_clear(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_divergence_gives_a_nan_row_and_a_warning():
    with pytest.warns(RuntimeWarning, match="diverged"):
        df = lesson.estimate_experiment(**TINY, steps=200, lr=50.0)
    assert df["cosine"].isna().all()


def test_spectra_frame_is_normalised_and_descending():
    df = lesson.spectra_frame({"a": _spd(5, 3), "b": 2 * torch.eye(5)})
    a = df[df.source == "a"]["eigenvalue"].to_numpy()
    assert a[0] == pytest.approx(1.0) and (a[:-1] >= a[1:]).all()
    assert df[df.source == "b"]["eigenvalue"].eq(1.0).all()
    with pytest.raises(ValueError, match="no positive eigenvalue"):
        lesson.spectra_frame({"z": torch.zeros(3, 3)})


# --------------------------------------------------------------------------- 2-layer networks


def test_two_layer_teacher_scales_and_is_deterministic():
    _, tasks = make_regression_tasks(1, 10, 4, n_train=2000, seed=0)
    W1, W2, Y, F = lesson.two_layer_teacher(tasks[0], 16, "tanh", gain=2.0, seed=5)
    W1b, _, Yb, _ = lesson.two_layer_teacher(tasks[0], 16, "tanh", gain=2.0, seed=5)
    assert torch.equal(W1, W1b) and torch.equal(Y, Yb)
    assert W1.shape == (16, 10) and W2.shape == (4, 16) and Y.shape == (2000, 4) and F.shape == (1000, 4)
    pre = tasks[0].X_train @ W1.T
    assert pre.std().item() == pytest.approx(2.0, rel=0.25)


@pytest.mark.parametrize("activation", ["linear", "tanh", "relu"])
def test_two_layer_gradients_match_autograd(activation):
    g = make_generator(0)
    X = torch.randn(20, 5, generator=g, dtype=torch.float64)
    Y = torch.randn(20, 3, generator=g, dtype=torch.float64)
    W1 = torch.randn(7, 5, generator=g, dtype=torch.float64)
    W2 = torch.randn(3, 7, generator=g, dtype=torch.float64)
    lr = 0.01
    A, B = lesson.finetune_two_layer(W1, W2, X, Y, activation=activation, steps=1, lr=lr, batch_size=8, seed=3)
    idx = torch.randint(0, 20, (8,), generator=make_generator(3))  # the same minibatch
    p1, p2 = W1.clone().requires_grad_(True), W2.clone().requires_grad_(True)
    act = {"linear": lambda z: z, "tanh": torch.tanh, "relu": torch.relu}[activation]
    ((act(X[idx] @ p1.T) @ p2.T - Y[idx]) ** 2).sum(1).mean().backward()
    assert torch.allclose(A, W1 - lr * p1.grad, atol=1e-12)
    assert torch.allclose(B, W2 - lr * p2.grad, atol=1e-12)


def test_two_layer_adam_matches_torch_optim():
    g = make_generator(1)
    X, Y = torch.randn(30, 4, generator=g, dtype=torch.float64), torch.randn(30, 2, generator=g, dtype=torch.float64)
    W1, W2 = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(2, 6, generator=g, dtype=torch.float64)
    A, B = lesson.finetune_two_layer(W1, W2, X, Y, activation="tanh", steps=5, lr=0.01, batch_size=10, optimizer="adam")
    p1, p2 = W1.clone().requires_grad_(True), W2.clone().requires_grad_(True)
    opt = torch.optim.Adam([p1, p2], lr=0.01)
    gen = make_generator(0)
    for _ in range(5):
        idx = torch.randint(0, 30, (10,), generator=gen)
        opt.zero_grad()
        ((torch.tanh(X[idx] @ p1.T) @ p2.T - Y[idx]) ** 2).sum(1).mean().backward()
        opt.step()
    assert torch.allclose(A, p1.detach(), atol=1e-10) and torch.allclose(B, p2.detach(), atol=1e-10)


# --------------------------------------------------------------------------- the ViT comparison


class _FakeZoo:
    """Two tasks, an 'encoder' that is one Linear layer (key '0.weight' sees the images)."""

    tasks = ["a", "b"]

    def __init__(self):
        g = make_generator(0)
        self._x = {t: torch.randn(50, 6, generator=g) * (i + 1) for i, t in enumerate(self.tasks)}
        self._base = {"0.weight": torch.randn(4, 6, generator=g)}
        self._experts = {t: {"0.weight": self._base["0.weight"] + 0.1 * torch.randn(4, 6, generator=g)}
                         for t in self.tasks}

    def split(self, task, split="train"):
        return SimpleNamespace(x=self._x[task])

    def base_state(self):
        return self._base

    def expert_state(self, task):
        return self._experts[task]

    def encoder(self, state):
        m = nn.Sequential(nn.Linear(6, 4, bias=False))
        m.load_state_dict(state)
        return m


def test_hooked_covariances_are_the_inputs_covariances():
    zoo = _FakeZoo()
    covs = lesson.hooked_covariances(zoo, ["0.weight"], n_images=40)
    assert len(covs) == 2
    for t, c in zip(zoo.tasks, covs):
        x = zoo.split(t).x[:40].double()
        assert torch.allclose(c["0.weight"], torch.cov(x.T, correction=0), atol=1e-10)
    gram = lesson.hooked_covariances(zoo, ["0.weight"], n_images=40, kind="gram", source="base")
    x = zoo.split("b").x[:40].double()
    assert torch.allclose(gram[1]["0.weight"], x.T @ x / 40, atol=1e-10)
    with pytest.raises(ValueError, match="kind"):
        lesson.hooked_covariances(zoo, ["0.weight"], kind="fisher")
    with pytest.raises(ValueError, match="source"):
        lesson.hooked_covariances(zoo, ["0.weight"], source="merged")
    with pytest.raises(ValueError, match="n_images"):
        lesson.hooked_covariances(zoo, ["0.weight"], n_images=1)


def _layer_world(n_tasks: int = 3, d_in: int = 8, d_out: int = 300):
    """Experts whose task vectors are B_t Sigma_t^(1/2): ACE's estimate is then ∝ Sigma_t."""
    base = {KEY: torch.zeros(d_out, d_in, dtype=torch.float64)}
    covs, experts = [], []
    for t in range(n_tasks):
        S = _spd(d_in, 10 + t, [1.0, 0.3, 0.1, 0.03, 0.01, 0.01, 0.01, 0.01])
        lam, Q = torch.linalg.eigh(S)
        root = (Q * lam.sqrt()) @ Q.T
        B = torch.randn(d_out, d_in, generator=make_generator(20 + t), dtype=torch.float64)
        experts.append({KEY: B @ root})
        covs.append({KEY: S})
    return base, experts, covs


def test_vit_agreement_matches_own_task_better_than_others():
    base, experts, covs = _layer_world()
    df = lesson.vit_agreement(base, experts, covs, tasks=["x", "y", "z"])
    assert list(df.columns[:5]) == ["task", "key", "block", "layer_type", "d_in"]
    assert df["layer_type"].eq("mlp.c_fc.weight").all() and df["block"].eq(0).all()
    assert (df["cosine"] > 0.9).all()
    assert (df["cosine"] > df["cross_task_cosine"] + 0.2).all()
    cheap = lesson.vit_agreement(base, experts, covs, eigen=False)
    assert torch.allclose(torch.tensor(cheap["cosine"].to_numpy()), torch.tensor(df["cosine"].to_numpy()))
    assert cheap["subspace_overlap"].isna().all()


def test_vit_agreement_argument_errors():
    base, experts, covs = _layer_world(2)
    with pytest.raises(ValueError, match="one per expert"):
        lesson.vit_agreement(base, experts, covs[:1])
    with pytest.raises(ValueError, match="task names"):
        lesson.vit_agreement(base, experts, covs, tasks=["only one"])
    with pytest.raises(KeyError, match="no entry"):
        lesson.vit_agreement(base, experts, covs, keys=["visual.other.weight"])


# --------------------------------------------------------------------------- the unified framework


def test_estimator_covariances_rescale_keeps_relative_weights():
    base, experts, covs = _layer_world(2)
    raw = lesson.estimator_covariances(base, experts, [KEY], "ace", rescale=False)
    out = lesson.estimator_covariances(base, experts, [KEY], "ace")
    d = raw[0][KEY].shape[0]
    traces = [float(torch.trace(c[KEY])) for c in out]
    assert sum(traces) / 2 == pytest.approx(d)
    ratio_raw = float(torch.trace(raw[0][KEY]) / torch.trace(raw[1][KEY]))
    assert traces[0] / traces[1] == pytest.approx(ratio_raw)
    ident = lesson.estimator_covariances(base, experts, [KEY], "identity")
    assert torch.equal(ident[0][KEY], torch.eye(d, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs given"):
        lesson.estimator_covariances(base, experts, [KEY], "given")
    with pytest.raises(ValueError, match="estimator"):
        lesson.estimator_covariances(base, experts, [KEY], "fisher")


def test_unified_merges_reduce_to_averaging_least_squares_and_wudi(world64):
    base, experts = world64
    keys = [k for k in base if k.endswith(("in_proj_weight", "c_fc.weight", "c_proj.weight"))]
    given = [{k: _spd(base[k].shape[1], 30 + 7 * t + i) for i, k in enumerate(keys)} for t in range(len(experts))]
    out = lesson.unified_merges(base, experts, keys, given=given, eps=0.0, estimators=("identity", "wudi", "given"))
    wa = merge("weight_averaging", base, experts)
    for k in base:  # identity = weight averaging, on every key
        assert torch.allclose(out["identity"][k], wa[k], atol=1e-6), k
    for k in set(base) - set(keys):  # non-keys are averaged in every row
        assert torch.allclose(out["given"][k], wa[k], atol=1e-6), k
    for k in keys:
        taus = [e[k].double() - base[k].double() for e in experts]
        grad = wudi_grad(out["wudi"][k].double() - base[k].double(), taus)
        assert grad.norm() < 1e-4 * wudi_grad(torch.zeros_like(taus[0]), taus).norm()
        A = sum(g[k] for g in given)
        Bm = sum(tau @ g[k] for tau, g in zip(taus, given))
        expect = base[k].double() + torch.linalg.solve(A.T, Bm.T).T
        assert torch.allclose(out["given"][k].double(), expect, atol=1e-4), k


def test_unified_merges_argument_errors(world64):
    base, experts = world64
    with pytest.raises(ValueError, match="unknown estimator"):
        lesson.unified_merges(base, experts, ["visual.proj"], estimators=("magic",))
    with pytest.raises(KeyError, match="no key"):
        lesson.unified_merges(base, experts, ["nope.weight"], estimators=("identity",))


def test_unified_linear_table_and_the_joint_optimum():
    res = lesson.unified_linear(**TINY, steps=30, eps=0.0)
    t = res.table.set_index("method")
    assert list(res.table.columns) == ["method", "label", "loss", "gain", "cosine"]
    assert list(t.index) == ["base", "experts", "identity", "wudi", "ace", "given", "ace_full", "joint least squares"]
    assert t.loc["base", "gain"] == pytest.approx(0.0) and t.loc["experts", "gain"] == pytest.approx(100.0)
    assert t["loss"].drop("experts").min() == pytest.approx(t.loc["joint least squares", "loss"])  # the optimum
    assert t.loc["given", "cosine"] == pytest.approx(1.0)
    W_avg = sum(res.experts) / len(res.experts)
    assert torch.allclose(res.merged["identity"], W_avg, atol=1e-12)
    _, tasks = make_regression_tasks(2, 8, 24, n_train=300, n_val=1, subspace_dim=3, noise=0.05, seed=0)
    assert torch.allclose(res.merged["joint least squares"], joint_least_squares(tasks))
    with pytest.raises(ValueError, match="activation"):
        lesson.unified_linear(activation="relu")


# --------------------------------------------------------------------------- figures


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def test_sweep_panel_draws_metrics_and_baseline(ax):
    df = lesson.sweep("steps", [2, 50], **TINY)
    lesson.sweep_panel(ax, df, "steps", metrics=("cosine", "cosine_sq"))
    assert len(ax.get_lines()) == 3 and ax.get_ylim() == (0, 1.02)
    with pytest.raises(ValueError, match="no rows"):
        lesson.sweep_panel(ax, df, "lr")


def test_sweep_panel_categorical_knob(ax):
    df = lesson.sweep("activation", ["none", "relu"], **TINY, steps=5)
    lesson.sweep_panel(ax, df, "activation", baseline=None, legend=False)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["none", "relu"]
    assert ax.get_legend() is None


def test_progress_panel_needs_its_hue(ax):
    df = lesson.sweep("steps", [2, 20], **TINY).assign(model="sgd")
    lesson.progress_panel(ax, df)
    assert len(ax.get_lines()) == 2
    with pytest.raises(ValueError, match="no column"):
        lesson.progress_panel(ax, df, hue="optimizer_name")


def test_layer_figures(ax):
    base, experts, covs = _layer_world()
    df = lesson.vit_agreement(base, experts, covs, tasks=["x", "y", "z"])
    lesson.layer_heatmap(ax, df)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["x", "y", "z"]
    fig, ax2 = plt.subplots()
    lesson.layer_type_bars(ax2, df)
    assert len(ax2.patches) == 3  # one layer type, three metrics
    plt.close(fig)


def test_covariance_image_and_spectra(ax):
    lesson.covariance_image(ax, _spd(4, 0), title="S")
    assert ax.get_title() == "S"
    with pytest.raises(ValueError, match="square"):
        lesson.covariance_image(ax, torch.ones(2, 3))
    fig, ax2 = plt.subplots()
    lesson.spectra_plot(ax2, lesson.spectra_frame({"a": _spd(4, 1)}))
    assert ax2.get_yscale() == "log"
    plt.close(fig)


def test_sweep_columns_cover_every_setting():
    assert set(lesson.DEFAULTS) <= set(lesson.SWEEP_COLUMNS)
    assert set(lesson.AGREEMENT_COLUMNS) <= set(lesson.SWEEP_COLUMNS)


def test_sweep_explorer_redraws_the_chosen_knob():
    widgets = pytest.importorskip("acetools_course.widgets")
    pytest.importorskip("ipywidgets")
    df = pd.concat([lesson.sweep("steps", [2, 20], **TINY), lesson.sweep("noise", [0.0, 1.0], **TINY)],
                   ignore_index=True)
    ex = widgets.task_picker(lesson.sweep_panel, ["steps", "noise"], name="param", description="knob", data=df)
    assert ex.ax.get_xlabel() == "steps"
    ex.set(param="noise")
    assert ex.ax.get_xlabel() == "noise" and ex.draws == 2


# --------------------------------------------------------------------------- verdicts


def _frame(cos, **cols):
    return pd.DataFrame({"cosine": cos, "cosine_sq": cos, "subspace_overlap": 1.0, "identity_cosine": 0.4, **cols})


def test_verdict_theorem1_thresholds():
    curves = pd.concat([_frame([0.6, 0.6], model=m, steps=s) for m in ("linear layer, SGD", "2-layer ReLU")
                        for s in (3, 300)], ignore_index=True)
    adam = _frame([0.5, 0.5])
    # the paper's "∝" is cosine 1: reproduced
    assert lesson.verdict_theorem1(_frame([1.0, 1.0]), curves, adam, steps=50).verdict == "reproduced"
    assert lesson.verdict_theorem1(_frame([0.9, 0.95]), curves, adam, steps=50).verdict == "reproduced"
    v = lesson.verdict_theorem1(_frame([0.7, 0.8]), curves, adam, steps=50)
    assert v.verdict == "partly" and "after 300 steps 0.600" in v.measured and v.numbers["cosine_adam"] == 0.5
    assert lesson.verdict_theorem1(_frame([0.2, 0.3]), curves, adam, steps=50).verdict == "not reproduced"
    with pytest.raises(ValueError, match="no rows"):
        lesson.median_cosine(curves, model="nope")


def test_verdict_theorem1_vit_rules():
    def vit(cos, ident, cross=0.0):
        return pd.DataFrame({"layer_type": ["a", "a", "b", "b"], "cosine": cos, "identity_cosine": ident,
                             "cross_task_cosine": cross})

    kw = dict(vit_base=vit([0.5] * 4, 0.1), vit_gram=vit([0.5] * 4, 0.1), n_images=8, suite="s", size="micro")
    assert lesson.verdict_theorem1_vit(vit([0.95, 0.99, 0.92, 0.9], 0.2), **kw).verdict == "reproduced"
    v = lesson.verdict_theorem1_vit(vit([0.6, 0.5, 0.3, 0.1], [0.2, 0.2, 0.2, 0.2]), **kw)  # beats I in 3 of 4 cells
    assert v.verdict == "partly" and v.numbers["beats_identity"] == 0.75 and "a 0.55" in v.measured
    assert lesson.verdict_theorem1_vit(vit([0.1] * 4, 0.2), **kw).verdict == "not reproduced"


def test_verdict_unified_and_synthetic_checks():
    exact = lesson.unified_linear(eps=0.0, n_tasks=2, d_in=6, d_out=12, n_train=200, steps=10)
    checks = lesson.synthetic_checks(exact)
    assert checks["identity_synthetic"] <= lesson.TOLERANCES["identity_synthetic"]
    assert checks["given_jls"] <= lesson.TOLERANCES["given_jls"]
    assert checks["wudi_gradient"] <= lesson.TOLERANCES["wudi_gradient"]
    acc = pd.DataFrame({"method": ["identity", "wudi", "ace", "given", "given_gram", "ace_full"],
                        "test_normalized": [70.0, 71, 72, 73, 74, 75]})
    gains = pd.Series({"ace": 90.0, "given": 99.0})
    ok = lesson.verdict_unified({**checks, "identity_vit": 1e-8, "identity_route": 2e-8}, acc, gains, gains, eps=1e-4)
    assert ok.verdict == "reproduced" and "to 2.0e-08 (mini-world)" in ok.measured
    bad = lesson.verdict_unified({**checks, "identity_vit": 1e-3, "identity_route": 0.0}, acc, gains, gains, eps=1e-4)
    assert bad.verdict == "not reproduced" and "identity_vit" in bad.reason
