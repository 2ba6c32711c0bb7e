"""The method registry: names, hyperparameters with defaults and ranges, descriptions.

A merge method is a pure function::

    fn(base, task_vectors, *, is_matrix, **hparams) -> dict[str, Tensor]

``base`` maps every key to the pretrained weight W0 (already on the compute device, in the
compute dtype), ``task_vectors`` is a list with one ``{key: tau_t}`` dict per expert, and
``is_matrix(key, tensor)`` says which keys take the matrix path. It returns the merged
*update* (a task-vector-shaped dict with every key of ``base``); :func:`acetools.merge`
adds it to W0. Methods never modify their inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["Param", "MethodInfo", "register", "METHODS", "REQUIRED"]


class _Required:
    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return "<required>"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """One hyperparameter: default, one-line doc and what values are allowed.

    ``low``/``high`` bound numbers (inclusive unless ``low_open``/``high_open``);
    ``choices`` lists the allowed values; ``types`` the accepted Python types;
    ``check`` is an extra predicate ``value -> error message or None``.
    """

    default: Any
    doc: str
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    types: tuple[type, ...] | None = None
    check: Callable[[Any], str | None] | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def validate(self, method: str, name: str, value: Any) -> None:
        where = f"{method}: hyperparameter {name}={value!r}"
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(f"{where} is not one of {list(self.choices)}")
            return
        if self.types is not None and not isinstance(value, self.types):
            names = " or ".join(t.__name__ for t in self.types)
            raise TypeError(f"{where} must be {names}, got {type(value).__name__}")
        if self.low is not None or self.high is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{where} must be a number")
            if not math.isfinite(value):
                raise ValueError(f"{where} must be finite")
            if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
                op = ">" if self.low_open else ">="
                raise ValueError(f"{where} is out of range: must be {op} {self.low}")
            if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
                op = "<" if self.high_open else "<="
                raise ValueError(f"{where} is out of range: must be {op} {self.high}")
        if self.check is not None:
            msg = self.check(value)
            if msg:
                raise ValueError(f"{where}: {msg}")


@dataclass(frozen=True)
class MethodInfo:
    """What the registry knows about one method."""

    name: str
    description: str
    params: Mapping[str, Param]
    func: Callable[..., dict] = field(repr=False)

    @property
    def hparams(self) -> dict[str, Any]:
        """Hyperparameter names with their defaults (``REQUIRED`` where there is none)."""
        return {k: p.default for k, p in self.params.items()}

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overlaid with ``given``, every value checked; unknown names rejected."""
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            valid = ", ".join(self.params) or "(none)"
            raise TypeError(
                f"{self.name}: unknown hyperparameter(s) {unknown}; valid ones are: {valid} "
                "(plus the merge() options device, is_matrix, progress)"
            )
        out: dict[str, Any] = {}
        for name, p in self.params.items():
            if name in given:
                value = given[name]
            elif p.required:
                raise TypeError(f"{self.name}: missing required hyperparameter {name!r} ({p.doc})")
            else:
                value = p.default
            p.validate(self.name, name, value)
            out[name] = value
        return out


    def effective(self, resolved: Mapping[str, Any]) -> dict[str, Any]:
        """``resolved`` (from :meth:`resolve`) with every "use the preset" ``None`` replaced by the value
        the method will use (e.g. ACE's ``gate=None`` -> ``"auto"`` for the "ace" estimator): what a
        printed or recorded hyperparameter line shows."""
        hook = _EFFECTIVE.get(self.name)
        return dict(resolved) if hook is None else hook(dict(resolved))


_EFFECTIVE: dict[str, Callable[[dict], dict]] = {}


def effective_hparams(name: str):
    """Decorator registering ``fn(resolved) -> resolved`` as :meth:`MethodInfo.effective` of ``name``."""

    def deco(fn):
        _EFFECTIVE[name] = fn
        return fn

    return deco


_REGISTRY: dict[str, MethodInfo] = {}
METHODS: Mapping[str, MethodInfo] = MappingProxyType(_REGISTRY)


def register(name: str, description: str, **params: Param):
    """Decorator adding a merge function to :data:`METHODS` under ``name``."""

    def deco(fn):
        if name in _REGISTRY:
            raise ValueError(f"merge method {name!r} is registered twice")
        _REGISTRY[name] = MethodInfo(name, description, MappingProxyType(dict(params)), fn)
        return fn

    return deco
