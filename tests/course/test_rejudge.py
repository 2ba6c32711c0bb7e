"""The committed claims: every record carries its world and effect fields, and its verdict is
what today's rules give on the numbers it holds (acetools.course.rejudge, scripts/rejudge_claims.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acetools.course import claims
from acetools.course.rejudge import PENDING, rejudge
from acetools.course.verdicts import VERDICTS

FIGURES = Path(__file__).resolve().parents[2] / "figures"
FILES = sorted(FIGURES.glob("*/claims.json"))


def test_there_are_committed_claims():
    assert len(FILES) >= 5


@pytest.mark.parametrize("path", FILES, ids=[p.parent.name for p in FILES])
def test_every_committed_record_carries_world_and_effects(path):
    for cid, e in json.loads(path.read_text()).items():
        assert e["verdict"] in VERDICTS, cid
        assert e["world"]["name"] and e["world"]["profile"] == "full", cid  # the mini-world, the text world, …
        assert not e["world"]["fixture"], cid
        for f in claims.RECORD_FIELDS:
            assert f in e, (cid, f)
            assert e[f] is None or isinstance(e[f], (int, float)), (cid, f, e[f])
        if e["predicted_effect"] is not None:  # a prediction comes with its floor, measurement and rule
            assert e["noise_floor"] is not None and e["measured_effect"] is not None and e["scaling"], cid
        if e["verdict"] == "undecidable here":
            assert abs(e["predicted_effect"]) <= e["noise_floor"] + 1e-12, cid
        if cid in PENDING:
            assert "pending rerun" in e["reason"] and e["numbers"]["pending_rerun"] == PENDING[cid], cid


def test_committed_verdicts_are_todays_rules(tmp_path):
    import shutil

    shutil.copytree(FIGURES, tmp_path / "figures")
    rows = rejudge(tmp_path / "figures", write=False)
    assert len(rows) == sum(len(json.loads(p.read_text())) for p in FILES)
    drift = [(r["id"], r["before"], r["after"]) for r in rows if r["changed"]]
    assert not drift, f"committed verdicts differ from today's rules: {drift}; run scripts/rejudge_claims.py"
    # and rewriting changes no verdict
    rejudge(tmp_path / "figures")
    again = claims.collect(tmp_path / "figures")
    now = claims.collect(FIGURES)
    assert {k: e["verdict"] for k, e in again.items()} == {k: e["verdict"] for k, e in now.items()}
