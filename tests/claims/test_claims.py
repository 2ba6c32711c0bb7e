"""acetools_course.claims: the registry, recording verdicts, and the collected table."""

from __future__ import annotations

import json

import pytest

from acetools_course import claims
from acetools_course.verdicts import World

W = World("mini-world", "full", {8: 4.1})
FIX = World("fixture", "quick", {3: 1.0}, fixture=True)


def test_registry_ids_are_unique_and_owned_by_course_notebooks():
    ids = [c.id for c in claims.CLAIMS]
    assert len(ids) == len(set(ids))
    from acetools.notebooks import notebook_paths

    stems = {p.stem for p in notebook_paths()}
    owners = {c.notebook for c in claims.CLAIMS}
    assert owners <= stems | {"01_theorem1", "02_ace_step_by_step", "03_esm_step_by_step", "04_benchmark", "05_claims"}
    assert {c.paper for c in claims.CLAIMS} == {"ACE", "ESM"}


def test_record_writes_merges_and_validates(tmp_path, caplog):
    caplog.set_level("INFO", logger="acetools_course.claims")
    d = tmp_path / "02_ace_step_by_step"
    claims.record(d, "ace.csp", "prior +0.3 pts", "partly", "within noise", world=W, delta=0.3)
    claims.record(d, "ace.refinement", "refine +1.2 pts", "reproduced", "above noise", world=W, delta=1.2)
    claims.record(d, "ace.csp", "prior +0.1 pts", "not reproduced", "no effect", world=W, delta=0.1,
                  measured_effect=0.1)  # replaces
    got = json.loads((d / "claims.json").read_text())
    assert set(got) == {"ace.csp", "ace.refinement"}
    assert got["ace.csp"]["verdict"] == "not reproduced" and got["ace.csp"]["numbers"] == {"delta": 0.1}
    assert got["ace.csp"]["notebook"] == "02_ace_step_by_step"
    assert got["ace.csp"]["world"]["name"] == "mini-world" and got["ace.csp"]["world"]["profile"] == "full"
    for f in claims.RECORD_FIELDS:  # every record carries the effect fields, numbers or null
        assert f in got["ace.refinement"]
    assert got["ace.csp"]["measured_effect"] == 0.1 and got["ace.csp"]["predicted_effect"] is None
    assert "[reproduced] ace.refinement" in caplog.text
    with pytest.raises(KeyError, match="valid ids"):
        claims.record(d, "ace.nope", "", "reproduced", "", world=W)
    with pytest.raises(ValueError, match="verdict"):
        claims.record(d, "ace.csp", "", "kind of", "", world=W)
    with pytest.raises(TypeError, match="world="):
        claims.record(d, "ace.csp", "", "partly", "")
    with pytest.raises(claims.MixedWorldsError, match="one file, one world"):
        claims.record(d, "ace.csp", "", "partly", "", world=FIX)


def test_table_lists_every_claim_and_marks_unmeasured(tmp_path):
    claims.record(tmp_path / "04_benchmark", "ace.sota", "ACE 2nd of 11", "not reproduced", "TSV-M ahead", world=W)
    df = claims.claims_table(tmp_path)
    assert len(df) == len(claims.CLAIMS)
    row = df.set_index("id").loc["ace.sota"]
    assert row.verdict == "not reproduced" and row.measured == "ACE 2nd of 11" and row.world == "mini-world"
    assert (df.verdict == "not measured").sum() == len(claims.CLAIMS) - 1
    counts = claims.verdict_counts(df)
    assert list(counts.columns[:5]) == list(claims.VERDICTS) and counts.loc["mini-world", "not reproduced"] == 1


def test_a_claim_is_judged_per_world_and_fixture_worlds_do_not_mix(tmp_path):
    text = World("text", "full", {8: 6.0})
    claims.record(tmp_path / "04_benchmark", "ace.sota", "a", "undecidable here", "small room", world=W)
    claims.record(tmp_path / "07_language", "ace.sota", "b", "reproduced", "room", world=text)
    df = claims.claims_table(tmp_path)
    assert sorted(df.loc[df.id == "ace.sota", "world"]) == ["mini-world", "text"]
    counts = claims.verdict_counts(df)
    assert counts.loc["text", "reproduced"] == 1 and counts.loc["mini-world", "undecidable here"] == 1
    claims.record(tmp_path / "02_ace_step_by_step", "ace.csp", "c", "partly", "r", world=FIX)
    with pytest.raises(claims.MixedWorldsError, match="fixture"):
        claims.collect(tmp_path)
    assert len(claims.collect(tmp_path, allow_mixed=True)) == 3


def test_record_takes_a_verdict(tmp_path):
    from acetools_course.verdicts import Verdict

    v = Verdict("prior +0.3 pts", "partly", "within the margin", {"delta": 0.3})
    entry = claims.record(tmp_path / "02_ace_step_by_step", "ace.csp", v, world=W, suite="tasks8")
    assert (entry["measured"], entry["verdict"], entry["reason"]) == (v.measured, v.verdict, v.reason)
    assert entry["numbers"] == {"delta": 0.3, "suite": "tasks8"}
    with pytest.raises(TypeError, match="no verdict"):
        claims.record(tmp_path, "ace.csp", v, verdict="reproduced", world=W)


