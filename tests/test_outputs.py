"""Outputs that load as written (acetools/files/outputs.py; docs/your-models.md §What is written, §Per-task
heads): config.json records the dtype written, and ``--per-task-out DIR`` writes one folder per task that
plain ``from_pretrained`` loads with that task's head, config and tokenizer. Tiny BERT folders built with
transformers (tests/test_lineage.py's world), no downloads.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

from acetools.cli import main
from acetools.errors import InputError
from acetools.files import outputs
from acetools.files.checkpoints import open_checkpoint
from acetools.files.heads import load_with_head
from acetools.files.merge_files import merge_files
from acetools.files.outputs import record_dtype, written_dtype

from .test_lineage import _world

transformers = pytest.importorskip("transformers")
IDS = torch.tensor([[5, 6, 7, 8]])
LABELS = {"task2": 2, "task3": 3, "task5": 5}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny world, its base with a WordPiece tokenizer beside its weights."""
    root = tmp_path_factory.mktemp("outputs")
    base, experts, _ = _world(root)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    (root / "vocab.txt").write_text("\n".join(words) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(root / "vocab.txt")).save_pretrained(base)
    return base, experts


def _quiet():
    from acetools.files.heads import _quiet_transformers

    return _quiet_transformers()


def test_config_records_the_dtype_written(world, tmp_path):
    base, experts = world
    before = (base / "config.json").read_bytes()
    merge_files("task_arithmetic", base, experts, tmp_path / "bf16", dtype="bf16", hash_inputs=False)
    cfg = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and "torch_dtype" not in cfg  # transformers 5 wrote the base's "dtype"
    assert (base / "config.json").read_bytes() == before  # the base's own file is never touched
    with _quiet():
        model = transformers.AutoModel.from_pretrained(tmp_path / "bf16", dtype="auto")
    assert model.dtype == torch.bfloat16
    merge_files("task_arithmetic", base, experts, tmp_path / "same", hash_inputs=False)
    assert json.loads((tmp_path / "same" / "config.json").read_text())["dtype"] == "float32"


def test_a_transformers_4_config_gets_both_names_and_the_bases_dtype_is_what_was_written(world, tmp_path):
    """A base config with ``torch_dtype`` (transformers 4) gets it and ``dtype``; with the base's dtype kept,
    the config says what the files hold (here bf16 weights under a config that says float32)."""
    from safetensors.torch import save_file

    base, experts = world
    shutil.copytree(base, tmp_path / "base")
    cfg = json.loads((tmp_path / "base" / "config.json").read_text())
    cfg["torch_dtype"] = cfg.pop("dtype", "float32")
    (tmp_path / "base" / "config.json").write_text(json.dumps(cfg))
    sd = open_checkpoint(base).state_dict()
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()},
              tmp_path / "base" / "model.safetensors")
    merge_files("ties", tmp_path / "base", experts, tmp_path / "out", hash_inputs=False)
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert out["torch_dtype"] == out["dtype"] == "bfloat16"
    assert json.loads((tmp_path / "base" / "config.json").read_text())["torch_dtype"] == "float32"
    merge_files("ties", tmp_path / "base", experts, tmp_path / "f16", dtype="fp16", hash_inputs=False)
    assert json.loads((tmp_path / "f16" / "config.json").read_text())["torch_dtype"] == "float16"


def test_written_dtype_is_the_dtype_of_most_entries():
    assert written_dtype([(torch.bfloat16, (10, 10)), (torch.float32, (3,)), (torch.int64, (1, 512))]) \
        == torch.bfloat16
    assert written_dtype([(torch.int64, (4,))]) is None
    assert record_dtype({"a": 1}, None) == {"a": 1}
    assert record_dtype({"torch_dtype": "float32"}, torch.float16) == {"torch_dtype": "float16", "dtype": "float16"}


def test_per_task_out_loads_with_from_pretrained_as_load_with_head(world, tmp_path):
    base, experts = world
    res = merge_files("ties", base, experts, tmp_path / "merged", dtype="bf16", per_task_out=tmp_path / "tasks")
    assert res.info["per_task_out"] == [str(tmp_path.resolve() / "tasks" / t) for t in LABELS]
    for task, n in LABELS.items():
        folder = tmp_path / "tasks" / task
        with _quiet():
            model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, dtype="auto").eval()
        ref = load_with_head(tmp_path / "merged", task)
        assert type(model).__name__ == "BertForSequenceClassification" and model.dtype == torch.bfloat16
        assert model.config.num_labels == n and model.config.id2label == ref.config.id2label
        mine, theirs = model.state_dict(), ref.state_dict()
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
        with torch.no_grad():  # the same weights; the logits to rounding (the kernels see other memory layouts)
            torch.testing.assert_close(model(input_ids=IDS).logits, ref(input_ids=IDS).logits)
        assert (folder / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
        tok = transformers.AutoTokenizer.from_pretrained(folder)  # the base's tokenizer
        assert tok("w1 w2")["input_ids"] == transformers.AutoTokenizer.from_pretrained(base)("w1 w2")["input_ids"]
        assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    assert not [p for p in (tmp_path / "tasks").iterdir() if p.name.startswith(".")]  # no staging left


def test_per_task_out_is_checked_like_out(world, tmp_path):
    base, experts = world
    with pytest.raises(InputError, match="heads are 'drop'"):
        merge_files("ties", base, experts, tmp_path / "a", heads="drop", per_task_out=tmp_path / "t")
    with pytest.raises(InputError, match="overlap"):
        merge_files("ties", base, experts, tmp_path / "b", per_task_out=tmp_path / "b")
    with pytest.raises(InputError, match="inside the input checkpoint folder"):
        merge_files("ties", base, experts, tmp_path / "c", per_task_out=experts[0] / "tasks")
    (tmp_path / "t" / "task3").mkdir(parents=True)
    (tmp_path / "t" / "task3" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="task3 is not empty"):
        merge_files("ties", base, experts, tmp_path / "d", per_task_out=tmp_path / "t")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "d").exists()
    merge_files("ties", base, experts, tmp_path / "d", per_task_out=tmp_path / "t", overwrite=True,
                hash_inputs=False)
    assert not (tmp_path / "t" / "task3" / "notes.txt").exists()  # replaced, as --overwrite says
    assert (tmp_path / "t" / "task3" / "model.safetensors").is_file()


