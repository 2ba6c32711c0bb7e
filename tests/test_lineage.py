"""Bases and experts are checked before a merge (acetools/files/lineage.py), and the staging folder of a
new output (acetools/files/staging.py): tiny BERT folders built with transformers, no downloads.

The setting of docs/your-models.md §Bases and experts are checked: a bare ``BertModel`` base and three
``BertForSequenceClassification`` experts (2, 3 and 5 labels) fine-tuned from it merge, diagnose and
load back; a randomly initialised base of the same config is refused with one line naming the expert
and the number; a head-only expert is warned about; ``--force`` merges anyway.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from acetools.cli import main
from acetools.files.checkpoints import open_checkpoint
from acetools.files.heads import load_with_head
from acetools.files.lineage import (
    COSINE_LIMIT,
    RATIO_LIMIT,
    SHARED_RATIO_LIMIT,
    check_lineage,
    measure_lineage,
    sample_keys,
)
from acetools.files.staging import STAGE_MARK, make_stage, stale_stages
from acetools.layouts import PRESETS, default_layout

transformers = pytest.importorskip("transformers")


def _config(n: int):
    return transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=24, num_labels=n)


def _world(root: Path, step: float = 0.002) -> tuple[Path, list[Path], Path]:
    """A bare BertModel base, three classifier experts (2, 3, 5 labels) whose backbones moved by ``step``
    x N(0, 1) from it (a fine-tune's size: ‖τ‖/‖W0‖ about 0.1), and a random BertModel of the same config."""
    torch.manual_seed(0)
    base = transformers.BertModel(_config(2))
    base.save_pretrained(root / "base")
    experts = []
    for t, n in enumerate((2, 3, 5)):
        torch.manual_seed(10 + t)
        ex = transformers.BertForSequenceClassification(_config(n))
        ex.bert.load_state_dict(base.state_dict())
        g = torch.Generator().manual_seed(20 + t)
        with torch.no_grad():
            for p in ex.bert.parameters():
                p.add_(step * torch.randn(p.shape, generator=g))
        ex.save_pretrained(root / f"task{n}")
        experts.append(root / f"task{n}")
    torch.manual_seed(99)
    transformers.BertModel(_config(2)).save_pretrained(root / "random")
    return root / "base", experts, root / "random"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return _world(tmp_path_factory.mktemp("lineage"))


def test_the_done_when_setting_merges_diagnoses_and_loads_back(world, tmp_path, capsys):
    base, experts, _ = world
    out = tmp_path / "merged"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no lineage warning for real fine-tunes
        assert main(["merge", "--method", "ties", "--base", str(base), "--experts", *map(str, experts),
                     "--out", str(out), "-q"]) == 0
    for task, n in (("task2", 2), ("task3", 3), ("task5", 5)):
        model = load_with_head(out, task)
        assert model.config.num_labels == n and model(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, n)
    assert main(["diagnose", "--base", str(base), "--experts", *map(str, experts), "--out", str(tmp_path / "d"),
                 "--tables-only", "-q"]) == 0
    assert "3 experts, layout 'bert'" in capsys.readouterr().out


def test_a_random_base_is_refused_with_one_line_naming_the_expert_and_the_number(world, tmp_path, capsys):
    _, experts, random = world
    out = tmp_path / "merged"
    assert main(["merge", "--method", "task_arithmetic", "--base", str(random), "--experts", *map(str, experts),
                 "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"expert 0 ({experts[0]})" in err and "‖τ‖/‖W0‖ = " in err and "--force" in err, err
    ratio = float(err.split("‖τ‖/‖W0‖ = ")[1].split()[0])
    assert ratio > 1, err  # an unrelated base is farther from the expert than from zero
    assert not out.exists() and not list(tmp_path.glob(f".merged{STAGE_MARK}*"))
    with pytest.warns(UserWarning, match="merging anyway"):
        assert main(["merge", "--method", "task_arithmetic", "--base", str(random), "--experts",
                     *map(str, experts), "--out", str(out), "--force", "-q"]) == 0
    assert (out / "model.safetensors").is_file()


def test_the_numbers_separate_real_fine_tunes_from_foreign_bases(world):
    base, experts, random = world
    cks = [open_checkpoint(e) for e in experts]
    from acetools.files.heads import plan_heads

    lay = default_layout(open_checkpoint(base).keys(), open_checkpoint(base).config)
    for b in (base, random):
        ck = open_checkpoint(b)
        plan = plan_heads("drop", ck, cks, lay)
        assert plan.alignment is not None and plan.alignment.prefix == "bert"
        assert sorted(plan.keys) == ["classifier.bias", "classifier.weight"]
        view, heads, _ = plan.views(ck, cks, lay)
        lin = measure_lineage(view, heads, lay)
        if b == base:
            assert max(lin.ratio) < SHARED_RATIO_LIMIT and all(abs(lin.mean_cosine(t)) < 0.2 for t in range(3))
            assert lin.refusal() is None and lin.unchanged == []
        else:
            assert min(lin.ratio) > 1 and min(lin.mean_cosine(t) for t in range(3)) > COSINE_LIMIT
            assert "expert 0" in (lin.refusal() or "")
    assert 0 < SHARED_RATIO_LIMIT < 1 < RATIO_LIMIT


def test_a_head_only_expert_is_warned_about_once():
    g = torch.Generator().manual_seed(0)
    base = {f"layers.{i}.fc.weight": torch.randn(6, 5, generator=g) for i in range(3)}
    moved = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in base.items()}
    same = {k: v.clone() for k, v in base.items()}
    with pytest.warns(UserWarning, match=r"expert 1: the merged part equals the base on all 3 sampled") as rec:
        lin = check_lineage(base, [moved, same], PRESETS["generic"])
    assert len([w for w in rec if "equals the base" in str(w.message)]) == 1
    assert lin.unchanged == [1] and lin.ratio[1] == 0 and math.isnan(lin.cosine[0][1])
    assert json.dumps(lin.as_dict())  # recorded in acetools_merge.json


def test_one_expert_far_from_the_base_is_refused_by_its_ratio_alone():
    g = torch.Generator().manual_seed(1)
    base = {f"blocks.{i}.w": torch.randn(8, 8, generator=g) for i in range(4)}
    near = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in base.items()}
    far = {k: 3 * torch.randn(v.shape, generator=g) for k, v in base.items()}
    with pytest.raises(ValueError, match=rf"expert 1: ‖τ‖/‖W0‖ = 3\.\d+ \(limit {RATIO_LIMIT}\)"):
        check_lineage(base, [near, far], PRESETS["generic"])


def test_sample_keys_spread_over_the_depth_and_skip_ties():
    base = {f"h.{i}.attn.c_attn.weight": torch.zeros(4, 12) for i in range(20)}
    base.update({"wte.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(10, 4), "ln_f.weight": torch.ones(4)})
    lay = PRESETS["gpt2"].bind(base)
    keys = sample_keys(base, lay)
    assert len(keys) == 8 and keys[0] == "h.0.attn.c_attn.weight" and keys[-1] == "h.19.attn.c_attn.weight"
    assert "lm_head.weight" not in keys and "ln_f.weight" not in keys
    assert sample_keys({"a": torch.zeros(3), "b": torch.zeros(2, 2)}, PRESETS["generic"]) == ["b"]


def test_a_killed_merges_staging_folder_is_removed_by_the_next_run(tmp_path):
    out = tmp_path / "merged"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".merged{STAGE_MARK}{int(dead.stdout)}-abc"
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"partial")
    mine = tmp_path / f".merged{STAGE_MARK}{os.getpid()}-xyz"  # a live merge's folder stays
    mine.mkdir()
    other = tmp_path / f".other{STAGE_MARK}{int(dead.stdout)}-abc"  # a killed merge of another output: removed
    other.mkdir()
    hidden = tmp_path / ".other"  # an unrelated hidden folder stays
    hidden.mkdir()
    assert stale_stages(out) == sorted([left, other])
    old = os.umask(0o022)
    try:
        stage = make_stage(out)
    finally:
        os.umask(old)
    assert not left.exists() and not other.exists() and mine.exists() and hidden.exists() and stage.is_dir()
    assert stage.stat().st_mode & 0o777 == 0o755 and stage.name.startswith(f".merged{STAGE_MARK}{os.getpid()}-")


def test_a_folder_without_permission_is_named_by_the_users_path(tmp_path, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(kwargs.get("dir", "?")) + "/.x.acetools-stage-1-abc")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(PermissionError) as e:
        make_stage(tmp_path / "merged")
    assert str(tmp_path / "merged") in str(e.value) and STAGE_MARK not in str(e.value)


def test_the_merge_command_cleans_a_killed_merges_staging_folder_and_names_out(world, tmp_path, monkeypatch,
                                                                                capsys):
    base, experts, _ = world
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".merged{STAGE_MARK}{int(dead.stdout)}-abc"
    left.mkdir()
    argv = ["merge", "--method", "task_arithmetic", "--base", str(base), "--experts", *map(str, experts), "-q"]
    assert main([*argv, "--out", str(tmp_path / "merged")]) == 0
    assert not left.exists() and (tmp_path / "merged" / "model.safetensors").is_file()
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", f"{kwargs.get('dir', '?')}/.other{STAGE_MARK}1-abc")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    assert main([*argv, "--out", str(tmp_path / "other")]) != 0
    err = capsys.readouterr().err
    assert str(tmp_path / "other") in err and STAGE_MARK not in err, err
