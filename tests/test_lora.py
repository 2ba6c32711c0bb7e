"""peft LoRA adapters as experts (docs/your-models.md §LoRA adapters as experts): folded as peft's
merge_and_unload() folds them, merged by every method as their folded checkpoints are, the linear merge
written back as an adapter, and every bad adapter refused in one line. peft is the oracle; the models are
tiny and built here (nothing downloaded)."""

from __future__ import annotations

import functools
import json
import math
import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from acetools.cli import main
from acetools.errors import InputError
from acetools.files.checkpoints import open_checkpoint
from acetools.files.diagnose import check_inputs, diagnose
from acetools.files.heads import load_head, load_with_head, task_state_dict
from acetools.files.lora import LoraCheckpoint, open_expert
from acetools.files.merge_files import merge_files
from acetools.merging import METHODS
from tests.merge_helpers import random_data_inputs

try:
    import peft
    import transformers
except ImportError:  # the peft oracles are skipped; the hand-written adapters below still run
    peft = transformers = None
needs_peft = pytest.mark.skipif(peft is None, reason="peft (the oracle extra) is not installed")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

HPARAMS = {"dare": {"seed": 0}}  # the methods that need per-key inputs (ESM, RegMean) are left to their own tests
NEEDS_INPUTS = {name for name, info in METHODS.items() if info.per_key and name != "ace"}