TEXT = World("text", "full", {8: 6.0})
TEXT_FIX = World("text fixture", "quick", {3: 2.0}, fixture=True)


def test_the_text_worlds_claim_names_are_the_lessons():
    cw = claims.claim_world(quick=True, kind="text8")
    assert cw.name == claims.TEXT_CLAIM_WORLDS["quick"] == TEXT_FIX.name and cw.fixture and not cw.room
    assert claims.is_text_world_name(TEXT.name) and claims.is_text_world_name(TEXT_FIX.name)
    assert not claims.is_text_world_name(W.name) and not claims.is_text_world_name(FIX.name)
    assert claims.is_analogue("esm.sota", "text") and claims.is_analogue("ace.gamma_vit", "text fixture")
    assert not claims.is_analogue("ace.language_sota", "text") and not claims.is_analogue("esm.sota", "mini-world")
    assert claims.LANGUAGE_CLAIMS == {c.id for c in claims.CLAIMS if c.notebook == "07_language"} | {"ace.language"}


def test_a_text_claim_world_names_its_head_protocol():
    zs, tr = claims.claim_world(quick=True, kind="text8"), claims.claim_world(quick=True, kind="text8", heads="trained")
    assert tr.name == claims.TEXT_CLAIM_WORLDS["quick trained"] != zs.name and claims.is_text_world_name(tr.name)
    assert claims.is_text_world_name(claims.TEXT_CLAIM_WORLDS["full trained"])
    with pytest.raises(ValueError, match="heads='glue'"):
        claims.claim_world(quick=True, kind="text8", heads="glue")


def test_side_by_side_shows_both_worlds_and_labels_analogues(tmp_path):
    claims.record(tmp_path / "04_benchmark", "ace.sota", "a", "undecidable here", "small room", world=W)
    claims.record(tmp_path / "04_benchmark", "esm.sota", "b", "not reproduced", "r", world=W)
    claims.record(tmp_path / "04_benchmark-text8", "ace.sota", "c", "reproduced", "room", world=TEXT)
    claims.record(tmp_path / "07_language", "ace.gamma_bert", "d", "not reproduced", "low gamma", world=TEXT)
    g = claims.gather(tmp_path)
    assert g.worlds == ["mini-world", "text"]
    assert len(g.notes) == 1 and "04_benchmark-text8, 07_language" in g.notes[0] and "fixture" not in g.notes[0]
    table = claims.claims_table(tmp_path, records=g.records)
    both = claims.side_by_side(table)
    assert list(both.columns) == ["id", "paper", "mini-world", "text"]
    assert both.to_dict("records") == [{"id": "ace.sota", "paper": "ACE", "mini-world": "undecidable here",
                                        "text": "reproduced (analogue)"}]  # judged on one world only: not shown
    counts = claims.verdict_counts(table, split_analogues=True)
    assert counts.loc["text · analogues", "reproduced"] == 1 and counts.loc["text", "not reproduced"] == 1
    assert counts.loc["mini-world", "all"] == 2
    shown = claims.styled_table(table).data
    assert "text (analogue)" in set(shown["world"]) and "text" in set(shown["world"])


def test_gather_says_when_the_text_claims_are_missing_or_from_a_fixture(tmp_path):
    claims.record(tmp_path / "04_benchmark", "ace.sota", "a", "undecidable here", "small room", world=W)
    g = claims.gather(tmp_path)
    assert g.worlds == ["mini-world"] and "No text world's claims" in g.notes[0]
    # a fixture text world beside the real mini-world: left out, and said so
    claims.record(tmp_path / "07_language", "ace.gamma_bert", "d", "not reproduced", "low gamma", world=TEXT_FIX)
    with pytest.raises(claims.MixedWorldsError):
        claims.collect(tmp_path)
    g = claims.gather(tmp_path)
    assert g.worlds == ["mini-world"] and set(k[0] for k in g.records) == {"mini-world"}
    assert "Left out" in g.notes[0] and "text fixture" in g.notes[0] and "07_language" in g.notes[0]
    assert "No text world's claims" in g.notes[1]
    # the quick profile: both worlds fixtures, both kept, the text world's said to be the fixture's
    quick = tmp_path / "quick"
    claims.record(quick / "04_benchmark", "ace.sota", "a", "partly", "r", world=FIX)
    claims.record(quick / "04_benchmark-text8", "ace.sota", "c", "reproduced", "r", world=TEXT_FIX)
    g = claims.gather(quick)
    assert g.worlds == ["fixture", "text fixture"] and len(g.notes) == 1 and "fixture text world" in g.notes[0]
    both = claims.side_by_side(claims.claims_table(quick, records=g.records))
    assert both.set_index("id").loc["ace.sota", "text fixture"] == "reproduced (analogue)"


def test_claim_world_reads_the_mini_worlds_room():
    w = claims.claim_world(quick=False)  # the committed benchmark files
    assert w.name == "mini-world" and w.profile == "full" and not w.fixture
    assert sorted(w.room) == [8, 14, 20] and all(0 < r < 10 for r in w.room.values())
    assert sorted(w.room_abs) == [8, 14, 20]
    q = claims.claim_world(quick=True)
    assert q.fixture and q.profile == "quick" and q.room == {}
