"""Notebook 01's experiments: Theorem 1 of ACE-Merging measured (docs/course.md §01_theorem1, docs/methods.md §ACE).

The lesson builds one estimate by hand; this module repeats it over synthetic configurations, the ViT's
layers (against hooked covariances) and the unified framework's estimators (verdicts: ``claimkit.theorem1``)."""

from __future__ import annotations

import functools
import math
import operator
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..diagnostics import compare_covariances, layer_type
from ..errors import InputError, InputKeyError, InputTypeError
from ..files.activations import gram_matrices, input_covariances
from ..keys import block_index
from ..merging import merge
from ..merging.ace import estimate_covariance
from ..merging.wudi import wudi_grad
from ..synthetic import RegressionTask, descend, finetune_linear, joint_least_squares, make_regression_tasks
from ..utils import cpu_threads, make_generator

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


