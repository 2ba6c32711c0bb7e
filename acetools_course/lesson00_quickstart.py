"""Lesson 00 (docs/course.md §00_quickstart): the linear world of ``acetools demo``, the normalized
gain, and the mini-world's ACE against task arithmetic as a table and in words."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from acetools.synthetic import RegressionTask, finetune_linear, make_regression_tasks, task_loss
from acetools.utils import cpu_threads


def linear_world(n_tasks: int, d_in: int, d_out: int, *, steps: int, lr: float = 0.02, seed: int = 0,
                 device: str | torch.device = "cpu") -> tuple[Tensor, list[RegressionTask], list[Tensor]]:
    """``(W0, tasks, W)``: a base map, ``n_tasks`` regression tasks with their true ``task.Sigma`` and
    one SGD-fine-tuned expert per task (seeded ``seed + t``, as ``acetools demo``), float64 on ``device``."""
    W0, tasks = make_regression_tasks(n_tasks, d_in, d_out, seed=seed)
    dev = torch.device(device)
    W0 = W0.to(dev)
    tasks = [replace(t, **{f.name: getattr(t, f.name).to(dev) for f in fields(t)
                           if isinstance(getattr(t, f.name), Tensor)}) for t in tasks]
    with cpu_threads(None, env_default=True):  # ACETOOLS_NUM_THREADS, as the mini-world's training
        experts = [finetune_linear(W0, t.X_train, t.Y_train, steps=steps, lr=lr, seed=seed + i)
                   for i, t in enumerate(tasks)]
    return W0, tasks, experts


def normalized_gain(W: Tensor, W0: Tensor, tasks: Sequence[RegressionTask], experts: Sequence[Tensor],
                    split: str = "test") -> float:
    """Mean over tasks of ``100 (L_base - L) / (L_base - L_expert)`` (``L``: :func:`acetools.synthetic.task_loss`
    on ``split``): 100 as good as each expert on its task, 0 no better than the base (``acetools demo``'s score)."""
    gains = []
    for task, W_t in zip(tasks, experts, strict=True):
        base, expert, merged = (task_loss(M, task, split) for M in (W0, W_t, W))
        gains.append(100 * (base - merged) / (base - expert))
    return sum(gains) / len(gains)


def comparison(bench, methods: Sequence[str] = ("task_arithmetic", "ace")) -> pd.DataFrame:
    """The floor, the ceiling and ``methods`` (``bench.run``), with the coefficient in words (``lam = 0.30``
    or ``none``) and test accuracy, absolute and normalized (%)."""
    runs = bench.reference_rows()[:2] + [bench.run(m) for m in methods]
    t = bench.summary(runs)

    def coef(name: Any, value: Any) -> str:
        if not isinstance(name, str) or value is None or (isinstance(value, float) and math.isnan(value)):
            return "none"
        return f"{name} = {value:.2f}"

    return pd.DataFrame({"method": t["method"], "coefficient": [coef(n, v) for n, v in zip(t["coef_name"], t["coef"])],
                         "test accuracy (%)": t["test_acc"], "normalized (%)": t["test_normalized"]})


def summary_sentence(table: pd.DataFrame) -> str:
    """ACE against the unmerged base and against task arithmetic, in one sentence, from
    :func:`comparison`'s table."""
    row = table.set_index("method")
    ace = row.loc["ace", "normalized (%)"]
    gain = ace - row.loc["base (frozen heads)", "normalized (%)"]
    diff = ace - row.loc["task_arithmetic", "normalized (%)"]
    return (f"ACE is {gain:+.1f} normalized points over the unmerged base and {diff:+.1f} against task arithmetic "
            f"at its best validation coefficient ({row.loc['task_arithmetic', 'coefficient']}).")
