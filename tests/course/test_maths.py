"""Textbook maths: the notebooks' equations are typeset (never code spans), every notebook links
the notation table, and the HTML reports typeset them offline with a local MathJax — checked in
headless Chromium, which also fails on tables wider than the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from tests import report_checks as R

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
needs_browser = pytest.mark.skipif(R.find_chromium() is None or R.mathjax_url() is None,
                                   reason="needs Debian's chromium and libjs-mathjax (scripts/setup.sh)")


@pytest.mark.parametrize("span", ["W_bar = (sum_t delta_W_t Sigma_t)(sum_t Sigma_t)^-1", "e_t = ||ΔW_t||_F²",
                                  "tau_t = ΔW_t", "W̃_tᵀ W̃_t", "gamma = Var_t(l_t) / Mean_t(l_t)²", "dO = X tau^T",
                                  "Sigma_t ∝ Cov[delta_W_t]", "k = int(d_out / T)"])
def test_an_equation_in_a_code_span_is_found(span):
    assert R.equation_code_spans(f"text `{span}` more") == [span]


@pytest.mark.parametrize("span", ['acetools.merge("ace", ...)', "quick=True", "tau_t", "Sigma_hat", "eps_mode",
                                  "figures/02_ace_step_by_step", "ace (eps 1e-5)", "W0", "attn.in_proj"])
def test_code_in_a_code_span_is_not_an_equation(span):
    assert R.equation_code_spans(f"text `{span}` and $\\sum_t \\Sigma_t$ and $$x = y^{{-1}}$$") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_equations_are_typeset_and_it_links_the_notation(path):
    nb = json.loads(path.read_text())
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    left = R.equation_code_spans(md)
    assert not left, f"{path.name}: equations left as code spans (typeset them as $…$): {left}"
    assert "docs/notation.md" in "".join(nb["cells"][0]["source"]), f"{path.name} does not link docs/notation.md"
    # display equations carry docs/methods.md's numbers
    methods = (REPO / "docs" / "methods.md").read_text() + (REPO / "docs" / "course.md").read_text()
    for tag in re.findall(r"\\tag\{([^}]+)\}", md):
        assert f"({tag})" in methods, f"{path.name}: \\tag{{{tag}}} is not an equation of docs/methods.md"


def test_the_notation_table_fixes_the_overloads():
    text = (REPO / "docs" / "notation.md").read_text()
    assert "`tau_t`" in text and r"\tau_\gamma" in text and r"\sum_t" in text
    methods = (REPO / "docs" / "methods.md").read_text()
    assert "(∑_t W_t Σ_t)(∑_t Σ_t)⁻¹" in methods and "(Σ_t W_t Σ_t)" not in methods  # ∑ sums, Σ covariances
    assert (REPO / "docs" / "rendered_equation.png").is_file()


def _render(tmp_path, cells, name="page") -> Path:
    nb = nbformat.v4.new_notebook(cells=cells, metadata=nbformat.read(str(NOTEBOOKS[0]), as_version=4).metadata)
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, str(path))
    from acetools.notebooks import render_html

    return render_html(path)


@pytest.mark.skipif(R.mathjax_url() is None, reason="needs a local MathJax (scripts/setup.sh installs libjs-mathjax)")
def test_reports_load_mathjax_locally_and_nothing_from_a_cdn(tmp_path):
    html = _render(tmp_path, [nbformat.v4.new_markdown_cell(r"$$\bar W = \Big(\sum_t W_t\Sigma_t\Big) \tag{ACE.1}$$")])
    text = html.read_text()
    assert R.mathjax_url().split("?")[0] in text
    assert not re.search(r"<script[^>]+src=\"https?://", text) and "cdnjs" not in text


@needs_browser
def test_a_report_renders_its_maths_in_chromium_and_a_broken_one_fails(tmp_path):
    src = (REPO / "notebooks" / "02_ace_step_by_step.ipynb")
    md = [c for c in nbformat.read(str(src), as_version=4).cells if c.cell_type == "markdown"]
    good = _render(tmp_path, md, "good")
    lay = R.chromium_layout(good)
    assert lay["rendered"] > 20 and lay["raw"] == 0 and lay["errors"] == 0
    assert R.check_rendered(good) == []
    broken = tmp_path / "broken.html"  # the same page with its MathJax missing: the TeX stays raw
    broken.write_text(good.read_text().replace(R.mathjax_url().split("?")[0], (tmp_path / "no.js").as_uri()))
    problems = R.check_rendered(broken)
    assert problems and "maths not rendered" in problems[0]


@needs_browser
def test_a_table_wider_than_the_page_fails(tmp_path):
    wide = "| " + " | ".join(f"column_{i}_with_a_long_header" for i in range(40)) + " |\n|" + "---|" * 40 + "\n"
    html = _render(tmp_path, [nbformat.v4.new_markdown_cell(wide)], "wide")
    problems = R.check_rendered(html)
    assert any("px wide, wider than the page (1280 px)" in p for p in problems), problems
