"""Figures of notebook 01: pure functions ``(ax, data, ...) -> ax`` on the frames of :mod:`acetools.course.theorem1`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import InputError
from ...plotting import finish, heatmap

#: Axis/legend names of the agreement metrics.
METRIC_LABELS = {
    "cosine": r"cos($\hat\Sigma$, $\Sigma$)",
    "cosine_sq": r"cos($\hat\Sigma$, $\Sigma^2$)",
    "subspace_overlap": "top-k eigenvector overlap",
    "spectrum_pearson": "spectrum correlation",
    "identity_cosine": r"cos($I$, $\Sigma$)  (isotropic guess)",
    "cross_task_cosine": r"cos($\hat\Sigma_t$, $\Sigma_s$), other tasks $s$",
}


def covariance_image(ax, M, *, title: str | None = None):
    """A covariance matrix as an image divided by its largest |entry| (shapes compare across scales), centred at 0."""
    A = np.asarray(M.detach().cpu().double() if hasattr(M, "detach") else M, dtype=float)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise InputError(f"covariance_image needs a square matrix, got shape {A.shape}")
    scale = np.abs(A).max()
    ax.imshow(A / scale if scale > 0 else A, cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
    return finish(ax, title)


def spectra_plot(ax, spectra, *, title: str | None = None):
    """Normalised eigenvalues (:func:`acetools.course.theorem1.spectra_frame`) per ``source``, log scale."""
    for name, g in spectra.groupby("source", sort=False):
        g = g.sort_values("index")
        ax.plot(g["index"], g["eigenvalue"].clip(lower=1e-12), marker=".", label=str(name))
    ax.set_yscale("log")
    ax.set_xlabel("eigenvalue index")
    ax.set_ylabel(r"$\lambda_i / \lambda_1$")
    return finish(ax, title, legend=True, fontsize=10)


def _positions(values) -> tuple[np.ndarray, list[str], bool]:
    """x positions for swept values: numeric values as they are, categories 0..n-1."""
    vals = list(dict.fromkeys(values))
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in vals):
        return np.asarray(vals, dtype=float), [str(v) for v in vals], True
    return np.arange(len(vals), dtype=float), [str(v) for v in vals], False


def sweep_panel(ax, data, param: str, *, metrics: Sequence[str] = ("cosine", "cosine_sq"),
                baseline: str | None = "identity_cosine", logx: bool | None = None, title: str | None = None,
                legend: bool = True):
    """Median over tasks of each metric against one swept knob (``param``) of a :func:`acetools.course.theorem1.sweep`
    frame, with a min–max band and the isotropic guess dashed; ``logx=None``: log x past a factor 20."""
    d = data[data["param"] == param] if "param" in data else data
    if d.empty:
        raise InputError(f"no rows with param == {param!r}; swept knobs: {sorted(set(data['param']))}")
    order = list(dict.fromkeys(d["value"]))
    x, labels, numeric = _positions(order)
    pos = dict(zip(order, x))
    for m in metrics:
        g = d.groupby("value", sort=False)[m]
        med, lo, hi = g.median(), g.min(), g.max()
        xs = np.array([pos[v] for v in med.index])
        idx = np.argsort(xs)
        line, = ax.plot(xs[idx], med.values[idx], marker="o", label=METRIC_LABELS.get(m, m))
        ax.fill_between(xs[idx], lo.values[idx], hi.values[idx], color=line.get_color(), alpha=0.15)
    if baseline:
        ax.axhline(float(d[baseline].median()), color="grey", ls="--", lw=1,
                   label=METRIC_LABELS.get(baseline, baseline))
    if numeric:
        if logx is None:
            logx = bool((x > 0).all()) and x.max() / x.min() > 20
        if logx:
            ax.set_xscale("log")
    else:
        ax.set_xticks(x, labels)
    ax.set_xlabel(param)
    ax.set_ylabel("agreement")
    ax.set_ylim(0, 1.02)
    if legend:
        return finish(ax, title, legend=True, fontsize=10)


def progress_panel(ax, data, *, hue: str = "model", metric: str = "cosine", title: str | None = None):
    """``metric`` against training ``progress`` (0 untrained, 1 converged), one line per ``hue`` value (median
    over tasks): separates *how far* training went from *how* (optimizer, depth, non-linearity)."""
    if hue not in data:
        raise InputError(f"data has no column {hue!r}; add one naming each curve")
    for key, g in data.groupby(hue, sort=False):
        m = g.groupby("value", sort=False)[["progress", metric]].median().sort_values("progress")
        ax.plot(m["progress"], m[metric], marker="o", label=str(key))
    ax.axhline(float(data["identity_cosine"].median()), color="grey", ls="--", lw=1,
               label=METRIC_LABELS["identity_cosine"])
    ax.set_xlabel("training progress (fraction of the error removed)")
    ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    ax.set_ylim(0, 1.02)
    return finish(ax, title, legend=True, fontsize=10)


def _short(layer_type: str) -> str:
    return layer_type.replace("_weight", "").replace(".weight", "")


def layer_heatmap(ax, data, *, value: str = "cosine", title: str | None = None, cbar: bool = True):
    """Layers × tasks heatmap of ``value`` from :func:`acetools.course.theorem1.vit_agreement` (0–1 scale)."""
    d = data.assign(layer=[f"{b}·{_short(t)}" for b, t in zip(data["block"], data["layer_type"])])
    rows = list(dict.fromkeys(d.sort_values(["block", "layer_type"])["layer"]))
    table = d.pivot_table(index="layer", columns="task", values=value, sort=False).reindex(rows)
    table = table[list(dict.fromkeys(d["task"]))]
    return heatmap(ax, table, title=title or METRIC_LABELS.get(value, value), vmin=0.0, vmax=1.0, cmap="viridis",
                   cbar=cbar)


def layer_type_bars(ax, data, *, metrics: Sequence[str] = ("cosine", "cross_task_cosine", "identity_cosine"),
                    title: str | None = None):
    """Median over blocks and tasks of each metric per layer type: own task, other tasks, isotropic guess."""
    types = list(dict.fromkeys(data["layer_type"]))
    med = data.groupby("layer_type", sort=False)[list(metrics)].median().reindex(types)
    width = 0.8 / len(metrics)
    pos = np.arange(len(types))
    for i, m in enumerate(metrics):
        ax.bar(pos + (i - (len(metrics) - 1) / 2) * width, med[m].values, width, label=METRIC_LABELS.get(m, m))
    ax.set_xticks(pos, [_short(t) for t in types])
    ax.set_ylabel("median cosine")
    ax.set_ylim(0, 1.02)
    return finish(ax, title, legend=True, fontsize=10)
