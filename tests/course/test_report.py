"""The checks of a rendered page (tests/report_checks.py) and `acetools report`: parameters, selection, profiles."""

from __future__ import annotations

import pytest

from acetools.cli import build_parser
from acetools.notebooks import PROFILES, notebook_paths, parse_parameter, run_report


@pytest.mark.parametrize("text,expected", [
    ("seed=3", ("seed", 3)), ("quick=True", ("quick", True)), ("lr=0.5", ("lr", 0.5)),
    ("suite=tasks20", ("suite", "tasks20")), ("suites=['a', 'b']", ("suites", ["a", "b"])),
    ("name=a=b", ("name", "a=b")),
])
def test_parse_parameter(text, expected):
    assert parse_parameter(text) == expected


@pytest.mark.parametrize("bad", ["seed", "=3", "1x=2", "a b=1"])
def test_parse_parameter_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_parameter(bad)


def test_notebook_selection_by_stem_number_and_name():
    paths = notebook_paths()
    first = paths[0]
    for key in (first.stem, first.stem[:2], first.stem[3:]):
        assert notebook_paths(only=[key]) == [first]
    with pytest.raises(ValueError, match="no notebook matches"):
        notebook_paths(only=["99_nothing"])


def test_missing_notebooks_folder_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="notebooks"):
        notebook_paths(tmp_path / "nope")


def test_unknown_profile_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="profile"):
        run_report("fastest", out=tmp_path)
    assert set(PROFILES) == {"quick", "full"}


def test_cli_parses_report_options():
    args = build_parser().parse_args(["report", "--profile", "full", "--only", "00", "02",
                                      "-p", "seed=1", "-p", "quick=True"])
    assert args.profile == "full" and args.only == ["00", "02"] and args.parameter == ["seed=1", "quick=True"]


def test_cli_lists_notebooks(capsys):
    from acetools.cli import main

    assert main(["report", "--list"]) == 0
    out = capsys.readouterr().out.split()
    assert out == [p.stem for p in notebook_paths()]


def test_timeouts_reach_papermill(tmp_path, monkeypatch):
    import nbformat
    import papermill as pm

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("seed: int = 0  # the seed")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder = tmp_path / "nbs"
    folder.mkdir()
    nbformat.write(nb, str(folder / "00_tiny.ipynb"))
    seen = {}

    def fake_execute(src, dst, **kw):
        seen.update(kw)
        nbformat.write(nb, dst)

    monkeypatch.setattr(pm, "execute_notebook", fake_execute)
    recs = run_report("quick", notebooks=folder, out=tmp_path / "build", html=False, timeout=7, start_timeout=123)
    assert [r["notebook"] for r in recs] == ["00_tiny"]
    assert seen["execution_timeout"] == 7 and seen["start_timeout"] == 123
    assert seen["parameters"] == {}  # the quick profile's parameters this notebook does not declare are dropped
    run_report("quick", notebooks=folder, out=tmp_path / "build", html=False)
    assert seen["execution_timeout"] is None and seen["start_timeout"] == 300


def test_cli_parses_timeouts():
    args = build_parser().parse_args(["report", "--cell-timeout", "600", "--start-timeout", "90"])
    assert args.cell_timeout == 600 and args.start_timeout == 90
    args = build_parser().parse_args(["report"])
    assert args.cell_timeout is None and args.start_timeout == 300


def _executed_notebook(tmp_path, outputs):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# A page\n## The section"),
                nbformat.v4.new_code_cell("x", outputs=outputs)]
    path = tmp_path / "page.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_render_html_takes_alt_text_from_the_figure_and_adds_the_page_css(tmp_path):
    import base64

    import nbformat

    from acetools.notebooks import REPORT_CSS, render_html
    from tests.report_checks import check_html

    png = base64.b64encode(b"\x89PNG fake").decode()
    out = [nbformat.v4.new_output("display_data", data={"image/png": png},
                                  metadata={"image/png": {"alt": "Figure: gamma per matrix"}}),
           nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(b"\x89PNG other").decode()})]
    html = render_html(_executed_notebook(tmp_path, out)).read_text()
    assert 'alt="Figure: gamma per matrix"' in html
    assert 'alt="Figure of the section The section"' in html  # no title: the section's heading
    assert "No description has been provided" not in html
    assert "overflow-x: auto" in html and REPORT_CSS.strip().splitlines()[0] in html
    assert check_html(tmp_path / "page.html") == []


def test_check_html_finds_what_a_reader_cannot_trust(tmp_path):
    from tests.report_checks import check_html

    page = tmp_path / "bad.html"
    page.write_text('<table><tr><td>NaN</td><td>1.0</td></tr></table><pre>{8: 1.0568946612521204}</pre>'
                    '<img alt="No description has been provided for this image" src="data:image/png;base64,AAA">'
                    "<pre>Traceback (most recent call last):\nValueError: x</pre>"
                    "<p><strong>partly</strong> · <code>ace.csp</code>: a — b</p>"
                    "<pre>[partly] ace.csp: a — b</pre><pre>k = [2, 3]; names [&#x27;a&#x27;, &#x27;b&#x27;]</pre>")
    problems = "\n".join(check_html(page))
    for what in ("NaN cell", "raw dict repr", "default alt text", "traceback", "more than once: ['ace.csp']",
                 "raw list or array repr ×2"):
        assert what in problems
    ok = tmp_path / "ok.html"
    ok.write_text("<table><tr><td>—</td><td>1.00</td></tr></table><p><strong>partly</strong> · <code>ace.csp</code>: "
                  "a — b</p><p>a set {x: y} in prose is fine</p><pre>ours a > b [seeds 0.32..0.53]</pre>")
    assert check_html(ok) == []


