"""``acetools merge --search eval.py:function``: the coefficient chosen by the user's evaluation
(acetools/files/search_merge.py; docs/your-models.md §Coefficients chosen by your evaluation).

The user's function here scores a merged folder by its distance to task arithmetic at λ = 0.1, so
the search must choose λ = 0.1 from the library's grid, stop after PATIENCE worse values, print its
trace and write the chosen merge with the search in acetools_merge.json.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from acetools.cli import main
from acetools.files.checkpoints import open_checkpoint
from acetools.files.search_merge import load_evaluation, search_merge, searched
from acetools.search import LAMBDA_GRID, PATIENCE

from .test_lineage import _world

pytest.importorskip("transformers")

KEY = "bert.encoder.layer.0.attention.self.query.weight"
EVAL = '''
import torch
from safetensors.torch import load_file

TARGET = torch.load({target!r})
CALLS = []


def evaluate(model, task):
    """Higher is better: minus the distance of the merged query weight to the target."""
    CALLS.append((str(model), task))
    w = load_file(f"{{model}}/model.safetensors")[{key!r}]
    return -float((w - TARGET).norm())
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    base, experts, _ = _world(root)
    W0 = open_checkpoint(base).get(KEY.removeprefix("bert."))
    taus = [open_checkpoint(e).get(KEY) - W0 for e in experts]
    torch.save(W0 + LAMBDA_GRID[2] * sum(taus), root / "target.pt")
    (root / "user_eval.py").write_text(EVAL.format(target=str(root / "target.pt"), key=KEY))
    return base, experts, root


def test_merge_search_runs_the_users_evaluation_and_reports_the_chosen_coefficient(world, tmp_path, capsys):
    base, experts, root = world
    out = tmp_path / "merged"
    assert main(["merge", "--method", "task_arithmetic", "--base", str(base), "--experts", *map(str, experts),
                 "--out", str(out), "--search", f"{root / 'user_eval.py'}:evaluate", "-q"]) == 0
    text = capsys.readouterr().out
    assert "searching task_arithmetic's lam" in text and f"chosen lam={LAMBDA_GRID[2]:g}" in text
    assert text.count("<- chosen") == 1
    info = json.loads((out / "acetools_merge.json").read_text())
    assert info["hparams"]["lam"] == pytest.approx(LAMBDA_GRID[2])
    s = info["search"]
    assert s["param"] == "lam" and s["value"] == pytest.approx(LAMBDA_GRID[2]) and s["stopped_early"]
    assert [e["value"] for e in s["trace"]] == pytest.approx(list(LAMBDA_GRID[:3 + PATIENCE]))
    assert set(s["trace"][0]["scores"]) == {"task2", "task3", "task5"}  # the experts' names are the tasks
    merged = open_checkpoint(out).get(KEY)
    assert -float((merged - torch.load(root / "target.pt")).norm()) == pytest.approx(max(
        e["mean"] for e in s["trace"]), abs=1e-6)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # candidates removed


def test_search_in_python_and_its_errors(world, tmp_path):
    base, experts, root = world
    evaluate = load_evaluation(f"{root / 'user_eval.py'}:evaluate")
    lines: list[str] = []
    found = search_merge("task_arithmetic", base, experts, tmp_path / "m", evaluate, patience=1,
                         report=lines.append)
    assert found.param == "lam" and found.value == pytest.approx(LAMBDA_GRID[2]) and len(lines) == 4
    assert searched("tsv_m").param == "alpha" and searched("ace").param == "scaling"
    with pytest.raises(ValueError, match="weight_averaging has no searched coefficient"):
        searched("weight_averaging")
    with pytest.raises(ValueError, match="do not also give -p lam"):
        search_merge("task_arithmetic", base, experts, tmp_path / "x", evaluate, hparams={"lam": 0.3})
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_evaluation(f"{root / 'user_eval.py'}:nope")
    with pytest.raises(ValueError, match="path/to/eval.py:function"):
        load_evaluation("user_eval.py")
    with pytest.raises(ValueError, match="returned 'bad' for task 'task2'"):
        search_merge("task_arithmetic", base, experts, tmp_path / "y", lambda m, t: "bad")
    assert not (tmp_path / "y").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert isinstance(Path(evaluate.__code__.co_filename), Path)


def _doc_blocks() -> tuple[str, str]:
    text = (Path(__file__).resolve().parents[1] / "docs" / "your-models.md").read_text()
    section = text.split("## Coefficients chosen by your evaluation", 1)[1].split("\n## ", 1)[0]
    python = re.findall(r"```python\n(# eval\.py.*?)```", section, flags=re.S)
    bash = re.findall(r"```bash\n(acetools merge .*?)\n```", section, flags=re.S)
    assert len(python) == 1 and len(bash) == 1, "the worked example: one eval.py block, one command"
    return python[0], bash[0]


def test_the_worked_example_runs(world, tmp_path, monkeypatch, capsys):
    """The documented eval.py and command, on tiny BERT folders named as in the example (a bare base
    with a WordPiece tokenizer, three classifier experts)."""
    import shutil

    transformers = pytest.importorskip("transformers")
    base, experts, _ = world
    shutil.copytree(base, tmp_path / "minilm")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(tmp_path / "minilm")
    for name, e in zip(("ft_a", "ft_b", "ft_c"), experts):
        shutil.copytree(e, tmp_path / name)
    g = torch.Generator().manual_seed(3)
    val = {name: {"texts": [" ".join(f"w{int(i)}" for i in torch.randint(0, 59, (6,), generator=g))
                            for _ in range(8)],
                  "labels": torch.randint(0, n, (8,), generator=g).tolist()}
           for name, n in (("ft_a", 2), ("ft_b", 3), ("ft_c", 5))}
    (tmp_path / "val.json").write_text(json.dumps(val))
    python, command = _doc_blocks()
    (tmp_path / "eval.py").write_text(python)
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command)[1:] + ["-q"]) == 0
    info = json.loads((tmp_path / "merged" / "acetools_merge.json").read_text())
    s = info["search"]
    assert s["param"] == "lam" and info["hparams"]["lam"] == pytest.approx(s["value"])
    assert all(0 <= v <= 1 for e in s["trace"] for v in e["scores"].values())
    assert set(s["trace"][0]["scores"]) == {"ft_a", "ft_b", "ft_c"}
    assert f"chosen lam={s['value']:g}" in capsys.readouterr().out
