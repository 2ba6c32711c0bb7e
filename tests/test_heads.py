"""Per-task heads in the file merge (``acetools merge --heads``): tiny BERT, RoBERTa and GPT-2 classifiers.

Each expert is a ``*ForSequenceClassification`` with its own label count (2 / 4 / 5), saved with
``save_pretrained`` like the other file tests (tests/test_merge_files.py). Checked: the merged
backbone is the method's merge of the backbone keys alone (streamed and in memory), every head
file is the expert's head exactly, the loader's model gives the logits of a model assembled by
hand (and the expert's own logits when the backbone is the expert's), and the errors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from acetools.cli import main
from acetools.files.checkpoints import file_sha256, open_checkpoint
from acetools.files.heads import list_heads, load_head, load_with_head, task_state_dict
from acetools.files.merge_files import load_config, merge_files
from acetools.layouts import PRESETS, Layout, is_classifier
from acetools.merging import merge

transformers = pytest.importorskip("transformers")

LABELS = (2, 4, 5)
HEAD = {"bert": ("classifier.weight", "classifier.bias"),
        "roberta": ("classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight",
                    "classifier.out_proj.bias"),
        "gpt2": ("score.weight",)}
LAYOUT = {"bert": "bert", "roberta": "bert", "gpt2": "gpt2"}


def _config(family: str, num_labels: int):
    names = {"id2label": {i: f"{family}-class-{i}" for i in range(num_labels)}}
    names["label2id"] = {v: k for k, v in names["id2label"].items()}
    if family == "bert":
        return transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=24, **names)
    if family == "roberta":
        return transformers.RobertaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=32, max_position_embeddings=24, type_vocab_size=1,
                                          pad_token_id=1, **names)
    return transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, pad_token_id=0,
                                   bos_token_id=2, eos_token_id=3, **names)


_CLASS = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification",
          "gpt2": "GPT2ForSequenceClassification"}


def _model(family: str, num_labels: int, seed: int):
    torch.manual_seed(seed)
    return getattr(transformers, _CLASS[family])(_config(family, num_labels)).eval()


def _classifiers(root: Path, family: str, labels=LABELS, tune_backbone: bool = True, names=("sst2", "agnews", "emo"),
                 base_labels: int = 2):
    """A base classifier (2 labels, random head) and one expert per label count, fine-tuned from it:
    the expert starts from the base's backbone, gets its own head, and (``tune_backbone``) a
    perturbed backbone. Returns ``(base folder, expert folders, expert models)``."""
    base = _model(family, base_labels, 0)
    base.save_pretrained(root / "base")
    backbone = {k: v for k, v in base.state_dict().items() if not k.startswith(HEAD[family][0].split(".")[0] + ".")}
    folders, models = [], []
    for t, n in enumerate(labels):
        ex = _model(family, n, 10 + t)
        missing, unexpected = ex.load_state_dict(backbone, strict=False)
        assert sorted(missing) == sorted(HEAD[family]) and not unexpected
        if tune_backbone:
            g = torch.Generator().manual_seed(20 + t)
            with torch.no_grad():
                for k, p in ex.named_parameters():
                    if k in backbone:
                        p.add_(0.02 * torch.randn(p.shape, generator=g))
        ex.save_pretrained(root / names[t])
        folders.append(root / names[t])
        models.append(ex)
    return root / "base", folders, models


def _split(path: Path, family: str) -> tuple[dict, dict]:
    sd = open_checkpoint(path).state_dict()
    head = {k: v for k, v in sd.items() if k in HEAD[family]}
    return {k: v for k, v in sd.items() if k not in head}, head


def _ids(family: str) -> dict:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(4, 60, (3, 7), generator=g)
    return {"input_ids": ids} if family == "gpt2" else {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _by_hand(family: str, config_dir: Path, state: dict):
    """The expert's class and config, loaded strictly with ``state``: the reference for the loader."""
    config = transformers.AutoConfig.from_pretrained(config_dir)
    model = getattr(transformers, _CLASS[family])(config).eval()
    model.load_state_dict(state, strict=True)
    return model


