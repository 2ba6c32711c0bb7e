"""The lessons' figures, one module per lesson (``acetools.course.plotting.<lesson>``).

Each function draws on the axes it is given; the theme, the saver and the generic heatmap /
bar / line helpers are the library's :mod:`acetools.plotting`.
"""
