"""acetools: a Jupyter-first toolkit for data-free model merging (ACE-Merging, ESM and baselines)."""

from __future__ import annotations

__version__ = "0.1.0"

import importlib as _importlib  # noqa: E402
import logging as _logging  # noqa: E402

# A quiet library: messages go to the ``acetools.<module>`` loggers and are shown only when an
# application configures logging (the command line does: --quiet / --verbose).
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = ["merge", "task_vectors", "METHODS", "seed_everything", "__version__"]

# Imported on first use (PEP 562), so that ``python -m acetools`` checks its arguments before
# torch loads: a bad argument stops in a fraction of a second.
_LAZY = {"METHODS": ".merging", "merge": ".merging", "task_vectors": ".merging", "seed_everything": ".utils"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):  # a submodule, as ``acetools.merging`` was before the lazy imports
        try:
            return _importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