def _randomize_b(model, seed: int, scales: tuple[float, float] = (0.03, 0.1)) -> None:
    """LoRA's B starts at zero: give every factor random values, as training would (standard deviations
    ``scales``: the LoRA factors', the modules_to_save copies')."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (scales[0] if "lora_" in name else scales[1]))


def _base(model_cls, cfg, folder: Path):
    """A tiny ``model_cls(cfg)`` (seed 0) saved to ``folder``; a function that loads it afresh."""
    torch.manual_seed(0)
    model_cls(cfg).save_pretrained(folder)
    return functools.partial(model_cls.from_pretrained, folder)


def _adapter(model_fn, base_dir: Path, out: Path, seed: int, *, scales: tuple[float, float] = (0.03, 0.1),
             **lora) -> Path:
    """A peft adapter of ``model_fn()`` (its base named ``base_dir``) with random factors, saved to ``out``."""
    model = model_fn()
    model.name_or_path = str(base_dir)
    pm = peft.get_peft_model(model, peft.LoraConfig(**lora))
    _randomize_b(pm, seed, scales)
    pm.save_pretrained(str(out))
    return out


def _folded(model_fn, adapter: Path, out: Path) -> Path:
    """The oracle: peft's own fold of the adapter, saved as a full checkpoint."""
    pm = peft.PeftModel.from_pretrained(model_fn(), str(adapter))
    pm.merge_and_unload().save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT classifier base, its bare backbone, three adapters (ranks 4 / 2 with rank and alpha patterns /
    rsLoRA) with modules_to_save=["classifier"], and peft's folds of them."""
    if peft is None or transformers is None:
        pytest.skip("peft (the oracle extra) is not installed")
    root = tmp_path_factory.mktemp("bert")
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32, num_labels=3)
    torch.manual_seed(0)
    base = transformers.BertForSequenceClassification(cfg)
    base.save_pretrained(root / "base")
    base.bert.save_pretrained(root / "bare")

    def fresh():
        return transformers.BertForSequenceClassification.from_pretrained(root / "base")

    common = {"modules_to_save": ["classifier"], "task_type": "SEQ_CLS"}
    ads = [
        _adapter(fresh, root / "base", root / "ad_a", 1, r=4, lora_alpha=8, target_modules=["query", "value"],
                 **common),
        _adapter(fresh, root / "base", root / "ad_b", 2, r=4, lora_alpha=16, target_modules=["query", "dense"],
                 rank_pattern={"output.dense": 2}, alpha_pattern={"output.dense": 3}, **common),
        _adapter(fresh, root / "base", root / "ad_c", 3, r=2, lora_alpha=4, use_rslora=True,
                 target_modules=["key", "value", "dense"], **common),
    ]
    folded = [_folded(fresh, a, root / f"fold_{a.name}") for a in ads]
    return {"root": root, "base": root / "base", "bare": root / "bare", "adapters": ads, "folded": folded,
            "fresh": fresh}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama (LlamaConfig, causal LM) and two adapters on attention, MLP and the embedding."""
    if peft is None or transformers is None:
        pytest.skip("peft (the oracle extra) is not installed")
    root = tmp_path_factory.mktemp("llama")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    fresh = _base(transformers.LlamaForCausalLM, cfg, root / "base")

    ads = [
        _adapter(fresh, root / "base", root / "ad_0", 4, r=4, lora_alpha=8,
                 target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]),
        _adapter(fresh, root / "base", root / "ad_1", 5, r=2, lora_alpha=2,
                 target_modules=["q_proj", "k_proj", "o_proj", "gate_proj", "embed_tokens"]),
    ]
    folded = [_folded(fresh, a, root / f"fold_{a.name}") for a in ads]
    return {"root": root, "base": root / "base", "adapters": ads, "folded": folded, "fresh": fresh}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return open_checkpoint(folder).state_dict()


def _assert_same_merge(a: Path, b: Path, rtol: float = 1e-6, what: str = "") -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        scale = max(float(wb[k].float().abs().max()), 1e-12)
        err = float((wa[k].float() - wb[k].float()).abs().max())
        assert err <= rtol * scale + 1e-7, f"{what} {k}: {err / scale:.2e} relative"


@pytest.mark.oracle
@pytest.mark.parametrize("world", ["bert", "llama"])
def test_fold_equals_peft_merge_and_unload(world, request):
    w = request.getfixturevalue(world)
    base = open_checkpoint(w["base"])
    for ad, fold in zip(w["adapters"], w["folded"]):
        ck = open_expert(ad, base)
        assert isinstance(ck, LoraCheckpoint)
        want = _weights(fold)
        assert set(ck.keys()) == set(want)
        for k in want:
            torch.testing.assert_close(ck.get(k), want[k], rtol=0, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
        assert ck.meta(next(iter(ck.targets))).shape == want[next(iter(ck.targets))].shape


def test_fold_equation_scales(bert):
    """scale = lora_alpha / r, alpha_pattern / rank_pattern per module, lora_alpha / sqrt(r) with rsLoRA."""
    base = open_checkpoint(bert["base"])
    b = open_expert(bert["adapters"][1], base)
    t = b.targets["bert.encoder.layer.0.attention.output.dense.weight"]
    assert (t.rank, t.scale) == (2, 3 / 2)
    assert b.targets["bert.encoder.layer.0.attention.self.query.weight"].scale == 16 / 4
    c = open_expert(bert["adapters"][2], base)
    assert c.targets["bert.encoder.layer.1.attention.self.key.weight"].scale == 4 / math.sqrt(2)
    key = "bert.encoder.layer.1.attention.self.key.weight"
    A = c.factor(c.targets[key].a)
    B = c.factor(c.targets[key].b)
    torch.testing.assert_close(c.get(key), base.get(key) + 4 / math.sqrt(2) * B @ A)


@needs_peft
def test_fold_fan_in_fan_out_gpt2(tmp_path):
    """GPT-2's Conv1D stores W as d_in x d_out: peft's fan_in_fan_out folds (B A)^T, and so does the view."""
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=16)
    fresh = _base(transformers.GPT2LMHeadModel, cfg, tmp_path / "base")

    ad = _adapter(fresh, tmp_path / "base", tmp_path / "ad", 7, r=2, lora_alpha=4, target_modules=["c_attn", "c_fc"],
                  fan_in_fan_out=True)
    want = _weights(_folded(fresh, ad, tmp_path / "fold"))
    ck = open_expert(ad, open_checkpoint(tmp_path / "base"))
    assert ck.targets["transformer.h.0.attn.c_attn.weight"].transpose
    for k in ck.targets:
        torch.testing.assert_close(ck.get(k), want[k], rtol=0, atol=1e-6)


def test_bare_base_takes_the_adapters_prefix(bert, tmp_path):
    """A bare BertModel base with adapters of BertForSequenceClassification: the merge of the backbone equals
    the one against the classifier base, and the heads are the adapters' classifiers."""
    # the adapters name the classifier folder as their base: copies that name none (no check)
    ads = [str(_copy(a, tmp_path, a.name, base_model_name_or_path=None)) for a in bert["adapters"][:2]]
    cls = merge_files("task_arithmetic", bert["base"], ads, tmp_path / "cls")
    bare = merge_files("task_arithmetic", bert["bare"], ads, tmp_path / "bare")
    assert bare.plan.heads.mode == "per-task" and bare.info["heads"]["tasks"]
    wc, wb = _weights(cls.out), _weights(bare.out)
    assert set(wb) == set(wc) and all(k.startswith("bert.") for k in wb)  # the task model's names
    for k, v in wb.items():
        torch.testing.assert_close(v, wc[k], rtol=0, atol=0)
    sd, _ = task_state_dict(bare.out, "ad_b")
    want = _weights(bert["folded"][1])
    torch.testing.assert_close(sd["classifier.weight"], want["classifier.weight"])
    # the adapter output against the bare base: the same factors, the heads beside them
    la = merge_files("task_arithmetic", bert["bare"], ads, None, lora_out=tmp_path / "lora_bare")
    lc = merge_files("task_arithmetic", bert["base"], ads, None, lora_out=tmp_path / "lora_cls")
    assert set(la.info["heads"]["tasks"]) == {"ad_a", "ad_b"}
    from safetensors.torch import load_file
    fa, fc = load_file(la.out / "adapter_model.safetensors"), load_file(lc.out / "adapter_model.safetensors")
    assert fa.keys() == fc.keys() and all(torch.equal(fa[k], fc[k]) for k in fa)


