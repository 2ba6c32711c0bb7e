"""The exercises and their solutions (notebooks/exercises/, notebooks/solutions/).

* Both folders are committed clean (docs/style.md §12) with one literal parameters cell, and
  every lesson the exercises name exists in notebooks/.
* Each exercise notebook is generated from its solution (scripts/make_exercises.py) and has not
  drifted from it; every exercise is a cell tagged ``exercise`` with a ``TODO`` and a ``check``
  cell after it.
* Every check fails on its exercise's stub, with the exercise's own message, and passes on the
  solution (run in this process, cell by cell: seconds).
* The solutions run under papermill in the quick profile; an untouched exercise notebook stops
  at its first check with PapermillExecutionError naming it.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path
from typing import cast

import nbformat
import pytest

from acetools.notebooks import notebook_paths, run_notebook
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((REPO / "notebooks" / "solutions").glob("*.ipynb"))
EXERCISES = sorted((REPO / "notebooks" / "exercises").glob("*.ipynb"))
#: Lessons with exercises (docs/teaching.md): three exercises each.
LESSONS = ("00_quickstart", "01_theorem1", "02_ace_step_by_step", "03_esm_step_by_step", "04_benchmark",
           "05_claims", "06_mergeable_world", "07_language", "08_lora_experts")


def _script():
    return load_script("make_exercises")


def _tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def test_every_lesson_with_exercises_has_both_notebooks():
    lessons = {p.stem for p in notebook_paths()}
    assert [p.name for p in SOLUTIONS] == [f"{n}_solutions.ipynb" for n in LESSONS]
    assert [p.name for p in EXERCISES] == [f"{n}_exercises.ipynb" for n in LESSONS]
    missing = [n for n in LESSONS if n not in lessons]
    assert not missing, f"exercises for lessons that notebooks/ does not have: {missing}"


@pytest.mark.parametrize("path", SOLUTIONS + EXERCISES, ids=lambda p: p.name)
def test_notebook_is_clean_with_one_parameters_cell(path):
    raw = json.loads(path.read_text())
    nbformat.validate(nbformat.reads(path.read_text(), as_version=4))
    assert raw["metadata"]["kernelspec"]["name"] == "python3"
    assert raw["metadata"]["language_info"]["name"] == "python"
    for i, cell in enumerate(raw["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, f"{path.name} cell {i} ran"
    assert raw["cells"][0]["cell_type"] == "markdown"
    params = [c for c in raw["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{path.name}: {len(params)} parameters cells"
    src = "".join(params[0]["source"])
    for node in ast.parse(src).body:
        assert isinstance(node, ast.AnnAssign) and node.value is not None, (
            f"{path.name}: parameters line {node.lineno} is not `name: type = x`")
        ast.literal_eval(node.value)
    assert "quick: bool" in src


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_exercises_are_generated_from_their_solutions(path):
    mod = _script()
    dest = mod.exercise_path(path)
    assert dest.is_file(), f"{dest.name} is missing: run python3 scripts/make_exercises.py"
    assert dest.read_text() == mod.render(path), f"{dest.name} drifted: run python3 scripts/make_exercises.py"
    assert path.read_text() == mod.render_solution(path), (
        f"{path.name} lacks nbgrader's metadata: run python3 scripts/make_exercises.py")
    ex = nbformat.read(str(dest), as_version=4)
    todo = [c for c in ex.cells if "exercise" in _tags(c)]
    assert len(todo) == 3, f"{dest.name}: {len(todo)} exercises, three per lesson"
    for c in todo:
        assert "# TODO" in c.source and "SOLUTION" not in c.source
    assert "(solutions)" not in ex.cells[0].source


@pytest.mark.parametrize("path", SOLUTIONS + EXERCISES, ids=lambda p: p.name)
def test_cells_carry_nbgrader_metadata(path):
    """Exercise cells are nbgrader solution cells, checks autograded tests worth a point, the rest
    locked; ids unique (docs/teaching.md §Grading with nbgrader)."""
    cells = nbformat.read(str(path), as_version=4).cells
    meta = [c.metadata.get("nbgrader") for c in cells]
    assert all(m and m["schema_version"] == 3 for m in meta), f"{path.name}: a cell without nbgrader metadata"
    ids = [m["grade_id"] for m in meta]
    assert len(set(ids)) == len(ids), f"{path.name}: repeated grade ids"
    for c, m in zip(cells, meta):
        kind = "exercise" if "exercise" in _tags(c) else "check" if "check" in _tags(c) else "other"
        assert (m["solution"], m["grade"], m["locked"]) == {"exercise": (True, False, False),
                                                            "check": (False, True, True),
                                                            "other": (False, False, True)}[kind], (path.name, m)
    assert [m["grade_id"] for m in meta if m["grade"]] == ["check1", "check2", "check3"]
    assert sum(m.get("points", 0) for m in meta) == 3


def test_the_generator_refuses_a_region_without_a_stub():
    mod = _script()
    with pytest.raises(ValueError, match="exercise stub"):
        mod.exercise_source("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n", "here")
    with pytest.raises(ValueError, match="without"):
        mod.exercise_source("def f():\n    return 1\n", "here")


def _substituted(source: str, bodies: str | tuple[str | None, ...]) -> str:
    """``source`` with its k-th solution region replaced by ``bodies[k]`` (indented as the region;
    ``None`` keeps that region's solution); a string replaces the first region."""
    regions = iter((bodies,) if isinstance(bodies, str) else bodies)

    def sub(m: re.Match) -> str:
        body = next(regions, None)
        if body is None:
            return m.group(0)
        return textwrap.indent(textwrap.dedent(body).strip("\n"), m.group("indent"))

    return _script().REGION.sub(sub, source)


#: Two plausible wrong answers per exercise, (lesson, exercise) -> the code that replaces the
#: solution region (a tuple: one entry per region of the cell, None keeping the solution's). Each
#: is the mistake the exercise is about, and its check must fail on it.
WRONG: dict[tuple[str, int], tuple[str | tuple[str | None, ...], ...]] = {
    ("00_quickstart", 1): (  # the sign of the update; the expert's weights instead of its update
        "return [{k: base[k] - e[k] for k in base} for e in experts]",
        "return [{k: e[k].clone() for k in base} for e in experts]"),
    ("00_quickstart", 2): (  # the mean of the task vectors; interpolation between base and mean expert
        "taus = my_task_vectors(base, experts)\n"
        "return {k: base[k] + lam * sum(tv[k] for tv in taus) / len(taus) for k in base}",
        "return {k: (1 - lam) * base[k] + lam * sum(e[k] for e in experts) / len(experts) for k in base}"),
    ("00_quickstart", 3): tuple(  # lambda chosen on the test split, or on the training split
        "losses = []\nfor lam in grid:\n    W = my_task_arithmetic(base, experts, lam)['fc.weight']\n"
        f"    losses.append(sum(task_loss(W, t, '{split}') for t in tasks) / len(tasks))\n"
        "return grid[losses.index(min(losses))]" for split in ("test", "train")),
    ("01_theorem1", 1): (  # np.cov's 1/(n-1); the columns centred instead of the rows
        "Wc = delta_W.double() - delta_W.double().mean(dim=0, keepdim=True)\nreturn Wc.T @ Wc / (delta_W.shape[0] - 1)",
        "Wc = delta_W.double() - delta_W.double().mean(dim=1, keepdim=True)\nreturn Wc.T @ Wc"),
    ("01_theorem1", 2): (  # spectral norms instead of Frobenius; the diagonals' cosine only
        "return float((A * B).sum() / (torch.linalg.matrix_norm(A, ord=2) * torch.linalg.matrix_norm(B, ord=2)))",
        "a, b = torch.diagonal(A), torch.diagonal(B)\nreturn float(a @ b / (a.norm() * b.norm()))"),
    ("01_theorem1", 3): (  # plain averaging; the numerator without the covariances
        "return sum(t.W_star for t in tasks) / len(tasks)",
        "A = sum(t.Sigma for t in tasks)\nB = sum(t.W_star for t in tasks)\nreturn torch.linalg.solve(A.T, B.T).T"),
    ("02_ace_step_by_step", 1): (  # the biased variance; the energies without the log
        "ell = torch.log(torch.stack([d.double().square().sum() for d in deltas]) + 1e-12)\n"
        "return float(ell.var(unbiased=False) / (ell.mean() ** 2 + 1e-12))",
        "e = torch.stack([d.double().square().sum() for d in deltas])\n"
        "return float(e.var(unbiased=True) / (e.mean() ** 2 + 1e-12))"),
    ("02_ace_step_by_step", 2): (  # log c instead of 2 log c (the norm is squared), in either function
        ("ell = torch.log(torch.stack([d.double().square().sum() for d in deltas]) + 1e-12)\n"
         "return float(ell.var(unbiased=True) / ((ell.mean() + math.log(c)) ** 2 + 1e-12))", None),
        (None, "ell = torch.log(torch.stack([d.double().square().sum() for d in deltas]) + 1e-12)\n"
               "return math.exp(-float(ell.mean()))")),
    ("02_ace_step_by_step", 3): tuple(  # uncentred numerators; a ridge eps * I not divided by the trace
        "regs, nums = [], []\nfor d in deltas:\n    S = estimate_covariance(d)\n"
        "    tr = torch.diagonal(S).sum() + 1e-12\n"
        f"    regs.append(S / tr + ({ridge}) * torch.eye(S.shape[0], dtype=torch.float64))\n    nums.append({num})\n"
        "A = sum(regs)\nB = sum(N @ R for N, R in zip(nums, regs))\nreturn torch.linalg.solve(A.T, B.T).T"
        for ridge, num in (("eps / tr", "d.double()"), ("eps", "center_rows(d.double())"))),
    ("03_esm_step_by_step", 1): (  # integer division; no floor of one direction
        "return max(1, d_out // n_tasks)",
        "return int(d_out * (1.0 / n_tasks))"),
    ("03_esm_step_by_step", 2): (  # the SVD of delta_W itself; a centred PCA of the activation shift
        "return torch.linalg.svd(delta_W, full_matrices=False)[0][:, :k]",
        "dO = X @ delta_W.T\n_, _, Vh = torch.linalg.svd(dO - dO.mean(dim=0, keepdim=True), full_matrices=False)\n"
        "return Vh[:k].T"),
    ("03_esm_step_by_step", 3): (  # zero norms not handled; divided by the largest norm instead of the mean
        "return (norms / norms.mean()) ** power",
        "top = norms.max()\nif not bool(top > 0):\n    return torch.zeros_like(norms)\n"
        "safe = torch.where(norms > 0, norms, top)\n"
        "return torch.where(norms > 0, (safe / top) ** power, torch.zeros_like(norms))"),
    ("04_benchmark", 1): (  # the ratio of the mean accuracies; the validation split
        "d = per_task[(per_task['suite'] == suite) & (per_task['seed'] == seed) & (per_task['split'] == 'test')]\n"
        "acc = d.pivot_table(index='task', columns='method', values='accuracy')\n"
        "return float(100 * acc[method].mean() / acc['experts (individual)'].mean())",
        "d = per_task[(per_task['suite'] == suite) & (per_task['seed'] == seed) & (per_task['split'] == 'val')]\n"
        "acc = d.pivot_table(index='task', columns='method', values='accuracy')\n"
        "return float((100 * acc[method] / acc['experts (individual)']).mean())"),
    ("04_benchmark", 2): tuple(  # any lead counts (no margin); the margin from one method's unpaired spread
        "d = summary[summary['suite'] == suite].pivot_table(index='seed', columns='method', values='test_normalized')\n"
        f"diff = (d[a] - d[b]).dropna()\nmargin = {margin}\nlead = float(diff.mean())\n"
        "return 'better' if lead > margin else ('worse' if lead < -margin else 'tie')"
        for margin in ("0.0", "max(0.5, float(d[a].std(ddof=1)))")),
    ("04_benchmark", 3): (  # absolute instead of normalized points; one seed instead of the mean over seeds
        "out = {}\nfor n, g in summary.groupby('n_tasks'):\n"
        "    p = g.pivot_table(index='seed', columns='method', values='test_acc')\n"
        "    out[int(n)] = float((p['tsv_m'] - p['task_arithmetic']).mean())\nreturn out",
        "out = {}\nfor n, g in summary.groupby('n_tasks'):\n"
        "    p = g.pivot_table(index='seed', columns='method', values='test_normalized')\n"
        "    out[int(n)] = float(p['tsv_m'].iloc[0] - p['task_arithmetic'].iloc[0])\nreturn out"),
    ("05_claims", 1): (  # the paper's effect unscaled; the rooms' ratio inverted
        "return math.copysign(min(abs(paper_effect), max(headroom, 0.0)), paper_effect)",
        "pred = paper_effect * paper_room / world_room\n"
        "return math.copysign(min(abs(pred), max(headroom, 0.0)), pred)"),
    ("05_claims", 2): (  # the standard error without Z_95; no floor of 0.5 points
        "if se is not None:\n    return max(0.5, se)\nif spread is None or not math.isfinite(spread):\n    return 0.5\n"
        "return max(0.5, spread)",
        "if se is not None:\n    return Z_95 * se\nif spread is None or not math.isfinite(spread):\n    return 0.5\n"
        "return spread"),
    ("05_claims", 3): tuple(  # decidable by the measurement; the power of one margin instead of two
        f"keep = [a for e, a in zip(effects, agree) if {rule}]\nif not keep:\n    return verdicts.UNDECIDABLE\n"
        "return 'reproduced' if all(keep) else ('partly' if any(keep) else 'not reproduced')"
        for rule in ("abs(e.measured) > e.floor", "abs(e.predicted) > e.floor")),
    ("06_mergeable_world", 1): (  # the experts' weights instead of their updates; the mean of per-key cosines
        "F = torch.stack([torch.cat([e[k].double().reshape(-1) for k in base]) for e in experts])\n"
        "n = F.norm(dim=1)\nreturn (F @ F.T) / (n[:, None] * n[None, :])",
        "out = 0\nfor k in base:\n    F = torch.stack([(e[k] - base[k]).double().reshape(-1) for e in experts])\n"
        "    n = F.norm(dim=1)\n    out = out + (F @ F.T) / (n[:, None] * n[None, :])\nreturn out / len(base)"),
    ("06_mergeable_world", 2): tuple(  # mean cos instead of mean cos²; the sides swapped
        "def top(M):\n    Us, _, Vh = torch.linalg.svd(M, full_matrices=False)\n"
        f"    return Us[:, :k] if side == {left!r} else Vh[:k].T\n\n{value}"
        for left, value in (("left", "return float(torch.linalg.svdvals(top(A).T @ top(B)).mean())"),
                            ("right", "return float((top(A).T @ top(B)).square().sum() / k)"))),
    ("06_mergeable_world", 3): (  # the share of the singular values (not squared); the share of the directions
        "s = torch.linalg.svdvals(tau.double())\nk = int(min(tau.shape) * (1.0 / n_tasks))\n"
        "return float(s[:k].sum() / s.sum())",
        "return int(min(tau.shape) * (1.0 / n_tasks)) / min(tau.shape)"),
    ("07_language", 1): (  # the biased variance; the coefficient of variation, not squared
        "e = torch.stack([d.double().square().sum() for d in deltas])\nm = float(e.mean())\n"
        "return 0.0 if m <= 0 else float(e.var(unbiased=False)) / m**2",
        "e = torch.stack([d.double().square().sum() for d in deltas])\nm = float(e.mean())\n"
        "return 0.0 if m <= 0 else float(e.std(unbiased=True)) / m"),
    ("07_language", 2): tuple(  # the survivors not rescaled; the mask read the wrong way round
        f"out = {{}}\nfor k in base:\n    kept = [torch.where(dare_mask(tv[k].shape, p, seed, t, k), {kept}){scale}\n"
        "            for t, tv in enumerate(taus)]\n    out[k] = base[k] + lam * sum(kept)\nreturn out"
        for kept, scale in (("0.0, tv[k]", ""), ("tv[k], 0.0", " / (1 - p)"))),
    ("07_language", 3): (  # the largest singular value instead of the mean; each task flattened, then summed
        "U, S, Vh = torch.linalg.svd(sum(taus_of_one_matrix), full_matrices=False)\nreturn S.max() * (U @ Vh)",
        "out = 0\nfor tau in taus_of_one_matrix:\n    U, S, Vh = torch.linalg.svd(tau, full_matrices=False)\n"
        "    out = out + S.mean() * (U @ Vh)\nreturn out"),
    ("08_lora_experts", 1): (  # rsLoRA's alpha / sqrt(r) without use_rslora; r read off A's columns (d_in)
        "return W0 + (alpha / B.shape[1] ** 0.5) * B @ A",
        "return W0 + (alpha / A.shape[1]) * B @ A"),
    ("08_lora_experts", 2): (  # lambda left out; lambda on both factors (lambda squared in B A)
        "B = torch.cat([(alpha / B_t.shape[1]) * B_t for B_t, _ in adapters], dim=1)\n"
        "A = torch.cat([A_t for _, A_t in adapters], dim=0)\nreturn B, A",
        "B = torch.cat([lam * (alpha / B_t.shape[1]) * B_t for B_t, _ in adapters], dim=1)\n"
        "A = torch.cat([lam * A_t for _, A_t in adapters], dim=0)\nreturn B, A"),
    ("08_lora_experts", 3): (  # R_a not transposed; V left in the r-dimensional coordinates of the QR
        "Q_b, R_b = torch.linalg.qr(B)\nQ_a, R_a = torch.linalg.qr(A.T)\nu, s, vh = torch.linalg.svd(R_b @ R_a)\n"
        "return Q_b @ u, s, vh @ Q_a.T",
        "Q_b, R_b = torch.linalg.qr(B)\nQ_a, R_a = torch.linalg.qr(A.T)\nu, s, vh = torch.linalg.svd(R_b @ R_a.T)\n"
        "return Q_b @ u, s, vh"),
}


def test_every_exercise_has_two_wrong_answers():
    assert sorted(WRONG) == sorted((n, k) for n in LESSONS for k in (1, 2, 3))
    assert all(len(w) == 2 for w in WRONG.values())


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_check_fails_on_its_stub_and_two_wrong_answers_and_passes_on_the_solution(path, capsys):
    """Each check runs on its exercise's stub and on the two wrong answers of :data:`WRONG`, each in
    a copy of the namespace the solution built up to that exercise, and must fail with the
    exercise's own message; then on the solution, which must pass (quick profile, in this process)."""
    mod, lesson = _script(), path.stem[: -len("_solutions")]
    nb = nbformat.read(str(path), as_version=4)
    ns: dict = {}
    n, answer = 0, ""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        src = cell.source + ("\nquick = True\n" if "parameters" in _tags(cell) else "")
        if "exercise" in _tags(cell):
            n, answer = n + 1, src
            continue
        if "check" in _tags(cell):
            variants = {"stub": mod.exercise_source(answer, "test")}
            variants.update({f"wrong answer {i + 1}": _substituted(answer, w) for i, w in enumerate(WRONG[lesson, n])})
            for name, variant in variants.items():
                assert variant != answer, f"{lesson} exercise {n}: the {name} replaced nothing"
                trial = dict(ns)
                exec(compile(variant, f"exercise {n} ({name})", "exec"), trial)
                with pytest.raises(AssertionError, match=rf"^Exercise {n}[: ]"):
                    exec(compile(src, f"check {n} on the {name}", "exec"), trial)
            exec(compile(answer, f"exercise {n}", "exec"), ns)
        exec(compile(src, "cell", "exec"), ns)
    assert n == 3, f"{path.name}: {n} exercises, three per lesson"
    assert capsys.readouterr().out.count("passed") == 3


@pytest.fixture()
def kernel_env(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ACETOOLS_NUM_THREADS", "1")


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_runs_in_the_quick_profile(path, tmp_path, kernel_env):
    rec = run_notebook(path, tmp_path, {"quick": True}, html=False, cwd=REPO / "notebooks")
    nb = nbformat.read(rec["executed"], as_version=4)
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert [int(m) for m in re.findall(r"Exercise (\d) passed", out)] == [1, 2, 3]


@pytest.mark.slow
def test_an_untouched_exercise_notebook_fails_its_first_check(tmp_path, kernel_env):
    from papermill.exceptions import PapermillExecutionError

    path = REPO / "notebooks" / "exercises" / "02_ace_step_by_step_exercises.ipynb"
    with pytest.raises(PapermillExecutionError, match=r"Exercise 1: your gamma .* differs from "
                                                      r"acetools\.merging\.ace\.heterogeneity"):
        run_notebook(path, tmp_path, {"quick": True}, html=False, cwd=REPO / "notebooks")


@pytest.mark.slow
def test_nbgrader_autogrades_a_solved_and_an_unsolved_copy(tmp_path, kernel_env):
    """nbgrader (the course extra) on lesson 00's exercises in a fresh course directory: the
    solution notebook is the source, ``generate_assignment`` releases it, ``autograde`` grades a
    solved copy (full points) and the untouched exercise notebook (none)."""
    pytest.importorskip("nbgrader", reason="nbgrader comes with the course extra: pip install -e .[course]")
    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    name, course = "00_quickstart", tmp_path / "course"
    copies = {"source": REPO / "notebooks" / "solutions" / f"{name}_solutions.ipynb",
              "submitted/solved": REPO / "notebooks" / "solutions" / f"{name}_solutions.ipynb",
              "submitted/unsolved": REPO / "notebooks" / "exercises" / f"{name}_exercises.ipynb"}
    for where, nb in copies.items():  # each in the quick profile (the parameters cell is locked: the same in all)
        (course / where / "ex00").mkdir(parents=True)
        text = nb.read_text()
        assert "quick: bool = False" in text
        text = text.replace("quick: bool = False", "quick: bool = True")
        (course / where / "ex00" / f"{name}.ipynb").write_text(text)
    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.course_id = "acetools"
    api = NbGraderAPI(config=config)
    generated = cast(dict, api.generate_assignment("ex00"))  # a dict with "success" and "log"; annotated bool
    assert generated["success"], generated.get("log", "")[-2000:]
    released = nbformat.read(str(course / "release" / "ex00" / f"{name}.ipynb"), as_version=4)
    assert not any("### BEGIN SOLUTION" in c.source for c in released.cells)
    for student in ("solved", "unsolved"):
        res = cast(dict, api.autograde("ex00", student))
        assert res["success"], res.get("log", "")[-2000:]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {s: (gb.find_submission("ex00", s).score, gb.find_submission("ex00", s).max_score)
                  for s in ("solved", "unsolved")}
    assert scores == {"solved": (3.0, 3.0), "unsolved": (0.0, 3.0)}, scores
