"""Non-persistent buffers one side saved and the other did not (acetools/files/buffers.py; docs/your-models.md
§What can be read): carried from whichever side has them, with one log line; a missing weight stays an error.
The slow tests use the shipped MiniLM folder as the base and experts saved by the installed transformers.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from acetools.cli import main
from acetools.errors import InputKeyError
from acetools.files.buffers import NON_PERSISTENT_BUFFERS, carry_missing_buffers, is_non_persistent
from acetools.files.checkpoints import open_checkpoint
from acetools.files.diagnose import check_inputs
from acetools.files.merge_files import merge_files
from acetools.layouts import TensorMeta
from acetools.merging import METHODS

from .minilm_files import TASKS, minilm_world

#: The methods that merge files without data inputs (activations, Gram matrices).
DATA_FREE = [m for m in METHODS if not METHODS[m].data_inputs]


def test_the_rules_by_name_dtype_and_rank():
    def np(key, shape, dtype):
        return is_non_persistent(key, TensorMeta(shape, dtype))

    assert np("bert.embeddings.position_ids", (1, 512), torch.int64)
    assert np("embeddings.token_type_ids", (1, 512), torch.int64)
    assert np("vision_model.embeddings.position_ids", (1, 50), torch.int64)
    assert np("transformer.h.0.attn.bias", (1, 1, 8, 8), torch.bool)
    assert np("h.3.attn.bias", (1, 1, 8, 8), torch.float32)  # the float mask of GPT-2's first checkpoints
    assert np("transformer.h.0.attn.attention.bias", (1, 1, 8, 8), torch.bool)  # GPT-Neo
    assert np("transformer.h.0.attn.masked_bias", (), torch.float32)
    assert np("model.layers.0.self_attn.rotary_emb.inv_freq", (32,), torch.float32)
    # real weights never are, whatever their name
    assert not np("transformer.h.0.attn.c_attn.bias", (12,), torch.float32)
    assert not np("h.0.attn.bias", (12,), torch.float32)  # a 1-D attn.bias is a weight
    assert not np("embeddings.position_ids", (1, 6), torch.float32)  # position_ids are integers
    assert not np("embeddings.position_embeddings.weight", (6, 4), torch.float32)
    assert not np("model.layers.0.self_attn.rotary_emb.inv_freq", (32,), torch.int64)
    assert all(what for *_, what in NON_PERSISTENT_BUFFERS)


def _tiny(tmp_path: Path, base_extra: dict, expert_extra: list[dict], n: int = 2) -> tuple[Path, list[Path]]:
    """A two-matrix base and ``n`` experts as safetensors files, each with its own extra keys."""
    g = torch.Generator().manual_seed(0)
    core = {"h.0.attn.c_attn.weight": torch.randn(4, 12, generator=g),
            "h.0.attn.c_attn.bias": torch.randn(12, generator=g), "h.0.mlp.c_fc.weight": torch.randn(4, 8, generator=g)}
    save_file({**core, **base_extra}, tmp_path / "base.safetensors")
    paths = []
    for t in range(n):
        e = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in core.items()}
        save_file({**e, **expert_extra[t]}, tmp_path / f"e{t}.safetensors")
        paths.append(tmp_path / f"e{t}.safetensors")
    return tmp_path / "base.safetensors", paths


def test_buffers_missing_from_the_experts_come_from_the_base(tmp_path, caplog):
    mask = torch.tril(torch.ones(1, 1, 5, 5, dtype=torch.bool))
    extra = {"embeddings.position_ids": torch.arange(6)[None], "h.0.attn.bias": mask,
             "h.0.attn.masked_bias": torch.tensor(-1e4)}
    base, experts = _tiny(tmp_path, extra, [{}, {"h.0.attn.bias": mask}])
    with caplog.at_level(logging.INFO, logger="acetools.files.buffers"):
        res = merge_files("ties", base, experts, tmp_path / "out", layout="gpt2")
    lines = [r.getMessage() for r in caplog.records if r.name == "acetools.files.buffers"]
    assert len(lines) == 2, lines  # one line per set of keys missing: expert 0 lacks three, expert 1 two
    assert re.match(r"buffers 'embeddings.position_ids', '[^']+' \(and 1 more\) missing from expert 0 ", lines[0])
    assert "missing from expert 1" in lines[1] and lines[1].endswith("carried from the base")
    out = open_checkpoint(tmp_path / "out").state_dict()
    assert list(out) == list(open_checkpoint(base).keys())  # the base's keys, in its order
    assert torch.equal(out["embeddings.position_ids"], extra["embeddings.position_ids"])
    assert torch.equal(out["h.0.attn.bias"], mask) and out["h.0.attn.masked_bias"].item() == -1e4
    carried = [r["key"] for r in res.plan.rows if r["path"] == "carried from base"]
    assert sorted(carried) == sorted(extra)  # the float masked_bias too: never merged
    assert res.info["buffers_carried"] == dict.fromkeys(extra, "the base")
    assert "buffers: 3 non-persistent buffer(s) missing from some models" in res.plan.summary()


def test_buffers_the_base_lacks_come_from_the_first_expert_that_has_them(tmp_path, caplog):
    inv = 1.0 / 10000 ** (torch.arange(0, 4, 2) / 4)
    base, experts = _tiny(tmp_path, {}, [{}, {"embeddings.position_ids": torch.arange(6)[None],
                                              "layers.0.rotary_emb.inv_freq": inv}, {}], n=3)
    with caplog.at_level(logging.INFO, logger="acetools.files.buffers"):
        res = merge_files("task_arithmetic", base, experts, tmp_path / "out", layout="gpt2")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "acetools.files.buffers"]
    assert re.search(r"missing from the base, expert 0 \(.*e0.safetensors\), expert 2 .* carried from expert 1$",
                     line)
    out = open_checkpoint(tmp_path / "out").state_dict()
    assert torch.equal(out["embeddings.position_ids"], torch.arange(6)[None])
    assert torch.equal(out["layers.0.rotary_emb.inv_freq"], inv)  # exactly the value the expert saved
    assert res.info["buffers_carried"] == {"embeddings.position_ids": "expert 1",
                                           "layers.0.rotary_emb.inv_freq": "expert 1"}


def test_a_missing_weight_stays_an_error(tmp_path):
    base, experts = _tiny(tmp_path, {"h.0.ln.weight": torch.ones(4)}, [{}, {}])
    with pytest.raises(InputKeyError, match=r"is missing key 'h.0.ln.weight'"):
        merge_files("ties", base, experts, tmp_path / "out", layout="gpt2")
    # named like a buffer, but float: a weight, not recomputed at load time
    base, experts = _tiny(tmp_path, {"embeddings.position_ids": torch.arange(6.0)[None]}, [{}, {}])
    with pytest.raises(InputKeyError, match=r"is missing key 'embeddings.position_ids'"):
        merge_files("ties", base, experts, tmp_path / "out", layout="gpt2")
    assert not (tmp_path / "out").exists()


def test_carry_on_checkpoints_and_in_diagnose(tmp_path, caplog):
    base, experts = _tiny(tmp_path, {"embeddings.position_ids": torch.arange(6)[None]}, [{}, {}])
    b, ex, carried = carry_missing_buffers(open_checkpoint(base), [open_checkpoint(e) for e in experts])
    assert carried == {"embeddings.position_ids": "the base"} and set(b.keys()) == set(ex[0].keys())
    assert torch.equal(ex[1].get("embeddings.position_ids"), torch.arange(6)[None])
    same = carry_missing_buffers(b, ex)
    assert same[2] == {} and same[0] is b and same[1] == ex  # nothing missing: the models unchanged
    with caplog.at_level(logging.INFO, logger="acetools.files.buffers"):
        info = check_inputs(base, experts, layout="gpt2")
    assert info["n_tasks"] == 2 and any("carried from the base" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_gpt2_base_saved_with_its_masks_merges_like_one_without_them(tmp_path):
    """A GPT-2 base as the first GPT-2 checkpoints were saved (float ``attn.bias`` masks and ``masked_bias``
    in the file) with experts saved by the installed transformers: every method gives the weights it gives
    on the base without them, the masks are written as the base has them, and the output loads back."""
    transformers = pytest.importorskip("transformers")
    from acetools.layouts import get_layout

    from .test_merge_files import _data_inputs, _hf_world

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    with _quiet():
        plain, experts = _hf_world(tmp_path, transformers.GPT2LMHeadModel(cfg).eval())
    old = tmp_path / "old"
    shutil.copytree(plain, old)
    sd = open_checkpoint(plain).state_dict()
    masks = {f"transformer.h.{i}.attn.{k}": v for i in range(2) for k, v in (
        ("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)), ("masked_bias", torch.tensor(-1e4)))}
    save_file({**sd, **masks}, old / "model.safetensors", metadata={"format": "pt"})
    lay = get_layout("gpt2", keys=list(sd))
    for method in METHODS:
        hp = {**({"steps": 3} if method == "wudi" else {}), **_data_inputs(method, sd, lay, len(experts))}
        got = merge_files(method, old, experts, tmp_path / f"{method}-old", hparams=hp, hash_inputs=False)
        assert got.info["buffers_carried"] == dict.fromkeys(masks, "the base"), method
        merge_files(method, plain, experts, tmp_path / method, hparams=hp, hash_inputs=False)
        ref = open_checkpoint(tmp_path / method).state_dict()
        out = open_checkpoint(tmp_path / f"{method}-old").state_dict()
        assert out.keys() == {*ref, *masks}, method
        assert all(torch.equal(out[k], ref[k]) for k in ref), method
        assert all(torch.equal(out[k], v) for k, v in masks.items()), method
        with _quiet():
            _, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / f"{method}-old",
                                                                   output_loading_info=True)
        assert not info["missing_keys"] and not info["mismatched_keys"], (method, info)


# --------------------------------------------------------------------------- the shipped MiniLM, transformers 5
@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    pytest.importorskip("transformers")
    return minilm_world(tmp_path_factory.mktemp("minilm"))


@pytest.mark.slow
def test_minilm_files_as_they_are_saved(minilm):
    """The base's file holds ``embeddings.position_ids`` (saved by transformers 4.8); the experts', saved
    by the installed transformers, do not (transformers 5 writes no non-persistent buffer)."""
    import transformers

    base, experts = minilm
    assert "embeddings.position_ids" in open_checkpoint(base)
    if int(transformers.__version__.split(".")[0]) >= 5:
        assert all("bert.embeddings.position_ids" not in open_checkpoint(e) for e in experts)


@pytest.mark.slow
@pytest.mark.parametrize("method", DATA_FREE)
def test_every_data_free_method_merges_minilm_and_loads_back(minilm, tmp_path, method):
    import transformers

    from acetools.files.heads import load_with_head

    base, experts = minilm
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    out = tmp_path / method
    hp = {"steps": 3} if method == "wudi" else None  # a few Adam steps: the merge, not WUDI's fit, is tested
    res = merge_files(method, base, experts, out, hparams=hp, hash_inputs=False)
    assert res.info["buffers_carried"] == {"bert.embeddings.position_ids": "the base"}
    with _quiet():
        loaded: Any = transformers.BertModel.from_pretrained(out, output_loading_info=True)
    model, info = loaded
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    assert torch.isfinite(model(input_ids=ids).last_hidden_state).all()
    for name, n in TASKS:
        assert load_with_head(out, name)(input_ids=ids).logits.shape == (1, n), name


def _quiet():
    from acetools.files.heads import _quiet_transformers

    return _quiet_transformers()


def _section(name: str) -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "your-models.md").read_text()
    return text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.slow
def test_the_per_task_heads_examples_run_as_written(minilm, tmp_path, monkeypatch):
    """docs/your-models.md §Per-task heads: its commands and its Python block, with models/base the shipped
    MiniLM and models/sst2, agnews, emotion its experts with 2, 4 and 5 labels saved by transformers; the
    folders of --per-task-out load with plain from_pretrained and give load_with_head's logits."""
    import transformers

    from acetools.files.heads import load_with_head

    section = _section("Per-task heads")
    commands = re.findall(r"```bash\n(acetools merge .*?)\n```", section, flags=re.S)
    (python,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(commands) == 2 and "--per-task-out tasks" in commands[1]
    base, experts = minilm
    models = tmp_path / "models"
    models.mkdir()
    (models / "base").symlink_to(base)
    for name, expert in zip(("sst2", "agnews", "emotion"), experts):  # 2, 4 and 5 labels
        (models / name).symlink_to(expert)
    for i, run in enumerate([*commands, python]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "models").symlink_to(models)
        monkeypatch.chdir(tmp_path / str(i))
        if run is python:
            scope: dict = {}
            exec(compile(run, "docs/your-models.md", "exec"), scope)  # noqa: S102 - the documented block
            assert scope["logits"].shape == (1, 4) and set(scope["heads"]) == {"sst2", "agnews", "emotion"}
        else:
            assert main(shlex.split(run.replace("\\\n", " "), comments=True)[1:] + ["-q"]) == 0
        info = json.loads((tmp_path / str(i) / "merged" / "acetools_merge.json").read_text())
        assert info["buffers_carried"] == {"bert.embeddings.position_ids": "the base"}
        assert info["heads"]["mode"] == "per-task"
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    for name, n in (("sst2", 2), ("agnews", 4), ("emotion", 5)):
        with _quiet():
            model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "1" / "tasks" / name)
        ref = load_with_head(tmp_path / "1" / "merged", name)
        mine, theirs = model.state_dict(), ref.state_dict()
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
        with torch.no_grad():
            logits = model.eval()(input_ids=ids).logits
            # the same weights (bitwise); the logits to float32 rounding (the kernels see other memory layouts)
            torch.testing.assert_close(logits, ref(input_ids=ids).logits)
        assert logits.shape == (1, n)


