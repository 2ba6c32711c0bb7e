"""One verdict type and one comparison rule for every claim the course decides (docs/course.md §Verdicts).

:class:`Verdict` is what a claim's check returns; :func:`compare` and :func:`margin` are the
comparison rule (docs/course.md §Noise rule); :func:`agreement`, :func:`criteria` and
:func:`threshold` turn checks into a verdict; :class:`World`, :class:`Effect`, :func:`effect` and
:func:`decide` scale a paper's effect to this world (:data:`SCALING_RULE`, docs/course.md §Scaling rule)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from acetools.errors import InputError, InputKeyError

from .power import POWER_FACTOR, ceiling_prediction, has_power
from .stats import Z_95

#: The smallest difference (points) that counts, whatever the seeds say (docs/course.md §Noise rule).
NOISE: float = 0.5

#: The word for a difference within the margin, everywhere in the course.
TIE: str = "tie"

#: The verdict of a claim whose predicted effect is at or below the floor everywhere (docs/course.md §Scaling rule).
UNDECIDABLE: str = "undecidable here"
#: The verdict for a claim that needs models or data this world does not have (e.g. GPT-2 on
#: GLUE in the vision world), or a stage that does not run in it.
NOT_TESTABLE: str = "not testable here"

#: The five verdict words.
VERDICTS: tuple[str, ...] = ("reproduced", "partly", "not reproduced", UNDECIDABLE, NOT_TESTABLE)

#: How a paper's effect is carried into a world (docs/course.md §Claim rules, lesson 05).
SCALING_RULE: str = (
    "predicted = paper effect × (world room ÷ paper room), where room = TSV-M − task arithmetic at the same "
    "number of tasks (the paper's in the table column the claim comes from, in that table's points; the "
    "world's in its normalized points, mean over seeds), so predicted is in the world's normalized points; "
    "its size capped at the headroom left above the rival (the experts' level minus the rival); a setting is "
    "decidable when |predicted| >= 2 × margin, margin = max(NOISE, the 95 % half-width of the paired difference: "
    "a bootstrap over the test examples combined with a t interval over the seeds, (V.8)), or max(NOISE, seed sd "
    "of the paired difference) where the result files have no per-example results; a setting without a paper "
    "number decides nothing, and a claim with no deciding setting is 'undecidable here', whatever the "
    "measurement says (V.7)")


@dataclass(frozen=True)
class Verdict:
    """A claim's measurement in words, its verdict (:data:`VERDICTS`), a one-line reason and the raw
    ``numbers`` (JSON-able), stored in ``claims.json``."""

    measured: str
    verdict: str
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    #: per setting (suite, layer type, …): the paper's effect, its prediction here, the floor
    #: and the measurement (:class:`Effect`); empty for claims that are not a comparison. Any
    #: sequence is accepted; it is stored as a tuple (the verdict is frozen)
    effects: Sequence[Effect] = ()
    #: the measurement in the claim's own unit where the claim is not a comparison (a cosine,
    #: a share, a ratio); None otherwise (then :attr:`measured_effect` comes from ``effects``)
    value: float | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise InputError(f"verdict {self.verdict!r} must be one of {VERDICTS}")
        object.__setattr__(self, "effects", tuple(self.effects))

    def _headline(self) -> Effect | None:
        """The setting that speaks for the claim: the most decidable one (largest
        ``|predicted| - needed``; settings without a prediction last)."""
        if not self.effects:
            return None
        return max(self.effects, key=lambda e: (e.predicted is not None,
                                                 -math.inf if e.predicted is None else abs(e.predicted) - e.needed))

    @property
    def predicted_effect(self) -> float | None:
        e = self._headline()
        return None if e is None else e.predicted

    @property
    def noise_floor(self) -> float | None:
        e = self._headline()
        return None if e is None else e.floor

    @property
    def measured_effect(self) -> float | None:
        e = self._headline()
        return self.value if e is None else e.measured

    @property
    def paper_effect(self) -> float | None:
        e = self._headline()
        return None if e is None else e.paper

    def record_fields(self) -> dict[str, Any]:
        """The fields every claim record carries (``claims.json``): ``predicted_effect``,
        ``noise_floor``, ``measured_effect``, ``paper_effect`` (numbers or None), ``scaling``
        (the rule with this claim's numbers, or None), ``effect_setting`` (the setting these
        come from), ``standard_error`` and ``margin_rule`` (how the floor was set: docs/course.md
        §Margin, power and rivals) and ``effects`` (every setting's)."""
        e = self._headline()
        return {"predicted_effect": _num(self.predicted_effect), "noise_floor": _num(self.noise_floor),
                "measured_effect": _num(self.measured_effect), "paper_effect": _num(self.paper_effect),
                "scaling": None if e is None else e.scaling(), "effect_setting": None if e is None else e.setting,
                "standard_error": None if e is None else _num(e.se),
                "margin_rule": None if e is None or e.measured is None else e.margin_rule(),
                "effects": [x.as_dict() for x in self.effects]}

    def with_reason(self, reason: str, **numbers: Any) -> Verdict:
        """A copy with another reason and more numbers (the effects kept)."""
        return Verdict(self.measured, self.verdict, reason, {**self.numbers, **numbers}, self.effects, self.value)

    def line(self, claim_id: str = "") -> str:
        """One line: ``[verdict] claim_id: measured — reason``."""
        head = f"[{self.verdict}] {claim_id}: " if claim_id else f"[{self.verdict}] "
        return f"{head}{self.measured} — {self.reason}"

    def __str__(self) -> str:
        return self.line()


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class World:
    """The world a claim is judged in: ``name``, ``profile``, ``room`` = ``{n_tasks: TSV-M − task
    arithmetic}`` (normalized points), ``noise``, ``fixture`` (numbers that check code, not results)
    and a ``description`` for the page."""

    name: str
    profile: str
    room: Mapping[int, float] = field(default_factory=dict)
    noise: float = NOISE
    fixture: bool = False
    description: str = ""
    #: the room in absolute accuracy points, for claims measured in absolute accuracy
    room_abs: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.profile not in ("full", "quick"):
            raise InputError(f"World.profile={self.profile!r} must be 'full' or 'quick'")
        object.__setattr__(self, "room", {int(k): float(v) for k, v in dict(self.room).items()})
        object.__setattr__(self, "room_abs", {int(k): float(v) for k, v in dict(self.room_abs).items()})

    def room_at(self, n_tasks: int, unit: str = "normalized") -> float:
        """The room at ``n_tasks`` tasks in ``unit`` (``"normalized"`` or ``"absolute"``
        points; KeyError naming the rooms this world has)."""
        if unit not in ("normalized", "absolute"):
            raise InputError(f"unit={unit!r} must be 'normalized' or 'absolute'")
        rooms = self.room if unit == "normalized" else self.room_abs
        try:
            return rooms[int(n_tasks)]
        except KeyError:
            raise InputKeyError(f"world {self.name!r} has no {unit} room at {n_tasks} tasks; it has "
                           f"{sorted(rooms)}") from None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "profile": self.profile, "room": {str(k): v for k, v in self.room.items()},
                "room_abs": {str(k): v for k, v in self.room_abs.items()},
                "noise": self.noise, "fixture": self.fixture, "description": self.description}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> World:
        return cls(d["name"], d["profile"], {int(k): v for k, v in d.get("room", {}).items()},
                   float(d.get("noise", NOISE)), bool(d.get("fixture", False)), d.get("description", ""),
                   {int(k): v for k, v in d.get("room_abs", {}).items()})

    @classmethod
    def from_summary(cls, summary: Any, name: str, profile: str, *, fixture: bool = False, description: str = "",
                     metric: str = "test_normalized", noise: float = NOISE) -> World:
        """The world whose room is measured in ``summary`` (a results summary frame with
        ``n_tasks``, ``method``, ``seed`` and ``metric``): TSV-M − task arithmetic per number
        of tasks, paired per seed, mean over seeds. Numbers of tasks without both methods
        have no room."""
        d = summary[summary["method"].isin(["tsv_m", "task_arithmetic"])]

        def rooms(col: str) -> dict[int, float]:
            out = {}
            if col not in d.columns:
                return out
            for n, g in d.groupby("n_tasks"):
                p = g.pivot_table(index="seed", columns="method", values=col)
                if {"tsv_m", "task_arithmetic"} <= set(p.columns):
                    diff = (p["tsv_m"] - p["task_arithmetic"]).dropna()
                    if len(diff):
                        out[int(n)] = float(diff.mean())
            return out

        return cls(name, profile, rooms(metric), noise, fixture, description, rooms("test_acc"))


