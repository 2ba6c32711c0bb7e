"""The benchmark harness on a micro world: search, evaluation, method inputs, records."""

from __future__ import annotations

import json

import pytest

from acetools.benchmark import Benchmark, Search
from acetools.search import LAMBDA_GRID
from tests.test_zoo import FINETUNE, PRETRAIN, load_split, pretraining_pool  # the zoo tests' 3-task world


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from acetools.world.vision.zoo import Zoo

    zoo = Zoo(["a", "b", "c"], size="micro", seed=0, root=tmp_path_factory.mktemp("zoo"), base="train",
              load_split=load_split, pretraining_pool=pretraining_pool, pretrain=PRETRAIN, finetune=FINETUNE,
              threads=1, mtl=False).build(progress=False)
    return Benchmark(zoo, n_val=60, n_proxy=8, n_gram=64, threads=1)


def test_expert_row_is_100_normalized_and_base_is_evaluated(bench):
    runs = bench.reference_rows()
    names = [r.name for r in runs]
    assert names == ["base (frozen heads)", "experts (individual)"]
    assert all(abs(v - 1.0) < 1e-12 for v in runs[1].test_normalized.values())
    assert set(runs[0].test) == {"a", "b", "c"}


def test_grid_search_picks_from_the_grid_and_reports_test_at_it(bench):
    run = bench.run("task_arithmetic")
    assert run.coef_name == "lam" and run.coef in LAMBDA_GRID
    assert len(run.search) == len(LAMBDA_GRID)
    best = run.search.loc[run.search.avg_normalized_top1.idxmax()]
    assert best.alpha == pytest.approx(run.coef)
    # the chosen coefficient's val accuracy is what the search saw
    for t in bench.tasks:
        assert run.val[t] == pytest.approx(best[f"{t}:top1"])
    # and test accuracy equals a direct merge at that coefficient
    import acetools

    direct = acetools.merge("task_arithmetic", bench.base, bench.experts, lam=run.coef)
    assert bench.evaluate(direct, "test") == pytest.approx(run.test)


def test_methods_needing_data_get_it(bench):
    esm = bench.run("esm", search=Search("alpha", "esm", bracket=(0.0, 2.0)))
    assert 0.0 <= esm.coef <= 2.0
    acts = bench.esm_activations()
    k = next(iter(acts))
    assert len(acts[k]) == 3 and acts[k][0].shape[0] == 8 * 17  # 8 images x (16 patches + cls)
    reg = bench.run("regmean")
    assert reg.coef is None and set(reg.test) == set(bench.tasks)
    assert len(bench.grams()) == 3


def test_data_inputs_are_timed_apart_from_the_merge(bench, monkeypatch):
    fresh = Benchmark(bench.world, n_val=60, n_proxy=8, n_gram=64, threads=1)
    collected = []
    real = fresh.world.gram_inputs
    monkeypatch.setattr(fresh.world, "gram_inputs", lambda *a, **k: collected.append(1) or real(*a, **k))
    first = fresh.run("regmean")
    assert first.inputs_seconds > 0 and fresh._grams is not None and len(collected) == len(fresh.tasks)
    again = fresh.run("regmean")  # the Grams are cached: nothing collected, same merge
    assert len(collected) == len(fresh.tasks) and again.test == first.test
    assert fresh.run("task_arithmetic").summary()["inputs_seconds"] == 0.0  # no data inputs


def test_variant_rows_are_the_labelled_merges(bench):
    import acetools
    from acetools.benchmark import VARIANTS

    runs = bench.run_all(["ace", "wudi"], references=False, extra=VARIANTS)
    assert [r.name for r in runs] == ["ace", "wudi", "ace (gate off)", "ace (eps 1e-5)", "wudi (lr 1e-4)",
                                      "wudi (lr 1e-3)"]
    for r, hp in zip(runs[2:], ({"gate": "off"}, {"eps": 1e-5}, {"lr": 1e-4}, {"lr": 1e-3})):
        assert r.method == r.name.split(" ")[0] and r.coef is None and r.hparams == hp
        direct = acetools.merge(r.method, bench.base, bench.experts, **hp)
        assert bench.evaluate(direct, "test") == pytest.approx(r.test)


