"""The command line: every bad argument is one line ``acetools: error: ...`` with exit 2
(``--debug`` shows the traceback), ``-p`` values are checked against the notebooks'
parameters cells before any kernel starts, ``zoo build --check`` never raises, and
``--quiet`` / ``--verbose`` set the library's logging level."""

from __future__ import annotations

import logging

import nbformat
import pytest

from acetools import notebooks as N
from acetools.cli import main


def _one_line_error(capsys, argv, *needles):
    """Run ``main(argv)``; it must return 2 and print exactly one stderr line naming ``needles``."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("acetools: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- parse-time errors
@pytest.mark.parametrize("argv,needles", [
    (["bench", "--suite", "nosuch"], ["--suite", "'nosuch'", "tasks8"]),
    (["zoo", "build", "--size", "bogus"], ["zoo build", "--size", "'bogus'", "micro"]),
    (["zoo", "build", "--suite", "nosuch", "--check"], ["--suite", "'nosuch'"]),
    (["demo", "--methods", "ace", "nosuch"], ["--methods", "'nosuch'", "task_arithmetic"]),
    (["bench", "--methods", "nosuch"], ["--methods", "'nosuch'"]),
    (["demo", "--tasks", "0"], ["--tasks", "positive"]),
    (["demo", "--tasks", "x"], ["--tasks", "'x'"]),
    (["demo", "--seed", "-1"], ["--seed", ">= 0"]),
    (["zoo", "build", "--seeds", "a"], ["--seeds", "'a'"]),
    (["zoo", "build", "--threads", "0"], ["--threads"]),
    (["bench", "--n-val", "0"], ["--n-val"]),
    (["bench", "--n-test", "-5"], ["--n-test"]),
    (["bench", "--patience", "0"], ["--patience"]),
    (["report", "--profile", "fastest"], ["--profile", "'fastest'", "quick"]),
    (["report", "--cell-timeout", "-1"], ["--cell-timeout"]),
    (["report", "--start-timeout", "soon"], ["--start-timeout", "'soon'"]),
    (["report", "--nosuch"], ["unrecognized arguments", "--nosuch"]),
    (["nosuch"], ["invalid choice", "'nosuch'"]),
    ([], ["required", "COMMAND"]),
    (["zoo"], ["zoo", "required"]),
    (["--quiet", "--verbose", "demo"], ["--verbose", "--quiet"]),
])
def test_parse_errors_are_one_line(capsys, argv, needles):
    _one_line_error(capsys, argv, *needles)


def test_every_subcommand_has_the_output_options():
    import argparse

    from acetools.cli import _add_output_options_everywhere, build_parser

    def walk(p, path):
        yield path, p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from walk(sub, [*path, name])

    parser = build_parser()
    _add_output_options_everywhere(parser)  # as main() does
    found = list(walk(parser, []))
    assert len(found) >= 6
    for path, p in found:
        for opt in ("--debug", "--quiet", "--verbose"):
            assert opt in p._option_string_actions, (path, opt)
        if path:  # below the top, the flags never reset a global one
            assert p._option_string_actions["--debug"].default is argparse.SUPPRESS


def test_help_exits_zero(capsys):
    assert main(["report", "--help"]) == 0
    assert "--debug" in capsys.readouterr().out


# ---------------------------------------------------------------- errors raised by the library
def test_unknown_notebook_names_it(capsys):
    _one_line_error(capsys, ["report", "--only", "99"], "'99'", "00_")


def test_missing_notebooks_folder_names_it(capsys, tmp_path):
    _one_line_error(capsys, ["report", "--list", "--notebooks", str(tmp_path / "nope")], "nope")


def test_malformed_parameter(capsys):
    _one_line_error(capsys, ["report", "-p", "bad"], "'bad'", "KEY=VALUE")
    _one_line_error(capsys, ["report", "-p", "1x=2"], "'1x'")


def test_unknown_parameter_names_it(capsys):
    _one_line_error(capsys, ["report", "--only", "00", "-p", "nosuch=1"], "nosuch", "seed")


@pytest.mark.parametrize("param,needles", [
    ("seed=abc", ["'seed'", "int", "'abc'"]),
    ("seed=1.5", ["'seed'", "int"]),
    ("seed=True", ["'seed'", "int"]),
    ("quick=yes", ["'quick'", "bool", "True or False"]),
    ("quick=1", ["'quick'", "bool"]),
])
def test_parameter_types_are_checked_before_any_kernel(capsys, monkeypatch, param, needles):
    import papermill as pm

    def no_kernel(*a, **k):
        raise AssertionError("a kernel was started for a bad parameter")

    monkeypatch.setattr(pm, "execute_notebook", no_kernel)
    _one_line_error(capsys, ["report", "--only", "00", "-p", param], *needles, "00_quickstart")


def test_bad_output_folder_is_named_before_anything_runs(capsys, tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    _one_line_error(capsys, ["report", "--only", "00", "--out", str(f)], "--out", "file.txt")
    _one_line_error(capsys, ["bench", "--out", str(f)], "--out", "file.txt")


def test_debug_shows_the_traceback(capsys):
    for argv in (["--debug", "report", "-p", "bad"], ["report", "-p", "bad", "--debug"]):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            main(argv)


def test_any_subcommand_gets_the_wrapper(capsys, monkeypatch):
    """Errors of the library a command calls are wrapped in main(), not per command."""
    import acetools.cli as C
    from acetools.errors import InputError, InputKeyError, InputTypeError

    for exc in (InputError("bad value for 'x'"), InputKeyError("no key 'k'"), InputTypeError("'t' must be a Tensor"),
                FileNotFoundError(2, "No such file or directory", "/no/such/file"), C.CLIError("bad 'c'")):
        def boom(args, exc=exc):
            raise exc

        monkeypatch.setattr(C, "_cmd_demo", boom)
        line = _one_line_error(capsys, ["demo"])
        assert "'" in line and ("/no/such/file" in line or str(exc.args[0]) in line)
        assert not line.startswith("acetools: error: \"")  # a KeyError's message, not its repr
    # a built-in ValueError is a library bug, not bad input: it keeps its traceback
    monkeypatch.setattr(C, "_cmd_demo", lambda args: int("not a number"))
    with pytest.raises(ValueError, match="invalid literal"):
        main(["demo"])


def test_ctrl_c_is_one_line_with_exit_130(capsys, monkeypatch):
    import acetools.cli as C

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(C, "_cmd_demo", interrupted)
    assert main(["demo"]) == 130
    assert capsys.readouterr().err.strip() == "acetools: interrupted"


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only bad input becomes one line; an unexpected exception is not hidden."""
    import acetools.cli as C

    def bug(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(C, "_cmd_demo", bug)
    with pytest.raises(ZeroDivisionError):
        main(["demo"])


# ---------------------------------------------------------------- -p parsing and type checking
def _notebook(folder, source):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir(exist_ok=True)
    path = folder / "00_tiny.ipynb"
    nbformat.write(nb, str(path))
    return path


PARAMS = """\
seed: int = 0  # a seed
lr: float = 0.5  # a rate
quick: bool = False  # fast
name: str = "a"  # a name
grid: list = [0.1, 0.2]  # a grid
names: list = ["x", "y"]  # names
anything = 3  # no annotation
"""


@pytest.mark.parametrize("raw,expected", [
    ({"seed": "3"}, {"seed": 3}), ({"lr": "1"}, {"lr": 1.0}), ({"lr": "2.5e-3"}, {"lr": 0.0025}),
    ({"quick": "True"}, {"quick": True}), ({"name": "3"}, {"name": "3"}), ({"name": "a b"}, {"name": "a b"}),
    ({"grid": "[1, 0.5]"}, {"grid": [1.0, 0.5]}), ({"names": "['p']"}, {"names": ["p"]}),
    ({"anything": "[1, 'z']"}, {"anything": [1, "z"]}), ({"anything": "text"}, {"anything": "text"}),
    ({"seed": 4, "lr": 3}, {"seed": 4, "lr": 3.0}),  # Python values from the library API
])
def test_check_parameters_parses_by_the_declared_type(tmp_path, raw, expected):
    path = _notebook(tmp_path, PARAMS)
    got = N.check_parameters([path], raw)
    assert got == expected and all(type(got[k]) is type(v) for k, v in expected.items())


@pytest.mark.parametrize("raw,match", [
    ({"seed": "abc"}, r"'seed' of 00_tiny expects int \(default 0\), got 'abc'"),
    ({"seed": "2.0"}, "'seed'.*int"),
    ({"lr": "fast"}, "'lr'.*float"),
    ({"lr": "True"}, "'lr'.*float"),
    ({"quick": "0"}, "'quick'.*bool.*True or False"),
    ({"grid": "0.1"}, "'grid'.*list"),
    ({"grid": "[0.1, 'a']"}, "'grid'.*elements must be float"),
    ({"names": "[x]"}, "'names'.*list"),
    ({"names": "[1]"}, "'names'.*elements must be str"),
    ({"name": 3}, "'name'.*str"),
])
def test_check_parameters_rejects_wrong_types(tmp_path, raw, match):
    path = _notebook(tmp_path, PARAMS)
    with pytest.raises(N.ParameterTypeError, match=match):
        N.check_parameters([path], raw)


def test_parse_parameter_keeps_text_when_asked():
    assert N.parse_parameter("seed=3", literal=False) == ("seed", "3")
    assert N.parse_parameter("seed=3") == ("seed", 3)


def test_run_report_checks_every_notebook_before_the_first_runs(tmp_path, monkeypatch):
    import papermill as pm

    folder = tmp_path / "nbs"
    _notebook(folder, "seed: int = 0  # a seed\n")
    nb = nbformat.read(str(folder / "00_tiny.ipynb"), as_version=4)
    nb.cells[0].source = "seed: int = 0  # a seed\nlr: float = 0.1  # a rate\n"
    nbformat.write(nb, str(folder / "01_other.ipynb"))
    started = []
    monkeypatch.setattr(pm, "execute_notebook", lambda *a, **k: started.append(a))
    with pytest.raises(N.UnknownParameterError, match="00_tiny.*'lr'"):
        N.run_report("quick", notebooks=folder, out=tmp_path / "b", html=False, parameters={"lr": 0.2})
    with pytest.raises(N.ParameterTypeError, match="'seed' of 00_tiny"):
        N.run_report("quick", notebooks=folder, out=tmp_path / "b", html=False, parameters={"seed": "x"})
    assert started == []


# ---------------------------------------------------------------- zoo build --check
def test_check_reports_a_missing_data_source_as_a_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ACETOOLS_DATA", str(tmp_path / "no-data"))
    code = main(["zoo", "build", "--check", "--suite", "online8", "--size", "micro", "--root", str(tmp_path / "zoo")])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "seed=0" in lines[0] and "cannot check" in lines[0] and "DataSourceError" in lines[0]


def test_check_never_raises(capsys, monkeypatch):
    import acetools.world.vision.zoo as Z

    def broken(self, **kw):
        raise RuntimeError("cache unreadable")

    monkeypatch.setattr(Z.Zoo, "missing", broken)
    code = main(["zoo", "build", "--check", "--suite", "tiny", "--size", "micro", "--seeds", "0", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 1 and len(out) == 2 and all("cannot check" in o and "cache unreadable" in o for o in out)


# ---------------------------------------------------------------- logging
@pytest.mark.parametrize("flag,level", [([], logging.INFO), (["--quiet"], logging.WARNING),
                                        (["--verbose"], logging.DEBUG), (["-q"], logging.WARNING)])
def test_quiet_and_verbose_set_the_library_level_while_main_runs(capsys, monkeypatch, flag, level):
    """The level holds inside the command, and main() leaves the logger as it found it: a
    handler left behind would hold this call's stderr (closed under pytest or papermill) and
    every later log line would fail with 'I/O operation on closed file'."""
    import os

    import acetools.cli as cli

    monkeypatch.setenv("ACETOOLS_PROGRESS", "1")
    logger = logging.getLogger("acetools")
    old = logger.level, list(logger.handlers)
    seen = []

    def fake_report(args):
        seen.append(logger.level)
        logging.getLogger("acetools.world.vision.zoo").info("an info line")
        return 0

    monkeypatch.setattr(cli, "_cmd_report", fake_report)
    for argv in ([*flag, "report", "--list"], ["report", "--list", *flag]):
        assert main(argv) == 0
        assert seen.pop() == level
        assert ("an info line" in capsys.readouterr().err) == (level <= logging.INFO)
        assert (logger.level, logger.handlers) == (old[0], old[1])
        assert os.environ["ACETOOLS_PROGRESS"] == "1"  # restored after --quiet


def test_library_is_silent_without_configuration():
    """A NullHandler on ``acetools``: without logging configured, even a library warning
    prints nothing (Python's last-resort handler would print it to stderr)."""
    import subprocess
    import sys

    code = "import logging, acetools; logging.getLogger('acetools.world.vision.zoo').warning('should not show')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "should not show" not in res.stderr, res.stderr
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("acetools").handlers)


def test_bad_cache_root_is_named_before_anything_is_built(capsys, tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    for cmd in (["zoo", "build"], ["zoo", "build", "--check"], ["bench"]):
        _one_line_error(capsys, [*cmd, "--suite", "tiny", "--size", "micro", "--root", str(f / "cache")],
                        "--root", "file.txt")


def test_more_eval_images_than_a_split_has_is_an_error(capsys):
    _one_line_error(capsys, ["bench", "--suite", "tiny", "--size", "micro", "--n-val", "100000"],
                    "--n-val 100000", "tiny_", "val images")
    _one_line_error(capsys, ["bench", "--suite", "tasks8", "--n-test", "5000"], "--n-test 5000", "test images")


@pytest.mark.parametrize("param,needles", [
    ("suite=nosuch", ["'suite'", "unknown suite 'nosuch'", "tasks8"]),
    ("size=huge", ["'size'", "unknown size 'huge'", "small"]),
])
def test_registry_parameters_name_registered_things(capsys, param, needles):
    _one_line_error(capsys, ["report", "--only", "00", "-p", param], *needles)


def test_list_parameters_are_checked_element_by_element(capsys):
    _one_line_error(capsys, ["report", "--only", "04", "-p", "suites=['tasks8', 'nosuch']"], "'suites'", "'nosuch'")
    _one_line_error(capsys, ["report", "--only", "04", "-p", "sweep_method=nosuch"], "'sweep_method'", "method")


def test_the_readme_report_commands_pass_the_checks(monkeypatch, tmp_path, capsys):
    """README: `report --only 02 -p seed=1 -p quick=True` reaches papermill with typed values."""
    import papermill as pm

    seen = []

    def fake(src, dst, parameters=None, **kw):
        seen.append(parameters)
        nbformat.write(nbformat.read(src, as_version=4), dst)

    monkeypatch.setattr(pm, "execute_notebook", fake)
    code = main(["report", "--only", "02", "-p", "seed=1", "-p", "quick=True", "--no-html", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert seen[0]["seed"] == 1 and seen[0]["quick"] is True


def test_a_failing_notebook_is_one_line_with_exit_1(monkeypatch, tmp_path, capsys):
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    def fail(*a, **k):
        raise PapermillExecutionError(3, 7, "x = 1/0", "ZeroDivisionError", "division by zero", [])

    monkeypatch.setattr(pm, "execute_notebook", fail)
    assert main(["report", "--only", "00", "--no-html", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("acetools: error")]
    assert "Traceback" not in err and "running 00_quickstart" in err  # the INFO line says which notebook
    assert len(lines) == 1 and "cell [7]" in lines[0] and "ZeroDivisionError: division by zero" in lines[0]
    with pytest.raises(PapermillExecutionError):
        main(["report", "--only", "00", "--no-html", "--out", str(tmp_path), "--debug"])


def test_argument_types_for_new_subcommands():
    """The ``type=`` helpers a new subcommand can use name the bad value."""
    import argparse

    from acetools.cli import nonnegative_int, positive_int

    assert positive_int("3") == 3 and nonnegative_int("0") == 0
    for fn, bad, match in ((positive_int, "0", "positive"), (positive_int, "1.5", "'1.5'"),
                           (nonnegative_int, "-1", ">= 0")):
        with pytest.raises(argparse.ArgumentTypeError, match=match):
            fn(bad)


def test_size_accepts_open_clip_names_and_rejects_unknown_ones(capsys):
    """--size takes the registered sizes and open_clip model names (the online suites use ViT-B-32)."""
    from acetools.cli import model_size

    assert model_size("small") == "small"
    assert model_size("ViT-B-32") == "ViT-B-32"
    assert main(["zoo", "build", "--size", "bogus", "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bogus" in err[0] and "ViT-B-32" in err[0]
