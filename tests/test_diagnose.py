"""Diagnose your models: the library against brute force, the layout, files, plots, the CLI and the report."""

from __future__ import annotations

import json
import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from acetools import cli
from acetools.diagnostics import (
    heterogeneity_per_layer,
    principal_subspace,
    relative_update_norms,
    singular_values,
    task_vector_cosine,
)
from acetools.files.diagnose import (
    REPORT_NOTEBOOK,
    Diagnosis,
    check_inputs,
    diagnose,
    run_report,
)
from acetools.merging import is_matrix_param, task_vectors
from acetools.merging.ace import heterogeneity
from acetools.plotting import diagnose as dplot
from tests.conftest import make_world

T = 3


@pytest.fixture(scope="module")
def world():
    return make_world(n_tasks=T, seed=3, rank=64, dtype=torch.float64)  # full-rank task vectors


@pytest.fixture(scope="module")
def diag(world):
    base, experts = world
    return diagnose(base, experts, layout="open_clip", ace=True)


def save_world(folder, base, experts):
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in base.items()}, str(folder / "base.safetensors"))
    paths = []
    for i, e in enumerate(experts):
        paths.append(folder / f"expert{i}.safetensors")
        save_file({k: v.contiguous() for k, v in e.items()}, str(paths[-1]))
    return folder / "base.safetensors", paths


# --------------------------------------------------------------------------- the numbers
def test_norms_cosines_and_gamma_match_brute_force(world, diag):
    base, experts = world
    tvs = task_vectors(base, experts)
    mats = [k for k in base if is_matrix_param(k, base[k])]
    assert sorted(diag.layers["key"]) == sorted(mats)
    want = relative_update_norms(base, tvs, ["task0", "task1", "task2"])
    got = diag.norms.set_index(["task", "key"])
    for _, r in want.iterrows():
        assert got.loc[(r["task"], r["key"]), "ratio"] == pytest.approx(r["ratio"], rel=1e-12)
        assert got.loc[(r["task"], r["key"]), "energy"] == pytest.approx(r["tau_norm"] ** 2, rel=1e-12)
    np.testing.assert_allclose(diag.cosine.to_numpy(), task_vector_cosine(tvs).to_numpy(), atol=1e-12)
    het = heterogeneity_per_layer(tvs).set_index("key")
    L = diag.layers.set_index("key")
    for k in mats:
        assert L.loc[k, "gamma"] == heterogeneity([tv[k] for tv in tvs])
        assert L.loc[k, "flag"] == het.loc[k, "flag"] == (L.loc[k, "gamma"] > 0.3)
        F = torch.stack([tv[k].reshape(-1) for tv in tvs])
        assert L.loc[k, "sum_energy_ratio"] == pytest.approx(float(F.sum(0).square().sum() / F.square().sum()))


def test_spectra_energy_and_overlap_match_svd(world, diag):
    base, experts = world
    tvs = task_vectors(base, experts)
    L = diag.layers.set_index("key")
    for k in L.index:
        d_out, d_in = base[k].shape
        kk = int(L.loc[k, "tsv_k"])
        assert kk == min(d_out, d_in) // T
        S = [singular_values(tv[k]) for tv in tvs]
        e = [float(s[:kk].square().sum() / s.square().sum()) for s in S]
        assert L.loc[k, "energy_topk"] == pytest.approx(np.mean(e), abs=1e-5)
        sig = diag.spectra[(diag.spectra["key"] == k) & (diag.spectra["task"] == "task1")]["sigma"].to_numpy()
        np.testing.assert_allclose(sig, S[1][:len(sig)].numpy(), rtol=1e-3, atol=1e-4 * float(S[1][0]))
        ov = []
        for i in range(T):
            for j in range(i + 1, T):
                for side in ("left", "right"):
                    A = principal_subspace(tvs[i][k], kk, side)
                    B = principal_subspace(tvs[j][k], kk, side)
                    ov.append(float((A.T @ B).square().sum()) / kk)
        assert L.loc[k, "overlap_topk"] == pytest.approx(np.mean(ov), abs=1e-3)
        assert L.loc[k, "overlap_random"] == pytest.approx((kk / d_out + kk / d_in) / 2)
    assert np.isfinite(diag.layers["wpre_top5_energy"]).all()
    assert set(diag.summary["metric"]) >= {"tau_ratio", "ace_gamma_median", "ace_gated_fraction", "cosine_mean",
                                           "trunc_energy", "overlap_topk", "overlap_random", "wpre_top5_energy"}


