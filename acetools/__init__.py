"""acetools: a Jupyter-first toolkit for data-free model merging (ACE-Merging, ESM and baselines)."""

from __future__ import annotations

__version__ = "0.1.0"

from .merging import METHODS, merge, task_vectors  # noqa: E402
from .utils import seed_everything  # noqa: E402

__all__ = ["merge", "task_vectors", "METHODS", "seed_everything", "__version__"]
