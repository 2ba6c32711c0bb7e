"""Notebook 01's experiments: Theorem 1 of ACE-Merging measured (docs/course.md §01_theorem1, docs/methods.md §ACE).

The lesson builds one estimate by hand; this module repeats it over synthetic configurations, the ViT's
layers (against hooked covariances) and the unified framework's estimators; its claims are judged below.

Figures of notebook 01: pure functions ``(ax, data, ...) -> ax`` on the frames above.

Notebook 01's claim verdicts: ace.theorem1, ace.theorem1_vit and ace.unified (docs/course.md
§Claim rules); the tables they read come from this module's experiments."""

from __future__ import annotations

import functools
import math
import operator
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from acetools.diagnostics import compare_covariances, layer_type
from acetools.errors import InputError, InputKeyError, InputTypeError
from acetools.files.activations import gram_matrices, input_covariances
from acetools.keys import block_index
from acetools.merging import merge
from acetools.merging.ace import estimate_covariance
from acetools.merging.wudi import wudi_grad
from acetools.plotting import finish, heatmap, track_drawing
from acetools.synthetic import RegressionTask, descend, finetune_linear, joint_least_squares, make_regression_tasks
from acetools.utils import cpu_threads, make_generator

from .verdicts import Verdict, threshold

# ---- Experiments: the tables and runs -------------------------------------------------------------

#: The columns of the lesson's tables: one configuration's tasks (:func:`estimate_experiment`), the
#: sweeps' medians (:func:`sweep`) and the ViT's layer types (:func:`vit_agreement`).
TABLE_METRICS = ("progress", "cosine", "cosine_sq", "subspace_overlap", "identity_cosine")
SWEEP_METRICS = ("progress", "cosine", "cosine_sq", "subspace_overlap")
VIT_METRICS = ("cosine", "cosine_sq", "subspace_overlap", "identity_cosine", "cross_task_cosine")
#: Plain headers for those columns (cosines have no unit; progress is a share of the base's error).
COLUMN_LABELS = {
    "progress": "training progress (share of error removed)",
    "cosine": "cos(Σ̂, Σ)",
    "cosine_sq": "cos(Σ̂, Σ²)",
    "subspace_overlap": "top-k eigenvector overlap",
    "identity_cosine": "cos(I, Σ): isotropic guess",
    "cross_task_cosine": "cos(Σ̂, other tasks' Σ)",
    "label": "covariance in the closed form",
    "test_acc": "test accuracy (%)",
    "test_normalized": "normalized test accuracy (%)",
}

#: What :func:`covariance_agreement` returns, in order.
AGREEMENT_COLUMNS = ("cosine", "cosine_sq", "subspace_overlap", "spectrum_pearson", "identity_cosine")

#: The default configuration of :func:`estimate_experiment` (Theorem 1's regime: SGD, one linear layer, early
#: training); a 2-layer net studies its first layer (``d_hidden`` rows, pre-activation sd ``gain``).
DEFAULTS: dict[str, Any] = {
    "n_tasks": 4,
    "d_in": 32,
    "d_out": 64,
    "d_hidden": 64,
    "subspace_dim": 6,
    "n_train": 2000,
    "steps": 50,
    "lr": 0.02,
    "batch_size": 64,
    "noise": 0.05,
    "optimizer": "sgd",
    "activation": "none",
    "gain": 1.0,
    "seed": 0,
}
_ACTIVATIONS = ("none", "linear", "tanh", "relu")

#: Columns of :func:`estimate_experiment` and :func:`sweep`: knob and value, task, configuration, ``progress``
#: (share of the base's noiseless test error E||f(x) - f*(x)||² removed: 0 untrained, 1 converged), ``k``, agreement.
SWEEP_COLUMNS = ("param", "value", "task", *DEFAULTS, "progress", "k", *AGREEMENT_COLUMNS)

#: Labels of the unified framework's rows (:func:`unified_merges`).
ESTIMATOR_LABELS = {
    "identity": "identity (= weight averaging)",
    "wudi": "WUDI estimator",
    "ace": "ACE estimator",
    "given": "true covariance (RegMean-like)",
    "ace_full": "ACE (full method)",
}


# --------------------------------------------------------------------------- comparing


def _sym(M: Tensor) -> Tensor:
    M = M.double()
    return (M + M.T) / 2


def matrix_cosine(A: Tensor, B: Tensor) -> float:
    """<A, B>_F / (||A||_F ||B||_F) of two equally shaped matrices (NaN if either is zero)."""
    if A.shape != B.shape:
        raise InputError(f"matrix_cosine: shapes {tuple(A.shape)} and {tuple(B.shape)} differ")
    A, B = A.double(), B.double()
    den = float(torch.linalg.matrix_norm(A) * torch.linalg.matrix_norm(B))
    return float((A * B).sum()) / den if den > 0 else math.nan


