"""acetools_course.widgets: explorers redraw through their pure plot function when a value is set."""

from __future__ import annotations

import pytest
import traitlets

pytest.importorskip("ipywidgets")

from acetools_course import widgets  # noqa: E402


def _recorder():
    calls = []

    def plot(ax, **kw):
        calls.append(kw)
        ax.plot([0, 1], [0, kw.get("k", kw.get("alpha", 1))])
        ax.set_title(str(kw))
        return ax

    return plot, calls


def test_rank_slider_redraws_with_the_new_rank():
    plot, calls = _recorder()
    ex = widgets.rank_slider(plot, ranks=range(1, 9), value=4, data="sv")
    assert calls[-1] == {"data": "sv", "k": 4} and ex.draws == 1
    ex.set(k=7)
    assert calls[-1]["k"] == 7 and ex.values == {"k": 7} and ex.draws == 2
    assert ex.ax.get_title() == str({"data": "sv", "k": 7})
    assert len(ex.ax.lines) == 1  # the axes is cleared between draws


def test_alpha_slider_offers_only_the_swept_values():
    plot, calls = _recorder()
    ex = widgets.alpha_slider(plot, alphas=[0.1, 0.5, 1.0], value=0.5)
    ex.set(alpha=1.0)
    assert calls[-1]["alpha"] == 1.0
    with pytest.raises(traitlets.TraitError):
        ex.set(alpha=0.7)  # not a swept value
    with pytest.raises(ValueError, match="swept"):
        widgets.alpha_slider(plot, alphas=[0.1, 0.5], value=0.3)


def test_task_picker_and_errors():
    plot, calls = _recorder()
    ex = widgets.task_picker(plot, tasks=["a", "b"], value="a")
    ex.set(task="b")
    assert calls[-1]["task"] == "b"
    with pytest.raises(KeyError, match="controls"):
        ex.set(nope=1)
    with pytest.raises(ValueError, match="unknown task"):
        widgets.task_picker(plot, tasks=["a"], value="z")
    with pytest.raises(ValueError, match="empty"):
        widgets.rank_slider(plot, ranks=[])


def test_nothing_is_printed_outside_a_frontend(capsys):
    """Outside a Jupyter kernel a redraw updates the figure and prints nothing (it used to
    print ``Figure(600x360)`` per draw)."""
    plot, calls = _recorder()
    assert not widgets.in_frontend()
    ex = widgets.rank_slider(plot, ranks=range(1, 5), value=2)
    ex.set(k=3)
    ex.set(k=4)
    out = capsys.readouterr()
    assert ex.draws == 3 and calls[-1]["k"] == 4
    assert out.out == "" and out.err == ""