def test_non_affine_search_is_refused(bench, monkeypatch):
    import acetools.benchmark as B

    real = B.merge

    def squared(method, base, experts, **hp):
        lam = hp.pop("lam")
        return real(method, base, experts, lam=lam**2, **hp)

    monkeypatch.setattr(B, "merge", squared)
    with pytest.raises(RuntimeError, match="affinely"):
        bench.run("task_arithmetic")


def test_save_writes_tables_and_a_reproducible_record(bench, tmp_path):
    runs = bench.run_all(["weight_averaging", "ace"], progress=False)
    paths = bench.save(runs, tmp_path, "micro")
    rec = json.loads(paths["json"].read_text())
    assert rec["tasks"] == ["a", "b", "c"] and rec["size"] == "micro"
    assert {r["method"] for r in rec["runs"]} >= {"weight_averaging", "ace"}
    assert any(c["kind"] == "expert" and len(c["content_sha256"]) == 64 for c in rec["checkpoints"])
    assert "torch" in rec["versions"]
    summary = bench.summary(runs)
    assert summary.loc[summary.method == "experts (individual)", "test_normalized"].item() == pytest.approx(100)


def test_every_searched_method_is_registered():
    from acetools.merging import METHODS

    for m, info in METHODS.items():
        if info.search is not None:
            assert info.search.param in info.params, (m, info.search.param)


def test_micro_world_from_the_data_registry_builds_and_merges(tmp_path):
    """CI builds a real (offline-data) micro world end to end and merges it (issue: mini-world)."""
    from acetools.world.vision.data import SUITES
    from acetools.world.vision.zoo import Zoo

    assert "tiny" in SUITES
    zoo = Zoo("tiny", size="micro", seed=0, root=tmp_path, base="train", pool_kwargs={"n_per_source": 200},
              pretrain=PRETRAIN, finetune=FINETUNE, threads=1, mtl=False).build(progress=False)
    bench = Benchmark(zoo, n_val=40, n_test=60, threads=1)
    base_acc = bench.evaluate(bench.base, "test")
    experts = bench.expert_accuracy("test")
    run = bench.run("ace")
    assert set(run.test) == set(SUITES["tiny"])
    # experts learned their tasks beyond the base's frozen prototype heads
    assert sum(experts.values()) > sum(base_acc.values())
    assert all(0.0 <= v <= 1.0 for v in run.test.values())


def test_patience_stops_the_grid_early_and_is_recorded(bench):
    run = bench.run("task_arithmetic")
    from acetools.benchmark import Benchmark

    b2 = Benchmark(bench.world, n_val=60, n_proxy=8, n_gram=64, threads=1, patience=2)
    r2 = b2.run("task_arithmetic")
    assert len(r2.search) < len(run.search) or r2.coef == run.coef
    assert b2.record([r2])["patience"] == 2
    with pytest.raises(ValueError, match="patience"):
        Benchmark(bench.world, patience=0)


def test_regime_tables_match_a_direct_computation(bench):
    from acetools.merging import is_matrix_param

    norms, cos = bench.regime()
    assert list(norms.index) == bench.tasks and list(cos.index) == bench.tasks
    key = next(k for k in bench.base if k.endswith("mlp.c_fc.weight"))
    t = bench.tasks[1]
    tau = bench.world.expert_state(t)[key] - bench.base[key]
    layer_keys = [k for k in bench.base if k.endswith("mlp.c_fc.weight")]
    want = sum(float((bench.world.expert_state(t)[k] - bench.base[k]).norm() / bench.base[k].norm())
               for k in layer_keys) / len(layer_keys)
    assert norms.loc[t, "mlp.c_fc.weight"] == pytest.approx(want, rel=1e-6)
    assert float(tau.norm()) > 0
    assert all(is_matrix_param(k, bench.base[k]) for k in layer_keys)
    assert cos.values.diagonal() == pytest.approx([1.0] * len(bench.tasks))


