"""Lesson 00, ``acetools_course.lesson00_quickstart``: the linear world, its score, and the mini-world's tables."""

from __future__ import annotations

import math
import re
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


# --------------------------------------------------------------------------- epsilon, ACE's lever (section 7)


def test_the_lesson_names_eps_as_aces_lever_and_turns_it():
    """Section 7 of notebook 00 merges with ACE at the official code's eps (1e-2) and the paper's (1e-5) beside
    task arithmetic, before "What we learned"; the paragraph on why ACE trails names eps and points there. The
    quick run's output is checked by tests/test_notebooks.py (eps_lever_problems)."""
    import json
    from pathlib import Path

    from tests.test_notebooks import EPS_SECTION

    cells = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "00_quickstart.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    start = next(i for i, s in enumerate(sources) if EPS_SECTION in s)
    end = next(i for i, s in enumerate(sources) if "## What we learned" in s)
    assert start < end, "section 7 comes before 'What we learned'"
    code = "\n".join(s for c, s in zip(cells[start:end], sources[start:end]) if c["cell_type"] == "code")
    values = [float(v) for v in re.findall(r"eps_values = \[([^\]]*)\]", code)[0].split(",")]
    assert 1e-2 in values and 1e-5 in values, values
    assert 'bench.run("ace", eps=e)' in code and '"task_arithmetic"' in code and '"ace_eps"' in code
    why = next(s for s in sources[:start] if "Why ACE can trail task arithmetic" in s)
    assert "ridge $\\varepsilon$" in why and "section 7" in why
