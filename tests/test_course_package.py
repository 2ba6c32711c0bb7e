"""The course as one installable package beside the library (docs/course.md §Naming rule).

* The library never imports the course: no ``acetools/**/*.py`` imports ``acetools_course``, and importing the
  library's entry points loads none of it.
* No import shim: no ``sys.path`` edit in any module (``scripts/``, ``benchmarks/``, ``tests/``, the packages; nor
  in the code one hands a child process) or in the notebooks' code cells, and no ``pythonpath`` setting for
  pytest; the course is imported as the installed package it is.
* Names say what they are: no module of ``acetools_course`` has the name of a module or package of ``acetools``.
* A lesson lives in at most four places: its notebook, its module ``acetools_course/lessonNN_X.py``, its
  exercises (with solutions) and its tests.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "acetools_course"
#: The library's entry points a user imports (``acetools``'s ``__init__`` imports the merge API).
LIBRARY_ENTRY = ("acetools", "acetools.cli", "acetools.files", "acetools.merging", "acetools.plotting",
                 "acetools.diagnostics", "acetools.benchmark", "acetools.results", "acetools.search",
                 "acetools.regime", "acetools.notebooks", "acetools.world", "acetools.reports")
#: Top-level folders that hold no code (build outputs, figures, prose).
NOT_CODE = {"build", "figures", "docs", "node_modules", "__pycache__"}
#: Files named for a lesson that are not that lesson: lesson 05 is the claims page, and ``claims`` also names
#: the course's claim registry (every lesson records its verdicts there), the script that rejudges them and
#: their tests; ``benchmark`` also names the library's ``acetools/benchmark.py``, tested with its text rows.
NAMED_FOR_ANOTHER_THING = {"acetools_course/claims.py", "scripts/rejudge_claims.py", "tests/claims/test_claims.py",
                           "tests/test_rejudge_claims.py", "tests/test_benchmark.py", "tests/test_benchmark_text.py"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every absolute import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module))
    return found


def _env_without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


# --------------------------------------------------------------------------- (a) the library never imports the course


def test_no_library_module_imports_the_course():
    files = sorted((ROOT / "acetools").rglob("*.py"))
    assert len(files) > 50, "the walk found too few library files"
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in files for line, mod in _imports(p)
           if mod.split(".")[0] == "acetools_course"]
    assert not bad, "the library must not import the course (move what it needs into acetools): " + "; ".join(bad)


def test_importing_the_library_loads_no_course_module():
    code = (f"import importlib, sys\nfor m in {LIBRARY_ENTRY!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'acetools_course'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", f"the library loaded course modules: {r.stdout.strip()}"


def test_the_import_scan_sees_a_course_import(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("import os\n\ndef f():\n    from acetools_course.verdicts import NOISE\n")
    assert (4, "acetools_course.verdicts") in _imports(path)


# --------------------------------------------------------------------------- (b) no import shim


#: Edits the self-tests below feed the scan (the one place ``tests/`` may spell one, as data).
EDIT_SAMPLES = ("import sys\nsys.path.insert(0, 'x')", "import sys\nsys.path[:0] = ['x']",
                "import sys\nsys.path += ['x']", "import sys\nsys.path.append('x')", "import sys\nsys.path = ['x']")
#: The same in code a test hands a child process: a ``str.format`` template, an f-string, a one-line program.
CHILD_EDIT_SAMPLES = ('code = """\nimport sys\nsys.path.insert(0, {root!r})\n"""',
                      'code = f"""\nimport sys\nsys.path[:0] = [{str(ROOT)!r}]\n"""',
                      'INSTALL = ("import sys; sys.path.insert(1, sys.argv.pop(1)); ")')
#: ``sys.path`` changed on a line of code that does not parse (a ``str.format`` template): a method call or an
#: assignment to it, a slice or an item of it.
EDIT_LINE = re.compile(r"\bsys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear|__setitem__)\s*\(|"
                       r"(\[[^\]]*\])*\s*\+?=(?!=))")


def _mutates_sys_path(source: str, samples: tuple[str, ...] = ()) -> list[int]:
    """Lines of ``source`` that change ``sys.path`` (a call of one of its methods, or an assignment to it or to
    a slice or item of it), also in the code a string constant holds for a child process (an f-string's holes
    read as names); ``samples``: strings that are data, not code."""
    def is_path(node) -> bool:
        while isinstance(node, ast.Subscript):
            node = node.value
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    def held_code(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(str(v.value) if isinstance(v, ast.Constant) else "_" for v in node.values)
        return None

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_path(node.func.value):
            if node.func.attr in ("insert", "append", "extend", "remove", "pop", "clear", "__setitem__"):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_path(t) for t in targets):
                lines.append(node.lineno)
        code = held_code(node) if isinstance(node, (ast.Constant, ast.JoinedStr)) else None
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and code and "sys.path" in code and code not in samples:
            try:
                inner = _mutates_sys_path(textwrap.dedent(code), samples)
            except SyntaxError:
                inner = [i for i, ln in enumerate(code.splitlines(), 1) if EDIT_LINE.search(ln)]
            lines += [node.lineno for _ in inner[:1]]
    return sorted(set(lines))


def _code_cells(path: Path) -> list[str]:
    """The code cells of a notebook, with IPython's magics and shell lines blanked (they are not Python)."""
    nb = nbformat.read(str(path), as_version=4)
    return ["\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in c.source.splitlines())
            for c in nb.cells if c.cell_type == "code"]


