"""acetools.course.quickstart (lesson 00): its tables from a benchmark."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from acetools.course import quickstart as lesson


class FakeBench:
    """What the quickstart reads from a Benchmark: evaluate, expert_accuracy, run, reference_rows, summary."""

    base = "W0"

    def evaluate(self, state, split):
        return {"a": 0.4, "b": 0.6}

    def expert_accuracy(self, split):
        return {"a": 0.9, "b": 0.8}

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


def test_ingredients_has_a_mean_row_in_percent():
    t = lesson.ingredients(FakeBench())
    assert list(t.index) == ["a", "b", "mean"]
    assert t.loc["mean", "base (frozen heads)"] == pytest.approx(50.0)
    assert t.loc["mean", "expert"] == pytest.approx(85.0)


def test_comparison_says_which_methods_have_a_coefficient_and_reads_as_a_sentence():
    t = lesson.comparison(FakeBench())
    assert list(t["method"]) == ["base (frozen heads)", "experts (individual)", "task_arithmetic", "ace"]
    assert list(t["coefficient"]) == ["none", "none", "lam = 0.30", "none"]  # no NaN coefficient
    assert not t.isna().any().any()
    s = lesson.summary_sentence(t)
    assert s == ("ACE is +23.5 normalized points over the unmerged base and +3.5 against task arithmetic at its "
                 "best validation coefficient (lam = 0.30).")
