"""The method registry: the one place that knows a merge method (CONTRIBUTING.md, "Add a merge method").

``@register(name, description, **params)`` declares, next to the function, its hyperparameters
(:class:`Param`: doc and allowed values; the default is the one written in the function's signature, which
the registry reads, as mergekit's ``@merge_method`` does: no default means required) and:

- ``key_scope``: ``"key"`` (one key's update needs only that key: streamed), ``"model"``, or a
  function of the resolved hyperparameters returning ``(scope, why)``;
- ``per_key``: hyperparameters holding per-key inputs, cut to one key when merging key by key;
  ``data_inputs``: those a harness fills from its data (:meth:`acetools.benchmark.Benchmark.method_inputs`);
- ``search`` (:class:`Search`); ``needs_layout``: it takes a matrix path;
- streamed merges (:mod:`acetools.merging.driver`): ``prepare(view, hparams) -> dict`` runs before the
  key-by-key pass (its dict reaches every per-key call as keyword arguments); ``summed(hparams) -> c``:
  the update is c x the summed task vectors, formed in one buffer (``None``: not with these hyperparameters);
- ``layout_hparams(layout_name) -> dict``: defaults per layout preset; ``presets(resolved) -> resolved``:
  the values a ``None`` hyperparameter stands for (:meth:`MethodInfo.effective`); ``memory_note`` and
  ``note``: what ``acetools merge --dry-run`` says.

A merge method is a pure function ``fn(base, task_vectors, *, is_matrix, **hparams) -> dict``: ``base``
maps every key to W0 (on the compute device, in the compute dtype), ``task_vectors`` holds one
``{key: tau_t}`` dict per expert; it returns the merged *update* for every key of ``base``, inputs untouched.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .. import search
from ..errors import InputError, InputTypeError
from ..search import ALPHA_GRID, ESM_BRACKET, LAMBDA_GRID

if TYPE_CHECKING:
    from torch import Tensor


__all__ = ["Param", "MethodInfo", "Search", "register", "METHODS", "REQUIRED", "SCOPES", "LAMBDA_GRID",
           "ALPHA_GRID", "ESM_BRACKET", "per_expert_values", "is_matrix_param"]


def is_matrix_param(key: str, tensor: Tensor) -> bool:
    """The "is it a matrix?" rule of docs/methods.md §Matrix path: ``ndim == 2`` and not ``text_projection``."""
    return tensor.ndim == 2 and "text_projection" not in key


#: The scopes of :meth:`MethodInfo.key_scope`.
SCOPES = ("key", "global_ties", "model")


class _Required:
    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return "<required>"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """One hyperparameter: one-line doc and the values allowed (``low``/``high`` inclusive unless
    ``low_open``/``high_open``; ``choices``; ``types``; ``check(value) -> error message or None``).
    ``per_expert``: a list or tuple with one such value per expert is accepted too, each value checked
    (docs/your-models.md §Coming from mergekit); ``scalar=False``: only such a list, or ``None``.
    ``default``: filled in by :func:`register` from the method's signature (``REQUIRED`` where it has none)."""

    doc: str
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    types: tuple[type, ...] | None = None
    check: Callable[[Any], str | None] | None = None
    per_expert: bool = False
    scalar: bool = True
    default: Any = REQUIRED

    def __post_init__(self):
        if not isinstance(self.doc, str):
            raise InputTypeError(f"Param({self.doc!r}, ...): the first argument is the one-line doc; write the "
                                 "default in the method's signature (CONTRIBUTING.md, Add a merge method)")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def validate(self, method: str, name: str, value: Any) -> None:
        if self.per_expert and isinstance(value, (list, tuple)):
            if not value:
                raise InputError(f"{method}: hyperparameter {name}=[] is empty: give one value per expert")
            for t, v in enumerate(value):
                self._validate_one(method, f"{name}[{t}]", v)
            return
        if not self.scalar:
            if value is not None:
                raise InputTypeError(f"{method}: hyperparameter {name}={value!r} must be a list with one value per "
                                     "expert, or None")
            return
        self._validate_one(method, name, value)

    def _validate_one(self, method: str, name: str, value: Any) -> None:
        where = f"{method}: hyperparameter {name}={value!r}"
        if self.choices is not None:
            if value not in self.choices:
                raise InputError(f"{where} is not one of {list(self.choices)}")
            return
        if self.types is not None and not isinstance(value, self.types):
            names = " or ".join(t.__name__ for t in self.types)
            raise InputTypeError(f"{where} must be {names}, got {type(value).__name__}")
        if self.low is not None or self.high is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputTypeError(f"{where} must be a number")
            if not math.isfinite(value):
                raise InputError(f"{where} must be finite")
            if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
                op = ">" if self.low_open else ">="
                raise InputError(f"{where} is out of range: must be {op} {self.low}")
            if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
                op = "<" if self.high_open else "<="
                raise InputError(f"{where} is out of range: must be {op} {self.high}")
        if self.check is not None:
            msg = self.check(value)
            if msg:
                raise InputError(f"{where}: {msg}")


