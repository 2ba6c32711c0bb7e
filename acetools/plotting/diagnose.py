"""Figures of a diagnosis (:mod:`acetools.files.diagnose`): pure functions ``(ax, table, ...) -> ax``.

Each takes one table of :class:`acetools.files.diagnose.Diagnosis` (or the matching
:mod:`acetools.diagnostics` table) and names a missing column; layers are on the x axis in the
table's order, labelled ``block.type``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import InputError, InputKeyError, InputTypeError
from ..keys import short_label
from ._core import finish, heatmap, save_figure

__all__ = ["ratio_by_layer", "energy_by_layer", "gamma_by_layer", "cosine_heatmap", "spectra_by_type",
           "energy_concentration", "overlap_by_layer", "show"]


def _need(table, cols: Sequence[str], what: str) -> None:
    have = list(getattr(table, "columns", []))
    for c in cols:
        if c not in have:
            raise InputKeyError(f"{what}: the table has no column {c!r} (columns: {have}); pass the matching table of "
                           "acetools.files.diagnose.diagnose(...)")


def _xticks(ax, keys, max_labels: int = 60) -> np.ndarray:
    keys = list(keys)
    x = np.arange(len(keys))
    step = max(1, math.ceil(len(keys) / max_labels))
    ax.set_xticks(x[::step], [short_label(k) for k in keys][::step], rotation=90, fontsize=6)
    return x


def ratio_by_layer(ax, norms, *, matrices_only: bool = True, title: str | None = None):
    """‖τ_t‖/‖W0‖ per layer: mean over tasks (line) and their range (band); ``matrices_only`` by ``role``."""
    _need(norms, ["key", "ratio"], "ratio_by_layer")
    t = norms[norms["role"] == "matrix"] if matrices_only and "role" in norms.columns else norms
    g = t.groupby("key", sort=False)["ratio"]  # one row per (key, task)
    x = _xticks(ax, list(g.mean().index))
    ax.fill_between(x, g.min().to_numpy(float), g.max().to_numpy(float), alpha=0.3, color="C0",
                    label="range over tasks")
    ax.plot(x, g.mean().to_numpy(float), marker=".", color="C0", label="mean over tasks")
    ax.set_ylabel("‖τ_t‖_F / ‖W0‖_F")
    return finish(ax, title, legend=True)


def energy_by_layer(ax, layers, *, logy: bool = True, title: str | None = None):
    """‖ΔW_t‖²_F per matrix: mean (line) and the tasks' min-max (band)."""
    mean = "energy_mean" if "energy_mean" in getattr(layers, "columns", []) else "energy"
    _need(layers, ["key", mean, "energy_min", "energy_max"], "energy_by_layer")
    x = _xticks(ax, layers["key"])
    ax.fill_between(x, layers["energy_min"], layers["energy_max"], alpha=0.3, color="C1", label="min-max over tasks")
    ax.plot(x, layers[mean], marker=".", color="C1", label="mean over tasks")
    ax.axhline(1.0, color="k", ls=":", lw=1, label="‖ΔW‖² = 1 (log-energy 0)")
    if logy:
        ax.set_yscale("log")
    ax.set_ylabel("‖ΔW_t‖²_F")
    return finish(ax, title, legend=True)


def gamma_by_layer(ax, layers, *, tau: float | None = None, vit: float | None = 0.25, title: str | None = None):
    """ACE's γ per matrix (Eq. 7) against the gate τ (None: ACE's registered default), gated ones in red."""
    _need(layers, ["key", "gamma"], "gamma_by_layer")
    if tau is None:
        from ..merging import METHODS

        tau = float(METHODS["ace"].params["tau"].default)
    g = layers["gamma"].to_numpy(float)
    x = _xticks(ax, layers["key"])
    flag = g > tau
    ax.scatter(x[~flag], g[~flag], s=14, color="C0", label=f"γ ≤ τ ({int((~flag).sum())})", zorder=3)
    ax.scatter(x[flag], g[flag], s=14, color="C3", label=f"gated: γ > τ ({int(flag.sum())})", zorder=3)
    ax.axhline(tau, color="k", ls=":", lw=1, label=f"ACE's gate τ = {tau}")
    if vit is not None:
        ax.axhline(vit, color="C2", ls="--", lw=1, label=f"CLIP ViTs: γ < {vit}")
    # log scale when the points and the lines drawn with them span two decades: γ near 1e-3
    # under a gate at 0.3 would otherwise sit on the axis
    span = np.append(g, [tau] + ([vit] if vit is not None else []))
    pos = span[np.isfinite(span) & (span > 0)]
    if pos.size and bool(np.all(g[np.isfinite(g)] > 0)) and pos.max() / max(pos.min(), 1e-300) > 100:
        ax.set_yscale("log")
    ax.set_ylabel("heterogeneity γ")
    return finish(ax, title, legend=True)


