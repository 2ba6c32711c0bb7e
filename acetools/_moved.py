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
        new = new_name(spec.name)
        _warn(spec.name, new)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__  # the import system now sets __spec__ to the old one
        return module

    def exec_module(self, module):
        module.__spec__ = self._specs.pop(module.__spec__.name)  # the new module, its own spec, two names

    # what ``python -m <old path>`` (runpy) asks for
    def get_code(self, fullname):
        new = new_name(fullname)
        _warn(fullname, new)
        return importlib.util.find_spec(new).loader.get_code(new)

    def is_package(self, fullname):
        return importlib.util.find_spec(new_name(fullname)).submodule_search_locations is not None


def install() -> None:
    """Put :class:`OldPaths` first on ``sys.meta_path`` (once per interpreter)."""
    if not any(type(f).__name__ == "OldPaths" and type(f).__module__ == __name__ for f in sys.meta_path):
        sys.meta_path.insert(0, OldPaths())
