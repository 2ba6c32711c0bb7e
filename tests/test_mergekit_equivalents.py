"""Per-expert weights and densities (docs/your-models.md §Coming from mergekit; Eqs. (WA.2), (TA.2) and
(TIES.5) of docs/methods.md §Weight averaging, §Task arithmetic, §TIES, §DARE) and the documented mergekit
equivalents, each checked against mergekit.

The first half needs no oracle: the weighted methods against their equations written out here,
streamed against in memory, and every refusal's one line. The second half (``oracle``) runs the
docs' mergekit / acetools config pairs as written on tiny Llama folders, mergekit's ``run_merge``
beside ``acetools merge``, and mergekit's tensor functions on the cases the pairs leave out.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml

from acetools.cli import main
from acetools.files.checkpoints import open_checkpoint
from acetools.files.merge_files import load_config, merge_files, plan_merge
from acetools.files.per_expert import per_expert_hparams
from acetools.merging import merge, task_vectors
from acetools.merging.ties import dare_mask, dare_task_vectors, drop_and_rescale, kept_count
from tests.merge_helpers import perturbed

from .conftest import make_world

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DOC = Path(__file__).resolve().parents[1] / "docs" / "your-models.md"
W = [0.7, 0.3, 1.2]


def _one_line_error(capsys, argv, pattern):
    """``main(argv)`` returns 2 and prints one stderr line that matches ``pattern``."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("acetools: error: "), (code, err)
    assert re.search(pattern, lines[0]), lines[0]


def assert_rel_close(actual, expected, rtol=1e-5):
    actual, expected = actual.detach().double(), expected.detach().double()
    assert actual.shape == expected.shape
    err = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert err <= rtol * scale + 1e-12, f"max error {err:.3g} vs scale {scale:.3g}"


def _ties_by_hand(taus, ks, ws, merge_kind):
    """Eq. (TIES.5) per tensor with a sort, one tensor: trim each tau_t to its top k_t %, weight, elect the sign
    of the weighted sum, keep the agreeing non-zero entries, and sum or divide by their weights."""
    weighted = []
    for tau, k, w in zip(taus, ks, ws):
        flat = tau.reshape(-1)
        m = kept_count(flat.numel(), k)
        kept = torch.zeros_like(flat)
        idx = flat.abs().argsort(descending=True)[:m]
        kept[idx] = flat[idx]
        weighted.append(w * kept.reshape(tau.shape))
    stack = torch.stack(weighted)
    gamma = torch.sign(stack.sum(0))
    agree = (torch.sign(stack) == gamma) & (stack != 0)
    total = torch.where(agree, stack, 0).sum(0)
    if merge_kind == "sum":
        return total
    wsum = (agree.to(stack.dtype) * torch.tensor(ws, dtype=stack.dtype).reshape(-1, *[1] * tau.ndim)).sum(0)
    return total / torch.where(wsum == 0, 1, wsum)


# --------------------------------------------------------------------------- the engine, per expert

def test_weighted_task_arithmetic_and_averaging_are_their_equations(world):
    base, experts = world
    experts = experts[:3]
    tvs = task_vectors(base, experts)
    ta = merge("task_arithmetic", base, experts, lam=0.8, weights=W)
    wa = merge("weight_averaging", base, experts, weights=W)
    for k in base:
        assert_rel_close(ta[k] - base[k], 0.8 * sum(w * tv[k] for w, tv in zip(W, tvs)))  # (TA.2)
        assert_rel_close(wa[k], sum(w * e[k] for w, e in zip(W, experts)) / sum(W))  # (WA.2)
    # all-ones weights are the unweighted methods, bit for bit
    for method, hp in (("task_arithmetic", {"lam": 0.4}), ("weight_averaging", {})):
        plain = merge(method, base, experts, **hp)
        ones = merge(method, base, experts, weights=[1, 1, 1], **hp)
        assert all(torch.equal(plain[k], ones[k]) for k in base)


