"""The mini-world's model sizes as open_clip model configs, in a module without torch (the
command line checks ``--size`` against it before anything heavy loads)."""

from __future__ import annotations

__all__ = ["SIZES"]

# The mini-world's sizes as open_clip model configs (same schema as open_clip's
# ``model_configs/*.json``). ``head_width`` sets the number of attention heads
# (width // head_width). The text towers are small; they are only built by
# ``open_clip.create_model`` / :func:`acetools.world.vision.models.build_clip` (tiny-CLIP experiments, tests).
SIZES: dict[str, dict] = {
    "micro": {  # tests: a few thousand parameters' worth of seconds
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    },
    "tiny": {  # 0.82 M parameters, 65 tokens
        "embed_dim": 128,
        "vision_cfg": {"image_size": 32, "patch_size": 4, "width": 128, "layers": 4, "head_width": 32},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 128, "heads": 4, "layers": 2},
    },
    "small": {  # width 192, 6 layers, patch 8 (17 tokens): ~1.8x faster than patch 4
        "embed_dim": 192,
        "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 192, "layers": 6, "head_width": 32},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 192, "heads": 6, "layers": 2},
    },
    "wide": {  # width 384, 4 layers, patch 8: twice small's width (384 / T directions per task for TSV-M)
        "embed_dim": 384,
        "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 384, "layers": 4, "head_width": 64},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 384, "heads": 6, "layers": 2},
    },
}
