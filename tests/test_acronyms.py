"""Every acronym is spelled out where a lesson first uses it (docs/glossary.md §Acronyms).

The acronyms and their spelled-out forms are the table of docs/glossary.md §Acronyms. A lesson's
markdown is read cell by cell in order; at the first use of an acronym, its spelled-out form
must have appeared (in that cell or before), or that first use must be a link to the glossary.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from acetools.notebooks import notebook_paths

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"


def acronyms() -> dict[str, str]:
    """``{acronym: spelled out}`` from the table of docs/glossary.md §Acronyms."""
    text = GLOSSARY.read_text(encoding="utf-8").split("\n## Acronyms", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| *([^|`]+?) *\| *([^|]+?) *\|", text, flags=re.M)
    return {a: s for a, s in rows if a not in ("acronym", "---")}


def _plain(text: str) -> str:
    """Lower case, one kind of dash, no emphasis, single spaces: how a spelled-out form is matched."""
    text = re.sub(r"[*_`]", "", text.lower())
    return re.sub(r"\s+", " ", re.sub(r"[‐-―−]", "-", text))


def _use(acronym: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w]){re.escape(acronym)}(?![\w])")


def undefined(cells: list[str], table: dict[str, str]) -> list[str]:
    """The acronyms of ``table`` that ``cells`` (markdown, in order) use before spelling them out or
    linking their first use to the glossary, each with the start of the cell of its first use."""
    problems = []
    for acronym, spelled in table.items():
        for i, cell in enumerate(cells):
            m = _use(acronym).search(cell)
            if m is None:
                continue
            linked = any(a.start() <= m.start() < a.end() and "glossary.md" in a.group(2)
                         for a in re.finditer(r"\[([^\]]*)\]\(([^)]*)\)", cell))
            if not linked and _plain(spelled) not in _plain("\n".join(cells[: i + 1])):
                problems.append(f"{acronym} ({spelled}) first used in: {cell.strip()[:70]!r}")
            break
    return problems


def test_the_glossary_lists_the_acronyms():
    table = acronyms()
    for name in ("ESD", "TSV-M", "CTS", "WUDI", "CART", "TIES", "DARE", "ACE", "ESM", "CKA", "SVD", "MTL"):
        assert name in table, f"docs/glossary.md §Acronyms lacks {name}"
    assert table["ESD"] == "essential subspace decomposition"


def test_an_acronym_used_before_it_is_spelled_out_is_found():
    table = {"ESD": "essential subspace decomposition"}
    assert undefined(["ESD keeps energy.", "ESD is the essential subspace decomposition."], table)
    assert not undefined(["The essential subspace decomposition (ESD).", "ESD again."], table)
    assert not undefined(["See [ESD](../docs/glossary.md#acronyms) for it."], table)
    assert undefined(["See [ESD](../docs/methods.md#esm) for it."], table)
    assert not undefined(["SESDE is another word.", "no acronym here"], table)


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_every_acronym_is_spelled_out_at_first_use(path):
    nb = nbformat.read(str(path), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "markdown"]
    problems = undefined(cells, acronyms())
    assert not problems, f"{path.name}: spell these out where first used, or link them to " \
                         "docs/glossary.md#acronyms:\n" + "\n".join(problems)
