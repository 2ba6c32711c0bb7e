"""Weight averaging and task arithmetic (docs/methods.md §Weight averaging, §Task arithmetic), and the input checks of
merge()."""

from __future__ import annotations

import math

import pytest
import torch

import acetools
from acetools.merging import METHODS, merge, task_vectors
from tests.conftest import SHAPES, make_world


def _clone(sd):
    return {k: v.clone() for k, v in sd.items()}


def _tv(base, ex, key):
    return ex[key].double() - base[key].double()


# --- the equations of docs/methods.md --------------------------------------------------------

def test_weight_averaging_is_mean_of_experts(world64):
    base, experts = world64
    out = merge("weight_averaging", base, experts)
    for key in base:
        # theta = theta0 + (1/T) sum_t tau_t  ==  (1/T) sum_t theta_t
        expected = base[key] + sum(_tv(base, ex, key) for ex in experts) / len(experts)
        torch.testing.assert_close(out[key], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out[key], sum(ex[key] for ex in experts) / len(experts), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0, 2.5])
def test_task_arithmetic_equation(world64, lam):
    base, experts = world64
    out = merge("task_arithmetic", base, experts, lam=lam)
    for key in base:
        expected = base[key] + lam * sum(_tv(base, ex, key) for ex in experts)
        torch.testing.assert_close(out[key], expected, rtol=1e-12, atol=1e-12)


def test_task_arithmetic_default_lam_is_0_3(world64):
    base, experts = world64
    assert METHODS["task_arithmetic"].hparams == {"lam": 0.3, "weights": None}
    a = merge("task_arithmetic", base, experts)
    b = merge("task_arithmetic", base, experts, lam=0.3)
    assert all(torch.equal(a[k], b[k]) for k in base)


def test_ta_with_lam_one_over_T_equals_weight_averaging(world64):
    base, experts = world64
    a = merge("task_arithmetic", base, experts, lam=1 / len(experts))
    b = merge("weight_averaging", base, experts)
    for k in base:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-12)


def test_single_expert():
    base, experts = make_world(n_tasks=1, dtype=torch.float64)
    wa = merge("weight_averaging", base, experts)
    ta = merge("task_arithmetic", base, experts, lam=1.0)
    for k in base:
        torch.testing.assert_close(wa[k], experts[0][k], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ta[k], experts[0][k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["weight_averaging", "task_arithmetic"])
def test_zero_task_vectors_return_base_exactly(world, method):
    base, _ = world
    experts = [_clone(base) for _ in range(3)]
    out = merge(method, base, experts)
    assert all(torch.equal(out[k], base[k]) for k in base)


@pytest.mark.parametrize("method", ["weight_averaging", "task_arithmetic"])
def test_expert_order_invariance(world, method):
    base, experts = world
    a = merge(method, base, experts)
    b = merge(method, base, experts[::-1])
    c = merge(method, base, [experts[2], experts[0], experts[3], experts[1]])
    for k in base:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a[k], c[k], rtol=1e-6, atol=1e-7)


def test_task_arithmetic_is_linear_in_lam(world64):
    base, experts = world64
    a = merge("task_arithmetic", base, experts, lam=0.5)
    b = merge("task_arithmetic", base, experts, lam=1.5)
    for k in base:
        torch.testing.assert_close(b[k] - base[k], 3 * (a[k] - base[k]), rtol=1e-10, atol=1e-12)


def test_returns_every_key_with_shape():
    base, experts = make_world()
    out = merge("weight_averaging", base, experts)
    assert list(out) == list(SHAPES)
    assert all(out[k].shape == base[k].shape for k in base)


# --- dtype, device, inputs -----------------------------------------------------------------

def test_float64_is_kept_and_computed_in_float64(world64):
    base, experts = world64
    out = merge("task_arithmetic", base, experts, lam=0.7)
    assert all(out[k].dtype == torch.float64 for k in out)
    key = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    exact = base[key] + 0.7 * sum(ex[key] - base[key] for ex in experts)
    # float32 arithmetic would be off by ~1e-7; float64 is within ~1e-15
    assert (out[key] - exact).abs().max() < 1e-13