@pytest.mark.slow
def test_the_search_worked_example_runs_on_the_shipped_minilm(minilm, tmp_path, monkeypatch, capsys):
    """docs/your-models.md §Coefficients chosen by your evaluation: its eval.py and command as written, with
    minilm the shipped MiniLM folder (its own tokenizer) and ft_a, ft_b, ft_c saved by transformers."""
    section = _section("Coefficients chosen by your evaluation")
    (python,) = re.findall(r"```python\n(# eval\.py.*?)```", section, flags=re.S)
    (command,) = re.findall(r"```bash\n(acetools merge .*?)\n```", section, flags=re.S)
    base, experts = minilm
    for p in (base, *experts):
        (tmp_path / p.name).symlink_to(p)
    words = "good bad fine terrible great awful nice poor".split()
    g = torch.Generator().manual_seed(0)
    val = {name: {"texts": [" ".join(words[int(i)] for i in torch.randint(0, 8, (5,), generator=g))
                            for _ in range(6)],
                  "labels": torch.randint(0, n, (6,), generator=g).tolist()} for name, n in TASKS}
    (tmp_path / "val.json").write_text(json.dumps(val))
    (tmp_path / "eval.py").write_text(python)
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command)[1:] + ["-q"]) == 0
    info = json.loads((tmp_path / "merged" / "acetools_merge.json").read_text())
    assert info["buffers_carried"] == {"bert.embeddings.position_ids": "the base"}
    assert set(info["search"]["trace"][0]["scores"]) == {name for name, _ in TASKS}
    assert "chosen lam=" in capsys.readouterr().out
