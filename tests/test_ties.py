"""TIES-Merging (docs/methods.md §TIES) and DARE (docs/methods.md §DARE) against brute force, by hand and by
statistics."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from acetools.merging import METHODS, merge, task_vectors
from acetools.merging.ties import (
    dare_mask,
    dare_seed,
    dare_task_vectors,
    disjoint_merge,
    drop_and_rescale,
    elect_sign,
    kept_count,
    majority_sign,
    resolve_zero_signs,
    ties,
    trim,
    trim_threshold,
)
from tests.conftest import make_world


def _sgn(x: float) -> int:
    return (x > 0) - (x < 0)


def ties_brute_force(tvs, k, scope, merge_func, lam=1.0):
    """docs/methods.md §TIES, Eqs. (TIES.1)-(TIES.3), with explicit Python loops over coordinates.

    ``tvs`` is a list (one per task) of ``{key: list of floats}``. Returns ``{key: list}``.
    """
    T = len(tvs)
    keys = list(tvs[0])
    groups = [keys] if scope == "global" else [[key] for key in keys]
    out = {}
    for group in groups:
        # 1. trim: keep |v| >= the floor(k n / 100)-th largest magnitude of the group
        trimmed = []
        for t in range(T):
            mags = sorted((abs(v) for key in group for v in tvs[t][key]), reverse=True)
            n_keep = math.floor(Fraction(str(k)) * len(mags) / 100)
            thr = mags[n_keep - 1] if n_keep > 0 else math.inf
            trimmed.append({key: [v if abs(v) >= thr else 0.0 for v in tvs[t][key]] for key in group})
        # 2. elect: sign of the sum; zero sums take the sign of the sum of all elected signs
        signs = {}
        for key in group:
            signs[key] = []
            for i in range(len(tvs[0][key])):
                s = 0.0
                for t in range(T):
                    s += trimmed[t][key][i]
                signs[key].append(_sgn(s))
        majority = _sgn(sum(s for key in group for s in signs[key]))
        # 3. disjoint merge
        for key in group:
            vals = []
            for i, s in enumerate(signs[key]):
                g = s if s != 0 else majority
                selected = [trimmed[t][key][i] for t in range(T)
                            if trimmed[t][key][i] != 0 and _sgn(trimmed[t][key][i]) == g]
                agg = sum(selected)
                if merge_func == "mean":
                    agg = agg / max(1, len(selected))
                vals.append(lam * agg)
            out[key] = vals
    return out


def _as_lists(tvs):
    return [{k: v.reshape(-1).tolist() for k, v in tv.items()} for tv in tvs]


def _run(method, tvs, dtype=torch.float64, **hp):
    """merge() on base = 0, so the merged weights are the update itself."""
    base = {k: torch.zeros_like(v, dtype=dtype) for k, v in tvs[0].items()}
    experts = [{k: v.to(dtype) for k, v in tv.items()} for tv in tvs]
    return merge(method, base, experts, **hp)


# Hand-made task vectors (T = 3; 9 coordinates per task: w has 6, b has 3). Every value is a
# dyadic rational, so every sum is exact.
HAND = [
    {"w": [4, -1, 2, 2, 0.5, -3], "b": [1, -0.25, 0.5]},
    {"w": [-2, 1, 0.5, -4, 0.25, 3], "b": [-1, 2, -0.5]},
    {"w": [1, 0.5, -0.25, 4, -2, 0.125], "b": [0.5, -2, 3]},
]


def _hand_tensors():
    return [{"w": torch.tensor(tv["w"], dtype=torch.float64).reshape(2, 3),
             "b": torch.tensor(tv["b"], dtype=torch.float64)} for tv in HAND]


# Worked by hand with k = 34:
# global: floor(0.34 * 9) = 3 kept, but the 3rd and 4th magnitudes tie at 2, so 4 are kept per
#   task. Sums per coordinate: w = [2, 0 (all trimmed), 2, 2, -2, 0 (3 - 3)], b = [0 (all
#   trimmed), 0 (2 - 2), 3]; the majority sign is sign(1+1+1-1+1) = +, so w5 takes +3 and b1
#   takes +2.
HAND_GLOBAL_MEAN = {"w": [4, 0, 2, 3, -2, 3], "b": [0, 2, 3]}
HAND_GLOBAL_SUM = {"w": [4, 0, 2, 6, -2, 3], "b": [0, 2, 3]}
# tensor: w keeps floor(0.34 * 6) = 2 per task, b keeps floor(0.34 * 3) = 1. w sums
#   [4, 0, 0, 0 (-4 + 4), -2, 0 (-3 + 3)] elect signs [+, 0, 0, 0, -, 0]: their sum is 0, so
#   the majority is 0 and the cancelled coordinates w3, w5 select nothing.
HAND_TENSOR_MEAN = {"w": [4, 0, 0, 0, -2, 0], "b": [1, 2, 3]}


# --- kept_count / trim ---------------------------------------------------------------------

@pytest.mark.parametrize("n, k, expected", [
    (100, 29, 29),      # 0.29 * 100 = 28.999... in floats; the count is still 29
    (100, 20, 20), (9, 34, 3), (6, 34, 2), (3, 34, 1), (4, 20, 0), (7, 100, 7), (10, 0.5, 0),
    (1000, 20.1, 201), (10**9, 20, 2 * 10**8),
])
def test_kept_count(n, k, expected):
    assert kept_count(n, k) == expected


@pytest.mark.parametrize("k", [0, -5, 100.5])
def test_kept_count_rejects_bad_k(k):
    with pytest.raises(ValueError, match="percent of entries kept"):
        kept_count(10, k)


def test_trim_threshold_keeps_ties():
    x = torch.tensor([4.0, -1, 2, 2, 0.5, -3, 1, -0.25, 0.5])
    thr = trim_threshold(x, 34)
    assert thr.item() == 2.0
    assert int((x.abs() >= thr).sum()) == 4  # 3 asked for, the tie at 2 is kept
    assert trim_threshold(x, 100).item() == 0.25
    assert math.isinf(trim_threshold(x, 5).item())  # floor(0.45) = 0: nothing kept
    # the float64 (numpy) and the other dtypes' (torch.kthvalue) paths agree
    assert trim_threshold(x.double(), 34).item() == 2.0
    assert trim_threshold(x.bfloat16(), 34).item() == 2.0
    assert trim_threshold([x[:4], x[4:]], 100).item() == 0.25  # several tensors: ranked together


def test_trim_global_and_tensor_counts():
    tvs = task_vectors({"a": torch.zeros(10), "b": torch.zeros(30)},
                       [{"a": torch.randn(10, generator=torch.Generator().manual_seed(i)),
                         "b": 3 * torch.randn(30, generator=torch.Generator().manual_seed(10 + i))} for i in range(2)])
    g = trim(tvs, k=25, scope="global")
    t = trim(tvs, k=25, scope="tensor")
    for tv in g:
        assert sum(int((v != 0).sum()) for v in tv.values()) == 10  # floor(0.25 * 40)
    for tv in t:
        assert int((tv["a"] != 0).sum()) == 2 and int((tv["b"] != 0).sum()) == 7
    # the global trim keeps the largest magnitudes of the whole model, mostly from b here
    assert sum(int((tv["b"] != 0).sum()) for tv in g) > sum(int((tv["a"] != 0).sum()) for tv in g)


def test_trim_rejects_bad_scope():
    tvs = [{"a": torch.ones(3)}]
    with pytest.raises(ValueError, match="scope='layer'"):
        trim(tvs, 20, scope="layer")
    with pytest.raises(ValueError, match="at least one task vector"):
        trim([], 20)


# --- TIES against the hand computation and brute force ---------------------------------------

def test_brute_force_reproduces_hand_computation():
    assert ties_brute_force(HAND, 34, "global", "mean") == HAND_GLOBAL_MEAN
    assert ties_brute_force(HAND, 34, "global", "sum") == HAND_GLOBAL_SUM
    assert ties_brute_force(HAND, 34, "tensor", "mean") == HAND_TENSOR_MEAN


@pytest.mark.parametrize("scope, merge_func, expected", [
    ("global", "mean", HAND_GLOBAL_MEAN), ("global", "sum", HAND_GLOBAL_SUM), ("tensor", "mean", HAND_TENSOR_MEAN),
])
def test_ties_hand_example(scope, merge_func, expected):
    out = _run("ties", _hand_tensors(), k=34, scope=scope, merge=merge_func, lam=1.0)
    assert out["w"].reshape(-1).tolist() == expected["w"]
    assert out["b"].tolist() == expected["b"]


def test_ties_tensor_sum_hand_example():
    out = _run("ties", _hand_tensors(), k=34, scope="tensor", merge="sum")
    ref = ties_brute_force(HAND, 34, "tensor", "sum")
    assert out["w"].reshape(-1).tolist() == ref["w"] and out["b"].tolist() == ref["b"]


def test_zero_sign_takes_majority_positive_and_negative():
    # k = 100: no trimming. Coordinates 0 and 2 cancel exactly; coordinate 3 is all zero.
    pos = [{"x": [1.0, 2, -1, 0]}, {"x": [-1.0, 3, 1, 0]}]
    neg = [{"x": [1.0, -2, -1, 0]}, {"x": [-1.0, -3, 1, 0]}]
    for scope in ("global", "tensor"):
        for data, expected in ((pos, [1, 2.5, 1, 0]), (neg, [-1, -2.5, -1, 0])):
            tvs = [{"x": torch.tensor(d["x"], dtype=torch.float64)} for d in data]
            out = _run("ties", tvs, k=100, scope=scope)
            assert out["x"].tolist() == expected
            assert ties_brute_force(data, 100, scope, "mean")["x"] == expected


def test_global_and_tensor_majority_differ():
    # a's own elected signs are [0, -, -] but the model-wide majority is + (b votes + 5 times)
    data = [{"a": [1.0, -2, -3], "b": [1.0] * 5}, {"a": [-1.0, -2, -3], "b": [1.0] * 5}]
    tvs = [{k: torch.tensor(v, dtype=torch.float64) for k, v in d.items()} for d in data]
    g = _run("ties", tvs, k=100, scope="global")
    t = _run("ties", tvs, k=100, scope="tensor")
    assert g["a"].tolist() == [1, -2, -3]
    assert t["a"].tolist() == [-1, -2, -3]


def _random_tvs(seed, n_tasks=3, shapes=(("m", (3, 4)), ("v", (5,)), ("c", (2, 2, 2))), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [{name: torch.randn(shape, generator=g, dtype=dtype) * (1 + i) for i, (name, shape) in enumerate(shapes)}
            for _ in range(n_tasks)]


@pytest.mark.parametrize("scope", ["global", "tensor"])
@pytest.mark.parametrize("merge_func", ["mean", "sum"])
@pytest.mark.parametrize("k", [10, 20, 34, 50, 100])
def test_ties_random_matches_brute_force(scope, merge_func, k):
    tvs = _random_tvs(seed=k)
    out = _run("ties", tvs, dtype=torch.float32, k=k, scope=scope, merge=merge_func, lam=0.7)
    ref = ties_brute_force(_as_lists(tvs), k, scope, merge_func, lam=0.7)
    for key in ref:
        torch.testing.assert_close(out[key].reshape(-1), torch.tensor(ref[key], dtype=torch.float32),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("scope", ["global", "tensor"])
@pytest.mark.parametrize("merge_func", ["mean", "sum"])
def test_ties_in_parts_is_bitwise_the_whole_key(monkeypatch, scope, merge_func):
    """TIES' histogram, election and disjoint merge go PART entries of a key at a time (the streamed merge's
    work space); the result does not depend on PART, bit for bit, nor do the radix thresholds."""
    import acetools.merging.ties as ties_module
    from acetools.merging.ties import radix_thresholds

    tvs = _random_tvs(seed=5, shapes=(("m", (13, 11)), ("v", (37,)), ("c", (3, 4, 5))))
    for tv in tvs:
        tv["v"][::3] = 0.0  # zero sums: the majority sign decides
    whole = _run("ties", tvs, dtype=torch.float32, k=30, scope=scope, merge=merge_func)
    thr = radix_thresholds(list(tvs[0]), lambda key: [tv[key] for tv in tvs], 3, 30, torch.float32,
                           sum(v.numel() for v in tvs[0].values()))
    monkeypatch.setattr(ties_module, "PART", 7)  # parts that end inside every key
    parts = _run("ties", tvs, dtype=torch.float32, k=30, scope=scope, merge=merge_func)
    for key in whole:
        assert torch.equal(parts[key], whole[key]), key
    assert radix_thresholds(list(tvs[0]), lambda key: [tv[key] for tv in tvs], 3, 30, torch.float32,
                            sum(v.numel() for v in tvs[0].values())) == thr
    ref = ties_brute_force(_as_lists(tvs), 30, scope, merge_func)
    for key in ref:
        torch.testing.assert_close(parts[key].reshape(-1), torch.tensor(ref[key], dtype=torch.float32),
                                   rtol=1e-6, atol=1e-7)


def test_ties_on_clip_world_matches_brute_force(world64):
    base, experts = world64
    tvs = task_vectors(base, experts)
    for scope in ("global", "tensor"):
        out = merge("ties", base, experts, k=20, scope=scope, lam=1.0)
        ref = ties_brute_force(_as_lists(tvs), 20, scope, "mean")
        for key in base:
            torch.testing.assert_close((out[key] - base[key]).reshape(-1), torch.tensor(ref[key], dtype=torch.float64),
                                       rtol=1e-9, atol=1e-12)


def test_tiny_tensor_is_trimmed_away_in_tensor_scope():
    g = torch.Generator().manual_seed(0)
    tvs = [{"logit_scale": torch.tensor([5.0]), "w": torch.randn(10, generator=g)} for _ in range(2)]
    out = _run("ties", tvs, k=20, scope="tensor")
    assert out["logit_scale"].tolist() == [0.0]  # floor(0.2 * 1) = 0 entries kept
    # globally, floor(0.2 * 11) = 2 entries are kept per task and 5.0 is the largest of them
    out = _run("ties", tvs, k=20, scope="global")
    assert out["logit_scale"].tolist() == [5.0]


# --- TIES step functions and properties --------------------------------------------------------

def test_step_functions_compose_to_ties():
    tvs = _random_tvs(seed=5, dtype=torch.float64)
    keys = list(tvs[0])
    trimmed = trim(tvs, k=30, scope="global")
    gammas = {key: elect_sign(torch.stack([tv[key] for tv in trimmed])) for key in keys}
    maj = majority_sign(gammas.values())
    steps = {key: disjoint_merge(torch.stack([tv[key] for tv in trimmed]), resolve_zero_signs(gammas[key], maj))
             for key in keys}
    base = {key: torch.zeros_like(v) for key, v in tvs[0].items()}
    direct = ties(base, tvs, is_matrix=None, k=30, lam=1.0, scope="global", merge="mean")
    assert all(torch.equal(steps[key], direct[key]) for key in keys)


def test_disjoint_merge_with_zero_gamma_selects_nothing():
    trimmed = torch.tensor([[1.0, -1.0], [-2.0, 0.0]])
    assert disjoint_merge(trimmed, torch.zeros(2)).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="merge='max'"):
        disjoint_merge(trimmed, torch.ones(2), "max")


def test_majority_sign():
    assert majority_sign([torch.tensor([1, -1, -1], dtype=torch.int8), torch.tensor([0, -1])]) == -1
    assert majority_sign([torch.tensor([1, -1, 1], dtype=torch.int8), torch.tensor([0, 1])]) == 1
    assert majority_sign([torch.tensor([1, -1])]) == 0


def test_ties_single_task_no_trim_is_lam_tau():
    base, experts = make_world(n_tasks=1, dtype=torch.float64)
    out = merge("ties", base, experts, k=100, lam=0.5)
    for k in base:
        torch.testing.assert_close(out[k], base[k] + 0.5 * (experts[0][k] - base[k]), rtol=1e-12, atol=1e-12)


def test_ties_identical_experts_mean_is_trimmed_tau():
    base, experts = make_world(n_tasks=1, dtype=torch.float64)
    tv = task_vectors(base, experts)[0]
    kept = trim([tv], k=20)[0]
    out = merge("ties", base, experts * 3, k=20, lam=1.0)
    for k in base:
        torch.testing.assert_close(out[k] - base[k], kept[k], rtol=1e-12, atol=1e-12)


def test_ties_order_invariance_and_scale_equivariance(world64):
    base, experts = world64
    a = merge("ties", base, experts, k=20)
    b = merge("ties", base, experts[::-1], k=20)
    for k in base:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-12)
    # trimming, signs and means commute with scaling every task vector by c > 0
    scaled = [{k: base[k] + 4.0 * (ex[k] - base[k]) for k in base} for ex in experts]
    c = merge("ties", base, scaled, k=20)
    for k in base:
        torch.testing.assert_close(c[k] - base[k], 4.0 * (a[k] - base[k]), rtol=1e-12, atol=1e-12)


def test_ties_sum_is_mean_times_count(world64):
    base, experts = world64
    tvs = task_vectors(base, experts)
    trimmed = trim(tvs, 20)
    m = merge("ties", base, experts, merge="mean")
    s = merge("ties", base, experts, merge="sum")
    key = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    stack = torch.stack([tv[key] for tv in trimmed])
    count = ((torch.sign(stack) == torch.sign(s[key] - base[key])) & (stack != 0)).sum(0).clamp(min=1)
    torch.testing.assert_close(s[key] - base[key], (m[key] - base[key]) * count, rtol=1e-10, atol=1e-12)


def test_ties_defaults():
    assert METHODS["ties"].hparams == {"k": 20, "lam": 1.0, "scope": "global", "merge": "mean", "weights": None}


@pytest.mark.parametrize("method", ["ties", "dare"])
def test_inputs_unmodified_and_dtypes_kept(method):
    for dtype in (torch.float64, torch.bfloat16, torch.float32):
        base, experts = make_world(dtype=dtype)
        b0 = {k: v.clone() for k, v in base.items()}
        e0 = [{k: v.clone() for k, v in e.items()} for e in experts]
        out = merge(method, base, experts)
        assert all(out[k].dtype == dtype for k in out)
        assert all(torch.equal(base[k], b0[k]) for k in base)
        assert all(torch.equal(e[k], f[k]) for e, f in zip(experts, e0) for k in base)


@pytest.mark.parametrize("hp, exc, msg", [
    ({"k": 0}, ValueError, "hyperparameter k=0 is out of range: must be > 0.0"),
    ({"k": 120}, ValueError, "k=120 is out of range: must be <= 100.0"),
    ({"k": "20"}, TypeError, "k='20' must be a number"),
    ({"scope": "layer"}, ValueError, r"scope='layer' is not one of \['global', 'tensor'\]"),
    ({"merge": "max"}, ValueError, r"merge='max' is not one of \['mean', 'sum'\]"),
    ({"lam": -1}, ValueError, "lam=-1 is out of range"),
    ({"threshold": 20}, TypeError, "valid ones are: k, lam, scope, merge"),
])
def test_ties_bad_hyperparameters(world, hp, exc, msg):
    base, experts = world
    with pytest.raises(exc, match=msg):
        merge("ties", base, experts, **hp)


# --- DARE ----------------------------------------------------------------------------------------

def test_dare_defaults():
    assert METHODS["dare"].hparams == {"p": 0.5, "base_method": "task_arithmetic", "seed": 0, "lam": 0.3,
                                       "rescale": True, "k": 20, "scope": "global", "merge": "mean",
                                       "weights": None}


def test_dare_seed_derivation_is_fixed():
    # sha256("acetools.dare:0:0:visual.proj")[:8], little-endian, top bit cleared. Changing the
    # derivation changes every DARE result ever published with acetools.
    assert dare_seed(0, 0, "visual.proj") == 8385323745851818184
    assert len({dare_seed(s, t, k) for s in (0, 1) for t in (0, 1) for k in ("a", "b")}) == 8


@pytest.mark.parametrize("base_method", ["task_arithmetic", "ties"])
def test_dare_same_seed_same_weights_different_seed_differs(world, base_method):
    base, experts = world
    a = merge("dare", base, experts, seed=3, base_method=base_method)
    b = merge("dare", base, experts, seed=3, base_method=base_method)
    c = merge("dare", base, experts, seed=4, base_method=base_method)
    assert all(torch.equal(a[k], b[k]) for k in base)
    key = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    assert not torch.equal(a[key], c[key])
    assert sum(not torch.equal(a[k], c[k]) for k in base) >= len(base) - 1  # text_projection tau is 0


def test_dare_independent_of_key_order_and_dtype(world):
    base, experts = world
    a = merge("dare", base, experts, seed=7)
    rev = list(base)[::-1]
    b = merge("dare", {k: base[k] for k in rev}, [{k: e[k] for k in rev} for e in experts], seed=7)
    assert all(torch.equal(a[k], b[k]) for k in base)
    tv32 = task_vectors(base, experts)
    tv64 = task_vectors(base, experts, dtype=torch.float64)
    d32 = dare_task_vectors(tv32, 0.5, seed=7)
    d64 = dare_task_vectors(tv64, 0.5, seed=7)
    for x, y in zip(d32, d64):
        for k in base:
            assert torch.equal(x[k] == 0, y[k] == 0)


def test_dare_masks_differ_per_task_and_key():
    m00 = dare_mask((50,), 0.5, 0, 0, "a")
    assert torch.equal(m00, dare_mask((50,), 0.5, 0, 0, "a"))
    assert not torch.equal(m00, dare_mask((50,), 0.5, 0, 1, "a"))
    assert not torch.equal(m00, dare_mask((50,), 0.5, 0, 0, "b"))
    assert not torch.equal(m00, dare_mask((50,), 0.5, 1, 0, "a"))


def test_dare_ta_matches_brute_force(world64):
    base, experts = world64
    p, lam, seed = 0.3, 0.8, 11
    out = merge("dare", base, experts, p=p, lam=lam, seed=seed)
    for key in base:
        expected = torch.zeros_like(base[key])
        for t, ex in enumerate(experts):
            tau = ex[key] - base[key]
            m = dare_mask(tau.shape, p, seed, t, key)
            expected += torch.where(m, 0.0, tau) / (1 - p)
        torch.testing.assert_close(out[key], base[key] + lam * expected, rtol=1e-12, atol=1e-12)


def test_dare_ties_is_ties_on_dropped_vectors(world64):
    base, experts = world64
    tvs = task_vectors(base, experts)
    dropped = dare_task_vectors(tvs, 0.6, seed=2)
    out = merge("dare", base, experts, p=0.6, seed=2, base_method="ties", k=30, scope="tensor", merge="sum", lam=0.5)
    ref = ties({k: torch.zeros_like(v) for k, v in base.items()}, dropped, is_matrix=None, k=30, lam=0.5,
               scope="tensor", merge="sum")
    for key in base:
        torch.testing.assert_close(out[key], base[key] + ref[key], rtol=1e-12, atol=1e-12)


def test_dare_p0_equals_task_arithmetic_and_ties(world):
    base, experts = world
    a = merge("dare", base, experts, p=0.0, lam=0.4)
    b = merge("task_arithmetic", base, experts, lam=0.4)
    assert all(torch.equal(a[k], b[k]) for k in base)
    for scope in ("global", "tensor"):
        a = merge("dare", base, experts, p=0.0, base_method="ties", lam=0.9, k=25, scope=scope)
        b = merge("ties", base, experts, lam=0.9, k=25, scope=scope)
        assert all(torch.equal(a[k], b[k]) for k in base)


def test_drop_and_rescale_values():
    tau = torch.arange(1.0, 201.0)
    m = dare_mask(tau.shape, 0.75, 0, 0, "x")
    r = drop_and_rescale(tau, m, 0.75)
    n = drop_and_rescale(tau, m, 0.75, rescale=False)
    assert torch.equal(r[m], torch.zeros(int(m.sum()))) and torch.equal(n[m], torch.zeros(int(m.sum())))
    assert torch.equal(n[~m], tau[~m])
    torch.testing.assert_close(r[~m], tau[~m] * 4, rtol=0, atol=0)
    with pytest.raises(ValueError, match="mask shape"):
        drop_and_rescale(tau, m[:10], 0.75)


@pytest.mark.parametrize("p", [0.3, 0.9])
def test_dare_drop_fraction_is_p(p):
    n = 200_000
    m = dare_mask((n,), p, 0, 0, "big")
    sd = math.sqrt(n * p * (1 - p))  # binomial standard deviation
    assert abs(int(m.sum()) - n * p) < 5 * sd


def _dare_z_scores(p, rescale, S=400):
    """Per-entry z-scores of the mean of S DARE draws around tau, with Var = tau^2 p/(1-p)/S."""
    g = torch.Generator().manual_seed(0)
    tvs = [{"w": torch.randn(4, 5, generator=g, dtype=torch.float64),
            "b": torch.randn(6, generator=g, dtype=torch.float64)}
           for _ in range(2)]
    acc = [{k: torch.zeros_like(v) for k, v in tv.items()} for tv in tvs]
    for s in range(S):
        for a, d in zip(acc, dare_task_vectors(tvs, p, seed=s, rescale=rescale)):
            for k in a:
                a[k] += d[k]
    zs = []
    for a, tv in zip(acc, tvs):
        for k in tv:
            sd = tv[k].abs() * math.sqrt(p / (1 - p) / S)
            zs.append(((a[k] / S - tv[k]) / sd).reshape(-1))
    return torch.cat(zs)


@pytest.mark.parametrize("p", [0.5, 0.9])
def test_dare_rescaled_is_unbiased(p):
    # E[tau_hat] = tau: every entry's mean over 400 seeds lies within 5 standard deviations
    # (52 entries: a false alarm has probability ~3e-5), and the z-scores average to ~0.
    z = _dare_z_scores(p, rescale=True)
    assert z.abs().max() < 5.0
    assert abs(z.mean().item()) < 5.0 / math.sqrt(z.numel())
    # the same test detects the bias of the unrescaled survivors, E = (1 - p) tau
    z = _dare_z_scores(p, rescale=False)
    assert z.abs().min() > 5.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dare_same_on_gpu(world):
    base, experts = world
    for base_method in ("task_arithmetic", "ties"):
        c = merge("dare", base, experts, seed=5, base_method=base_method)
        g = merge("dare", base, experts, seed=5, base_method=base_method, device="cuda")
        for k in base:
            torch.testing.assert_close(g[k].cpu(), c[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("hp, exc, msg", [
    ({"p": 1.0}, ValueError, "p=1.0 is out of range: must be < 1.0"),
    ({"p": -0.1}, ValueError, "p=-0.1 is out of range: must be >= 0.0"),
    ({"seed": 1.5}, ValueError, "seed must be an int, got float"),
    ({"seed": True}, ValueError, "seed must be an int, got bool"),
    ({"base_method": "linear"}, ValueError, r"base_method='linear' is not one of \['task_arithmetic', 'ties'\]"),
    ({"rescale": "yes"}, TypeError, "rescale='yes' must be bool"),
    ({"sparsity_ratio": 0.5}, TypeError, "valid ones are: p, base_method, seed, lam, rescale, k, scope, merge"),
])
def test_dare_bad_hyperparameters(world, hp, exc, msg):
    base, experts = world
    with pytest.raises(exc, match=msg):
        merge("dare", base, experts, **hp)


def test_dare_mask_rejects_bad_p():
    with pytest.raises(ValueError, match=r"p=1 must be in \[0, 1\)"):
        dare_mask((3,), 1, 0, 0, "a")