@pytest.mark.oracle
@pytest.mark.parametrize("world", ["bert", "llama"])
def test_every_method_adapters_equal_fold_then_merge(world, request, tmp_path):
    """Merging the adapters directly, folded key by key (lowrank="never"), equals merging peft's folds of them, for
    every method (heads per task; RegMean and ESM, with random Grams and activations, on the Llama). The span's
    merge (lowrank="auto") is tests/test_lora_span.py's: at these ranks (r_t < int(16 / T), sum_t r_t < 16) the
    full-space TSV-M, Iso-C and Iso-CTS take null-space slots that the span drops."""
    w = request.getfixturevalue(world)
    for method in sorted(set(METHODS) - (NEEDS_INPUTS if world == "bert" else set())):
        hp = {**HPARAMS.get(method, {}), **(_data_inputs(method, w["base"], 2) if world == "llama" else {})}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = merge_files(method, w["base"], [str(p) for p in w["adapters"]], tmp_path / f"{method}_a", hparams=hp,
                            lowrank="never")
            b = merge_files(method, w["base"], [str(p) for p in w["folded"]], tmp_path / f"{method}_b", hparams=hp)
        _assert_same_merge(a.out, b.out, rtol=1e-5, what=method)
        assert len(a.info["heads"]["tasks"]) == len(b.info["heads"]["tasks"]) == (3 if world == "bert" else 0)
        if world == "bert":
            for ta, tb in zip(a.info["heads"]["tasks"], b.info["heads"]["tasks"]):
                ha, _ = task_state_dict(a.out, ta)
                hb, _ = task_state_dict(b.out, tb)
                torch.testing.assert_close(ha["classifier.weight"], hb["classifier.weight"])


def test_adapters_and_full_checkpoints_mixed(bert, tmp_path):
    experts = [str(bert["adapters"][0]), str(bert["folded"][1]), str(bert["adapters"][2])]
    a = merge_files("ties", bert["base"], experts, tmp_path / "mixed")
    b = merge_files("ties", bert["base"], [str(p) for p in bert["folded"]], tmp_path / "folded")
    _assert_same_merge(a.out, b.out)


@pytest.mark.oracle
@pytest.mark.parametrize("method,hp", [("task_arithmetic", {"lam": 0.7}), ("weight_averaging", {}),
                                       ("task_arithmetic", {"lam": 0.5, "weights": [1.0, -0.5]})])
def test_lora_out_equals_full_merge(llama, tmp_path, method, hp):
    """The adapter output (rank sum_t r_t), loaded by peft and folded, equals the full-space merge to 1e-6."""
    ads = [str(p) for p in llama["adapters"]]
    full = merge_files(method, llama["base"], ads, tmp_path / "full", hparams=hp)
    res = merge_files(method, llama["base"], ads, None, hparams=hp, lora_out=tmp_path / "lora")
    cfg = json.loads((res.out / "adapter_config.json").read_text())
    assert cfg["r"] == 4 + 2 and cfg["rank_pattern"]  # modules updated by both adapters have rank 6, others 4 or 2
    pm = peft.PeftModel.from_pretrained(llama["fresh"](), str(res.out))
    got = pm.merge_and_unload().state_dict()
    want = _weights(full.out)
    for k, v in want.items():
        rel = float((got[k] - v).norm() / v.norm().clamp_min(1e-12))
        assert rel <= 1e-6, (k, rel)