CASES = [("bert", "ties", {"k": 40}), ("roberta", "tsv_m", {}), ("gpt2", "task_arithmetic", {"lam": 0.5})]


@pytest.mark.parametrize("mode", ["stream", "memory"])
@pytest.mark.parametrize("family, method, hp", CASES, ids=[c[0] for c in CASES])
def test_per_task_heads_merge_the_backbone_and_keep_each_head(tmp_path, family, method, hp, mode):
    base, experts, _ = _classifiers(tmp_path, family)
    out = tmp_path / "merged"
    res = merge_files(method, base, experts, out, hparams=hp, mode=mode)  # heads="auto": per task for classifiers
    assert res.info["heads"]["mode"] == "per-task" and res.info["driver"] == mode
    assert res.info["heads"]["keys"] == [k for k in open_checkpoint(experts[0]).keys() if k in HEAD[family]]
    assert "heads: per task" in res.plan.summary() and "agnews (4 labels)" in res.plan.summary()
    # the backbone: the method's merge of the backbone keys alone, exactly
    b, _ = _split(base, family)
    ex = [_split(e, family)[0] for e in experts]
    ref = merge(method, b, ex, layout=LAYOUT[family], **hp)
    merged = open_checkpoint(out).state_dict()
    assert sorted(merged) == sorted(ref)
    for k, v in ref.items():
        assert torch.equal(merged[k], v), k
    assert not torch.equal(merged[next(iter(ref))], b[next(iter(ref))])
    # every head: the expert's own tensors, byte for byte, with its labels and hashes
    heads = list_heads(out)
    assert list(heads) == ["sst2", "agnews", "emo"]
    for folder, n in zip(experts, LABELS):
        name = folder.name
        tensors, record = load_head(out, name)
        _, own = _split(folder, family)
        assert sorted(tensors) == sorted(own) and all(torch.equal(tensors[k], own[k]) for k in own)
        assert all(tensors[k].dtype == own[k].dtype for k in own)
        assert record["num_labels"] == n and record["id2label"] == {str(i): f"{family}-class-{i}" for i in range(n)}
        assert record["source"] == str(folder) and record["architectures"] == [_CLASS[family]]
        assert record["sha256"] == file_sha256(out / "heads" / name / "head.safetensors")
        assert record["source_sha256"] == {str(folder / "model.safetensors"): file_sha256(folder / "model.safetensors")}
        # the loader: the merged backbone plus this head, like a model assembled by hand
        model = load_with_head(out, name)
        assert type(model).__name__ == _CLASS[family] and model.config.num_labels == n
        assert model.config.id2label[n - 1] == f"{family}-class-{n - 1}"
        hand = _by_hand(family, folder, {**merged, **own})
        with torch.no_grad():
            got, want = model(**_ids(family)).logits, hand(**_ids(family)).logits
        assert got.shape == (3, n) and torch.equal(got, want)
        sd, cfg = task_state_dict(out, name)
        assert cfg["id2label"] == record["id2label"] and sorted(sd) == sorted(hand.state_dict())
    meta = json.loads((out / "acetools_merge.json").read_text())
    assert meta["heads"]["tasks"] == {n: f"heads/{n}" for n in ("sst2", "agnews", "emo")}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary folder left


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2"])
def test_loader_reproduces_each_experts_logits_on_its_own_backbone(tmp_path, family):
    """Experts that tuned only their heads share the base's backbone: weight averaging gives that
    backbone back exactly, so each task's model must be the expert itself."""
    base, experts, models = _classifiers(tmp_path, family, tune_backbone=False)
    out = tmp_path / "merged"
    with pytest.warns(UserWarning, match=r"expert 2 \(.*emo\): the merged part equals the base .*their heads"):
        assert main(["merge", "--method", "weight_averaging", "--base", str(base), "--experts",
                     *map(str, experts), "--out", str(out), "--heads", "per-task", "--names", "a", "b", "c", "-q"]) == 0
    for name, expert, n in zip("abc", models, LABELS):
        model = load_with_head(out, name)
        with torch.no_grad():
            assert torch.equal(model(**_ids(family)).logits, expert(**_ids(family)).logits)
        assert model.config.num_labels == n


