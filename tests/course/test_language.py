"""Lesson 07's tables and verdict rules (the rules checked on the papers' own numbers)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from acetools.diagnostics import heterogeneity_per_layer
from acetools.merging import task_vectors
from acetools_course import lesson07_language as lesson
from acetools_course.lesson02_ace_step_by_step import gamma_by_type


def test_gamma_by_type_names_bert_layers_and_gamma_depends_on_the_units():
    """The lesson's one gamma table (acetools.diagnostics.heterogeneity_per_layer, summarised by
    acetools_course.lesson02_ace_step_by_step.gamma_by_type) on BERT keys; scaling every weight moves gamma."""
    g = torch.Generator().manual_seed(0)
    base = {"encoder.layer.0.attention.self.query.weight": torch.randn(8, 8, generator=g),
            "encoder.layer.0.output.dense.weight": torch.randn(8, 16, generator=g)}
    experts = [{k: v + s * 0.01 * torch.randn(v.shape, generator=g) for k, v in base.items()} for s in (1, 2, 4)]
    a = heterogeneity_per_layer(task_vectors(base, experts))
    c = 100.0
    scaled = heterogeneity_per_layer(task_vectors({k: c * v for k, v in base.items()},
                                                  [{k: c * v for k, v in e.items()} for e in experts]))
    assert not a["gamma"].to_numpy() == pytest.approx(scaled["gamma"].to_numpy(), rel=1e-2), \
        "gamma depends on the units"
    assert a["energy_max"].to_numpy() / a["energy_min"].to_numpy() == pytest.approx(
        scaled["energy_max"].to_numpy() / scaled["energy_min"].to_numpy(), rel=1e-4)  # the spread does not
    by_type = gamma_by_type(a)
    assert list(by_type.index) == ["query", "ffn_out"] and by_type.shape[1] <= 6


def test_stage_view_is_five_plain_columns():
    abl = pd.DataFrame([{"eps": 1e-2, "setting": "gate on (forced)", "gate": "on", "val_normalized": 80.0,
                         "test_normalized": 79.0, "test_acc": 70.0, "merge_seconds": 1.0}])
    v = lesson.stage_view(abl)
    assert list(v.columns) == ["ε", "setting", "validation, normalized (%)", "test, normalized (%)",
                               "test accuracy (%)"]
    assert v.iloc[0].tolist() == [1e-2, "gate on (forced)", 80.0, 79.0, 70.0]


def _write_run(folder, suite, seed, tasks, normalized):
    """A committed-looking benchmark run: a summary and a per-task file."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{suite}_minilm_seed{seed}"
    pd.DataFrame([{"method": m, "coef_name": "", "coef": None, "test_acc": v, "test_normalized": v,
                   "val_normalized": v, "merge_seconds": 0.0} for m, v in normalized.items()]).to_csv(
        f"{stem}_summary.csv", index=False)
    pd.DataFrame([{"method": m, "task": t, "split": "test", "accuracy": v, "normalized": v}
                  for m, v in normalized.items() for t in tasks]).to_csv(f"{stem}_per_task.csv", index=False)


def test_growth_table_reads_each_suites_lead_over_task_arithmetic(tmp_path):
    t8, t12 = [f"t{i}" for i in range(8)], [f"t{i}" for i in range(12)]
    _write_run(tmp_path, "text8", 0, t8, {"task_arithmetic": 70.0, "tsv_m": 86.0, "ace (eps 2e-4)": 84.0})
    _write_run(tmp_path, "text8", 1, t8, {"task_arithmetic": 72.0, "tsv_m": 86.0, "ace (eps 2e-4)": 86.0})
    _write_run(tmp_path, "text12", 0, t12, {"task_arithmetic": 60.0, "tsv_m": 80.0, "ace (eps 2e-4)": 81.0})
    g = lesson.growth_table(tmp_path).set_index("lead")
    assert list(g.columns) == ["text8 (T = 8, 2 seeds)", "text12 (T = 12, 1 seed)"]
    assert g.loc["tsv_m − task_arithmetic", "text8 (T = 8, 2 seeds)"] == pytest.approx(15.0)
    assert g.loc["ace (eps 2e-4) − task_arithmetic", "text12 (T = 12, 1 seed)"] == pytest.approx(21.0)
    assert "esm − task_arithmetic" not in g.index, "a method with no row is left out"
    assert lesson.growth_table(tmp_path, ["text8"]).shape[1] == 2
    assert lesson.growth_table(tmp_path / "none").empty


def test_room_by_task_ranks_the_tasks_by_tsv_m_over_task_arithmetic(tmp_path):
    _write_run(tmp_path, "text8", 0, ["a", "b"], {"base (zero-shot heads)": 50.0, "task_arithmetic": 80.0,
                                                  "tsv_m": 90.0})
    # a second seed where task b gains more than task a
    pd.DataFrame([{"method": m, "task": t, "split": "test", "accuracy": v, "normalized": v}
                  for m, vals in {"base (zero-shot heads)": (50, 50), "task_arithmetic": (80, 60),
                                  "tsv_m": (90, 90)}.items() for t, v in zip("ab", vals)]).to_csv(
        tmp_path / "text8_minilm_seed1_per_task.csv", index=False)
    (tmp_path / "text8_minilm_seed1_summary.csv").write_text((tmp_path / "text8_minilm_seed0_summary.csv").read_text())
    r = lesson.room_by_task(tmp_path)
    assert r["task"].tolist() == ["b", "a"]
    assert r.set_index("task").loc["b", "tsv_m − task_arithmetic"] == pytest.approx(20.0)  # (10 + 30) / 2
    assert r.set_index("task").loc["a", "base (zero-shot heads)"] == pytest.approx(50.0)
    with pytest.raises(FileNotFoundError, match="text12"):
        lesson.room_by_task(tmp_path, "text12")
