"""acetools_course.lesson_worlds (the notebooks' world) and acetools.plotting's core."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from acetools import plotting
from acetools.errors import InputError
from acetools_course import lesson_worlds as course


def test_suite_tasks_and_profiles():
    assert course.suite_tasks("tasks8")[:2] == ["fashion", "animals"] and len(course.suite_tasks("tasks20")) == 20
    assert course.suite_tasks("tasks20", quick=True) == course.suite_tasks("tiny")
    with pytest.raises(ValueError, match="unknown suite"):
        course.suite_tasks("tasks9")
    assert course.QUICK_EVAL["n_test"] < course.FULL_EVAL["n_test"]


def test_figures_path_is_absolute_and_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = course.figures_path("figs/x")
    assert p.is_absolute() and p.is_dir() and p == (tmp_path / "figs" / "x").resolve()


def test_the_default_figures_folder_depends_on_the_profile(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    monkeypatch.chdir(repo / "notebooks")  # where papermill --cwd notebooks and JupyterLab run a notebook
    assert course.repo_root() == repo
    quick = course.figures_path("", notebook="02_x", quick=True)
    full = course.figures_path("", notebook="02_x", quick=False)
    assert quick == repo / "build" / "quick" / "figures" / "02_x" and full == repo / "figures" / "02_x"
    import json

    assert json.loads((quick / course.MANIFEST).read_text()) == {"notebook": "02_x", "profile": "quick"}
    with pytest.raises(ValueError, match="committed figures"):  # a quick run never writes the results
        course.figures_path("../figures/02_x", notebook="02_x", quick=True)
    with pytest.raises(ValueError, match="notebook= and quick="):
        course.figures_path("")
    from acetools_course.verdicts import World

    course.note_world(quick, World("fixture", "quick", fixture=True))
    fig, ax = plotting.new_axes()
    ax.plot([0, 1])
    png = plotting.save_figure(fig, "line", quick)
    from PIL import Image

    meta = Image.open(png).text
    assert meta["acetools:world"] == "fixture" and meta["acetools:profile"] == "quick"


def test_the_text_world_is_a_notebook_world(tmp_path, monkeypatch):
    from acetools.world.text.tasks import SUITES

    assert course.text_worlds() == ["text", *SUITES]  # read from the text world, never listed here
    suite = next(iter(SUITES))
    assert course.is_text_world(suite) and course.text_suite(suite) == suite and course.text_suite("text") == "text8"
    assert not course.is_text_world("mini") and not course.is_text_world("tasks8")
    assert course.world_options(suite) == {"kind": suite}
    with pytest.raises(ValueError, match="text8"):
        course.world_options("text99")
    with pytest.raises(ValueError, match="not a text world"):
        course.text_suite("mini")
    # its figures go beside the mini-world's, for a default and for a given folder
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    monkeypatch.chdir(repo / "notebooks")
    quick = course.figures_path("", notebook="02_x", quick=True, world=suite)
    assert quick == repo / "build" / "quick" / "figures" / f"02_x-{suite}"
    import json

    assert json.loads((quick / course.MANIFEST).read_text())["notebook"] == f"02_x-{suite}"
    given = course.figures_path(tmp_path / "figs" / "02_x", quick=False, world=suite)
    assert given == (tmp_path / "figs" / f"02_x-{suite}").resolve()
    assert course.figures_path(tmp_path / "figs" / "02_x", world="mini") == (tmp_path / "figs" / "02_x").resolve()
    with pytest.raises(ValueError, match="committed figures"):
        course.figures_path("../figures/02_x", notebook="02_x", quick=True, world=suite)


def test_save_figure_is_atomic_deterministic_and_checks_names(tmp_path):
    fig, ax = plotting.new_axes()
    plotting.heatmap(ax, np.eye(3), labels=["a", "b", "c"], title="I")
    p1 = plotting.save_figure(fig, "eye", tmp_path)
    b1 = p1.read_bytes()
    p2 = plotting.save_figure(fig, "eye", tmp_path)
    assert p1 == p2 == tmp_path / "eye.png" and p2.read_bytes() == b1
    assert b1[:8] == b"\x89PNG\r\n\x1a\n"
    assert [f.name for f in tmp_path.iterdir()] == ["eye.png"]  # no temporary left behind
    for bad in ("eye.png", "a/b", "", "has space"):
        with pytest.raises(ValueError, match="file stem"):
            plotting.save_figure(fig, bad, tmp_path)


def test_generic_plots_draw_what_they_are_given():
    import pandas as pd

    fig, axes = plotting.new_axes(1, 3)
    plotting.bar_plot(axes[0], {"a": 1.0, "b": 2.0}, errors=[0.1, 0.2], highlight=["b"])
    assert len(axes[0].patches) == 2 and [t.get_text() for t in axes[0].get_xticklabels()] == ["a", "b"]
    df = pd.DataFrame({"x": [1, 2, 1, 2], "y": [1.0, 2.0, 3.0, 4.0], "m": ["p", "p", "q", "q"]})
    plotting.line_plot(axes[1], df, x="x", y="y", hue="m")
    assert len(axes[1].lines) == 2
    with pytest.raises(ValueError, match="2-D"):
        plotting.heatmap(axes[2], np.ones(3))


def test_describe_says_which_world():
    from types import SimpleNamespace

    from acetools_course.lesson_worlds import describe

    z = SimpleNamespace(tasks=["tiny_shapes", "tiny_orient", "tiny_count"], size="micro", suite="tiny")
    q = describe(z, quick=True)
    assert "fixture world: 3 procedural tasks (tiny_shapes, tiny_orient, tiny_count)" in q and "micro" in q
    f = describe(SimpleNamespace(tasks=[f"t{i}" for i in range(8)], size="small", suite="tasks8"), quick=False)
    assert f.startswith("The mini-world's suite tasks8: 8 tasks") and "fixture" not in f
    from acetools.world.vision.finetune import FinetuneConfig

    z8 = SimpleNamespace(tasks=["a"], size="small", suite="tasks8", seed=2,
                         finetune_config=FinetuneConfig(lr=1e-4, precision="bf16"))
    assert describe(z8, quick=False).endswith("experts fine-tuned with AdamW at lr 0.0001 for 3 epochs (bf16), seed 2.")


def test_text_overlaps_finds_overprinted_labels(tmp_path):
    import json

    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(6, 3))
    axes[0].set_title("left")
    axes[1].set_title("right")
    assert plotting.text_overlaps(fig) == []
    axes[0].text(0.5, 0.5, "a long label that runs on", transform=axes[0].transAxes)
    axes[0].text(0.52, 0.5, "and another one on top", transform=axes[0].transAxes)
    pairs = plotting.text_overlaps(fig)
    assert ("a long label that runs on", "and another one on top") in pairs
    (tmp_path / "figures.json").write_text(json.dumps({"profile": "quick"}))
    plotting.save_figure(fig, "crowded", tmp_path)
    got = json.loads((tmp_path / "figures.json").read_text())
    assert got["text_overlaps"]["crowded"][0] == ["a long label that runs on", "and another one on top"]
    plt.close(fig)


def test_text_overlaps_measures_an_annotation_by_its_text_not_its_leader_line():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.text(0.45, 0.5, "here", transform=ax.transData)
    # the arrow runs under "here", the text is far from it
    ax.annotate("far away", (0.3, 0.52), xytext=(0.75, 0.9), arrowprops={"arrowstyle": "-"})
    assert plotting.text_overlaps(fig) == []
    plt.close(fig)


def test_label_points_places_crowded_labels_apart_and_deterministically():
    import matplotlib.pyplot as plt

    # two tight clusters, like task arithmetic beside weight averaging and the structured methods together
    x = [60.0, 60.4, 61.0, 60.2, 80.0, 80.1, 80.2, 80.3, 80.25]
    y = [70.0, 70.3, 71.0, 70.1, 85.0, 85.2, 85.4, 85.3, 85.1]
    names = ["weight_averaging", "task_arithmetic", "ties", "dare", "tsv_m", "iso_c", "iso_cts", "ace", "esm"]

    def place():
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.scatter(x, y)
        ax.margins(0.15)
        anns = plotting.label_points(ax, x, y, names)
        got = ([a.get_text() for a in anns], [tuple(a.xyann) for a in anns], plotting.text_overlaps(fig))
        plt.close(fig)
        return got

    texts, offsets, overlaps = place()
    assert texts == names
    assert overlaps == []
    # the naive placement (every label at the same offset) overprints: the test can fail
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(x, y)
    for n, xi, yi in zip(names, x, y):
        ax.annotate(n, (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=7)
    assert plotting.text_overlaps(fig)
    plt.close(fig)
    assert place()[1] == offsets
    with pytest.raises(InputError, match="2 x, 2 y and 1 labels"):
        plotting.label_points(plt.gca(), [1, 2], [1, 2], ["a"])
    plt.close("all")


@pytest.mark.parametrize("n", [5, 22, 40])
def test_bar_plot_keeps_many_category_labels_apart(n):
    """bar_plot slants its labels while a bar's width allows, stands them upright, then shrinks
    them (the 04 page's 22 method rows on a 5.2-inch panel overprinted at a fixed 45 degrees)."""
    import matplotlib.pyplot as plt

    labels = [f"ace (eps 2e-4, gate off) {i}" for i in range(n)]
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    plotting.bar_plot(ax, list(range(n)), labels=labels)
    assert plotting.text_overlaps(fig) == []
    rot = {t.get_rotation() for t in ax.get_xticklabels()}
    assert rot == ({45.0} if n == 5 else {90.0})
    plt.close(fig)