def test_no_sys_path_edit_in_any_module_or_notebook():
    """Scripts, benchmarks, tests, the library and the course (every ``.py`` of the repository outside its build
    outputs), and the notebooks' code cells."""
    files = _code_files()
    tops = {f.split("/")[0] for f in files}
    notebooks = sorted((ROOT / "notebooks").rglob("*.ipynb"))
    assert {"scripts", "benchmarks", "tests", "acetools", "acetools_course"} <= tops and len(notebooks) >= 8, (
        "the walk found too few modules or notebooks")
    bad = [f"{f}:{line}" for f in files
           for line in _mutates_sys_path((ROOT / f).read_text("utf-8"), EDIT_SAMPLES + CHILD_EDIT_SAMPLES)]
    bad += [f"{p.relative_to(ROOT)} cell {i}" for p in notebooks for i, src in enumerate(_code_cells(p))
            if _mutates_sys_path(src)]
    assert not bad, ("import the installed packages (pip install -e . installs acetools and acetools_course), load "
                     "a script by path (tests/conftest.py's load_script) or give a child process its PYTHONPATH "
                     "instead of editing sys.path: " + "; ".join(bad))


@pytest.mark.parametrize("source", EDIT_SAMPLES)
def test_the_sys_path_scan_sees_an_edit(source):
    assert _mutates_sys_path(source) == [2]
    assert _mutates_sys_path("import sys\nprint(sys.path[0])") == []


@pytest.mark.parametrize("source", CHILD_EDIT_SAMPLES, ids=["a format template", "an f-string", "a one-liner"])
def test_the_sys_path_scan_sees_an_edit_in_a_child_processs_code(source):
    assert _mutates_sys_path(source) == [1]
    assert _mutates_sys_path('code = "import sys; print(sys.path[0] == sys.path[1])"') == []
    assert _mutates_sys_path(f"SAMPLE = {EDIT_SAMPLES[0]!r}", EDIT_SAMPLES) == []


def test_pytest_has_no_pythonpath_setting():
    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "pythonpath" not in pytest_ini, "the course is an installed package: drop pythonpath from pyproject.toml"
    assert not (ROOT / "pytest.ini").exists() and not (ROOT / "setup.cfg").exists()


# --------------------------------------------------------------------------- (c) names say what they are


def _basenames(folder: Path) -> set[str]:
    """The names of the modules and packages under ``folder`` (``x`` for ``x.py`` and for ``x/``)."""
    out = {p.stem for p in folder.rglob("*.py") if p.stem != "__init__" and "__pycache__" not in p.parts}
    return out | {p.name for p in folder.rglob("*") if p.is_dir() and p.name != "__pycache__" and p != folder}


def _name_clashes(course: Path, library: Path) -> list[str]:
    return sorted(_basenames(course) & _basenames(library))


def test_no_course_module_has_the_name_of_a_library_module_or_package():
    assert {"verdicts", "lesson_worlds", "lesson02_ace_step_by_step"} <= _basenames(COURSE)
    assert {"world", "benchmark", "plotting", "ace"} <= _basenames(ROOT / "acetools")
    clashes = _name_clashes(COURSE, ROOT / "acetools")
    assert not clashes, f"rename these acetools_course modules to say what they hold (acetools has them): {clashes}"