@pytest.mark.oracle
def test_lora_out_matches_peft_cat_and_peft_linear_mixes_factors(llama, tmp_path):
    """peft's add_weighted_adapter: "cat" is our task arithmetic adapter exactly; "linear" in the installed
    peft forms (sum_t sqrt(w_t s_t) B_t)(sum_t sqrt(w_t s_t) A_t), whose cross terms B_t A_u (t != u) make it
    differ from the task-arithmetic merge when the adapters share a module (the factor-mixing issue)."""
    ads = [str(p) for p in llama["adapters"]]
    res = merge_files("task_arithmetic", llama["base"], ads, None, hparams={"lam": 0.6}, lora_out=tmp_path / "ours")
    pm = peft.PeftModel.from_pretrained(llama["fresh"](), ads[0], adapter_name="a0")
    pm.load_adapter(ads[1], adapter_name="a1")
    pm.add_weighted_adapter(["a0", "a1"], [0.6, 0.6], "cat", combination_type="cat")
    key = "model.layers.0.self_attn.q_proj"
    mod = pm.base_model.model.model.layers[0].self_attn.q_proj
    ours = LoraCheckpoint(res.out, open_checkpoint(llama["base"]))
    torch.testing.assert_close(mod.get_delta_weight("cat"), ours.delta(f"{key}.weight"), rtol=1e-6, atol=1e-7)
    a0, a1 = (open_expert(p, open_checkpoint(llama["base"])) for p in ads)
    exact = 0.6 * (a0.delta(f"{key}.weight") + a1.delta(f"{key}.weight"))
    torch.testing.assert_close(mod.get_delta_weight("cat"), exact, rtol=1e-6, atol=1e-7)
    # "linear" needs equal ranks: two adapters of rank 2 on q_proj
    pm2 = peft.PeftModel.from_pretrained(llama["fresh"](), ads[1], adapter_name="b0")
    other = _adapter(llama["fresh"], llama["base"], tmp_path / "ad_r2", 9, r=2, lora_alpha=2, target_modules=["q_proj"])
    pm2.load_adapter(str(other), adapter_name="b1")
    pm2.add_weighted_adapter(["b0", "b1"], [0.6, 0.6], "lin", combination_type="linear")
    q = pm2.base_model.model.model.layers[0].self_attn.q_proj
    b0, b1 = (open_expert(p, open_checkpoint(llama["base"])) for p in (ads[1], other))
    t0, t1 = b0.targets[f"{key}.weight"], b1.targets[f"{key}.weight"]
    c0, c1 = math.sqrt(0.6 * t0.scale), math.sqrt(0.6 * t1.scale)
    mixed = (c0 * b0.factor(t0.b) + c1 * b1.factor(t1.b)) @ (c0 * b0.factor(t0.a) + c1 * b1.factor(t1.a))
    lin = q.get_delta_weight("lin")
    torch.testing.assert_close(lin, mixed * q.scaling["lin"], rtol=1e-5, atol=1e-7)
    exact = 0.6 * (b0.delta(f"{key}.weight") + b1.delta(f"{key}.weight"))
    assert float((lin - exact).norm() / exact.norm()) > 1e-2


def test_lora_out_with_heads_cli(bert, tmp_path, capsys):
    """``acetools merge --lora-out``: the adapter plus each task's head; base + adapter + head = the full merge's
    task model."""
    ads = [str(p) for p in bert["adapters"]]
    assert main(["merge", "--method", "task_arithmetic", "--base", str(bert["base"]), "--experts", *ads,
                 "--lora-out", str(tmp_path / "lora"), "--out", str(tmp_path / "full")]) == 0
    printed = capsys.readouterr().out
    assert "merged LoRA adapter" in printed and "experts: 3 LoRA adapters" in printed
    model = load_with_head(tmp_path / "full", "ad_c")  # the full merge loads back as the task's model
    assert model.config.num_labels == 3
    full_sd, _ = task_state_dict(tmp_path / "full", "ad_c")
    head, _ = load_head(tmp_path / "lora", "ad_c")
    torch.testing.assert_close(head["classifier.weight"], full_sd["classifier.weight"], rtol=0, atol=0)
    lora = LoraCheckpoint(tmp_path / "lora", open_checkpoint(bert["base"]))
    for k in lora.targets:
        torch.testing.assert_close(lora.get(k), full_sd[k], rtol=1e-6, atol=1e-6)
    idx = json.loads((tmp_path / "lora" / "heads" / "index.json").read_text())
    assert set(idx["tasks"]) == {"ad_a", "ad_b", "ad_c"}


