"""Never a silently wrong merge: each test here failed (merged without a word) before the fix.

ESM without ESD layers, activations captured with the wrong width (GPT-2 Conv1D), covariances
and Gram matrices that are not symmetric PSD, mean fallbacks without a warning, and plot
helpers that reject the diagnostics' own tables.

Then the battery (``CASES``, ``test_battery``): bad inputs and faults across the API, the file
merges and the command line, each with the exact kind of outcome it must get (an error of a given
type naming X, a warning naming X, or a result checked against a reference), and that no input file
changed. Fault injection: a streamed merge killed mid-write leaves no output folder and the same
command then completes; a pretraining killed after an epoch resumes to the uninterrupted weights.
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
    # under the official code's rule (open_clip names) the default targets match nothing here
    with pytest.raises(ValueError, match=r"default targets.*targets="):
        acetools.merge("esm", base, experts, activations=acts, layout="open_clip")
    # detected as HF CLIP (the default), ESM targets HF CLIP's layers and names the missing capture
    with pytest.raises(ValueError, match=r"no entry for ESD layer .*k_proj.*capture_inputs"):
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
        acetools.merge("esm", base, experts, activations=acts, targets=targets, layout="open_clip")
    with pytest.raises(ValueError, match="'c_fc'"):
        acetools.merge("esm", base, experts, activations=acts, targets=targets, layer_types=("fc1", "c_fc"),
                       layout="open_clip")


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
    """Conv1D weights given in x out to ESM under the open_clip rule (as stored): the activation width is
    checked, not reshaped."""
    model = tiny_gpt2()
    base = float_state(model)
    experts = perturbed(base, 2)
    key = "transformer.h.0.attn.c_attn.weight"
    X = capture_inputs(model, torch.randint(0, 40, (2, 6)), [key])[key]
    with pytest.raises(ValueError, match=r"c_attn\.weight.*expert 0.*d_in=16.*expects d_in=48"):
        acetools.merge("esm", {key: base[key]}, [{key: e[key]} for e in experts],
                       activations={key: [X, X]}, targets=("c_attn",), layer_scaling=False, layout="open_clip")


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

    from acetools.diagnostics import heterogeneity_per_layer
    from acetools_course.lesson02_ace_step_by_step import gamma_strip

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
        averaged = acetools.merge("cart", bert, experts, layout="bert")
    mean = acetools.merge("weight_averaging", bert, experts, layout="bert")
    assert all(torch.allclose(averaged[k], mean[k]) for k in bert), "the official name rule averages BERT"
    with w.catch_warnings():
        w.simplefilter("error", RuntimeWarning)
        blocks = acetools.merge("cart", bert, experts, layout="bert", targets="blocks")
    assert all(not torch.allclose(blocks[k], mean[k]) for k in bert), "targets='blocks' takes BERT's block matrices"
    with pytest.raises(ValueError, match="targets='vit'.*none matches"):
        acetools.merge("wudi", bert, experts, layout="bert", targets="vit", steps=1)
    from tests.conftest import make_world

    base, ex = make_world(n_tasks=2)
    with w.catch_warnings():
        w.simplefilter("error", RuntimeWarning)
        acetools.merge("cart", base, ex)  # open_clip: every block matrix is attn/mlp, nothing to announce


# =========================================================================== the battery
# Table-driven: every bad input or fault across the API and the command line, each with the exact kind of
# outcome it must get: an error of a given type naming X, a warning naming X, or a correct result
# (checked against a reference). A CLI error is one line on stderr, exit status 2, without escape codes.
import re  # noqa: E402
import shutil  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from acetools.cli import main as cli_main  # noqa: E402
from acetools.files.checkpoints import ShardedWriter, open_checkpoint  # noqa: E402
from acetools.files.merge_files import merge_files, save_activations  # noqa: E402


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Any], Any]  # ctx -> result; for "cli" the argv (a list) to run
    kind: str  # "error" | "warn" | "ok" | "cli"
    exc: type | None = None  # the error / warning class
    match: str = ""  # regular expression the message must contain
    check: Callable[[Any, Any], None] | None = None  # (result, ctx) -> assertions on a correct result


class Ctx:
    """A tiny linear world in memory and tiny GPT-2 folders on disk (shared, read-only), plus a fresh tmp."""

    def __init__(self, files: dict, tmp: Path):
        self.tmp = tmp
        self.gpt2_base, self.gpt2_experts = files["base"], files["experts"]
        g = torch.Generator().manual_seed(0)
        self.base = {"l.weight": torch.randn(6, 5, generator=g), "l.bias": torch.randn(6, generator=g)}
        self.ex = [{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in self.base.items()} for _ in range(3)]
        self.acts = {"l.weight": [torch.randn(10, 5, generator=g) for _ in range(3)]}

    def with_key(self, t: int, key: str, value) -> list[dict]:
        ex = [dict(e) for e in self.ex]
        ex[t][key] = value
        return ex

    def copy_folder(self, src: Path, name: str) -> Path:
        dst = self.tmp / name
        shutil.copytree(src, dst)
        return dst


def _without(kind: str) -> None:
    """Skip a missing-device case on a machine that has that device."""
    if kind == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")


def _mean_check(res, ctx):
    want = {k: ctx.base[k] + sum(e[k] - ctx.base[k] for e in ctx.ex) / 3 for k in ctx.base}
    for k, v in want.items():
        torch.testing.assert_close(res[k], v)


def _rank_one_ace(ctx):
    g = torch.Generator().manual_seed(3)
    vs = [torch.randn(5, 1, generator=g, dtype=torch.float64) for _ in range(3)]
    b64 = {k: v.double() for k, v in ctx.base.items()}
    ex64 = [{k: v.double() for k, v in e.items()} for e in ctx.ex]
    covs = [{"l.weight": v @ v.T} for v in vs]
    return acetools.merge("ace", b64, ex64, estimator="given", covariances=covs, eps=0.0), (b64, ex64, covs)


def _rank_one_check(res, ctx):
    out, (b64, ex64, covs) = res
    taus = [(e["l.weight"] - b64["l.weight"]).numpy() for e in ex64]
    S = [c["l.weight"].numpy() for c in covs]
    ref = sum(t @ s for t, s in zip(taus, S)) @ np.linalg.pinv(sum(S))
    np.testing.assert_allclose((out["l.weight"] - b64["l.weight"]).numpy(), ref, atol=1e-12 * np.abs(ref).max())


def _esm_nomatrix(ctx):
    base = {"a": torch.zeros(()), "b": torch.zeros(3)}
    ex = [{"a": torch.tensor(1.0), "b": torch.ones(3)}, {"a": torch.tensor(3.0), "b": -torch.ones(3)}]
    return acetools.merge("esm", base, ex), (base, ex)


def _esm_nomatrix_check(res, ctx):
    out, (base, ex) = res
    ref = acetools.merge("weight_averaging", base, ex)
    assert all(torch.equal(out[k], ref[k]) for k in ref)


def _esm_rank_deficient(ctx):
    g = torch.Generator().manual_seed(8)
    base = {"h.0.mlp.c_fc.weight": torch.randn(16, 8, generator=g, dtype=torch.float64)}
    ex = [{k: v + 0.1 * torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in base.items()}
          for _ in range(2)]
    xs = [torch.randn(40, 8, generator=g, dtype=torch.float64) for _ in range(2)]
    acts = {"h.0.mlp.c_fc.weight": [x - x.mean(dim=1, keepdim=True) for x in xs]}  # rank 7 < k = 8
    out64 = acetools.merge("esm", base, ex, activations=acts, targets=("c_fc",), layer_types=())
    out32 = acetools.merge("esm", {k: v.float() for k, v in base.items()},
                           [{k: v.float() for k, v in e.items()} for e in ex],
                           activations={k: [x.float() for x in v] for k, v in acts.items()},
                           targets=("c_fc",), layer_types=())
    return out64, out32, base


def _esm_rank_check(res, ctx):
    out64, out32, base = res
    k = "h.0.mlp.c_fc.weight"
    d64, d32 = out64[k] - base[k], out32[k].double() - base[k]
    assert float((d32 - d64).abs().max() / d64.abs().max()) < 1e-4


def _dry_run_cli(ctx, *extra):
    return ["merge", "--method", "ace", "--base", str(ctx.gpt2_base), "--experts", *map(str, ctx.gpt2_experts),
            "--dry-run", *extra]


def _gpt2_merge(ctx, experts=None, out="o", **kw):
    exps = ctx.gpt2_experts if experts is None else experts
    return merge_files(kw.pop("method", "task_arithmetic"), ctx.gpt2_base, exps, ctx.tmp / out, **kw)


def _gpt2_loads(res, ctx):
    model, info = transformers.GPT2LMHeadModel.from_pretrained(res.out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def _shards(ctx):
    sd = {f"transformer.h.{i}.mlp.c_fc.weight.long_name_{i}": torch.randn(7, 13) for i in range(300)}
    with ShardedWriter(ctx.tmp / "sh", shard_size="100KB", metadata={"acetools.note": "x" * 400}) as w:
        for k, v in sd.items():
            w.add(k, v)
        files = w.close()
    return sd, files


def _shards_check(res, ctx):
    sd, files = res
    sizes = [f.stat().st_size for f in files if f.suffix == ".safetensors"]
    assert len(sizes) > 1 and max(sizes) <= 100_000, sizes  # headers included (before: 100,968 B)
    ck = open_checkpoint(ctx.tmp / "sh")
    assert all(torch.equal(ck.get(k), v) for k, v in sd.items())


def _pickled(ctx):
    p = ctx.tmp / "module.pt"
    torch.save(torch.nn.Linear(2, 2), p)
    return ["merge", "--method", "ties", "--base", str(p), "--experts", str(p), str(p), "--out", str(ctx.tmp / "o")]


def _acts_file(ctx, n_tasks):
    acts = {}
    for layer in range(2):
        for name, d in (("attn.c_attn", 16), ("mlp.c_fc", 16), ("mlp.c_proj", 64)):
            acts[f"transformer.h.{layer}.{name}.weight"] = [torch.randn(12, d) for _ in range(n_tasks)]
    return save_activations(ctx.tmp / "acts.safetensors", acts)


CASES: list[Case] = [
    # ------------------------------------------------------------------ API: inputs
    Case("api-unknown-method", lambda c: acetools.merge("nope", c.base, c.ex), "error", ValueError,
         r"unknown merge method 'nope'"),
    Case("api-unknown-hparam", lambda c: acetools.merge("ties", c.base, c.ex, bogus=1), "error", TypeError,
         r"unknown hyperparameter\(s\) \['bogus'\]"),
    Case("api-hparam-out-of-range", lambda c: acetools.merge("ties", c.base, c.ex, k=150), "error", ValueError,
         r"k=150 is out of range"),
    Case("api-hparam-nan", lambda c: acetools.merge("task_arithmetic", c.base, c.ex, lam=float("nan")), "error",
         ValueError, r"lam=nan must be finite"),
    Case("api-hparam-type", lambda c: acetools.merge("tsv_m", c.base, c.ex, alpha="x"), "error", TypeError,
         r"alpha='x' must be a number"),
    Case("api-negative-eps", lambda c: acetools.merge("ace", c.base, c.ex, eps=-1.0), "error", ValueError, r"eps=-1"),
    Case("api-dare-p", lambda c: acetools.merge("dare", c.base, c.ex, p=1.5), "error", ValueError, r"p=1\.5"),
    Case("api-wudi-steps", lambda c: acetools.merge("wudi", c.base, c.ex, steps=-1), "error", ValueError, "steps=-1"),
    Case("api-no-experts", lambda c: acetools.merge("ties", c.base, []), "error", ValueError, "experts is empty"),
    Case("api-experts-a-dict", lambda c: acetools.merge("ties", c.base, c.ex[0]), "error", TypeError,
         "experts must be a list"),
    Case("api-empty-base", lambda c: acetools.merge("ties", {}, c.ex), "error", ValueError, "base is empty"),
    Case("api-missing-key", lambda c: acetools.merge("ties", c.base, [c.ex[0], {"l.weight": c.ex[1]["l.weight"]}]),
         "error", KeyError, r"experts\[1\] is missing key 'l\.bias'"),
    Case("api-extra-key", lambda c: acetools.merge("ties", c.base, c.with_key(1, "x", torch.zeros(1))), "error",
         KeyError, r"experts\[1\] has key 'x'"),
    Case("api-shape-mismatch", lambda c: acetools.merge("ties", c.base, c.with_key(1, "l.bias", torch.zeros(7))),
         "error", ValueError, r"shape mismatch at key 'l\.bias'"),
    Case("api-nan-expert", lambda c: acetools.merge("ties", c.base, c.with_key(1, "l.bias", torch.full((6,), np.nan))),
         "error", ValueError, r"experts\[1\]\['l\.bias'\] contains 6 NaN"),
    Case("api-inf-base", lambda c: acetools.merge("ties", {**c.base, "l.bias": torch.full((6,), np.inf)}, c.ex),
         "error", ValueError, r"base\['l\.bias'\] contains 0 NaN and 6 Inf"),
    Case("api-int-expert-key", lambda c: acetools.merge(
        "ties", c.base, c.with_key(1, "l.bias", torch.zeros(6, dtype=torch.long))), "error", TypeError,
         r"mixed dtypes at key 'l\.bias'"),
    Case("api-buffer-changed", lambda c: acetools.merge(
        "ties", {**c.base, "n": torch.tensor(3)}, [{**e, "n": torch.tensor(i)} for i, e in enumerate(c.ex)]),
         "warn", UserWarning, r"non-float buffer 'n' differs",
         lambda r, c: torch.equal(r["n"], torch.tensor(3)) or pytest.fail("buffer not carried from the base")),
    Case("api-unknown-layout", lambda c: acetools.merge("ties", c.base, c.ex, layout="nope"), "error", ValueError,
         "unknown layout 'nope'"),
    Case("api-layout-and-is-matrix", lambda c: acetools.merge("ties", c.base, c.ex, layout="generic",
                                                              is_matrix=lambda k, v: True), "error", ValueError,
         "either layout= or is_matrix="),
    Case("api-is-matrix-not-callable", lambda c: acetools.merge("ties", c.base, c.ex, is_matrix=3), "error", TypeError,
         "is_matrix must be a callable"),
    # ------------------------------------------------------------------ API: devices
    Case("api-device-meta", lambda c: acetools.merge("ties", c.base, c.ex, device="meta"), "error", ValueError,
         r"device='meta' cannot compute a merge"),
    Case("api-device-bogus", lambda c: acetools.merge("ties", c.base, c.ex, device="bogus"), "error", ValueError,
         r"device='bogus' is not a device"),
    Case("api-device-mps-missing", lambda c: _without("mps") or acetools.merge("ties", c.base, c.ex, device="mps"),
         "error", ValueError, "no mps device is available"),
    Case("api-task-vectors-device-meta", lambda c: acetools.task_vectors(c.base, c.ex, device="meta"), "error",
         ValueError, "meta"),
    # ------------------------------------------------------------------ API: numerics
    Case("api-ace-singular-given-eps0", _rank_one_ace, "warn", RuntimeWarning,
         r"'l\.weight' is singular or ill-conditioned", _rank_one_check),
    Case("api-regmean-singular-gram", lambda c: acetools.merge(
        "regmean", c.base, c.ex, alpha=1.0,
        grams=[{"l.weight": torch.outer(torch.arange(1.0, 6.0), torch.arange(1.0, 6.0))}] * 3),
         "warn", RuntimeWarning, r"'l\.weight' is singular"),
    Case("api-esm-no-matrix-averages", _esm_nomatrix, "warn", RuntimeWarning, "no matrix key", _esm_nomatrix_check),
    Case("api-esm-overflow-names-key", lambda c: acetools.merge(
        "esm", c.base, [{k: v + 1e30 * torch.rand(v.shape) for k, v in e.items()} for e in c.ex], activations=c.acts,
        targets=("l.weight",), layer_types=()), "error", ValueError, r"layer 'l\.weight'.*overflow"),
    Case("api-esm-k-above-shift-rank", _esm_rank_deficient, "warn", RuntimeWarning,
         r"'h\.0\.mlp\.c_fc\.weight'.*exceeds the rank", _esm_rank_check),
    # ------------------------------------------------------------------ API: per-key inputs
    Case("api-esm-no-activations", lambda c: acetools.merge("esm", c.base, c.ex, targets=("l.weight",)), "error",
         TypeError, "missing hyperparameter 'activations'"),
    Case("api-esm-activation-width", lambda c: acetools.merge(
        "esm", c.base, c.ex, activations={"l.weight": [torch.randn(4, 6)] * 3}, targets=("l.weight",)), "error",
         ValueError, r"activations\['l\.weight'\]\[0\].*d_in=6"),
    Case("api-esm-activation-nan", lambda c: acetools.merge(
        "esm", c.base, c.ex, activations={"l.weight": [torch.full((4, 5), np.nan)] * 3}, targets=("l.weight",),
        layer_types=()), "error", ValueError, r"'l\.weight', task 0.*NaN"),
    Case("api-esm-activation-count", lambda c: acetools.merge(
        "esm", c.base, c.ex, activations={"l.weight": [torch.randn(4, 5)] * 2}, targets=("l.weight",)), "error",
         ValueError, r"has 2 tensors for 3 experts"),
    Case("api-esm-target-matches-nothing", lambda c: acetools.merge(
        "esm", c.base, c.ex, activations=c.acts, targets=("nothing",)), "error", ValueError, "'nothing'"),
    Case("api-regmean-gram-shape", lambda c: acetools.merge("regmean", c.base, c.ex, grams=[{"l.weight": torch.eye(4)}]
                                                            * 3), "error", ValueError, r"grams\[0\]\['l\.weight'\]"),
    Case("api-regmean-no-grams", lambda c: acetools.merge("regmean", c.base, c.ex), "error", TypeError,
         "missing required hyperparameter 'grams'"),
    Case("api-ace-covariances-wrong-estimator", lambda c: acetools.merge(
        "ace", c.base, c.ex, covariances=[{"l.weight": torch.eye(5)}] * 3), "error", ValueError,
         "only used with estimator='given'"),
    Case("api-ace-covariance-shape", lambda c: acetools.merge(
        "ace", c.base, c.ex, estimator="given", covariances=[{"l.weight": torch.eye(4)}] * 3), "error", ValueError,
         r"covariances\[0\]\['l\.weight'\] has shape \(4, 4\)"),
    Case("api-ace-covariance-count", lambda c: acetools.merge(
        "ace", c.base, c.ex, estimator="given", covariances=[{"l.weight": torch.eye(5)}] * 2), "error", ValueError,
         "2 entries for 3 experts"),
    Case("api-ace-covariance-asymmetric", lambda c: acetools.merge(
        "ace", c.base, c.ex, estimator="given",
        covariances=[{"l.weight": torch.eye(5) + torch.triu(torch.ones(5, 5), 1)}] * 3), "error", ValueError,
         "is not symmetric"),
    # ------------------------------------------------------------------ files: expert lists and folders
    Case("files-base-among-experts", lambda c: _gpt2_merge(c, [c.gpt2_base, *c.gpt2_experts[:2]]), "error",
         ValueError, r"expert 0 .* is the same checkpoint as the base"),
    Case("files-expert-twice", lambda c: _gpt2_merge(c, [c.gpt2_experts[0], c.gpt2_experts[1], c.gpt2_experts[0]]),
         "error", ValueError, r"expert 2 .* same checkpoint as expert 0.*list every expert once"),
    Case("files-copy-of-an-expert", lambda c: _gpt2_merge(c, [*c.gpt2_experts, c.copy_folder(c.gpt2_experts[1], "cp")]),
         "error", ValueError, r"expert 3 .* same content \(sha256\) as expert 1"),
    Case("files-copy-of-the-base", lambda c: _gpt2_merge(c, [c.copy_folder(c.gpt2_base, "b2"), *c.gpt2_experts]),
         "error", ValueError, r"expert 0 .* same content \(sha256\) as the base"),
    Case("files-one-expert", lambda c: _gpt2_merge(c, c.gpt2_experts[:1]), "warn", UserWarning, "only one expert",
         _gpt2_loads),
    Case("files-out-inside-an-input", lambda c: _gpt2_merge(c, out=str(c.gpt2_experts[0] / "merged")), "error",
         ValueError, "is inside the input checkpoint folder"),
    Case("files-out-is-an-input", lambda c: merge_files("task_arithmetic", c.gpt2_base, c.gpt2_experts,
                                                        c.gpt2_experts[1]), "error", ValueError,
         "holds the input checkpoint"),
    Case("files-forced-layout-contradicts-config", lambda c: _gpt2_merge(c, layout="bert"), "error", ValueError,
         r"layout 'bert' contradicts the checkpoint's config\.json.*'gpt2'"),
    Case("files-forced-layout-with-force", lambda c: _gpt2_merge(c, layout="gpt2", force_layout=True), "ok",
         check=_gpt2_loads),
    Case("files-device-meta-before-any-work", lambda c: _gpt2_merge(c, device="meta"), "error", ValueError,
         "device='meta'"),
    Case("files-missing-expert", lambda c: _gpt2_merge(c, [c.tmp / "nope"]), "error", FileNotFoundError,
         "checkpoint not found"),
    Case("files-bad-dtype", lambda c: _gpt2_merge(c, dtype="float7"), "error", ValueError, "float7"),
    Case("files-bad-shard-size", lambda c: _gpt2_merge(c, shard_size="5XB"), "error", ValueError, "5XB"),
    Case("files-shards-respect-the-limit-with-headers", _shards, "ok", check=_shards_check),
    Case("files-esm-activations-for-too-many-tasks", lambda c: _gpt2_merge(
        c, c.gpt2_experts[:2], method="esm", hparams={"activations": _acts_file(c, 3)}), "error", ValueError,
         r"given for tasks \[0, 1, 2\], expected 0\.\.1"),
    # ------------------------------------------------------------------ command line
    Case("cli-experts-flag-twice", lambda c: ["merge", "--method", "ties", "--base", str(c.gpt2_base), "--experts",
                                              str(c.gpt2_experts[0]), "--experts", str(c.gpt2_experts[1]),
                                              "--out", str(c.tmp / "o")], "cli", match="--experts given twice"),
    Case("cli-diagnose-experts-flag-twice", lambda c: ["diagnose", "--base", str(c.gpt2_base), "--experts",
                                                       str(c.gpt2_experts[0]), "--experts", str(c.gpt2_experts[1]),
                                                       "--out", str(c.tmp / "d")], "cli", match="given twice"),
    Case("cli-unknown-method", lambda c: ["merge", "--method", "nope"], "cli", match="invalid choice: 'nope'"),
    Case("cli-merge-without-out", lambda c: _dry_run_cli(c)[:-1], "cli", match="merge needs --out"),
    Case("cli-param-without-equals", lambda c: _dry_run_cli(c, "-p", "lam"), "cli", match="lam"),
    Case("cli-unknown-param", lambda c: _dry_run_cli(c, "-p", "bogus=1"), "cli", match=r"\['bogus'\]"),
    Case("cli-forced-layout-contradicts-config", lambda c: _dry_run_cli(c, "--layout", "bert"), "cli",
         match=r"contradicts .*--force-layout"),
    Case("cli-device-meta", lambda c: _dry_run_cli(c, "--device", "meta"), "cli", match="device='meta'"),
    Case("cli-base-among-experts", lambda c: ["merge", "--method", "ties", "--base", str(c.gpt2_base), "--experts",
                                              str(c.gpt2_base), str(c.gpt2_experts[0]), "--dry-run"], "cli",
         match="same checkpoint as the base"),
    Case("cli-diagnose-out-is-an-expert", lambda c: ["diagnose", "--base", str(c.gpt2_base), "--experts",
                                                     *map(str, c.gpt2_experts), "--out", str(c.gpt2_experts[0]),
                                                     "--tables-only"], "cli", match="holds the input checkpoint"),
    Case("cli-diagnose-out-inside-an-expert", lambda c: ["diagnose", "--base", str(c.gpt2_base), "--experts",
                                                         *map(str, c.gpt2_experts), "--out",
                                                         str(c.gpt2_experts[0] / "tables"), "--tables-only"], "cli",
         match="inside the input checkpoint folder"),
    Case("cli-pickled-module-without-escape-codes", _pickled, "cli", match=r"weights_only=True"),
    Case("cli-bad-size", lambda c: ["bench", "--size", "bogus"], "cli", match="unknown model size 'bogus'"),
    Case("cli-bad-shard-size", lambda c: _dry_run_cli(c, "--shard-size", "lots"), "cli", match="lots"),
]


@pytest.fixture(scope="module")
def gpt2_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("battery")
    model = tiny_gpt2()
    model.save_pretrained(root / "base")
    experts = []
    for t in range(3):
        m = tiny_gpt2()
        m.load_state_dict(model.state_dict())
        g = torch.Generator().manual_seed(20 + t)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=g))
        m.save_pretrained(root / f"expert{t}")
        experts.append(root / f"expert{t}")
    return {"base": root / "base", "experts": experts}


def test_the_battery_has_at_least_60_cases_with_unique_ids():
    ids = [c.id for c in CASES]
    assert len(ids) >= 60 and len(set(ids)) == len(ids), len(ids)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_battery(case, gpt2_folders, tmp_path, capsys):
    ctx = Ctx(gpt2_folders, tmp_path)
    before = {p: _snapshot(p) for p in [ctx.gpt2_base, *ctx.gpt2_experts]}
    if case.kind == "error":
        with pytest.raises(case.exc, match=case.match):
            case.run(ctx)
    elif case.kind == "warn":
        with pytest.warns(case.exc, match=case.match):
            res = case.run(ctx)
        if case.check:
            case.check(res, ctx)
    elif case.kind == "ok":
        res = case.run(ctx)
        case.check(res, ctx)
    else:
        argv = case.run(ctx)
        capsys.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rc = cli_main(argv)
        err = capsys.readouterr().err.strip().splitlines()[-1] if rc else ""
        assert rc == 2, (rc, err)
        assert err.startswith("acetools: error: ") and re.search(case.match, err), err
        assert "\x1b" not in err, repr(err)  # no terminal escape codes
    assert {p: _snapshot(p) for p in before} == before  # no input was touched


# --------------------------------------------------------------------------- fault injection
ROOT = Path(__file__).resolve().parents[1]


def _run_killed(script: str, tmp: Path) -> int:
    """Run ``script`` in a fresh interpreter (this checkout's acetools) that SIGKILLs itself; its exit code."""
    import subprocess
    import sys

    path = tmp / "killed.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ACETOOLS_PROGRESS": "0", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])
    return r.returncode


