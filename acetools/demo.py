"""The end-to-end demo: merge linear-regression experts with every method and score them.

Ground truth is known here (spec-free, see :mod:`acetools.synthetic`): each task has its own
input covariance, each expert is W0 fine-tuned by SGD on its task, and a merge is scored on
every task's held-out data by its *normalized gain*

    100 * (L_base - L_merged) / (L_base - L_expert)

(100: as good as the task's own expert; 0: no better than the unmerged base). The
joint least-squares map, which needs the true covariances, is the upper reference.
"""

from __future__ import annotations

import time
import warnings

import pandas as pd
import torch

from .merging import METHODS, merge
from .synthetic import finetune_linear, joint_least_squares, make_regression_tasks, task_loss

__all__ = ["run_demo"]

KEY = "lin.weight"


def _extra_inputs(method: str, tasks) -> dict:
    """Inputs that data-based methods need: proxy activations (ESM) and Gram matrices (RegMean)."""
    if method == "esm":
        return {"activations": {KEY: [t.X_train[:256].float() for t in tasks]}, "targets": (KEY,)}
    if method == "regmean":
        return {"grams": [{KEY: (t.X_train.T @ t.X_train / t.X_train.shape[0]).float()} for t in tasks]}
    return {}


def run_demo(n_tasks: int = 6, d_in: int = 48, d_out: int = 24, seed: int = 0,
             methods: list[str] | None = None, steps: int = 300, lr: float = 0.02) -> pd.DataFrame:
    """Build ``n_tasks`` regression experts, merge them with ``methods`` (default: all).

    Returns one row per method with the mean normalized gain, the worst task's gain,
    and the merge time in milliseconds, best first.
    """
    W0, tasks = make_regression_tasks(n_tasks, d_in, d_out, seed=seed)
    experts_W = [finetune_linear(W0, t.X_train, t.Y_train, steps=steps, lr=lr, seed=seed + i)
                 for i, t in enumerate(tasks)]
    base = {KEY: W0.float()}
    experts = [{KEY: W.float()} for W in experts_W]
    L_base = [task_loss(W0, t) for t in tasks]
    L_exp = [task_loss(W, t) for W, t in zip(experts_W, tasks)]

    def gains(W: torch.Tensor) -> list[float]:
        return [100 * (lb - task_loss(W, t)) / (lb - le) for t, lb, le in zip(tasks, L_base, L_exp)]

    rows = []
    for m in methods or list(METHODS):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            merged = merge(m, base, experts, **_extra_inputs(m, tasks))
        ms = 1000 * (time.perf_counter() - t0)
        g = gains(merged[KEY].double())
        rows.append({"method": m, "mean_gain": sum(g) / len(g), "worst_task_gain": min(g), "merge_ms": ms,
                     "uses_data": m in ("esm", "regmean")})
    g = gains(joint_least_squares(tasks))
    rows.append({"method": "joint least squares (true Sigma_t)", "mean_gain": sum(g) / len(g),
                 "worst_task_gain": min(g), "merge_ms": float("nan"), "uses_data": True})
    return pd.DataFrame(rows).sort_values("mean_gain", ascending=False, ignore_index=True)
