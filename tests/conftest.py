"""Shared fixtures: small random base/expert state dicts with CLIP-like key names."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest
import torch

# The tests use small tensors: one thread avoids OpenMP spin-wait slowdowns of tiny LAPACK
# calls (measured ~100x on a busy 2-core machine) and fixes the reduction order.
torch.set_num_threads(1)

# open_clip-style names so the key rules of docs/methods.md (matrix path, CART's attn/mlp, WUDI/ESM
# targets) apply exactly as on a real ViT.
SHAPES = {
    "visual.conv1.weight": (16, 3, 4, 4),
    "visual.class_embedding": (16,),
    "visual.positional_embedding": (5, 16),
    "visual.ln_pre.weight": (16,),
    "visual.ln_pre.bias": (16,),
    "visual.transformer.resblocks.0.ln_1.weight": (16,),
    "visual.transformer.resblocks.0.ln_1.bias": (16,),
    "visual.transformer.resblocks.0.attn.in_proj_weight": (48, 16),
    "visual.transformer.resblocks.0.attn.in_proj_bias": (48,),
    "visual.transformer.resblocks.0.attn.out_proj.weight": (16, 16),
    "visual.transformer.resblocks.0.attn.out_proj.bias": (16,),
    "visual.transformer.resblocks.0.ln_2.weight": (16,),
    "visual.transformer.resblocks.0.ln_2.bias": (16,),
    "visual.transformer.resblocks.0.mlp.c_fc.weight": (64, 16),
    "visual.transformer.resblocks.0.mlp.c_fc.bias": (64,),
    "visual.transformer.resblocks.0.mlp.c_proj.weight": (16, 64),
    "visual.transformer.resblocks.0.mlp.c_proj.bias": (16,),
    "visual.ln_post.weight": (16,),
    "visual.ln_post.bias": (16,),
    "visual.proj": (16, 8),
    "text_projection": (8, 8),
}


def make_world(n_tasks: int = 4, seed: int = 0, rank: int = 4, scale: float = 0.05,
               dtype: torch.dtype = torch.float32, shapes: dict | None = None):
    """A base state dict and ``n_tasks`` experts whose 2-D task vectors are low rank.

    Returns ``(base, experts)``; the text_projection task vector is zero, as in CLIP.
    """
    g = torch.Generator().manual_seed(seed)
    shapes = shapes or SHAPES
    base = {k: torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for k, s in shapes.items()}
    experts = []
    for _ in range(n_tasks):
        ex = {}
        for k, s in shapes.items():
            if k == "text_projection":
                tau = torch.zeros(s, dtype=torch.float64)
            elif len(s) == 2:
                r = min(rank, *s)
                tau = (torch.randn(s[0], r, generator=g, dtype=torch.float64)
                       @ torch.randn(r, s[1], generator=g, dtype=torch.float64))
                tau = scale * tau / r ** 0.5
            else:
                tau = scale * torch.randn(s, generator=g, dtype=torch.float64)
            ex[k] = (base[k].double() + tau).to(dtype)
        experts.append(ex)
    return base, experts


@pytest.fixture
def world():
    return make_world()


@pytest.fixture
def world64():
    return make_world(dtype=torch.float64)


def load_script(name: str):
    """A script of ``benchmarks/`` (``name`` without ``.py``) imported as a module, for its tests. The scripts
    beside it that it imports by name (``_shapes``, ``text_world``) are loaded first, from its folder, as Python
    finds them when it runs the script (its folder first on the path)."""
    from pathlib import Path

    return _load_by_path(Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py", f"benchmarks_{name}")


def _load_by_path(path, module_name: str, loading: frozenset = frozenset()):
    """``path`` executed as the module ``module_name``, after the scripts beside it that it imports (each loaded
    once, under its own name, as an import from the script's folder is; ``loading``: those on the way here)."""
    import ast
    import importlib.util
    import sys

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
        for top in {n.split(".")[0] for n in names} - loading - {path.stem}:
            sibling = path.parent / f"{top}.py"
            if sibling.is_file() and getattr(sys.modules.get(top), "__file__", None) != str(sibling):
                _load_by_path(sibling, top, loading | {path.stem})
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sibling = module_name == path.stem  # importable by its name, as ``import text_world`` finds it
    if sibling:
        sys.modules[module_name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        if sibling:
            sys.modules.pop(module_name, None)
        raise
    return mod
