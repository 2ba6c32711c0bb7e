"""The benchmark harness on a micro world: search, evaluation, method inputs, records."""

from __future__ import annotations

import json

import pytest
import torch

from acetools.benchmark import SEARCH, Benchmark, Search
from acetools.search import LAMBDA_GRID

from test_zoo import FINETUNE, PRETRAIN, load_split, pretraining_pool  # the zoo tests' 3-task world


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from acetools.zoo import Zoo

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

    for m, s in SEARCH.items():
        assert m in METHODS
        if s is not None:
            assert s.param in METHODS[m].params, (m, s.param)


def test_micro_world_from_the_data_registry_builds_and_merges(tmp_path):
    """CI builds a real (offline-data) micro world end to end and merges it (issue: mini-world)."""
    from acetools.data import SUITES
    from acetools.zoo import Zoo

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
