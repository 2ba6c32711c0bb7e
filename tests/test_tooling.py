"""Repository tooling: ruff is configured and clean; the setup script waits for the apt lock."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str] | None:
    exe = shutil.which("ruff")
    if exe:
        return [exe]
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    return None


def test_ruff_is_configured():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert cfg["line-length"] == 120
    select = cfg["lint"]["select"]
    assert {"E", "F", "W", "I", "B"} <= set(select)  # import sorting and bugbear (issue 22), as pre-commit runs them


def test_ruff_check_is_clean():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the dev extra: pip install -e '.[dev]')")
    res = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"ruff check found problems:\n{res.stdout[-6000:]}{res.stderr[-2000:]}"


def test_setup_script_waits_for_the_apt_lock():
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert "DPkg::Lock::Timeout" in setup and "could not get lock" in setup.lower()
    calls = [ln.strip() for ln in setup.splitlines()
             if re.search(r"\bapt-get\s+(update|install|upgrade)", ln) and not ln.strip().startswith(("#", "echo"))]
    assert not calls, f"apt-get run without apt_wait (fails at once when another apt holds the lock): {calls}"
    assert re.search(r"apt_wait update", setup) and re.search(r"apt_wait install", setup)


def test_setup_script_is_valid_bash():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    res = subprocess.run([bash, "-n", str(ROOT / "scripts/setup.sh")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
