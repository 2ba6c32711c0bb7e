"""Every notebook reads as a lesson: objectives first, "What we learned" last, the audit after it
in a marked appendix (the lesson shape docs/style.md asks for)."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _cells(path: Path) -> list[tuple[str, str]]:
    """A notebook's cells as ``(source, cell_type)``."""
    return [("".join(c["source"]), c["cell_type"]) for c in json.loads(path.read_text())["cells"]]


def _headings(path: Path) -> list[str]:
    return [line.strip() for src, kind in _cells(path) if kind == "markdown"
            for line in src.splitlines() if re.match(r"#{1,3} ", line)]


def test_there_are_nine_lessons():
    assert len(NOTEBOOKS) == 9, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_what_we_learned_closes_the_lesson_and_only_an_appendix_follows(path):
    heads = _headings(path)
    learned = [i for i, h in enumerate(heads) if h == "## What we learned"]
    assert len(learned) == 1, f"{path.name}: one '## What we learned' heading, found {len(learned)}"
    after = [h for h in heads[learned[0] + 1:] if h.startswith("## ")]
    assert all(h.startswith("## Appendix") for h in after), (
        f"{path.name}: after 'What we learned' only '## Appendix …' sections may follow; found {after}")
    assert heads[0].startswith("# "), f"{path.name}: the first heading is the lesson's title"


#: The lessons that implement a method's equations (docs/style.md §1) and their tagged equations.
IMPLEMENTING = ["01_theorem1", "02_ace_step_by_step", "03_esm_step_by_step", "07_language", "08_lora_experts"]


def _library_names(code: str) -> set[str]:
    """The names a notebook binds from acetools (modules, functions, aliases, results of its calls)."""
    names = {"acetools"}
    for m in re.finditer(r"^from acetools[\w.]* import (?:\(([^)]*)\)|(.*))$", code, re.M):
        for part in (m.group(1) or m.group(2)).replace("\n", ",").split(","):
            part = part.strip()
            if part:
                names.add(part.split(" as ")[-1].strip())
    names |= {m.group(1) for m in re.finditer(r"^import acetools[\w.]* as (\w+)", code, re.M)}
    # and the names assigned from a library call (``covs = A.normalize_covariances(...)``)
    lib = r"(?:" + "|".join(map(re.escape, sorted(names))) + r")\s*[.(]"
    for m in re.finditer(r"^([\w, ]+?)\s*=\s*" + lib, code, re.M):
        names |= {n.strip() for n in m.group(1).split(",") if n.strip().isidentifier()}
    return names


def equation_checks(path: Path) -> list[tuple[str, bool]]:
    """Each tagged equation of a lesson and whether one of the next three code cells checks it: the
    cell calls ``assert_close`` and names something acetools computed."""
    cells = _cells(path)
    lib = _library_names("\n".join(src for src, kind in cells if kind == "code"))
    uses_lib = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(lib))) + r")\b")
    out = []
    for i, (src, kind) in enumerate(cells):
        if kind != "markdown":
            continue
        following = [s for s, k in cells[i + 1:] if k == "code"][:3]
        checked = any("assert_close(" in s and uses_lib.search(s) for s in following)
        out += [(tag, checked) for tag in re.findall(r"\\tag\{([^}]+)\}", src)]
    return out


@pytest.mark.parametrize("stem", IMPLEMENTING)
def test_nine_in_ten_tagged_equations_are_computed_and_checked_against_the_library(stem):
    checks = equation_checks(next(p for p in NOTEBOOKS if p.stem == stem))
    assert checks, f"{stem} tags no equation"
    missing = [tag for tag, ok in checks if not ok]
    assert len(missing) <= 0.1 * len(checks), f"{stem}: no assert_close against acetools after {missing}"


def test_an_equation_without_a_check_is_seen(tmp_path):
    def code(src):
        return {"cell_type": "code", "source": src, "metadata": {}, "outputs": [], "execution_count": None}

    def maths(tag):
        return {"cell_type": "markdown", "source": f"$$x \\tag{{{tag}}}$$", "metadata": {}}

    checked = "torch.testing.assert_close(A.center_rows(x), y)"
    nb = {"cells": [code("from acetools.merging import ace as A"),
                    maths("ACE.1"), code("y = x + 1"), code("torch.testing.assert_close(y, x + 1)"), code("z = y"),
                    code(checked),  # the fourth code cell after (ACE.1): too far
                    maths("ACE.2"), code("out = A.closed_form(x)"), code("torch.testing.assert_close(out, y)")]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert equation_checks(path) == [("ACE.1", False), ("ACE.2", True)]


#: Calls that run a whole method, and the equation the student has written out by hand before one.
WHOLE_METHOD = re.compile(r"acetools\.merge\(|\bace_matrix\(|\bace_with_diagnostics\(|\besm_merge_matrix\(")
OWN_VERSION_FIRST = {"02_ace_step_by_step": "ACE.10", "03_esm_step_by_step": "ESM.5"}


@pytest.mark.parametrize("stem", sorted(OWN_VERSION_FIRST))
def test_the_whole_method_runs_only_after_the_students_own_version(stem):
    """docs/style.md §1: the student composes the method (the closed form of ACE, the merge of ESM in
    the essential subspace) and checks it before the lesson calls the packaged method."""
    cells = _cells(next(p for p in NOTEBOOKS if p.stem == stem))
    tag = OWN_VERSION_FIRST[stem]
    at = next(i for i, (src, _) in enumerate(cells) if f"\\tag{{{tag}}}" in src)
    checked = next(i for i, (src, kind) in enumerate(cells) if i > at and kind == "code" and "assert_close(" in src)
    first = next(i for i, (src, kind) in enumerate(cells) if kind == "code" and WHOLE_METHOD.search(src))
    assert first > checked, f"{stem}: cell {first} runs the whole method before the student's ({tag}) in cell {checked}"