def cosine_heatmap(ax, cosine, *, title: str | None = None):
    """The T x T task-vector cosine matrix, centred at 0."""
    import pandas as pd

    if not isinstance(cosine, pd.DataFrame) or cosine.shape[0] != cosine.shape[1]:
        raise InputTypeError("cosine_heatmap: pass the square T x T DataFrame Diagnosis.cosine")
    return heatmap(ax, cosine, title=title, center=0.0, vmin=-1.0, vmax=1.0)


def spectra_by_type(ax, spectra, *, relative: bool = True, logy: bool = True, title: str | None = None):
    """Singular values of τ_t (over σ_1 when ``relative``), mean over tasks and blocks, one line per layer type."""
    col = "sigma_rel" if relative else "sigma"
    _need(spectra, ["layer_type", "index", col], "spectra_by_type")
    for i, (lt, g) in enumerate(spectra.groupby("layer_type", sort=False)):
        m = g.groupby("index")[col].mean()
        ax.plot(m.index, np.clip(m.to_numpy(float), 1e-12, None), color=f"C{i % 10}", label=str(lt))
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("index i")
    ax.set_ylabel("σ_i / σ_1" if relative else "σ_i")
    return finish(ax, title, legend=True)


def energy_concentration(ax, layers, *, title: str | None = None):
    """Share of τ_t's energy in its top ⌊r/T⌋ directions and its top 5 %, mean over tasks, per matrix."""
    _need(layers, ["key", "energy_topk", "energy_top5"], "energy_concentration")
    x = _xticks(ax, layers["key"])
    ax.plot(x, 100 * layers["energy_topk"], marker=".", label="top ⌊r/T⌋ (TSV-M's rank budget)")
    ax.plot(x, 100 * layers["energy_top5"], marker=".", label="top 5 % of the directions")
    ax.set_ylim(0, 102)
    ax.set_ylabel("share of ‖τ_t‖² (%)")
    return finish(ax, title, legend=True)


def overlap_by_layer(ax, layers, *, title: str | None = None):
    """Overlap of tasks' top-k singular subspaces (mean cos²) per matrix, beside random ones (k/d)."""
    _need(layers, ["key", "overlap_topk", "overlap_random"], "overlap_by_layer")
    x = _xticks(ax, layers["key"])
    ax.plot(x, layers["overlap_topk"], marker=".", color="C4", label="tasks' top-k subspaces")
    ax.plot(x, layers["overlap_random"], ls="--", color="k", lw=1, label="random subspaces (k/d)")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("overlap (mean cos²)")
    return finish(ax, title, legend=True)


def show(fig, alt: str, *, name: str | None = None, folder=None, dpi: int = 110):
    """Display ``fig`` as an ``<img>`` with alt text ``alt`` (saved as ``<folder>/<name>.png`` too); closes it."""
    import base64
    import html
    import io

    import matplotlib.pyplot as plt
    from IPython.core.display import HTML
    from IPython.display import display

    if not isinstance(alt, str) or not alt.strip():
        raise InputError("show: give every figure a non-empty alt text that says what it shows")
    if name is not None and folder is not None:
        save_figure(fig, name, folder, dpi=dpi)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    display(HTML(f'<img alt="{html.escape(alt, quote=True)}" src="data:image/png;base64,{data}" '
                 'style="max-width:100%"/>'))
