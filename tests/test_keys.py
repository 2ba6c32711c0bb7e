"""acetools.keys: one parser for block index, layer type and short label of a weight key,
for open_clip and Hugging Face layouts."""

from __future__ import annotations

import pytest

from acetools import keys as K

OC = "visual.transformer.resblocks.{}.{}"


@pytest.mark.parametrize("key,block,ltype", [
    ("visual.transformer.resblocks.3.mlp.c_fc.weight", 3, "mlp.c_fc.weight"),
    ("visual.transformer.resblocks.11.attn.in_proj_weight", 11, "attn.in_proj_weight"),
    ("transformer.resblocks.0.ln_1.bias", 0, "ln_1.bias"),  # text tower / bare encoder
    ("visual.positional_embedding", None, "positional_embedding"),
    ("visual.proj", None, "proj"),
    ("logit_scale", None, "logit_scale"),
    # Hugging Face layouts
    ("vision_model.encoder.layers.5.self_attn.q_proj.weight", 5, "self_attn.q_proj.weight"),  # HF CLIP
    ("model.layers.31.mlp.down_proj.weight", 31, "mlp.down_proj.weight"),  # LLaMA
    ("roberta.encoder.layer.2.attention.self.query.weight", 2, "attention.self.query.weight"),  # RoBERTa
    ("bert.encoder.layer.10.output.dense.weight", 10, "output.dense.weight"),  # BERT
    ("transformer.h.7.attn.c_attn.weight", 7, "attn.c_attn.weight"),  # GPT-2
    ("h.7.mlp.c_fc.weight", 7, "mlp.c_fc.weight"),  # GPT-2 without the wrapper
    ("blocks.4.attn.qkv.weight", 4, "attn.qkv.weight"),  # timm
    ("model.layers.3.block_sparse_moe.experts.2.w1.weight", 3, "block_sparse_moe.experts.2.w1.weight"),  # first index
    ("model.embed_tokens.weight", None, "model.embed_tokens.weight"),
    ("transformer.wte.weight", None, "transformer.wte.weight"),
    ("lm_head.weight", None, "lm_head.weight"),
])
def test_parse_key(key, block, ltype):
    p = K.parse_key(key)
    assert (p.key, p.block, p.layer_type) == (key, block, ltype)
    assert K.block_index(key) == block and K.layer_type(key) == ltype
    assert K.block_index(key, default=-1) == (-1 if block is None else block)


def test_names_that_only_look_like_blocks_are_not_blocks():
    for key in ("visual.high.3.weight", "model.layers_norm.weight", "encoder.layers.x.weight", "layers.2"):
        assert K.block_index(key) is None, key


@pytest.mark.parametrize("key,dot,b", [
    (OC.format(3, "mlp.c_fc.weight"), "3.c_fc", "b3 c_fc"),
    (OC.format(11, "attn.in_proj_weight"), "11.in_proj", "b11 in_proj"),
    (OC.format(0, "attn.out_proj.weight"), "0.out_proj", "b0 out_proj"),
    (OC.format(2, "mlp.c_proj.weight"), "2.c_proj", "b2 c_proj"),
    (OC.format(2, "ln_1.weight"), "2.ln_1.weight", OC.format(2, "ln_1.weight")),
    (OC.format(2, "mlp.c_fc.bias"), "2.mlp.c_fc.bias", OC.format(2, "mlp.c_fc.bias")),
    ("visual.positional_embedding", "pos_emb", "visual.positional_embedding"),
    ("visual.proj", "proj", "visual.proj"),
    ("model.layers.1.self_attn.q_proj.weight", "1.q_proj", "b1 q_proj"),
    ("transformer.h.1.attn.c_proj.weight", "1.attn_c_proj", "b1 attn_c_proj"),
    ("transformer.h.1.mlp.c_proj.weight", "1.c_proj", "b1 c_proj"),
    ("bert.encoder.layer.1.intermediate.dense.weight", "1.ffn_in", "b1 ffn_in"),
])
def test_short_labels(key, dot, b):
    assert K.short_label(key) == dot and K.short_label(key, style="b") == b


def test_labels_are_unique_within_each_layout():
    layouts = {
        "open_clip": [OC.format(i, t) for i in range(2) for t in
                      ("attn.in_proj_weight", "attn.out_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight",
                       "ln_1.weight", "ln_1.bias")],
        "gpt2": [f"transformer.h.{i}.{t}" for i in range(2) for t in
                 ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")],
        "bert": [f"bert.encoder.layer.{i}.{t}" for i in range(2) for t in
                 ("attention.self.query.weight", "attention.self.key.weight", "attention.self.value.weight",
                  "attention.output.dense.weight", "intermediate.dense.weight", "output.dense.weight")],
        "llama": [f"model.layers.{i}.{t}" for i in range(2) for t in
                  ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                   "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")],
    }
    for name, ks in layouts.items():
        for style in ("dot", "b"):
            labels = [K.short_label(k, style=style) for k in ks]
            assert len(set(labels)) == len(labels), (name, style, labels)


def test_unknown_style_is_named():
    with pytest.raises(ValueError, match="'fancy'"):
        K.short_label("visual.proj", style="fancy")


def test_the_lessons_use_the_one_parser():
    """The lesson helpers are the keys helpers (same labels and block conventions as before)."""
    from acetools import diagnostics
    from acetools_course import lesson02_ace_step_by_step as PA
    from acetools_course import lesson03_esm_step_by_step as PE

    key = OC.format(3, "mlp.c_fc.weight")
    assert diagnostics.layer_type is K.layer_type
    assert PA.short_label(key) == "3.c_fc" and PE.short_key(key) == "b3 c_fc"
    assert PE.short_key("visual.proj") == "visual.proj" and PA.short_label("visual.positional_embedding") == "pos_emb"
