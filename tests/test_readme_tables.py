"""The results tables come from the committed files (scripts/readme_tables.py) and cannot drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]


def _script():
    return load_script("readme_tables")


def _pages(mod) -> dict[str, str]:
    return {page: (REPO / page).read_text() for page in mod.PAGES}


def test_tables_are_generated_from_the_committed_files():
    mod = _script()
    pages = _pages(mod)
    rendered = mod.render_pages(pages)
    for page, text in pages.items():
        assert rendered[page] == text, f"{page}'s tables drifted: run python3 scripts/readme_tables.py"


def test_a_drifted_table_is_caught_and_a_missing_block_named():
    mod = _script()
    pages = _pages(mod)
    holder = next(p for p, text in pages.items() if "<!-- generated: benchmark -->" in text)
    drifted = pages[holder].replace("| ace | ", "| ace | 99.9 ± 0.0 / ", 1)
    assert drifted != pages[holder]
    assert mod.render(drifted) == pages[holder]  # the block is rewritten from the files
    cut = dict(pages)
    cut[holder] = pages[holder].replace("<!-- generated: targets -->", "").replace("<!-- /generated: targets -->", "")
    with pytest.raises(ValueError, match="targets"):
        mod.render_pages(cut)
    doubled = dict(pages)
    doubled["README.md"] = pages["README.md"] + "\n<!-- generated: room -->\n<!-- /generated: room -->\n"
    with pytest.raises(ValueError, match="room"):
        mod.render_pages(doubled)


def test_pages_carry_no_raw_reprs():
    for page in _pages(_script()).values():
        assert "{'tasks8'" not in page and "TSV-M - TA:" not in page
        assert "no orthogonalisation can separate them" not in page