def covariance_agreement(Sigma_hat: Tensor, Sigma: Tensor, k: int | None = None, *,
                         eigen: bool = True) -> dict[str, float]:
    """How well ``Sigma_hat`` matches the true ``Sigma`` (d × d), scale-free: ``cosine``, ``cosine_sq``
    (with Sigma²), ``subspace_overlap`` and ``spectrum_pearson`` (:func:`acetools.diagnostics.compare_covariances`,
    top ``k``; NaN with ``eigen=False``), ``identity_cosine`` (the isotropic guess's, the bar to clear) and ``k``."""
    for what, M in (("Sigma_hat", Sigma_hat), ("Sigma", Sigma)):
        if not isinstance(M, Tensor) or M.ndim != 2 or M.shape[0] != M.shape[1]:
            raise InputError(f"{what} must be a square matrix, got {getattr(M, 'shape', type(M).__name__)}")
    A, S = _sym(Sigma_hat), _sym(Sigma)
    eye = torch.eye(S.shape[0], dtype=torch.float64, device=S.device)
    out = {"cosine": matrix_cosine(A, S), "cosine_sq": matrix_cosine(A, S @ S), "subspace_overlap": math.nan,
           "spectrum_pearson": math.nan, "identity_cosine": matrix_cosine(eye, S), "k": math.nan}
    if eigen:
        c = compare_covariances(A, S, k)
        out.update(cosine=c.cosine, subspace_overlap=c.subspace_overlap, spectrum_pearson=c.spectrum_pearson, k=c.k)
    return out


# --------------------------------------------------------------------------- 2-layer networks


def _phi(activation: str) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """(phi, phi') of an activation, phi' written in terms of the pre-activation z."""
    if activation == "linear":
        return (lambda z: z), (lambda z: torch.ones_like(z))
    if activation == "tanh":
        return torch.tanh, (lambda z: 1 - torch.tanh(z) ** 2)
    if activation == "relu":
        return torch.relu, (lambda z: (z > 0).to(z.dtype))
    raise InputError(f"activation={activation!r} must be one of ['linear', 'tanh', 'relu']")


