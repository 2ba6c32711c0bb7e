"""The course: what the numbered notebooks need, above the library (docs/course.md §Naming rule).

``notebooks/NN_X.ipynb`` ↔ ``acetools.course.X`` ↔ ``acetools.course.plotting.X`` ↔
``tests/course/test_X.py``; shared: :mod:`.world`, :mod:`.verdicts`, :mod:`.claims`,
:mod:`.paper_tables`, :mod:`.page`, :mod:`.widgets`. The library never imports the course."""