def test_a_failed_task_folder_leaves_nothing(world, tmp_path, monkeypatch):
    base, experts = world
    real = outputs.load_head

    def fail_on_task5(folder, task):
        if task == "task5":
            raise RuntimeError("disk full")
        return real(folder, task)

    monkeypatch.setattr(outputs, "load_head", fail_on_task5)
    with pytest.raises(RuntimeError, match="disk full"):
        merge_files("ties", base, experts, tmp_path / "merged", per_task_out=tmp_path / "tasks", hash_inputs=False)
    assert not (tmp_path / "merged").exists()
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no --out, no task folder, no staging


def test_per_task_out_from_the_command_line_and_a_config_file(world, tmp_path, capsys):
    base, experts = world
    assert main(["merge", "--method", "task_arithmetic", "--base", str(base), "--experts", *map(str, experts),
                 "--out", str(tmp_path / "m"), "--per-task-out", str(tmp_path / "tasks"), "-q"]) == 0
    assert "one model per task (from_pretrained):" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == sorted(LABELS)
    (tmp_path / "merge.yaml").write_text(yaml.safe_dump({
        "method": "task_arithmetic", "base": str(base), "experts": list(map(str, experts)), "out": "m2",
        "per_task_out": "per-task"}))
    assert main(["merge", str(tmp_path / "merge.yaml"), "-q"]) == 0
    with _quiet():
        model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "per-task" / "task5")
    assert model.config.num_labels == 5
    capsys.readouterr()
    assert main(["merge", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--per-task-out DIR" in text and "config.json records it" in text


@pytest.mark.parametrize("vocab", ["base", "union"])
def test_per_task_out_with_an_expert_that_added_tokens(world, tmp_path, vocab):
    """An expert with two added tokens (``resize_token_embeddings``): each task folder's config has the
    merged rows' count, so it loads with from_pretrained as load_with_head loads it (docs/your-models.md
    §Vocabularies)."""
    base, experts = world
    with _quiet():
        grown = transformers.BertForSequenceClassification.from_pretrained(experts[2])
    grown.resize_token_embeddings(66)
    with _quiet():
        grown.save_pretrained(tmp_path / "task5")
    merge_files("task_arithmetic", base, [*experts[:2], tmp_path / "task5"], tmp_path / "m", vocab=vocab,
                per_task_out=tmp_path / "tasks", hash_inputs=False)
    for task in LABELS:
        with _quiet():
            model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "tasks" / task)
        ref = load_with_head(tmp_path / "m", task)
        assert model.config.vocab_size == ref.config.vocab_size == (66 if vocab == "union" else 64)
        mine, theirs = model.state_dict(), ref.state_dict()
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize("searcher", ["grid", "tpe"])
def test_a_search_writes_the_task_folders_of_the_chosen_merge_only(world, tmp_path, searcher):
    """Every candidate of --search is merged without --per-task-out (acetools.files.search_merge.score_candidate):
    the folders are written once, for the chosen merge, whichever searcher chose it."""
    base, experts = world
    seen = []

    def evaluate(folder, task):
        seen.append(folder)
        assert not (tmp_path / "tasks").exists()  # nothing written there while the candidates are scored
        return float(open_checkpoint(folder).get("bert.pooler.dense.bias").sum())

    options = dict(per_task_out=tmp_path / "tasks", heads="per-task")
    if searcher == "grid":
        from acetools.files.search_merge import search_merge

        found = search_merge("task_arithmetic", base, experts, tmp_path / "merged", evaluate, **options)
    else:
        pytest.importorskip("optuna")
        from acetools.files.tpe_merge import tpe_search_merge

        found = tpe_search_merge("ties", base, experts, tmp_path / "merged", evaluate, trials=3, seed=0, **options)
    assert len(set(seen)) > 1
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == sorted(found.merge.info["heads"]["tasks"])
