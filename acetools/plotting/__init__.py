"""Plotting basics: pure functions ``(ax, data, ...) -> ax``, one theme and one saver.

Each lesson's own figures are in its course module (``acetools_course.lessonNN_<name>``); a diagnosis's in
:mod:`.diagnose`.
"""

from __future__ import annotations

from ._core import bar_plot, finish, heatmap, label_points, line_plot, new_axes, save_figure, set_theme, text_overlaps
from ._versions import figure_record, track_drawing

__all__ = ["set_theme", "save_figure", "new_axes", "finish", "heatmap", "bar_plot", "line_plot", "label_points",
           "text_overlaps", "track_drawing", "figure_record"]
