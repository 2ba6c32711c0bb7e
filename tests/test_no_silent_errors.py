"""Never a silently wrong merge: each test here failed (merged without a word) before the fix.

ESM without ESD layers, activations captured with the wrong width (GPT-2 Conv1D), covariances
and Gram matrices that are not symmetric PSD, mean fallbacks without a warning, and plot
helpers that reject the diagnostics' own tables.
"""

from __future__ import annotations

import pytest
import torch

import acetools
from acetools.files.activations import capture_inputs, gram_matrices
from acetools.merging import task_vectors
from acetools.merging.ace import ace_matrix

transformers = pytest.importorskip("transformers")


def tiny_gpt2(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(cfg).eval()


def tiny_clip_vision(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, image_size=16, patch_size=8)
    return transformers.CLIPVisionModel(cfg).eval()


def float_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


def perturbed(base: dict, n: int, scale: float = 0.05, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{k: v + scale * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(n)]


# --------------------------------------------------------------------------- ESM never becomes TSV-M
def _hf_clip_world(n: int = 3):
    model = tiny_clip_vision()
    base = float_state(model)
    base = {k: v for k, v in base.items() if "position_ids" not in k}
    experts = perturbed(base, n)
    keys = [k for k in base if k.endswith(("q_proj.weight", "fc1.weight"))]
    acts = {k: [torch.randn(20, base[k].shape[1]) for _ in range(n)] for k in keys}
    return base, experts, acts


def test_esm_with_hf_clip_names_and_default_targets_is_an_error_not_tsv_m():
    base, experts, acts = _hf_clip_world()
    with pytest.raises(ValueError, match=r"default targets.*targets="):
        acetools.merge("esm", base, experts, activations=acts)
    # with the model's names ESM runs, and differs from TSV-M on the ESD layers
    targets = (r"q_proj\.weight", r"fc1\.weight")
    esm = acetools.merge("esm", base, experts, activations=acts, targets=targets, layer_scaling=False)
    tsv = acetools.merge("tsv_m", base, experts)
    key = next(iter(acts))
    assert not torch.allclose(esm[key], tsv[key])


def test_esm_target_pattern_matching_no_weight_is_named():
    base, experts, acts = _hf_clip_world()
    with pytest.raises(ValueError, match="nonexistent"):
        acetools.merge("esm", base, experts, activations=acts, targets=("nonexistent",))
    with pytest.raises(ValueError, match="'nonexistent'"):
        acetools.merge("esm", base, experts, activations=acts, targets=(r"q_proj\.weight", "fc1", "nonexistent"))


def test_esm_activation_key_outside_the_targets_or_the_model_is_named():
    base, experts, acts = _hf_clip_world()
    targets = (r"q_proj\.weight",)  # the fc1 activations would be ignored
    with pytest.raises(KeyError, match=r"fc1\.weight.*no ESM target"):
        acetools.merge("esm", base, experts, activations=acts, targets=targets, layer_scaling=False)
    bad = {**acts, "vision_model.nope.weight": acts[next(iter(acts))]}
    with pytest.raises(KeyError, match=r"nope\.weight.*not a weight"):
        acetools.merge("esm", base, experts, activations=bad, targets=(r"q_proj\.weight", "fc1"),
                       layer_scaling=False)


def test_esm_layer_types_that_match_nothing_warn_or_raise():
    base, experts, acts = _hf_clip_world()
    targets = (r"q_proj\.weight", r"fc1\.weight")
    # HF CLIP's self_attn.out_proj.weight contains the CLIP type attn.out_proj.weight: drop it
    base = {k: v for k, v in base.items() if "out_proj" not in k}
    experts = [{k: v for k, v in e.items() if "out_proj" not in k} for e in experts]
    with pytest.warns(RuntimeWarning, match="Step C"):
        acetools.merge("esm", base, experts, activations=acts, targets=targets)
    with pytest.raises(ValueError, match="'c_fc'"):
        acetools.merge("esm", base, experts, activations=acts, targets=targets, layer_types=("fc1", "c_fc"))


# --------------------------------------------------------------------------- capture honours Conv1D
def test_capture_on_gpt2_conv1d_has_the_input_width_and_rows():
    model = tiny_gpt2()
    ids = torch.randint(0, 40, (3, 5))
    key = "transformer.h.0.attn.c_attn.weight"
    assert tuple(model.state_dict()[key].shape) == (16, 48)  # Conv1D: in x out
    seen = {}
    h = model.transformer.h[0].ln_1.register_forward_hook(lambda m, a, out: seen.setdefault("ln_1", out))
    try:
        X = capture_inputs(model, ids, [key, "transformer.h.0.mlp.c_proj.weight"])
    finally:
        h.remove()
    assert tuple(X[key].shape) == (15, 16)  # 3 x 5 tokens, d_in = n_embd (was 5 x 48 rows: silently wrong)
    torch.testing.assert_close(X[key], seen["ln_1"].reshape(-1, 16))
    assert tuple(X["transformer.h.0.mlp.c_proj.weight"].shape) == (15, 64)
    G = gram_matrices(model, ids, [key])
    assert tuple(G[key].shape) == (16, 16)


def test_capture_with_a_wrong_orientation_is_an_error_naming_the_key():
    class Layout:  # says c_attn is out x in although the module is a Conv1D
        def orientation(self, key):
            return "out_in"

    model = tiny_gpt2()
    with pytest.raises(RuntimeError, match=r"c_attn\.weight.*width 16.*d_in is 48"):
        capture_inputs(model, torch.randint(0, 40, (2, 4)), ["transformer.h.0.attn.c_attn.weight"], layout=Layout())


def test_capture_takes_dict_batches():
    model = tiny_gpt2()
    ids = torch.randint(0, 40, (2, 4))
    key = "transformer.h.1.attn.c_attn.weight"
    a = capture_inputs(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, [key], batch_size=1)
    b = capture_inputs(model, ids, [key])
    torch.testing.assert_close(a[key], b[key])


def test_esm_on_gpt2_as_stored_rejects_the_captured_width():
    """Conv1D weights given in x out to ESM (no layout): the activation width is checked, not reshaped."""
    model = tiny_gpt2()
    base = float_state(model)
    experts = perturbed(base, 2)
    key = "transformer.h.0.attn.c_attn.weight"
    X = capture_inputs(model, torch.randint(0, 40, (2, 6)), [key])[key]
    with pytest.raises(ValueError, match=r"c_attn\.weight.*expert 0.*d_in=16.*expects d_in=48"):
        acetools.merge("esm", {key: base[key]}, [{key: e[key]} for e in experts],
                       activations={key: [X, X]}, targets=("c_attn",), layer_scaling=False)


# --------------------------------------------------------------------------- PSD covariances and Grams
def _linear_world(n: int = 3, d_out: int = 6, d_in: int = 5):
    g = torch.Generator().manual_seed(0)
    key = "blocks.0.mlp.c_fc.weight"
    base = {key: torch.randn(d_out, d_in, generator=g, dtype=torch.float64)}
    experts = [{key: base[key] + 0.1 * torch.randn(d_out, d_in, generator=g, dtype=torch.float64)} for _ in range(n)]
    covs = []
    for _ in range(n):
        A = torch.randn(d_in, 2 * d_in, generator=g, dtype=torch.float64)
        covs.append({key: A @ A.T / (2 * d_in)})
    return key, base, experts, covs


def test_ace_given_rejects_a_negative_definite_covariance_naming_expert_and_key():
    key, base, experts, covs = _linear_world()
    acetools.merge("ace", base, experts, estimator="given", covariances=covs)  # valid: runs
    bad = [covs[0], {key: -torch.eye(5, dtype=torch.float64)}, covs[2]]
    with pytest.raises(ValueError, match=r"covariances\[1\]\['blocks\.0\.mlp\.c_fc\.weight'\].*not positive semi"):
        acetools.merge("ace", base, experts, estimator="given", covariances=bad)
    asym = covs[2][key].clone()
    asym[0, 1] += 1.0
    with pytest.raises(ValueError, match=r"covariances\[2\].*not symmetric"):
        acetools.merge("ace", base, experts, estimator="given", covariances=[covs[0], covs[1], {key: asym}])
    dWs = [e[key] - base[key] for e in experts]
    with pytest.raises(ValueError, match=r"task 1 \(expert 1\) for layer 'L'.*not positive semi"):
        ace_matrix(dWs, Sigma=[covs[0][key], -torch.eye(5, dtype=torch.float64), covs[2][key]],
                   estimator="given", name="L")


def test_psd_tolerance_accepts_rank_deficient_float32_grams():
    key, base, experts, _ = _linear_world()
    X = torch.randn(3, 5)  # 3 rows: rank 3 < d_in = 5, eigenvalues 0 up to float32 rounding
    grams = [{key: X.T @ X / 3} for _ in experts]
    acetools.merge("regmean", base, experts, grams=[{key: g[key].double()} for g in grams])


def test_regmean_rejects_a_non_psd_gram_naming_expert_and_key():
    key, base, experts, covs = _linear_world()
    grams = [dict(c) for c in covs]
    grams[2] = {key: covs[2][key] - 2 * torch.linalg.eigvalsh(covs[2][key])[-1] * torch.eye(5, dtype=torch.float64)}
    with pytest.raises(ValueError, match=r"regmean: grams\[2\]\['blocks\.0\.mlp\.c_fc\.weight'\].*smallest eigenvalue"):
        acetools.merge("regmean", base, experts, grams=grams)


def test_mean_fallbacks_are_announced():
    key, base, experts, covs = _linear_world()
    other = "blocks.0.attn.out_proj.weight"
    base2 = {**base, other: torch.randn(6, 6, dtype=torch.float64)}
    experts2 = [{**e, other: base2[other] + 0.1} for e in experts]
    with pytest.warns(RuntimeWarning, match=r"regmean: 1 matrix key\(s\) have no Gram.*out_proj"):
        acetools.merge("regmean", base2, experts2, grams=covs)
    with pytest.warns(RuntimeWarning, match=r"ace: 1 matrix key\(s\) have no covariances.*out_proj"):
        acetools.merge("ace", base2, experts2, estimator="given", covariances=covs)


# --------------------------------------------------------------------------- diagnostics feed the plots
def test_gamma_strip_takes_heterogeneity_per_layer():
    import matplotlib.pyplot as plt

    from acetools.course.plotting.ace_step_by_step import gamma_strip
    from acetools.diagnostics import heterogeneity_per_layer

    for model in (tiny_gpt2(), tiny_clip_vision()):
        base = float_state(model)
        tvs = task_vectors(base, perturbed(base, 3))
        table = heterogeneity_per_layer(tvs)
        fig, ax = plt.subplots()
        gamma_strip(ax, table)
        assert len(ax.get_xticklabels()) == table["layer_type"].nunique() > 1
        plt.close(fig)
    fig, ax = plt.subplots()
    with pytest.raises(KeyError, match="no column 'layer_type'"):
        gamma_strip(ax, table.drop(columns="layer_type"))
    plt.close(fig)


# --------------------------------------------------------------------------- ACE on GPT-2 through the layout
def test_ace_on_gpt2_with_the_layout_merges_conv1d_as_d_out_x_d_in():
    import dataclasses

    from acetools.layouts import PRESETS

    model = tiny_gpt2()
    base = {k: v for k, v in model.state_dict().items()}
    experts = perturbed({k: v for k, v in base.items() if v.is_floating_point()}, 3, seed=4)
    experts = [{**{k: v for k, v in base.items() if not v.is_floating_point()}, **e} for e in experts]
    for e, s in zip(experts, (0.5, 1.0, 3.0)):  # heterogeneous task energies, as in the issue
        e["transformer.h.0.attn.c_attn.weight"] = base["transformer.h.0.attn.c_attn.weight"] + s * (
            e["transformer.h.0.attn.c_attn.weight"] - base["transformer.h.0.attn.c_attn.weight"])
    key = "transformer.h.0.attn.c_attn.weight"
    merged = acetools.merge("ace", base, experts, layout="gpt2")
    dWs = [(e[key] - base[key]).T.double() for e in experts]  # d_out x d_in = 48 x 16
    ref, _ = ace_matrix(dWs, name=key)
    torch.testing.assert_close((merged[key] - base[key]).double(), ref.T.to(torch.float32).double(),
                               rtol=1e-4, atol=1e-6)
    auto = acetools.merge("ace", base, experts, layout="auto")
    torch.testing.assert_close(auto[key], merged[key])
    # as stored (in x out, the old silent behaviour) the update is a different one
    stored = acetools.merge("ace", base, experts, layout=dataclasses.replace(PRESETS["gpt2"], in_out=()))
    d_ok, d_bad = merged[key] - base[key], stored[key] - base[key]
    assert float((d_bad - d_ok).norm() / d_ok.norm()) > 0.01


def test_cart_announces_block_matrices_its_name_rule_misses_and_wudi_vit_needs_its_names():
    import warnings as w

    g = torch.Generator().manual_seed(0)
    bert = {f"encoder.layer.0.{n}.weight": torch.randn(8, 8, generator=g, dtype=torch.float64)
            for n in ("attention.self.query", "intermediate.dense", "output.dense")}
    experts = [{k: v + 0.1 * torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in bert.items()}
               for _ in range(3)]
    with pytest.warns(RuntimeWarning, match=r"cart: 3 matrix key\(s\) have names without 'attn'/'mlp'"):
        acetools.merge("cart", bert, experts, layout="bert")
    with pytest.raises(ValueError, match="targets='vit'.*none matches"):
        acetools.merge("wudi", bert, experts, layout="bert", targets="vit", steps=1)
    from tests.conftest import make_world

    base, ex = make_world(n_tasks=2)
    with w.catch_warnings():
        w.simplefilter("error", RuntimeWarning)
        acetools.merge("cart", base, ex)  # open_clip: every block matrix is attn/mlp, nothing to announce