@dataclass(frozen=True)
class Effect:
    """One setting of a comparative claim: the paper's effect and room, the world's room, the
    prediction (:func:`predict`), the noise floor (:func:`margin`) and the measured effect, all
    in points (the paper's in its table's, the rest in the world's normalized points)."""

    setting: str
    paper: float | None
    paper_room: float | None
    world_room: float | None
    predicted: float | None
    floor: float
    measured: float | None
    #: the paired bootstrap standard error of the measurement (None: the floor is the seed rule's)
    se: float | None = None
    #: the expert seeds the measurement rests on, where the verdict knows them (1: a stage ablation's one seed)
    seeds: int | None = None

    @property
    def scaled(self) -> bool:
        return self.paper_room is not None and self.world_room is not None

    @property
    def needed(self) -> float:
        """The smallest prediction that decides here: ``POWER_FACTOR × floor`` for a scaled prediction
        (:func:`acetools_course.power.has_power`), the floor for a unit-free one."""
        return POWER_FACTOR * self.floor if self.scaled else self.floor

    @property
    def decidable(self) -> bool:
        """Whether the paper's prediction here has the power to decide (docs/course.md §Margin, power and rivals): a
        scaled one at least twice the floor, a unit-free one beyond it. Without a prediction there is nothing to
        lack power (True here), but such a setting decides nothing under the one rule ((V.7), :func:`power_rule`):
        :attr:`decides`."""
        if self.predicted is None:
            return True
        return has_power(self.predicted, self.floor) if self.scaled else abs(self.predicted) > self.floor

    @property
    def decides(self) -> bool:
        """Whether this setting decides its claim under the one rule ((V.7), :func:`power_rule`): a paper
        prediction here, with the power to decide (:attr:`decidable`)."""
        return self.predicted is not None and self.decidable

    def margin_rule(self) -> str:
        if self.predicted is not None and not self.scaled:  # Kendall tau against its chance floor
            return f"the chance floor {self.floor:.2f} of a unit-free measure (no paired difference to resample)"
        if self.se is None and self.seeds == 1:
            return (f"NOISE = {self.floor:.2f}: one expert seed and no per-example results (neither the seeds' nor "
                    "the test examples' noise is measured)")
        if self.se is None:
            return f"max(NOISE, sd over seeds) = {self.floor:.2f}: no per-example results"
        if self.seeds == 1:
            return (f"max(NOISE, 1.96 × {self.se:.2f}) = {self.floor:.2f}: paired bootstrap over the test examples of "
                    "one expert seed (the seeds' noise is not measured; (V.8) with S = 1)")
        return (f"max(NOISE, 1.96 × {self.se:.2f}) = {self.floor:.2f}: paired bootstrap over the test examples, with "
                "a t interval over the seeds where there are several (V.8)")

    def scaling(self) -> str:
        if self.predicted is None:
            return (f"{self.setting}: no paper effect to scale, so no prediction: this setting decides nothing "
                    f"(V.7); it would need a measured effect of at least {POWER_FACTOR * self.floor:.2f}")
        if self.paper_room is None or self.world_room is None:
            return (f"{self.setting}: the paper's {self.paper:+.2f}, a unit-free measure, not scaled "
                    f"(floor {self.floor:.2f}: {'decidable' if self.decidable else 'undecidable'})")
        return (f"{self.setting}: {self.paper:+.2f} × {self.world_room:.2f} / {self.paper_room:.2f}, capped at the "
                f"headroom = {self.predicted:+.2f} (needs ≥ {self.needed:.2f}, twice the floor {self.floor:.2f}: "
                f"{'decidable' if self.decidable else 'undecidable'})")

    def as_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "paper": _num(self.paper), "paper_room": _num(self.paper_room),
                "world_room": _num(self.world_room), "predicted": _num(self.predicted), "floor": _num(self.floor),
                "measured": _num(self.measured), "se": _num(self.se), "decidable": self.decides, "seeds": self.seeds}


