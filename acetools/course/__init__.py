"""The course: what the numbered notebooks in ``notebooks/`` need, above the library.

One naming rule links everything of a lesson: ``notebooks/NN_X.ipynb`` ↔ the lesson module
``acetools.course.X`` ↔ its figures ``acetools.course.plotting.X`` ↔ its tests
``tests/course/test_X.py`` (and ``tests/course/plotting/test_X.py``) ↔ its section in
``docs/course.md``. Lessons: ``quickstart`` (00), ``theorem1`` (01), ``ace_step_by_step`` (02),
``esm_step_by_step`` (03), ``benchmark`` (04), ``claims`` (05).

Shared by every lesson: :mod:`.world` (the mini-world per profile), :mod:`.verdicts` (the one
verdict type and the one comparison rule every claim uses), :mod:`.claims` (the claims registry
and each notebook's ``claims.json``), :mod:`.paper_tables` (the papers' numbers), :mod:`.page`
(tables and figures as a report shows them), :mod:`.widgets` (optional ipywidgets explorers) and
:mod:`.report` (papermill runs and HTML).

Imports flow one way: the course imports the library (:mod:`acetools.merging`,
:mod:`acetools.diagnostics`, :mod:`acetools.world.vision.zoo`, …); nothing in the library imports the course.
"""
