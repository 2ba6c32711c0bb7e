"""Lesson 08's tables and figures (acetools_course/lesson08_lora_experts.py) on small made-up inputs."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest
import torch

from acetools import plotting
from acetools.merging import lowrank
from acetools.world.text.lora import LoraFactors
from acetools_course import lesson08_lora_experts as lesson


def _table() -> pd.DataFrame:
    rows = []
    for m, (f, lo) in {"task_arithmetic": (90.0, 88.0), "tsv_m": (93.0, 91.5)}.items():
        rows += [{"method": m, "experts": "full fine-tunes", "coef": 0.5, "test_acc": 70.0, "test_normalized": f,
                  "rank": 384, "stored (M)": 10.6},
                 {"method": m, "experts": "LoRA", "coef": 1.0, "test_acc": 69.0, "test_normalized": lo,
                  "rank": 64, "stored (M)": 1.1}]
    return pd.DataFrame(rows)


def test_compare_view_is_method_by_full_and_lora_in_six_columns():
    v = lesson.compare_view(_table())
    assert list(v.columns) == ["method", "full fine-tunes (%)", "LoRA (%)", "coefficient, full / LoRA",
                               "rank of a matrix, full / LoRA", "stored numbers (M), full / LoRA"]
    row = v.set_index("method").loc["tsv_m"]
    assert row["full fine-tunes (%)"] == 93.0 and row["LoRA (%)"] == 91.5
    assert row["rank of a matrix, full / LoRA"] == "384 / 64" and row["coefficient, full / LoRA"] == "0.50 / 1.00"


class _FakeLora:
    tasks = ["a", "b"]

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self._f = {t: {"w": LoraFactors(torch.randn(6, 2, generator=g), torch.randn(2, 5, generator=g), 0.5)}
                   for t in self.tasks}

    def factors(self, task):
        return self._f[task]


def test_lora_factors_fold_the_scale_into_b_and_their_sum_has_rank_sum_r():
    fake = _FakeLora()
    pairs = lesson.lora_factors(fake, "w")
    torch.testing.assert_close(pairs[0][0], 0.5 * fake.factors("a")["w"].B)
    ta = lowrank.task_arithmetic_lowrank(pairs, lam=1.0)
    want = sum(0.5 * f["w"].B @ f["w"].A for f in fake._f.values())
    torch.testing.assert_close(ta.dense(), want)
    assert lowrank.numerical_rank(lowrank.to_rank(ta, ta.rank).S) == 4


@pytest.mark.parametrize("draw", ["spectra", "bars"])
def test_the_figures_draw_without_overlapping_text(draw):
    fig, ax = plotting.new_axes(width=7, height=4.2, layout="constrained")
    if draw == "spectra":
        lesson.spectra(ax, torch.linspace(1, 0.01, 60), torch.linspace(1, 0.2, 16), total_rank=16)
        assert ax.get_yscale() == "log" and len(ax.get_lines()) == 3  # two spectra and the bound
    else:
        lesson.comparison_bars(ax, _table())
        assert len(ax.patches) == 4
    fig.canvas.draw()
    assert not plotting.text_overlaps(fig)