@dataclass(frozen=True)
class Search:
    """How a method's coefficient is chosen on validation (docs/methods.md §Benchmark protocol): ``kind``
    ``"grid"`` (every value of ``grid``), ``"golden"`` (golden section on ``bracket``) or ``"esm"``."""

    param: str  # the hyperparameter searched
    kind: str
    grid: tuple[float, ...] = ()
    bracket: tuple[float, float] = ESM_BRACKET

    def __post_init__(self):
        if self.kind not in ("grid", "golden", "esm"):
            raise InputError(f"Search.kind={self.kind!r} is not one of ['grid', 'golden', 'esm']")
        if self.kind == "grid" and not self.grid:
            raise InputError(f"Search({self.param!r}, 'grid') needs a non-empty grid")

    def run(self, score_fn: Callable[[float], Mapping[str, float]], reference: Mapping[str, float] | None = None,
            **options: Any) -> Any:
        """Choose the coefficient with :mod:`acetools.search`'s function for ``kind``; ``score_fn(c)`` returns
        the validation score per task, ``options`` go to the search function."""
        if self.kind == "grid":
            return search.grid_search(score_fn, self.grid, reference=reference, **options)
        if self.kind == "golden":
            return search.golden_section_search(score_fn, *self.bracket, reference=reference, **options)
        if reference is None:
            raise InputError(f"Search({self.param!r}, 'esm') needs the experts' scores as reference")
        return search.esm_search(score_fn, reference, lo=self.bracket[0], hi=self.bracket[1], **options)


Scope = str | tuple[str, str] | Callable[[Mapping[str, Any]], tuple[str, str]]


@dataclass(frozen=True)
class MethodInfo:
    """What the registry knows about one method (see the module docstring)."""

    name: str
    description: str
    params: Mapping[str, Param]
    func: Callable[..., dict] = field(repr=False)
    scope: Scope = "model"
    per_key: tuple[str, ...] = ()
    data_inputs: tuple[str, ...] = ()
    search: Search | None = None
    needs_layout: bool = False
    prepare: Callable[..., Mapping[str, Any]] | None = field(default=None, repr=False)
    layout_hparams: Callable[[str | None], Mapping[str, Any]] | None = field(default=None, repr=False)
    memory_note: Callable[[int, int], str] | None = field(default=None, repr=False)
    note: str = ""
    summed: Callable[[Mapping[str, Any]], float | None] | None = field(default=None, repr=False)
    presets: Callable[[dict], dict] | None = field(default=None, repr=False)

    def key_scope(self, hparams: Mapping[str, Any] | None = None) -> tuple[str, str]:
        """``(scope, why)`` with ``hparams`` (resolved here): ``"key"``, ``"global_ties"`` (TIES' global trim:
        extra passes first) or ``"model"`` (in memory); ``why`` says why not ``"key"``."""
        scope = self.scope
        if callable(scope):
            scope = scope(self.resolve(dict(hparams or {})))
        if isinstance(scope, str):
            scope = (scope, "" if scope == "key" else
                     f"{self.name} is registered with key_scope={scope!r} (it is not known to merge each key "
                     "on its own)")
        if scope[0] not in SCOPES:  # a bug in a registration, not bad input
            raise RuntimeError(f"{self.name}: key_scope {scope[0]!r} is not one of {list(SCOPES)}")
        return scope

    def scope_label(self) -> str:
        """The scope at the default hyperparameters; ``"model"`` where a required one leaves them incomplete."""
        try:
            return self.key_scope()[0]
        except TypeError:
            return "model"

    @property
    def hparams(self) -> dict[str, Any]:
        """Hyperparameter names with their defaults (``REQUIRED`` where there is none)."""
        return {k: p.default for k, p in self.params.items()}

    def resolve(self, given: Mapping[str, Any], layout: str | None = None) -> dict[str, Any]:
        """Defaults overlaid with ``given``, every value checked; unknown names rejected. With
        ``layout`` (a preset name), the method's ``layout_hparams`` for it come between the two."""
        if layout is not None and self.layout_hparams is not None:
            given = {**self.layout_hparams(layout), **given}
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            valid = ", ".join(self.params) or "(none)"
            raise InputTypeError(
                f"{self.name}: unknown hyperparameter(s) {unknown}; valid ones are: {valid} "
                "(plus the merge() options device, is_matrix, progress)"
            )
        out: dict[str, Any] = {}
        for name, p in self.params.items():
            if name in given:
                value = given[name]
            elif p.required:
                raise InputTypeError(f"{self.name}: missing required hyperparameter {name!r} ({p.doc})")
            else:
                value = p.default
            p.validate(self.name, name, value)
            out[name] = value
        return out

    def check_per_expert(self, resolved: Mapping[str, Any], n_tasks: int) -> None:
        """Refuse a per-expert list (a :class:`Param` with ``per_expert``) whose length is not ``n_tasks``, in one
        line naming the method, the hyperparameter and both counts."""
        for name, p in self.params.items():
            value = resolved.get(name)
            if p.per_expert and isinstance(value, (list, tuple)) and len(value) != n_tasks:
                raise InputError(f"{self.name}: hyperparameter {name} has {len(value)} values but {n_tasks} experts "
                                 f"are given; give one value per expert, in the experts' order")

    def effective(self, resolved: Mapping[str, Any]) -> dict[str, Any]:
        """``resolved`` with every "use the preset" ``None`` replaced by the value the method will use (the
        ``presets`` hook; e.g. ACE's ``gate=None`` -> ``"auto"``): what a recorded hyperparameter line shows."""
        return dict(resolved) if self.presets is None else self.presets(dict(resolved))


