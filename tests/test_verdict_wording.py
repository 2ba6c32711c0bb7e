"""The course states one rule for every verdict (docs/course.md §One rule, (V.7)): a comparison decides only
where the paper's prediction is at least twice its margin, and no prediction decides nothing. The words of the
older rule ("at or below the noise floor", a claim "within our noise floor (V.2)") must not come back in the
docs or the lessons, nor a one-seed claim described as bootstrapped over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Phrases of the older rule, lower case, each with what replaced it.
STALE: dict[str, str] = {
    "at or below the noise floor": "less than twice its margin, or no paper number (V.7)",
    "below the noise floor": "less than twice its margin, or no paper number (V.7)",
    "within our noise floor": "less than twice its margin, or no paper number (V.7)",
    "clears the noise floor": "at least twice its margin (V.5)",
    "falls below the noise": "less than twice its margin, or no paper number (V.7)",
    "bootstrap over test examples and seeds": "the test examples, with a t interval over seeds where there are "
                                              "several (V.8); the stage claims rest on one seed",
}


def _texts() -> list[tuple[str, str]]:
    out = [(p.relative_to(REPO).as_posix(), p.read_text()) for p in sorted((REPO / "docs").rglob("*.md"))]
    for p in sorted((REPO / "notebooks").rglob("*.ipynb")):
        for c in json.loads(p.read_text())["cells"]:
            out.append((f"{p.relative_to(REPO).as_posix()} {c.get('id', '')}", "".join(c["source"])))
    return out


TEXTS = _texts()


def test_the_docs_and_lessons_are_read():
    names = {n.split()[0] for n, _ in TEXTS}
    assert {"docs/course.md", "docs/glossary.md", "docs/results.md", "notebooks/05_claims.ipynb",
            "notebooks/07_language.ipynb"} <= names


@pytest.mark.parametrize("phrase", sorted(STALE))
def test_no_stale_rule_wording(phrase):
    hits = [name for name, text in TEXTS if phrase in " ".join(text.lower().split())]
    assert not hits, f"{phrase!r} (the older rule) in {hits}: say {STALE[phrase]!r} (docs/course.md §One rule)"
