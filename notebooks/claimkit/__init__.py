"""The course's claims and their verdicts, beside the notebooks (docs/course.md §Verdicts).

Not part of the installed library: the notebooks import it from their folder (``from claimkit
import claims``), scripts and tests put ``notebooks/`` on ``sys.path``. :mod:`.verdicts` holds the
rules, :mod:`.claims` the registry, the records and the claim worlds, and ``claimkit.X`` the
verdicts of notebook ``NN_X`` from the tables :mod:`acetools.course.X` computes."""
