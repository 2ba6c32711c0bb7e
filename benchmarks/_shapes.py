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