def test_diagnose_reads_adapters(bert):
    out = check_inputs(bert["base"], [str(p) for p in bert["adapters"]])
    assert out["n_tasks"] == 3 and out["n_matrices"] > 0


def test_diagnose_adapters_equals_their_folds(hand):
    """``acetools diagnose`` on adapters measures what it measures on their folded checkpoints."""
    a = diagnose(hand["base"], [str(p) for p in hand["adapters"]], names=["t0", "t1"])
    b = diagnose(hand["base"], [str(p) for p in hand["folded"]], names=["t0", "t1"])
    for name in ("layers", "norms", "cosine"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), rtol=1e-5)
    assert len(a.layers) > 0


# --------------------------------------------------------------------------- bad adapters: one line each
def _copy(ad: Path, tmp: Path, name: str, **cfg) -> Path:
    out = tmp / name
    shutil.copytree(ad, out)
    data = json.loads((out / "adapter_config.json").read_text())
    data.update(cfg)
    (out / "adapter_config.json").write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("change,expect", [
    ({"use_dora": True}, "DoRA"),
    ({"peft_type": "IA3"}, "peft_type 'IA3'"),
    ({"peft_type": "LOHA"}, "peft_type 'LOHA'"),
    ({"base_model_name_or_path": "meta-llama/Llama-3-8B"}, "'meta-llama/Llama-3-8B'"),
    ({"r": 0}, "r=0"),
    ({"r": 8}, "rank 3"),
    ({"target_parameters": ["experts.gate_up_proj"]}, "target_parameters"),
    ({"init_lora_weights": "pissa_niter_4"}, "init_lora_weights='pissa_niter_4'"),
    ({"init_lora_weights": "olora"}, "init_lora_weights='olora'"),
])
def test_bad_adapter_one_line(hand, tmp_path, change, expect):
    bad = _copy(hand["adapters"][0], tmp_path, "bad", **change)
    with pytest.raises((InputError, TypeError, KeyError)) as e:
        merge_files("task_arithmetic", hand["base"], [str(bad), str(hand["adapters"][1])], tmp_path / "out")
    msg = str(e.value).strip("'\"")
    assert expect in msg and "\n" not in msg and str(bad) in msg
    if "base_model_name_or_path" in change:  # the same model under another name: --force merges, with a warning
        with pytest.warns(UserWarning, match="merge anyway with --force"):
            merge_files("task_arithmetic", hand["base"], [str(bad), str(hand["adapters"][1])], tmp_path / "forced",
                        force=True)


def test_bad_adapter_files_one_line(bert, llama, tmp_path):
    base = open_checkpoint(bert["base"])
    cases = []
    no_w = _copy(bert["adapters"][0], tmp_path, "no_weights")
    (no_w / "adapter_model.safetensors").unlink()
    cases.append((no_w, "no adapter_model.safetensors"))
    bad_json = _copy(bert["adapters"][0], tmp_path, "bad_json")
    (bad_json / "adapter_config.json").write_text("{r: 4")
    cases.append((bad_json, "not valid JSON"))
    from safetensors.torch import load_file, save_file
    half = _copy(bert["adapters"][0], tmp_path, "half")
    sd = load_file(half / "adapter_model.safetensors")
    save_file({k: v for k, v in sd.items() if "query.lora_B" not in k}, half / "adapter_model.safetensors")
    cases.append((half, "lora_B.weight beside it"))
    dora = _copy(bert["adapters"][0], tmp_path, "magnitude")
    magnitude = "base_model.model.bert.encoder.layer.0.attention.self.query.lora_magnitude_vector"
    save_file({**sd, magnitude: torch.ones(16)}, dora / "adapter_model.safetensors")
    cases.append((dora, "lora_magnitude_vector"))
    other = _copy(llama["adapters"][0], tmp_path, "llama_on_bert", base_model_name_or_path=None)
    cases.append((other, "does not have"))
    for path, expect in cases:
        with pytest.raises((InputError, FileNotFoundError, KeyError)) as e:
            open_expert(path, base)
        msg = str(e.value).strip("'\"")
        assert expect in msg and "\n" not in msg and str(path) in msg, msg
    with pytest.raises(InputError, match="is a peft adapter, not a checkpoint"):
        open_checkpoint(bert["adapters"][0])
    with pytest.raises(InputError, match="is a peft adapter, not a checkpoint"):
        merge_files("ties", bert["adapters"][0], [str(p) for p in bert["folded"]], tmp_path / "as_base")


