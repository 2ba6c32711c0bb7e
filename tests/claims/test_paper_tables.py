"""acetools_course.paper_tables and acetools_course.paper_tables: the published numbers, their name mapping and internal
consistency."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from acetools.merging import METHODS
from acetools.results import REFERENCES, kendall_tau
from acetools_course import claims
from acetools_course import paper_tables as cpt
from acetools_course import paper_tables as pt


def test_every_name_maps_to_a_registered_method_or_reference():
    for paper_name, ours in pt.NAME_MAP.items():
        assert ours is None or ours in METHODS, paper_name
    for paper_name, ours in pt.REFERENCE_MAP.items():
        assert ours in REFERENCES, paper_name
    assert pt.registry_name("ACE-Merging") == "ace" and pt.registry_name("Consensus TA") is None
    with pytest.raises(KeyError):
        pt.registry_name("AdaMerging")
    assert set(pt.VISION["method_paper"]) <= set(pt.NAME_MAP) | set(pt.REFERENCE_MAP)


def test_seed_numbers_are_there():
    ace = pt.paper_column("ace", "ViT-B/32", 8)
    assert ace["ace"] == 87.9 and ace["tsv_m"] == 85.9 and ace["weight_averaging"] == 66.3
    assert pt.paper_column("ace", "ViT-L/14", 20)["ace"] == 89.5
    esm = pt.paper_column("esm", "ViT-B/16", 20)
    assert esm.to_dict() == {"task_arithmetic": 65.8, "tsv_m": 80.6, "iso_cts": 82.4, "esm": 84.9}
    assert pt.paper_column("esm", "ViT-L/14", 14)["esm"] == 91.3
    with pytest.raises(KeyError):
        pt.paper_column("ace", "ViT-B/16", 8)


def test_claim_texts_quote_the_table_numbers():
    """The claim registry's numbers are the tables' (so the two cannot drift apart)."""
    sota = claims.claim("ace.sota").text
    for (bb, n), v in zip(pt.COMPARISONS["ace"].values(), ("87.9", "86.1", "89.5")):
        assert f"{pt.paper_column('ace', bb, n)['ace']:.1f}" == v and v in sota
    for n in (8, 14, 20):
        col = pt.paper_column("esm", "ViT-B/16", n)
        text = claims.claim("esm.sota").text
        assert f"{col['esm']:.1f}" in text and f"{col['iso_cts']:.1f}" in text


def test_overlapping_cells_agree_across_sources():
    v = pt.vision_long()
    spec = v[v["table"] == "spec"].set_index(["backbone", "n_tasks", "method_paper"])["accuracy"]
    canon = {"Weight Avg": "Weight Averaging", "ESM (Ours)": "ESM"}
    checked = 0
    for r in v[v["table"] != "spec"].itertuples():
        key = (r.backbone, r.n_tasks, canon.get(r.method_paper, r.method_paper))
        if key in spec.index:
            assert spec[key] == r.accuracy, (r.table, key)
            checked += 1
    assert checked >= 30


def test_each_column_has_one_row_per_method():
    v = pt.vision_long()
    dup = v.dropna(subset=["method"]).duplicated(["table", "backbone", "n_tasks", "method"])
    assert not dup.any()
    assert len(pt.paper_column("spec", "ViT-B/16", 20)) == 9  # Consensus TA and references dropped


def test_comparisons_and_claimed_ranks():
    for table, cols in pt.COMPARISONS.items():
        assert sorted(cols) == [8, 14, 20]
        for n in cols:
            assert len(pt.comparison_columns(table, n)) >= 4
    with pytest.raises(KeyError, match="no comparison"):
        pt.comparison_columns("ace", 10)
    with pytest.raises(ValueError):
        pt.vision_long("nope")
    # the claimed ranks agree with ACE's own table (up to the CART/TSV-M near-tie)
    r = cpt.ACE_CLAIMED_RANKS
    for n in (8, 14, 20):
        col = pt.comparison_columns("ace", n)
        assert kendall_tau(col[r.index].to_numpy(), r.to_numpy()) >= 0.9
    assert r["cart"] == r["tsv_m"]


def test_esm_ablation_matches_main_table_and_claims():
    ab = cpt.ESM_ABLATION.set_index(["decomposition", "scaling"])
    assert ab.loc[("SVD", "none"), "tasks8"] == pt.paper_column("esm", "ViT-B/16", 8)["tsv_m"]
    assert ab.loc[("ESD", "all"), "tasks20"] == pt.paper_column("esm", "ViT-B/16", 20)["esm"]
    gain = ab.loc[("ESD", "none")] [["tasks8", "tasks20"]] - ab.loc[("SVD", "none")][["tasks8", "tasks20"]]
    nums = re.findall(r"\+(\d\.\d)", claims.claim("esm.esd_alone").text)
    assert [f"{g:.1f}" for g in gain] == nums


def test_language_table():
    lang = cpt.LANGUAGE
    assert isinstance(lang, pd.DataFrame)
    ace = lang[lang["method_paper"] == "ACE-Merging"].set_index("model")["value"]
    assert ace["GPT-2"] == 74.1 and ace["RoBERTa-Base"] == 90.4 and ace["RoBERTa-Large"] == 91.7
    wudi = lang[lang["method_paper"] == "WUDI-Merging"].set_index("model")["value"]
    assert round(ace["RoBERTa-Base"] - wudi["RoBERTa-Base"], 1) == 5.1
