"""Every notebook reads as a lesson: objectives first, "What we learned" last, the audit after it
in a marked appendix (the lesson shape docs/style.md asks for)."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _headings(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return [line.strip() for c in cells if c["cell_type"] == "markdown"
            for line in "".join(c["source"]).splitlines() if re.match(r"#{1,3} ", line)]


def test_there_are_eight_lessons():
    assert len(NOTEBOOKS) == 8, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_what_we_learned_closes_the_lesson_and_only_an_appendix_follows(path):
    heads = _headings(path)
    learned = [i for i, h in enumerate(heads) if h == "## What we learned"]
    assert len(learned) == 1, f"{path.name}: one '## What we learned' heading, found {len(learned)}"
    after = [h for h in heads[learned[0] + 1:] if h.startswith("## ")]
    assert all(h.startswith("## Appendix") for h in after), (
        f"{path.name}: after 'What we learned' only '## Appendix …' sections may follow; found {after}")
    assert heads[0].startswith("# "), f"{path.name}: the first heading is the lesson's title"