import os  # noqa: E402

_KILL_MERGE = """
import os, signal
from acetools.files import checkpoints, merge_files as mf
at = {at!r}
if at == "close":
    def copy_side_files(*a, **k):  # the shards are written and closed: die before the folder is in place
        os.kill(os.getpid(), signal.SIGKILL)
    mf.copy_side_files = copy_side_files
else:
    orig, seen = checkpoints.ShardedWriter.add, [0]
    def add(self, key, t):
        orig(self, key, t)
        seen[0] += 1
        if seen[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoints.ShardedWriter.add = add
mf.merge_files("ties", {base!r}, {experts!r}, {out!r}, shard_size="20KB", progress=False)
"""


@pytest.mark.parametrize("at", [3, 12, "close"])
def test_a_killed_streamed_merge_leaves_no_output_folder_and_a_rerun_completes(at, gpt2_folders, tmp_path):
    base, experts = gpt2_folders["base"], gpt2_folders["experts"]
    out = tmp_path / "merged"
    _run_killed(_KILL_MERGE.format(at=at, base=str(base), experts=[str(e) for e in experts], out=str(out)), tmp_path)
    assert not out.exists()  # absent, not half-written
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".") and p.name != "killed.py"]
    res = merge_files("ties", base, experts, out, shard_size="20KB", progress=False)  # the same command again
    assert len(res.files) > 2 and (out / "acetools_merge.json").is_file() and (out / "config.json").is_file()
    b = open_checkpoint(base).state_dict()
    ex = [open_checkpoint(e).state_dict() for e in experts]
    ref = acetools.merge("ties", b, ex, layout="gpt2")
    got = open_checkpoint(out).state_dict()
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)