@pytest.mark.parametrize("merge_kind", ["mean", "sum"])
def test_weighted_ties_per_expert_k_is_eq_ties5(world, merge_kind):
    base, experts = world
    experts = experts[:3]
    tvs = task_vectors(base, experts)
    ks = [50, 25, 75]
    out = merge("ties", base, experts, k=ks, weights=W, scope="tensor", merge=merge_kind, lam=0.9)
    for key in base:
        ref = 0.9 * _ties_by_hand([tv[key] for tv in tvs], ks, W, merge_kind)
        assert_rel_close(out[key] - base[key], ref)
    # the weights change the merge (so the comparison above can fail)
    plain = merge("ties", base, experts, k=ks, scope="tensor", merge=merge_kind, lam=0.9)
    assert not torch.allclose(plain["visual.proj"], out["visual.proj"])
    ones = merge("ties", base, experts, k=ks, weights=[1.0] * 3, scope="tensor", merge=merge_kind, lam=0.9)
    assert all(torch.equal(plain[k], ones[k]) for k in base)


def test_per_expert_k_global_trims_each_task_at_its_own_count(world):
    base, experts = world
    experts = experts[:2]
    tvs = task_vectors(base, experts)
    out = merge("ties", base, experts, k=[10, 100], merge="sum", lam=1.0)  # scope global
    n = sum(v.numel() for v in base.values())
    first = torch.cat([tvs[0][k].reshape(-1) for k in base])
    thr0 = first.abs().sort(descending=True).values[kept_count(n, 10) - 1]
    # where expert 1 (k = 100: untrimmed) is zero, only expert 0's top 10 % can remain
    key = "text_projection"  # a zero task vector in both: nothing
    assert torch.equal(out[key], base[key])
    d = torch.cat([(out[k] - base[k]).reshape(-1) for k in base])
    second = torch.cat([tvs[1][k].reshape(-1) for k in base])
    kept0 = first.abs() >= thr0
    elected = torch.sign(second + torch.where(kept0, first, 0))  # (TIES.2) on expert 0 trimmed, expert 1 whole
    expected = torch.where(torch.sign(second) == elected, second, 0) + torch.where(
        kept0 & (torch.sign(first) == elected), first, 0)
    assert_rel_close(d, expected)


def test_per_expert_p_draws_each_task_mask_at_its_rate(world):
    base, experts = world
    experts = experts[:2]
    tvs = task_vectors(base, experts)
    ps = [0.2, 0.6]
    mixed = dare_task_vectors(tvs, ps, seed=3)
    for t, p in enumerate(ps):  # task t's masks are those of a scalar p = p_t
        alone = dare_task_vectors(tvs, p, seed=3)[t]
        assert all(torch.equal(mixed[t][k], alone[k]) for k in base)
    out = merge("dare", base, experts, p=ps, seed=3, lam=0.5, weights=[0.7, 0.3])
    for k in base:
        assert_rel_close(out[k] - base[k], 0.5 * (0.7 * mixed[0][k] + 0.3 * mixed[1][k]))
    dropped = dare_mask(base["visual.proj"].shape, 0.6, 3, 1, "visual.proj")
    assert 0.3 < dropped.float().mean() < 0.9  # the rate is p_t, not one shared p


def _folder_world(tmp_path, n=3, dtype=torch.float32):
    from safetensors.torch import save_file

    base, experts = make_world(n_tasks=n, dtype=dtype)
    save_file(base, tmp_path / "base.safetensors")
    paths = []
    for i, e in enumerate(experts):
        save_file(e, tmp_path / f"e{i}.safetensors")
        paths.append(tmp_path / f"e{i}.safetensors")
    return tmp_path / "base.safetensors", paths, base, experts


