"""``python -m acetools``: the command line (:func:`acetools.cli.main`).

Run from a folder that holds a clone named ``acetools/`` (a checkout, whose ``acetools/`` has no
``__init__.py``), Python finds that folder first on its path and imports it as an empty namespace package
``acetools``: an editable install's finder is asked only after the path search, so it supplies this file
and the submodules but not the package's ``__init__`` (``cannot import name '__version__'``). The package
is then loaded from the folder of this file, as it would be from anywhere else (docs/your-models.md
§What can be read).
"""

import sys
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path


def _unshadow() -> None:
    """Replace an empty namespace package ``acetools`` (a folder of that name in the working directory) by the
    package this file belongs to; one line naming the folder and the fix when that cannot be done."""
    name = __spec__.parent if __spec__ is not None else "acetools"
    pkg = sys.modules.get(name)
    if pkg is None or getattr(pkg, "__file__", None) is not None:
        return  # the package itself (its __init__ ran)
    here = Path(__file__).resolve().parent
    shadow = ", ".join(str(Path(p).resolve()) for p in getattr(pkg, "__path__", []))
    init = here / "__init__.py"
    spec = spec_from_file_location(name, init, submodule_search_locations=[str(here)])
    if not init.is_file() or spec is None or spec.loader is None:
        sys.exit(f"acetools: error: the folder {shadow} (no __init__.py) shadows the installed acetools package; "
                 "run from another folder (cd elsewhere) or rename that folder")
    module = module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_unshadow()

from .cli import main  # noqa: E402  (after the package is the real one)

raise SystemExit(main())
