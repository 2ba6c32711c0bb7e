"""The repository keeps its promises: README commands, CI command, environment.yml in step."""

from __future__ import annotations

import re
from pathlib import Path

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
    wanted = {_name(r) for r in py["dependencies"] + py["optional-dependencies"]["dev"]}
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
