"""Layouts: presets, detection, orientation and ties (acetools.layouts)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from acetools.layouts import PRESETS, Layout, TensorMeta, describe, detect_layout, format_table, get_layout
from acetools.merging import is_matrix_param

OPEN_CLIP_KEYS = {
    "visual.conv1.weight": (8, 3, 4, 4),
    "visual.class_embedding": (8,),
    "visual.positional_embedding": (5, 8),
    "visual.proj": (8, 4),
    "visual.transformer.resblocks.0.attn.in_proj_weight": (24, 8),
    "visual.transformer.resblocks.0.attn.in_proj_bias": (24,),
    "visual.transformer.resblocks.0.mlp.c_fc.weight": (32, 8),
    "token_embedding.weight": (10, 8),
    "text_projection": (8, 4),
    "logit_scale": (),
}


def test_open_clip_preset_is_exactly_is_matrix_param():
    lay = get_layout("open_clip", keys=OPEN_CLIP_KEYS)
    for key, shape in OPEN_CLIP_KEYS.items():
        t = torch.zeros(shape)
        assert lay.is_matrix(key, t) == is_matrix_param(key, t), key
        assert lay.orientation(key) == "out_in"
    # the official rule's matrices include visual.proj and the positional embedding
    assert lay.is_matrix("visual.proj", torch.zeros(8, 4))
    assert lay.is_matrix("visual.positional_embedding", torch.zeros(5, 8))
    assert detect_layout(OPEN_CLIP_KEYS) == "open_clip"


def test_gpt2_orientation_embeddings_and_ties():
    keys = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
            "transformer.h.0.attn.c_proj.weight", "transformer.h.0.mlp.c_fc.weight",
            "transformer.h.0.mlp.c_proj.weight",
            "transformer.h.0.ln_1.weight", "lm_head.weight"]
    assert detect_layout(keys) == "gpt2"
    lay = get_layout("auto", keys=keys)
    assert lay.name == "gpt2" and lay.tied == {"lm_head.weight": "transformer.wte.weight"}
    w = torch.arange(6.0).reshape(2, 3)  # stored in x out
    for k in keys[2:6]:
        assert lay.orientation(k) == "in_out" and lay.role(k, w) == "matrix"
        assert torch.equal(lay.to_canonical(k, w), w.T)
        assert torch.equal(lay.from_canonical(k, lay.to_canonical(k, w)), w)
    assert lay.role("transformer.wte.weight", w) == "embedding" and not lay.is_matrix("transformer.wte.weight", w)
    assert lay.role("lm_head.weight", w) == "head"
    assert lay.orientation("lm_head.weight") == "out_in"
    # a config that unties the embeddings removes the tie
    assert get_layout("gpt2", keys=keys, config={"tie_word_embeddings": False}).tied == {}


@pytest.mark.parametrize("config, name", [
    ({"model_type": "gpt2"}, "gpt2"), ({"model_type": "roberta"}, "bert"), ({"model_type": "llama"}, "llama"),
    ({"model_type": "clip_vision_model"}, "hf_clip"), ({"architectures": ["MistralForCausalLM"]}, "llama"),
    ({"model_cfg": {"vision_cfg": {}}}, "open_clip"), ({"model_type": "unknown"}, None),
])
def test_detect_from_config(config, name):
    assert detect_layout([], config) == name


def test_bert_llama_hf_clip_roles():
    bert = PRESETS["bert"]
    m = torch.zeros(4, 4)
    for k in ("roberta.embeddings.word_embeddings.weight", "roberta.embeddings.token_type_embeddings.weight"):
        assert bert.role(k, m) == "embedding"
    for k in ("classifier.dense.weight", "classifier.out_proj.weight", "bert.pooler.dense.weight"):
        assert bert.role(k, m) == "head"
    assert bert.role("roberta.encoder.layer.0.attention.self.query.weight", m) == "matrix"
    llama = PRESETS["llama"]
    assert llama.role("model.embed_tokens.weight", m) == "embedding" and llama.role("lm_head.weight", m) == "head"
    assert all(llama.role(f"model.layers.0.{p}.weight", m) == "matrix"
               for p in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"))
    clip = PRESETS["hf_clip"]
    assert clip.role("vision_model.embeddings.position_embedding.weight", m) == "embedding"
    assert clip.role("vision_model.encoder.layers.0.self_attn.q_proj.weight", m) == "matrix"


def test_buffers_and_options():
    lay = PRESETS["generic"]
    assert lay.role("embeddings.position_ids", torch.zeros(1, 5, dtype=torch.long)) == "buffer"
    assert lay.role("bn.num_batches_tracked", TensorMeta((), torch.int64)) == "buffer"
    assert lay.role("encoder.embed.weight", torch.zeros(3, 3)) == "embedding"
    opt = dataclasses.replace(lay, matrix_embeddings=True)
    assert opt.is_matrix("encoder.embed.weight", torch.zeros(3, 3))
    assert not opt.is_matrix("encoder.embed.bias", torch.zeros(3))


def test_errors_name_the_thing():
    with pytest.raises(ValueError, match="unknown layout 'gpt3'"):
        get_layout("gpt3")
    with pytest.raises(ValueError, match="not a regular expression"):
        Layout("bad", in_out=("(",))


def test_describe_table():
    lay = get_layout("gpt2", keys=["transformer.wte.weight", "lm_head.weight"])
    rows = describe(lay, {"transformer.wte.weight": torch.zeros(5, 4), "lm_head.weight": torch.zeros(5, 4),
                          "transformer.h.0.attn.c_attn.weight": torch.zeros(4, 12)})
    assert [r["path"] for r in rows] == ["elementwise", "tied to transformer.wte.weight", "matrix"]
    assert rows[2]["orientation"] == "in_out"
    assert "tied to transformer.wte.weight" in format_table(rows)


# --------------------------------------------------------------------------- merge() with a layout
def _gpt2_world(n_tasks=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"transformer.wte.weight": (12, 4), "transformer.h.0.attn.c_attn.weight": (4, 12),
              "transformer.h.0.mlp.c_fc.weight": (4, 16), "transformer.h.0.ln_1.weight": (4,)}
    base = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    base["lm_head.weight"] = base["transformer.wte.weight"]
    experts = []
    for _ in range(n_tasks):
        e = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in base.items() if k != "lm_head.weight"}
        e["lm_head.weight"] = e["transformer.wte.weight"]
        experts.append(e)
    return base, experts


def test_merge_without_a_layout_detects_it_as_the_cli_does():
    import warnings

    from acetools.layouts import default_layout
    from acetools.merging import merge

    base, experts = _gpt2_world()
    assert default_layout(base).name == "gpt2"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "uses the open_clip rule" warning any more
        out = merge("tsv_m", base, experts)
    ref = merge("tsv_m", base, experts, layout="gpt2")
    assert all(torch.equal(out[k], ref[k]) for k in base)
    # a model nothing recognises keeps the open_clip rule (every 2-D tensor a matrix, as stored)
    plain = {"w": torch.randn(4, 3)}
    assert default_layout(plain).name == "open_clip"


def test_merge_tied_keys_merged_once():
    from acetools.merging import merge

    base, experts = _gpt2_world()
    untied = lambda sd: {k: v for k, v in sd.items() if k != "lm_head.weight"}  # noqa: E731
    out = merge("ties", base, experts, layout="gpt2", k=30)  # global scope: a double count would change it
    ref = merge("ties", untied(base), [untied(e) for e in experts], layout="gpt2", k=30)
    assert list(out) == list(base)
    assert all(torch.equal(out[k], ref[k]) for k in ref)
    assert torch.equal(out["lm_head.weight"], out["transformer.wte.weight"])
    assert out["lm_head.weight"].data_ptr() != out["transformer.wte.weight"].data_ptr()


def test_merge_in_out_equals_transposed_out_in():
    from acetools.merging import merge

    base, experts = _gpt2_world()
    out = merge("tsv_m", base, experts, layout="gpt2")
    flip = lambda sd: {k: (v.T.contiguous() if PRESETS["gpt2"].orientation(k) == "in_out" else v)  # noqa: E731
                       for k, v in sd.items()}
    lin = dataclasses.replace(PRESETS["gpt2"], in_out=())
    ref = merge("tsv_m", flip(base), [flip(e) for e in experts], layout=lin)
    for k in base:
        torch.testing.assert_close(out[k], flip(ref)[k] if PRESETS["gpt2"].orientation(k) == "in_out" else ref[k])


def test_merge_layout_argument_errors():
    from acetools.merging import is_matrix_param, merge

    base, experts = _gpt2_world()
    with pytest.raises(ValueError, match="either layout= or is_matrix="):
        merge("ties", base, experts, layout="gpt2", is_matrix=is_matrix_param)


def test_detect_bare_hf_clip_vision_state_dict():
    """A bare CLIPVisionModel state dict (transformers 5: no ``vision_model.`` prefix) is hf_clip."""
    keys = ["embeddings.class_embedding", "embeddings.position_embedding.weight", "pre_layrnorm.weight",
            "encoder.layers.0.self_attn.q_proj.weight", "encoder.layers.0.mlp.fc1.weight", "post_layernorm.weight"]
    assert detect_layout(keys) == "hf_clip"
    assert detect_layout(keys[3:5]) is None  # q_proj / fc1 alone name no architecture