def predict(paper_effect: float, paper_room: float, world_room: float) -> float:
    """The effect a paper predicts in a world: ``paper_effect * world_room / paper_room``
    (:data:`SCALING_RULE`). ``paper_room`` must be positive; a world without room (``<= 0``)
    predicts no effect."""
    return ceiling_prediction(paper_effect, paper_room, world_room)


def effect(setting: str, measured: float | None, *, paper: float | None = None, paper_room: float | None = None,
           world_room: float | None = None, spread: float | None = None, noise: float = NOISE,
           headroom: float | None = None, se: float | None = None, seeds: int | None = None) -> Effect:
    # world_room and measured must be in the same unit (normalized or absolute points)
    """One :class:`Effect`: with ``paper``, ``paper_room`` and ``world_room`` the prediction is
    scaled and capped at ``headroom`` (:func:`acetools_course.power.ceiling_prediction`); without a paper effect
    there is no prediction. The floor is ``max(noise, 1.96 se)`` with a paired bootstrap standard error
    ``se``, else :func:`margin` ``(spread, noise)``."""
    pred = None
    if paper is not None:
        if paper_room is None or world_room is None:
            raise InputError(f"{setting}: a paper effect needs paper_room and world_room to be scaled")
        pred = ceiling_prediction(paper, paper_room, world_room, headroom)
    se = _num(se)
    return Effect(setting, None if paper is None else float(paper), _num(paper_room), _num(world_room), pred,
                  margin(spread, noise, se=se), _num(measured), se, seeds)


