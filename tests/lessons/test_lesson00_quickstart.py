"""Lesson 00, ``acetools_course.lesson00_quickstart``: the linear world, its score, and the mini-world's tables."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from acetools.synthetic import finetune_linear, make_regression_tasks
from acetools_course import lesson00_quickstart as lesson


class FakeBench:
    """What the quickstart reads from a Benchmark: run, reference_rows, summary."""

    def reference_rows(self):
        return [SimpleNamespace(method="base (frozen heads)", coef_name=None, coef=None, acc=50.0, norm=60.0),
                SimpleNamespace(method="experts (individual)", coef_name=None, coef=None, acc=85.0, norm=100.0),
                SimpleNamespace(method="multi-task (MTL)", coef_name=None, coef=None, acc=86.0, norm=101.0)]

    def run(self, method):
        if method == "task_arithmetic":
            return SimpleNamespace(method=method, coef_name="lam", coef=0.3, acc=70.0, norm=80.0)
        return SimpleNamespace(method=method, coef_name=None, coef=math.nan, acc=72.0, norm=83.5)

    @staticmethod
    def summary(runs):
        return pd.DataFrame([{"method": r.method, "coef_name": r.coef_name, "coef": r.coef, "test_acc": r.acc,
                              "test_normalized": r.norm} for r in runs])


def test_comparison_says_which_methods_have_a_coefficient_and_reads_as_a_sentence():
    t = lesson.comparison(FakeBench())
    assert list(t["method"]) == ["base (frozen heads)", "experts (individual)", "task_arithmetic", "ace"]
    assert list(t["coefficient"]) == ["none", "none", "lam = 0.30", "none"]  # no NaN coefficient
    assert not t.isna().any().any()
    s = lesson.summary_sentence(t)
    assert s == ("ACE is +23.5 normalized points over the unmerged base and +3.5 against task arithmetic at its "
                 "best validation coefficient (lam = 0.30).")


def test_linear_world_is_the_demos_world_on_the_device():
    W0, tasks, W = lesson.linear_world(3, 6, 4, steps=20, seed=5)
    W0_ref, tasks_ref = make_regression_tasks(3, 6, 4, seed=5)
    torch.testing.assert_close(W0, W0_ref)
    for i, (t, W_t) in enumerate(zip(tasks_ref, W)):
        torch.testing.assert_close(W_t, finetune_linear(W0_ref, t.X_train, t.Y_train, steps=20, lr=0.02, seed=5 + i))
        torch.testing.assert_close(tasks[i].Sigma, t.Sigma)
    assert W0.dtype == torch.float64 and all(x.device == W0.device for x in (tasks[0].X_test, W[0]))


def test_normalized_gain_is_0_for_the_base_and_100_for_the_experts():
    W0, tasks, W = lesson.linear_world(2, 8, 3, steps=30, seed=1)
    assert lesson.normalized_gain(W0, W0, tasks, W) == pytest.approx(0.0)
    # one expert per task is 100 on its own task: the map that is each task's expert (scored task by task)
    for t, W_t in zip(tasks, W):
        assert lesson.normalized_gain(W_t, W0, [t], [W_t], "val") == pytest.approx(100.0)
    assert lesson.normalized_gain(W[0], W0, tasks, W) < 100.0  # one task's expert is not the others'


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_linear_world_lives_on_cuda():
    W0, tasks, W = lesson.linear_world(2, 8, 3, steps=5, seed=0, device="cuda")
    assert W0.is_cuda and tasks[0].Sigma.is_cuda and W[1].is_cuda
    assert math.isfinite(lesson.normalized_gain(W0 + (W[0] - W0), W0, tasks, W))