def test_heads_of_different_shapes_without_the_option_name_key_shapes_and_option(tmp_path, capsys):
    base, experts, _ = _classifiers(tmp_path, "bert")
    msg = r"shape mismatch at key 'classifier\.(weight|bias)': base .*base: \(2,?.*agnews: \(4,?.*heads='per-task'"
    with pytest.raises(ValueError, match=msg):
        merge_files("ties", base, experts, tmp_path / "o", heads="merge")
    assert not (tmp_path / "o").exists()
    capsys.readouterr()  # the fixtures' save_pretrained bars
    code = main(["merge", "--method", "ties", "--base", str(base), "--experts", *map(str, experts),
                 "--out", str(tmp_path / "o"), "--heads", "merge", "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert re.search(r"key 'classifier\.(weight|bias)'", err) and "(4" in err and "(5" in err
    assert "--heads per-task" in err
    with pytest.raises(ValueError, match="heads='bogus' must be one of auto, merge, per-task, drop"):
        merge_files("ties", base, experts, tmp_path / "o", heads="bogus")


def test_bare_files_drop_names_and_overwrite(tmp_path):
    """Safetensors files without a config: heads found from the key names (auto), labels from the
    head's output size; drop; names; the heads folder of an earlier merge."""
    _, experts, _ = _classifiers(tmp_path, "gpt2")
    files = []
    for e in experts:
        f = tmp_path / f"{e.name}.safetensors"
        f.write_bytes((e / "model.safetensors").read_bytes())
        files.append(f)
    base = tmp_path / "base.safetensors"
    base.write_bytes((tmp_path / "base" / "model.safetensors").read_bytes())
    assert is_classifier(open_checkpoint(files[0]).keys(), None, PRESETS["gpt2"])
    assert not is_classifier(["score.weight"], {"architectures": ["GPT2LMHeadModel"]}, PRESETS["gpt2"])
    out = tmp_path / "m"
    res = merge_files("task_arithmetic", base, files, out)
    assert res.info["heads"]["mode"] == "per-task" and res.plan.layout.name == "gpt2"
    assert {n: r["num_labels"] for n, r in list_heads(out).items()} == dict(zip(("sst2", "agnews", "emo"), LABELS))
    assert list_heads(out)["emo"]["config"] is None
    with pytest.raises(ValueError, match="no model_type in the config of task 'emo'; use task_state_dict"):
        load_with_head(out, "emo")
    sd, cfg = task_state_dict(out, "emo")
    assert cfg == {"num_labels": 5, "id2label": {str(i): f"LABEL_{i}" for i in range(5)},
                   "label2id": {f"LABEL_{i}": i for i in range(5)}}
    assert torch.equal(sd["score.weight"], open_checkpoint(files[2]).get("score.weight"))
    with pytest.raises(FileExistsError, match="already holds weights"):
        merge_files("task_arithmetic", base, files, out)
    res = merge_files("task_arithmetic", base, files, out, overwrite=True, names=["x", "y", "z"])
    assert sorted(p.name for p in (out / "heads").iterdir()) == ["index.json", "x", "y", "z"]
    with pytest.raises(KeyError, match="no head for task 'sst2'; its tasks are: x, y, z"):
        load_head(out, "sst2")
    # drop: the backbone only, and the earlier merge's heads go with the overwrite
    res = merge_files("task_arithmetic", base, files, out, overwrite=True, heads="drop")
    assert not (out / "heads").exists() and "score.weight" not in open_checkpoint(out).keys()
    assert "left out of the merge and not written" in res.plan.summary()
    with pytest.raises(ValueError, match=r"two experts have the head name 'same'"):
        merge_files("task_arithmetic", base, files, tmp_path / "n", names=["same", "same", "other"])
    with pytest.raises(ValueError, match=r"names: 4 name\(s\) for 3 experts"):
        merge_files("task_arithmetic", base, files, tmp_path / "n", names=["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="cannot be a folder name"):
        merge_files("task_arithmetic", base, files, tmp_path / "n", names=["a", "../b", "c"])
    with pytest.raises(ValueError, match="has no key that layout 'plain' calls a task head"):
        merge_files("task_arithmetic", base, files, tmp_path / "n", heads="per-task",
                    layout=Layout("plain"))


def test_same_shaped_heads_merge_when_asked_and_a_failed_merge_leaves_nothing(tmp_path, monkeypatch):
    base, experts, _ = _classifiers(tmp_path, "roberta", labels=(3, 3, 3), base_labels=3)
    out = tmp_path / "merged"
    res = merge_files("task_arithmetic", base, experts, out, heads="merge", hparams={"lam": 1 / 3})
    assert res.info["heads"]["mode"] == "merge" and not (out / "heads").exists()
    b, ex = open_checkpoint(base).state_dict(), [open_checkpoint(e).state_dict() for e in experts]
    ref = merge("task_arithmetic", b, ex, layout="bert", lam=1 / 3)
    merged = open_checkpoint(out).state_dict()
    assert sorted(merged) == sorted(ref) and all(torch.equal(merged[k], ref[k]) for k in ref)
    assert all(not torch.equal(merged[k], b[k]) for k in HEAD["roberta"] if k.endswith("weight"))  # biases: 0
    from acetools.files import heads as heads_mod

    def boom(self):
        raise RuntimeError("disk full")

    monkeypatch.setattr(heads_mod.HeadWriter, "write", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        merge_files("task_arithmetic", base, experts, tmp_path / "failed")
    assert not (tmp_path / "failed").exists()  # a new --out appears complete or not at all (staged, issue 20)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".failed.")]  # nor its staging folder
    # a head file changed after the merge is refused by the loader
    monkeypatch.undo()
    merge_files("task_arithmetic", base, experts, tmp_path / "ok")
    f = tmp_path / "ok" / "heads" / "sst2" / "head.safetensors"
    f.write_bytes(f.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ValueError, match="the head file was changed after the merge"):
        load_with_head(tmp_path / "ok", "sst2")
    with pytest.raises(FileNotFoundError, match="holds no per-task heads"):
        list_heads(out)


def _bare(folder: Path, family: str, out: Path) -> Path:
    """The backbone of a saved classifier as the bare model class (BertModel, GPT2Model): keys without
    the base-model prefix ('bert.', 'transformer.')."""
    model = getattr(transformers, _CLASS[family]).from_pretrained(folder)
    getattr(model, model.base_model_prefix).save_pretrained(out)
    return out


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_bare_backbone_base_merges_with_classifier_experts_and_the_reverse(tmp_path, family):
    """A BertModel / GPT2Model base with *ForSequenceClassification experts (2, 3, 5 labels) merges through
    the base-model prefix, exactly as with the classifier base of the same backbone, with the experts'
    key names; diagnose reads the same folders; the reverse (bare experts, classifier base) too."""
    base, experts, _ = _classifiers(tmp_path, family, labels=(2, 3, 5))
    bare = _bare(base, family, tmp_path / "bare")
    prefix = "bert." if family == "bert" else "transformer."
    assert not any(k.startswith(prefix) for k in open_checkpoint(bare).keys())
    out, ref = tmp_path / "from_bare", tmp_path / "from_classifier"
    assert main(["merge", "--method", "ties", "--base", str(bare), "--experts", *map(str, experts), "--out", str(out),
                 "-q"]) == 0
    merge_files("ties", base, experts, ref)
    got, want = open_checkpoint(out).state_dict(), open_checkpoint(ref).state_dict()
    assert sorted(got) == sorted(want) and all(k.startswith(prefix) for k in got)
    assert all(torch.equal(got[k], want[k]) for k in want)
    model = load_with_head(out, "agnews")
    assert model.config.num_labels == 3 and model(**_ids(family)).logits.shape == (3, 3)
    assert "base is a bare backbone" in merge_files("ties", bare, experts, dry_run=True).plan.summary()
    from acetools.files.diagnose import diagnose

    d = diagnose(bare, experts, layout="auto")
    assert d.meta["n_tasks"] == 3 and all(k.startswith(prefix) for k in d.layers["key"])
    # the reverse: bare experts, a classifier base: the output has the experts' (bare) names
    bare_experts = [_bare(e, family, tmp_path / f"bare_{e.name}") for e in experts]
    rev, ref2 = tmp_path / "reverse", tmp_path / "all_bare"
    merge_files("ties", base, bare_experts, rev)
    assert "the experts are bare backbones" in merge_files("ties", base, bare_experts, dry_run=True).plan.summary()
    merge_files("ties", bare, bare_experts, ref2)
    got, want = open_checkpoint(rev).state_dict(), open_checkpoint(ref2).state_dict()
    assert sorted(got) == sorted(want) and not any(k.startswith(prefix) for k in got)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_heads_follow_the_umask_and_a_bf16_head_keeps_the_backbone_dtype(tmp_path):
    base, experts, _ = _classifiers(tmp_path, "bert")
    sd = open_checkpoint(experts[1]).state_dict()
    from safetensors.torch import save_file

    save_file({k: (v.bfloat16() if k.startswith("classifier.") else v) for k, v in sd.items()},
              str(experts[1] / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((experts[1] / "config.json").read_text())
    (experts[1] / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16", "dtype": "bfloat16"}))
    import os

    old = os.umask(0o027)
    try:
        merge_files("task_arithmetic", base, experts, tmp_path / "merged")
    finally:
        os.umask(old)
    heads = tmp_path / "merged" / "heads"
    modes = {p.relative_to(heads).as_posix(): p.stat().st_mode & 0o777 for p in [heads, *heads.rglob("*")]}
    assert all(m == (0o750 if (heads / p).is_dir() else 0o640) for p, m in modes.items()), modes
    assert load_head(tmp_path / "merged", "agnews")[0]["classifier.weight"].dtype == torch.bfloat16  # as stored
    model = load_with_head(tmp_path / "merged", "agnews")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert load_with_head(tmp_path / "merged", "agnews", dtype=torch.bfloat16).classifier.weight.dtype == torch.bfloat16


def test_config_file_heads_and_names(tmp_path):
    base, experts, _ = _classifiers(tmp_path, "bert")
    conf = tmp_path / "merge.yaml"
    conf.write_text("method: task_arithmetic\nbase: base\nexperts: [sst2, agnews, emo]\nout: merged\n"
                    "heads: per-task\nnames: [one, two, three]\n")
    assert load_config(conf)["names"] == ["one", "two", "three"]
    assert main(["merge", str(conf), "-q"]) == 0
    assert list(list_heads(tmp_path / "merged")) == ["one", "two", "three"]
    conf.write_text("method: ties\nbase: base\nexperts: [sst2]\nnames: sst2\n")
    with pytest.raises(ValueError, match="names must be a list"):
        load_config(conf)


def _doc_example() -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "your-models.md").read_text()
    section = text.split("## Per-task heads", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "docs/your-models.md §Per-task heads has one Python example"
    return blocks[0]


def test_the_documented_example_runs(tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    _, experts, _ = _classifiers(models, "bert", names=("sst2", "agnews", "emotion"))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_doc_example(), "docs/your-models.md", "exec"), scope)  # noqa: S102 - the documented example
    assert scope["model"].config.num_labels == 4 and tuple(scope["logits"].shape) == (1, 4)
    assert scope["heads"]["emotion"]["num_labels"] == 5
