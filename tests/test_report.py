"""acetools.report and the `acetools report` CLI: parameters, selection, profiles."""

from __future__ import annotations

import pytest

from acetools.cli import build_parser
from acetools.report import PROFILES, notebook_paths, parse_parameter, run_report


@pytest.mark.parametrize("text,expected", [
    ("seed=3", ("seed", 3)), ("quick=True", ("quick", True)), ("lr=0.5", ("lr", 0.5)),
    ("suite=tasks20", ("suite", "tasks20")), ("suites=['a', 'b']", ("suites", ["a", "b"])),
    ("name=a=b", ("name", "a=b")),
])
def test_parse_parameter(text, expected):
    assert parse_parameter(text) == expected


@pytest.mark.parametrize("bad", ["seed", "=3", "1x=2", "a b=1"])
def test_parse_parameter_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_parameter(bad)


def test_notebook_selection_by_stem_number_and_name():
    paths = notebook_paths()
    first = paths[0]
    for key in (first.stem, first.stem[:2], first.stem[3:]):
        assert notebook_paths(only=[key]) == [first]
    with pytest.raises(ValueError, match="no notebook matches"):
        notebook_paths(only=["99_nothing"])


def test_missing_notebooks_folder_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="notebooks"):
        notebook_paths(tmp_path / "nope")


def test_unknown_profile_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="profile"):
        run_report("fastest", out=tmp_path)
    assert set(PROFILES) == {"quick", "full"}


def test_cli_parses_report_options():
    args = build_parser().parse_args(["report", "--profile", "full", "--only", "00", "02", "-p", "seed=1", "-p", "quick=True"])
    assert args.profile == "full" and args.only == ["00", "02"] and args.parameter == ["seed=1", "quick=True"]


def test_cli_lists_notebooks(capsys):
    from acetools.cli import main

    assert main(["report", "--list"]) == 0
    out = capsys.readouterr().out.split()
    assert out == [p.stem for p in notebook_paths()]
