"""Figures of notebook 02: pure functions ``(ax, data, ...) -> ax`` on the tables of
:mod:`acetools.course.ace_step_by_step` and :func:`acetools.diagnostics.heterogeneity_per_layer`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import InputKeyError
from ...keys import short_label, short_name  # short_label: ``...resblocks.3.mlp.c_fc.weight`` -> ``3.c_fc``
from ...plotting import finish


def _wants_log(values, ratio: float = 100.0) -> bool:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return v.size > 0 and v.max() / v.min() > ratio


def gamma_strip(ax, table, *, vit: float = 0.25, tau: float = 0.3, logy: bool | None = None, title: str | None = None):
    """gamma of every matrix, one column per layer type, against the paper's ViT line ``vit`` and ACE's
    gate ``tau``; ``logy=None``: log scale when gamma spans two decades."""
    missing = [c for c in ("layer_type", "gamma") if c not in table.columns]
    if missing:
        raise InputKeyError(f"gamma_strip: the table has no column {missing[0]!r} (columns: {list(table.columns)}); "
                       "pass acetools.diagnostics.heterogeneity_per_layer(...) or a table with layer_type and gamma")
    types = list(dict.fromkeys(table["layer_type"]))
    g = table["gamma"].to_numpy(dtype=float)
    x = np.array([types.index(t) for t in table["layer_type"]], dtype=float)
    # deterministic jitter: spread the points of a type evenly
    for t in types:
        idx = np.flatnonzero(table["layer_type"].to_numpy() == t)
        if idx.size > 1:
            x[idx] += np.linspace(-0.2, 0.2, idx.size)
    flag = g > tau
    ax.scatter(x[~flag], g[~flag], s=24, color="C0", label=f"gamma <= tau ({int((~flag).sum())})", zorder=3)
    ax.scatter(x[flag], g[flag], s=24, color="C3", label=f"flagged: gamma > tau ({int(flag.sum())})", zorder=3)
    ax.axhline(vit, color="C2", ls="--", lw=1, label=f"paper: ViT gamma < {vit}")
    ax.axhline(tau, color="k", ls=":", lw=1, label=f"gate tau = {tau} (RoBERTa above)")
    ax.set_xticks(range(len(types)), [short_name(t) for t in types], rotation=30, ha="right")
    if logy is None:
        logy = _wants_log(np.append(g, [vit, tau]))
    if logy:
        ax.set_yscale("log")
    ax.set_ylabel("heterogeneity gamma (eq. 7)")
    return finish(ax, title, legend=True)


def gamma_scaling(ax, df, *, tau: float = 0.3, title: str | None = None):
    """gamma of c·ΔW_t against the scale c (log-log; ``df``: scale, gamma), the gate tau and c = 1 marked."""
    d = df.sort_values("scale")
    ax.plot(d["scale"], d["gamma"], marker="o", ms=3, label="gamma(c·ΔW)")
    ax.axhline(tau, color="k", ls=":", lw=1, label=f"gate tau = {tau}")
    ax.axvline(1.0, color="C3", ls="--", lw=1, label="our weights (c = 1)")
    ax.set_xscale("log")
    if _wants_log(d["gamma"]):
        ax.set_yscale("log")
    ax.set_xlabel("scale c of every task vector")
    ax.set_ylabel("gamma")
    return finish(ax, title, legend=True)


def task_weights(ax, weights, *, title: str | None = None):
    """Each task's share of sum_t Sigma_tilde,t before (tr_t / sum tr) and after ACE's
    normalisation (``weights``: columns task, share_raw, share_used); line at 1/T."""
    n = len(weights)
    pos = np.arange(n)
    ax.bar(pos - 0.2, weights["share_raw"], width=0.4, label=r"raw: $\mathrm{tr}_t / \sum_s \mathrm{tr}_s$")
    ax.bar(pos + 0.2, weights["share_used"], width=0.4, label="as ACE used it")
    ax.axhline(1.0 / n, color="k", ls=":", lw=1, label="$1/T$")
    ax.set_xticks(pos, list(weights["task"]), rotation=45, ha="right")
    ax.set_ylabel("share of the summed covariance")
    ax.legend(fontsize=10, framealpha=0.9)
    return finish(ax, title)


def prior_profile(ax, profile, *, title: str | None = None):
    """The prior's column profile |c_j| against the diagonal of sum_t Sigma_tilde,t and the ridge, log
    scale, columns sorted by the diagonal. ``profile``: columns column, prior, cov_diag, ridge."""
    p = profile.sort_values("cov_diag", ascending=False).reset_index(drop=True)
    j = np.arange(len(p))
    c = p["prior"].to_numpy(dtype=float)
    ax.plot(j, p["cov_diag"], label=r"diag of $\sum_t \tilde\Sigma_t$")
    ax.plot(j, p["ridge"], ls="--", label=r"ridge on the diagonal ($\varepsilon I$)")
    pos, neg = c > 0, c < 0
    ax.scatter(j[pos], c[pos], s=8, marker="o", color="C2", label=r"$C_{\mathrm{agg}}$ column value $c_j > 0$")
    ax.scatter(j[neg], -c[neg], s=10, marker="x", color="C3", label=r"$|c_j|$, $c_j < 0$")
    ax.set_yscale("log")
    ax.set_xlabel("input column j (sorted by covariance diagonal)")
    ax.set_ylabel("value (log)")
    # a readable legend off the data: below the axes
    ax.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2, frameon=False)
    return finish(ax, title)


def spectra(ax, spectra: Mapping[str, Sequence[float]], *, top_frac: float | None = 0.05, logy: bool = True,
            title: str | None = None):
    """Singular values (descending) of several matrices, one line each; a line where the top ``top_frac`` ends."""
    r = 0
    for label, s in spectra.items():
        s = np.sort(np.asarray(s, dtype=float))[::-1]
        r = max(r, s.size)
        ax.plot(np.arange(1, s.size + 1), np.clip(s, 1e-16, None), label=label)
    if top_frac:
        k = max(1, int(np.ceil(top_frac * r)))
        ax.axvline(k, color="k", ls=":", lw=1, label=f"top {100 * top_frac:g}% (k = {k})")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("index i")
    ax.set_ylabel("singular value sigma_i")
    return finish(ax, title, legend=True)


def refined_spectrum(ax, pre: Sequence[float], refined: Mapping[int, Sequence[float]], k: int, *,
                     k_ace: int | None = None):
    """The rank slider's view: the spectrum of W_pre and of W_pre + sigma_iso(k) U_k V_kᵀ for
    the chosen ``k`` (``refined``: k -> singular values; log scale); ``k_ace`` marks ACE's own k."""
    k = int(k)
    if k not in refined:
        raise InputKeyError(
            f"no refined spectrum for k = {k}; have k in {sorted(refined)[:3]}...{sorted(refined)[-3:]}")
    pre_a = np.asarray(pre, dtype=float)
    s = np.asarray(refined[k], dtype=float)
    ax.plot(np.arange(1, pre_a.size + 1), np.clip(pre_a, 1e-16, None), color="C0", label="W_pre")
    ax.plot(np.arange(1, s.size + 1), np.clip(s, 1e-16, None), color="C1", label=f"refined, k = {k}")
    ax.axvline(k, color="C1", ls="--", lw=1)
    if k_ace is not None:
        ax.axvline(int(k_ace), color="k", ls=":", lw=1, label=f"ACE's k = {int(k_ace)}")
    ax.set_yscale("log")
    ax.set_xlabel("index i")
    ax.set_ylabel("singular value")
    ax.set_title(f"spectral refinement at rank k = {k}")
    ax.legend(fontsize=10)
    return ax