@pytest.mark.parametrize("method,hp", [
    ("ties", {"k": [30, 50, 20], "weights": W, "scope": "global", "lam": 0.7}),
    ("dare", {"p": [0.1, 0.5, 0.3], "weights": W, "base_method": "ties", "k": [40, 60, 80], "lam": 0.5}),
    ("task_arithmetic", {"weights": W, "lam": 0.6}),
    ("weight_averaging", {"weights": W}),
])
def test_streamed_per_expert_merge_equals_in_memory(tmp_path, method, hp):
    b, ex, base, experts = _folder_world(tmp_path)
    res = merge_files(method, b, ex, tmp_path / "out", hparams=hp, layout="open_clip", force=True, hash_inputs=False)
    assert res.plan.mode == "stream"
    got = open_checkpoint(tmp_path / "out").state_dict()
    ref = merge(method, base, experts, layout="open_clip", **hp)
    for k in base:
        assert torch.equal(got[k], ref[k]), k


# --------------------------------------------------------------------------- the refusals, one line each

def test_lengths_must_match_the_experts(world, tmp_path):
    base, experts = world  # four experts
    for method, hp in (("task_arithmetic", {"weights": [1.0, 2.0]}), ("ties", {"k": [20, 30, 40]}),
                       ("dare", {"p": [0.1] * 5})):
        name, n = next((k, len(v)) for k, v in hp.items())
        with pytest.raises(ValueError, match=rf"^{method}: hyperparameter {name} has {n} values but 4 experts are "
                                             "given; give one value per expert"):
            merge(method, base, experts, **hp)
    b, ex, *_ = _folder_world(tmp_path, n=2)
    with pytest.raises(ValueError, match=r"^ties: hyperparameter weights has 3 values but 2 experts are given"):
        plan_merge("ties", b, ex, hparams={"weights": W})


def test_bad_per_expert_values_are_refused(world):
    base, experts = world
    cases = [
        ("task_arithmetic", {"weights": 0.5}, TypeError, r"weights=0\.5 must be a list with one value per expert"),
        ("ties", {"weights": [1.0, "x", 1.0, 1.0]}, ValueError, r"weights\[1\]='x': must be a finite number"),
        ("ties", {"k": [20, 120, 20, 20]}, ValueError, r"k\[1\]=120 is out of range: must be <= 100\.0"),
        ("dare", {"p": [0.1, 1.0, 0.1, 0.1]}, ValueError, r"p\[1\]=1\.0 is out of range: must be < 1\.0"),
        ("ties", {"k": []}, ValueError, r"k=\[\] is empty"),
        ("tsv_m", {"weights": [1.0] * 4}, TypeError, r"tsv_m: unknown hyperparameter\(s\) \['weights'\]"),
        ("weight_averaging", {"weights": [1.0, -1.0, 0.5, -0.5]}, ValueError, r"sum to 0"),
    ]
    for method, hp, err, msg in cases:
        with pytest.raises(err, match=msg):
            merge(method, base, experts, **hp)


