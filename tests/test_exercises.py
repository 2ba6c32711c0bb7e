"""The exercises and their solutions (notebooks/exercises/, notebooks/solutions/).

* Both folders are committed clean (docs/style.md §12) with one literal parameters cell, and
  every lesson the exercises name exists in notebooks/.
* Each exercise notebook is generated from its solution (scripts/make_exercises.py) and has not
  drifted from it; every exercise is a cell tagged ``exercise`` with a ``TODO`` and a ``check``
  cell after it.
* Every check fails on its exercise's stub, with the exercise's own message, and passes on the
  solution (run in this process, cell by cell: seconds).
* The solutions run under papermill in the quick profile; an untouched exercise notebook stops
  at its first check with PapermillExecutionError naming it.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from acetools.notebooks import notebook_paths, run_notebook
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((REPO / "notebooks" / "solutions").glob("*.ipynb"))
EXERCISES = sorted((REPO / "notebooks" / "exercises").glob("*.ipynb"))
#: Lessons with exercises (docs/teaching.md): three exercises each.
LESSONS = ("00_quickstart", "01_theorem1", "02_ace_step_by_step", "03_esm_step_by_step", "07_language",
           "08_lora_experts")


def _script():
    return load_script("make_exercises")


def _tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def test_every_lesson_with_exercises_has_both_notebooks():
    lessons = {p.stem for p in notebook_paths()}
    assert [p.name for p in SOLUTIONS] == [f"{n}_solutions.ipynb" for n in LESSONS]
    assert [p.name for p in EXERCISES] == [f"{n}_exercises.ipynb" for n in LESSONS]
    missing = [n for n in LESSONS if n not in lessons]
    assert not missing, f"exercises for lessons that notebooks/ does not have: {missing}"


@pytest.mark.parametrize("path", SOLUTIONS + EXERCISES, ids=lambda p: p.name)
def test_notebook_is_clean_with_one_parameters_cell(path):
    raw = json.loads(path.read_text())
    nbformat.validate(nbformat.reads(path.read_text(), as_version=4))
    assert raw["metadata"]["kernelspec"]["name"] == "python3"
    assert raw["metadata"]["language_info"]["name"] == "python"
    for i, cell in enumerate(raw["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, f"{path.name} cell {i} ran"
    assert raw["cells"][0]["cell_type"] == "markdown"
    params = [c for c in raw["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{path.name}: {len(params)} parameters cells"
    src = "".join(params[0]["source"])
    for node in ast.parse(src).body:
        assert isinstance(node, ast.AnnAssign), f"{path.name}: parameters line {node.lineno} is not `name: type = x`"
        ast.literal_eval(node.value)
    assert "quick: bool" in src


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_exercises_are_generated_from_their_solutions(path):
    mod = _script()
    dest = mod.exercise_path(path)
    assert dest.is_file(), f"{dest.name} is missing: run python3 scripts/make_exercises.py"
    assert dest.read_text() == mod.render(path), f"{dest.name} drifted: run python3 scripts/make_exercises.py"
    ex = nbformat.read(str(dest), as_version=4)
    todo = [c for c in ex.cells if "exercise" in _tags(c)]
    assert len(todo) == 3, f"{dest.name}: {len(todo)} exercises, three per lesson"
    for c in todo:
        assert "# TODO" in c.source and "SOLUTION" not in c.source
    assert "(solutions)" not in ex.cells[0].source


def test_the_generator_refuses_a_region_without_a_stub():
    mod = _script()
    with pytest.raises(ValueError, match="exercise stub"):
        mod.exercise_source("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n", "here")
    with pytest.raises(ValueError, match="without"):
        mod.exercise_source("def f():\n    return 1\n", "here")


def _run_cells(nb, ns: dict, stub_for: int | None = None) -> None:
    """Execute ``nb``'s code cells in ``ns``; the exercise cell number ``stub_for`` (0-based among
    the exercises) in its stub form, its check expected to fail with the exercise's message."""
    mod = _script()
    n = -1
    expect_failure = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        src = cell.source
        if "parameters" in _tags(cell):
            src += "\nquick = True\n"
        if "exercise" in _tags(cell):
            n += 1
            expect_failure = n == stub_for
            if expect_failure:
                src = mod.exercise_source(src, "test")
        if "check" in _tags(cell) and expect_failure:
            with pytest.raises(AssertionError, match=rf"^Exercise {n + 1}[: ]"):
                exec(compile(src, f"check {n + 1}", "exec"), ns)
            return
        exec(compile(src, "cell", "exec"), ns)
    assert stub_for is None, f"exercise {stub_for + 1} not found"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_check_fails_on_its_stub_and_passes_on_the_solution(path, capsys):
    nb = nbformat.read(str(path), as_version=4)
    _run_cells(nb, {})
    assert capsys.readouterr().out.count("passed") == 3
    for k in range(3):
        _run_cells(nb, {}, stub_for=k)


@pytest.fixture()
def kernel_env(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ACETOOLS_NUM_THREADS", "1")


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_runs_in_the_quick_profile(path, tmp_path, kernel_env):
    rec = run_notebook(path, tmp_path, {"quick": True}, html=False, cwd=REPO / "notebooks")
    nb = nbformat.read(rec["executed"], as_version=4)
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert [int(m) for m in re.findall(r"Exercise (\d) passed", out)] == [1, 2, 3]


@pytest.mark.slow
def test_an_untouched_exercise_notebook_fails_its_first_check(tmp_path, kernel_env):
    from papermill.exceptions import PapermillExecutionError

    path = REPO / "notebooks" / "exercises" / "02_ace_step_by_step_exercises.ipynb"
    with pytest.raises(PapermillExecutionError, match=r"Exercise 1: your gamma .* differs from "
                                                      r"acetools\.merging\.ace\.heterogeneity"):
        run_notebook(path, tmp_path, {"quick": True}, html=False, cwd=REPO / "notebooks")
