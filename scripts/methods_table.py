"""Rewrite the methods table of docs/methods.md (§Methods at a glance) from the registry (developer tool).

The block between :data:`acetools.merging._registry.TABLE_BEGIN` and ``TABLE_END`` becomes
:func:`acetools.merging.methods_table`; ``tests/test_registry.py`` fails when it drifts.

    python3 scripts/methods_table.py
"""

from __future__ import annotations

from pathlib import Path

from acetools.errors import InputError
from acetools.merging import methods_table
from acetools.merging._registry import TABLE_BEGIN, TABLE_END

DOC = Path(__file__).resolve().parents[1] / "docs" / "methods.md"


def update_methods_table(path: Path = DOC) -> bool:
    """Rewrite the generated table in ``path``; True when the file changed."""
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.partition(TABLE_BEGIN)
    _, _, tail = rest.partition(TABLE_END)
    if TABLE_BEGIN not in text or TABLE_END not in rest:
        raise InputError(f"{path} has no {TABLE_BEGIN!r} ... {TABLE_END!r} block")
    new = f"{head}{TABLE_BEGIN}\n{methods_table()}\n{TABLE_END}{tail}"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    print(f"{DOC}: {'rewritten' if update_methods_table() else 'up to date'}")
