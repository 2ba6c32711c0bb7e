"""Per-expert ``weight`` and ``density`` in a merge config, as mergekit writes them (docs/your-models.md
§Coming from mergekit).

:func:`read_experts` reads a config's ``experts:`` (or mergekit's ``models:``) entries: a path, or a mapping
``{path: ..., weight: 0.3, density: 0.5}`` (mergekit's ``{model: ..., parameters: {weight: ..., density:
...}}`` too). :func:`per_expert_hparams` turns the values into the method's hyperparameters once the method
is known: ``weight`` -> ``weights`` (weight_averaging, task_arithmetic, ties, dare), ``density`` -> ``k =
100 x density`` (ties) or ``p = 1 - density`` (dare).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from ..errors import InputError, InputTypeError
from ..merging import METHODS

__all__ = ["read_experts", "per_expert_hparams", "PER_EXPERT", "MERGEKIT_KEYS"]

#: The per-expert parameters a config entry may carry.
PER_EXPERT = ("weight", "density")

#: mergekit's top-level config keys with acetools' counterpart (None: no equivalent).
MERGEKIT_KEYS = {"merge_method": "method", "base_model": "base", "parameters": "hyperparameters", "slices": None,
                 "out_dtype": "dtype", "tokenizer_source": "vocab"}

_ENTRY_KEYS = ("path", "model", "parameters", *PER_EXPERT)


def mergekit_key_hint(key: str) -> str:
    """What to write instead of mergekit's top-level ``key``: one clause for an unknown-key error."""
    other = MERGEKIT_KEYS[key]
    if other is None:
        return f"'{key}' is mergekit's, with no acetools equivalent"
    return f"'{key}' is mergekit's; acetools' key is '{other}'"


def _number(where: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        shape = ("a list (mergekit's gradient over layers)" if isinstance(value, list) else
                 "a mapping (mergekit's per-tensor filter)" if isinstance(value, Mapping) else repr(value))
        raise InputError(f"{where}: {name} is {shape}; acetools takes one finite number per expert for the whole "
                         "model (docs/your-models.md §Coming from mergekit)")
    return float(value)


def read_experts(entries: Sequence[Any], where: str) -> tuple[list[str], dict[str, list[float]]]:
    """``(paths, {"weight": [...], "density": [...]})`` from a config's expert entries; a parameter given for
    some experts but not all is an error naming the first without it."""
    paths: list[str] = []
    given: list[dict[str, float]] = []
    for i, entry in enumerate(entries):
        at = f"{where}: expert {i}"
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Mapping):
            if isinstance(entry, (list, tuple)) or entry is None:
                raise InputTypeError(f"{at} is {entry!r}; give a path, or a mapping {{path: ..., weight: ...}}")
            paths.append(str(entry))
            given.append({})
            continue
        unknown = sorted(set(entry) - set(_ENTRY_KEYS))
        if unknown:
            raise InputError(f"{at}: unknown key(s) {unknown}; an expert entry takes path (or mergekit's model), "
                             "weight, density (or mergekit's parameters: {weight, density})")
        if ("path" in entry) == ("model" in entry):
            raise InputError(f"{at}: give its checkpoint as exactly one of path: or model:")
        params = entry.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise InputTypeError(f"{at}: parameters must be a mapping (weight: ..., density: ...)")
        bad = sorted(set(params) - set(PER_EXPERT))
        if bad:
            raise InputError(f"{at}: parameter(s) {bad} have no per-expert acetools equivalent; per expert, "
                             f"acetools takes {' and '.join(PER_EXPERT)}")
        twice = sorted(set(params) & set(entry))
        if twice:
            raise InputError(f"{at}: {twice[0]} is given both in parameters: and beside it; give it once")
        values = {name: _number(at, name, v) for name, v in {**params, **{k: entry[k] for k in PER_EXPERT
                                                                           if k in entry}}.items()}
        paths.append(str(entry.get("path", entry.get("model"))))
        given.append(values)
    out: dict[str, list[float]] = {}
    for name in PER_EXPERT:
        have = [name in g for g in given]
        if any(have) and not all(have):
            raise InputError(f"{where}: expert {have.index(False)} ({paths[have.index(False)]}) has no {name} while "
                             f"expert {have.index(True)} has one; give every expert a {name}, or none")
        if all(have) and given:
            out[name] = [g[name] for g in given]
    return paths, out


def _decimal(x: float) -> Fraction:
    """``x`` as the decimal it prints as (0.3 -> 3/10, not the nearest binary float)."""
    return Fraction(repr(float(x)))


def per_expert_hparams(method: str, per_expert: Mapping[str, Sequence[float]], hparams: Mapping[str, Any],
                       where: str) -> dict[str, Any]:
    """``hparams`` with the experts' ``weight`` and ``density`` as ``method``'s hyperparameters; refused, in one
    line naming the method and the parameter, where the method has no such coefficient or ``hparams`` sets it
    already."""
    hp = dict(hparams)
    if method not in METHODS:
        return hp  # the merge names the unknown method
    if "weight" in per_expert:
        if "weights" not in METHODS[method].params:
            takes = ", ".join(m for m, info in METHODS.items() if "weights" in info.params)
            raise InputError(f"{where}: {method} takes no per-expert weight (the experts' weight: has no meaning "
                             f"for it); per-expert weights apply to {takes}")
        if hp.get("weights") is not None:
            raise InputError(f"{where}: the experts' weight: and the hyperparameter weights both set the weights "
                             f"of {method}; give one")
        hp["weights"] = list(per_expert["weight"])
    if "density" in per_expert:
        target = {"ties": "k", "dare": "p"}.get(method)
        if target is None:
            raise InputError(f"{where}: {method} takes no per-expert density (the experts' density: has no meaning "
                             "for it); density applies to ties (k = 100 x density) and dare (p = 1 - density)")
        if target in hp:
            raise InputError(f"{where}: the experts' density: and the hyperparameter {target} both set {target} "
                             f"of {method}; give one")
        for t, d in enumerate(per_expert["density"]):
            if not 0 < d <= 1:
                raise InputError(f"{where}: expert {t}'s density={d!r} must be in (0, 1] (the fraction of each task "
                                 "vector kept)")
        hp[target] = [float(100 * _decimal(d)) if target == "k" else float(1 - _decimal(d))
                      for d in per_expert["density"]]
    return hp
