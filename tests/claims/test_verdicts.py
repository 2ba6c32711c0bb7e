"""acetools_course.verdicts: the one verdict type and the one comparison rule."""

from __future__ import annotations

import math

import pytest

from acetools_course import verdicts as V
from acetools_course.claims import VERDICTS


def test_one_vocabulary():
    assert V.VERDICTS == VERDICTS == ("reproduced", "partly", "not reproduced", "undecidable here",
                                      "not testable here")
    assert V.TIE == "tie"
    assert V.NOISE == 0.5


def test_verdict_validates_and_reads_as_one_line():
    v = V.Verdict("ACE +2.0 vs TSV-M", "reproduced", "beyond the margin", {"diff": 2.0})
    assert v.line("ace.sota") == "[reproduced] ace.sota: ACE +2.0 vs TSV-M — beyond the margin"
    assert str(v) == "[reproduced] ACE +2.0 vs TSV-M — beyond the margin"
    with pytest.raises(ValueError, match="must be one of"):
        V.Verdict("x", "kind of", "y")


def test_margin_is_noise_or_the_seed_spread():
    assert V.margin() == 0.5 and V.margin(math.nan) == 0.5 and V.margin(0.2) == 0.5
    assert V.margin(0.9) == 0.9 and V.margin(0.1, noise=0.05) == 0.1


def test_compare_counts_only_beyond_the_margin():
    assert V.compare(0.6) == "better" and V.compare(-0.6) == "worse"
    assert V.compare(0.5) == "tie" and V.compare(-0.5) == "tie"  # exactly the margin is a tie
    assert V.compare(0.8, spread=1.0) == "tie" and V.compare(1.1, spread=1.0) == "better"
    assert V.compare(0.3, noise=0.2) == "better"
    with pytest.raises(ValueError, match="finite"):
        V.compare(float("nan"))
    # the smallest effects the papers' claims rest on count: ESM's "PS helps SVD too" +0.6 at 8 tasks,
    # ACE over TSV-M +1.5 at 14 tasks
    assert V.compare(89.6 - 89.0) == "better" and V.compare(86.1 - 84.6) == "better"


def test_agreement_criteria_threshold():
    assert V.agreement([True, True]) == "reproduced"
    assert V.agreement([True, False]) == "partly"
    assert V.agreement([False]) == "not reproduced"
    with pytest.raises(ValueError):
        V.agreement([])
    assert V.criteria({"a": True, "b": False}) == (["a"], "partly")
    assert V.criteria({"a": True}) == (["a"], "reproduced")
    assert [V.threshold(x, 0.9, 0.7) for x in (0.95, 0.9, 0.8, 0.1)] == ["reproduced", "reproduced", "partly",
                                                                         "not reproduced"]
    assert [V.threshold(x, 3, 10, higher=False) for x in (2, 5, 11)] == ["reproduced", "partly", "not reproduced"]


def test_predict_scales_by_the_rooms():
    # ACE's lead over TSV-M at 8 tasks (+2.0 in a table whose room is 15.1) in a world with room 4.1
    assert V.predict(2.0, 15.1, 4.1) == pytest.approx(2.0 * 4.1 / 15.1)
    assert V.predict(2.0, 15.1, -1.0) == 0.0  # no room: no effect predicted
    with pytest.raises(ValueError, match="paper_room"):
        V.predict(2.0, 0.0, 4.1)
    with pytest.raises(ValueError, match="world_room"):
        V.predict(2.0, 15.1, math.nan)


def test_effect_decidable_and_decide():
    e = V.effect("t8", -3.0, paper=2.0, paper_room=15.1, world_room=8.0)  # predicted 1.06 >= 2 x 0.5
    assert e.decidable and e.floor == 0.5 and e.measured == -3.0
    u = V.effect("t14", 1.0, paper=1.5, paper_room=14.1, world_room=3.1)  # 0.33 < 1.0
    assert not u.decidable
    # predicted 0.54 beyond the 0.5 floor, but a true effect there is measured beyond it only half the time
    assert not V.effect("t8", 0.0, paper=2.0, paper_room=15.1, world_room=4.1).decidable
    assert not V.effect("t8", 0.0, paper=2.0, paper_room=15.1, world_room=8.0, spread=0.9).decidable  # sd wins
    # no paper number, no prediction: nothing lacks power, but the setting decides nothing (the one rule, (V.7))
    bare = V.effect("t8", 0.0)
    assert bare.decidable and not bare.decides and bare.predicted is None and not bare.as_dict()["decidable"]
    assert e.decides and not u.decides
    with pytest.raises(ValueError, match="paper_room"):
        V.effect("t8", 0.0, paper=1.0)
    assert V.decide([e, u], [False, True]) == ("not reproduced", "undecidable: t14 (predicted +0.33, needs ≥ 1.00)")
    assert V.decide([u], [True])[0] == V.UNDECIDABLE  # whatever the measurement says
    with pytest.raises(ValueError):
        V.decide([e], [True, False])


def test_verdict_record_fields_from_the_most_decidable_setting():
    e = V.effect("t8", -3.0, paper=2.0, paper_room=15.1, world_room=4.1)
    u = V.effect("t14", 1.0, paper=1.5, paper_room=14.1, world_room=3.1)
    v = V.Verdict("m", "not reproduced", "r", {}, (u, e))
    f = v.record_fields()
    assert f["effect_setting"] == "t8" and f["measured_effect"] == -3.0 and f["paper_effect"] == 2.0
    assert f["predicted_effect"] == pytest.approx(2.0 * 4.1 / 15.1) and f["noise_floor"] == 0.5
    assert "4.10 / 15.10" in f["scaling"] and len(f["effects"]) == 2
    plain = V.Verdict("cos 0.96", "reproduced", "r", value=0.96).record_fields()
    assert plain["measured_effect"] == 0.96 and plain["predicted_effect"] is None and plain["noise_floor"] is None


