"""The course: what the numbered notebooks need, above the library (docs/course.md §Naming rule).

``notebooks/NN_X.ipynb`` ↔ ``acetools.course.X`` ↔ ``acetools.course.plotting.X`` ↔
``tests/course/test_X.py``; shared: :mod:`.world`, :mod:`.paper_tables`, :mod:`.page`,
:mod:`.widgets`. The claims and their verdicts live beside the notebooks (``notebooks/claimkit``,
docs/course.md §Verdicts). The library never imports the course."""