def decide(effects: Sequence[Effect], agree: Sequence[bool]) -> tuple[str, str]:
    """The verdict over settings with the fifth word: settings whose prediction is below the
    floor are left out; none left -> :data:`UNDECIDABLE`; otherwise :func:`agreement` over the
    decidable ones. Returns ``(verdict, note)``, ``note`` naming the undecidable settings."""
    if len(effects) != len(agree):
        raise InputError(f"{len(effects)} effects for {len(agree)} agreements")
    if not effects:
        raise InputError("no settings to decide on")
    keep = [a for e, a in zip(effects, agree) if e.decidable]
    out = [e for e in effects if not e.decidable]
    note = "" if not out else (
        "undecidable: " + ", ".join(f"{e.setting} (" + ("no paper number" if e.predicted is None else
                                                       f"predicted {e.predicted:+.2f}") + f", needs ≥ {e.needed:.2f})"
                                    for e in out))
    if not keep:
        return UNDECIDABLE, note
    return agreement(keep), note


#: The words that open what :func:`power_rule` adds to a reason; an earlier addition is cut there and rewritten.
POWER_RULE_MARK: str = "; one rule (V.7):"


def _opposite(e: Effect) -> bool:
    """Whether setting ``e`` decides the sign opposite to its prediction: measured beyond its margin the other way."""
    if e.predicted is None or e.measured is None or e.predicted == 0:
        return False
    return e.measured * math.copysign(1.0, e.predicted) < -e.floor


def _unit_free(e: Effect) -> bool:
    """Whether setting ``e``'s prediction is unit-free (Kendall τ against its chance floor): a paper number not
    scaled by the rooms (:attr:`Effect.scaled`; a record's effect without ``paper_room``). The one criterion the
    course uses for it."""
    return e.predicted is not None and not e.scaled


def _needed(e: Effect) -> float:
    """The prediction setting ``e`` would need to decide: twice its margin, or (to exceed) its chance floor for a
    unit-free prediction (Kendall τ)."""
    return e.floor if _unit_free(e) else POWER_FACTOR * e.floor