def test_the_name_rule_sees_a_clash(tmp_path):
    (tmp_path / "course").mkdir()
    (tmp_path / "lib" / "world").mkdir(parents=True)
    (tmp_path / "course" / "world.py").write_text("")
    (tmp_path / "course" / "page.py").write_text("")
    (tmp_path / "lib" / "world" / "base.py").write_text("")
    assert _name_clashes(tmp_path / "course", tmp_path / "lib") == ["world"]


#: Folders whose scripts Python runs with the folder first on the path: each script is a top-level module there.
SCRIPT_FOLDERS = ("scripts", "benchmarks")


def _clashing_names(files: list[str]) -> list[str]:
    """Names two modules would share where the names clash: a test module's name twice under ``tests/`` (one name,
    one test file), or one top-level name twice (a script beside its siblings in ``scripts/``/``benchmarks/``, a
    top-level package, a module at the repository's root)."""
    tests: dict[str, list[str]] = {}
    top: dict[str, list[str]] = {}
    for f in files:
        p = Path(f)
        if p.parts[0] == "tests" and p.name.startswith("test_"):
            tests.setdefault(p.stem, []).append(f)
        if len(p.parts) == 1 or (len(p.parts) == 2 and p.parts[0] in SCRIPT_FOLDERS):
            top.setdefault(p.stem, []).append(f)
        elif len(p.parts) == 2 and p.name == "__init__.py":
            top.setdefault(p.parts[0], []).append(f)
    return sorted(f"{name}: {', '.join(fs)}" for names in (tests, top) for name, fs in names.items() if len(fs) > 1)


def test_no_two_modules_share_a_name_where_names_clash():
    files = _code_files()
    assert {"tests/lessons/test_lesson02_ace_step_by_step.py", "benchmarks/text_world.py"} <= set(files)
    clashes = _clashing_names(files)
    assert not clashes, "rename one of each (a test module for what it tests, a script for what it does): " + \
        "; ".join(clashes)


def test_the_name_clash_rule_sees_a_second_test_module_and_a_second_script():
    files = ["tests/course/test_benchmark.py", "tests/claims/test_benchmark.py", "tests/test_ace.py",
             "scripts/merge_rows.py", "benchmarks/merge_rows.py", "acetools/files/merge_files.py",
             "benchmarks/merge_files.py", "acetools/world/text/finetune.py", "acetools/world/vision/finetune.py",
             "acetools/__init__.py", "scripts/acetools.py"]
    assert _clashing_names(files) == [
        "acetools: acetools/__init__.py, scripts/acetools.py",
        "merge_rows: scripts/merge_rows.py, benchmarks/merge_rows.py",
        "test_benchmark: tests/course/test_benchmark.py, tests/claims/test_benchmark.py"]





# --------------------------------------------------------------------------- (d) a lesson in at most four places


def _lessons() -> dict[str, str]:
    """``{"02": "ace_step_by_step", ...}`` from the numbered notebooks."""
    out = {}
    for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        number, name = p.stem.split("_", 1)
        out[number] = name
    return out


def _code_files() -> list[str]:
    """Every ``.py`` file of the repository (its tests included) outside its build outputs, relative to it."""
    found = []
    for top in ROOT.iterdir():
        if top.name.startswith(".") or top.name in NOT_CODE:
            continue
        paths = [top] if top.suffix == ".py" else top.rglob("*.py") if top.is_dir() else []
        found += [p.relative_to(ROOT).as_posix() for p in paths if "__pycache__" not in p.parts]
    return sorted(found)


def _misplaced(lessons: dict[str, str], files: list[str]) -> list[str]:
    """Files named for a lesson that are not its module or its tests' module (the library's own names aside)."""
    bad = []
    for number, name in lessons.items():
        own = {f"acetools_course/lesson{number}_{name}.py", f"tests/lessons/test_lesson{number}_{name}.py"}
        bad += [f"{f} (lesson {number}: {name})" for f in files
                if name in Path(f).stem and f not in own and not f.startswith("acetools/")
                and f not in NAMED_FOR_ANOTHER_THING]
    return bad


