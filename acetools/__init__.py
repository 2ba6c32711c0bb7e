"""acetools: a Jupyter-first toolkit for data-free model merging (ACE-Merging, ESM and baselines)."""

from __future__ import annotations

__version__ = "0.1.0"

import logging as _logging  # noqa: E402

# A quiet library: messages go to the ``acetools.<module>`` loggers and are shown only when an
# application configures logging (the command line does: --quiet / --verbose).
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

from ._moved import install as _install_old_paths  # noqa: E402

_install_old_paths()  # acetools.zoo, acetools.data, ...: the paths before issue 22, deprecated for one release

from .merging import METHODS, merge, task_vectors  # noqa: E402
from .utils import seed_everything  # noqa: E402

__all__ = ["merge", "task_vectors", "METHODS", "seed_everything", "__version__"]
