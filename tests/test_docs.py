"""The repository's docs are the only references code may cite (docs/style.md §5).

* Every ``docs/<file>.md §<section>`` reference in ``acetools/``, ``notebooks/``, ``tests/``,
  ``benchmarks/`` and ``README.md`` names a file in ``docs/`` and a heading in it (a chain such
  as ``docs/methods.md §Iso-C, §Iso-CTS`` is checked section by section); every equation label
  such as ``(ACE.10)`` exists in ``docs/methods.md``.
* Nothing cites the old, private specification (its section numbers, "the spec's rule", its
  style-guide numbers, "oracles.md") or a bare section number that no document carries.
* Every link between the docs pages (and from the README into ``docs/``) resolves, anchors
  included.
* The hyperparameter tables of ``docs/methods.md`` state exactly the registry's defaults
  (``acetools.METHODS[name].hparams``).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import acetools
from acetools.merging import REQUIRED

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Pages other branches are writing. A link to one of them is accepted while the file is missing;
#: once it exists, test_pending_pages_are_still_missing fails until its name is removed here, and
#: from then on its links and anchors are checked like every other page's.
PENDING: set[str] = set()

#: Paper names that may precede a section sign of the paper itself ("ACE-Merging §3").
PAPERS = ("ACE-Merging", "ESM", "TSV-M", "Iso-CTS", "Iso-C", "WUDI", "CART", "TIES", "DARE", "RegMean")

_OLD = re.compile(
    r"(?i:\bspec\b\s*§)"  # the old section numbers, e.g. 'spec' + ' §3.4'
    r"|\bspec verification\b"
    r"|\bthe spec's\b"
    r"|\(spec(?:,\s*[A-Z]|/)"  # '(spec, Notation)', '(spec/oracles.md)'
    r"|\bspec note\b"
    r"|\bSTYLE \d"  # the old style guide's numbers
    r"|(?<![\w/])oracles\.md"
    r"|algorithms\.md"
    r"|shared/(?:spec|seeds|notes)"
)


# --------------------------------------------------------------------------- reading
def _scanned_files() -> list[Path]:
    out: list[Path] = []
    for pattern in ("acetools/**/*.py", "tests/**/*.py", "benchmarks/**/*.py", "benchmarks/**/*.sh",
                    "acetools_course/*.py", "notebooks/*.ipynb", "notebooks/exercises/*.ipynb",
                    "notebooks/solutions/*.ipynb", "README.md"):
        out += sorted(p for p in ROOT.glob(pattern) if p.is_file())
    return [p for p in out if p.resolve() != Path(__file__).resolve()]


def _text(path: Path) -> str:
    """The file's text; for a notebook, its cells' sources joined (so JSON escapes do not matter)."""
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":
        cells = json.loads(raw)["cells"]
        return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)
    return raw


def _flat(text: str) -> str:
    """Line breaks (with the next line's indentation and comment marker) as one space, so a
    reference wrapped over two lines reads as one."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#:?[ \t]*)?", " ", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(path: Path) -> list[str]:
    """The headings of a docs page as a reader sees them: a link in one reads as its text."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = re.match(r"(#{1,6})\s+(.+?)\s*#*\s*$", line)
        if m and not fenced:
            out.append(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2)))
    return out


def _keys(path: Path) -> list[str]:
    """What a reference may name after '§': a heading's text, or the number of a numbered heading
    ("12" for "12. Committed notebooks are clean"); longest first."""
    keys = set()
    for h in _headings(path):
        keys.add(h)
        m = re.match(r"(\d+)\.\s", h)
        if m:
            keys.add(m.group(1))
    return sorted(keys, key=len, reverse=True)


def _match_key(rest: str, keys: list[str]) -> str | None:
    for k in keys:
        if rest.startswith(k) and (len(rest) == len(k) or not re.match(r"[\w-]", rest[len(k)])):
            return k
    return None


_REF = re.compile(r"docs/([\w.-]+\.md)")
_CHAIN = re.compile(r"(?:,\s*| and | or |\s*/\s*)§")


def _references(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Problems with the docs references in ``text``, and the spans they cover."""
    problems, spans = [], []
    for m in _REF.finditer(text):
        name = m.group(1)
        page = DOCS / name
        end = m.end()
        if not page.is_file():
            if name not in PENDING:
                problems.append(f"docs/{name} does not exist")
            spans.append((m.start(), end))
            continue
        keys = _keys(page)
        if text.startswith("#", end):  # docs/methods.md#ace (a link)
            anchor = re.match(r"#([\w-]+)", text[end:])
            if anchor and anchor.group(1) not in {_slug(h) for h in _headings(page)}:
                problems.append(f"docs/{name}#{anchor.group(1)}: no such anchor")
            spans.append((m.start(), end + (anchor.end() if anchor else 0)))
            continue
        if text.startswith(" §", end):
            pos = end + 2
            while True:
                k = _match_key(text[pos:], keys)
                if k is None:
                    problems.append(f"docs/{name} §{text[pos:pos + 30]!r}: no heading starts with that "
                                    f"(headings: {keys})")
                    break
                end = pos = pos + len(k)
                chain = _CHAIN.match(text, pos)  # "§Iso-C, §Iso-CTS": each must be a heading of the page
                if not chain:
                    break
                pos = chain.end()
        spans.append((m.start(), end))
    return problems, spans


def _labels() -> set[str]:
    """Equation labels defined in docs/methods.md: '(ACE.10)' at the end of a line."""
    text = (DOCS / "methods.md").read_text(encoding="utf-8")
    return set(re.findall(r"\(([A-Za-z][\w-]*\.\d+)\)\s*$", text, flags=re.MULTILINE))


# --------------------------------------------------------------------------- tests
def test_docs_pages_exist():
    for name in ("index.md", "methods.md", "course.md", "style.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"


@pytest.mark.parametrize("path", _scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_references_resolve(path):
    text = _text(path)
    flat = _flat(text)
    problems, spans = _references(flat)
    for m in _OLD.finditer(flat):
        problems.append(f"old reference {flat[max(0, m.start() - 30):m.end() + 30]!r}: cite a docs/ section instead")
    for m in re.finditer("§", flat):
        if any(a <= m.start() < b for a, b in spans):
            continue
        if re.match(r"\[§[^\]]*\]\(docs/", flat[m.start() - 1:]):  # link text: [§TSV-M](docs/methods.md#tsv-m)
            continue
        before = flat[max(0, m.start() - 15):m.start()]
        if not before.rstrip().endswith(PAPERS):
            problems.append(f"section sign outside a docs reference: {flat[max(0, m.start() - 30):m.start() + 30]!r}")
    prefixes = {lab.split(".")[0] for lab in _labels()}
    defined = _labels()
    for m in re.finditer(r"\(([A-Za-z][\w-]*)\.(\d+)\)", flat):
        if m.group(1) in prefixes and f"{m.group(1)}.{m.group(2)}" not in defined:
            problems.append(f"equation ({m.group(1)}.{m.group(2)}) is not defined in docs/methods.md")
    sources = (DOCS / "methods.md").read_text(encoding="utf-8")
    for tag in set(re.findall(r"\[(?:[A-Z]+-(?:code|notes|table|arXiv)|FB|MK)\]", flat)):
        if f"| {tag} |" not in sources:
            problems.append(f"source tag {tag} is not defined in docs/methods.md §Sources")
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_equation_labels_are_unique():
    text = (DOCS / "methods.md").read_text(encoding="utf-8")
    found = re.findall(r"\(([A-Za-z][\w-]*\.\d+)\)\s*$", text, flags=re.MULTILINE)
    dupes = sorted({x for x in found if found.count(x) > 1})
    assert not dupes, f"equation labels defined twice in docs/methods.md: {dupes}"
    assert {"ACE.10", "ESM.9", "TSV-M.2"} <= set(found)


def _links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")) + [ROOT / "README.md"], ids=lambda p: p.name)
def test_links_resolve(page):
    problems = []
    for target in _links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if page.name == "README.md" and not file.startswith("docs/"):
            if file and not dest.exists():
                problems.append(f"{target}: no such file")
            continue
        if not dest.is_file():
            if dest.parent == DOCS and dest.name in PENDING:
                continue
            problems.append(f"{target}: no such file")
            continue
        if anchor and anchor not in {_slug(h) for h in _headings(dest)}:
            problems.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not problems, f"{page.name}:\n" + "\n".join(problems)


def test_pending_pages_are_still_missing():
    landed = sorted(n for n in PENDING if (DOCS / n).exists())
    assert not landed, f"{landed} exist now: remove them from PENDING in tests/test_docs.py so their links are checked"


def test_index_lists_every_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    pages = {p.name for p in DOCS.glob("*.md") if not p.name.startswith("_")} | PENDING
    missing = sorted(n for n in pages - {"index.md"} if f"]({n})" not in index)
    assert not missing, f"docs/index.md does not link {missing}"


# --------------------------------------------------------------------------- defaults
_SECTION_OF = {
    "task_arithmetic": "Task arithmetic", "ties": "TIES", "dare": "DARE", "tsv_m": "TSV-M", "iso_c": "Iso-C",
    "iso_cts": "Iso-CTS", "cart": "CART", "wudi": "WUDI", "regmean": "RegMean", "ace": "ACE", "esm": "ESM",
    "weight_averaging": "Weight averaging",
}


def _section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert m, f"docs/methods.md has no section '## {heading}'"
    return m.group(1)


def _split_top(cell: str, n: int) -> list[str]:
    parts = [p.strip() for p in re.split(r",\s*(?![^(]*\))", cell)]
    return parts if n > 1 else [cell.strip()]


def _doc_defaults(section: str) -> dict[str, str]:
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([A-Za-z_]\w*)`", cells[0])
        values = _split_top(cells[1], len(names))
        if len(values) != len(names):
            raise AssertionError(f"cannot pair names {names} with defaults {cells[1]!r}")
        out.update(dict(zip(names, values)))
    return out


def _same(doc: str, value) -> bool:
    if value is REQUIRED:
        return doc == "required"
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        return re.findall(r"`([^`]+)`", doc) == list(value)
    try:
        parsed = ast.literal_eval(doc.replace("`", ""))
    except (ValueError, SyntaxError):
        return False
    return parsed == value and type(parsed) in (type(value), int, float) or (parsed is value)


@pytest.mark.parametrize("method", sorted(_SECTION_OF))
def test_methods_md_states_the_registry_defaults(method):
    info = acetools.METHODS[method]
    text = (DOCS / "methods.md").read_text(encoding="utf-8")
    doc = _doc_defaults(_section(text, _SECTION_OF[method]))
    assert set(doc) == set(info.hparams), (
        f"docs/methods.md §{_SECTION_OF[method]} lists {sorted(doc)}, the registry has {sorted(info.hparams)}")
    wrong = {k: (doc[k], v) for k, v in info.hparams.items() if not _same(doc[k], v)}
    assert not wrong, f"docs/methods.md §{_SECTION_OF[method]}: documented vs registered defaults differ: {wrong}"


def test_every_registered_method_has_a_section():
    assert set(acetools.METHODS) <= set(_SECTION_OF), sorted(set(acetools.METHODS) - set(_SECTION_OF))
