"""pyright (basic mode, ``[tool.pyright]`` in pyproject.toml) finds no error in the library.

pyright comes with the dev extra (``pip install -e .[dev]``: the ``pyright`` wheel bundles the
type checker and its ``nodejs`` extra a Node.js from PyPI) or the conda environment; the test
fails, saying how to install it, where it is missing. Nothing is downloaded here:
``PYRIGHT_PYTHON_IGNORE_WARNINGS`` turns off the wrapper's check for a newer release, and
``.ci/run`` runs pyright once after installing (an older wrapper fetches its npm package then).
About a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pyright() -> list[str]:
    exe = shutil.which("pyright")
    if exe is not None:
        return [exe]
    try:
        import pyright  # noqa: F401 - the wrapper's module, run as python -m pyright
    except ImportError:
        pytest.fail("pyright is not installed: pip install -e '.[dev]' (or the conda environment, "
                    "environment.yml) brings it; the library's type check did not run")
    return [sys.executable, "-m", "pyright"]


@pytest.mark.slow
def test_pyright_basic_on_the_library():
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    res = subprocess.run([*_pyright(), "--outputjson", "--project", str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=900, env=env)
    try:
        report = json.loads(res.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright gave no JSON report (exit {res.returncode}): {(res.stderr or res.stdout).strip()[-500:]}")
    assert report["summary"]["filesAnalyzed"] > 50, f"pyright checked only {report['summary']['filesAnalyzed']} files"
    errors = [d for d in report.get("generalDiagnostics", []) if d.get("severity") == "error"]
    shown = "; ".join(f"{Path(d['file']).relative_to(ROOT)}:{d['range']['start']['line'] + 1}: {d['message']}"
                      for d in errors[:15])
    assert not errors, f"pyright (basic) finds {len(errors)} error(s) in acetools/: {shown}"
