"""The repository keeps its promises: README commands, CI command, environment.yml in step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
# conda-forge names that differ from PyPI's
CONDA_NAME = {"torch": "pytorch"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)\n(.*?)```", text, re.S)
    assert block, "README.md must open with a bash block holding the two commands"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_readme_opens_with_two_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert "scripts/setup.sh" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_exactly_the_readme_test_command():
    test_cmd = _readme_commands()[1]
    ci = [ln.strip() for ln in (ROOT / ".ci/run").read_text().splitlines()]
    assert ci[-1] == test_cmd, f".ci/run must end with the README's test command {test_cmd!r}, ends with {ci[-1]!r}"
    assert any("scripts/setup.sh" in ln for ln in ci)


def test_environment_yml_in_step_with_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = py["optional-dependencies"]
    wanted = {_name(r) for r in py["dependencies"] + extras["dev"] + extras["course"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = set(), set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip |= {_name(d) for d in dep["pip"] if not d.startswith("-")}
        else:
            conda.add(_name(dep))
    have = conda | pip
    missing = sorted(n for n in wanted if CONDA_NAME.get(n, n) not in have)
    assert not missing, f"environment.yml lacks {missing} (listed in pyproject.toml)"
    extra = sorted(n for n in have - {"python", "pip"} if n not in {CONDA_NAME.get(w, w) for w in wanted})
    assert not extra, f"environment.yml lists {extra}, which pyproject.toml does not"
    assert any("-e ." in d for dep in env["dependencies"] if isinstance(dep, dict) for d in dep["pip"])


def test_setup_pins_torch_versions():
    setup = (ROOT / "scripts/setup.sh").read_text()
    for pin in ("torch==2.14.1", "torchvision==0.29.1", "open_clip_torch==3.3.0"):
        assert pin in setup


def test_ci_reruns_the_linalg_and_merge_tests_under_another_mkl_code_path():
    ci = (ROOT / ".ci/run").read_text()
    files = re.search(r'^LINALG_TESTS="([^"]+)"', ci, re.M)
    assert files, ".ci/run must list the linear-algebra and merge test files in LINALG_TESTS"
    names = files.group(1).split()
    assert "tests/test_numerics.py" in names and "tests/test_ace.py" in names and "tests/test_esm.py" in names
    missing = [n for n in names if not (ROOT / n).is_file()]
    assert not missing, f".ci/run's LINALG_TESTS names missing files {missing}"
    rerun = [ln for ln in ci.splitlines() if "$LINALG_TESTS" in ln and not ln.lstrip().startswith("#")]
    assert len(rerun) == 1 and "MKL_CBWR=COMPATIBLE" in rerun[0] and "MKL_ENABLE_INSTRUCTIONS=" in rerun[0], rerun
    lines = [ln.strip() for ln in ci.splitlines()]
    assert lines.index(rerun[0].strip()) < len(lines) - 1  # before, not instead of, the README's command


_NUMBER = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}
_PAGES = ("README.md", "CONTRIBUTING.md", "docs/*.md")


def _pages() -> list[Path]:
    return [p for pattern in _PAGES for p in sorted(ROOT.glob(pattern))]


def test_every_count_of_notebooks_matches_the_folder():
    """"Seven numbered notebooks", "six notebooks", a list that stops at 06: every count of the
    course's notebooks in the README and docs/ is the number in notebooks/."""
    from acetools.notebooks import notebook_paths

    lessons = [p.stem for p in notebook_paths()]
    wrong = []
    for page in _pages():
        text = re.sub(r"\s+", " ", page.read_text(encoding="utf-8"))
        for m in re.finditer(r"\b(\w+) (?:numbered |course |executed )?(?:notebooks|lessons)\b", text, re.I):
            word = m.group(1).lower()
            n = _NUMBER.get(word, int(word) if word.isdigit() else None)
            if n is not None and n != len(lessons):
                wrong.append(f"{page.relative_to(ROOT)}: {m.group(0)!r} (notebooks/ has {len(lessons)})")
        for m in re.finditer(r"00_quickstart …\s*\u00a7?`?(\d\d_\w+)", text):
            if m.group(1) != lessons[-1]:
                wrong.append(f"{page.relative_to(ROOT)}: a list of the lessons ends at {m.group(1)}, not {lessons[-1]}")
    assert not wrong, "\n".join(wrong)


