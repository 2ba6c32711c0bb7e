"""Rules of the code's shape (issue 22), checked on the source of ``acetools/``.

* No function is over 100 lines: long work is split into named steps.
* Input checks raise the project's own error types (:mod:`acetools.errors`), so that the
  command line prints them as one line and a library bug (a built-in ``TypeError``) keeps its
  traceback: no ``raise ValueError(`` / ``KeyError(`` / ``TypeError(`` in the library.
* The library never imports the course (``acetools/course``), outside the deprecated alias of
  ``acetools.regime.regime_targets``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / "acetools").rglob("*.py"))
MAX_LINES = 100


def _functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_library_function_is_over_100_lines():
    long = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in LIBRARY for n in _functions(p) if n.end_lineno - n.lineno + 1 > MAX_LINES]
    assert not long, "split these into named steps: " + "; ".join(long)


def test_the_ast_walk_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES + 1))
    path = tmp_path / "long.py"
    path.write_text(f"def f():\n{body}\n")
    (node,) = _functions(path)
    assert node.end_lineno - node.lineno + 1 > MAX_LINES


def test_input_checks_raise_the_projects_error_types():
    found = []
    for p in LIBRARY:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = getattr(node.exc.func, "id", None)
                if name in ("ValueError", "KeyError", "TypeError"):
                    found.append(f"{p.relative_to(ROOT)}:{node.lineno} raise {name}")
    assert not found, ("raise acetools.errors.InputError / InputKeyError / InputTypeError instead (the CLI prints "
                       "only the project's errors as bad input): " + "; ".join(found[:10]))


def test_user_errors_are_the_projects_own():
    from acetools.cli import USER_ERRORS, main
    from acetools.errors import AcetoolsError

    assert USER_ERRORS == (AcetoolsError, OSError)
    for builtin in (ValueError, KeyError, TypeError):
        assert not issubclass(builtin, USER_ERRORS)
    assert main(["merge", "--method", "ace", "--base", "/nonexistent/base.safetensors", "--experts",
                 "/nonexistent/e.safetensors", "--dry-run"]) == 2


def test_a_library_bug_keeps_its_traceback(monkeypatch):
    import acetools.cli as cli

    def buggy(args):
        return isinstance(1, lambda: None)  # TypeError from a bug, not from an input check

    monkeypatch.setattr(cli, "_cmd_demo", buggy)  # build_parser reads the handler when main() runs
    with pytest.raises(TypeError, match="isinstance"):
        cli.main(["demo"])


def test_the_library_does_not_import_the_course():
    bad = []
    for p in LIBRARY:
        if "course" in p.relative_to(ROOT / "acetools").parts[:1]:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and "course" in node.module.split("."):
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert bad == ["acetools/regime.py:" + str(_alias_line())], bad


def _alias_line() -> int:
    text = (ROOT / "acetools" / "regime.py").read_text(encoding="utf-8").splitlines()
    return next(i + 1 for i, line in enumerate(text) if "from .course.mergeable_world import regime_targets" in line)
