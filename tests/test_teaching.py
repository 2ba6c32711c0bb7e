"""docs/teaching.md's assessment (issue 42): one per week of the syllabus, its part A the exercises of that week's
classes, its part B graded by the rubric, whose points add up to what each answer is worth."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEACHING = ROOT / "docs" / "teaching.md"


def _sections(text: str, level: str) -> dict[str, str]:
    """``{heading: body}`` of the ``level`` (``"##"``, ``"###"``) sections of ``text``."""
    parts = re.split(rf"^{level} (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _class_exercises(text: str) -> dict[int, set[str]]:
    """``{week: exercise numbers}`` from the classes' ``**Exercises**`` lists."""
    out: dict[int, set[str]] = {}
    for heading, body in _sections(text, "##").items():
        m = re.match(r"Class \d \(week (\d)\)", heading)
        if m is None:
            continue
        for listed in body.split("**Exercises**")[1:]:
            listed = re.split(r"\)\.\s", listed, maxsplit=1)[0]  # up to the list's closing sentence
            out.setdefault(int(m.group(1)), set()).update(re.findall(r"(?:^|\),)\s*(\d\d)\s+\(", listed))
    return out


def assessment_problems(text: str) -> list[str]:
    """What the assessment of ``text`` (a docs/teaching.md) lacks."""
    assessment = _sections(text, "##").get("Assessment")
    if assessment is None:
        return ["no '## Assessment' section"]
    total = re.search(r"(\d+) points a week: part A scaled to (\d+), part B (\d+) by the rubric", assessment)
    if not total:
        return ["the assessment does not say its points a week (part A, part B by the rubric)"]
    week_total, part_a, part_b = (int(x) for x in total.groups())
    problems = [] if part_a + part_b == week_total else [f"part A {part_a} + part B {part_b} != {week_total}"]
    subsections = _sections(assessment, "###")
    rubric = next((body for h, body in subsections.items() if h.startswith("Rubric")), None)
    worth = re.search(r"Rubric \(part B, per answer: (\d+) points\)", assessment)
    if rubric is None or worth is None:
        return [*problems, "no '### Rubric (part B, per answer: N points)'"]
    rows = [r for r in rubric.splitlines() if r.startswith("|") and not r.startswith("|---")]
    header, criteria = rows[0], rows[1:]
    levels = [int(x) for x in re.findall(r"\| (\d+) points? ", header + " ")]
    if len(criteria) < 2 or sorted(levels, reverse=True) != levels or levels[-1] != 0:
        problems.append(f"the rubric needs criteria rows and point levels from high to 0: {header}")
    elif len(criteria) * levels[0] != int(worth.group(1)):
        problems.append(f"the rubric's {len(criteria)} criteria at {levels[0]} points make "
                        f"{len(criteria) * levels[0]}, not the {worth.group(1)} an answer is worth")
    empty = [r.split("|")[1].strip() for r in criteria if any(not c.strip() for c in r.strip("|").split("|"))]
    problems += [f"rubric criterion {c!r} has an empty level" for c in empty]
    for week, exercises in sorted(_class_exercises(text).items()):
        body = next((b for h, b in subsections.items() if h.startswith(f"Week {week}:")), None)
        if body is None:
            problems.append(f"no '### Week {week}: ...' assessment")
            continue
        a = re.search(r"\*\*Part A\*\* \((\d+) points\): exercises ([^.]*)", body)
        b = re.search(r"\*\*Part B\*\* \((\d+) points\)", body)
        questions = re.findall(r"^\d+\. ", body.split("**Part B**", 1)[-1], flags=re.M)
        if not a or not b:
            problems.append(f"week {week}: no '**Part A** (N points): exercises ...' or '**Part B** (N points)'")
            continue
        if int(a.group(1)) != part_a or int(b.group(1)) != part_b:
            problems.append(f"week {week}: parts worth {a.group(1)} and {b.group(1)}, not {part_a} and {part_b}")
        if len(questions) * int(worth.group(1)) != part_b:
            problems.append(f"week {week}: {len(questions)} questions at {worth.group(1)} points are not {part_b}")
        assessed = set(re.findall(r"\b(\d\d)\b", a.group(2)))
        if assessed != exercises:
            problems.append(f"week {week}: part A assesses exercises {sorted(assessed)}, the week's classes hand "
                            f"out {sorted(exercises)}")
    return problems


def test_each_week_has_an_assessment_graded_by_the_rubric():
    text = TEACHING.read_text(encoding="utf-8")
    weeks = _class_exercises(text)
    assert sorted(weeks) == [1, 2] and weeks[1] >= {"00", "01", "02"}, weeks
    handed_out = set().union(*weeks.values())
    on_disk = {p.name[:2] for p in (ROOT / "notebooks" / "exercises").glob("[0-9][0-9]_*_exercises.ipynb")}
    assert handed_out == on_disk, f"the classes hand out exercises {sorted(handed_out)}, on disk: {sorted(on_disk)}"
    problems = assessment_problems(text)
    assert not problems, "docs/teaching.md §Assessment: " + "; ".join(problems)


@pytest.mark.parametrize("edit, problem", [
    (("exercises 03, 05, 06, 07 and 08", "exercises 03, 05, 06 and 07"),
     "week 2: part A assesses exercises ['03', '05', '06', '07'], the week's classes hand out"),
    (("| the claim | ties", "| the claim | | ties"), "rubric criterion 'the claim' has an empty level"),
    (("per answer: 6 points", "per answer: 5 points"), "the rubric's 3 criteria at 2 points make 6, not the 5"),
    (("### Week 2: ESM", "### Week two: ESM"), "no '### Week 2: ...' assessment"),
    (("part B 18 by the rubric", "part B 20 by the rubric"), "part A 12 + part B 20 != 30"),
], ids=["an exercise not assessed", "an empty rubric level", "a rubric worth another sum", "a week without one",
        "parts that do not add up"])
def test_the_assessment_check_sees_a_gap(edit, problem):
    text = TEACHING.read_text(encoding="utf-8")
    assert edit[0] in text, edit[0]
    assert any(p.startswith(problem) for p in assessment_problems(text.replace(edit[0], edit[1]))), problem
