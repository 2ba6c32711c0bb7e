"""A benchmark stopped part-way resumes from the rows it kept (``Benchmark.run_all(store=...)``)."""

from __future__ import annotations

import pytest

from acetools.benchmark import Benchmark
from acetools.errors import InputError
from tests.test_benchmark import bench  # noqa: F401  (the module-scoped micro-world benchmark)


def test_kept_rows_are_handed_back_and_only_the_rest_is_computed(bench, tmp_path, monkeypatch):  # noqa: F811
    store = tmp_path / "rows"
    first = bench.run_all(["weight_averaging", "task_arithmetic"], references=False, store=store)
    assert sorted(p.name for p in store.glob("*.pkl")) == ["task_arithmetic.pkl", "weight_averaging.pkl"]

    computed = []
    real_run = Benchmark.run

    def counting_run(self, method, **kw):
        computed.append(kw.get("label") or method)
        return real_run(self, method, **kw)

    monkeypatch.setattr(Benchmark, "run", counting_run)
    extra = {"ta (no search)": {"method": "task_arithmetic", "search": None}}
    again = bench.run_all(["weight_averaging", "task_arithmetic"], references=False, extra=extra, store=store)
    assert computed == ["ta (no search)"]  # the two kept rows were read back, not merged again
    assert [r.name for r in again] == ["weight_averaging", "task_arithmetic", "ta (no search)"]
    for kept, fresh in zip(again[:2], first):
        assert kept.test == fresh.test and kept.coef == fresh.coef
    assert (store / "ta_no_search_.pkl").is_file()


def test_a_file_holding_another_row_is_refused(bench, tmp_path):  # noqa: F811
    store = tmp_path / "rows"
    bench.run_all(["weight_averaging"], references=False, store=store)
    (store / "weight_averaging.pkl").rename(store / "task_arithmetic.pkl")
    with pytest.raises(InputError, match="does not hold the row 'task_arithmetic'"):
        bench.run_all(["task_arithmetic"], references=False, store=store)
