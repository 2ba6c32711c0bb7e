"""benchmarks/gpu_merge_time.py: its flop model agrees with merge_speed.py's where both count the same algorithm,
its shapes are the architectures', and its bounds grow with T as the algorithms do."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def scripts():
    return load_script("gpu_merge_time"), load_script("merge_speed"), load_script("_shapes")


def test_ace_flops_are_merge_speeds_model_on_the_flagged_path(scripts):
    gmt, ms, _ = scripts
    mats = [s for s in ms.vit_b32_shapes(1).values() if len(s) == 2]
    for T in (8, 20):
        ours = sum(gmt.matrix_flops("ace", m, n, T, 0) for m, n in mats)
        assert ours == pytest.approx(ms.model_flops("ace", T, 1, flagged=1.0) * 1e9, rel=1e-12)


def test_llama_layer_shapes_and_bounds(scripts):
    gmt, _, shapes = scripts
    layer = shapes.llama3_8b_layer_shapes()
    n_params = sum(a * (b if len(s) == 2 else 1) for s in layer.values() for a, b in [(s[0], s[-1])])
    assert n_params == 218_112_000  # 32 such layers + embeddings and head make Llama-3-8B's 8.03 B
    for method in ("task_arithmetic", "ties", "tsv_m", "ace", "wudi", "regmean"):
        f8, b8 = gmt.bounds(method, layer, 8, 4, 20)
        f20, b20 = gmt.bounds(method, layer, 20, 4, 20)
        assert 0 < f8 < f20 and 0 < b8 < b20, method
    assert gmt.bounds("task_arithmetic", layer, 8, 8, 20)[1] == pytest.approx(2 * gmt.bounds(
        "task_arithmetic", layer, 8, 4, 20)[1])  # float64 moves twice the bytes