def test_world_room_from_a_summary_and_round_trip():
    import pandas as pd

    s = pd.DataFrame({"n_tasks": [8] * 4 + [20] * 2, "seed": [0, 0, 1, 1, 0, 0],
                      "method": ["tsv_m", "task_arithmetic"] * 3, "test_normalized": [90, 86, 91, 86, 80, 77]})
    w = V.World.from_summary(s, "mini-world", "full")
    assert w.room == {8: 4.5, 20: 3.0} and w.room_at(20) == 3.0
    with pytest.raises(KeyError, match="no normalized room at 14"):
        w.room_at(14)
    assert V.World.from_dict(w.as_dict()) == w
    with pytest.raises(ValueError, match="profile"):
        V.World("x", "fast")


def test_the_text_world_plugs_into_the_same_machinery():
    """A second world (the text world) judges ACE's language lead with its own room and noise."""
    import pandas as pd

    from acetools_course import lesson07_language as lang

    rows = [{"seed": s, "method": m, "test_normalized": v} for s in (0, 1, 2)
            for m, v in (("ace (eps 2e-4)", 80.0 + s * 0.1), ("wudi", 79.0), ("ties", 70.0), ("tsv_m", 78.0))]
    per_seed = pd.DataFrame(rows)
    plain = lang.verdict_sota(per_seed)
    assert plain.verdict == "reproduced"  # every lead beyond NOISE, no prediction to scale
    roomy = V.World("text", "full", {8: 10.9})  # RoBERTa-GLUE's own room: every prediction is the paper's lead
    r = lang.verdict_sota(per_seed, world=roomy)
    assert r.verdict == "reproduced" and {e.setting: e.predicted for e in r.effects}["wudi"] == pytest.approx(5.1)
    tight = V.World("text", "full", {8: 0.5})  # WUDI's +5.1 predicts 0.23 here: undecidable; TIES, TSV-M decide
    t = lang.verdict_sota(per_seed, world=tight)
    assert "undecidable: wudi" in t.reason and t.verdict == "reproduced"


def test_power_rule_decides_only_where_a_prediction_has_power():
    """(V.7): settings without a paper number or without power decide nothing; the claim then is undecidable here
    and names the effect the world would need; otherwise it is judged at its deciding settings and says how many."""
    strong = V.effect("t8", 1.5, paper=2.0, paper_room=4.0, world_room=4.0)  # predicted 2.0 >= 2 x 0.5
    weak = V.effect("t14", 1.5, paper=0.5, paper_room=4.0, world_room=4.0)  # predicted 0.5 < 1.0
    bare = V.effect("t20", 3.0, se=0.4)  # no paper number; margin 1.96 x 0.4 = 0.78
    none = V.power_rule(V.Verdict("m", "reproduced", "r", {}, (weak, bare)))
    assert none.verdict == V.UNDECIDABLE and none.numbers["power_rule"]["deciding"] == []
    assert "at least 1.00 points" in none.reason and "(1 of 2 have no paper number" in none.reason
    assert none.numbers["power_rule"]["before"] == "reproduced"
    judged = V.power_rule(V.Verdict("m", "partly", "r", {}, (strong, weak, bare)))
    assert judged.verdict == "partly" and "judged at 1 of 3 settings (t8)" in judged.reason
    assert V.power_rule(judged) == judged  # idempotent: record() applies it to what rejudge already ruled
    # a unit-free prediction (Kendall tau) needs to exceed its chance floor, not twice it: the claimed order's own
    # tau, 0.95, at a floor of 0.95 decides nothing (ace.ordering)
    tau = V.Effect("T=8", 0.95, None, None, 0.95, 0.95, 0.53)
    ordering = V.power_rule(V.Verdict("tau 0.53", "not reproduced", "r", {}, (tau,)))
    assert ordering.verdict == V.UNDECIDABLE and ordering.numbers["power_rule"]["needed"] == 0.95
    assert "beyond its chance floor at T=8" in ordering.reason


def test_power_rule_a_contradicting_setting_makes_a_claim_not_reproduced():
    """A claim judged at several settings is reproduced or partly only if no deciding setting is measured beyond its
    margin against the predicted sign; an undecidable one (no power) cannot contradict it."""
    up = V.effect("eps 1e-2", 2.3, paper=2.0, paper_room=4.0, world_room=4.0)
    down = V.effect("eps 1e-5", -1.9, paper=2.0, paper_room=4.0, world_room=4.0)
    weak_down = V.effect("eps 2e-4", -1.9, paper=0.4, paper_room=4.0, world_room=4.0)
    v = V.power_rule(V.Verdict("m", "partly", "r", {}, (up, down)))
    assert v.verdict == "not reproduced" and v.numbers["power_rule"]["against"] == ["eps 1e-5"]
    assert "eps 1e-5 decides the opposite sign" in v.reason
    assert V.power_rule(V.Verdict("m", "reproduced", "r", {}, (up, weak_down))).verdict == "reproduced"
    # not testable and non-comparative verdicts pass unchanged
    nt = V.Verdict("m", V.NOT_TESTABLE, "r", {}, (down,))
    assert V.power_rule(nt) is nt
    plain = V.Verdict("cos 0.96", "reproduced", "r", value=0.96)
    assert V.power_rule(plain) is plain
