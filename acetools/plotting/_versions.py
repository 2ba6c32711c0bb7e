"""The code version of a saved figure (docs/course.md §Figures and their code): which drawing functions drew on it
and a hash of each one's source text, for the figure manifest ``figures.json`` that :func:`save_figure` writes.

A drawing function is a public function whose first argument is the axes it draws on (``ax`` or ``axes``): the
lessons' figure modules and the shared plots of :mod:`acetools.plotting` are tracked with :func:`track_drawing`,
so that each call notes itself on the axes' figure. The hash is of the function's own source text
(:func:`inspect.getsource`), so moving a function between modules leaves it unchanged, and so is the theme's
(:func:`acetools.plotting.set_theme`) that every figure is drawn with."""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import types
from collections.abc import Callable, Iterable
from typing import Any

#: The attribute of a matplotlib figure listing the drawing functions that drew on it, in call order.
DRAWN_BY: str = "_acetools_drawn_by"
#: The first-parameter names of a drawing function.
AXES_PARAMS: frozenset[str] = frozenset({"ax", "axes"})


def source_hash(fn: Callable[..., Any]) -> str:
    """sha256 of ``fn``'s source text (the undecorated function's), hex: what a figure's record compares."""
    return hashlib.sha256(inspect.getsource(inspect.unwrap(fn)).encode()).hexdigest()


def qualified_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of ``fn`` (the undecorated function), as a figure's record names it."""
    fn = inspect.unwrap(fn)
    return f"{fn.__module__}:{fn.__qualname__}"


def _figure_of(args: tuple, kwargs: dict) -> Any:
    first: Any = args[0] if args else kwargs.get("ax", kwargs.get("axes"))
    if isinstance(first, (list, tuple)) or hasattr(first, "flat"):  # a list or an array of axes
        many: Any = getattr(first, "flat", first)
        first = next(iter(many), None)
    return getattr(first, "figure", None)


def drawing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that, called on axes, notes itself on their figure (:data:`DRAWN_BY`); otherwise unchanged."""
    if getattr(fn, "__acetools_drawing__", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        fig = _figure_of(args, kwargs)
        if fig is not None:
            drawn = fig.__dict__.setdefault(DRAWN_BY, [])
            if fn not in drawn:
                drawn.append(fn)
        return fn(*args, **kwargs)

    wrapper.__acetools_drawing__ = True  # type: ignore[attr-defined]
    return wrapper


def _is_drawing(name: str, obj: Any, module: str) -> bool:
    if name.startswith("_") or not isinstance(obj, types.FunctionType) or obj.__module__ != module:
        return False
    params = list(inspect.signature(obj).parameters)
    return bool(params) and params[0] in AXES_PARAMS


def track_drawing(modules: Iterable[types.ModuleType]) -> None:
    """Replace every drawing function defined in ``modules`` by its :func:`drawing` wrapper, in place (callers
    that look it up on the module, and the module's own calls, get the wrapper)."""
    for mod in modules:
        for name, obj in list(vars(mod).items()):
            if _is_drawing(name, obj, mod.__name__):
                setattr(mod, name, drawing(obj))


def figure_record(fig: Any, theme: Callable[..., Any]) -> dict[str, Any]:
    """The code version of ``fig`` for its manifest entry: ``drawn_by`` (each drawing function that drew on it,
    :func:`qualified_name` and :func:`source_hash`) and ``theme`` (the theme function's, likewise: the caller
    passes :func:`acetools.plotting.set_theme`)."""

    def one(fn: Callable[..., Any]) -> dict[str, str]:
        return {"function": qualified_name(fn), "source_sha256": source_hash(fn)}

    return {"drawn_by": [one(fn) for fn in getattr(fig, DRAWN_BY, [])], "theme": one(theme)}


def resolve(name: str, search: Iterable[str] = ()) -> Callable[..., Any] | None:
    """The function a record names (``module:qualname``), or, where its module no longer has it (the function
    moved), the one function of that qualname in the modules ``search``; None where there is none or several."""
    module, _, qual = name.partition(":")

    def find(mod_name: str) -> Any:
        try:
            obj: Any = importlib.import_module(mod_name)
        except ImportError:
            return None
        for part in qual.split("."):
            obj = getattr(obj, part, None)
        return obj if callable(obj) else None

    got = find(module)
    if got is not None:
        return got
    found = [f for f in (find(m) for m in search if m != module) if f is not None]
    return found[0] if len(found) == 1 else None
