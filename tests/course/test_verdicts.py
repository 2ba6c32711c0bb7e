"""acetools.course.verdicts: the one verdict type and the one comparison rule."""

from __future__ import annotations

import math

import pytest

from acetools.course import verdicts as V
from acetools.course.claims import VERDICTS


def test_one_vocabulary():
    assert V.VERDICTS == VERDICTS == ("reproduced", "partly", "not reproduced", "not testable here")
    assert V.TIE == "tie" and V.OUTCOMES == ("better", "tie", "worse")
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
    assert V.counts(0.6) and not V.counts(0.4)
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