def test_bfloat16_base_returns_bfloat16():
    base, experts = make_world(dtype=torch.bfloat16)
    out = merge("task_arithmetic", base, experts, lam=0.4)
    for k in base:
        assert out[k].dtype == torch.bfloat16
        # computed in float32 and rounded to bfloat16 once at the end: within one bf16 rounding
        expected = (base[k].double()
                    + 0.4 * sum(ex[k].double() - base[k].double() for ex in experts)).to(torch.bfloat16)
        torch.testing.assert_close(out[k], expected, rtol=2**-8, atol=1e-6)


def test_device_kwarg_cpu(world):
    base, experts = world
    out = merge("weight_averaging", base, experts, device="cpu")
    assert all(v.device.type == "cpu" for v in out.values())
    ref = merge("weight_averaging", base, experts, device=torch.device("cpu"))
    assert all(torch.equal(out[k], ref[k]) for k in base)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_device_cuda_without_cuda_raises(world):
    base, experts = world
    with pytest.raises(ValueError, match="no CUDA device"):
        merge("weight_averaging", base, experts, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_cuda_matches_cpu(world):
    base, experts = world
    for method in ("weight_averaging", "task_arithmetic"):
        g = merge(method, base, experts, device="cuda")
        c = merge(method, base, experts)
        assert all(g[k].device.type == "cuda" for k in g)
        for k in base:
            torch.testing.assert_close(g[k].cpu(), c[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("method", ["weight_averaging", "task_arithmetic"])
def test_inputs_unmodified(world, method):
    base, experts = world
    b0, e0 = _clone(base), [_clone(e) for e in experts]
    out = merge(method, base, experts)
    assert all(torch.equal(base[k], b0[k]) for k in base)
    assert all(torch.equal(e[k], f[k]) for e, f in zip(experts, e0) for k in base)
    # the output does not alias the input
    out["visual.ln_pre.weight"].add_(1.0)
    assert torch.equal(base["visual.ln_pre.weight"], b0["visual.ln_pre.weight"])


def test_task_vectors_helper(world64):
    base, experts = world64
    tvs = task_vectors(base, experts)
    assert len(tvs) == len(experts)
    for tv, ex in zip(tvs, experts):
        for k in base:
            assert torch.equal(tv[k], ex[k] - base[k])


def test_top_level_exports():
    assert acetools.merge is merge
    assert {"weight_averaging", "task_arithmetic"} <= set(acetools.METHODS)


# --- validation errors of merge() ----------------------------------------------------------

def test_unknown_method_lists_valid_ones(world):
    base, experts = world
    with pytest.raises(ValueError, match="unknown merge method 'avg'") as e:
        merge("avg", base, experts)
    assert "task_arithmetic" in str(e.value) and "weight_averaging" in str(e.value)


def test_unknown_hyperparameter_lists_valid_ones(world):
    base, experts = world
    with pytest.raises(TypeError, match=r"unknown hyperparameter\(s\) \['scaling_factor'\]") as e:
        merge("task_arithmetic", base, experts, scaling_factor=0.3)
    assert "lam" in str(e.value)
    with pytest.raises(TypeError, match="valid ones are: weights \\(plus"):
        merge("weight_averaging", base, experts, lam=0.3)


@pytest.mark.parametrize("lam, exc, msg", [
    (-0.1, ValueError, "out of range: must be >= 0.0"),
    (math.nan, ValueError, "must be finite"),
    (math.inf, ValueError, "must be finite"),
    ("0.3", TypeError, "must be a number"),
    (True, TypeError, "must be a number"),
])
def test_out_of_range_hyperparameter(world, lam, exc, msg):
    base, experts = world
    with pytest.raises(exc, match=msg) as e:
        merge("task_arithmetic", base, experts, lam=lam)
    assert "task_arithmetic: hyperparameter lam=" in str(e.value)


def test_empty_expert_list(world):
    base, _ = world
    with pytest.raises(ValueError, match="experts is empty"):
        merge("weight_averaging", base, [])


def test_experts_must_be_a_list(world):
    base, experts = world
    with pytest.raises(TypeError, match="experts must be a list of state dicts"):
        merge("weight_averaging", base, experts[0])


def test_missing_key_named_with_expert_index(world):
    base, experts = world
    experts = [_clone(e) for e in experts]
    del experts[2]["visual.proj"]
    with pytest.raises(KeyError, match=r"experts\[2\] is missing key 'visual.proj'"):
        merge("weight_averaging", base, experts)


def test_extra_key_named_with_expert_index(world):
    base, experts = world
    experts = [_clone(e) for e in experts]
    experts[1]["head.weight"] = torch.zeros(3)
    with pytest.raises(KeyError, match=r"experts\[1\] has key 'head.weight'.*that base does not have"):
        merge("weight_averaging", base, experts)


def test_shape_mismatch_names_key(world):
    base, experts = world
    experts = [_clone(e) for e in experts]
    key = "visual.transformer.resblocks.0.attn.out_proj.weight"
    experts[3][key] = torch.zeros(16, 15)
    with pytest.raises(ValueError, match=rf"shape mismatch at key '{key}'.*experts\[3\] has \(16, 15\)"):
        merge("task_arithmetic", base, experts)


def test_non_float_buffers_carried_from_base(world):
    base, experts = world
    base = _clone(base)
    base["position_ids"] = torch.arange(5)
    experts = [dict(e, position_ids=torch.arange(5)) for e in experts]
    out = merge("weight_averaging", base, experts)
    assert out["position_ids"].dtype == torch.int64 and torch.equal(out["position_ids"], torch.arange(5))
    ref = merge("weight_averaging", {k: v for k, v in base.items() if k != "position_ids"},
                [{k: v for k, v in e.items() if k != "position_ids"} for e in experts])
    assert all(torch.equal(out[k], ref[k]) for k in ref)
    experts[1] = dict(experts[1], position_ids=torch.arange(5) + 1)
    with pytest.warns(UserWarning, match=r"'position_ids' differs from the base in experts \[1\]"):
        out = merge("weight_averaging", base, experts)
    assert torch.equal(out["position_ids"], torch.arange(5))


def test_mixed_dtypes_name_key_and_expert(world):
    base, experts = world
    experts = [_clone(e) for e in experts]
    experts[1]["visual.ln_post.bias"] = experts[1]["visual.ln_post.bias"].double()
    with pytest.raises(TypeError, match=r"mixed dtypes at key 'visual.ln_post.bias'.*experts\[1\] is torch.float64"):
        merge("weight_averaging", base, experts)


@pytest.mark.parametrize("bad, word", [(math.nan, "1 NaN and 0 Inf"), (math.inf, "0 NaN and 1 Inf")])
def test_nan_inf_named_with_key_and_expert(world, bad, word):
    base, experts = world
    experts = [_clone(e) for e in experts]
    experts[2]["visual.class_embedding"][3] = bad
    with pytest.raises(ValueError, match=rf"experts\[2\]\['visual.class_embedding'\] contains {word}"):
        merge("task_arithmetic", base, experts)


def test_nan_in_base_named(world):
    base, experts = world
    base = _clone(base)
    base["visual.proj"][0, 0] = math.nan
    with pytest.raises(ValueError, match=r"base\['visual.proj'\] contains 1 NaN"):
        merge("weight_averaging", base, experts)


def test_is_matrix_must_be_callable(world):
    base, experts = world
    with pytest.raises(TypeError, match="is_matrix must be a callable"):
        merge("weight_averaging", base, experts, is_matrix=True)
