"""The README's tables come from the committed files (scripts/readme_tables.py) and cannot drift."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("readme_tables", REPO / "scripts" / "readme_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_tables_are_generated_from_the_committed_files():
    mod = _script()
    readme = (REPO / "README.md").read_text()
    assert mod.render(readme) == readme, "README.md's tables drifted: run python3 scripts/readme_tables.py"


def test_a_drifted_table_is_caught_and_a_missing_block_named():
    mod = _script()
    readme = (REPO / "README.md").read_text()
    drifted = readme.replace("| ace | ", "| ace | 99.9 ± 0.0 / ", 1)
    assert mod.render(drifted) == readme  # the block is rewritten from the files
    with pytest.raises(ValueError, match="targets"):
        mod.render(readme.replace("<!-- generated: targets -->", "").replace("<!-- /generated: targets -->", ""))


def test_readme_carries_no_raw_reprs():
    readme = (REPO / "README.md").read_text()
    assert "{'tasks8'" not in readme and "TSV-M - TA:" not in readme
    assert "no orthogonalisation can separate them" not in readme