def two_layer_teacher(task: RegressionTask, d_hidden: int, activation: str, *, gain: float = 1.0,
                      shift: float = 1.0, seed: int = 0,
                      base: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A 2-layer task ``y = W2* phi(W1* x) + noise``: ``(W1_0, W2_0, Y_train, F_test)``, the base drawn from
    ``seed`` unless given (pre-activation sd ≈ ``gain``), the teacher ``shift``-scaled away from it."""
    phi, _ = _phi(activation)
    d_in, d_out = task.Sigma.shape[0], task.W_star.shape[0]
    s1 = gain / float(torch.trace(task.Sigma)) ** 0.5
    if base is None:
        g = make_generator(seed)
        W1_0 = s1 * torch.randn(d_hidden, d_in, generator=g, dtype=torch.float64)
        W2_0 = torch.randn(d_out, d_hidden, generator=g, dtype=torch.float64) / d_hidden**0.5
    else:
        W1_0, W2_0 = base
    g = make_generator(seed + 1)
    W1 = W1_0 + shift * s1 * torch.randn(W1_0.shape, generator=g, dtype=torch.float64)
    W2 = W2_0 + shift * torch.randn(W2_0.shape, generator=g, dtype=torch.float64) / W2_0.shape[1] ** 0.5

    def teacher(X: Tensor) -> Tensor:
        return phi(X @ W1.T) @ W2.T

    noise = task.noise * torch.randn(task.X_train.shape[0], d_out, generator=g, dtype=torch.float64)
    return W1_0, W2_0, teacher(task.X_train) + noise, teacher(task.X_test)


def finetune_two_layer(W1: Tensor, W2: Tensor, X: Tensor, Y: Tensor, *, activation: str = "tanh",
                       steps: int = 200, lr: float = 0.05, batch_size: int = 64, optimizer: str = "sgd",
                       seed: int = 0, betas: tuple[float, float] = (0.9, 0.999)) -> tuple[Tensor, Tensor]:
    """Fine-tune both layers of ``x -> W2 phi(W1 x)`` by SGD or Adam (:func:`acetools.synthetic.descend`):
    dW1 = 2 E[(W2ᵀ e ⊙ phi'(W1 x)) xᵀ] depends on x and W2, what Theorem 1's linear layer leaves out."""
    phi, dphi = _phi(activation)

    def gradient(params: list[Tensor], Xb: Tensor, Yb: Tensor) -> list[Tensor]:
        A, B = params
        Z = Xb @ A.T
        H = phi(Z)
        E = 2.0 * (H @ B.T - Yb) / Xb.shape[0]  # d loss / d output, per row
        return [((E @ B) * dphi(Z)).T @ Xb, E.T @ H]

    W1, W2 = descend([W1, W2], gradient, X, Y, steps=steps, lr=lr, batch_size=batch_size, optimizer=optimizer,
                     seed=seed, betas=betas)
    return W1, W2


# --------------------------------------------------------------------------- synthetic sweeps


def _config(overrides: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise InputTypeError(f"unknown setting(s) {unknown}; valid settings: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **overrides}
    for name in ("n_tasks", "d_in", "d_out", "d_hidden", "subspace_dim", "n_train", "steps", "batch_size"):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{name}={v!r} must be a positive int")
    for name in ("lr", "gain"):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise InputError(f"{name}={v!r} must be a positive number")
    if isinstance(cfg["noise"], bool) or not isinstance(cfg["noise"], (int, float)) or cfg["noise"] < 0:
        raise InputError(f"noise={cfg['noise']!r} must be a number >= 0")
    if cfg["optimizer"] not in ("sgd", "adam"):
        raise InputError(f"optimizer={cfg['optimizer']!r} must be 'sgd' or 'adam'")
    if cfg["activation"] not in _ACTIVATIONS:
        raise InputError(f"activation={cfg['activation']!r} must be one of {list(_ACTIVATIONS)}")
    if cfg["subspace_dim"] > cfg["d_in"]:
        raise InputError(f"subspace_dim={cfg['subspace_dim']} must be <= d_in={cfg['d_in']}")
    return cfg


def _noiseless_loss(M: Tensor, task: RegressionTask) -> float:
    """The linear map M's test error without the label noise: E||(M - W*) x||² = tr(D Sigma Dᵀ), D = M - W*."""
    D = M - task.W_star
    return float(torch.trace(D @ task.Sigma @ D.T))


def _two_layer_loss(A: Tensor, B: Tensor, X: Tensor, Y: Tensor, phi: Callable[[Tensor], Tensor]) -> float:
    """Test MSE of the 2-layer net (A, B) against the noiseless teacher outputs ``Y``."""
    return float(((phi(X @ A.T) @ B.T - Y) ** 2).sum(1).mean())


@overload
def estimate_experiment(*, k: int | None = None, return_estimates: Literal[False] = False,
                        **settings: Any) -> pd.DataFrame: ...
@overload
def estimate_experiment(*, k: int | None = None, return_estimates: Literal[True],
                        **settings: Any) -> tuple[pd.DataFrame, list[Tensor], list[Tensor]]: ...
@cpu_threads(None, env_default=True)  # ACETOOLS_NUM_THREADS, as the mini-world's training
def estimate_experiment(*, k: int | None = None, return_estimates: bool = False, **settings: Any):
    """Fine-tune one configuration's tasks (``settings`` over :data:`DEFAULTS`) and compare each Sigma_hat_t
    with Sigma_t: one row per task (:data:`SWEEP_COLUMNS`); ``return_estimates`` adds both lists of matrices."""
    cfg = _config(settings)
    k = cfg["subspace_dim"] if k is None else k
    W0, tasks = make_regression_tasks(cfg["n_tasks"], cfg["d_in"], cfg["d_out"], n_train=cfg["n_train"], n_val=1,
                                      subspace_dim=cfg["subspace_dim"], noise=cfg["noise"], seed=cfg["seed"])
    fit = {"steps": cfg["steps"], "lr": cfg["lr"], "batch_size": cfg["batch_size"], "optimizer": cfg["optimizer"]}
    rows, estimates, truths = [], [], []
    shared: tuple[Tensor, Tensor] | None = None
    for i, task in enumerate(tasks):
        seed = cfg["seed"] + 1000 + i
        if cfg["activation"] == "none":
            W = finetune_linear(W0, task.X_train, task.Y_train, seed=seed, **fit)
            delta = W - W0
            before, after = _noiseless_loss(W0, task), _noiseless_loss(W, task)
        else:
            act = cfg["activation"]
            W1_0, W2_0, Y_tr, F_te = two_layer_teacher(task, cfg["d_hidden"], act, gain=cfg["gain"],
                                                       seed=cfg["seed"] + 100 * i, base=shared)
            shared = (W1_0, W2_0)  # one pretrained base for every task
            W1, W2 = finetune_two_layer(W1_0, W2_0, task.X_train, Y_tr, activation=act, seed=seed, **fit)
            delta = W1 - W1_0
            phi, _ = _phi(act)

            before = _two_layer_loss(W1_0, W2_0, task.X_test, F_te, phi)
            after = _two_layer_loss(W1, W2, task.X_test, F_te, phi)
        if not torch.isfinite(delta).all():  # SGD diverged (lr too large for this setting)
            warnings.warn(f"task {i}: training diverged with {fit}; its row is NaN", RuntimeWarning, stacklevel=2)
            S_hat = torch.full((cfg["d_in"], cfg["d_in"]), math.nan, dtype=torch.float64)
            agree = dict.fromkeys(AGREEMENT_COLUMNS, math.nan) | {"k": k}
            before, after = 1.0, math.nan
        else:
            S_hat = estimate_covariance(delta)
            agree = covariance_agreement(S_hat, task.Sigma, k)
        rows.append({"param": "", "value": None, "task": i, **cfg,
                     "progress": 1.0 - after / before if before > 0 else math.nan, **agree})
        estimates.append(S_hat)
        truths.append(task.Sigma)
    df = pd.DataFrame(rows, columns=list(SWEEP_COLUMNS))
    return (df, estimates, truths) if return_estimates else df


def sweep(param: str, values: Sequence[Any], *, k: int | None = None, **settings: Any) -> pd.DataFrame:
    """:func:`estimate_experiment` for each of ``values`` of the setting ``param`` (the others: ``settings``
    over :data:`DEFAULTS`): one row per (value, task), :data:`SWEEP_COLUMNS`. Plot with ``x=param``."""
    if param not in DEFAULTS:
        raise InputError(f"param={param!r} is not a setting; choose one of {sorted(DEFAULTS)}")
    if param in settings:
        raise InputTypeError(f"{param!r} is swept; do not also pass it as a fixed setting")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise InputError(f"values must be a non-empty list of {param} values, got {values!r}")
    frames = []
    for v in values:
        df = estimate_experiment(k=k, **{**settings, param: v})
        df["param"], df["value"] = param, v
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def spectra_frame(matrices: Mapping[str, Tensor]) -> pd.DataFrame:
    """Eigenvalues of each named symmetric matrix, descending, over the largest: long DataFrame
    ``source, index, eigenvalue`` (the shape of the spectrum is what Theorem 1 is about)."""
    rows = []
    for name, M in matrices.items():
        lam = torch.linalg.eigvalsh(_sym(M)).flip(0).clamp(min=0)
        top = float(lam[0])
        if top <= 0:
            raise InputError(f"spectra_frame: {name!r} has no positive eigenvalue")
        rows += [{"source": name, "index": i + 1, "eigenvalue": float(v) / top} for i, v in enumerate(lam)]
    return pd.DataFrame(rows, columns=["source", "index", "eigenvalue"])


# --------------------------------------------------------------------------- the mini-world's ViT


def hooked_covariances(zoo, keys: Sequence[str], *, n_images: int = 256, source: str = "expert",
                       kind: str = "covariance", split: str = "train",
                       batch_size: int = 128) -> list[dict[str, Tensor]]:
    """True input covariances of ``keys`` per task, hooked in the expert's (or base's) encoder over ``n_images``
    of ``split``: centred, or ``kind="gram"`` (RegMean's (1/N) XᵀX). ``attn.out_proj`` cannot be hooked."""
    if source not in ("expert", "base"):
        raise InputError(f"source={source!r} must be 'expert' or 'base'")
    if kind not in ("covariance", "gram"):
        raise InputError(f"kind={kind!r} must be 'covariance' or 'gram'")
    if isinstance(n_images, bool) or not isinstance(n_images, int) or n_images < 2:
        raise InputError(f"n_images={n_images!r} must be an int >= 2")
    reader = input_covariances if kind == "covariance" else gram_matrices
    out = []
    base_enc = zoo.encoder(zoo.base_state()) if source == "base" else None
    for t in zoo.tasks:
        x = torch.as_tensor(np.asarray(zoo.split(t, split).x[:n_images]))
        enc = base_enc if base_enc is not None else zoo.encoder(zoo.expert_state(t))
        out.append(reader(enc, x, keys, batch_size=batch_size))
    return out


def vit_agreement(base: Mapping[str, Tensor], experts: Sequence[Mapping[str, Tensor]],
                  covariances: Sequence[Mapping[str, Tensor]], *, tasks: Sequence[str] | None = None,
                  keys: Sequence[str] | None = None, k: int | None = None, eigen: bool = True) -> pd.DataFrame:
    """Sigma_hat_t of each layer against the hooked Sigma_t: one row per (task, key), :data:`AGREEMENT_COLUMNS`
    and ``cross_task_cosine`` (against the other tasks'); ``eigen=False`` skips the eigendecompositions."""
    if len(experts) != len(covariances):
        raise InputError(f"{len(experts)} experts but {len(covariances)} covariance dicts; pass one per expert")
    names = list(tasks) if tasks is not None else [str(i) for i in range(len(experts))]
    if len(names) != len(experts):
        raise InputError(f"{len(names)} task names for {len(experts)} experts")
    keys = list(keys) if keys is not None else list(covariances[0])
    rows = []
    for key in keys:
        for t, c in enumerate(covariances):
            if key not in c:
                raise InputKeyError(f"covariances[{t}] has no entry for {key!r}")
        for t, (name, ex) in enumerate(zip(names, experts)):
            S_hat = estimate_covariance(ex[key].double() - base[key].double())
            agree = covariance_agreement(S_hat, covariances[t][key], k, eigen=eigen)
            others = [matrix_cosine(S_hat, covariances[s][key]) for s in range(len(experts)) if s != t]
            rows.append({"task": name, "key": key, "block": block_index(key, default=-1), "layer_type": layer_type(key),
                         "d_in": S_hat.shape[0], **agree,
                         "cross_task_cosine": sum(others) / len(others) if others else math.nan})
    cols = ["task", "key", "block", "layer_type", "d_in", *AGREEMENT_COLUMNS, "k", "cross_task_cosine"]
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- the unified framework


def estimator_covariances(base: Mapping[str, Tensor], experts: Sequence[Mapping[str, Tensor]],
                          keys: Sequence[str], estimator: str, *,
                          given: Sequence[Mapping[str, Tensor]] | None = None,
                          rescale: bool = True) -> list[dict[str, Tensor]]:
    """Sigma_t per key for one estimator (``"identity"``, ``"wudi"``, ``"ace"`` or ``"given"``), one dict per expert;
    ``rescale`` divides a layer's T matrices by their mean trace / d_in (eps then means the same for all)."""
    if estimator not in ("identity", "wudi", "ace", "given"):
        raise InputError(f"estimator={estimator!r} must be 'identity', 'wudi', 'ace' or 'given'")
    if estimator == "given" and given is None:
        raise InputError("estimator='given' needs given=[{key: Sigma_t}, ...], one dict per expert")
    if given is not None and len(given) != len(experts):
        raise InputError(f"given has {len(given)} dicts for {len(experts)} experts")
    out: list[dict[str, Tensor]] = [{} for _ in experts]
    for key in keys:
        if estimator == "given" and given is not None:  # (given is checked above)
            mats = [given[t][key].double() for t in range(len(experts))]
        else:
            mats = [estimate_covariance(ex[key].double() - base[key].double(), estimator) for ex in experts]
        if rescale:
            d = mats[0].shape[0]
            scale = sum(float(torch.trace(M)) for M in mats) / (len(mats) * d)
            if scale > 0:
                mats = [M / scale for M in mats]
        for t, M in enumerate(mats):
            out[t][key] = M
    return out


def unified_merges(base: Mapping[str, Tensor], experts: Sequence[Mapping[str, Tensor]], keys: Sequence[str], *,
                   given: Sequence[Mapping[str, Tensor]] | None = None, eps: float = 1e-4,
                   estimators: Sequence[str] = ("identity", "wudi", "ace", "given", "ace_full"),
                   ace_hparams: Mapping[str, Any] | None = None) -> dict[str, dict[str, Tensor]]:
    """``{estimator: state}``: every estimator through one closed form (``merge("ace", estimator="given",
    ...)``, raw numerator, no prior, no gate) on ``keys``, the rest averaged; ``"ace_full"`` is ACE as
    registered (``ace_hparams``), for reference."""
    unknown = [e for e in estimators if e not in ESTIMATOR_LABELS]
    if unknown:
        raise InputError(f"unknown estimator(s) {unknown}; choose from {list(ESTIMATOR_LABELS)}")
    keyset = set(keys)
    missing = sorted(keyset - set(base))
    if missing:
        raise InputKeyError(f"base has no key {missing[0]!r}")
    out = {}
    for e in estimators:
        if e == "ace_full":
            out[e] = merge("ace", base, list(experts), **dict(ace_hparams or {}))
            continue
        covs = estimator_covariances(base, experts, keys, e, given=given)
        out[e] = merge("ace", base, list(experts), is_matrix=lambda key, _tensor: key in keyset, estimator="given",
                       covariances=covs, eps=eps)
    return out


@dataclass
class UnifiedResult:
    """What :func:`unified_linear` returns."""

    table: pd.DataFrame  # method, label, loss, gain, cosine
    W0: Tensor  # the base map
    experts: list[Tensor]  # the fine-tuned maps W_t
    merged: dict[str, Tensor]  # method -> merged map W0 + W_bar (and the references)
    Sigma: list[Tensor]  # the true input covariances


@cpu_threads(None, env_default=True)  # ACETOOLS_NUM_THREADS, as the mini-world's training
def unified_linear(*, eps: float = 1e-4, **settings: Any) -> UnifiedResult:
    """The unified framework on linear tasks: :func:`unified_merges` scored by the noiseless test error and
    the normalized gain, beside ``base``, ``experts`` and ``joint least squares``."""
    cfg = _config(settings)
    if cfg["activation"] != "none":
        raise InputError("unified_linear merges one linear layer: activation must be 'none'")
    W0, tasks = make_regression_tasks(cfg["n_tasks"], cfg["d_in"], cfg["d_out"], n_train=cfg["n_train"], n_val=1,
                                      subspace_dim=cfg["subspace_dim"], noise=cfg["noise"], seed=cfg["seed"])
    fit = {"steps": cfg["steps"], "lr": cfg["lr"], "batch_size": cfg["batch_size"], "optimizer": cfg["optimizer"]}
    Ws = [finetune_linear(W0, t.X_train, t.Y_train, seed=cfg["seed"] + 1000 + i, **fit) for i, t in enumerate(tasks)]
    key = "W"
    base, experts = {key: W0}, [{key: W} for W in Ws]
    truth = [{key: t.Sigma} for t in tasks]
    merged = {e: s[key] for e, s in unified_merges(base, experts, [key], given=truth, eps=eps).items()}
    maps = {"base": W0, "experts": None, **merged, "joint least squares": joint_least_squares(tasks)}

    def errors(W: Tensor | None) -> list[float]:
        return [_noiseless_loss(Wt if W is None else W, t) for Wt, t in zip(Ws, tasks)]

    L_base, L_exp = errors(W0), errors(None)
    rows = []
    for name, W in maps.items():
        L = errors(W)
        gain = [100 * (b - x) / (b - e) if b != e else math.nan for b, e, x in zip(L_base, L_exp, L)]
        cos = math.nan
        if name in ("identity", "wudi", "ace", "given"):
            est = estimator_covariances(base, experts, [key], name, given=truth, rescale=False)
            cos = sum(matrix_cosine(c[key], t.Sigma) for c, t in zip(est, tasks)) / len(tasks)
        rows.append({"method": name, "label": ESTIMATOR_LABELS.get(name, name), "loss": sum(L) / len(L),
                     "gain": sum(gain) / len(gain), "cosine": cos})
    table = pd.DataFrame(rows, columns=["method", "label", "loss", "gain", "cosine"])
    return UnifiedResult(table, W0, Ws, {k: v for k, v in maps.items() if v is not None}, [t.Sigma for t in tasks])


# --------------------------------------------------------------------------- the lesson's settings
#: The knobs notebook 01 sweeps, and their values (full profile).
GRIDS: dict[str, list] = {
    "steps": [3, 10, 30, 100, 300, 1000, 3000],
    "lr": [0.001, 0.003, 0.01, 0.03, 0.1],
    "d_out": [8, 16, 32, 64, 128, 256],
    "d_in": [8, 16, 32, 64, 128],
    "noise": [0.0, 0.1, 0.3, 1.0, 3.0],
    "batch_size": [1, 4, 16, 64, 256],
}
#: The same knobs on coarser grids (quick profile).
QUICK_GRIDS: dict[str, list] = {"steps": [3, 30, 300], "lr": [0.003, 0.03], "d_out": [8, 64], "d_in": [8, 16],
                                "noise": [0.0, 1.0], "batch_size": [4, 64]}
#: Training lengths of the degradation curves (full / quick profile).
CURVE_STEPS: list[int] = [3, 10, 30, 100, 300, 1000]
QUICK_CURVE_STEPS: list[int] = [3, 30, 300]


def degradation_models(adam_lr: float) -> dict[str, dict[str, Any]]:
    """The models of the degradation study: :func:`estimate_experiment` overrides by name."""
    return {
        "linear layer, SGD": {},
        "linear layer, Adam": {"optimizer": "adam", "lr": adam_lr},
        "2-layer linear": {"activation": "linear"},
        "2-layer tanh": {"activation": "tanh"},
        "2-layer ReLU": {"activation": "relu"},
    }


def settings(*, quick: bool, n_tasks: int, d_in: int, d_out: int, seed: int, theorem_steps: int
             ) -> tuple[dict[str, Any], dict[str, list], list[int], dict[str, Any]]:
    """Notebook 01's synthetic setting: ``(synth, grids, curve_steps, regime)``, ``regime`` being ``synth`` at
    ``theorem_steps`` SGD steps (Theorem 1's regime)."""
    if quick:
        synth = dict(n_tasks=2, d_in=16, d_out=32, d_hidden=32, subspace_dim=4, n_train=500, seed=seed)
        grids, curve = {k: list(v) for k, v in QUICK_GRIDS.items()}, list(QUICK_CURVE_STEPS)
    else:
        synth = dict(n_tasks=n_tasks, d_in=d_in, d_out=d_out, d_hidden=d_out, seed=seed)
        grids, curve = {k: list(v) for k, v in GRIDS.items()}, list(CURVE_STEPS)
    return synth, grids, curve, dict(synth, steps=theorem_steps)


# --------------------------------------------------------------------------- checks of the unified framework


def synthetic_checks(exact: UnifiedResult) -> dict[str, float]:
    """The framework's equivalences on an ``eps=0`` :func:`unified_linear` result (max errors; WUDI's relative)."""
    taus = [W - exact.W0 for W in exact.experts]
    err_identity = float((exact.merged["identity"] - exact.W0 - sum(taus) / len(taus)).abs().max())
    A = functools.reduce(operator.add, exact.Sigma)  # sum_t Sigma_t (the same additions as sum())
    B = functools.reduce(operator.add, (W @ S for W, S in zip(exact.experts, exact.Sigma)))
    jls_experts = torch.linalg.solve(A.T, B.T).T
    err_given = float((exact.merged["given"] - jls_experts).abs().max())
    g_wudi = wudi_grad(exact.merged["wudi"] - exact.W0, taus)  # WUDI's loss gradient (docs/methods.md §WUDI)
    rel = float(g_wudi.norm() / wudi_grad(torch.zeros_like(taus[0]), taus).norm())
    return {"identity_synthetic": err_identity, "given_jls": err_given, "wudi_gradient": rel}


def identity_errors(base: Mapping[str, Tensor], experts: Sequence[Mapping[str, Tensor]],
                    identity_route: Mapping[str, Tensor]) -> dict[str, float]:
    """Max abs difference from weight averaging of ``merge("ace", estimator="identity")`` (``identity_vit``)
    and of the unified route's identity row (``identity_route``), over the whole state dict."""
    wa = merge("weight_averaging", base, experts)
    ace_identity = merge("ace", base, experts, estimator="identity")
    return {"identity_vit": max(float((ace_identity[k].double() - wa[k].double()).abs().max()) for k in wa),
            "identity_route": max(float((identity_route[k].double() - wa[k].double()).abs().max()) for k in wa)}


def unified_accuracy(bench, merged: Mapping[str, Mapping[str, Tensor]], labels: Mapping[str, str]) -> pd.DataFrame:
    """Test accuracy of the base and every merge of ``merged`` on ``bench`` (means over tasks, %)."""
    accs = {m: bench.evaluate(state, "test") for m, state in {"base": bench.base, **merged}.items()}
    return pd.DataFrame([{"method": m, "label": labels[m], "test_acc": 100 * pd.Series(a).mean(),
                          "test_normalized": 100 * pd.Series(bench.normalized(a, "test")).mean()}
                         for m, a in accs.items()])


# ---- Figures: the lesson's plots, drawn on a given axes -------------------------------------------

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
    """Normalised eigenvalues (:func:`spectra_frame`) per ``source``, log scale."""
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
    """Median over tasks of each metric against one swept knob (``param``) of a :func:`sweep`
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
    """Layers × tasks heatmap of ``value`` from :func:`vit_agreement` (0–1 scale)."""
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


# ---- Verdicts: the lesson's claims, judged --------------------------------------------------------

#: ace.theorem1 / ace.theorem1_vit: the levels of the median cosine (docs/course.md §Claim rules).
COSINE_REPRODUCED: float = 0.9


COSINE_PARTLY: float = 0.7


#: ace.theorem1_vit, partly: the estimate beats the isotropic guess I in at least this share of
#: the layer × task cells (it carries covariance information where it is not proportional).
BEATS_IDENTITY: float = 0.5


#: ace.unified: the equivalences are exact, so they hold to numerical precision (float32 merges
#: on the mini-world, float64 on the synthetic layer).
TOLERANCES: dict[str, float] = {"identity_vit": 1e-6, "identity_synthetic": 1e-10, "wudi_gradient": 1e-8,
                                "given_jls": 1e-8}


def median_cosine(frame: pd.DataFrame, column: str = "cosine", **where: Any) -> float:
    """The median of ``column`` over the rows of ``frame`` where every ``col == value`` of ``where`` holds."""
    sel = frame
    for k, v in where.items():
        sel = sel[sel[k] == v]
    if sel.empty:
        raise InputError(f"no rows where {where}")
    return float(sel[column].median())


def verdict_theorem1(regime: pd.DataFrame, curves: pd.DataFrame, adam: pd.DataFrame, *, steps: int) -> Verdict:
    """ace.theorem1 (rule: docs/course.md §Claim rules) on ``regime`` (``estimate_experiment``);
    ``curves`` (``sweep`` with a ``model`` column) and ``adam`` are the degradations reported with it."""
    cos, cos_sq = median_cosine(regime), median_cosine(regime, "cosine_sq")
    overlap, identity = median_cosine(regime, "subspace_overlap"), median_cosine(regime, "identity_cosine")
    last = int(curves["steps"].max())
    converged = median_cosine(curves, model="linear layer, SGD", steps=last)
    relu = median_cosine(curves, model="2-layer ReLU", steps=last)
    cos_adam = median_cosine(adam)
    measured = (f"SGD, linear layer, {steps} steps: median cos(Σ̂, Σ) = {cos:.3f} (cos with Σ² {cos_sq:.3f}, top-k "
                f"overlap {overlap:.3f}, isotropic guess {identity:.3f}); after {last} steps {converged:.3f}; "
                f"Adam {cos_adam:.3f}; 2-layer ReLU after {last} steps {relu:.3f}")
    reason = (f"threshold {COSINE_REPRODUCED} (partly {COSINE_PARTLY}) on the median cosine in the Theorem's regime; "
              + ("there the estimate tracks Σ² more closely than Σ (the first-order prediction); "
                 if cos_sq > cos else "")
              + f"it falls to {converged:.2f} when the expert converges (isotropic guess {identity:.2f})")
    nums = {"cosine": cos, "cosine_sq": cos_sq, "subspace_overlap": overlap, "identity_cosine": identity,
            "cosine_converged": converged, "cosine_adam": cos_adam, "cosine_relu": relu, "steps": steps}
    return Verdict(measured, threshold(cos, COSINE_REPRODUCED, COSINE_PARTLY), reason, nums, value=cos)


def verdict_theorem1_vit(vit: pd.DataFrame, *, vit_base: pd.DataFrame, vit_gram: pd.DataFrame, n_images: int,
                         suite: str, size: str) -> Verdict:
    """ace.theorem1_vit (rule: docs/course.md §Claim rules) from ``vit_agreement`` tables
    (``vit``; ``vit_base`` and ``vit_gram`` beside)."""
    med_type = vit.groupby("layer_type", sort=False)["cosine"].median()
    beats_identity = float((vit["cosine"] > vit["identity_cosine"]).mean())
    beats_cross = float((vit["cosine"] > vit["cross_task_cosine"]).mean())
    if (med_type >= COSINE_REPRODUCED).all():
        verdict = "reproduced"
    elif beats_identity >= BEATS_IDENTITY:
        verdict = "partly"
    else:
        verdict = "not reproduced"
    per_type = ", ".join(f"{str(t).replace('.weight', '').replace('_weight', '')} {v:.2f}" for t, v in med_type.items())
    measured = (f"median cos(Σ̂, hooked Σ) per layer type: {per_type}; isotropic guess "
                f"{vit['identity_cosine'].median():.2f}; beats I in {100 * beats_identity:.0f}% and other tasks' Σ in "
                f"{100 * beats_cross:.0f}% of {len(vit)} layer×task cells")
    reason = (f"thresholds: median ≥ {COSINE_REPRODUCED} in every type → reproduced; beats I in ≥ "
              f"{100 * BEATS_IDENTITY:.0f}% of cells → partly ({size} ViT, experts trained with AdamW, {n_images} "
              "images per task)")
    nums = {"median_cosine": {t: float(v) for t, v in med_type.items()},
            "identity_cosine": float(vit["identity_cosine"].median()),
            "cross_task_cosine": float(vit["cross_task_cosine"].median()), "beats_identity": beats_identity,
            "beats_cross": beats_cross, "base_input_cosine": float(vit_base["cosine"].median()),
            "gram_cosine": float(vit_gram["cosine"].median()), "n_images": n_images, "suite": suite, "size": size}
    return Verdict(measured, verdict, reason, nums, value=float(vit["cosine"].median()))


def verdict_unified(checks: Mapping[str, float], vit_unified: pd.DataFrame, early: pd.Series, converged: pd.Series,
                    *, eps: float) -> Verdict:
    """ace.unified (rule: docs/course.md §Claim rules): every check of ``checks`` within its
    :data:`TOLERANCES`; ``vit_unified``, ``early`` and ``converged`` are shown beside."""
    acc = dict(zip(vit_unified["method"], vit_unified["test_normalized"]))
    vit_err = max(checks["identity_vit"], checks["identity_route"])
    holds = (vit_err <= TOLERANCES["identity_vit"] and checks["identity_synthetic"] <= TOLERANCES["identity_synthetic"]
             and checks["wudi_gradient"] <= TOLERANCES["wudi_gradient"])
    measured = (f"identity = weight averaging to {vit_err:.1e} (mini-world) and {checks['identity_synthetic']:.1e} "
                f"(synthetic); WUDI row's relative loss gradient {checks['wudi_gradient']:.1e}; normalized test acc "
                f"identity {acc['identity']:.1f}, WUDI {acc['wudi']:.1f}, ACE estimator {acc['ace']:.1f}, true "
                f"covariance {acc['given']:.1f}, true Gram {acc['given_gram']:.1f}, full ACE {acc['ace_full']:.1f}; "
                f"synthetic gain (early / converged) ACE {early['ace']:.0f} / {converged['ace']:.0f}, true Σ "
                f"{early['given']:.0f} / {converged['given']:.0f}")
    reason = ("the equivalences hold to numerical precision; the merges differ only in the Sigma_t plugged in" if holds
              else "an equivalence fails beyond its tolerance: " + ", ".join(
                  f"{k} {checks[k]:.1e} > {t:g}" for k, t in TOLERANCES.items() if k in checks and checks[k] > t))
    nums = {"identity_vs_wa": checks["identity_vit"], "identity_route_vs_wa": checks["identity_route"],
            "identity_synthetic": checks["identity_synthetic"], "wudi_relative_gradient": checks["wudi_gradient"],
            "given_vs_jls": checks["given_jls"], "vit_normalized": acc, "synthetic_gain_early": early.to_dict(),
            "synthetic_gain_converged": converged.to_dict(), "eps": eps}
    return Verdict(measured, "reproduced" if holds else "not reproduced", reason, nums, value=float(vit_err))


track_drawing([sys.modules[__name__]])  # each figure function notes itself on the figure it draws (the manifest)
