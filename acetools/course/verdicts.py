"""One verdict type and one comparison rule for every claim the course decides.

Every lesson decides the claims it owns (:mod:`acetools.course.claims`) with the helpers
here, so that a reader learns one rule:

* :class:`Verdict` — what a claim's check returns: ``measured`` (the measurement in words,
  with its numbers), ``verdict`` (one of :data:`VERDICTS`), ``reason`` (one line: the rule
  and how the numbers met it) and ``numbers`` (the raw values, JSON-able).
  ``claims.record(fig_dir, claim_id, v)`` stores it.
* **the comparison rule** (:func:`compare`): a difference between two measurements, in
  percentage points, *counts* when it exceeds :func:`margin` = ``max(NOISE, seed spread)``;
  otherwise it is a :data:`TIE`. :data:`NOISE` (0.5 points) is the only guard where there is
  one seed (or no seed spread to measure), and the spread over seeds of the paired difference
  takes over where it is larger.
* **turning checks into a verdict**: :func:`agreement` (every setting agrees -> reproduced,
  some -> partly, none -> not reproduced), :func:`criteria` (the same over named criteria),
  :func:`threshold` (a value against a reproduced / partly threshold).

Each lesson's ``verdict_*`` / ``assess_*`` functions state their thresholds against the
paper's own number (see their docstrings, and ``docs/course.md §Claim rules``); a rule that the
paper's own table would fail is a wrong rule, and the tests check each rule on the paper's
numbers (``tests/course/test_verdicts.py`` and the lessons' tests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

__all__ = [
    "NOISE",
    "TIE",
    "VERDICTS",
    "OUTCOMES",
    "Verdict",
    "margin",
    "compare",
    "counts",
    "agreement",
    "criteria",
    "threshold",
]

#: The smallest difference (percentage points of accuracy, or of energy / CKA x 100) that
#: counts, whatever the seeds say: the seed-to-seed noise of a mean accuracy in the
#: mini-world. The papers' smallest effects that their claims rest on are larger (ESM's
#: "PS helps SVD too" is +0.6 at 8 tasks, ACE's lead over TSV-M +1.5 to +2.0), so every
#: claim that the papers' tables support passes this floor on the papers' own numbers.
NOISE: float = 0.5

#: The word for a difference within the margin, everywhere in the course.
TIE: str = "tie"

#: The outcomes of :func:`compare`.
OUTCOMES: tuple[str, str, str] = ("better", TIE, "worse")

#: The verdict words: ``not testable here`` is for claims that need models or data this
#: toolkit does not have (e.g. GPT-2 on GLUE).
VERDICTS: tuple[str, ...] = ("reproduced", "partly", "not reproduced", "not testable here")


@dataclass(frozen=True)
class Verdict:
    """A claim's measurement and its verdict.

    ``measured``: the measurement in words with its numbers; ``verdict``: one of
    :data:`VERDICTS`; ``reason``: one line, the rule and how the numbers met it;
    ``numbers``: the raw values (JSON-able), stored with the verdict in ``claims.json``.
    """

    measured: str
    verdict: str
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise InputError(f"verdict {self.verdict!r} must be one of {VERDICTS}")

    def line(self, claim_id: str = "") -> str:
        """One line: ``[verdict] claim_id: measured — reason``."""
        head = f"[{self.verdict}] {claim_id}: " if claim_id else f"[{self.verdict}] "
        return f"{head}{self.measured} — {self.reason}"

    def __str__(self) -> str:
        return self.line()


def margin(spread: float | None = None, noise: float = NOISE) -> float:
    """The margin a difference must exceed to count: ``max(noise, spread)``; ``spread`` (the
    standard deviation over seeds of the paired difference) is ignored when it is missing or
    not finite (one seed)."""
    if spread is None or not math.isfinite(spread):
        return float(noise)
    return max(float(noise), float(spread))


def compare(diff: float, spread: float | None = None, noise: float = NOISE) -> str:
    """``"better"`` if ``diff`` > :func:`margin`, ``"worse"`` if ``diff`` < -margin, else
    :data:`TIE`. ``diff`` must be a finite number."""
    if diff is None or not math.isfinite(diff):
        raise InputError(f"diff={diff!r} is not a finite number")
    m = margin(spread, noise)
    if diff > m:
        return "better"
    if diff < -m:
        return "worse"
    return TIE


def counts(diff: float, spread: float | None = None, noise: float = NOISE) -> bool:
    """Whether ``diff`` is a gain that counts (``compare(...) == "better"``)."""
    return compare(diff, spread, noise) == "better"


def agreement(agree: Sequence[bool]) -> str:
    """``reproduced`` if every setting (suite, layer type, …) agrees with the claim, ``not
    reproduced`` if none does, ``partly`` otherwise."""
    agree = [bool(a) for a in agree]
    if not agree:
        raise InputError("no settings to decide on")
    if all(agree):
        return "reproduced"
    if not any(agree):
        return "not reproduced"
    return "partly"


def criteria(crit: Mapping[str, bool]) -> tuple[list[str], str]:
    """The criteria met, and the verdict: all -> reproduced, some -> partly, none -> not
    reproduced (:func:`agreement` over named criteria)."""
    met = [k for k, v in crit.items() if v]
    return met, agreement(list(crit.values()))


def threshold(value: float, reproduced: float, partly: float, *, higher: bool = True) -> str:
    """A value against two thresholds: ``>= reproduced`` -> reproduced, ``>= partly`` ->
    partly, else not reproduced (``higher=False``: ``<=`` for quantities where less is the
    claim)."""
    if higher:
        return "reproduced" if value >= reproduced else ("partly" if value >= partly else "not reproduced")
    return "reproduced" if value <= reproduced else ("partly" if value <= partly else "not reproduced")