def test_the_course_map_and_course_md_list_every_notebook():
    from acetools.notebooks import notebook_paths

    readme = (ROOT / "README.md").read_text()
    course = (ROOT / "docs" / "course.md").read_text()
    for stem in (p.stem for p in notebook_paths()):
        assert f"| `{stem}` |" in readme, f"README.md's course map lacks {stem}"
        assert re.search(rf"^## {stem}\s*$", course, re.M), f"docs/course.md has no section ## {stem}"


def test_readme_is_a_front_page():
    """At most 3,000 words, and how to open the course in JupyterLab within its first 60 lines."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 3000, f"README.md has {len(text.split())} words"
    assert "jupyter lab notebooks/" in "\n".join(text.splitlines()[:60])


def _shown_commands() -> list[str]:
    """Every line of a bash block in the README (comments and `[optional]` parts dropped)."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(re.sub(r"\s*\[[^\]]*\]", "", line))
    return out


def test_every_acetools_command_the_readme_shows_parses():
    """Each `acetools ...` command of the README is one the CLI accepts (parsed, not run: the ones
    that run in seconds are run by their own tests), and every script it names exists."""
    import shlex

    from acetools.cli import build_parser

    parser = build_parser()
    seen = 0
    for line in _shown_commands():
        for part in re.split(r"\s*&&\s*", line):
            words = shlex.split(part)
            if words[:3] == ["python3", "-m", "acetools"] or words[:1] == ["acetools"]:
                args = words[3:] if words[0] == "python3" else words[1:]
                try:
                    parser.parse_args(args)
                except SystemExit as err:
                    raise AssertionError(f"README command does not parse: {part!r}") from err
                seen += 1
            elif words[:1] in (["python3"], ["bash"]) and words[1].endswith((".py", ".sh")):
                assert (ROOT / words[1]).is_file(), f"README runs {words[1]}, which does not exist"
    assert seen >= 8


def test_reading_times_are_the_lessons_own():
    """The README's course map and docs/teaching.md state each lesson's reading time as computed
    from the notebook (scripts/build_site.py reading_minutes: prose and code, rounded to 5 min)."""
    import nbformat

    from acetools.notebooks import notebook_paths
    from tests.scripts import load_script

    minutes = load_script("build_site").reading_minutes
    readme = (ROOT / "README.md").read_text()
    teaching = (ROOT / "docs" / "teaching.md").read_text()
    wrong = []
    for path in notebook_paths():
        want = minutes(nbformat.read(str(path), as_version=4))
        row = re.search(rf"^\| `{path.stem}` \|[^|]*\| (\d+) min \|", readme, re.M)
        if not row or int(row.group(1)) != want:
            said = row.group(1) if row else "no"
            wrong.append(f"README.md course map, {path.stem}: {said} min, the notebook reads in {want} min")
        for m in re.finditer(rf"`{path.stem}` \(read (\d+) min", teaching):
            if int(m.group(1)) != want:
                wrong.append(f"docs/teaching.md, {path.stem}: read {m.group(1)} min, the notebook reads in {want} min")
    assert not wrong, "\n".join(wrong) + "\n(python3 scripts/readme_tables.py rewrites them)"


def _acetools_imports(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every ``import acetools…`` / ``from acetools… import name`` in a file (the library's
    and the course's, ``acetools_course``)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("acetools", "acetools_course"):
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] in ("acetools", "acetools_course")]
    return found


SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")])


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_script_imports_names_the_package_still_has(path):
    """A script under benchmarks/ or scripts/ breaks silently when the package moves a name; each
    of its acetools imports must resolve (without running the script)."""
    import importlib

    missing = []
    for module, name in _acetools_imports(path):
        mod = importlib.import_module(module)
        if name is not None and name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{path.name} imports what acetools no longer has: {missing}"


@pytest.mark.parametrize("name", ["acetools", "acetools_course"])
def test_every_data_file_of_the_package_ships_in_the_wheel(name):
    """A table read at run time (``tasks.json``, ``regime.json``, the course's ``paper_tables.json``, ...) that
    pyproject's package-data misses works from a checkout and fails from an installed wheel. The patterns are
    globbed as setuptools globs them (``*`` stays inside one folder)."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][name]
    package = ROOT / name
    data = {p.relative_to(package).as_posix() for p in package.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert data, "the package holds no data files: the walk is wrong"
    shipped = {p.relative_to(package).as_posix() for pat in patterns for p in package.glob(pat)}
    missing = sorted(data - shipped)
    assert not missing, f"add these to [tool.setuptools.package-data] in pyproject.toml: {missing}"
