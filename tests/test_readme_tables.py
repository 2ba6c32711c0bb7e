"""The results tables come from the committed files (scripts/readme_tables.py) and cannot drift."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
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


def test_gamma_card_table_reads_a_cards_layer_types(tmp_path):
    pd.DataFrame({"layer_type": ["attention.self.query.weight", "output.dense.weight"], "n_matrices": [6, 6],
                  "gamma_median": [0.07, 0.4], "gated_fraction": [0.0, 0.5], "log_energy_mean": [-2.3, -1.0],
                  "log_energy_sd": [0.6, 0.7], "tau_ratio": [0.01, 0.02]}).to_csv(tmp_path / "card_per_layer.csv",
                                                                                   index=False)
    g = _script().gamma_card_table(tmp_path)
    assert g["layer_type"].tolist() == ["attention.self.query", "output.dense"]
    assert g["γ median"].tolist() == [0.07, 0.4] and g["share above τ_γ = 0.3 (%)"].tolist() == [0.0, 50.0]
