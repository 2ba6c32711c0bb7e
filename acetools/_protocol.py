"""The search protocol's constants, in a module light enough for the command line's parser to
import (:mod:`acetools.search` loads torch through the method registry). Read them as
:data:`acetools.search.PATIENCE` and :data:`acetools.search.SHORT_GRID`."""

from __future__ import annotations

#: The one patience of the course's grid searches (notebooks, committed tables of both worlds,
#: ``benchmarks/mini_world.sh``, ``benchmarks/text_world.py``, the regime cards, the recipe
#: studies, ``acetools bench``): the Iso code's 3, counted only once the validation curve has
#: risen (:func:`acetools.search.grid_search`).
PATIENCE: int = 3
#: Grids of at most this many coefficients are searched whole, whatever the patience.
SHORT_GRID: int = 10