def test_identical_experts_overlap_fully_and_add_up():
    base, experts = make_world(n_tasks=1, seed=5, rank=64, dtype=torch.float64)
    d = diagnose(base, [experts[0], experts[0]], layout="open_clip")
    assert d.layers["overlap_topk"].to_numpy() == pytest.approx(1.0, abs=1e-4)
    assert d.layers["sum_energy_ratio"].to_numpy() == pytest.approx(2.0)
    assert d.cosine.iloc[0, 1] == pytest.approx(1.0)
    assert (d.layers["gamma"] == 0).all()


def test_one_expert_leaves_pairwise_signals_undefined_without_warnings():
    import warnings

    base, experts = make_world(n_tasks=1, seed=2, rank=64, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = diagnose(base, experts, layout="open_clip")
    s = d.summary.set_index("metric")["value"]
    assert math.isnan(s["cosine_mean"]) and math.isnan(s["overlap_topk"])
    assert s["trunc_energy"] == pytest.approx(100.0)  # T = 1: k = r keeps everything


def test_gpt2_layout_canonical_orientation_and_tied_keys_skipped():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    base = transformers.GPT2LMHeadModel(cfg).state_dict()
    g = torch.Generator().manual_seed(1)
    experts = [{k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                for k, v in base.items()} for _ in range(2)]
    for e in experts:
        e["lm_head.weight"] = e["transformer.wte.weight"]
    d = diagnose(base, experts, layout="auto")
    assert d.meta["layout"] == "gpt2"
    L = d.layers.set_index("key")
    assert L.loc["transformer.h.0.attn.c_attn.weight", "shape"] == "48x16"  # d_out x d_in, stored 16 x 48
    assert L.loc["transformer.h.0.attn.c_attn.weight", "orientation"] == "in_out"
    assert "lm_head.weight" not in set(d.norms["key"]) and "transformer.wte.weight" not in set(L.index)
    assert L.loc["transformer.h.0.attn.c_attn.weight", "tsv_k"] == 16 // 2
    experts[1]["lm_head.weight"] = experts[1]["lm_head.weight"] + 0.01  # untied in one expert: reported
    assert "lm_head.weight" in set(diagnose(base, experts, layout="gpt2").norms["key"])


def test_files_equal_state_dicts_and_save_load(world, diag, tmp_path):
    base, experts = world
    b, es = save_world(tmp_path / "ckpt", base, experts)
    d = diagnose(str(b), [str(p) for p in es], layout="open_clip", ace=True)
    assert d.meta["names"] == ["expert0", "expert1", "expert2"]
    cols = ["tau_ratio", "energy", "gamma", "energy_topk", "overlap_topk", "cosine_mean", "wpre_top5_energy"]
    assert sorted(d.layers["key"]) == sorted(diag.layers["key"])
    got = d.layers.set_index("key").loc[list(diag.layers["key"]), cols]
    np.testing.assert_allclose(got.to_numpy(), diag.layers[cols].to_numpy(), rtol=1e-6)
    d.save(tmp_path / "tables")
    back = Diagnosis.load(tmp_path / "tables")
    np.testing.assert_allclose(back.layers["gamma"].to_numpy(), d.layers["gamma"].to_numpy(), rtol=1e-5)
    np.testing.assert_allclose(back.cosine.to_numpy(), d.cosine.to_numpy(), rtol=1e-5)
    assert back.meta["names"] == d.meta["names"]


@pytest.mark.parametrize("on_disk", [True, False])
def test_large_keys_read_in_parts_give_the_whole_keys_numbers(world, tmp_path, monkeypatch, on_disk):
    """A non-matrix key over PART entries (an embedding table) is read PART entries at a time, from files and
    from state dicts: its norms and the cosines equal the whole-key reads to 1e-12 relative (sums in another
    order), every matrix table is unchanged (docs/performance.md §diagnose)."""
    import acetools.files.diagnose as D

    base, experts = world
    b, es = save_world(tmp_path / "ckpt", base, experts) if on_disk else (base, experts)
    args = (str(b), [str(p) for p in es]) if on_disk else (b, es)
    whole = diagnose(*args, layout="open_clip")
    read = []
    real = D._gram_in_parts
    monkeypatch.setattr(D, "_gram_in_parts", lambda key, *a: read.append(key) or real(key, *a))
    monkeypatch.setattr(D, "PART", 7)  # conv1 (768 entries), the class embedding and the biases go in parts
    parts = diagnose(*args, layout="open_clip")
    assert {"visual.conv1.weight", "visual.class_embedding", "visual.ln_pre.bias"} <= set(read)
    assert not set(read) & set(whole.layers["key"])  # matrices are read whole
    for name in ("layers", "overlap", "spectra", "cosine_per_layer"):
        assert parts.__dict__[name].equals(whole.__dict__[name]), name
    assert list(parts.norms["key"]) == list(whole.norms["key"])
    for col in ("tau_norm", "base_norm", "ratio", "energy"):
        np.testing.assert_allclose(parts.norms[col].to_numpy(), whole.norms[col].to_numpy(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(parts.cosine.to_numpy(), whole.cosine.to_numpy(), rtol=1e-12, atol=1e-15)


def test_a_nan_in_a_key_read_in_parts_is_named_with_the_whole_keys_counts(world, tmp_path, monkeypatch):
    import acetools.files.diagnose as D

    base, experts = world
    bad = {k: v.clone() for k, v in experts[1].items()}
    bad["visual.conv1.weight"].view(-1)[[3, 500, 700]] = torch.tensor([math.nan, math.nan, math.inf],
                                                                         dtype=torch.float64)
    b, es = save_world(tmp_path / "ckpt", base, [experts[0], bad])
    monkeypatch.setattr(D, "PART", 100)  # the three are in different parts
    with pytest.raises(ValueError, match=r"experts\[1\] \(expert1\)\['visual.conv1.weight'\] contains 2 NaN and 1 Inf"):
        diagnose(str(b), [str(p) for p in es], layout="open_clip")


def test_default_names_are_the_experts_names_as_merge_gives_them(world, tmp_path):
    """One rule with merge's heads and --search (acetools.files.heads.expert_names): a folder's name, also for
    its model.safetensors; a repeated name gets the expert's index; task<i> for a state dict."""
    from safetensors.torch import save_file

    base, experts = world
    paths = []
    for name in ("sst2", "mnli", "sst2"):
        folder = tmp_path / f"run{len(paths)}" / name
        folder.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in experts[len(paths)].items()}, str(folder / "model.safetensors"))
        paths.append(folder if len(paths) != 1 else folder / "model.safetensors")
    assert check_inputs(base, [str(p) for p in paths], layout="open_clip")["names"] == ["sst2", "mnli", "sst2_2"]
    assert check_inputs(base, [experts[0], str(paths[1])], layout="open_clip")["names"] == ["task0", "mnli"]


def test_layers_come_in_block_order_whatever_the_file_order():
    shapes = {f"visual.transformer.resblocks.{i}.mlp.c_fc.weight": (6, 4) for i in (10, 2, 0, 1)}
    shapes["visual.proj"] = (4, 3)
    base, experts = make_world(n_tasks=2, seed=1, rank=4, dtype=torch.float64, shapes=shapes)
    d = diagnose(base, experts, layout="open_clip")
    assert list(d.layers["key"]) == ["visual.proj"] + [
        f"visual.transformer.resblocks.{i}.mlp.c_fc.weight" for i in (0, 1, 2, 10)]


def test_bad_inputs_name_the_expert_key_or_shape(world, tmp_path):
    base, experts = world
    key = "visual.transformer.resblocks.0.mlp.c_fc.weight"
    with pytest.raises(KeyError, match=r"experts\[1\] \(task1\) is missing key .*c_fc"):
        diagnose(base, [experts[0], {k: v for k, v in experts[1].items() if k != key}])
    with pytest.raises(ValueError, match=r"shape mismatch at key .*c_fc.*experts\[0\]"):
        diagnose(base, [{**experts[0], key: experts[0][key][:, :3]}])
    with pytest.raises(ValueError, match="2 names for 3 experts"):
        diagnose(base, experts, names=["a", "b"])
    with pytest.raises(TypeError, match="non-empty list"):
        diagnose(base, experts[0])
    with pytest.raises(ValueError, match="no key takes the matrix path"):
        diagnose(base, experts, keys=["visual.ln_pre.weight"])
    with pytest.raises(FileNotFoundError):
        check_inputs(str(tmp_path / "missing.safetensors"), [str(tmp_path / "x.safetensors")])


# --------------------------------------------------------------------------- the plots take the tables as they are
@pytest.mark.parametrize("fn, table", [
    (dplot.ratio_by_layer, "norms"), (dplot.energy_by_layer, "layers"), (dplot.gamma_by_layer, "layers"),
    (dplot.cosine_heatmap, "cosine"), (dplot.spectra_by_type, "spectra"), (dplot.energy_concentration, "layers"),
    (dplot.overlap_by_layer, "layers"),
])
def test_every_plot_takes_its_diagnosis_table(diag, fn, table):
    fig, ax = plt.subplots()
    try:
        assert fn(ax, getattr(diag, table)) is ax
        assert ax.has_data() or ax.collections or ax.images
    finally:
        plt.close(fig)


def test_plots_take_the_diagnostics_tables_and_name_missing_columns(world):
    base, experts = world
    tvs = task_vectors(base, experts)
    fig, axes = plt.subplots(1, 5)  # one axes per plot: the gamma plot may switch its axes to a log scale
    try:
        dplot.gamma_by_layer(axes[0], heterogeneity_per_layer(tvs))
        dplot.ratio_by_layer(axes[1], relative_update_norms(base, tvs))
        dplot.cosine_heatmap(axes[2], task_vector_cosine(tvs))
        with pytest.raises(KeyError, match="overlap_by_layer: the table has no column 'overlap_topk'"):
            dplot.overlap_by_layer(axes[3], heterogeneity_per_layer(tvs))
        dplot.energy_by_layer(axes[4], heterogeneity_per_layer(tvs))
        with pytest.raises(KeyError, match="'energy_min'"):
            dplot.energy_by_layer(axes[4], heterogeneity_per_layer(tvs).drop(columns="energy_min"))
    finally:
        plt.close(fig)


def test_gamma_axis_is_logarithmic_when_the_points_sit_far_below_the_gate():
    import pandas as pd

    fig, (a, b) = plt.subplots(1, 2)
    try:
        tiny = pd.DataFrame({"key": [f"k{i}" for i in range(4)], "gamma": [1e-3, 2e-3, 1.5e-3, 1e-3]})
        dplot.gamma_by_layer(a, tiny, tau=0.3)
        assert a.get_yscale() == "log"  # 0.001 under a gate line at 0.3: a linear axis would flatten them
        near = tiny.assign(gamma=[0.1, 0.2, 0.15, 0.25])
        dplot.gamma_by_layer(b, near, tau=0.3)
        assert b.get_yscale() == "linear"
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- the command and the report
def test_cli_tables_only_and_one_line_errors(world, tmp_path, capsys):
    base, experts = world
    b, es = save_world(tmp_path / "ckpt", base, experts)
    out = tmp_path / "out"
    rc = cli.main(["diagnose", "--base", str(b), "--experts", *map(str, es), "--out", str(out), "--tables-only",
                   "--names", "a", "b", "c"])
    assert rc == 0
    assert "ACE's γ" in capsys.readouterr().out
    assert json.loads((out / "meta.json").read_text())["names"] == ["a", "b", "c"]
    assert (out / "layers.csv").is_file() and (out / "summary.csv").is_file()
    rc = cli.main(["diagnose", "--base", str(b), "--experts", str(es[0]), str(tmp_path / "nope.safetensors"),
                   "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "nope.safetensors" in err
    rc = cli.main(["diagnose", "--base", str(b), "--experts", str(es[0]), "--out", str(out), "--layout", "gpt3"])
    assert rc == 2


def test_report_notebook_is_clean_and_declares_its_parameters():
    import papermill as pm

    raw = json.loads(REPORT_NOTEBOOK.read_text())
    assert raw["metadata"]["kernelspec"]["name"] == "python3" and "language_info" in raw["metadata"]
    assert raw["cells"][0]["cell_type"] == "markdown"
    for c in raw["cells"]:
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None
    tagged = [c for c in raw["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    declared = pm.inspect_notebook(str(REPORT_NOTEBOOK))
    assert set(declared) == {"base", "experts", "names", "layout", "tau", "ace", "out_dir", "heads"}
    assert all(p["help"] for p in declared.values())


@pytest.mark.slow
def test_report_renders_at_tiny_size_through_the_cli(world, tmp_path, capsys):
    import re

    base, experts = world
    b, es = save_world(tmp_path / "ckpt", base, experts)
    out = tmp_path / "report"
    rc = cli.main(["diagnose", "--base", str(b), "--experts", *map(str, es), "--out", str(out), "--ace"])
    assert rc == 0, capsys.readouterr().err
    html = (out / "diagnose.html").read_text()
    alts = re.findall(r'<img alt="([^"]+)"', html)
    assert len(alts) == 5 and all(len(a) > 40 for a in alts)
    assert "from acetools.files.diagnose import diagnose" not in html  # rendered without code
    executed = json.loads((out / "diagnose.ipynb").read_text())
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error" or o.get("name") == "stderr"]
    from tests.report_checks import check_html  # the course's checks of a rendered page

    assert check_html(out / "diagnose.html") == []
    assert "cdnjs" not in html and not re.search(r'<script[^>]+src="https?://', html)  # offline
    from tests.report_checks import check_rendered, find_chromium

    if find_chromium() is not None:  # at 1280 px: no table wider than the page
        assert check_rendered(out / "diagnose.html") == []
    for name in ("size", "cosine", "gamma", "spectra", "overlap"):
        assert (out / f"{name}.png").is_file()
    assert (out / "layers.csv").is_file()


def test_run_report_rejects_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run_report(tmp_path / "base.safetensors", [tmp_path / "e.safetensors"], tmp_path / "out")


def test_classifiers_with_different_heads_are_diagnosed_on_their_backbone(tmp_path, capsys):
    """--heads as for merge: auto leaves the classifier keys of 2-, 3- and 5-label experts out (their
    backbone is diagnosed, through the bare base's prefix); merge names the head key and the option."""
    pytest.importorskip("transformers")
    from tests.test_lineage import _world

    base, experts, _ = _world(tmp_path / "models")
    argv = ["diagnose", "--base", str(base), "--experts", *map(str, experts), "--tables-only", "-q"]
    assert cli.main([*argv, "--out", str(tmp_path / "auto")]) == 0
    norms = Diagnosis.load(tmp_path / "auto").norms
    assert not norms["key"].str.startswith("classifier.").any() and norms["key"].str.startswith("bert.").all()
    assert cli.main([*argv, "--out", str(tmp_path / "drop"), "--heads", "drop"]) == 0
    assert Diagnosis.load(tmp_path / "drop").norms.equals(norms)
    assert cli.main([*argv, "--out", str(tmp_path / "merge"), "--heads", "merge"]) != 0
    assert "(task2) has key 'classifier.bias' (and 1 more) that the base does not have" in capsys.readouterr().err
