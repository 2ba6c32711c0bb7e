"""The course's slides (scripts/build_site.py): one idea a slide, speaker notes, nothing cut.

A lesson becomes slides of one markdown block or one code cell each (:func:`one_idea_slides`); a
long paragraph shows its first sentence and its equations and goes whole into the speaker notes.
The Chromium test shows every slide of a deck at 1280 × 720 and fails on a slide whose content is
taller or wider than the slide (:func:`tests.report_checks.slide_overflows`).
"""

from __future__ import annotations

import nbformat
import pytest

from tests.report_checks import find_chromium, slide_overflows
from tests.scripts import load_script

LONG = ("The merge weighs each task by the directions its inputs use, so a task whose inputs live in a few "
        "directions pulls the merged map only there. This second sentence and the ones after it explain "
        "why, with enough words that the paragraph is too long for one slide: a teacher says them, the "
        "slide shows the first sentence and the equation.")


def _lesson() -> nbformat.NotebookNode:
    table = "<table>" + "".join(f"<tr><td>row {i}</td><td>{i * 0.5}</td></tr>" for i in range(60)) + "</table>"
    code = nbformat.v4.new_code_cell("\n".join(f"x{i} = {i}  # line {i} of a long cell" for i in range(45)))
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="done\n"),
                    nbformat.v4.new_output("display_data", data={"text/html": table, "text/plain": "table"})]
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 00 · A lesson\n\nShort opening line."),
        nbformat.v4.new_code_cell("quick: bool = False", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_markdown_cell(f"## 1 · A section\n\n{LONG}\n\n"
                                      "$$W = W_0 + \\lambda \\sum_t \\tau_t \\tag{TA.1}$$\n\n- a list item\n- another"),
        code,
    ])


def test_a_lesson_becomes_slides_of_one_idea_with_notes():
    mod = load_script("build_site")
    nb = mod.one_idea_slides(_lesson())
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    # heading + opening line; parameters; the long paragraph and its notes; the equation; the list;
    # the code with its printed line; its table
    assert kinds == ["slide", "skip", "slide", "notes", "subslide", "subslide", "subslide", "subslide"], kinds
    shown, notes = nb.cells[2].source, nb.cells[3].source
    assert shown == "## 1 · A section\n\nThe merge weighs each task by the directions its inputs use, so a task " \
                    "whose inputs live in a few directions pulls the merged map only there."
    assert notes == f"## 1 · A section\n\n{LONG}"
    assert nb.cells[4].source.startswith("$$W = W_0") and nb.cells[4].source.endswith("$$")
    assert nb.cells[5].source == "- a list item\n- another"
    # the code cell: its code with the printed line, then its table on a slide of its own, input hidden
    code, table = nb.cells[6], nb.cells[7]
    assert [o["output_type"] for o in code.outputs] == ["stream"] and "x44 = 44" in code.source
    assert [o["output_type"] for o in table.outputs] == ["display_data"] and "hide-input" in table.metadata.tags
    assert len({c.id for c in nb.cells}) == len(nb.cells)


def test_markdown_blocks_keep_equations_and_fences_whole():
    mod = load_script("build_site")
    md = "## H\n\ntext one\n\n$$a\n\n= b$$\n\n```\ncode\n\nmore\n```\n\nlast"
    assert mod.md_blocks(md) == ["## H\n\ntext one", "$$a\n\n= b$$", "```\ncode\n\nmore\n```", "last"]


@pytest.mark.slow
def test_every_slide_fits_1280_by_720(tmp_path):
    mod = load_script("build_site")
    if find_chromium() is None:
        pytest.skip("no headless Chromium (scripts/setup.sh installs Debian's chromium)")
    try:
        mod.reveal_root()
    except mod.SiteError as err:
        pytest.skip(str(err))
    nb = _lesson()  # sections before the long cell: reveal.js hides a stack that far from the first slide
    nb.cells[2:2] = [nbformat.v4.new_markdown_cell(f"## {k} · Section\n\nText {k}.") for k in range(2, 8)]
    lesson = tmp_path / "00_quickstart.ipynb"
    nbformat.write(nb, str(lesson))
    (deck,) = mod.build_slides([lesson], tmp_path / "out")
    got = slide_overflows(deck)
    assert got["slides"] >= 5 and got["notes"] >= 1, got
    assert not got["cut"], f"slides cut at 1280 × 720 (index, width, height, text): {got['cut']}"