def layer_metrics(ax, table, columns: Mapping[str, str] | Sequence[str], *, hlines: Mapping[str, float] | None = None,
                  logy: bool = False, ylabel: str | None = None, title: str | None = None):
    """One marker line per column (names or {column: legend label}) of a per-layer table (``layer_table``),
    layers on the x axis; ``hlines``: {label: y} reference lines (e.g. the paper's numbers)."""
    cols = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}
    x = np.arange(len(table))
    for i, (c, label) in enumerate(cols.items()):
        ax.plot(x, table[c].to_numpy(dtype=float), marker="o", ms=4, lw=1, label=label, color=f"C{i}")
    for j, (label, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, color="k", ls=[":", "--", "-."][j % 3], lw=1, label=label)
    ax.set_xticks(x, [short_label(k) for k in table["key"]], rotation=60, ha="right", fontsize=10)
    if logy:
        ax.set_yscale("log")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return finish(ax, title)


def ablation_bars(ax, table, *, column: str = "test_normalized", reference: str = "ACE (full)", noise: float = 0.5,
                  title: str | None = None):
    """Horizontal bars of ``column`` per variant of an ``Ablation.table``, one colour per suite, with the
    band reference ± ``noise`` (differences inside it count as no effect)."""
    suites = list(dict.fromkeys(table["suite"]))
    variants = list(dict.fromkeys(table["variant"]))
    h = 0.8 / len(suites)
    for i, s in enumerate(suites):
        t = table[table["suite"] == s].set_index("variant")
        vals = [float(t.loc[v, column]) if v in t.index else np.nan for v in variants]
        pos = np.arange(len(variants)) + (i - (len(suites) - 1) / 2) * h
        ax.barh(pos, vals, height=h, color=f"C{i}", label=str(s))
        if reference in t.index:
            ref = float(t.loc[reference, column])
            ax.axvspan(ref - noise, ref + noise, color=f"C{i}", alpha=0.15)
    ax.set_yticks(np.arange(len(variants)), variants)
    ax.invert_yaxis()
    finite = table[column].to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size:
        lo, hi = finite.min(), finite.max()
        pad = max(1.0, 0.1 * (hi - lo))
        ax.set_xlim(lo - pad - noise, hi + pad + noise)
    ax.set_xlabel(
        {"test_normalized": "normalized test accuracy (%)", "test_acc": "test accuracy (%)"}.get(column, column)
    )
    ax.legend(fontsize=10, title="suite (band: full ACE ± noise)", title_fontsize=10)
    return finish(ax, title)


