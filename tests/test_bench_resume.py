"""A benchmark stopped part-way resumes from the rows it kept (``Benchmark.run_all(store=...)``), kept as JSON
and ``.npz`` (never a pickle; issue #39 item 9)."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import acetools
from acetools.benchmark import Benchmark, load_row, row_path, save_row
from acetools.errors import InputError
from tests.test_benchmark import bench  # noqa: F401  (the module-scoped micro-world benchmark)


def _same_row(kept, fresh) -> None:
    for name in ("method", "hparams", "coef_name", "coef", "val", "test", "val_normalized", "test_normalized",
                 "merge_seconds", "label", "inputs_seconds"):
        assert getattr(kept, name) == getattr(fresh, name), name
    assert (kept.search is None) == (fresh.search is None)
    if fresh.search is not None:
        pd.testing.assert_frame_equal(kept.search, fresh.search)
    assert (kept.test_correct is None) == (fresh.test_correct is None)
    for task, hits in (fresh.test_correct or {}).items():
        assert kept.test_correct is not None
        assert kept.test_correct[task].dtype == hits.dtype and np.array_equal(kept.test_correct[task], hits)


def test_kept_rows_are_handed_back_and_only_the_rest_is_computed(bench, tmp_path, monkeypatch):  # noqa: F811
    store = tmp_path / "rows"
    first = bench.run_all(["weight_averaging", "task_arithmetic"], references=False, store=store)
    assert sorted(p.name for p in store.glob("*.json")) == ["task_arithmetic.json", "weight_averaging.json"]
    assert not list(store.glob("*.pkl"))

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
        _same_row(kept, fresh)  # every field as computed: scores, search trace, per-example correctness
    assert first[1].search is not None  # task arithmetic searched its coefficient: the trace came back too
    assert (store / "ta_no_search_.json").is_file()


def test_a_file_holding_another_row_is_refused(bench, tmp_path):  # noqa: F811
    store = tmp_path / "rows"
    bench.run_all(["weight_averaging"], references=False, store=store)
    (store / "weight_averaging.json").rename(store / "task_arithmetic.json")
    with pytest.raises(InputError, match="does not hold the row 'task_arithmetic'"):
        bench.run_all(["task_arithmetic"], references=False, store=store)


def test_a_changed_correctness_file_or_another_format_is_refused(bench, tmp_path):  # noqa: F811
    run = bench.run("weight_averaging")
    path = save_row(row_path(tmp_path, run.name), run)
    _same_row(load_row(path, run.name), run)
    assert run.test_correct is not None  # the micro world scores examples: the row has an .npz
    npz = path.with_suffix(".npz")
    npz.write_bytes(npz.read_bytes() + b"\0")
    with pytest.raises(InputError, match="missing or changed"):
        load_row(path, run.name)
    path.write_text(json.dumps({"format": "something else", "name": run.name}))
    with pytest.raises(InputError, match="not a kept benchmark row"):
        load_row(path, run.name)


class _RunsCode:
    """A pickle that runs code when loaded: it would create ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_an_old_pickle_row_is_never_loaded_but_computed_again_with_a_warning(bench, tmp_path):  # noqa: F811
    store = tmp_path / "rows"
    store.mkdir()
    marker = tmp_path / "the pickle ran"
    (store / "weight_averaging.pkl").write_bytes(pickle.dumps(_RunsCode(marker)))
    with pytest.warns(UserWarning, match=r"weight_averaging\.pkl: a row kept as a pickle .* never loaded"):
        runs = bench.run_all(["weight_averaging"], references=False, store=store)
    assert not marker.exists() and runs[0].name == "weight_averaging" and runs[0].test
    assert (store / "weight_averaging.json").is_file()


def test_no_module_of_the_package_imports_pickle():
    """Nothing in acetools/ unpickles, except the Animal-MNIST reader, whose unpickler refuses every class but
    NumPy's arrays (acetools/world/vision/data/sources.py, ``_NumpyOnlyUnpickler``)."""
    allowed = {"world/vision/data/sources.py"}
    root = Path(acetools.__file__).parent
    found = set()
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in ("pickle", "_pickle", "cPickle", "dill", "cloudpickle") for n in names):
                found.add(f.relative_to(root).as_posix())
    assert found == allowed, found
    src = (root / "world/vision/data/sources.py").read_text()
    assert "def find_class" in src and "refusing to unpickle" in src
