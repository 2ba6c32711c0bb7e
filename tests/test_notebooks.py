"""The course notebooks: hygiene of the committed files and a quick-profile run of each.

Every notebook runs under papermill at ``quick=True`` (the fixture world) through
``acetools.notebooks.run_report`` — the same path as ``acetools report --profile quick`` — with a
session-wide cache, so the fixture world is built once; every page is checked by
``tests/report_checks.check_report`` (lessons render with their code, docs/style.md §13).
"""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path

import nbformat
import pytest

from acetools.notebooks import (
    HIDE_INPUT,
    UnknownParameterError,
    notebook_parameters,
    notebook_paths,
    run_notebook,
    run_report,
)
from tests.report_checks import check_report, rendered_code_cells

NOTEBOOKS = notebook_paths()
IDS = [p.stem for p in NOTEBOOKS]
CORE = {"quick": "bool", "suite": "str", "size": "str", "seed": "int", "device": "str", "interactive": "bool",
        "figures_dir": "str"}
EXPECTED = ["00_quickstart", "01_theorem1", "02_ace_step_by_step", "03_esm_step_by_step", "04_benchmark", "05_claims",
            "06_mergeable_world", "07_language", "08_lora_experts"]


def test_the_course_has_its_notebooks_in_order():
    assert IDS == sorted(IDS)
    missing = [n for n in EXPECTED if n not in IDS]
    assert not missing, f"notebooks missing: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_clean(path):
    """docs/style.md §12: no outputs, no execution counts, python3 kernelspec with language_info."""
    raw = json.loads(path.read_text())
    nb = nbformat.reads(path.read_text(), as_version=4)
    nbformat.validate(nb)
    assert raw["metadata"]["kernelspec"]["name"] == "python3"
    assert raw["metadata"]["language_info"]["name"] == "python"
    for i, cell in enumerate(raw["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"
    assert raw["cells"][0]["cell_type"] == "markdown", "a notebook opens with what it teaches"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_has_one_literal_parameters_cell(path):
    """docs/style.md §8: one parameters cell, literals with type annotations and a comment each."""
    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{path.name}: {len(cells)} parameters cells"
    src = cells[0].source
    tree = ast.parse(src)
    names = {}
    for node in tree.body:
        assert isinstance(node, ast.AnnAssign), (
            f"{path.name}: parameters cell line {node.lineno} is not `name: type = literal`"
        )
        ast.literal_eval(node.value)  # literals only
        names[node.target.id] = ast.unparse(node.annotation)
    for line in src.strip().splitlines():
        assert "#" in line, f"{path.name}: parameter line without a comment: {line!r}"
        assert line.count("=") == 1, (f"{path.name}: {line!r} has a second '=' (in its value or comment); papermill "
                                      "cannot parse such a line and would drop the parameter")
    for k, t in CORE.items():
        assert names.get(k) == t, f"{path.name}: core parameter {k}: {t} missing or mistyped"
    declared = notebook_parameters(path)
    assert set(declared) == set(names), f"{path.name}: papermill does not see {sorted(set(names) - set(declared))}"


def test_unknown_parameter_is_an_error(tmp_path):
    with pytest.raises(UnknownParameterError, match="no_such_knob"):
        run_notebook(NOTEBOOKS[0], tmp_path, {"quick": True, "no_such_knob": 3})
    with pytest.raises(UnknownParameterError):
        run_report("quick", only=[IDS[0]], parameters={"no_such_knob": 1}, out=tmp_path)


@pytest.fixture(scope="module")
def quick_env(tmp_path_factory, monkeypatch_module=None):
    import os

    root = tmp_path_factory.mktemp("course")
    old = {k: os.environ.get(k) for k in ("ACETOOLS_CACHE", "ACETOOLS_NUM_THREADS")}
    os.environ["ACETOOLS_CACHE"] = str(root / "cache")
    os.environ.setdefault("ACETOOLS_NUM_THREADS", "1")
    yield root
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


#: Lesson 00's section on epsilon (issue 42: the lesson names ACE's largest lever and shows it).
EPS_SECTION = "## 7 · $\\varepsilon$: ACE's largest lever"


def eps_lever_problems(nb) -> list[str]:
    """What an executed lesson 00 lacks in its section 7: the section itself, a table of ACE at the official
    code's eps (1e-2) and the paper's (1e-5) beside task arithmetic, each with its accuracy, and the printed line
    naming ACE's best eps and its lead or lag against task arithmetic."""
    start = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and EPS_SECTION in c.source]
    if not start:
        return [f"no section {EPS_SECTION!r}"]
    end = next((i for i in range(start[0] + 1, len(nb.cells)) if "\n## " in "\n" + nb.cells[i].source
                and nb.cells[i].cell_type == "markdown"), len(nb.cells))
    shown = ""
    for c in nb.cells[start[0]:end]:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            shown += o.get("text", "") + "".join(str(v) for k, v in o.get("data", {}).items() if k.startswith("text/"))
    number = r"-?\d+\.\d+"
    problems = [f"no row for {row!r} with its accuracy" for row in ("ACE, eps = 0.01", "ACE, eps = 1e-05",
                                                                   "task arithmetic")
                if not re.search(re.escape(row) + r"[^\n]*?</t[dh]>\s*<td[^>]*>\s*" + number, shown)]
    if not re.search(rf"ACE is best at eps = [\de.-]+: {number} % normalized, [+-]{number} points against task "
                     rf"arithmetic \(at the default eps = 0\.01: [+-]{number}\)", shown):
        problems.append("no printed line naming ACE's best eps and its difference to task arithmetic")
    return problems


def test_the_eps_check_sees_a_lesson_without_its_lever(tmp_path):
    def cell(kind: str, source: str, outputs=()):
        c = nbformat.v4.new_markdown_cell(source) if kind == "md" else nbformat.v4.new_code_cell(source)
        if kind != "md":
            c.outputs = list(outputs)
        return c

    row = "<tr><th>{i}</th><td>{m}</td><td>{v}</td></tr>"
    html = "<table>" + "".join(row.format(i=i, m=m, v=v) for i, (m, v) in enumerate(
        [("ACE, eps = 0.01", "61.20"), ("ACE, eps = 0.001", "62.00"), ("ACE, eps = 1e-05", "63.50"),
         ("task arithmetic (lambda = 0.3)", "62.10")])) + "</table>"
    line = "ACE is best at eps = 1e-05: 63.5 % normalized, +1.4 points against task arithmetic (at the default eps = " \
           "0.01: -0.9).\n"
    good = nbformat.v4.new_notebook(cells=[
        cell("md", EPS_SECTION + "\n\ntext"),
        cell("code", "page.table(eps_table)", [nbformat.v4.new_output("display_data", data={"text/html": html})]),
        cell("code", "print(...)", [nbformat.v4.new_output("stream", name="stdout", text=line)]),
        cell("md", "**Quick profile.**\n\n## What we learned\n"),
        cell("code", "print('after')", [nbformat.v4.new_output("stream", name="stdout", text=line)])])
    assert eps_lever_problems(good) == []
    no_paper = copy.deepcopy(good)
    no_paper.cells[1].outputs[0]["data"]["text/html"] = html.replace("1e-05", "1e-04")
    assert eps_lever_problems(no_paper) == ["no row for 'ACE, eps = 1e-05' with its accuracy"]
    silent = copy.deepcopy(good)
    silent.cells[2].outputs = []  # the line printed only after the section does not count
    assert eps_lever_problems(silent) == ["no printed line naming ACE's best eps and its difference to task "
                                          "arithmetic"]
    silent.cells[0].source = "## 7 · Something else"
    assert eps_lever_problems(silent) == [f"no section {EPS_SECTION!r}"]


@pytest.mark.slow
def test_every_notebook_runs_in_quick_mode(quick_env):
    """The quick profile end to end, in order (05 reads what 01-04 recorded), and every rendered
    page is one a reader can trust (:func:`check_html`: no NaN cells, no default alt text, no raw
    dict reprs, no tracebacks, each verdict once)."""
    out = quick_env / "build"
    recs = run_report("quick", out=out, figures=quick_env / "figures")
    assert [r["notebook"] for r in recs] == IDS
    for r in recs:
        assert Path(r["html"]).is_file() and Path(r["executed"]).is_file()
        figs = list((quick_env / "figures" / r["notebook"]).glob("*.png"))
        assert figs, f"{r['notebook']} saved no figure"
    # figures of a quick run never land in the repository's figures/
    executed = nbformat.read(recs[0]["executed"], as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.get("metadata", {}).get("tags", [])]
    assert injected and "quick = True" in injected[0].source
    # every page: check_html, figures with overprinted text, and (in headless Chromium, where installed)
    # maths that did not render and tables wider than the 1280 px page
    problems = [p for r in recs for p in check_report(r["html"], quick_env / "figures" / r["notebook"])]
    assert not problems, "\n".join(problems)
    # lessons render with their code: every code cell not tagged hide-input shows its input
    # (check_report fails a page that does not); 02, the longest lesson, shows at least ten
    for r in recs:
        nb = nbformat.read(r["executed"], as_version=4)
        own = [c for c in nb.cells if c.cell_type == "code" and HIDE_INPUT not in c.metadata.get("tags", [])]
        shown, _ = rendered_code_cells(Path(r["html"]).read_text())
        assert shown == len(own), f"{r['notebook']}: {shown} code cells shown of {len(own)}"
        if r["notebook"].startswith("02_"):
            assert shown >= 10, f"02 renders {shown} code cells"
    # lesson 00 shows epsilon as ACE's lever: its section 7's output names the eps values and both merges' accuracies
    quickstart = nbformat.read(recs[0]["executed"], as_version=4)
    assert not eps_lever_problems(quickstart), eps_lever_problems(quickstart)
    # the quick pages say what the quick world is
    for r in recs[:4]:
        assert "fixture world" in Path(r["html"]).read_text(), (
            f"{r['notebook']} does not say it shows the fixture world"
        )


@pytest.mark.slow
def test_a_quick_papermill_run_leaves_the_repository_untouched(quick_env, tmp_path, monkeypatch):
    """Run as a papermill user would (`papermill notebooks/NN.ipynb out.ipynb -p quick True --cwd
    notebooks`): the quick profile's default figures folder is under build/, never the committed
    figures/, so `git status` is the same before and after. (Seed 0: the module's fixture world,
    already cached, so no second world is built.)"""
    import shutil
    import subprocess

    import papermill as pm

    repo = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")

    def status() -> str:
        return subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout

    before = status()
    import os

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))  # this checkout
    nb = repo / "notebooks" / "00_quickstart.ipynb"
    pm.execute_notebook(str(nb), str(tmp_path / "out.ipynb"), parameters={"quick": True},
                        cwd=str(repo / "notebooks"), kernel_name="python3", progress_bar=False, start_timeout=300)
    assert status() == before, "a quick papermill run changed tracked files"
    out = repo / "build" / "quick" / "figures" / "00_quickstart"
    assert (out / "ace_vs_task_arithmetic.png").is_file()
    assert json.loads((out / "figures.json").read_text())["profile"] == "quick"