_KILL_PRETRAIN = """
import os, signal, sys
from types import SimpleNamespace
import acetools.world.vision.finetune as ft
from tests.test_finetune import corner_task
save = ft._save_resume
def killed(path, fp, step, *a):
    save(path, fp, step, *a)
    if step >= 8:  # after epoch 2 of 3: the checkpoint is on disk, the process dies
        os.kill(os.getpid(), signal.SIGKILL)
ft._save_resume = killed
t = corner_task(128, 4, n_classes=4)
pool = SimpleNamespace(x=t.x, labels={{"pos": t.y}}, head_classes={{"pos": 4}})
ft.pretrain_base(pool, "micro", checkpoint={ckpt!r}, epochs=3, batch_size=32, lr=2e-3, seed=3, augment=True,
                 threads=1, progress=False)
"""


def test_a_killed_pretraining_resumes_to_the_uninterrupted_weights(tmp_path):
    from types import SimpleNamespace

    from acetools.world.vision.finetune import pretrain_base
    from tests.test_finetune import corner_task

    ckpt = tmp_path / "base.resume.safetensors"
    _run_killed(_KILL_PRETRAIN.format(ckpt=str(ckpt)), tmp_path)
    assert ckpt.is_file() and not list(tmp_path.glob(".*.tmp"))  # the last epoch's checkpoint, complete
    t = corner_task(128, 4, n_classes=4)
    pool = SimpleNamespace(x=t.x, labels={"pos": t.y}, head_classes={"pos": 4})
    kw = dict(epochs=3, batch_size=32, lr=2e-3, seed=3, augment=True, threads=1, progress=False)
    resumed, rec = pretrain_base(pool, "micro", checkpoint=ckpt, **kw)
    ref, _ = pretrain_base(pool, "micro", **kw)
    assert rec["steps"] == 12 and not ckpt.exists()
    assert all(torch.equal(resumed[k], ref[k]) for k in ref)


