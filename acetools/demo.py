"""The end-to-end demo: merge linear-regression experts (:mod:`acetools.synthetic`) with every method.

A merge is scored on each task's test data by its normalized gain
100 * (L_base - L_merged) / (L_base - L_expert); coefficients are chosen on validation by each
method's registered search. The joint least-squares map (true covariances) is the upper reference.
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


def _data_inputs(method: str, tasks) -> dict:
    """The data inputs ``method`` declares, from the tasks' training inputs."""
    available = {
        "activations": lambda: {KEY: [t.X_train[:256].float() for t in tasks]},
        "grams": lambda: [{KEY: (t.X_train.T @ t.X_train / t.X_train.shape[0]).float()} for t in tasks],
        "targets": lambda: (KEY,),
    }
    return {name: available[name]() for name in METHODS[method].data_inputs}


def run_demo(n_tasks: int = 6, d_in: int = 48, d_out: int = 24, seed: int = 0,
             methods: list[str] | None = None, steps: int = 300, lr: float = 0.02,
             select: bool = True) -> pd.DataFrame:
    """Merge ``n_tasks`` regression experts with ``methods`` (default all); one row per method, best first:
    the coefficient (chosen on validation by its registered search unless ``select=False``), the mean
    and worst-task normalized gain on test, and the merge time in ms."""
    W0, tasks = make_regression_tasks(n_tasks, d_in, d_out, seed=seed)
    experts_W = [finetune_linear(W0, t.X_train, t.Y_train, steps=steps, lr=lr, seed=seed + i)
                 for i, t in enumerate(tasks)]
    base = {KEY: W0.float()}
    experts = [{KEY: W.float()} for W in experts_W]
    ref = {s: ([task_loss(W0, t, s) for t in tasks], [task_loss(W, t, s) for W, t in zip(experts_W, tasks)])
           for s in ("val", "test")}

    def gains(W: torch.Tensor, split: str) -> dict[str, float]:
        L_base, L_exp = ref[split]
        return {f"task{i}": 100 * (lb - task_loss(W, t, split)) / (lb - le)
                for i, (t, lb, le) in enumerate(zip(tasks, L_base, L_exp))}

    def merged_weight(m: str, **hp) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return merge(m, base, experts, **_data_inputs(m, tasks), **hp)[KEY].double()

    hundred = {f"task{i}": 100.0 for i in range(len(tasks))}  # gains are normalized already
    rows = []
    for m in methods or list(METHODS):
        search = METHODS[m].search if select else None
        t0 = time.perf_counter()
        hp = {}
        if search is not None:
            res = search.run(lambda c, m=m, p=search.param: gains(merged_weight(m, **{p: c}), "val"), hundred)
            hp = {search.param: res.best}
        W = merged_weight(m, **hp)
        ms = 1000 * (time.perf_counter() - t0)
        g = list(gains(W, "test").values())
        rows.append({"method": m, "coefficient": ", ".join(f"{k}={v:.3g}" for k, v in hp.items()),
                     "mean_gain": sum(g) / len(g), "worst_task_gain": min(g), "ms": ms,
                     "uses_data": bool(METHODS[m].data_inputs)})
    g = list(gains(joint_least_squares(tasks), "test").values())
    rows.append({"method": "joint least squares (true Sigma_t)", "coefficient": "", "mean_gain": sum(g) / len(g),
                 "worst_task_gain": min(g), "ms": float("nan"), "uses_data": True})
    return pd.DataFrame(rows).sort_values("mean_gain", ascending=False, ignore_index=True)