def eps_units(ax, table, *, paper_eps: float | None = 1e-5, default_eps: float | None = 1e-2,
              title: str | None = None):
    """ACE's normalized test accuracy against the ridge in the covariance's units, eps·d_in/tr (``eps_sweep``),
    one line per ``eps_mode``; the paper's (ViT) and the code's default eps marked."""
    for i, (mode, d) in enumerate(table.groupby("eps_mode", sort=False)):
        d = d.sort_values("ridge_rel")
        ax.plot(d["ridge_rel"], d["test_normalized"], "o-", color=f"C{i}", ms=4,
                label="absolute ε (the paper's)" if mode == "absolute" else "relative ε (eps_mode='relative')")
    ab = table[table["eps_mode"] == "absolute"]
    for eps, name, ls in ((paper_eps, "paper's ViT eps", "--"), (default_eps, "code default", ":")):
        row = ab[np.isclose(ab["eps"], eps)] if eps is not None else ab.iloc[:0]
        if len(row):
            ax.axvline(float(row["ridge_rel"].iloc[0]), color="0.4", ls=ls, lw=1, label=f"{name} {eps:g}")
    ax.set_xscale("log")
    ax.set_xlabel(r"ridge / mean eigenvalue of the covariance, $\rho = \varepsilon\, d_{\mathrm{in}} / \mathrm{tr}_t$")
    ax.set_ylabel("normalized test accuracy (%)")
    ax.legend(fontsize=10, loc="best", framealpha=0.9)
    return finish(ax, title)
