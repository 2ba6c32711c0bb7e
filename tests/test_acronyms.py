"""Every acronym is spelled out where a lesson or a docs page first uses it (docs/glossary.md §Acronyms).

The acronyms and their spelled-out forms are the table of docs/glossary.md §Acronyms. A lesson's
markdown (and that of its exercises and of their solutions, each opened on its own) is read cell by
cell in order, a docs page (docs/*.md, README.md) block by block (headings, paragraphs, table rows,
list items); at the first use of an acronym, its spelled-out form must have appeared (in that cell
or block, or before), or that first use must be a link to the glossary. On a page, code (fenced
blocks and spans) and links' addresses are not reading text.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from acetools.notebooks import notebook_paths

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "glossary.md"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_LINK = re.compile(r"\[([^\]]*)\]\(([^)]*)\)")


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


def _without_addresses(cell: str) -> str:
    """``cell`` with each link's address blanked out (same length), so that only its words are read."""
    return _LINK.sub(lambda a: a.group(0)[: a.start(2) - a.start()] + " " * len(a.group(2)) + ")", cell)


def page_blocks(text: str) -> list[str]:
    """A markdown page's reading text, block by block in order: fenced code and code spans dropped;
    a heading, a table row and a list item are blocks of their own, a paragraph is one block."""
    text = re.sub(r"^ *(```|~~~).*?^ *\1[^\n]*$", "", text, flags=re.M | re.S)
    text = re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", " ", text, flags=re.S)
    blocks: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        for line in paragraph.splitlines():
            starts = re.match(r" {0,3}(#|\||[-*+] |\d+[.)] )", line)
            if starts or not blocks or blocks[-1] == "":
                blocks.append(line)
            else:
                blocks[-1] += "\n" + line
        blocks.append("")
    return [b for b in blocks if b.strip()]


def undefined(cells: list[str], table: dict[str, str], glossary: str = "glossary.md") -> list[str]:
    """The acronyms of ``table`` that ``cells`` (markdown, in order) use before spelling them out or
    linking their first use to the glossary (a link to the file named ``glossary``; ``""`` on the
    glossary itself: a link to one of its own headings), each with
    the start of the cell of its first use. Links' addresses are not searched for uses."""
    problems = []
    for acronym, spelled in table.items():
        for i, cell in enumerate(cells):
            m = _use(acronym).search(_without_addresses(cell))
            if m is None:
                continue
            linked = any(a.start() <= m.start() < a.end() and Path(a.group(2).split("#")[0]).name == glossary
                         for a in _LINK.finditer(cell))
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


#: The lessons, and their exercises and solutions (a student opens each on its own).
NOTEBOOKS = [*notebook_paths(), *sorted((ROOT / "notebooks" / "exercises").glob("*.ipynb")),
             *sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))]


def test_the_notebooks_read_include_the_exercises_and_solutions():
    stems = {p.stem for p in NOTEBOOKS}
    lessons = [p.stem for p in notebook_paths()]
    assert len(lessons) >= 9 and {f"{n}_{kind}" for n in lessons for kind in ("exercises", "solutions")} <= stems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_acronym_is_spelled_out_at_first_use(path):
    nb = nbformat.read(str(path), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "markdown"]
    problems = undefined(cells, acronyms())
    assert not problems, f"{path.name}: spell these out where first used, or link them to " \
                         "docs/glossary.md#acronyms:\n" + "\n".join(problems)


def test_a_page_is_read_without_its_code_and_link_addresses():
    table = {"TIES": "trim, elect sign and merge", "ESD": "essential subspace decomposition"}
    page = "# Title\n\n```python\nmerge('TIES')\n```\n\nRun `TIES` or [this](methods.md#TIES).\n"
    assert page_blocks(page) == ["# Title", "Run   or [this](methods.md#TIES)."]
    assert not undefined(page_blocks(page), table)
    row = "| a | b |\n|---|---|\n| ESD | 1 |\n\nThe essential subspace decomposition.\n"
    assert undefined(page_blocks(row), table), "a table row before the words is a first use"
    assert not undefined(page_blocks("## On [ESD](#acronyms)\n"), table, glossary="")
    assert undefined(page_blocks("## On [ESD](methods.md#esm)\n"), table, glossary="")


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_acronym_is_spelled_out_at_first_use_on_a_page(path):
    blocks = page_blocks(path.read_text(encoding="utf-8"))
    glossary = "" if path == GLOSSARY else GLOSSARY.name
    problems = undefined(blocks, acronyms(), glossary)
    assert not problems, f"{path.relative_to(ROOT)}: spell these out where first used, or link " \
                         "them to docs/glossary.md#acronyms:\n" + "\n".join(problems)
