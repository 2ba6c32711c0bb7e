"""The exercise notebooks, generated from their solutions (one source, so they cannot drift).

    python3 scripts/make_exercises.py           # notebooks/exercises/ and nbgrader metadata from the solutions
    python3 scripts/make_exercises.py --check   # exit 1 if a notebook differs from what its solution makes

A solution notebook ``notebooks/solutions/NN_name_solutions.ipynb`` is written by hand. Each
exercise is a code cell tagged ``exercise`` whose answer sits between the lines
``### BEGIN SOLUTION`` and ``### END SOLUTION`` (nbgrader's markers), with one line
``# exercise stub: CODE`` inside; the cell after it is tagged ``check`` and asserts the answer
against the library. The exercise notebook ``notebooks/exercises/NN_name_exercises.ipynb`` is
the same notebook with each answer replaced by ``# TODO: your code here`` and the stub, which
runs but fails the check, and with " (solutions)" cut from its title. ``tests/test_exercises.py``
fails when the two drift apart.

Both notebooks carry nbgrader's cell metadata (schema 3), written here from the tags so that a
teacher can grade with nbgrader (docs/teaching.md §Grading with nbgrader): the ``exercise`` cell
number n is a solution cell ``exerciseN``, the ``check`` after it an autograded test ``checkN``
worth one point (locked), every other cell locked. The solution notebook is then nbgrader's
source notebook (``nbgrader generate_assignment`` makes the release from it) and the exercise
notebook what a student hands in; this script writes the metadata into both.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import cast

import nbformat

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "notebooks" / "solutions"
EXERCISES = REPO / "notebooks" / "exercises"
BEGIN, END, STUB = "### BEGIN SOLUTION", "### END SOLUTION", "# exercise stub:"
#: Points of one exercise's check in nbgrader.
POINTS = 1
REGION = re.compile(rf"^(?P<indent>[ \t]*){re.escape(BEGIN)}\n(?P<body>.*?)^[ \t]*{re.escape(END)}[ \t]*$", re.M | re.S)


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def exercise_source(source: str, where: str) -> str:
    """``source`` with every solution region replaced by the TODO line and its stub."""

    def stub(m: re.Match) -> str:
        lines = [ln.strip() for ln in m.group("body").splitlines() if ln.strip().startswith(STUB)]
        if len(lines) != 1:
            raise ValueError(f"{where}: a solution region needs exactly one '{STUB} CODE' line, found {len(lines)}")
        indent = m.group("indent")
        return f"{indent}# TODO: your code here\n{indent}{lines[0][len(STUB):].strip()}"

    out, n = REGION.subn(stub, source)
    if n == 0:
        raise ValueError(f"{where}: an exercise cell without a '{BEGIN}' ... '{END}' region")
    if BEGIN in out or END in out:
        raise ValueError(f"{where}: unbalanced '{BEGIN}' / '{END}' markers")
    return out


def nbgrader_metadata(cell, index: int, exercise: int) -> dict:
    """nbgrader's metadata (schema 3) of cell ``index``: ``exercise`` is the number (1, 2, ...) of the
    exercise this cell belongs to, counted up to and including this cell (0 before the first)."""
    meta = {"grade": False, "grade_id": f"cell{index}", "locked": True, "schema_version": 3,
            "solution": False, "task": False}
    if "exercise" in tags(cell):
        meta.update(grade_id=f"exercise{exercise}", locked=False, solution=True)
    elif "check" in tags(cell):
        meta.update(grade=True, grade_id=f"check{exercise}", points=POINTS)
    return meta


def _copy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A deep copy of a notebook (the input is untouched)."""
    return cast(nbformat.NotebookNode, nbformat.from_dict(nb))


def with_nbgrader(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` (a new notebook) with every cell's nbgrader metadata set from its tags."""
    nb = _copy(nb)
    n = 0
    for i, cell in enumerate(nb.cells):
        n += "exercise" in tags(cell)
        cell.metadata["nbgrader"] = nbgrader_metadata(cell, i, n)
    return nb


def exercise_notebook(solution: nbformat.NotebookNode, name: str = "the notebook") -> nbformat.NotebookNode:
    """The exercise notebook of a solution notebook (a new notebook; the input is untouched)."""
    nb = _copy(solution)
    exercises = 0
    for i, cell in enumerate(nb.cells):
        where = f"{name} cell {i}"
        if "exercise" in tags(cell):
            nxt = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
            if nxt is None or "check" not in tags(nxt):
                raise ValueError(f"{where}: an exercise cell must be followed by a cell tagged 'check'")
            cell.source = exercise_source(cell.source, where)
            exercises += 1
        elif BEGIN in cell.source:
            raise ValueError(f"{where}: a solution region in a cell not tagged 'exercise'")
    if exercises == 0:
        raise ValueError(f"{name}: no cell tagged 'exercise'")
    first = nb.cells[0]
    first.source = re.sub(r"^(#[^\n]*?) \(solutions\)", r"\1", first.source, count=1)
    return with_nbgrader(nb)


def exercise_path(solution_path: Path) -> Path:
    stem = solution_path.stem
    if not stem.endswith("_solutions"):
        raise ValueError(f"{solution_path.name}: a solution notebook is named NN_<lesson>_solutions.ipynb")
    return EXERCISES / f"{stem[:-len('_solutions')]}_exercises.ipynb"


def solution_paths(folder: Path = SOLUTIONS) -> list[Path]:
    return sorted(folder.glob("[0-9][0-9]_*_solutions.ipynb"))


def render(solution_path: Path) -> str:
    """The exercise notebook's file text for ``solution_path``."""
    nb = exercise_notebook(nbformat.read(str(solution_path), as_version=4), solution_path.name)
    return nbformat.writes(nb) + "\n"


def render_solution(solution_path: Path) -> str:
    """The solution notebook's file text with its nbgrader metadata (unchanged where it has it)."""
    return nbformat.writes(with_nbgrader(nbformat.read(str(solution_path), as_version=4))) + "\n"


def _write(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file beside it (no half-written notebook)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a notebook differs from what its solution makes")
    args = ap.parse_args(argv)
    stale = []
    for sol in solution_paths():
        for dest, text in ((sol, render_solution(sol)), (exercise_path(sol), render(sol))):
            if dest.is_file() and dest.read_text() == text:
                continue
            stale.append(dest)
            if not args.check:
                _write(dest, text)
    if args.check and stale:
        print("stale exercise or solution notebooks (run python3 scripts/make_exercises.py):",
              ", ".join(p.name for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
