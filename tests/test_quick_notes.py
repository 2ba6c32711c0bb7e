"""Lessons say where the quick profile's figures differ from the full profile's (docs/course.md §Running the course).

The quick profile runs a fixture world (three tiny tasks, a micro model) so that every cell runs in
seconds; where that world changes the picture a figure shows, the lesson says so beside the figure in
a markdown note that starts with "**Quick profile". A note names the full profile's numbers only
from committed files: every file it cites (a backticked path) exists, and every decimal number in a
note that cites files is one of those files' numbers at the note's precision, so that no number is
typed in.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from acetools.notebooks import notebook_paths

ROOT = Path(__file__).resolve().parents[1]
#: The lessons whose quick figures tell another story than their committed full-profile results
#: (05 gathers the others' verdicts; 08 has no committed full-profile figures to compare with yet).
NOTED = ("00_quickstart", "01_theorem1", "02_ace_step_by_step", "03_esm_step_by_step", "04_benchmark",
         "06_mergeable_world", "07_language")
_DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d+(?!\w|\.\d)")
_CITED = re.compile(r"`((?:figures|docs|benchmarks)/[^`*]+?\.(?:csv|json|md))`")


def quick_notes(path: Path) -> list[str]:
    """The quick-profile notes of a lesson: its markdown cells that start with "**Quick profile"."""
    nb = nbformat.read(str(path), as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("**Quick profile")]


def untraced(note: str, root: Path = ROOT) -> list[str]:
    """What in ``note`` does not come from the committed files it cites: a cited file that is missing,
    or a decimal number that none of them holds at the note's precision."""
    files = [root / f for f in _CITED.findall(note)]
    problems = [f"cites {f.relative_to(root)}, which does not exist" for f in files if not f.is_file()]
    if not files or problems:
        return problems
    held = [float(x) for f in files for x in _DECIMAL.findall(f.read_text(encoding="utf-8"))]
    held += [float(x) for f in files for x in re.findall(r"(?<![\w.])\d+(?!\w|\.\d)", f.read_text(encoding="utf-8"))]
    for number in _DECIMAL.findall(_CITED.sub(" ", note)):
        digits = len(number.split(".")[1])
        if not any(round(h, digits) == float(number) for h in held):
            problems.append(f"{number} is in none of the cited files")
    return problems


def test_a_note_is_checked_against_the_files_it_cites(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "t.csv").write_text("method,acc\nta,80.1234\nace,0.2667\n")
    assert not untraced("**Quick profile.** Full (`figures/t.csv`): 80.12 and λ 0.27.", tmp_path)
    assert untraced("**Quick profile.** Full (`figures/t.csv`): λ 0.28.", tmp_path) == \
        ["0.28 is in none of the cited files"]
    assert untraced("**Quick profile.** Full (`figures/t.csv`): 80.2.", tmp_path) == \
        ["80.2 is in none of the cited files"]
    assert untraced("**Quick profile.** Full (`figures/missing.csv`): 80.1.", tmp_path)
    assert not untraced("**Quick profile.** The paper puts ViTs at 0.25; no file cited.", tmp_path)


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_quick_profile_notes_name_committed_numbers(path):
    notes = quick_notes(path)
    if path.stem in NOTED:
        assert notes, f"{path.name}: no '**Quick profile' note beside the figures the fixture world changes"
    problems = [p for note in notes for p in untraced(note)]
    assert not problems, f"{path.name}: a quick-profile note names numbers that no committed file holds:\n" \
                         + "\n".join(problems)
