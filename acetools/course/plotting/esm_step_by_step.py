"""Figures of notebook 03: pure functions ``(ax, data, ...) -> ax`` on the tables of
:mod:`acetools.course.esm_step_by_step`."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import InputError
from ...keys import short_label
from ...plotting import finish

#: Plot labels: ``visual.transformer.resblocks.3.mlp.c_fc.weight`` -> ``b3 c_fc``.
short_key = functools.partial(short_label, style="b")


def _check_columns(df, cols, what):
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise InputError(f"{what} needs columns {list(cols)}; missing {missing}")


def energy_curves_at_rank(ax, k: int, *, curves, r_max: int, data: str = "held-out"):
    """:func:`energy_curves` with the marker at rank ``k`` of ``r_max`` (the rank explorer's callback)."""
    return energy_curves(ax, curves, data=data, k_frac=k / r_max)


def energy_curves(ax, curves, *, data: str = "held-out", k_frac: float | None = None, title: str | None = None):
    """Mean activation-shift energy captured against the share of components kept (``esd_vs_svd``'s curves),
    one colour per layer type, ESD solid and SVD dashed; ``k_frac`` marks that retention."""
    _check_columns(curves, ["layer_type", "data", "frac", "esd", "svd"], "energy_curves")
    sub = curves[curves["data"] == data]
    if sub.empty:
        raise InputError(f"no rows with data == {data!r}; have {sorted(curves['data'].unique())}")
    for i, (lt, g) in enumerate(sub.groupby("layer_type", sort=False)):
        m = g.groupby("frac")[["esd", "svd"]].mean()
        x = 100 * m.index.to_numpy()
        ax.plot(x, 100 * m["esd"], color=f"C{i}", label=f"{lt} ESD")
        ax.plot(x, 100 * m["svd"], color=f"C{i}", ls="--", label=f"{lt} SVD")
    if k_frac is not None:
        ax.axvline(100 * k_frac, color="0.4", lw=1, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("components kept (% of rank)")
    ax.set_ylabel("energy captured (%)")
    ax.set_ylim(0, 101)
    return finish(ax, title or f"activation-shift energy ({data})", legend=True, fontsize=10)


def cka_bars(ax, table, *, data: str = "held-out", title: str | None = None):
    """Mean linear CKA of the rank-k reconstruction with the full shift, ESD vs SVD, per layer type and overall."""
    _check_columns(table, ["layer_type", "data", "cka_esd", "cka_svd"], "cka_bars")
    sub = table[table["data"] == data]
    if sub.empty:
        raise InputError(f"no rows with data == {data!r}")
    by = sub.groupby("layer_type", sort=False)[["cka_esd", "cka_svd"]].mean()
    by.loc["all layers"] = sub[["cka_esd", "cka_svd"]].mean()
    pos = np.arange(len(by))
    ax.bar(pos - 0.2, by["cka_esd"], 0.4, label="ESD")
    ax.bar(pos + 0.2, by["cka_svd"], 0.4, label="SVD")
    ax.set_xticks(pos, list(by.index), rotation=20, ha="right")
    ax.set_ylabel("linear CKA")
    lo = float(np.nanmin(by.to_numpy()))
    ax.set_ylim(max(0.0, lo - 0.5 * (1.0 - lo) - 0.005), 1.0 + 0.1 * (1.0 - lo) + 0.001)  # zoomed: CKAs sit near 1
    return finish(ax, title or f"CKA at the retention k ({data})", legend=True, fontsize=10)


def gram_image(ax, G, *, block: int | Sequence[int] | None = None, title: str | None = None,
               vmax: float | None = None):
    """A Gram matrix (e.g. P_cat^T P_cat) as an image centred at 0; ``block`` (the rank k, or each task's k_t)
    draws lines between the tasks' blocks."""
    G = np.asarray(G, dtype=float)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise InputError(f"gram_image needs a square matrix, got shape {G.shape}")
    v = float(np.abs(G).max()) if vmax is None else float(vmax)
    im = ax.imshow(G, cmap="RdBu_r", vmin=-v, vmax=v, interpolation="nearest")
    if block:
        ends = range(block, G.shape[0], block) if isinstance(block, int) else np.cumsum(list(block))[:-1]
        for b in ends:
            ax.axhline(b - 0.5, color="0.3", lw=0.4)
            ax.axvline(b - 0.5, color="0.3", lw=0.4)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks([])
    ax.set_yticks([])
    return finish(ax, title)


def task_factor_heatmap(ax, factors, *, title: str | None = None):
    """Inter-task factors s_t, a task x layer DataFrame (docs/methods.md §ESM, Eq. (ESM.4))."""
    import seaborn as sns

    data = factors.rename(columns=short_key)
    # numbers only where a cell can hold them legibly; the colour bar carries no label of its own
    # (the title names s_t), so it cannot run into the next panel's axis label
    sns.heatmap(data, ax=ax, cmap="vlag", center=1.0, annot=data.size <= 60, fmt=".2f", annot_kws={"size": 10})
    ax.set_xlabel("layer")
    ax.set_ylabel("task")
    ax.set_title(title or r"inter-task factors $s_t = (n_t / \bar n)^2$")
    return ax


def dimension_factor_plot(ax, factors: Mapping[str, Sequence[float]], *, title: str | None = None):
    """Inter-dimension factors c_j (label -> the layer's d_in factors), sorted descending, log scale."""
    for label, c in factors.items():
        c = np.sort(np.asarray(c, dtype=float))[::-1]
        ax.plot(np.arange(1, len(c) + 1), c, label=label)
    ax.axhline(1.0, color="0.4", lw=1, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("input dimension j (sorted)")
    ax.set_ylabel(r"$c_j$")
    return finish(ax, title or r"inter-dimension factors $c_j = (\Vert a_j \Vert / \mathrm{mean})^2$", legend=True,
                  fontsize=10)


def layer_factor_bars(ax, table, *, title: str | None = None):
    """Inter-layer factors beta per block (columns layer_type, block, beta), docs/methods.md §ESM, Eq. (ESM.10)."""
    _check_columns(table, ["layer_type", "block", "beta"], "layer_factor_bars")
    types = list(dict.fromkeys(table["layer_type"]))
    blocks = sorted(table["block"].unique())
    width = 0.8 / max(1, len(types))
    for i, lt in enumerate(types):
        g = table[table["layer_type"] == lt].set_index("block").reindex(blocks)
        ax.bar(np.arange(len(blocks)) + (i - (len(types) - 1) / 2) * width, g["beta"], width, label=lt)
    ax.axhline(1.0, color="0.4", lw=1, ls=":")
    ax.set_xticks(np.arange(len(blocks)), [f"block {b}" for b in blocks])
    ax.set_ylabel(r"$\beta_\ell$")
    top = float(np.nanmax(table["beta"].to_numpy(dtype=float))) if len(table) else 1.0
    ax.set_ylim(0, 1.45 * top)  # head room: the legend sits above the bars, not on them
    ax.legend(fontsize=10, loc="upper left", ncols=2, framealpha=0.9)
    default = r"inter-layer factors $\beta_\ell = (\Vert \Delta W_\ell \Vert / \mathrm{mean\ over\ type})^2$"
    return finish(ax, title or default)


def accuracy_bars(ax, values: Mapping[str, float], *, baseline: float | None = None, baseline_label: str = "baseline",
                  ylabel: str = "test accuracy (%)", title: str | None = None, noise: float | None = None,
                  reference: str | None = None):
    """Bars of ``values`` (label -> %), zoomed; a ``baseline`` line and a ±``noise`` band at ``values[reference]``."""
    labels, vals = list(values), np.array([float(v) for v in values.values()])
    pos = np.arange(len(vals))
    ax.bar(pos, vals, color=["C3" if lab == reference else "C0" for lab in labels])
    lo = [vals.min()] + ([baseline] if baseline is not None else [])
    hi = [vals.max()] + ([baseline] if baseline is not None else [])
    span = max(max(hi) - min(lo), 2.0)
    ax.set_ylim(max(0.0, min(lo) - span), min(100.0, max(hi) + 0.5 * span))
    if baseline is not None:
        ax.axhline(baseline, color="0.2", ls="--", lw=1, label=baseline_label)
        ax.legend(fontsize=10)
    if noise is not None and reference is not None:
        r = float(values[reference])
        ax.axhspan(r - noise, r + noise, color="C3", alpha=0.15, lw=0)
    ax.set_xticks(pos, labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    return finish(ax, title)


def ablation_bars(ax, df, *, value: str = "test_acc", hue: str = "suite", title: str | None = None,
                  ylabel: str | None = None):
    """Grouped bars of ``value`` per ablation variant (``runs_table`` rows), one colour per ``hue``."""
    _check_columns(df, ["variant", value, hue], "ablation_bars")
    variants = list(dict.fromkeys(df["variant"]))
    hues = list(dict.fromkeys(df[hue]))
    width = 0.8 / max(1, len(hues))
    for i, h in enumerate(hues):
        g = df[df[hue] == h].set_index("variant").reindex(variants)
        ax.bar(np.arange(len(variants)) + (i - (len(hues) - 1) / 2) * width, g[value], width, label=str(h))
    vals = df[value].to_numpy(dtype=float)
    span = max(np.nanmax(vals) - np.nanmin(vals), 2.0)
    top = np.nanmax(vals) + 0.3 * span
    ax.set_ylim(max(0.0, np.nanmin(vals) - 0.5 * span), min(100.0, top) if "acc" in value else top)
    ax.set_xticks(np.arange(len(variants)), variants, rotation=25, ha="right")
    ax.set_ylabel(ylabel or value)
    return finish(ax, title, legend=True, fontsize=10)


def search_traces(ax, runs, *, title: str | None = None):
    """Normalized validation accuracy against alpha of each run's search (``MethodRun``), the chosen alpha marked."""
    for i, r in enumerate(runs):
        tr = r.search.sort_values("alpha")
        ax.plot(tr["alpha"], 100 * tr["avg_normalized_top1"], marker=".", color=f"C{i % 10}", label=r.name)
        best = tr[tr["is_best"]]
        ax.plot(best["alpha"], 100 * best["avg_normalized_top1"], marker="*", ms=11, color=f"C{i % 10}", ls="")
    if all((r.search["alpha"] > 0).all() for r in runs):  # a log grid: ticks at the alphas tried
        ax.set_xscale("log")
        alphas = sorted({float(a) for r in runs for a in r.search["alpha"]})
        # a tick at every alpha tried, labelled where labels fit (TSV-M's 30-point grid would crowd them):
        # at most 9 labels, spread evenly in log alpha
        labelled = set(alphas)
        if len(alphas) > 9:
            targets = np.geomspace(alphas[0], alphas[-1], 9)
            labelled = {min(alphas, key=lambda a, t=t: abs(np.log(a / t))) for t in targets}
        ax.set_xticks(alphas, [f"{a:g}" if a in labelled else "" for a in alphas],
                      rotation=45 if len(labelled) > 4 else 0, ha="right" if len(labelled) > 4 else "center")
        ax.minorticks_off()
    ax.set_xlabel("alpha")
    ax.set_ylabel("val normalized accuracy (%)")
    return finish(ax, title or "alpha chosen on validation (star)", legend=True, fontsize=10)


def norm_order_bars(ax, table, *, title: str | None = None):
    """Mean normalized accuracy of the experts cut to ESM's budget in norm or reverse order (raw / equal norms),
    beside the ``none`` and ``all`` references (``norm_order_table``)."""
    _check_columns(table, ["order", "equal_norms", "normalized"], "norm_order_bars")
    m = table.groupby(["order", "equal_norms"], sort=False)["normalized"].mean()
    labels, vals, colors = [], [], []
    for (order, eq), v in m.items():
        lab = order if order in ("all", "none") else f"{order} ({'equal' if eq else 'raw'} norms)"
        labels.append(lab)
        vals.append(v)
        colors.append("0.6" if order in ("all", "none") else ("C0" if order == "norm" else "C1"))
    pos = np.arange(len(vals))
    ax.bar(pos, vals, color=colors)
    ax.set_xticks(pos, labels, rotation=20, ha="right")
    ax.set_ylabel("normalized accuracy on own task (%)")
    ax.set_title(title or "components loaded by norm order vs reverse")
    return ax