def power_rule(v: Verdict) -> Verdict:
    """The one rule every comparative claim passes (docs/course.md §One rule, (V.7)); a claim is comparative when its
    verdict carries settings (``effects``). A setting decides only where the paper predicts an effect there (scaled and
    capped, (V.1), (V.6)) of at least :data:`~.power.POWER_FACTOR` × its margin ((V.5); a unit-free prediction
    beyond its chance floor); a setting without a paper number decides nothing. No deciding setting: ``undecidable
    here``, the reason naming the effect the world would need. A verdict of ``reproduced`` or ``partly`` with a
    deciding setting measured beyond its margin against the predicted sign becomes ``not reproduced``. The reason
    says at how many settings the claim was judged; ``numbers["power_rule"]`` holds the counts. ``not testable
    here`` and claims without settings pass unchanged; the rule is idempotent (:func:`acetools_course.claims.record`
    applies it to every record, scripts/rejudge_claims.py before comparing)."""
    if not v.effects or v.verdict == NOT_TESTABLE:
        return v
    deciding = [e for e in v.effects if e.decides]
    against = [e for e in deciding if _opposite(e)]
    verdict = v.verdict
    if not deciding:
        verdict = UNDECIDABLE
    elif against and verdict in ("reproduced", "partly"):
        verdict = "not reproduced"
    need = min(v.effects, key=_needed)
    rule = {"settings": len(v.effects), "deciding": [e.setting for e in deciding],
            "against": [e.setting for e in against], "needed": _needed(need),
            "needed_at": need.setting, "before": v.numbers.get("power_rule", {}).get("before", v.verdict)}
    if not deciding:
        unpredicted = sum(e.predicted is None for e in v.effects)
        why = (f"judged at 0 of {len(v.effects)} settings: no setting has a paper prediction with the power to "
               f"decide (at least {POWER_FACTOR:g}× its margin; a unit-free one strictly beyond its chance floor)"
               + (f" ({unpredicted} of {len(v.effects)} have no paper number to scale)" if unpredicted else ""))
        if _unit_free(need):
            at_floor = need.predicted is not None and math.isclose(abs(need.predicted), need.floor, rel_tol=1e-9)
            why += (f"; this world would need an effect above {rule['needed']:.2f} (a unit-free prediction beyond "
                    f"its chance floor at {need.setting}"
                    + (f"; the prediction {need.predicted:+.2f} equals the floor, and equal is undecidable"
                       if at_floor else "") + ")")
        else:
            why += (f"; this world would need an effect of at least {rule['needed']:.2f} points ({POWER_FACTOR:g} × "
                    f"the margin {need.floor:.2f} at {need.setting})")
    else:
        why = f"judged at {len(deciding)} of {len(v.effects)} settings ({', '.join(rule['deciding'])})"
        if against:
            why += f"; {', '.join(rule['against'])} decides the opposite sign"
    reason = f"{v.reason.split(POWER_RULE_MARK)[0]}{POWER_RULE_MARK} {why}"  # rewritten each time: idempotent
    return Verdict(v.measured, verdict, reason, {**v.numbers, "power_rule": rule}, v.effects, v.value)


def margin(spread: float | None = None, noise: float = NOISE, *, se: float | None = None) -> float:
    """The margin a difference must exceed to count: ``max(noise, 1.96 se)`` with the paired bootstrap
    standard error ``se`` (docs/course.md §Margin, power and rivals), else ``max(noise, spread)``;
    ``spread`` (the standard deviation over seeds of the paired difference) is ignored when it is
    missing or not finite (one seed)."""
    if se is not None:
        return max(float(noise), Z_95 * float(se))
    if spread is None or not math.isfinite(spread):
        return float(noise)
    return max(float(noise), float(spread))


def compare(diff: float, spread: float | None = None, noise: float = NOISE, *, se: float | None = None) -> str:
    """``"better"`` if ``diff`` > :func:`margin`, ``"worse"`` if ``diff`` < -margin, else
    :data:`TIE`. ``diff`` must be a finite number."""
    if diff is None or not math.isfinite(diff):
        raise InputError(f"diff={diff!r} is not a finite number")
    m = margin(spread, noise, se=se)
    if diff > m:
        return "better"
    if diff < -m:
        return "worse"
    return TIE


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
