"""The folders show the layers (issue 22): the moved modules, their old paths, and who imports what.

* every old path (``acetools.zoo``, ``acetools.data.<module>``, ...) still imports, warns with a
  ``DeprecationWarning`` that names the new path, and gives the very same module and objects; no
  file is left at an old path (``acetools._moved`` answers them), so git follows each move;
* the library itself imports only the new paths: importing every module of ``acetools`` and
  running ``python3 -m acetools --help`` emit no ``DeprecationWarning`` from acetools;
* ``acetools.merging`` (and ``layouts``/``keys``, which it uses) import nothing of the file side
  (``acetools.files``), the worlds (``acetools.world``) or the course.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from acetools._moved import MOVED, new_name

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "acetools"
DATA_SUBMODULES = sorted(m.name for m in pkgutil.iter_modules([str(PKG / "world" / "vision" / "data")]))


def _forget(old: str) -> None:
    """Drop ``old`` and its submodules from ``sys.modules`` (the new modules stay loaded)."""
    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        del sys.modules[name]


def _import_old(old: str):
    """Import ``old`` afresh as an ``import`` statement would (``__import__``: the warning names this file)."""
    _forget(next(o for o in MOVED if old == o or old.startswith(o + ".")))  # the stub runs again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        __import__(old)
    return sys.modules[old], [w for w in caught if issubclass(w.category, DeprecationWarning)]


def _file(module: str) -> Path:
    where = PKG / Path(*module.split(".")[1:])
    return where / "__init__.py" if where.is_dir() else where.with_suffix(".py")


def test_the_moves_are_the_ones_documented():
    assert DATA_SUBMODULES and "loading" in DATA_SUBMODULES and "_core" in DATA_SUBMODULES
    assert new_name("acetools.data.loading") == "acetools.world.vision.data.loading"
    assert new_name("acetools.diagnostics") is None and new_name("acetools.database") is None
    for old, new in MOVED.items():
        assert new.startswith(("acetools.files.", "acetools.world.vision.")), new
        assert _file(new).exists(), new
        assert not _file(old).exists() and not _file(old).parent.joinpath(old.split(".")[-1]).exists(), \
            f"{old}: a file at the old path (git would not follow the move)"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_warns_and_gives_the_same_module(old):
    new = importlib.import_module(MOVED[old])
    spec = new.__spec__
    mod, dep = _import_old(old)
    assert mod is new
    assert sys.modules[old] is new
    assert new.__spec__ is spec and new.__name__ == MOVED[old]  # the new module keeps its own identity
    assert [str(w.message).split(";")[0] for w in dep] == [f"{old} moved to {MOVED[old]}"]
    assert dep[0].filename == __file__, f"the warning should point at the importer, not {dep[0].filename}"
    public = [n for n in dir(new) if not n.startswith("__")]
    assert public
    for name in public:
        assert getattr(mod, name) is getattr(new, name)
    # `from acetools import <old name>` and attribute access give the same module too
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is new


@pytest.mark.parametrize("sub", DATA_SUBMODULES)
def test_old_data_submodule_warns_and_gives_the_same_module(sub):
    new = importlib.import_module(f"acetools.world.vision.data.{sub}")
    mod, dep = _import_old(f"acetools.data.{sub}")
    assert mod is new and sys.modules["acetools.data"] is importlib.import_module("acetools.world.vision.data")
    assert new.__name__ == f"acetools.world.vision.data.{sub}" == new.__spec__.name
    assert [str(w.message).split(";")[0] for w in dep] == [  # the package, then the module
        "acetools.data moved to acetools.world.vision.data",
        f"acetools.data.{sub} moved to acetools.world.vision.data.{sub}"]
    for name in dir(new):
        if not name.startswith("__"):
            assert getattr(mod, name) is getattr(new, name)


def test_old_paths_give_the_same_objects_in_a_fresh_interpreter():
    # the zoo's classes (what a pickle or isinstance check of user code sees) are one class, not two
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from acetools.zoo import Zoo; from acetools.world.vision.zoo import Zoo as Z2\n"
        "from acetools.data.loading import load_split as a; from acetools.world.vision.data import load_split as b\n"
        "from acetools.diagnose import Diagnosis; from acetools.files.diagnose import Diagnosis as D2\n"
        "import acetools.models, acetools.world.vision.models\n"
        "print(Zoo is Z2, a is b, Diagnosis is D2, acetools.models is acetools.world.vision.models)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True"] * 4
    # python -m with an old path runs the new module
    run = subprocess.run([sys.executable, "-m", "acetools.data.calibrate", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0 and "--suite" in run.stdout, run.stderr[-2000:]


def _library_modules() -> list[str]:
    old = set(MOVED)
    stubs = tuple(o + "." for o in old)
    names = ["acetools"]
    for info in pkgutil.walk_packages([str(PKG)], prefix="acetools."):
        name = info.name
        if name in old or name.startswith(stubs) or name in ("acetools._moved", "acetools.__main__"):
            continue
        names.append(name)
    return names


def test_the_library_imports_no_deprecated_path():
    """Import every module of acetools (new paths only) and run the CLI's --help: no DeprecationWarning
    that comes from acetools (a moved module imported through its old path would raise one)."""
    mods = _library_modules()
    assert "acetools.files.merge_files" in mods and "acetools.world.vision.data.loading" in mods
    assert "acetools.zoo" not in mods and "acetools.data" not in mods
    code = (
        "import importlib, json, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    for m in {mods!r}:\n"
        "        importlib.import_module(m)\n"
        "dep = [[str(w.message), w.filename] for w in caught if issubclass(w.category, DeprecationWarning)]\n"
        "print(json.dumps(dep))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    ours = [w for w in json.loads(out.stdout.strip().splitlines()[-1])
            if "acetools" in w[0] or str(PKG) in w[1]]
    assert not ours, ours
    cli = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m", "acetools", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=env)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "usage: acetools" in cli.stdout
    assert not [ln for ln in cli.stderr.splitlines() if "DeprecationWarning" in ln and "acetools" in ln], cli.stderr


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import statement in ``path`` (relative imports resolved)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    pkg = parts[:-1]  # the package that a relative import starts from (a module's or an __init__'s folder)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            found += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return found


def test_library_sources_import_only_new_paths():
    old = tuple(MOVED)
    bad = []
    for path in PKG.rglob("*.py"):
        if path.name == "_moved.py":
            continue
        for line, mod in _imports(path):
            if mod in old or mod.startswith(tuple(o + "." for o in old)):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, bad


def test_merging_imports_no_file_reader_and_no_world():
    below = [PKG / "layouts.py", PKG / "keys.py", PKG / "utils.py", *sorted((PKG / "merging").glob("*.py"))]
    banned = ("acetools.files", "acetools.world", "acetools.course", *MOVED)
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in below for line, mod in _imports(p)
           if mod.startswith(banned)]
    assert not bad, bad
    assert any(mod.startswith("acetools.layouts") for _, mod in _imports(PKG / "merging" / "__init__.py"))
