"""The course as a static site and as slides (scripts/build_site.py), built offline.

The build test takes every lesson executed on the quick profile (papermill, the fixture world:
the runs of ``acetools report --profile quick``), builds the Jupyter Book and the reveal.js
slides, and checks what a reader gets: a page per lesson with its code, figures and the links to
the previous and next lesson, equations typeset by the local MathJax, and nothing loaded from a
network. In a whole-suite run it reuses the lessons tests/test_notebooks.py executed earlier in
the same session (its ``course*/build`` folder under pytest's session folder, when every lesson
there ran to the end), so it costs about two minutes of Sphinx and nbconvert; run alone, it
executes the course itself (one quick run of the course more).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import nbformat
import pytest

from acetools.notebooks import notebook_paths
from tests.report_checks import CHROMIUM_FLAGS, find_chromium, slide_overflows
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]


def _script():
    return load_script("build_site")


def test_slide_types_follow_the_headings():
    mod = _script()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("intro without a heading"),
        nbformat.v4.new_code_cell("quick: bool = False  # parameters", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_markdown_cell("## 1 · A section"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("### a detail"),
        nbformat.v4.new_markdown_cell("text"),
        nbformat.v4.new_code_cell("y = 2", metadata={"slideshow": {"slide_type": "fragment"}}),
        nbformat.v4.new_markdown_cell("# Another part"),
    ])
    assert mod.slide_types(nb) == ["slide", "skip", "slide", "-", "subslide", "-", "fragment", "slide"]


def test_network_urls_are_found():
    mod = _script()
    page = ('<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js"></script>'
            '<link rel="stylesheet" href="//unpkg.com/reveal.js@4.0.2/dist/reveal.css">'
            "<script type=\"module\">import mermaid from 'https://cdn.example/mermaid.mjs';</script>"
            '<script src="reveal.js/dist/reveal.js"></script><a href="https://example.org/page">a link</a>')
    assert len(mod.network_urls(page)) == 3
    assert "mermaid" not in mod._offline(
        "<script type=\"module\">\n  import mermaid from 'https://cdn.example/m.mjs';\n  mermaid.initialize({});\n"
        "</script>")


def test_a_missing_reveal_is_named(monkeypatch, tmp_path):
    mod = _script()
    monkeypatch.setenv("ACETOOLS_REVEAL", str(tmp_path))
    with pytest.raises(mod.SiteError, match="reveal.js"):
        mod.reveal_root()


def _rendered_dom(page: Path) -> str:
    exe = find_chromium()
    if exe is None:
        pytest.skip("no headless Chromium (scripts/setup.sh installs Debian's chromium)")
    res = subprocess.run([exe, *CHROMIUM_FLAGS, "--virtual-time-budget=30000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=180)
    return res.stdout


def _complete(path: Path) -> bool:
    """A lesson papermill ran to its end without an error."""
    if not path.is_file():
        return False
    nb = nbformat.read(str(path), as_version=4)
    if nb.metadata.get("papermill", {}).get("duration") is None:
        return False
    return not any(o.get("output_type") == "error" for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def executed_earlier(base: Path) -> Path | None:
    """The folder where tests/test_notebooks.py executed every lesson in this session, or None."""
    names = [p.name for p in notebook_paths()]
    for folder in sorted(base.glob("course*/build")):
        if all(_complete(folder / n) for n in names):
            return folder
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    import importlib.util
    import os

    if importlib.util.find_spec("jupyter_book") is None:
        pytest.skip("jupyter-book is not installed (the course extra: pip install -e '.[course]')")
    root = tmp_path_factory.mktemp("site")
    with pytest.MonkeyPatch.context() as mp:  # a fresh cache: the fixture world is built as CI builds it
        mp.setenv("ACETOOLS_CACHE", str(root / "cache"))
        mp.setenv("ACETOOLS_NUM_THREADS", os.environ.get("ACETOOLS_NUM_THREADS", "1"))
        yield _script().build("quick", root / "out", executed=executed_earlier(tmp_path_factory.getbasetemp()))


@pytest.mark.slow
def test_the_site_has_every_lesson_with_code_figures_and_navigation(site):
    html = Path(site["site"]).parent
    lessons = [p.stem for p in notebook_paths()]
    assert site["lessons"] == lessons
    index = (html / "index.html").read_text()
    for i, stem in enumerate(lessons):
        assert f'href="{stem}.html"' in index, f"the index does not link {stem}"
        page = (html / f"{stem}.html").read_text()
        assert 'class="highlight' in page, f"{stem}: no code on the page"
        assert re.search(r'<img [^>]*src="_images/', page), f"{stem}: no figure on the page"
        before = lessons[i - 1] if i else "index"
        assert re.search(rf'<a class="left-prev"\s+href="{before}\.html"', page), f"{stem}: no link back to {before}"
        if i + 1 < len(lessons):
            assert re.search(rf'<a class="right-next"\s+href="{lessons[i + 1]}\.html"', page), (
                f"{stem} does not lead to {lessons[i + 1]}")
    for page in html.glob("*.html"):
        urls = _script().network_urls(page.read_text())
        assert not urls, f"{page.name} loads from a network: {urls}"
    assert (html / "_static" / "mathjax" / "MathJax.js").is_file()


@pytest.mark.slow
def test_the_site_typesets_its_equations_offline(site):
    page = Path(site["site"]).parent / "01_theorem1.html"
    dom = _rendered_dom(page)
    assert dom.count('class="mjx-chtml') > 10, "MathJax typeset nothing on the lesson page"
    # an error is an element MathJax marks (its style sheet always names the class .MathJax_Error)
    errors = re.findall(r'<[^>]+class="[^"]*\bMathJax_Error\b[^>]*>[^<]*', dom)
    assert not errors and "Math input error" not in dom, f"MathJax could not typeset: {errors[:3]}"


@pytest.mark.slow
def test_slides_are_built_for_every_lesson_offline(site):
    pages = [Path(p) for p in site["slides"]]
    assert [p.name for p in pages] == [f"{p.stem}.slides.html" for p in notebook_paths()]
    folder = pages[0].parent
    for part in ("reveal.js/dist/reveal.js", "reveal.js/plugin/notes/notes.js", "vendor/require.min.js",
                 "vendor/jquery.min.js", "mathjax/MathJax.js"):
        assert (folder / part).is_file(), f"slides: {part} is missing beside the pages"
    for page in pages:
        text = page.read_text()
        assert not _script().network_urls(text), f"{page.name} loads from a network"
        assert text.count("<section") >= 4, f"{page.name}: {text.count('<section')} slides"
    dom = _rendered_dom(pages[1])
    assert re.search(r'<div class="reveal [^"]*\bready\b', dom), "reveal.js did not start on the slides"
    assert dom.count('class="mjx-chtml') > 0, "the slides' equations were not typeset"


@pytest.mark.slow
def test_every_lessons_slides_fit_1280_by_720_with_speaker_notes(site):
    for page in [Path(p) for p in site["slides"]]:
        got = slide_overflows(page)
        assert got["notes"] >= 1, f"{page.name}: no speaker notes"
        assert not got["cut"], f"{page.name}: slides cut at 1280 × 720 (index, width, height, text): {got['cut']}"


def test_a_lesson_that_did_not_finish_is_not_reused(tmp_path):
    folder = tmp_path / "course0" / "build"
    folder.mkdir(parents=True)
    assert executed_earlier(tmp_path) is None
    for p in notebook_paths():
        nb = nbformat.read(str(p), as_version=4)
        nb.metadata["papermill"] = {"duration": 1.0}
        nbformat.write(nb, str(folder / p.name))
    assert executed_earlier(tmp_path) == folder
    last = folder / notebook_paths()[-1].name
    nb = nbformat.read(str(last), as_version=4)
    next(c for c in nb.cells if c.cell_type == "code").outputs = [
        nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=[])]
    nbformat.write(nb, str(last))
    assert executed_earlier(tmp_path) is None


@pytest.mark.slow
def test_the_build_can_be_rebuilt_from_executed_lessons(site, tmp_path):
    out = Path(site["out"])
    assert (out / "build.json").is_file()
    rec = _script().build("quick", tmp_path / "again", executed=Path(site["executed"]), site=False, only=["00"])
    assert [Path(p).name for p in rec["slides"]] == ["00_quickstart.slides.html"]
    assert "site" not in rec
