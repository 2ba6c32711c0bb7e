"""acetools_course.lesson06_mergeable_world: the plots draw what they are given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from acetools_course import lesson06_mergeable_world as lesson  # noqa: E402
from acetools_course import lesson06_mergeable_world as mplot  # noqa: E402
from tests.course.test_mergeable_world import fake_card  # noqa: E402


def test_merges_vs_clip_draws_three_bars_per_recipe_and_the_room():
    fig, ax = plt.subplots()
    cards = {"first": fake_card(), "wide": fake_card(tsv_minus_ta=12.0)}
    mplot.merges_vs_clip(ax, cards)
    assert len(ax.patches) == 6
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["room 4.0", "room 12.0"]
    assert len(ax.lines) == 2  # CLIP lines for TA and TSV-M (Iso-CTS has no clip value in the fake)
    with pytest.raises(ValueError):
        mplot.merges_vs_clip(ax, {})
    plt.close(fig)


def test_room_budget_and_overlap_plots():
    fig, (a, b) = plt.subplots(1, 2)
    mplot.plot_room_budget(a, lesson.room_budget(fake_card()))
    assert len(a.lines) == 2 and [round(v, 1) for v in a.lines[1].get_ydata()] == [100.0, 99.0, 76.0]
    mplot.subspace_overlap(b, {"first": fake_card()})
    assert [p.get_height() for p in b.patches] == pytest.approx([0.26, 0.48, 0.72, 0.09])
    plt.close(fig)
