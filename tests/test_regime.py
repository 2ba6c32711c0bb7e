"""acetools.regime: the regime card on the zoo tests' micro world (3 tasks)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from acetools.regime import RegimeCard, clip_reference, regime_card
from acetools.search import LAMBDA_GRID
from acetools.world.vision.zoo import Zoo
from tests.test_benchmark import bench  # noqa: F401  (the module-scoped micro-world benchmark)

ISSUE_ROWS = ["experts_abs", "base_abs", "base_norm", "ta_norm", "ta_lambda", "tsv_norm", "iso_cts_norm",
              "tsv_minus_ta", "ace_gamma_median", "ace_gated_fraction", "tau_ratio", "energy", "wpre_top5_energy",
              "cosine_mean", "cosine_max", "tsv_gap_share", "trunc_norm", "scaled_norm", "overlap_topk",
              "overlap_random", "trunc_energy", "overlap_left", "overlap_right", "act_overlap",
              "act_topk_energy", "tau_in_act", "act_overlap_centred", "act_topk_energy_centred", "act_mean_share",
              "act_pos_share", "act_cls_share"]


@pytest.fixture(scope="module")
def card(bench):  # noqa: F811
    return regime_card(bench.world, bench=bench, progress=False)


def test_card_has_every_row_of_the_issue_and_per_layer_type_rows(card, bench):  # noqa: F811
    df = card.to_frame()
    assert list(df.columns) == ["metric", "label", "value", "clip", "clip_note", "unit", "how"]
    assert set(ISSUE_ROWS) <= set(df["metric"])
    assert not df["metric"].duplicated().any()
    for lt in ("attn.in_proj_weight", "mlp.c_fc.weight", "mlp.c_proj.weight"):
        assert f"tau_ratio[{lt}]" in set(df["metric"]) and f"energy[{lt}]" in set(df["metric"])
    assert np.isfinite(df.set_index("metric").loc[ISSUE_ROWS, "value"].to_numpy(dtype=float)).all()
    # 3 tasks: no paper column, so no CLIP numbers from the tables (words-only rows keep theirs)
    assert math.isnan(card.to_frame().set_index("metric").loc["tsv_norm", "clip"])
    assert list(card.per_task["task"]) == bench.tasks


def test_card_rows_agree_with_the_benchmark_and_with_each_other(card, bench):  # noqa: F811
    v = card.value
    assert v("tsv_minus_ta") == pytest.approx(v("tsv_norm") - v("ta_norm"))
    assert v("ta_lambda") in LAMBDA_GRID
    ta = bench.run("task_arithmetic")
    assert v("ta_norm") == pytest.approx(ta.summary()["test_normalized"])
    assert v("experts_abs") == pytest.approx(100 * np.mean(list(bench.expert_accuracy("test").values())))
    gap = v("experts_abs") - v("base_abs")
    tsv_abs = card.per_task.eval("tsv_m_norm * expert_acc / 100").mean()
    assert v("tsv_gap_share") == pytest.approx(100 * (tsv_abs - v("base_abs")) / gap, rel=1e-6)
    assert 0 <= v("ace_gated_fraction") <= 100 and 0 <= v("wpre_top5_energy") <= 100
    assert -1 <= v("cosine_mean") <= v("cosine_max") <= 1
    assert 0 < v("overlap_random") < 1 and 0 <= v("overlap_topk") <= 1 + 1e-9
    assert v("ta_interference") == pytest.approx(v("scaled_norm") - v("ta_norm"))
    assert 0 <= v("act_overlap") <= 1 + 1e-9 and 0 <= v("tau_in_act") <= 1 + 1e-9 and 0 < v("act_topk_energy") <= 100
    assert min(v("overlap_left"), v("overlap_right")) <= v("overlap_topk") <= max(v("overlap_left"), v("overlap_right"))
    # centred, token-aware rows beside the raw ones: shares of the raw input energy, and the centred overlap
    assert 0 <= v("act_overlap_centred") <= 1 + 1e-9 and 0 < v("act_topk_energy_centred") <= 100
    assert 0 <= v("act_mean_share") + v("act_pos_share") <= 100 + 1e-6 and 0 < v("act_cls_share") < 100


def test_truncation_and_scaling_rows_match_a_direct_computation(card, bench):  # noqa: F811
    from acetools.diagnostics import heterogeneity_per_layer
    from acetools.merging import is_matrix_param, task_vectors
    from acetools.merging.svd import low_rank, tsv_rank

    base, T = bench.base, len(bench.tasks)
    taus = task_vectors(base, bench.experts)
    t, tv = bench.tasks[0], taus[0]
    st = {}
    for k in base:
        if is_matrix_param(k, base[k]):
            st[k] = base[k] + low_rank(tv[k].double(), tsv_rank(min(tv[k].shape), T)).float()
        else:
            st[k] = base[k] + tv[k]
    acc = bench.evaluate(st, "test", tasks=[t])[t]
    ref = bench.expert_accuracy("test")[t]
    assert card.per_task.loc[0, "truncated_norm"] == pytest.approx(100 * acc / ref)
    lam = card.value("ta_lambda")
    acc2 = bench.evaluate({k: base[k] + lam * tv[k] for k in base}, "test", tasks=[t])[t]
    assert card.per_task.loc[0, "scaled_norm"] == pytest.approx(100 * acc2 / ref)
    het = heterogeneity_per_layer(taus, tau=0.3)
    assert card.value("ace_gamma_median") == pytest.approx(float(het["gamma"].median()))
    assert card.value("ace_gated_fraction") == pytest.approx(100 * float(het["flag"].mean()))


def test_overlap_is_one_for_identical_task_vectors(bench, tmp_path):  # noqa: F811
    """Two experts equal to one another: their subspaces coincide, the cosine is 1."""
    import copy

    from acetools.benchmark import Benchmark

    zoo = bench.world
    twin = copy.copy(zoo)  # the zoo's cache, two tasks that are both task "a"
    e = zoo.expert_state("a")
    twin.tasks = ["a", "a2"]
    twin.expert_state = lambda t: e
    twin.split = lambda t, s: zoo.split("a", s)
    twin.head = lambda t: zoo.head("a")
    twin.records = list
    twin.mtl = False
    b = Benchmark(twin, n_val=30, n_test=30, threads=1)
    c = regime_card(twin, bench=b, progress=False)
    assert c.value("overlap_topk") == pytest.approx(1.0, abs=1e-6)
    assert c.value("cosine_max") == pytest.approx(1.0, abs=1e-6)
    assert c.value("ace_gamma_median") == 0.0  # equal energies: no heterogeneity
    assert c.value("act_overlap") == pytest.approx(1.0, abs=1e-6)  # the same inputs: the same activations
    assert c.value("act_overlap_centred") == pytest.approx(1.0, abs=1e-6)


def test_save_and_load_round_trip(card, tmp_path):
    paths = card.save(tmp_path / "out", stem="card")
    assert {p.name for p in paths.values()} == {"card.csv", "card_per_task.csv", "card_per_layer.csv", "card.json"}
    back = RegimeCard.load(tmp_path / "out")
    assert back.to_frame()["metric"].tolist() == card.to_frame()["metric"].tolist()
    assert back.value("tsv_norm") == pytest.approx(card.value("tsv_norm"))
    assert back.meta["n_tasks"] == 3 and back.meta["recipe"]["finetune"]["lr"] == 3e-3
    assert back.meta["recipe"]["pretrain"]["epochs"] == 4  # a trained base records its pretraining
    with pytest.raises(FileNotFoundError, match="card.json"):
        RegimeCard.load(tmp_path / "nowhere")
    with pytest.raises(KeyError, match="no row 'nope'"):
        card.value("nope")


def test_clip_reference_is_the_paper_table_normalized():
    from acetools.regime import CLIP_B32
    from acetools_course.paper_tables import paper_column

    for n in (8, 14, 20):
        col = paper_column("spec", "ViT-B/32", n, methods_only=False)
        ours = {"Fine-tuned": "experts (individual)", "Zero-shot": "base (frozen heads)",
                "Task Arithmetic": "task_arithmetic", "TSV-M": "tsv_m", "Iso-CTS": "iso_cts"}
        for name, key in ours.items():
            assert CLIP_B32[name][n] == col[key], (name, n)
    col = paper_column("spec", "ViT-B/32", 8, methods_only=False)
    ref = clip_reference(8)
    ft = col["experts (individual)"]
    assert ref["ta_norm"] == pytest.approx(100 * col["task_arithmetic"] / ft)
    assert ref["tsv_minus_ta"] == pytest.approx(100 * (col["tsv_m"] - col["task_arithmetic"]) / ft)
    assert 76.2 < ref["ta_norm"] < 76.4 and 84 < ref["tsv_gap_share"] < 85  # the issue's table
    assert all(math.isnan(v) for v in clip_reference(5).values())


def test_bad_tau_is_refused(bench):  # noqa: F811
    with pytest.raises(ValueError, match="tau"):
        regime_card(bench.world, bench=bench, tau=0.0, progress=False)


def test_cli_regime_writes_the_card(bench, tmp_path, monkeypatch, capsys):  # noqa: F811
    import acetools.world.vision.zoo as zoo_mod
    from acetools.cli import main

    seen = {}

    def fake_zoo(tasks, **kw):  # Zoo's own first parameter (the CLI passes the suite as tasks=)
        seen.update(kw, suite=tasks)
        return bench.world

    monkeypatch.setattr(zoo_mod, "Zoo", fake_zoo)
    rc = main(["regime", "--suite", "tiny", "--size", "micro", "--seed", "0", "--out", str(tmp_path / "c"),
               "--n-val", "60", "--n-test", "90", "--threads", "1"])
    assert rc == 0
    assert (tmp_path / "c" / "card.csv").is_file() and (tmp_path / "c" / "card.json").is_file()
    assert seen["suite"] == "tiny" and seen["size"] == "micro" and seen["seed"] == 0 and seen["mtl"] is False
    out = capsys.readouterr().out
    assert "TSV-M − task arithmetic" in out


def test_recipe_study_recipes_are_valid_and_the_summary_collects_cards(card, tmp_path):
    """benchmarks/recipe_study.py: every recipe makes a Zoo (nothing is built); the summary
    reads every card under a folder into the CSV and the figure."""
    from tests.conftest import load_script

    mod = load_script("recipe_study")
    for name in mod.RECIPES:
        zoo = mod.make_zoo(name, root=tmp_path / "zoo")
        assert zoo.tasks == ["fashion", "animals", "digits", "letters", "shapes", "orient", "count", "texture"]
        assert not zoo.built and not zoo.mtl
    # the first world keeps its recipe (and so its cache keys) after the shipped default moved
    first = mod.make_zoo("first_world", root=tmp_path / "zoo").finetune_config
    assert (first.lr, first.epochs, first.precision) == (4e-4, 3, "fp32")
    assert mod.make_zoo("gentle_fast", root=tmp_path / "zoo").finetune_config == \
        Zoo(["fashion"], size="small", root=tmp_path / "zoo").finetune_config
    with pytest.raises(KeyError, match="unknown recipe"):
        mod.make_zoo("nope")
    assert mod.summary_row(card, "x", ["tsv_norm"]) == {"recipe": "x", "tsv_norm": card.value("tsv_norm")}
    card.save(tmp_path / "cards" / "first_world")
    card.save(tmp_path / "cards" / "gentle")
    df = mod.summarize(tmp_path / "cards")
    assert df["recipe"].tolist() == ["first_world", "gentle", "CLIP ViT-B/32 (papers)"]
    assert (tmp_path / "cards" / "recipe_study.png").stat().st_size > 0
    back = pd.read_csv(tmp_path / "cards" / "recipe_study.csv")
    assert back.loc[0, "tsv_minus_ta"] == pytest.approx(card.value("tsv_minus_ta"), rel=1e-3)
    with pytest.raises(FileNotFoundError, match="card.json"):
        mod.summarize(tmp_path / "empty")
