"""The lessons' figures, one module per lesson; the theme, saver and generic helpers are :mod:`acetools.plotting`."""