def test_adapter_file_paths_name_their_folder(bert):
    """adapter_config.json or adapter_model.safetensors given as the expert: the adapter of their folder."""
    base = open_checkpoint(bert["base"])
    folder = bert["adapters"][0]
    for p in (folder / "adapter_config.json", folder / "adapter_model.safetensors"):
        ck = open_expert(str(p), base)
        assert isinstance(ck, LoraCheckpoint) and ck.folder == folder


def test_lora_out_refusals(bert, tmp_path):
    ads = [str(p) for p in bert["adapters"]]
    with pytest.raises(InputError, match="ties is not linear"):
        merge_files("ties", bert["base"], ads, None, lora_out=tmp_path / "x")
    with pytest.raises(InputError, match="is a full checkpoint"):
        merge_files("task_arithmetic", bert["base"], [ads[0], str(bert["folded"][1])], None, lora_out=tmp_path / "y")
    with pytest.raises(InputError, match="holds the input checkpoint"):
        merge_files("task_arithmetic", bert["base"], ads, None, lora_out=bert["adapters"][0])


# --------------------------------------------------------------------------- adapters written by hand (no peft)
def _hand_world(root: Path) -> dict:
    """A Llama-named base state dict (config.json included) and two adapters in peft's file format, written
    with torch alone: ranks 3 and 2 (a rank_pattern), one with rsLoRA, one with a modules_to_save lm_head."""
    g = torch.Generator().manual_seed(0)
    d, f, v = 8, 12, 20
    base = {"model.embed_tokens.weight": torch.randn(v, d, generator=g),
            "lm_head.weight": torch.randn(v, d, generator=g), "model.norm.weight": torch.ones(d)}
    for i in range(2):
        p = f"model.layers.{i}."
        base |= {p + f"self_attn.{m}_proj.weight": torch.randn(d, d, generator=g) for m in "qkvo"}
        base |= {p + "mlp.up_proj.weight": torch.randn(f, d, generator=g),
                 p + "mlp.gate_proj.weight": torch.randn(f, d, generator=g),
                 p + "mlp.down_proj.weight": torch.randn(d, f, generator=g),
                 p + "input_layernorm.weight": torch.ones(d)}
    from safetensors.torch import save_file
    (root / "base").mkdir()
    save_file(base, root / "base" / "model.safetensors")
    (root / "base" / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                           "hidden_size": d, "tie_word_embeddings": False}))
    specs = [({"r": 3, "lora_alpha": 6, "rank_pattern": {"down_proj": 2}, "alpha_pattern": {}},
              ["q_proj", "down_proj", "up_proj"], None),
             ({"r": 2, "lora_alpha": 3, "use_rslora": True}, ["q_proj", "v_proj"], "lm_head")]
    ads = []
    for t, (cfg, targets, save) in enumerate(specs):
        tensors = {}
        for key, W0 in base.items():
            module = key[: -len(".weight")]
            if W0.ndim != 2 or module.rsplit(".", 1)[-1] not in targets:
                continue
            r = 2 if module.endswith("down_proj") and "rank_pattern" in cfg else cfg["r"]
            tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(r, W0.shape[1], generator=g) * 0.05
            tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(W0.shape[0], r, generator=g) * 0.05
        if save:
            tensors[f"base_model.model.{save}.weight"] = base[f"{save}.weight"] + 0.01 * torch.randn(v, d, generator=g)
        folder = root / f"hand_{t}"
        folder.mkdir()
        save_file(tensors, folder / "adapter_model.safetensors")
        (folder / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "target_modules": targets, "modules_to_save": [save] if save else None,
            "base_model_name_or_path": "base", "fan_in_fan_out": False, **cfg}))
        ads.append(folder)
    return {"base": root / "base", "sd": base, "adapters": ads}


def _fold_by_hand(folder: Path, base_sd: dict) -> dict:
    """Eq. of docs/your-models.md §LoRA adapters as experts, written out: W0 + s B A per module."""
    from safetensors.torch import load_file
    cfg = json.loads((folder / "adapter_config.json").read_text())
    own = load_file(folder / "adapter_model.safetensors")
    out = dict(base_sd)
    for k, A in own.items():
        if not k.endswith("lora_A.weight"):
            if "lora_" not in k:
                out[k[len("base_model.model."):]] = A
            continue
        module = k[len("base_model.model."): -len(".lora_A.weight")]
        B = own[k.replace("lora_A", "lora_B")]
        r = A.shape[0]
        alpha = cfg["lora_alpha"]
        s = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        out[f"{module}.weight"] = base_sd[f"{module}.weight"] + (B @ A) * s  # peft's order of operations
    return out


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    root = tmp_path_factory.mktemp("hand")
    w = _hand_world(root)
    from safetensors.torch import save_file
    w["folded"] = []
    for a in w["adapters"]:
        (root / f"fold_{a.name}").mkdir()
        save_file(_fold_by_hand(a, w["sd"]), root / f"fold_{a.name}" / "model.safetensors")
        (root / f"fold_{a.name}" / "config.json").write_text((w["base"] / "config.json").read_text())
        w["folded"].append(root / f"fold_{a.name}")
    return w