def per_expert_values(method: str, name: str, value: Any, n_tasks: int, default: Any = None) -> list[Any]:
    """A hyperparameter that may be given per expert as ``n_tasks`` values: the list itself, or ``value``
    (``default`` where it is ``None``) repeated; another length is an error naming both counts."""
    if isinstance(value, (list, tuple)):
        if len(value) != n_tasks:
            raise InputError(f"{method}: hyperparameter {name} has {len(value)} values but {n_tasks} experts are "
                             "given; give one value per expert, in the experts' order")
        return list(value)
    return [default if value is None else value] * n_tasks


_REGISTRY: dict[str, MethodInfo] = {}
METHODS: Mapping[str, MethodInfo] = MappingProxyType(_REGISTRY)


def register(name: str, description: str, *, key_scope: Scope = "model", **options: Any):
    """Decorator adding a merge function to :data:`METHODS` under ``name``: ``options`` are the other fields of
    :class:`MethodInfo` (module docstring) and a :class:`Param` per hyperparameter. Each hyperparameter is a
    keyword parameter of the function, whose default (none: required) the registry reads from the signature;
    checks that ``per_key``, ``data_inputs`` and ``search.param`` name hyperparameters and that each default is a
    value its Param allows. The function is returned as it is."""
    declared = {k: v for k, v in options.items() if isinstance(v, Param)}
    fields = {k: v for k, v in options.items() if not isinstance(v, Param)}
    search = fields.get("search")

    def deco(fn):
        if name in _REGISTRY:
            raise InputError(f"merge method {name!r} is registered twice")
        for what, names in (("per_key", fields.get("per_key", ())), ("data_inputs", fields.get("data_inputs", ())),
                            ("search", (search.param,) if search else ())):
            unknown = [n for n in names if n not in declared]
            if unknown:
                raise InputError(f"register({name!r}): {what} names {unknown[0]!r}, which is not a parameter")
        sig = inspect.signature(fn).parameters
        keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        absent = [n for n in declared if n not in sig or sig[n].kind not in keyword]
        if absent:
            raise InputTypeError(f"register({name!r}): {fn.__name__} has no keyword parameter {absent[0]!r}; write it "
                                 "in the signature, with its default unless it is required")
        params = {n: dataclasses.replace(p, default=REQUIRED if sig[n].default is inspect.Parameter.empty
                                         else sig[n].default) for n, p in declared.items()}
        for n, p in params.items():
            if not p.required:
                p.validate(name, n, p.default)  # a default outside its own Param's range is a bug of the method
        _REGISTRY[name] = MethodInfo(name, description, MappingProxyType(params), fn, key_scope, **fields)
        return fn

    return deco
