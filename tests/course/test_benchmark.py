"""acetools_course.lesson04_benchmark (lesson 04): the lesson's data and tables."""

from __future__ import annotations

import numpy as np
import pandas as pd

from acetools import results
from acetools_course import lesson04_benchmark as lesson
from tests.test_results import summary_rows


def three_suites(scores_by_suite):
    return summary_rows({(s, n): v for (s, n), v in zip([("t8", 8), ("t14", 14), ("t20", 20)], scores_by_suite)})


def test_method_ranks():
    s = three_suites([{"ace": [80], "tsv_m": [85], "ta": [70]}, {"ace": [90], "tsv_m": [85], "ta": [70]},
                      {"ace": [70], "tsv_m": [70], "ta": [75]}])
    r = lesson.method_ranks(results.aggregate(s), ("ace",)).set_index("suite")
    assert r.loc["t8", "best"] == "tsv_m" and r.loc["t8", "ace rank"] == 2
    assert r.loc["t14", "ace rank"] == 1 and r.loc["t20", "ace rank"] == 2  # ties share the better rank
    assert r.loc["t20", "best score"] == 75 and list(r["T"]) == [8, 14, 20]


def test_wudi_lr_summary_uses_the_registry_default():
    from acetools.merging import METHODS

    lr0 = METHODS["wudi"].hparams["lr"]
    study = pd.DataFrame({"suite": "t8", "seed": 0, "method": "wudi", "lr": [lr0, 10 * lr0, 100 * lr0],
                          "val_normalized": [50.0, 80.0, 70.0], "test_normalized": [49.0, 79.0, 71.0],
                          "rms_start": 1e-2, "rms_move": [1e-5, 1e-4, 1e-3]})
    row = lesson.wudi_lr_summary(study).iloc[0]
    assert row["default lr"] == lr0 and row["default score"] == 49.0 and row["RMS move"] == 1e-5
    assert row["best lr on val"] == 10 * lr0 and row["its score"] == 79.0


# ----------------------------------------------------------------------------- variant rows and data-input time
def test_merge_time_table_splits_the_capture():
    s = three_suites([{"ace": [80], "esm": [85], "regmean": [84]}] * 3).assign(
        merge_seconds=lambda d: np.where(d["method"] == "esm", 2.0, 1.0),
        inputs_seconds=lambda d: np.select([d["method"] == "esm", d["method"] == "regmean"], [5.0, 0.5], 1e-6))
    t, apart = lesson.merge_time_table(results.aggregate(s))
    assert apart
    assert list(t.index) == ["ace", "esm", "esm: data capture", "esm: merge + capture", "regmean",
                             "regmean: data capture", "regmean: merge + capture"]
    assert t.loc["esm", "t8"] == 2.0 and t.loc["esm: data capture", "t14"] == 5.0
    assert t.loc["esm: merge + capture", "t20"] == 7.0 and t.loc["regmean: merge + capture", "t8"] == 1.5
    old, apart = lesson.merge_time_table(results.aggregate(s.drop(columns="inputs_seconds")))
    assert not apart and list(old.index) == ["ace", "esm", "regmean"]


