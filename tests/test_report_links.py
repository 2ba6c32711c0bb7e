"""What a reader follows and scrolls on a rendered report (:func:`acetools.notebooks.render_html`) and
on the site (scripts/build_site.py), in headless Chromium at 1280 px:

* the lessons' links to the docs pages (``../docs/glossary.md#cka``, ``../docs/notation.md``) work:
  the target page exists and holds the element the anchor names. The links checked are every one
  the lessons' markdown holds;
* a display equation wider than the page, a long code line and a long output line scroll or wrap
  inside the page, none cut (:func:`tests.report_checks.check_rendered`)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from acetools.notebooks import REPO, notebook_paths, render_html
from tests.report_checks import check_rendered, dead_links, find_chromium
from tests.scripts import load_script


def _lesson_links() -> list[str]:
    """Every distinct link to ``../docs/`` in the lessons' markdown, in course order."""
    found: list[str] = []
    for path in notebook_paths():
        for cell in nbformat.read(str(path), as_version=4).cells:
            if cell.cell_type == "markdown":
                found += [u for u in re.findall(r"\]\((\.\./docs/[^)\s]+)\)", cell.source) if u not in found]
    return found


LINKS = _lesson_links()


def _lesson_with_the_links(folder: Path) -> Path:
    """An executed lesson (as papermill leaves it: its source path in the metadata) whose markdown
    holds every link of :data:`LINKS`, with an equation, a code line and an output line each about
    four times as wide as the page."""
    terms = " + ".join(f"\\lambda_{{{i}}} \\hat\\Sigma_{{{i}}} W_{{{i}}}" for i in range(40))
    output = nbformat.v4.new_output("stream", name="stdout", text="y" * 400 + "\n" + " ".join(["word"] * 200))
    cells = [nbformat.v4.new_markdown_cell("# Links\n\n" + "\n".join(f"* [{u}]({u})" for u in LINKS)),
             nbformat.v4.new_markdown_cell(f"A wide equation:\n\n$$ M = {terms} $$\n\nand after it $x_0$."),
             nbformat.v4.new_code_cell("x = " + " + ".join(f"value_{i}" for i in range(60)), outputs=[output])]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["papermill"] = {"input_path": str(REPO / "notebooks" / "00_quickstart.ipynb")}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "00_quickstart.ipynb"
    nbformat.write(nb, str(path))
    return path


def _chromium():
    if find_chromium() is None:
        pytest.skip("no headless Chromium (scripts/setup.sh installs Debian's chromium)")


def test_the_lessons_link_the_glossary_and_the_notation():
    assert any("glossary.md#" in u for u in LINKS) and any("notation.md" in u for u in LINKS), LINKS


@pytest.mark.slow
def test_docs_links_resolve_and_wide_lines_scroll_in_a_rendered_report(tmp_path):
    _chromium()
    page = render_html(_lesson_with_the_links(tmp_path / "report"))
    assert "Sigma" in page.read_text() and not check_rendered(page), check_rendered(page)
    links, dead = dead_links(page)
    assert len(links) == len(LINKS), f"{len(links)} docs links on the page, the lessons have {len(LINKS)}"
    assert not dead, "\n".join(dead)
    # the docs pages link each other (glossary -> methods.md#notation): those resolve too
    links, dead = dead_links(tmp_path / "report" / "docs" / "glossary.html", r"\.html")
    assert any("methods.html#" in u for u in links) and not dead, dead


@pytest.mark.slow
def test_docs_links_resolve_and_wide_lines_scroll_on_the_site(tmp_path):
    import importlib.util

    _chromium()
    if importlib.util.find_spec("jupyter_book") is None:
        pytest.skip("jupyter-book is not installed (the course extra: pip install -e '.[course]')")
    lesson = _lesson_with_the_links(tmp_path / "executed")
    index = load_script("build_site").build_book([lesson], tmp_path / "site", "quick", {})
    page = index.parent / "00_quickstart.html"
    assert "#../docs" not in page.read_text(), "a docs link was left unresolved by MyST"
    problems = check_rendered(page)
    assert not problems, "\n".join(problems)
    links, dead = dead_links(page, within="article")
    assert len(links) == len(LINKS), f"{len(links)} docs links on the page, the lessons have {len(LINKS)}"
    assert not dead, "\n".join(dead)
    links, dead = dead_links(index.parent / "docs" / "glossary.html", r"\.html", within="article")
    assert any("methods.html#" in u for u in links) and not dead, dead
