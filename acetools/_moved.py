"""The old import paths of modules that moved (issue 22), kept for one release.

``acetools.zoo``, ``acetools.data`` (and ``acetools.data.<module>``), ``acetools.models`` and
``acetools.finetune`` moved to :mod:`acetools.world.vision`; ``acetools.checkpoints``,
``acetools.merge_files``, ``acetools.activations``, ``acetools.esm_inputs`` and
``acetools.diagnose`` moved to :mod:`acetools.files`. No file is left at an old path (so git
follows each move); instead :class:`OldPaths`, first on ``sys.meta_path`` once ``acetools`` is
imported, answers an old name: it warns (a ``DeprecationWarning`` naming the new path) and gives
the new module itself, so the old path yields the very same objects. ``python -m`` with an old
path runs the new module. The library imports only the new paths (``tests/test_moved.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

#: old module path -> new module path (a package's submodules follow it).
MOVED = {
    "acetools.zoo": "acetools.world.vision.zoo",
    "acetools.data": "acetools.world.vision.data",
    "acetools.models": "acetools.world.vision.models",
    "acetools.finetune": "acetools.world.vision.finetune",
    "acetools.checkpoints": "acetools.files.checkpoints",
    "acetools.merge_files": "acetools.files.merge_files",
    "acetools.activations": "acetools.files.activations",
    "acetools.esm_inputs": "acetools.files.esm_inputs",
    "acetools.diagnose": "acetools.files.diagnose",
}


def new_name(old: str) -> str | None:
    """The new path of the old module path ``old`` (``None`` if it did not move)."""
    for o, n in MOVED.items():
        if old == o or old.startswith(o + "."):
            return n + old[len(o):]
    return None


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; import it from there (the old path works for one release)",
                  DeprecationWarning, stacklevel=3)


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finder and loader of the old paths: ``import acetools.zoo`` gives ``acetools.world.vision.zoo``."""

    def __init__(self):
        self._specs = {}  # old name -> the new module's own spec, while the import system loads it

    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        found = importlib.util.find_spec(new) if new else None
        if found is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=found.origin,
                                               is_package=found.submodule_search_locations is not None)

    def create_module(self, spec):
        new = _moved_to(spec.name)
        _warn(spec.name, new)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__  # the import system now sets __spec__ to the old one
        return module

    def exec_module(self, module):
        old = module.__spec__  # set by the import system to the old name's spec (module.__name__ is the new one)
        if old is None:
            raise ImportError(f"{module.__name__} lost its module spec while loading", name=module.__name__)
        module.__spec__ = self._specs.pop(old.name)  # the new module, its own spec, two names

    # what ``python -m <old path>`` (runpy) asks for
    def get_code(self, fullname):
        new = _moved_to(fullname)
        _warn(fullname, new)
        loader = _new_spec(new).loader
        if not isinstance(loader, importlib.abc.InspectLoader):
            raise ImportError(f"{new} (the new path of {fullname}) has no code to run", name=fullname)
        return loader.get_code(new)

    def is_package(self, fullname):
        return _new_spec(_moved_to(fullname)).submodule_search_locations is not None


def _moved_to(old: str) -> str:
    """The new path of ``old``, which :class:`OldPaths` found (ImportError if it did not move)."""
    new = new_name(old)
    if new is None:
        raise ImportError(f"{old} is not an old path of acetools", name=old)
    return new


def _new_spec(new: str) -> importlib.machinery.ModuleSpec:
    spec = importlib.util.find_spec(new)
    if spec is None:
        raise ImportError(f"no module named {new!r}", name=new)
    return spec


def install() -> None:
    """Put :class:`OldPaths` first on ``sys.meta_path`` (once per interpreter)."""
    if not any(type(f).__name__ == "OldPaths" and type(f).__module__ == __name__ for f in sys.meta_path):
        sys.meta_path.insert(0, OldPaths())