def test_seed_aggregation_reads_every_seed_file(bench, tmp_path):
    import pandas as pd

    from acetools.benchmark import aggregate_seeds

    runs = [bench.run("weight_averaging")]
    for s, shift in ((0, 0.0), (1, 2.0)):
        df = bench.summary(runs)
        df["test_normalized"] += shift
        df.to_csv(tmp_path / f"tiny_micro_seed{s}_summary.csv", index=False)
    (tmp_path / "tiny_micro_seedX_summary.csv").write_text("junk")  # not a seed file: ignored
    agg = aggregate_seeds(tmp_path, "tiny", "micro").set_index("method")
    row = agg.loc["weight_averaging"]
    assert row.n_seeds == 2
    assert row.test_normalized == pytest.approx(df["test_normalized"].iloc[0] - 1.0)
    assert row.test_normalized_sd == pytest.approx(pd.Series([0.0, 2.0]).std())
    with pytest.raises(FileNotFoundError, match="acetools bench"):
        aggregate_seeds(tmp_path, "tasks8", "small")


def test_wudi_step_size_study(bench):
    """benchmarks/wudi_step_size.py's measurement: WUDI's start and how far Adam moves from it."""
    from tests.conftest import load_script

    wudi_step_size = load_script("wudi_step_size").wudi_step_size
    df = wudi_step_size(bench, [1e-6, 1e-4], steps=20)
    assert list(df["method"]) == ["task_arithmetic", "wudi", "wudi"]
    assert df.loc[0, "lam"] == 1.0 and list(df["lr"].iloc[1:]) == [1e-6, 1e-4]
    w = df.iloc[1:]
    # the start is the sum of the task vectors: its RMS is the same for every run
    assert w["rms_start"].nunique() == 1 and w["rms_start"].iloc[0] > 0
    # Adam moves an entry by about lr per step: at most ~steps * lr, more with a larger lr
    assert (w["rms_move"] <= 1.05 * 20 * w["lr"]).all()
    assert w["rms_move"].is_monotonic_increasing and w["loss_ratio"].is_monotonic_decreasing
    assert (w["loss_ratio"] < 1).all()
    for c in ("val_normalized", "test_normalized", "val_acc", "test_acc"):
        assert df[c].between(0, 200).all()
    with pytest.raises(ValueError, match="lrs"):
        wudi_step_size(bench, [0.0])


def test_test_rows_carry_per_example_correctness_saved_beside_the_tables(bench, tmp_path):
    import numpy as np

    from acetools.results import load_correctness

    run = bench.run("weight_averaging")
    base = bench.reference_rows()[0]
    for r in (run, base):
        assert r.test_correct is not None and set(r.test_correct) == {"a", "b", "c"}
        for t, hits in r.test_correct.items():
            assert hits.dtype == bool and len(hits) == len(bench.data(t, "test").y)
            assert int(hits.sum()) / len(hits) == r.test[t]  # the accuracy is the examples' mean
    merged = bench._merge("weight_averaging", {})
    assert bench.evaluate(merged, "test") == run.test  # the accuracy-only path agrees
    paths = bench.save([base, run], tmp_path, "micro", regime=False)
    back = load_correctness(paths["correct"])
    assert set(back) == {base.name, "weight_averaging"}
    for t in ("a", "b", "c"):
        np.testing.assert_array_equal(back["weight_averaging"][t], run.test_correct[t])


def test_a_given_hyperparameter_wins_over_the_worlds_data_input(bench, monkeypatch):
    """A variant's ESM targets (esm (roberta)) replace the world's, which would otherwise be passed twice."""
    import acetools
    from acetools.merging.esm import DEFAULT_TARGETS

    monkeypatch.setattr(bench, "esm_targets", lambda: ("matches no key",))
    run = bench.run("esm", search=None, targets=DEFAULT_TARGETS, alpha=0.5)
    direct = acetools.merge("esm", bench.base, bench.experts, activations=bench.esm_activations(),
                            targets=DEFAULT_TARGETS, alpha=0.5)
    assert bench.evaluate(direct, "test") == pytest.approx(run.test)
    assert bench.record([run])["heads"] is None  # the vision zoo names no head protocol