def test_each_lesson_lives_in_at_most_four_places():
    """Notebook, module, exercises with solutions, tests: no other ``.py`` is named for a lesson than its module
    and its tests' ``tests/lessons/test_lessonNN_<name>.py``. The library (``acetools/``) is not the course: its
    ``benchmark.py`` is the benchmark lesson 04 uses."""
    lessons = _lessons()
    assert len(lessons) >= 8, lessons
    files = _code_files()
    assert {"acetools_course/verdicts.py", "scripts/build_site.py", "tests/test_course_package.py"} <= set(files)
    modules = sorted(f for f in files if re.fullmatch(r"acetools_course/lesson\d\d_\w+\.py", f))
    unknown = [m for m in modules if Path(m).stem.removeprefix("lesson")[:2] not in lessons
               or Path(m).stem != f"lesson{Path(m).stem[6:8]}_{lessons[Path(m).stem[6:8]]}"]
    assert not unknown, f"a lesson module is named lessonNN_<its notebook's name>: {unknown}"
    bad = _misplaced(lessons, files)
    assert not bad, ("a lesson's code lives in acetools_course/lessonNN_<name>.py and its tests in "
                     "tests/lessons/test_lessonNN_<name>.py only: " + "; ".join(bad))
    tests = sorted(f for f in files if re.fullmatch(r"tests/lessons/test_lesson\d\d_\w+\.py", f))
    assert tests and all(Path(t).stem.removeprefix("test_") in {Path(m).stem for m in modules} for t in tests), (
        f"a lesson's tests are named test_<its module's name>.py: {tests}")
    for number, name in lessons.items():
        for folder, suffix in (("exercises", "_exercises"), ("solutions", "_solutions")):
            extra = [p.name for p in (ROOT / "notebooks" / folder).glob(f"*{name}*")
                     if p.name != f"{number}_{name}{suffix}.ipynb"]
            assert not extra, f"notebooks/{folder}: one notebook per lesson, named {number}_{name}{suffix}.ipynb"


def test_the_four_places_rule_sees_a_fifth():
    files = ["acetools_course/lesson02_ace_step_by_step.py", "acetools/benchmark.py",
             "scripts/ace_step_by_step_figures.py", "acetools_course/plotting/ace_step_by_step.py",
             "tests/lessons/test_lesson02_ace_step_by_step.py", "tests/claims/test_ace_step_by_step.py",
             "tests/course/test_benchmark.py"]
    assert _misplaced({"02": "ace_step_by_step", "04": "benchmark"}, files) == [
        "scripts/ace_step_by_step_figures.py (lesson 02: ace_step_by_step)",
        "acetools_course/plotting/ace_step_by_step.py (lesson 02: ace_step_by_step)",
        "tests/claims/test_ace_step_by_step.py (lesson 02: ace_step_by_step)",
        "tests/course/test_benchmark.py (lesson 04: benchmark)"]


# --------------------------------------------------------------------------- (e) installed, importable from anywhere


def _where_installed(tmp_path: Path) -> dict[str, str | None]:
    """Where a fresh interpreter, from a folder outside the repository and without PYTHONPATH, finds the
    packages (``None``: not found)."""
    code = ("import importlib.util, json\n"
            "print(json.dumps({n: getattr(importlib.util.find_spec(n), 'origin', None)"
            " for n in ('acetools', 'acetools_course')}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=_env_without_pythonpath())
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _inside(origin: str | None) -> bool:
    return origin is not None and Path(origin).resolve().is_relative_to(ROOT)


def test_the_course_imports_from_anywhere_once_installed(tmp_path):
    """``pip install -e .`` installs ``acetools_course`` beside ``acetools``: a fresh interpreter in another
    folder, without PYTHONPATH, imports it (and its paper tables, package data) from this repository."""
    where = _where_installed(tmp_path)
    if not _inside(where["acetools"]) and not _inside(where["acetools_course"]):
        pytest.skip(f"acetools is not installed from this checkout (a fresh interpreter finds acetools at "
                    f"{where['acetools']}, acetools_course at {where['acetools_course']}): run pip install -e . in "
                    f"{ROOT} to test this one")
    assert _inside(where["acetools_course"]), (
        f"acetools is installed from {ROOT} but acetools_course is not ({where['acetools_course']}): "
        "pyproject.toml's packages.find must include it; reinstall with pip install -e .")
    code = "import acetools_course.paper_tables as P; print(P.__file__, len(P.VISION))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=_env_without_pythonpath())
    assert r.returncode == 0, r.stderr[-2000:]
    path, rows = r.stdout.split()
    assert Path(path).resolve().is_relative_to(ROOT) and int(rows) > 0