# --------------------------------------------------------------------------- the command line's own promises
def test_printed_hyperparameters_are_the_resolved_values(gpt2_folders, capsys):
    """The plan printed ``gate=None prior=None numerator=None``; the README documents gate="auto"."""
    argv = ["merge", "--method", "ace", "--base", str(gpt2_folders["base"]), "--experts",
            *map(str, gpt2_folders["experts"]), "--dry-run"]
    assert cli_main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "gate='auto'" in first and "prior=True" in first and "numerator='centered'" in first, first
    assert "None" not in first.replace("covariances=None", ""), first
    assert cli_main([*argv, "-p", "estimator=wudi"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "gate='off'" in first and "prior=False" in first and "numerator='raw'" in first, first


def test_streamed_global_ties_checks_each_input_tensor_once(gpt2_folders, tmp_path, monkeypatch):
    """Global TIES reads every file in four passes; the finiteness check once ran on every tensor in each
    (3.5 s of 12.4 s). Now: once per input tensor, plus once per merged key (merging.driver.is_finite)."""
    from acetools.merging import driver

    base, experts = gpt2_folders["base"], gpt2_folders["experts"]
    ck = open_checkpoint(base)
    n_float = sum(1 for k in ck.keys() if ck.meta(k).dtype.is_floating_point)  # each merged once, checked once
    calls = [0]
    real = driver.is_finite

    def counting(t):
        calls[0] += 1
        return real(t)

    monkeypatch.setattr(driver, "is_finite", counting)
    res = merge_files("ties", base, experts, tmp_path / "o", progress=False, hash_inputs=False)
    monkeypatch.undo()
    assert res.plan.scope == "global_ties"
    assert calls[0] == n_float * (len(experts) + 1) + n_float, (calls[0], n_float)