def test_hand_adapters_fold_by_the_equation(hand):
    base = open_checkpoint(hand["base"])
    for a, f in zip(hand["adapters"], hand["folded"]):
        ck = open_expert(a, base)
        want = _weights(f)
        assert set(ck.keys()) == set(want)
        for k in want:
            torch.testing.assert_close(ck.get(k), want[k], rtol=1e-6, atol=1e-6)
    assert open_expert(hand["adapters"][0], base).targets["model.layers.1.mlp.down_proj.weight"].scale == 6 / 2


def _data_inputs(method: str, base: Path, n_tasks: int) -> dict:
    """Random Grams (RegMean) or proxy activations (ESM) of every matrix key, for the methods that need them."""
    from acetools.layouts import get_layout
    ck = open_checkpoint(base)
    lay = get_layout("auto", keys=ck.keys(), config=ck.config)
    widths = {k: m.shape[1] for k, m in ck.metas().items() if lay.is_matrix(k, m)}
    return random_data_inputs(method, widths, lay.name, n_tasks)


def test_hand_adapters_every_method_equals_fold_then_merge(hand, tmp_path):
    """Every method on the adapters equals it on their folds, RegMean and ESM with the same random Grams and
    activations. (Iso-C and Iso-CTS give the zero singular values of a low-rank update the mean's weight, so
    their result hangs on the rounding of the fold: the fold here is the same arithmetic as peft's, bit for
    bit.) Folded key by key (lowrank="never"): the span's merge is tests/test_lora_span.py's."""
    ads, folded = [str(p) for p in hand["adapters"]], [str(p) for p in hand["folded"]]
    for method in sorted(METHODS):
        hp = {**HPARAMS.get(method, {}), **_data_inputs(method, hand["base"], len(ads))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = merge_files(method, hand["base"], ads, tmp_path / f"{method}_a", hparams=hp, heads="merge",
                            lowrank="never")
            b = merge_files(method, hand["base"], folded, tmp_path / f"{method}_b", hparams=hp, heads="merge")
        _assert_same_merge(a.out, b.out, rtol=1e-5, what=method)


@pytest.mark.parametrize("method,hp", [("task_arithmetic", {"lam": 0.4}), ("weight_averaging", {"weights": [3, 1]})])
def test_hand_lora_out_equals_full_merge(hand, tmp_path, method, hp):
    """The written adapter, folded (by acetools here; by peft in test_lora_out_equals_full_merge), is the full
    merge to 1e-6 relative, with rank sum_t r_t per module and the merged modules_to_save."""
    ads = [str(p) for p in hand["adapters"]]
    with pytest.raises(InputError, match="modules_to_save"):  # lm_head saved by one adapter of two
        merge_files(method, hand["base"], ads, None, hparams=hp, lora_out=tmp_path / "refused")
    ads = [str(_copy(hand["adapters"][0], tmp_path, "a0")), str(_copy(hand["adapters"][1], tmp_path, "a1",
                                                                       modules_to_save=None))]
    from safetensors.torch import load_file, save_file
    sd = load_file(Path(ads[1]) / "adapter_model.safetensors")
    save_file({k: v for k, v in sd.items() if "lora_" in k}, Path(ads[1]) / "adapter_model.safetensors")
    full = merge_files(method, hand["base"], ads, tmp_path / "full", hparams=hp)
    res = merge_files(method, hand["base"], ads, None, hparams=hp, lora_out=tmp_path / "lora")
    cfg = json.loads((res.out / "adapter_config.json").read_text())
    assert cfg["r"] == 5 and cfg["rank_pattern"] == {r"model\.layers\.0\.mlp\.down_proj": 2,
                                                     r"model\.layers\.1\.mlp\.down_proj": 2,
                                                     r"model\.layers\.0\.mlp\.up_proj": 3,
                                                     r"model\.layers\.1\.mlp\.up_proj": 3,
                                                     r"model\.layers\.0\.self_attn\.v_proj": 2,
                                                     r"model\.layers\.1\.self_attn\.v_proj": 2}
    got = LoraCheckpoint(res.out, open_checkpoint(hand["base"]))
    want = _weights(full.out)
    for k, v in want.items():
        rel = float((got.get(k) - v).norm() / v.norm())
        assert rel <= 1e-6, (k, rel)


def test_stored_embedding_base_layer_is_w0(llama, tmp_path):
    """peft saves an embedding's base layer with the adapter and loads it over the base's: the fold uses it, and
    an adapter output, which cannot carry it, refuses one that differs from the base's."""
    from safetensors.torch import load_file, save_file
    ad = _copy(llama["adapters"][1], tmp_path, "own_w0")
    sd = load_file(ad / "adapter_model.safetensors")
    key = "base_model.model.model.embed_tokens.base_layer.weight"
    sd[key] = sd[key] + 1.0
    save_file(sd, ad / "adapter_model.safetensors")
    base = open_checkpoint(llama["base"])
    ck = open_expert(ad, base)
    assert isinstance(ck, LoraCheckpoint)
    want = sd[key] + ck.delta("model.embed_tokens.weight")
    torch.testing.assert_close(ck.get("model.embed_tokens.weight"), want, rtol=0, atol=0)
    with pytest.raises(InputError, match="stores its own"):
        merge_files("task_arithmetic", llama["base"], [str(llama["adapters"][0]), str(ad)], None,
                    lora_out=tmp_path / "out")


@pytest.mark.oracle
@pytest.mark.parametrize("extra", [{"lora_bias": True}, {"bias": "all"}, {"bias": "lora_only"}])
def test_fold_biases_as_peft(bert, tmp_path, extra):
    """lora_bias (s * lora_B.bias added to the bias) and bias="all" / "lora_only" (the biases trained and saved
    with the adapter) fold as peft's merge_and_unload() folds them."""
    ad = _adapter(bert["fresh"], bert["base"], tmp_path / "ad", 11, r=2, lora_alpha=4, target_modules=["query"],
                  modules_to_save=["classifier"], **extra)
    g = torch.Generator().manual_seed(3)
    if extra.get("bias"):  # trained biases differ from the base's
        from safetensors.torch import load_file, save_file
        sd = load_file(ad / "adapter_model.safetensors")
        save_file({k: v + 0.1 * torch.randn(v.shape, generator=g) if k.endswith(".bias") else v for k, v in sd.items()},
                  ad / "adapter_model.safetensors")
    want = _weights(_folded(bert["fresh"], ad, tmp_path / "fold"))
    ck = open_expert(ad, open_checkpoint(bert["base"]))
    base = _weights(bert["base"])
    changed = [k for k in want if k.endswith(".bias") and not torch.equal(want[k], base[k])]
    assert any("query" in k for k in changed)
    for k in want:
        torch.testing.assert_close(ck.get(k), want[k], rtol=0, atol=1e-6)
    if extra.get("bias"):
        with pytest.raises(InputError, match="an adapter output cannot carry it"):  # trained biases
            merge_files("task_arithmetic", bert["base"], [str(ad), str(bert["adapters"][0])], None,
                        lora_out=tmp_path / "lora")


@pytest.mark.parametrize("searcher", ["grid", "tpe"])
def test_a_search_takes_force_for_an_adapters_base_name(hand, tmp_path, searcher):
    """--force reaches the plan a search checks once (acetools.files.search_merge.PLAN_KEYS) for either searcher:
    an adapter that names another base is refused without it and merged, with a warning, with it."""
    from acetools.files.search_merge import search_merge

    bad = _copy(hand["adapters"][0], tmp_path, "renamed", base_model_name_or_path="meta-llama/Llama-3-8B")
    experts = [str(bad), str(hand["adapters"][1])]

    def evaluate(folder, task):
        return 1.0

    if searcher == "grid":
        run = functools.partial(search_merge, "task_arithmetic", hand["base"], experts)
    else:
        pytest.importorskip("optuna")
        from acetools.files.tpe_merge import tpe_search_merge

        run = functools.partial(tpe_search_merge, "task_arithmetic", hand["base"], experts, trials=2, seed=0)
    with pytest.raises(InputError, match="meta-llama/Llama-3-8B"):
        run(tmp_path / "refused", evaluate)
    with pytest.warns(UserWarning, match="merge anyway with --force"):
        found = run(tmp_path / "forced", evaluate, force=True)
    assert found.merge.out == (tmp_path / "forced").resolve()
