"""The lessons' figures, one module per lesson; the theme, saver and generic helpers are :mod:`acetools.plotting`."""

from acetools.plotting import track_drawing

from . import ace_step_by_step, benchmark, esm_step_by_step, language, mergeable_world, theorem1

# every lesson figure function notes itself on the figure it draws (the figure manifest's code version)
track_drawing([ace_step_by_step, benchmark, esm_step_by_step, language, mergeable_world, theorem1])
