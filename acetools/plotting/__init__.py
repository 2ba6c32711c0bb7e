"""Plotting basics: pure plotting functions ``(ax, data, ...) -> ax`` and one saver.

Every function draws on the axes it is given (it never creates a figure or shows one), so
notebooks, widgets (:mod:`acetools.course.widgets`) and reports share them. :func:`set_theme`
applies the one seaborn theme; :func:`save_figure` writes ``<folder>/<name>.png``
atomically with deterministic metadata.

:mod:`._core` holds the theme, the saver, :func:`finish` (title, legend, tick sizes) and the
generic heatmap / bar / line helpers, all imported from here; each lesson's own figures are in
:mod:`acetools.course.plotting`.
"""

from __future__ import annotations

from ._core import bar_plot, finish, heatmap, label_points, line_plot, new_axes, save_figure, set_theme, text_overlaps

__all__ = ["set_theme", "save_figure", "new_axes", "finish", "heatmap", "bar_plot", "line_plot", "label_points",
           "text_overlaps"]
