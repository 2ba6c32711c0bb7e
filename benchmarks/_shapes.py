"""Shapes of open_clip ViT-B/32's visual tower, for the benchmarks' random experts."""

from __future__ import annotations

WIDTH = 768


def vit_b32_visual_shapes(blocks: int = 12, width: int = WIDTH, *, whole: bool = True) -> dict[str, tuple[int, ...]]:
    """Key -> shape of open_clip ViT-B/32's visual tower in state-dict order; ``whole=False``
    gives only the ``blocks`` transformer blocks (what the per-block merge timings use)."""
    w = width
    shapes: dict[str, tuple[int, ...]] = {}
    if whole:
        shapes.update({
            "visual.class_embedding": (w,), "visual.positional_embedding": (50, w), "visual.proj": (w, 512),
            "visual.conv1.weight": (w, 3, 32, 32), "visual.ln_pre.weight": (w,), "visual.ln_pre.bias": (w,),
        })
    for b in range(blocks):
        p = f"visual.transformer.resblocks.{b}."
        shapes.update({
            p + "ln_1.weight": (w,), p + "ln_1.bias": (w,),
            p + "attn.in_proj_weight": (3 * w, w), p + "attn.in_proj_bias": (3 * w,),
            p + "attn.out_proj.weight": (w, w), p + "attn.out_proj.bias": (w,),
            p + "ln_2.weight": (w,), p + "ln_2.bias": (w,),
            p + "mlp.c_fc.weight": (4 * w, w), p + "mlp.c_fc.bias": (4 * w,),
            p + "mlp.c_proj.weight": (w, 4 * w), p + "mlp.c_proj.bias": (w,),
        })
    if whole:
        shapes.update({"visual.ln_post.weight": (w,), "visual.ln_post.bias": (w,)})
    return shapes


def llama3_8b_layer_shapes(layers: int = 1) -> dict[str, tuple[int, ...]]:
    """Key -> shape of ``layers`` decoder layers of Llama-3-8B (hidden 4096, 32 query / 8 key-value heads of
    128, MLP 14336), Hugging Face names, PyTorch's d_out x d_in."""
    h, kv, f = 4096, 1024, 14336
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f),
        })
    return shapes