@pytest.mark.slow
def test_02_to_04_run_on_the_text_world_and_05_shows_both_worlds(quick_env):
    """Notebooks 02-04 with ``world="text8"`` in the quick profile (the fixture text world:
    MiniLM's first layer, three small tasks): their figures and claims go to
    ``<notebook>-text8``, judged in the text world's fixture; then 05 shows the worlds side by
    side, the vision claims judged on the text world labelled as analogues. Reuses the module's
    cache and figures (after :func:`test_every_notebook_runs_in_quick_mode`, the vision
    fixture's claims are there too)."""
    import subprocess

    import pandas as pd

    from acetools_course import claims

    repo = Path(__file__).resolve().parents[1]

    def status() -> str:
        return subprocess.run(["git", "status", "--porcelain", "--", "figures"], cwd=repo, capture_output=True,
                              text=True).stdout

    before = status()
    figures = quick_env / "figures"
    recs = run_report("quick", only=["02", "03", "04"], parameters={"world": "text8"}, out=quick_env / "build-text",
                      figures=figures)
    for r in recs:
        folder = figures / f"{r['notebook']}-text8"
        assert list(folder.glob("*.png")), f"{r['notebook']} on the text world saved no figure"
        entries = json.loads((folder / "claims.json").read_text())
        owned = {c.id for c in claims.CLAIMS if c.notebook == r["notebook"]}
        assert entries and set(entries) <= owned, sorted(entries)
        assert {(e["world"]["name"], e["world"]["fixture"]) for e in entries.values()} == {("text fixture", True)}
        assert "fixture text world" in Path(r["html"]).read_text()
        problems = check_report(r["html"], folder)
        assert not problems, "\n".join(problems)
    # 03 says that it skips the proxy set the text world has no counterpart of
    assert "no generic pretraining pool of texts" in Path(recs[1]["html"]).read_text()
    rec = run_report("quick", only=["05"], out=quick_env / "build-text", figures=figures)[0]
    both = pd.read_csv(figures / "05_claims" / "claims_side_by_side.csv")
    html = Path(rec["html"]).read_text()
    assert "fixture text world of the quick profile" in html
    if (figures / "02_ace_step_by_step" / "claims.json").is_file():  # the vision fixture's claims are there
        # 07 (when it ran) judges the language claims with trained heads: a world of its own
        ran_07 = (figures / "07_language" / "claims.json").is_file()
        trained = [claims.TEXT_CLAIM_WORLDS["quick trained"]] if ran_07 else []
        assert list(both.columns) == ["id", "paper", "fixture", "text fixture", *trained] and len(both)
        judged = both["text fixture"] != "—"
        assert judged.any() and both.loc[judged, "text fixture"].str.endswith("(analogue)").all()
    problems = check_report(rec["html"], figures / "05_claims")
    assert not problems, "\n".join(problems)
    assert status() == before, "a quick run on the text world changed the committed figures"


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("stem", ["00_quickstart", "01_theorem1"])
def test_lessons_run_on_cuda(quick_env, stem):
    """docs/style.md §6: every lesson cell runs with device="cuda" (tensors follow the lesson's device)."""
    path = next(p for p in NOTEBOOKS if p.stem == stem)
    rec = run_notebook(path, quick_env / "build-cuda", {"quick": True, "device": "cuda",
                                                         "figures_dir": str(quick_env / "figures-cuda" / stem)},
                       html=False)
    executed = nbformat.read(rec["executed"], as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "cuda" in printed, f"{stem} does not say its tensors are on cuda"
