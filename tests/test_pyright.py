"""pyright (basic mode, ``pyrightconfig.json``) finds no error in the library.

Skipped, with the reason, where pyright is not installed (``pip install -e .[dev]`` or the
conda environment brings it; it needs Node.js, which the ``pyright`` wheel fetches once).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_pyright_basic_on_the_library():
    exe = shutil.which("pyright")
    if exe is None:
        pytest.skip("pyright is not installed (pip install pyright, or the dev extra): the type check did not run")
    res = subprocess.run([exe, "--outputjson", "-p", str(ROOT / "pyrightconfig.json")], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    try:
        report = json.loads(res.stdout)
    except json.JSONDecodeError:
        pytest.skip(f"pyright could not run here (no JSON report; exit {res.returncode}): {res.stderr.strip()[-300:]}")
    errors = [d for d in report.get("generalDiagnostics", []) if d.get("severity") == "error"]
    shown = "; ".join(f"{Path(d['file']).relative_to(ROOT)}:{d['range']['start']['line'] + 1}: {d['message']}"
                      for d in errors[:15])
    assert not errors, f"pyright (basic) finds {len(errors)} error(s) in acetools/: {shown}"
