"""The course: what the numbered notebooks need, beside the library (docs/course.md §Naming rule).

``notebooks/NN_X.ipynb`` ↔ ``acetools_course.lessonNN_X`` (its experiments, its figures' drawing and its
verdicts) ↔ ``tests/lessons/test_lessonNN_X.py``; shared: :mod:`.lesson_worlds`,
:mod:`.paper_tables`, :mod:`.page`, :mod:`.widgets` and the claims' :mod:`.claims`, :mod:`.verdicts`,
:mod:`.stats`, :mod:`.power` (docs/course.md §Verdicts). The library never imports the course."""
