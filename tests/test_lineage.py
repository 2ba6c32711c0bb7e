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
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from acetools.cli import main
from acetools.errors import InputError
from acetools.files.checkpoints import Checkpoint, open_checkpoint
from acetools.files.heads import load_with_head
from acetools.files.lineage import (
    CENTRAL_MARGIN,
    COSINE_LIMIT,
    RATIO_LIMIT,
    SHARED_RATIO_LIMIT,
    check_lineage,
    claimed_parents,
    measure_lineage,
    names_same_model,
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


# --------------------------------------------------------------------------- a swapped base
def _moved(base: dict, sizes, seed: int = 0) -> list[dict]:
    """One expert per size: ``base`` plus size x N(0, 1) on every tensor (independent fine-tunes)."""
    g = torch.Generator().manual_seed(seed)
    return [{k: v + s * torch.randn(v.shape, generator=g) for k, v in base.items()} for s in sizes]


def _base(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.fc.weight": torch.randn(48, 40, generator=g) for i in range(4)}


@pytest.mark.parametrize("sizes", [(0.01, 0.01, 0.01), (0.05, 0.05), (0.002, 0.01, 0.05), (0.01, 0.05),
                                   (0.05, 0.01, 0.01)])
def test_the_true_base_is_the_most_central_across_update_sizes(sizes):
    W0 = _base()
    experts = _moved(W0, sizes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lin = check_lineage(W0, experts, PRESETS["generic"])
    assert lin.most_central() is None and lin.refusal() is None
    assert all(lin.central_gap(t) < 0 for t in range(len(sizes)))  # independent updates: strictly most central
    assert abs(lin.cosine_from[0]) < 0.05  # and the task vectors from it nearly orthogonal
    assert len(lin.dist_sum) == len(sizes) + 1 and json.dumps(lin.as_dict())


def _gap_of_a_swap(a: float, b: float) -> float:
    """The gap of the true base over expert A given as the base, with orthogonal updates of sizes a and b:
    (s_A − s_base) / s_A = (√(a² + b²) − b) / (a + √(a² + b²))."""
    return (math.hypot(a, b) - b) / (a + math.hypot(a, b))


@pytest.mark.parametrize("sizes", [(0.01, 0.01, 0.01), (0.01, 0.01), (0.05, 0.01), (0.01, 0.02)])
def test_a_swapped_base_is_refused_naming_the_more_central_model(sizes):
    W0 = _base(1)
    experts = _moved(W0, sizes, seed=1)
    given = [W0, *experts[1:]]  # --base expert_0 --experts base expert_1 ...
    lin = measure_lineage(experts[0], given, PRESETS["generic"])
    assert lin.most_central() == 0 and max(lin.ratio) < SHARED_RATIO_LIMIT  # not an unrelated base
    if len(sizes) == 2:  # the geometry of orthogonal updates (random directions in 7,680 dimensions)
        assert lin.central_gap(0) == pytest.approx(_gap_of_a_swap(*sizes), abs=0.01)
    assert lin.cosine_from[0] > 0.3 > abs(lin.cosine_from[1])  # the swap's shared component, gone from the parent
    with pytest.raises(InputError) as e:
        check_lineage(experts[0], given, PRESETS["generic"])
    line = str(e.value)
    assert "\n" not in line and line.startswith("the base is not the most central of the models given: expert 0 is")
    s0, s1 = lin.dist_sum[0], lin.dist_sum[1]
    assert f"summed distance to the others {s1:.4g} against the base's {s0:.4g}" in line
    assert f"{lin.central_gap(0):.1%} less, limit {CENTRAL_MARGIN:.0%}" in line and "--force" in line
    with pytest.warns(UserWarning, match="merging anyway \\(force\\): the base is not the most central"):
        check_lineage(experts[0], given, PRESETS["generic"], force=True)


def test_a_swap_with_a_much_smaller_update_is_not_refused():
    """The limit of the rule: an expert that moved 5x less than another sits nearly at the base; given as
    the base it is within the margin (and the merge nearly the same)."""
    W0 = _base(2)
    small, large = _moved(W0, (0.002, 0.01), seed=2)
    lin = check_lineage(small, [W0, large], PRESETS["generic"])
    assert 0 < lin.central_gap(0) < CENTRAL_MARGIN
    assert lin.central_gap(0) == pytest.approx(_gap_of_a_swap(0.002, 0.01), abs=0.005)


def _backbones(root: Path, steps=(0.002, 0.002, 0.002)) -> tuple[Path, list[Path]]:
    """A bare BertModel base and three BertModel experts (fine-tuned backbones, as sentence encoders are)
    moved from it by ``steps`` x N(0, 1), one step per expert."""
    torch.manual_seed(0)
    base = transformers.BertModel(_config(2))
    base.save_pretrained(root / "base")
    experts = []
    for t, step in enumerate(steps):
        ex = transformers.BertModel(_config(2))
        ex.load_state_dict(base.state_dict())
        g = torch.Generator().manual_seed(20 + t)
        with torch.no_grad():
            for p in ex.parameters():
                p.add_(step * torch.randn(p.shape, generator=g))
        ex.save_pretrained(root / f"expert{t}")
        experts.append(root / f"expert{t}")
    return root / "base", experts


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    return _backbones(tmp_path_factory.mktemp("backbones"))


def test_a_swapped_base_on_disk_is_refused_with_one_line_and_merges_with_force(backbones, tmp_path, capsys):
    base, experts = backbones
    out = tmp_path / "merged"
    argv = ["merge", "--method", "task_arithmetic", "--base", str(experts[0]), "--experts", str(base),
            *map(str, experts[1:]), "--out", str(out), "-q"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith(f"acetools: error: the base ({experts[0]}) is not the most central of the models given: "
                           f"expert 0 ({base}) is (summed distance to the others "), line
    gap = float(line.split("against the base's ")[1].split(", ")[1].split("%")[0])
    assert 10 < gap < 30 and "% less, limit 5%" in line and "--force" in line, line  # equal updates: 22 %
    assert not out.exists()
    with pytest.warns(UserWarning, match=rf"merging anyway \(force\): the base \({experts[0]}\) is not the most"):
        assert main([*argv, "--force"]) == 0
    record = json.loads((out / "acetools_merge.json").read_text())["lineage"]
    assert record["dist_sum"][1] < record["dist_sum"][0] and record["limits"]["central_margin"] == CENTRAL_MARGIN
    assert main(["merge", "--method", "ties", "--base", str(base), "--experts", *map(str, experts),
                 "--out", str(tmp_path / "right"), "-q"]) == 0  # the right way round


def test_a_task_model_given_as_the_base_beside_a_bare_expert_names_the_swap(world, tmp_path, capsys):
    base, experts, _ = world
    assert main(["merge", "--method", "task_arithmetic", "--base", str(experts[0]), "--experts", str(base),
                 *map(str, experts[1:]), "--out", str(tmp_path / "merged"), "-q"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"expert {base} has no task head and the base {experts[0]} has one" in err[0], err
    assert "are --base and --experts swapped?" in err[0]


def test_true_bases_on_disk_with_unequal_update_sizes_merge_without_a_word(tmp_path):
    for steps in ((0.0005, 0.002, 0.008), (0.008, 0.0005, 0.0005), (0.001, 0.001, 0.004)):
        root = tmp_path / "-".join(map(str, steps))
        root.mkdir()
        base, experts = _backbones(root, steps)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert main(["merge", "--method", "task_arithmetic", "--base", str(base), "--experts",
                         *map(str, experts), "--out", str(root / "merged"), "-q"]) == 0
        lin = json.loads((root / "merged" / "acetools_merge.json").read_text())["lineage"]
        assert min(lin["dist_sum"]) == lin["dist_sum"][0]


# --------------------------------------------------------------------------- what the configs say
def _claiming(src: Path, dst: Path, value: str, field: str = "_name_or_path") -> Path:
    """A copy of the model folder ``src`` whose config.json (or adapter_config.json) says it was loaded from
    ``value``, as transformers 4 and peft write it."""
    shutil.copytree(src, dst)
    if field == "_name_or_path":
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, "_name_or_path": value}))
    else:
        (dst / "adapter_config.json").write_text(json.dumps({field: value, "peft_type": "LORA"}))
    return dst


def test_what_names_the_base_and_what_says_nothing(backbones, tmp_path, monkeypatch):
    base, experts = backbones
    named = tmp_path / "bert-tiny-uncased"
    named.symlink_to(base, target_is_directory=True)
    ck = open_checkpoint(named)
    monkeypatch.chdir(tmp_path)
    for same in (str(named), str(base), "bert-tiny-uncased", "prajjwal1/bert-tiny-uncased", "./bert-tiny-uncased",
                 "/home/someone/models/Bert_Tiny_Uncased", "~/.cache/huggingface/hub/models--org--bert-tiny-uncased/"
                 "snapshots/0123456789abcdef0123456789abcdef01234567", "model", ""):
        assert names_same_model(same, ck), same
    for other in ("google-bert/bert-base-cased", "roberta-base", str(experts[0]), "/data/models/distilbert"):
        assert not names_same_model(other, ck), other
    assert claimed_parents(open_checkpoint(experts[0])) == []  # transformers 5 writes no _name_or_path
    said = _claiming(experts[0], tmp_path / "said", "org/x")
    assert claimed_parents(open_checkpoint(said)) == [("config.json _name_or_path", "org/x")]


@pytest.mark.parametrize("value, refused", [
    ("google-bert/bert-base-cased", True),  # a hub id of another model
    ("/home/someone/models/distilbert-base-uncased", True),  # a path on another machine, to another model
    ("{base}", False),  # the base's own path
    ("{expert}", False),  # the expert's own folder: a model loaded from itself and saved again
    ("runs/sst2/checkpoint-500", False),  # a training run's own save folder
    ("base", False),  # a generic name says nothing
])
def test_a_config_naming_another_parent_is_refused(backbones, tmp_path, capsys, value, refused):
    base, experts = backbones
    claim = _claiming(experts[1], tmp_path / "claims", value.format(base=base, expert=tmp_path / "claims"))
    argv = ["merge", "--method", "task_arithmetic", "--base", str(base), "--experts", str(experts[0]), str(claim),
            str(experts[2]), "--out", str(tmp_path / "merged"), "-q"]
    if not refused:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert main(argv) == 0
        return
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"acetools: error: expert 1 ({claim}) says it was fine-tuned from {value!r} (config.json _name_or_path), "
        f"not from the base ({base})"), err
    assert "--force" in err[0] and not (tmp_path / "merged").exists()
    with pytest.warns(UserWarning, match=r"merging anyway \(force\): expert 1 .* says it was fine-tuned from"):
        assert main([*argv, "--force"]) == 0


def test_an_adapters_base_model_is_checked_too(backbones, tmp_path):
    """A folder with adapter_config.json is read as a LoRA adapter (acetools.files.lora, whose own refusal of a
    foreign base_model_name_or_path tests/test_lora.py checks); the lineage check reads the same field from the
    folder of any checkpoint it is given, here a full checkpoint opened beside such a file."""
    base, experts = backbones
    claim = _claiming(experts[0], tmp_path / "lora", "meta-llama/Llama-3.2-3B", "base_model_name_or_path")
    full = open_checkpoint(claim / "model.safetensors")
    ck = Checkpoint(claim, full.files, full.config, claim)
    assert claimed_parents(ck) == [("adapter_config.json base_model_name_or_path", "meta-llama/Llama-3.2-3B")]
    with pytest.raises(InputError, match=r"expert 0 \(.*lora\) says it was fine-tuned from 'meta-llama/Llama-3.2-3B' "
                                         r"\(adapter_config.json base_model_name_or_path\)"):
        check_lineage(open_checkpoint(base), [ck, open_checkpoint(experts[1])], PRESETS["bert"])


def test_one_expert_swapped_is_told_by_its_config_when_the_weights_cannot(backbones, tmp_path, capsys):
    """With one expert the distances are symmetric; a base whose config names the expert as where it was
    loaded from (and an expert naming a model given as another expert) is refused."""
    base, experts = backbones
    swapped = _claiming(experts[0], tmp_path / "ft", str(base))
    lin = measure_lineage(open_checkpoint(swapped), [open_checkpoint(base)], PRESETS["bert"])
    assert lin.central_gap(0) == 0 and lin.most_central() is None
    assert main(["merge", "--method", "task_arithmetic", "--base", str(swapped), "--experts", str(base),
                 "--out", str(tmp_path / "merged"), "-q"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and (f"the base ({swapped}) says it was fine-tuned from expert 0 ({base}) "
                              f"(config.json _name_or_path '{base}'): is it the base?") in err[0], err
    sibling = _claiming(experts[1], tmp_path / "ft2", str(experts[0]))
    with pytest.raises(InputError, match=rf"expert 1 \({sibling}\) says it was fine-tuned from '{experts[0]}', given "
                                         r"as expert 0 "):
        check_lineage(open_checkpoint(experts[2]), [open_checkpoint(experts[0]), open_checkpoint(sibling)],
                      PRESETS["bert"])


def test_the_committed_calibration_separates_true_swapped_and_foreign_bases_at_todays_limits():
    """benchmarks/results/lineage/thresholds.json (docs/your-models.md §Bases and experts are checked): its
    limits are the module's, and at them every true base passes, every foreign base is refused as unrelated
    and every swap of the text world's and MiniLM's experts as swapped, the margin between the two gaps."""
    record = json.loads((Path(__file__).parents[1] / "benchmarks/results/lineage/thresholds.json").read_text())
    assert record["limits"] == {"ratio": RATIO_LIMIT, "shared_ratio": SHARED_RATIO_LIMIT, "cosine": COSINE_LIMIT,
                                "central_margin": CENTRAL_MARGIN}
    rows = record["rows"]
    assert {r["case"] for r in rows} >= {"minilm-12", "minilm-mixed", "text-quick", "text-quick-few",
                                         "text-quick-mixed", "text-quick-mixed-rev"}
    kinds = {"true parent": None, "random-init": "unrelated", "random-matched": "unrelated", "swapped": "swapped"}
    for r in rows:
        assert r["refused"] == kinds[r["base"].split(":")[0]], r
    true_gap = max(r["central_gap"] for r in rows if r["base"] == "true parent")
    swap_gaps = {(r["case"], r["base"]): 0.0 for r in rows if r["base"].startswith("swapped")}
    for r in rows:
        if r["base"].startswith("swapped"):
            swap_gaps[r["case"], r["base"]] = max(swap_gaps[r["case"], r["base"]], r["central_gap"])
    assert true_gap < 0 < CENTRAL_MARGIN < min(swap_gaps.values()) and len(swap_gaps) == 18
