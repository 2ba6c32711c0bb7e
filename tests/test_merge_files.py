"""Merging checkpoints from files: tiny random HF / open_clip models on disk, the CLI, streaming.

Every model is built from a config in the test (no download; HF_HUB_OFFLINE=1), saved as its
library saves it, merged through ``acetools merge`` and loaded back with strict key checks.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from acetools.cli import main
from acetools.files.checkpoints import ShardedWriter, open_checkpoint, parse_size
from acetools.files.merge_files import load_config, merge_files, parse_hparam
from acetools.merging import merge
from tests.merge_helpers import perturbed, random_data_inputs

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

N_EXPERTS = 3


def _save_hf(model, root, name):
    path = root / name
    model.save_pretrained(path, safe_serialization=True)
    return path


def _hf_world(tmp_path, model):
    base = _save_hf(model, tmp_path, "base")
    experts = [_save_hf(perturbed(model, 10 + t), tmp_path, f"expert{t}") for t in range(N_EXPERTS)]
    return base, experts


def _states(base, experts):
    return open_checkpoint(base).state_dict(), [open_checkpoint(e).state_dict() for e in experts]


def _cli(*args):
    assert main(["merge", *map(str, args)]) == 0


def _load_strict(cls, out):
    model, info = cls.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model


@pytest.fixture(scope="module")
def gpt2_model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.fixture
def gpt2_files(tmp_path, gpt2_model):
    return _hf_world(tmp_path, gpt2_model)


def test_gpt2_cli_tsv_m_loads_strictly_and_matches_in_memory(tmp_path, gpt2_files):
    base, experts = gpt2_files
    out = tmp_path / "merged"
    _cli("--method", "tsv_m", "--base", base, "--experts", *experts, "--out", out, "-p", "alpha=0.8")
    model = _load_strict(transformers.GPT2LMHeadModel, out)
    b, ex = _states(base, experts)
    assert "lm_head.weight" not in b  # HF saves the tied head once
    ref = merge("tsv_m", b, ex, layout="gpt2", alpha=0.8)
    sd = model.state_dict()
    for k, v in ref.items():
        assert torch.equal(sd[k], v), k
    assert torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    # the Conv1D weights were merged as d_out x d_in: transposing every input gives the transposed result
    key = "transformer.h.0.attn.c_attn.weight"
    flipped = merge("tsv_m", {key: b[key].T.contiguous()}, [{key: e[key].T.contiguous()} for e in ex],
                    layout="generic", alpha=0.8)
    torch.testing.assert_close(sd[key], flipped[key].T, rtol=1e-5, atol=1e-6)
    meta = json.loads((out / "acetools_merge.json").read_text())
    assert meta["method"] == "tsv_m" and meta["layout"] == "gpt2" and meta["driver"] == "stream"
    assert len(meta["inputs"]["sha256"]) == N_EXPERTS + 1
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        header = fh.metadata()
    assert header["acetools.method"] == "tsv_m" and json.loads(header["acetools.hparams"]) == {"alpha": 0.8}
    assert (out / "config.json").is_file()


STREAMABLE = [
    ("weight_averaging", {}),
    ("task_arithmetic", {"lam": 0.4}),
    ("ties", {"k": 30}),
    ("ties", {"k": 30, "scope": "tensor", "merge": "sum"}),
    ("dare", {"p": 0.3, "seed": 1}),
    ("dare", {"p": 0.3, "base_method": "ties", "k": 40}),
    ("tsv_m", {}),
    ("iso_c", {}),
    ("iso_cts", {}),
    ("cart", {}),
    ("wudi", {"steps": 3}),
    ("ace", {}),
    ("ace", {"estimator": "wudi", "k_frac": 0.5}),
]


@pytest.mark.parametrize("method, hp", STREAMABLE, ids=[f"{m}-{i}" for i, (m, _) in enumerate(STREAMABLE)])
def test_streaming_equals_in_memory(tmp_path, gpt2_files, method, hp):
    base, experts = gpt2_files
    s = merge_files(method, base, experts, tmp_path / "s", hparams=hp, mode="stream", shard_size="10KB")
    m = merge_files(method, base, experts, tmp_path / "m", hparams=hp, mode="memory")
    assert s.plan.mode == "stream" and m.plan.mode == "memory" and len(s.files) > 2  # sharded, with an index
    a, b = open_checkpoint(tmp_path / "s").state_dict(), open_checkpoint(tmp_path / "m").state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _data_inputs(method, base_sd, lay, n_tasks):
    """Random data inputs for whatever ``method`` declares (Grams or activations of its matrix keys)."""
    widths = {k: lay.to_canonical(k, w).shape[1] for k, w in base_sd.items() if lay.is_matrix(k, w)}
    return random_data_inputs(method, widths, lay.name, n_tasks)


def test_every_method_in_memory_equals_the_file_merge(tmp_path, gpt2_files):
    """One driver: ``acetools.merge`` on state dicts and ``acetools merge`` on the files give the same weights, for
    every registered method (streamed where the method allows it, else its whole-model call)."""
    from acetools.layouts import get_layout
    from acetools.merging import METHODS

    base, experts = gpt2_files
    b, ex = _states(base, experts)
    lay = get_layout("gpt2", keys=list(b))
    for method in METHODS:
        hp = {**({"steps": 3} if method == "wudi" else {}), **_data_inputs(method, b, lay, len(ex))}
        res = merge_files(method, base, experts, tmp_path / method, hparams=hp)
        assert res.plan.mode == ("memory" if METHODS[method].key_scope(hp)[0] == "model" else "stream"), method
        got = open_checkpoint(tmp_path / method).state_dict()
        ref = merge(method, b, ex, layout="gpt2", **hp)
        assert got.keys() == ref.keys(), method
        for k in ref:
            assert torch.equal(got[k], ref[k]), (method, k)


def test_global_ties_threshold_is_exact(tmp_path, gpt2_files):
    """The streamed radix-select threshold equals the sort-based one, also with ties in |tau|."""
    from acetools.merging.ties import radix_thresholds, trim_threshold

    g = torch.Generator().manual_seed(0)
    parts = {"a": torch.randn(7, 5, generator=g), "b": torch.randn(40, generator=g).round(decimals=1),
             "c": torch.zeros(3), "d": -torch.randn(4, 4, generator=g).double().float()}
    n = sum(p.numel() for p in parts.values())
    for k in (0.5, 10, 20, 33.3, 99, 100):
        got = radix_thresholds(list(parts), lambda key: [parts[key], 2 * parts[key]], 2, k, torch.float32, n,
                               lambda it, desc: it)
        assert got[0].item() == trim_threshold(parts.values(), k).item()
        assert got[1].item() == trim_threshold([2 * p for p in parts.values()], k).item()


def test_esm_runs_in_memory_from_files(tmp_path, gpt2_files):
    base, experts = gpt2_files
    res = merge_files("esm", base, experts, tmp_path / "esm", hparams={"decomposition": "svd"})
    assert res.plan.mode == "memory" and "inter-layer polarization" in res.plan.scope_reason
    out = open_checkpoint(tmp_path / "esm").state_dict()
    ref = merge("esm", *_states(base, experts), layout="gpt2", decomposition="svd")
    assert all(torch.equal(out[k], ref[k]) for k in ref)


def test_regmean_and_ace_given_stream_with_per_key_inputs(tmp_path, gpt2_files):
    base, experts = gpt2_files
    key = "transformer.h.1.mlp.c_fc.weight"  # stored 16 x 64 (in x out): d_in = 16
    g = torch.Generator().manual_seed(3)
    grams = []
    for _ in experts:
        X = torch.randn(40, 16, generator=g)
        grams.append({key: X.T @ X})
    for method, hp in (("regmean", {"grams": grams}), ("ace", {"estimator": "given", "covariances": grams})):
        s = merge_files(method, base, experts, tmp_path / f"s{method}", hparams=hp, mode="stream")
        m = merge_files(method, base, experts, tmp_path / f"m{method}", hparams=hp, mode="memory")
        assert (s.plan.mode, m.plan.mode) == ("stream", "memory")
        a, b = (open_checkpoint(tmp_path / f"{x}{method}").state_dict() for x in "sm")
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert not torch.equal(a[key], merge("weight_averaging", *_states(base, experts), layout="gpt2")[key])
    with pytest.raises(KeyError, match="transformer.h.1.mlp.c_fx.weight"):
        merge_files("regmean", base, experts, tmp_path / "bad", hparams={"grams": [{key.replace("c_fc", "c_fx"): v[key]}
                                                                                  for v in grams]})


def test_mergekit_oracle_task_arithmetic_and_ties(tmp_path, gpt2_files):
    """mergekit on the same files: its merge functions (task arithmetic; TIES per tensor, dis-mean)."""
    api = pytest.importorskip("mergekit.merge_methods.api")
    base, experts = gpt2_files
    b, ex = _states(base, experts)
    _cli("--method", "task_arithmetic", "--base", base, "--experts", *experts, "--out", tmp_path / "ta",
         "-p", "lam=0.7")
    _cli("--method", "ties", "--base", base, "--experts", *experts, "--out", tmp_path / "ties",
         "-p", "k=25", "-p", "scope=tensor", "-p", "lam=0.8")
    ta, ti = open_checkpoint(tmp_path / "ta").state_dict(), open_checkpoint(tmp_path / "ties").state_dict()
    for k in b:
        if not b[k].is_floating_point():
            continue
        ts = [b[k]] + [e[k] for e in ex]
        ref = api.merge_tensors(ts, "task_arithmetic", base_index=0, parameters={"weight": 1.0, "lambda": 0.7})
        torch.testing.assert_close(ta[k] - b[k], ref - b[k], rtol=0, atol=1e-5 * float((ref - b[k]).abs().max()) + 1e-7)
        ref = api.merge_tensors(ts, "ties", base_index=0, parameters={"weight": 1.0, "density": 0.25, "lambda": 0.8})
        torch.testing.assert_close(ti[k] - b[k], ref - b[k], rtol=0, atol=1e-5 * float((ref - b[k]).abs().max()) + 1e-7)


def test_clip_vision_ace_and_dry_run(tmp_path, capsys):
    torch.manual_seed(1)
    cfg = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, image_size=16, patch_size=8)
    base, experts = _hf_world(tmp_path, transformers.CLIPVisionModel(cfg).eval())
    _cli("--method", "ace", "--base", base, "--experts", *experts, "--dry-run")
    text = capsys.readouterr().out
    assert "layout hf_clip" in text and not (tmp_path / "merged").exists()
    row = next(line for line in text.splitlines() if "embeddings.position_embedding.weight" in line)
    assert "embedding" in row and "elementwise" in row
    _cli("--method", "ace", "--base", base, "--experts", *experts, "--out", tmp_path / "merged")
    model = _load_strict(transformers.CLIPVisionModel, tmp_path / "merged")
    b, ex = _states(base, experts)
    ref = merge("ace", b, ex, layout="hf_clip")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ref.items())
    x = torch.randn(1, 3, 16, 16)
    assert torch.isfinite(model(pixel_values=x).pooler_output).all()


def test_dry_run_memory_estimate_adds_the_process_the_tensors_and_the_hashing(tmp_path, gpt2_files, monkeypatch):
    """The dry run's peak estimate (docs/your-models.md §Memory: streaming and what each method holds): the
    process's resident size now + (T + 2) x the largest tensor streamed (W0 and the update of every key in
    memory) + one hashing window per thread."""
    import re

    import acetools.files.merge_files as mf

    base, experts = gpt2_files
    assert 10e6 < mf.resident_bytes() < 1e12  # this test process, torch loaded
    monkeypatch.setattr(mf, "resident_bytes", lambda: 500_000_000)
    monkeypatch.setattr(mf.os, "cpu_count", lambda: 2)
    largest = 4 * 64 * 16  # wte, 64 x 16 float32
    model = sum(4 * math.prod(m.shape) for m in open_checkpoint(base).metas().values() if m.dtype.is_floating_point)
    for method, held in (("ties", 5 * largest), ("tsv_m", None)):
        plan = merge_files(method, base, experts, dry_run=True, mode="memory" if held is None else "auto").plan
        text = plan.memory_text("transformer.wte.weight")
        total = 500_000_000 + (held if held is not None else 2 * model + 3 * largest) + 2 * (1 << 24)
        assert re.match(rf"about {total / 1e6:.1f} MB at the peak: this process now \(Python, torch, acetools\) "
                        rf"500.0 MB \+ .* \+ hashing the inputs 33.6 MB \(2 x 16.8 MB windows\)", text), text


def test_roberta_embeddings_and_head_are_not_matrices(tmp_path):
    torch.manual_seed(2)
    cfg = transformers.RobertaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=24, type_vocab_size=1, num_labels=3)
    base, experts = _hf_world(tmp_path, transformers.RobertaForSequenceClassification(cfg).eval())
    # heads="auto" keeps a classifier's heads per task (tests/test_heads.py); merged when asked
    _cli("--method", "tsv_m", "--base", base, "--experts", *experts, "--out", tmp_path / "merged", "--heads", "merge")
    model = _load_strict(transformers.RobertaForSequenceClassification, tmp_path / "merged")
    sd = model.state_dict()
    b, ex = _states(base, experts)
    for k in ("roberta.embeddings.token_type_embeddings.weight", "roberta.embeddings.word_embeddings.weight",
              "classifier.dense.weight", "classifier.out_proj.weight"):
        mean = b[k] + torch.stack([e[k] - b[k] for e in ex]).mean(0)  # the elementwise rule, not TSV-M
        torch.testing.assert_close(sd[k], mean, rtol=1e-6, atol=1e-7)
        assert not torch.equal(sd[k], b[k])


def test_llama_yaml_config_sharded_bf16(tmp_path):
    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    base, experts = _hf_world(tmp_path, transformers.LlamaForCausalLM(cfg).eval())
    conf = tmp_path / "merge.yaml"
    conf.write_text("method: iso_cts\nbase: base\nexperts: [expert0, expert1, expert2]\nout: merged\n"
                    "hyperparameters: {alpha: 1.2}\nlayout: auto\ndtype: bf16\nshard_size: 8KB\n")
    _cli(conf)
    out = tmp_path / "merged"
    assert (out / "model.safetensors.index.json").is_file()
    model = _load_strict(transformers.LlamaForCausalLM, out)
    b, ex = _states(base, experts)
    ref = merge("iso_cts", b, ex, layout="llama", alpha=1.2)
    sd = model.state_dict()
    for k, v in ref.items():
        assert open_checkpoint(out).meta(k).dtype == torch.bfloat16
        assert torch.equal(sd[k].to(torch.bfloat16), v.to(torch.bfloat16)), k
    assert open_checkpoint(out).config["model_type"] == "llama"


def _tiny_open_clip():
    from open_clip.model import CLIP

    torch.manual_seed(4)
    return CLIP(embed_dim=8, vision_cfg={"image_size": 16, "patch_size": 8, "width": 16, "layers": 1, "head_width": 8},
                text_cfg={"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}).eval()


def test_open_clip_pt_and_safetensors_default_rule(tmp_path):
    from safetensors.torch import save_file

    model = _tiny_open_clip()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    # a training checkpoint: {"state_dict": {"module.<key>": ...}, "epoch": ...}
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in sd.items()}}, tmp_path / "base.pt")
    experts = []
    for t in range(N_EXPERTS):
        e = {k: v.clone().contiguous() for k, v in perturbed(model, 20 + t).state_dict().items()}
        save_file(e, tmp_path / f"e{t}.safetensors")
        experts.append(tmp_path / f"e{t}.safetensors")
    _cli("--method", "ace", "--base", tmp_path / "base.pt", "--experts", *experts, "--out", tmp_path / "merged")
    merged = open_checkpoint(tmp_path / "merged").state_dict()
    fresh = _tiny_open_clip()
    fresh.load_state_dict(merged, strict=True)
    ex = [open_checkpoint(e).state_dict() for e in experts]
    ref = merge("ace", sd, ex)  # the default (open_clip) rule: visual.proj and embeddings as matrices
    assert all(torch.equal(merged[k], ref[k]) for k in ref)
    assert json.loads((tmp_path / "merged" / "acetools_merge.json").read_text())["layout"] == "open_clip"


def test_buffers_carried_and_ties_confirmed(tmp_path):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    w = torch.randn(6, 4, generator=g)
    base = {"lm_head.weight": w, "transformer.wte.weight": w.clone(), "transformer.h.0.attn.c_attn.weight":
            torch.randn(4, 12, generator=g), "bn.num_batches_tracked": torch.tensor(7),
            "embeddings.position_ids": torch.arange(6)}
    paths = []
    for t in range(2):
        e = {k: (v + 0.1 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone())
             for k, v in base.items()}
        e["lm_head.weight"] = e["transformer.wte.weight"].clone()
        e["bn.num_batches_tracked"] = torch.tensor(7 + t)
        save_file(e, tmp_path / f"e{t}.safetensors")
        paths.append(tmp_path / f"e{t}.safetensors")
    save_file(base, tmp_path / "b.safetensors")
    with pytest.warns(UserWarning, match=r"'bn.num_batches_tracked' differs from the base in experts \[1\]"):
        res = merge_files("ties", tmp_path / "b.safetensors", paths, tmp_path / "out", layout="gpt2")
    out = open_checkpoint(tmp_path / "out").state_dict()
    assert out.keys() == base.keys()
    assert torch.equal(out["lm_head.weight"], out["transformer.wte.weight"])
    assert out["bn.num_batches_tracked"].item() == 7 and torch.equal(out["embeddings.position_ids"], torch.arange(6))
    assert res.info["tied"] == {"lm_head.weight": "transformer.wte.weight"}
    assert res.info["buffers_changed"] == {"bn.num_batches_tracked": [1]}
    with pytest.warns(UserWarning, match="num_batches_tracked"):
        mem = merge_files("ties", tmp_path / "b.safetensors", paths, tmp_path / "mem", layout="gpt2", mode="memory")
    assert (mem.info["tied"], mem.info["buffers_changed"]) == (res.info["tied"], res.info["buffers_changed"])
    with pytest.warns(UserWarning):
        ref = merge("ties", base, [open_checkpoint(p).state_dict() for p in paths], layout="gpt2")
    assert all(torch.equal(out[k], ref[k]) for k in ref)


def test_errors_name_the_input(tmp_path, gpt2_files):
    base, experts = gpt2_files
    with pytest.raises(FileNotFoundError, match="checkpoint not found: .*nope"):
        merge_files("ties", base, [tmp_path / "nope"], tmp_path / "o")
    with pytest.raises(ValueError, match="holds the input checkpoint"):
        merge_files("ties", base, experts, base)
    with pytest.raises(ValueError, match="unknown merge method 'tie'"):
        merge_files("tie", base, experts, tmp_path / "o")
    with pytest.raises(ValueError, match="esm cannot stream"):
        merge_files("esm", base, experts, tmp_path / "o", mode="stream")
    with pytest.raises(ValueError, match="unknown layout 'gpt3'"):
        merge_files("ties", base, experts, tmp_path / "o", layout="gpt3")
    other = tmp_path / "other"
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=8, n_layer=2,
                                                                 n_head=2))
    model.save_pretrained(other)
    with pytest.raises(ValueError, match=r"shape mismatch at key 'transformer\.[a-z0-9_.]+': base .* expert .*other"):
        merge_files("ties", base, [other], tmp_path / "o")
    merge_files("task_arithmetic", base, experts, tmp_path / "o")
    with pytest.raises(FileExistsError, match="already holds weights"):
        merge_files("task_arithmetic", base, experts, tmp_path / "o")
    merge_files("task_arithmetic", base, experts, tmp_path / "o", overwrite=True, shard_size="30KB")
    assert not (tmp_path / "o" / "model.safetensors").exists()  # the stale single file went with the overwrite
    pickled = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), pickled)
    with pytest.raises(ValueError, match="weights_only=True"):
        merge_files("ties", pickled, [pickled], tmp_path / "p")
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: ties\nbase: b\nexpert: [x]\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['expert'\]"):
        load_config(bad)


def test_small_helpers(tmp_path):
    assert parse_size("5GB") == 5_000_000_000 and parse_size("2GiB") == 2 * 1024**3 and parse_size(1000) == 1000
    with pytest.raises(ValueError, match="not a size"):
        parse_size("five")
    assert parse_hparam("k=20") == ("k", 20) and parse_hparam("scope=tensor") == ("scope", "tensor")
    assert parse_hparam("gate=on") == ("gate", "on") and parse_hparam("prior=false") == ("prior", False)
    with ShardedWriter(tmp_path / "w", shard_size=10) as w:
        w.add("a", torch.zeros(3))
        w.add("b", torch.ones(2))
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    with pytest.raises(RuntimeError, match="boom"), ShardedWriter(tmp_path / "x") as w:
        w.add("a", torch.zeros(3))
        raise RuntimeError("boom")
    assert list((tmp_path / "x").iterdir()) == []


def test_get_flat_reads_part_of_a_tensor_as_get_gives_it(tmp_path):
    """Checkpoint.get_flat (what diagnose reads large keys with): entries a:b of the flattened tensor, equal to
    get(); from a file at any offset and dtype, a state dict and a view; a range outside is an error naming it."""
    from safetensors.torch import save_file

    from acetools.files.checkpoints import as_checkpoint
    from acetools.files.heads import CheckpointView

    g = torch.Generator().manual_seed(0)
    sd = {"a": torch.arange(7, dtype=torch.int8), "h": torch.randn(4, 6, generator=g).bfloat16(),
          "w": torch.randn(5, 3, generator=g), "z": torch.zeros(0)}
    save_file(sd, str(tmp_path / "m.safetensors"))
    disk = open_checkpoint(tmp_path / "m.safetensors")
    for ck in (disk, as_checkpoint(sd, "sd"), CheckpointView(disk, ["a"])):
        for key, a, b in (("w", 0, 15), ("w", 4, 11), ("h", 5, 6), ("h", 3, 3), ("z", 0, 0)):
            assert torch.equal(ck.get_flat(key, a, b), ck.get(key).reshape(-1)[a:b]), (ck, key, a, b)
    with pytest.raises(ValueError, match=r"entries 10:16 are outside 'w' \(15 entries\)"):
        disk.get_flat("w", 10, 16)
    with pytest.raises(KeyError, match="per-task head key"):
        CheckpointView(disk, ["a"]).get_flat("a", 0, 1)


def test_cli_bad_input_is_one_line(tmp_path, gpt2_files, capsys):
    base, experts = gpt2_files
    assert main(["merge", "--method", "ties", "--base", str(base), "--experts", str(tmp_path / "missing"),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "checkpoint not found" in err and "missing" in err
    assert main(["merge", "--method", "ties", "--base", str(base), "--experts", str(experts[0]),
                 "-p", "k=500", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "k=500" in err
    assert main(["merge", "--method", "ties", "--base", str(base)]) == 2
    assert "merge needs --experts" in capsys.readouterr().err


def test_esm_with_an_activations_file_through_the_cli(tmp_path, gpt2_files):
    from acetools.files.merge_files import load_activations, save_activations

    base, experts = gpt2_files
    b, ex = _states(base, experts)
    g = torch.Generator().manual_seed(7)
    acts = {}
    for layer in range(2):  # ESM's targets of the gpt2 preset: c_attn and the two MLP matrices, d_in of out x in
        acts[f"transformer.h.{layer}.attn.c_attn.weight"] = [torch.randn(10, 16, generator=g) for _ in experts]
        acts[f"transformer.h.{layer}.mlp.c_fc.weight"] = [torch.randn(10, 16, generator=g) for _ in experts]
        acts[f"transformer.h.{layer}.mlp.c_proj.weight"] = [torch.randn(10, 64, generator=g) for _ in experts]
    path = save_activations(tmp_path / "acts.safetensors", acts)
    back = load_activations(path)
    assert back.keys() == acts.keys() and all(torch.equal(x, y) for k in acts for x, y in zip(acts[k], back[k]))
    _cli("--method", "esm", "--base", base, "--experts", *experts, "--out", tmp_path / "esm",
         "-p", f"activations={path}")
    out = open_checkpoint(tmp_path / "esm").state_dict()
    ref = merge("esm", b, ex, layout="gpt2", activations=acts)
    assert all(torch.equal(out[k], ref[k]) for k in ref)
    meta = json.loads((tmp_path / "esm" / "acetools_merge.json").read_text())
    assert meta["hparams"]["activations"] == str(path) and str(path) in meta["inputs"]["sha256"]
    with pytest.raises(ValueError, match=r"activations of 'transformer.h.0.attn.c_attn.weight' are given for "
                                         r"tasks \[0, 1, 2\], expected 0..1"):
        load_activations(path, n_tasks=2)



def test_streamed_task_arithmetic_checks_its_output_and_names_a_bad_input(tmp_path):
    """The streamed sum checks only the merged tensor for NaN/Inf; a bad one names the first input that has
    any (the base before the experts), or the method and key when every input is finite but the sum
    overflows. Chunks of any size give the same bits as task arithmetic on the task vectors."""
    from acetools.merging.averaging import summed
    from acetools.merging.driver import Source

    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(37, 11, generator=g), "b": torch.randn(5, generator=g), "s": torch.tensor(2.0)}
    experts = [{k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(4)]
    src = Source(base, experts)
    for k, w0 in base.items():
        ref = w0 + summed([ex[k] - w0 for ex in experts]).mul_(0.3)
        for chunk in (1, 7, 1 << 18):
            assert torch.equal(src.summed(k, 0.3, torch.device("cpu"), chunk=chunk), ref)

    def world(name, values):
        for i, v in enumerate(values):
            with ShardedWriter(tmp_path / name / f"m{i}") as w:
                w.add("w", v)
        return tmp_path / name / "m0", [tmp_path / name / f"m{i}" for i in range(1, len(values))]

    ones = torch.ones(6)
    b, ex = world("nan", [ones, ones + 1, torch.tensor([1.0, float("nan"), 2, float("inf"), 1, float("nan")]),
                          ones.clone().fill_(float("nan"))])
    with pytest.raises(ValueError, match=r"nan/m2\['w'\] contains 2 NaN and 1 Inf values"):
        merge_files("task_arithmetic", b, ex, tmp_path / "o1", force=True, hash_inputs=False)
    b, ex = world("big", [ones * -3e38, ones * 3e38, ones * 3e38])
    with pytest.raises(FloatingPointError, match="task_arithmetic produced non-finite weights at key 'w'"), \
            pytest.warns(UserWarning, match="merging anyway"):
        merge_files("task_arithmetic", b, ex, tmp_path / "o2", force=True, hash_inputs=False)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_streams_through_pinned_memory(tmp_path, gpt2_files, monkeypatch):
    """``--device cuda``: every tensor read from disk reaches the GPU through the pinned staging buffers, and the
    merge equals the CPU one (to float32 rounding)."""
    from acetools.merging import driver

    base, experts = gpt2_files
    staged = []
    to = driver.PinnedStaging.to

    def spy(self, t, device):
        out = to(self, t, device)
        staged.append(all(b is None or b.is_pinned() for b in self.buffers) and out.device.type == "cuda")
        return out

    monkeypatch.setattr(driver.PinnedStaging, "to", spy)
    for method, hp in (("task_arithmetic", {"lam": 0.4}), ("ties", {"k": 30})):
        merge_files(method, base, experts, tmp_path / f"gpu-{method}", hparams=hp, device="cuda")
        merge_files(method, base, experts, tmp_path / f"cpu-{method}", hparams=hp)
        a, b = (open_checkpoint(tmp_path / f"{d}-{method}").state_dict() for d in ("gpu", "cpu"))
        for k in b:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    n_tensors = len(open_checkpoint(base).keys()) * (1 + len(experts))
    assert len(staged) >= 2 * n_tensors and all(staged)
