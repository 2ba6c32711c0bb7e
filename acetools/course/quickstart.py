"""Lesson 00 (``notebooks/00_quickstart``): merge a suite's experts with ACE in one call.

The tables the quickstart shows, from a :class:`~acetools.benchmark.Benchmark`:
:func:`ingredients` (the base and each expert on every task), :func:`comparison` (ACE and
task arithmetic, its coefficient chosen on validation, between the floor and the ceiling)
and :func:`summary_sentence` (the comparison in words). The notebook makes no claim of the
papers: it measures this world.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

__all__ = ["ingredients", "comparison", "summary_sentence"]


def ingredients(bench) -> pd.DataFrame:
    """Test accuracy (%) of the base with its frozen heads (the floor) and of each expert on
    its own task (the ceiling), one row per task plus their ``mean``."""
    t = pd.DataFrame({"base (frozen heads)": bench.evaluate(bench.base, "test"),
                      "expert": bench.expert_accuracy("test")}).mul(100)
    t.loc["mean"] = t.mean()
    return t


def comparison(bench, methods: Sequence[str] = ("task_arithmetic", "ace")) -> pd.DataFrame:
    """The floor, the ceiling and ``methods`` (each run by ``bench.run``: coefficient chosen on
    validation where the method has one), with the coefficient in words (``lam = 0.30``, or
    ``none`` for a method without one) and test accuracy, absolute and normalized (%)."""
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