def _config(tmp_path, text, name="m.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_config_reads_both_spellings_and_maps_density(tmp_path):
    cfg = load_config(_config(tmp_path, "method: ties\nbase: b\nexperts:\n"
                                        "  - {path: x, weight: 0.7, density: 0.29}\n"
                                        "  - model: y\n    parameters: {weight: 0.3, density: 0.5}\n"))
    assert cfg["experts"] == [str(tmp_path / "x"), str(tmp_path / "y")]
    assert cfg["per_expert"] == {"weight": [0.7, 0.3], "density": [0.29, 0.5]}
    where = "m.yaml"
    assert per_expert_hparams("ties", cfg["per_expert"], {"lam": 1.0}, where) == {
        "lam": 1.0, "weights": [0.7, 0.3], "k": [29.0, 50.0]}  # 0.29 read as the decimal: k = 29, not 28.999...
    assert per_expert_hparams("dare", cfg["per_expert"], {}, where) == {"weights": [0.7, 0.3], "p": [0.71, 0.5]}
    mk = load_config(_config(tmp_path, "method: task_arithmetic\nbase: b\nmodels:\n  - model: x\n  - model: y\n"))
    assert mk["experts"] == [str(tmp_path / "x"), str(tmp_path / "y")] and "per_expert" not in mk


@pytest.mark.parametrize("text,msg", [
    ("method: tsv_m\nbase: b\nexperts: [{path: x, weight: 1}, {path: y, weight: 2}]\n",
     r"tsv_m takes no per-expert weight \(the experts' weight: has no meaning for it\); per-expert weights apply "
     r"to weight_averaging, task_arithmetic, ties, dare"),
    ("method: task_arithmetic\nbase: b\nexperts: [{path: x, density: 0.5}, {path: y, density: 0.5}]\n",
     r"task_arithmetic takes no per-expert density"),
    ("method: ties\nbase: b\nexperts: [{path: x, weight: 1}, y]\n",
     r"expert 1 \(y\) has no weight while expert 0 has one"),
    ("method: ties\nbase: b\nexperts: [{path: x, weight: [0, 0.5, 1]}]\n",
     r"expert 0: weight is a list \(mergekit's gradient over layers\); acetools takes one finite number"),
    ("method: ties\nbase: b\nexperts: [{model: x, parameters: {weight: 1, epsilon: 0.1}}]\n",
     r"parameter\(s\) \['epsilon'\] have no per-expert acetools equivalent"),
    ("method: ties\nbase: b\nexperts: [{path: x, weight: 1}]\nhyperparameters: {weights: [2]}\n",
     r"the experts' weight: and the hyperparameter weights both set the weights of ties; give one"),
    ("method: ties\nbase: b\nexperts: [{path: x, density: 1.5}]\n", r"expert 0's density=1\.5 must be in \(0, 1\]"),
    ("merge_method: ties\nbase_model: b\nmodels: [{model: x}]\n",
     r"unknown key\(s\) \['base_model', 'merge_method'\].*'base_model' is mergekit's; acetools' key is 'base'; "
     r"'merge_method' is mergekit's; acetools' key is 'method'"),
    ("method: ties\nbase: b\nexperts: [x]\nmodels: [{model: y}]\n", r"give the experts once"),
    ("method: ties\nbase: b\nexperts: [x]\nslices: []\n", r"'slices' is mergekit's, with no acetools equivalent"),
])
def test_config_refusals_name_the_method_and_parameter(tmp_path, capsys, text, msg):
    _one_line_error(capsys, ["merge", str(_config(tmp_path, text)), "--dry-run"], msg)


def test_cli_experts_over_a_weighted_config_is_refused(tmp_path, capsys):
    path = _config(tmp_path, "method: ties\nbase: b\nexperts: [{path: x, weight: 1}, {path: y, weight: 2}]\n")
    _one_line_error(capsys, ["merge", str(path), "--experts", "a", "b", "--dry-run"],
                    r"--experts replaces the experts of .*m\.yaml, whose weight would no longer match them; give them "
                    r"per expert with -p weights=")


# --------------------------------------------------------------------------- against mergekit

def _llama_folders(root: Path) -> None:
    """base, math, code: a tiny Llama and two perturbed copies, saved by transformers."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(root / "base")
    for t, name in enumerate(("math", "code")):
        perturbed(model, 10 + t).save_pretrained(root / name)


def _doc_pairs() -> dict[str, dict[str, str]]:
    text = DOC.read_text()
    sec = text[text.index("## Coming from mergekit"):]
    sec = sec[:sec.index("\n## ", 5)]
    pairs: dict[str, dict[str, str]] = {}
    for body in re.findall(r"```yaml\n(.*?)```", sec, re.S):
        m = re.match(r"# (mergekit|acetools): (\w+)\n", body)
        if m:
            pairs.setdefault(m.group(2), {})[m.group(1)] = body
    return pairs


def test_the_docs_pair_every_mergekit_config_with_an_acetools_one():
    pairs = _doc_pairs()
    assert sorted(pairs) == ["dare_ties", "linear", "task_arithmetic", "ties"]
    assert all(set(p) == {"mergekit", "acetools"} for p in pairs.values())


def _run_mergekit(body: str, root: Path, out: Path) -> dict[str, torch.Tensor]:
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    data = yaml.safe_load(body)
    # mergekit looks a relative name up on the Hub: give it the folders' absolute paths
    if "base_model" in data:
        data["base_model"] = str(root / data["base_model"])
    for entry in data["models"]:
        entry["model"] = str(root / entry["model"])
    run_merge(MergeConfiguration.model_validate(data), str(out),
              options=MergeOptions(lazy_unpickle=False, copy_tokenizer=False, quiet=True))
    return open_checkpoint(out).state_dict()


@pytest.mark.oracle
@pytest.mark.slow  # importing mergekit.merge (transformers, accelerate) takes 6 s of CPU, ~20 s on a busy machine
@pytest.mark.parametrize("name", ["linear", "task_arithmetic", "ties", "dare_ties"])
def test_documented_pair_matches_mergekit(tmp_path, monkeypatch, name):
    pytest.importorskip("mergekit.merge")
    _llama_folders(tmp_path)
    pair = _doc_pairs()[name]
    ref = _run_mergekit(pair["mergekit"], tmp_path, tmp_path / "mk_out")
    conf = _config(tmp_path, pair["acetools"], "acetools.yaml")
    assert main(["merge", str(conf)]) == 0
    ours = open_checkpoint(tmp_path / "merged").state_dict()
    base = open_checkpoint(tmp_path / "base").state_dict()
    assert set(ref) == set(ours)
    for k in base:
        assert_rel_close(ours[k] - base[k], ref[k] - base[k])
    moved = [k for k in base if not torch.equal(ours[k], base[k])]
    assert len(moved) == len(base)  # every key took part


@pytest.mark.oracle
@pytest.mark.slow
def test_documented_command_line_is_the_ties_config(tmp_path, monkeypatch):
    pytest.importorskip("mergekit.merge")
    _llama_folders(tmp_path)
    text = DOC.read_text()
    sec = text[text.index("## Coming from mergekit"):]
    line = re.search(r"```bash\n(.*?)```", sec, re.S).group(1).replace("\\\n", " ")
    argv = shlex.split(line)
    assert argv[:2] == ["acetools", "merge"]
    monkeypatch.chdir(tmp_path)
    assert main(argv[1:]) == 0
    ref = _run_mergekit(_doc_pairs()["ties"]["mergekit"], tmp_path, tmp_path / "mk_out")
    ours = open_checkpoint(tmp_path / "merged").state_dict()
    base = open_checkpoint(tmp_path / "base").state_dict()
    for k in base:
        assert_rel_close(ours[k] - base[k], ref[k] - base[k])


@pytest.mark.oracle
@pytest.mark.parametrize("normalize,merge_kind", [(True, "mean"), (False, "sum")])
def test_weighted_ties_matches_mergekit_tensorwise(world, normalize, merge_kind):
    api = pytest.importorskip("mergekit.merge_methods.api")
    base, experts = world
    experts = experts[:3]
    dens = [0.5, 0.25, 0.75]
    ours = merge("ties", base, experts, k=[100 * d for d in dens], weights=W, scope="tensor", merge=merge_kind,
                 lam=0.9)
    for key in base:
        assert all(int(d * base[key].numel()) == kept_count(base[key].numel(), 100 * d) for d in dens)
        ref = api.merge_tensors([base[key]] + [e[key] for e in experts], "ties", base_index=0,
                                parameters={"weight": W, "density": dens, "lambda": 0.9, "normalize": normalize})
        assert_rel_close(ours[key] - base[key], ref - base[key])


@pytest.mark.oracle
def test_weighted_task_arithmetic_and_linear_match_mergekit(world):
    api = pytest.importorskip("mergekit.merge_methods.api")
    base, experts = world
    experts = experts[:3]
    ta = merge("task_arithmetic", base, experts, lam=0.8, weights=W)
    wa = merge("weight_averaging", base, experts, weights=W)
    for key in base:
        ref = api.merge_tensors([base[key]] + [e[key] for e in experts], "task_arithmetic", base_index=0,
                                parameters={"weight": W, "lambda": 0.8})
        assert_rel_close(ta[key] - base[key], ref - base[key])
        ref = api.merge_tensors([e[key] for e in experts], "linear", parameters={"weight": W})
        assert_rel_close(wa[key], ref)  # linear averages the weights themselves: compared at their scale
        if key == "visual.proj":
            assert not torch.allclose(wa[key], merge("weight_averaging", base, experts)[key], rtol=1e-4)


@pytest.mark.oracle
@pytest.mark.parametrize("method,base_method", [("dare_linear", "task_arithmetic"), ("dare_ties", "ties")])
def test_dare_matches_mergekit_with_its_masks_replayed(world, method, base_method):
    """mergekit draws torch.bernoulli(density) per expert in order from the global generator; with those masks
    and no rescaling (rescale: false), acetools' drop (drop_and_rescale) and merge give mergekit's result."""
    api = pytest.importorskip("mergekit.merge_methods.api")
    base, experts = world
    experts = experts[:3]
    dens = [0.5, 0.7, 0.9]
    tvs = task_vectors(base, experts)
    for i, key in enumerate(base):
        torch.manual_seed(100 + i)
        ref = api.merge_tensors([base[key]] + [e[key] for e in experts], method, base_index=0,
                                parameters={"weight": W, "density": dens, "lambda": 0.6, "rescale": False})
        torch.manual_seed(100 + i)
        keep = [torch.bernoulli(torch.full_like(tv[key], d)) for tv, d in zip(tvs, dens)]  # mergekit's draws
        dropped = [{key: base[key] + drop_and_rescale(tv[key], m == 0, 1 - d, rescale=False)}
                   for tv, m, d in zip(tvs, keep, dens)]
        hp = {"k": 100, "scope": "tensor", "merge": "sum"} if base_method == "ties" else {}
        ours = merge(base_method, {key: base[key]}, dropped, weights=W, lam=0.6, layout="generic", **hp)[key]
        assert_rel_close(ours - base[key], ref - base[key], rtol=1e-5)
        if key == "visual.proj":  # the masks drop entries: without them the merge is far off
            plain = merge(base_method, {key: base[key]}, [{key: e[key]} for e in experts], weights=W, lam=0.6,
                          layout="generic", **hp)[key]
            assert not torch.allclose(plain, ref, rtol=1e-3)


@pytest.mark.oracle
def test_density_one_dare_and_normalized_task_arithmetic_match_mergekit(world):
    """The table's other exact rows: dare_linear and dare_ties at density 1 (nothing dropped), task_arithmetic
    with normalize: true (the weights divided by their sum), linear with normalize: false (weights summing to 1)."""
    api = pytest.importorskip("mergekit.merge_methods.api")
    base, experts = world
    experts = experts[:3]
    linear = merge("dare", base, experts, p=[0.0] * 3, weights=W, lam=0.6)
    ties_sum = merge("dare", base, experts, p=0.0, base_method="ties", k=100, scope="tensor", merge="sum",
                     weights=W, lam=0.6)
    normalized = merge("task_arithmetic", base, experts, weights=[w / sum(W) for w in W], lam=0.6)
    unit = [0.5, 0.2, 0.3]  # weights that sum to 1: linear with normalize: false is the weighted mean
    mean = merge("weight_averaging", base, experts, weights=unit)
    for key in base:
        ref = api.merge_tensors([e[key] for e in experts], "linear", parameters={"weight": unit, "normalize": False})
        assert_rel_close(mean[key], ref)
        tensors = [base[key]] + [e[key] for e in experts]
        one = {"weight": W, "density": 1.0, "lambda": 0.6}
        for ours, method, params in ((linear, "dare_linear", one), (ties_sum, "dare_ties", one),
                                     (normalized, "task_arithmetic", {"weight": W, "lambda": 0.6, "normalize": True})):
            ref = api.merge_tensors(tensors, method, base_index=0, parameters=params)
            assert_rel_close(ours[key] - base[key], ref - base[key])
