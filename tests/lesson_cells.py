"""A lesson's code cells run in this process at the quick profile, so that a test can patch the library first
(tests/test_lesson_mutations.py).

The notebook tests run each lesson under papermill in a kernel of its own (tests/test_notebooks.py); a patch made
in the test's process would not reach it, and a kernel per patch costs a lesson's start-up each time. Here the
cells of the lesson proper (before its appendix) are executed with ``exec`` in one namespace: the parameters
cell, then the quick profile's parameters over it, as papermill injects them. :meth:`Lesson.prepare` runs the
first cells (the world) once; :meth:`Lesson.first_failed_check` runs the others on a copy of that namespace and
returns the first cell whose check fails.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
APPENDIX = "## Appendix"  # the markdown heading where a lesson's audit starts: its checks end before it


@dataclass
class Failure:
    """A check that failed: the notebook's cell (its index among all cells) and the assertion's first line."""

    cell: int
    message: str


def code_cells(stem: str) -> list[tuple[int, str, list[str]]]:
    """The code cells of ``notebooks/<stem>.ipynb`` before its appendix: (index, source, tags)."""
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    out = []
    for i, cell in enumerate(nb["cells"]):
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and src.startswith(APPENDIX):
            break
        if cell["cell_type"] == "code":
            out.append((i, src, list(cell.get("metadata", {}).get("tags", []))))
    return out


class Lesson:
    """Lesson ``stem``'s cells; the first ``setup`` code cells (parameters included) are run once."""

    def __init__(self, stem: str, setup: int, parameters: dict[str, Any]):
        self.stem, self.cells = stem, code_cells(stem)
        self.setup, self.parameters = self.cells[:setup], dict(parameters)
        self.rest = self.cells[setup:]
        self.ns: dict[str, Any] = {}

    def _run(self, cells: list[tuple[int, str, list[str]]], ns: dict[str, Any]) -> None:
        for i, src, tags in cells:
            exec(compile(src, f"{self.stem}.ipynb cell {i}", "exec"), ns)  # noqa: S102 - the lesson's own code
            if "parameters" in tags:
                ns.update(self.parameters)

    def prepare(self) -> dict[str, Any]:
        """Run the setup cells (the world, built or loaded from the cache) once; the namespace they leave."""
        if not self.ns:
            import matplotlib

            matplotlib.use("Agg")
            self._run(self.setup, self.ns)
        return self.ns

    def first_failed_check(self) -> Failure | None:
        """Run the remaining cells on a copy of the prepared namespace; the first failing check (an
        ``AssertionError``, as ``torch.testing.assert_close`` raises), or None when every check passes.
        Any other exception propagates: a patch that crashes a lesson has not been caught by a check."""
        import matplotlib.pyplot as plt

        ns = copy.copy(self.prepare())  # the lesson rebinds names; the world's objects are shared, read only
        try:
            self._run(self.rest, ns)
        except AssertionError as e:
            tb = e.__traceback__
            cell = -1
            while tb is not None:  # the innermost frame of the lesson's own code names the cell
                name = tb.tb_frame.f_code.co_filename
                if name.startswith(f"{self.stem}.ipynb cell "):
                    cell = int(name.rsplit(" ", 1)[1])
                tb = tb.tb_next
            return Failure(cell, (str(e).strip().splitlines() or [""])[0])
        finally:
            plt.close("all")
        return None


def patch_everywhere(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
                     make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``module.name`` by ``make(original)`` in every loaded acetools module that binds the same
    object (``from .ace import center_rows`` would bind it in a second module too)."""
    orig = getattr(module, name)
    new = make(orig)
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == "acetools" or mod_name.startswith("acetools.")):
            continue
        for attr, value in list(vars(mod).items()):
            if value is orig:
                monkeypatch.setattr(mod, attr, new)
