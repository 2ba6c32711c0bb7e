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


def test_results_prose_states_no_number_outside_the_generated_blocks():
    """docs/results.md's worlds' prose (the two world sections) states its numbers only inside generated
    blocks: the sentences that contradicted the regenerated table ("ACE level with WUDI at lr 1e-4", "Iso-CTS
    the best structured merge at 96.1") are gone, and the text prose quotes its own table's numbers."""
    import re

    mod = _script()
    page = (REPO / "docs" / "results.md").read_text()
    assert "level with WUDI at lr 1e-4" not in page and "Iso-CTS at 96.1" not in page
    worlds = page[page.index("## The vision mini-world"):page.index("## Merging files")]
    prose = mod.BLOCK.sub("", worlds)
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)  # the commands
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith(("|", "![")))
    stated = re.findall(r"(?<![\w.=/-])\d+\.\d+(?![\w.])", prose)
    assert not stated, f"numbers in docs/results.md's prose outside the generated blocks: {stated}"
    text = mod.text_world_prose()
    _, mean = mod.benchmark_tables(REPO / "figures" / "benchmark", "text8")
    norm = mean.set_index("method")["test_normalized"]
    assert f"TSV-M − task arithmetic is {norm['tsv_m'] - norm['task_arithmetic']:.1f}" in text
    assert f"({norm['ace (eps 2e-4)']:.1f})" in text


def test_verdict_counts_agree_in_lesson_05_the_readme_and_results():
    """Lesson 05's committed table (figures/05_claims/claims_table.csv), docs/results.md's claims block and the
    committed claims.json files give one verdict per claim and world, so the same counts; the README states no
    counts of its own (it points to docs/results.md)."""
    import json
    import re

    from acetools_course.verdicts import VERDICTS

    files = sorted((REPO / "figures").glob("*/claims.json"))
    now = {(e["world"]["name"], cid): (e["paper"], e["verdict"]) for p in files
           for cid, e in json.loads(p.read_text()).items()}
    shown = pd.read_csv(REPO / "figures" / "05_claims" / "claims_table.csv")
    shown = shown[shown["verdict"] != "not measured"]
    lesson = {(r.world, r.id): (r.paper, r.verdict) for r in shown.itertuples()}
    assert lesson == now, "rerun 05_claims in the full profile: its table differs from the claim records " + \
        str(sorted(set(lesson.items()) ^ set(now.items())))
    page = (REPO / "docs" / "results.md").read_text()
    block = page[page.index("<!-- generated: claims -->"):page.index("<!-- /generated: claims -->")]
    for paper in ("ACE", "ESM"):
        row = next(line for line in block.splitlines() if line.startswith(f"| {paper} |"))
        got = [int(x) for x in row.strip("|").split("|")[1:]]
        assert got == [sum(1 for p, v in now.values() if p == paper and v == w) for w in VERDICTS], paper
    readme = (REPO / "README.md").read_text()
    assert not re.search(r"\d+\s+(?:claims? )?(?:reproduced|undecidable here|not reproduced)\b", readme)