def test_no_committed_figure_overprints_its_own_text():
    """Every figures.json under figures/ (written by plotting.save_figure in the full runs) lists
    no figure with overlapping text (tests/report_checks.figure_problems)."""
    from pathlib import Path

    from tests.report_checks import figure_problems

    root = Path(__file__).resolve().parents[2] / "figures"
    folders = sorted({p.parent for p in root.rglob("figures.json")})
    assert len(folders) >= 7
    problems = [p for f in folders for p in figure_problems(f)]
    assert not problems, problems


def _lesson(tmp_path, *, kind: str | None = None, prose: str = "Compute it:", hide_second: bool = False):
    """An executed two-cell lesson (or, with ``kind="report"``, a pure report) and its rendered page."""
    import nbformat

    from acetools.notebooks import render_html

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if kind:
        nb.metadata["acetools"] = {"kind": kind}
    setup = nbformat.v4.new_code_cell("import torch  # setup", outputs=[])
    setup.metadata["tags"] = ["hide-input"]
    own = nbformat.v4.new_code_cell("Sigma_hat = W_tilde.T @ W_tilde  # (d_in, d_in)", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="done\n")])
    if hide_second:
        own.metadata["tags"] = ["hide-input"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A lesson"), setup, nbformat.v4.new_markdown_cell(prose), own]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, str(path))
    return path, render_html(path, require_mathjax=False)


def test_a_lesson_renders_with_its_code_and_hides_only_tagged_cells(tmp_path):
    """docs/style.md §13: a lesson's own cells show their input; cells tagged hide-input (setup,
    plotting) show only their output; a pure report renders without input."""
    from bs4 import BeautifulSoup

    from tests.report_checks import check_html, rendered_code_cells

    def words(page) -> str:
        return BeautifulSoup(page.read_text(), features="html.parser").get_text()

    _, html = _lesson(tmp_path)
    assert "W_tilde.T" in words(html) and "import torch" not in words(html) and "done" in words(html)
    assert rendered_code_cells(html.read_text()) == (1, 2)
    assert check_html(html) == []
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    _, page = _lesson(report_dir, kind="report")
    assert "W_tilde.T" not in words(page) and rendered_code_cells(page.read_text()) == (0, 2)
    assert check_html(page) == []  # a pure report may hide its code


def test_the_report_check_fails_a_lesson_without_its_code(tmp_path):
    from acetools.notebooks import render_html
    from tests.report_checks import check_html

    path, _ = _lesson(tmp_path)
    html = render_html(path, require_mathjax=False, code=False)  # as nbconvert --no-input would
    problems = "\n".join(check_html(html))
    assert "a lesson rendered without its code" in problems


@pytest.mark.parametrize("prose", ["Here is the code:", "The cell below computes it.", "The next cell does it."])
def test_the_report_check_fails_prose_that_points_at_hidden_code(tmp_path, prose):
    from tests.report_checks import check_html

    _, html = _lesson(tmp_path, prose=prose, hide_second=True)
    problems = "\n".join(check_html(html))
    assert "prose points at code that is not shown" in problems
    shown = tmp_path / "shown"
    shown.mkdir()
    _, ok = _lesson(shown, prose=prose)
    assert check_html(ok) == []  # the same words are fine where the code is on the page


def test_parameter_values_are_checked_against_the_registry_the_notebook_names(tmp_path):
    """The runner learns a parameter's allowed values from the notebook (its comment names the
    registry: ``one of acetools.world.vision.data.SUITES``), not from a list of its own."""
    import nbformat

    from acetools.notebooks import ParameterTypeError, check_parameters, notebook_parameters, parameter_choices
    from acetools.world.vision.data import SUITES

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('suite: str = "tasks8"  # task suite, one of acetools.world.vision.data.SUITES\n'
                                     'name: str = "x"  # free text, any value')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "00_tiny.ipynb"
    nbformat.write(nb, str(path))
    declared = notebook_parameters(path)
    assert parameter_choices(declared["suite"]) == ("suite", list(SUITES))
    assert parameter_choices(declared["name"]) is None
    assert check_parameters([path], {"suite": "tasks20", "name": "nosuch"}) == {"suite": "tasks20", "name": "nosuch"}
    with pytest.raises(ParameterTypeError, match="unknown suite 'nosuch'"):
        check_parameters([path], {"suite": "nosuch"})
    with pytest.raises(ValueError, match="acetools.nowhere.THINGS"):
        parameter_choices({"help": "one of acetools.nowhere.THINGS"}, "suite")


def test_only_the_pure_reports_render_without_code():
    """docs/style.md §13: the shipped diagnose notebook is a pure report (rendered without input);
    every course notebook is a lesson (rendered with its code)."""
    import nbformat

    from acetools.files.diagnose import REPORT_NOTEBOOK
    from acetools.notebooks import shows_code

    assert not shows_code(nbformat.read(str(REPORT_NOTEBOOK), as_version=4))
    assert all(shows_code(nbformat.read(str(p), as_version=4)) for p in notebook_paths())
