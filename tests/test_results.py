"""acetools.results (the library's result files): loading benchmark files, aggregation, Kendall tau.

The benchmark lesson's verdicts and targets are tested in tests/lessons/test_lesson04_benchmark.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from acetools import results
from acetools.benchmark import aggregate_seeds

REF = list(results.REFERENCES[:2])


# ----------------------------------------------------------------------------- fixtures
def summary_rows(suite_scores: dict, seconds: dict | None = None, coef: dict | None = None) -> pd.DataFrame:
    """A tidy summary like load_summary's from ``{(suite, n_tasks): {method: [score per seed]}}``."""
    rows = []
    for (suite, n), methods in suite_scores.items():
        for m, vals in methods.items():
            for seed, v in enumerate(vals):
                rows.append({"suite": suite, "n_tasks": n, "size": "small", "seed": seed, "method": m,
                             "kind": results.row_kind(m),
                             "coef_name": None, "coef": (coef or {}).get(m, math.nan),
                             "test_acc": v, "test_normalized": v, "val_normalized": v,
                             "merge_seconds": (seconds or {}).get((suite, m), 1.0)})
    return pd.DataFrame(rows)


def write_run(folder, suite, seed, methods: dict, tasks=("a", "b"), regime=True, record=True, size="small"):
    """Files as Benchmark.save writes them; ``methods``: method -> (test_acc, normalized, seconds)."""
    stem = f"{suite}_{size}_seed{seed}"
    summ = [{"method": m, "coef_name": "lam" if m == "task_arithmetic" else None,
             "coef": 0.3 if m == "task_arithmetic" else None, "test_acc": a, "test_normalized": n,
             "val_normalized": n + 1, "merge_seconds": s} for m, (a, n, s) in methods.items()]
    pd.DataFrame(summ).to_csv(folder / f"{stem}_summary.csv", index=False)
    pt = [{"method": m, "task": t, "split": sp, "accuracy": a + i, "normalized": n + i}
          for m, (a, n, _) in methods.items() for sp in ("val", "test") for i, t in enumerate(tasks)]
    pd.DataFrame(pt).to_csv(folder / f"{stem}_per_task.csv", index=False)
    if regime:
        pd.DataFrame({"attn": [0.1] * len(tasks), "all matrices": [0.2] * len(tasks)},
                     index=pd.Index(tasks, name="task")).to_csv(folder / f"{stem}_norms.csv")
        pd.DataFrame(np.eye(len(tasks)), index=tasks, columns=tasks).to_csv(folder / f"{stem}_cosine.csv")
    if record:
        trace = [{"step": i, "alpha": a, "avg_top1": 0.5 + 0.1 * i, "avg_normalized_top1": 0.6 + 0.1 * i,
                  "is_best": i == 1, **{f"{t}:top1": 0.5 for t in tasks},
                  **{f"{t}:normalized_top1": 0.7 for t in tasks}}
                 for i, a in enumerate((0.1, 0.2, 0.3))]
        runs = [{"method": m, "coef_name": "lam" if m == "task_arithmetic" else None,
                 "search_trace": trace if m == "task_arithmetic" else None} for m in methods]
        (folder / f"{stem}.json").write_text(json.dumps({"tasks": list(tasks), "runs": runs}))


@pytest.fixture
def folder(tmp_path):
    m = {"base (frozen heads)": (40.0, 50.0, 0.0), "experts (individual)": (90.0, 100.0, 0.0)}
    write_run(tmp_path, "tasks8", 0, {**m, "task_arithmetic": (70.0, 80.0, 0.1), "ace": (75.0, 84.0, 0.2)})
    write_run(tmp_path, "tasks8", 1, {**m, "task_arithmetic": (72.0, 82.0, 0.3), "ace": (79.0, 88.0, 0.4)})
    write_run(tmp_path, "tasks14", 0, {**m, "task_arithmetic": (60.0, 70.0, 0.5), "ace": (70.0, 80.0, 0.6)},
              tasks=("a", "b", "c"), record=False)
    (tmp_path / "notes.txt").write_text("not a result")
    return tmp_path


# ----------------------------------------------------------------------------- loading
def test_find_results_orders_by_suites_then_seed_and_finds_optional_files(folder):
    runs = results.find_results(folder, ["tasks14", "tasks8"], "small")
    assert [(r.suite, r.seed) for r in runs] == [("tasks14", 0), ("tasks8", 0), ("tasks8", 1)]
    assert runs[0].record is None and runs[1].record is not None and runs[1].norms is not None
    assert all(r.correct is None for r in runs)  # written before per-example results were saved
    saved = results.save_correctness(folder / "tasks8_small_seed1_correct.npz", {"ace": {"a": [True, False]}})
    assert [r.correct for r in results.find_results(folder, ["tasks8"], "small")] == [None, saved]
    assert results.find_results(folder, ["tasks8"], "tiny") == []
    assert results.find_results(folder / "missing") == []


def test_require_results_names_the_command(folder):
    with pytest.raises(FileNotFoundError, match=r"acetools bench --suite tasks20 --size small"):
        results.require_results(folder, ["tasks8", "tasks20"], "small")
    (folder / "tasks8_small_seed1_per_task.csv").unlink()
    with pytest.raises(FileNotFoundError, match="per-task"):
        results.require_results(folder, ["tasks8"], "small")


def test_load_summary_adds_suite_tasks_seed_kind(folder):
    s = results.load_summary(results.find_results(folder, ["tasks8", "tasks14"]))
    assert len(s) == 12
    assert s.groupby("suite")["n_tasks"].first().to_dict() == {"tasks8": 2, "tasks14": 3}
    assert set(s.loc[s["method"] == "experts (individual)", "kind"]) == {"reference"}
    assert set(s.loc[s["method"] == "ace", "kind"]) == {"method"}
    assert s.loc[(s["suite"] == "tasks8") & (s["seed"] == 1) & (s["method"] == "ace"), "test_acc"].item() == 79.0


def test_load_per_task_and_matrix(folder):
    runs = results.find_results(folder, ["tasks8", "tasks14"])
    pt = results.load_per_task(runs)
    mat = results.per_task_matrix(pt, "tasks8")
    assert list(mat.columns) == ["a", "b"] and mat.index[0] == "base (frozen heads)"
    assert mat.loc["ace", "b"] == pytest.approx((85.0 + 89.0) / 2)  # normalized + task index 1, mean of seeds
    sc = results.task_scores(pt, "tasks8")
    row = sc[(sc["method"] == "ace") & (sc["task"] == "a")].iloc[0]
    assert row["mean"] == pytest.approx(86.0) and row["sd"] == pytest.approx(np.std([84, 88], ddof=1))
    with pytest.raises(KeyError):
        results.per_task_matrix(pt, "tasks20")


def test_search_traces_long_format(folder):
    rec = results.load_records(results.find_results(folder, ["tasks8"]))
    assert set(rec) == {("tasks8", 0), ("tasks8", 1)}
    tr = results.search_traces(rec[("tasks8", 0)])
    assert set(tr["method"]) == {"task_arithmetic"}
    assert sorted(tr["alpha"].unique()) == [0.1, 0.2, 0.3]
    mean = tr[tr["task"] == "mean"].set_index("alpha")
    assert mean.loc[0.3, "accuracy"] == pytest.approx(70.0) and mean.loc[0.3, "normalized"] == pytest.approx(80.0)
    assert tr[tr["is_best"]]["alpha"].unique().tolist() == [0.2]
    assert tr[tr["task"] == "a"]["normalized"].tolist() == pytest.approx([70.0] * 3)


def test_load_regime(folder):
    r = results.find_results(folder, ["tasks8"])[0]
    norms, cos = results.load_regime(r)
    assert list(norms.index) == ["a", "b"] and cos.shape == (2, 2)
    (folder / "tasks8_small_seed0_norms.csv").unlink()
    with pytest.raises(FileNotFoundError):
        results.load_regime(results.find_results(folder, ["tasks8"])[0])


# ----------------------------------------------------------------------------- aggregation
def test_aggregate_matches_hand_values_and_benchmark_aggregate_seeds(folder):
    runs = results.find_results(folder, ["tasks8", "tasks14"])
    agg = results.aggregate(results.load_summary(runs))
    a = agg[(agg["suite"] == "tasks8") & (agg["method"] == "ace")].iloc[0]
    assert a["n_seeds"] == 2 and a["test_acc"] == 77.0 and a["test_acc_sd"] == pytest.approx(math.sqrt(8))
    assert a["merge_seconds"] == pytest.approx(0.3)
    one = agg[(agg["suite"] == "tasks14") & (agg["method"] == "ace")].iloc[0]
    assert one["n_seeds"] == 1 and math.isnan(one["test_acc_sd"])
    ref = aggregate_seeds(folder, "tasks8", "small").set_index("method")
    mine = agg[agg["suite"] == "tasks8"].set_index("method")
    for col in ("test_acc", "test_acc_sd", "test_normalized", "test_normalized_sd", "merge_seconds"):
        assert mine[col].to_numpy() == pytest.approx(ref.loc[mine.index, col].to_numpy(), nan_ok=True)


def test_table1_cells_and_wide(folder):
    agg = results.aggregate(results.load_summary(results.find_results(folder, ["tasks8", "tasks14"])))
    t = results.table1(agg, "test_acc")
    assert list(t.columns) == ["tasks8 (T=2)", "tasks14 (T=3)"]
    assert t.loc["ace", "tasks8 (T=2)"] == "77.0 ± 2.8"
    assert t.loc["ace", "tasks14 (T=3)"] == "70.0"  # one seed: no sd
    w = results.wide(agg, "test_normalized")
    assert w.loc["task_arithmetic", "tasks8"] == 81.0 and list(w.columns) == ["tasks8", "tasks14"]


def test_row_kind():
    assert results.row_kind("base (frozen heads)") == "reference"
    assert results.row_kind("multi-task (MTL)") == "reference"
    for v in ("ace (gate off)", "ace (eps 1e-5)", "ace (scaling on val)"):
        assert results.row_kind(v) == "variant"
    assert results.row_kind("ace") == "method" and results.row_kind("tsv_m") == "method"
    assert results.row_kind("nomethod (x)") == "method"  # not a registered method: no variant of one


def test_variant_rows_and_inputs_seconds(tmp_path):
    m = {"base (frozen heads)": (40.0, 50.0, 0.0), "experts (individual)": (90.0, 100.0, 0.0)}
    # a variant first seen before a method (another suite's file order): tables still put it last
    write_run(tmp_path, "tasks8", 0, {**m, "ace (gate off)": (74.0, 83.0, 0.2), "ace": (75.0, 84.0, 0.2),
                                      "esm": (80.0, 90.0, 1.0)})
    f = tmp_path / "tasks8_small_seed0_summary.csv"
    d = pd.read_csv(f)
    d["inputs_seconds"] = np.where(d["method"] == "esm", 3.0, 0.0)
    d.to_csv(f, index=False)
    summ = results.load_summary(results.find_results(tmp_path))
    assert summ.set_index("method")["kind"].to_dict() == {
        "base (frozen heads)": "reference", "experts (individual)": "reference", "ace (gate off)": "variant",
        "ace": "method", "esm": "method"}
    agg = results.aggregate(summ)
    assert agg.set_index("method").loc["esm", "inputs_seconds"] == 3.0
    assert list(results.wide(agg).index) == ["base (frozen heads)", "experts (individual)", "ace", "esm",
                                             "ace (gate off)"]
    t = results.table1(agg)
    assert list(t.index)[-1] == "variant: ace (gate off)" and t.loc["variant: ace (gate off)"].iloc[0] == "83.0"
    assert "ace" in t.index


def test_old_files_without_inputs_seconds(folder):
    agg = results.aggregate(results.load_summary(results.find_results(folder)))
    assert "inputs_seconds" not in agg.columns and "merge_seconds" in agg.columns
    assert set(agg["kind"]) == {"reference", "method"}


# ----------------------------------------------------------------------------- Kendall tau
@pytest.mark.parametrize("x, y, tau", [
    ([1, 2, 3, 4], [1, 2, 3, 4], 1.0),
    ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
    ([1, 2, 3, 4], [1, 3, 2, 4], (5 - 1) / 6),  # one of six pairs swapped
    ([1, 2, 3], [1, 1, 2], 2 / math.sqrt(2 * 3)),  # tau-b with a tie in y: C=2, D=0, ties_y=1
    ([1, 1, 2, 3], [1, 2, 2, 3], 4 / math.sqrt(5 * 5)),  # ties on both sides
])
def test_kendall_tau_hand_values_and_scipy(x, y, tau):
    from scipy.stats import kendalltau

    assert results.kendall_tau(x, y) == pytest.approx(tau)
    assert results.kendall_tau(x, y) == pytest.approx(kendalltau(x, y).statistic)


def test_kendall_tau_degenerate():
    assert math.isnan(results.kendall_tau([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError):
        results.kendall_tau([1, 2], [1, 2, 3])


def test_rank_agreement_uses_common_methods_only():
    ours = pd.Series({"a": 90.0, "b": 80.0, "c": 85.0, "only_ours": 10.0})
    paper = pd.Series({"a": 3.0, "b": 1.0, "c": 2.0, "only_paper": 99.0})
    ra = results.rank_agreement(ours, paper)
    assert ra["methods"] == ["a", "c", "b"] and ra["n"] == 3
    assert ra["tau"] == pytest.approx(1.0) and ra["discordant"] == 0 and ra["concordant"] == 3
    swapped = results.rank_agreement(pd.Series({"a": 1.0, "b": 3.0, "c": 2.0}), paper)
    assert swapped["tau"] == pytest.approx(-1.0) and swapped["ours_order"] == ["b", "c", "a"]


def test_load_wudi_step_size(tmp_path):
    assert results.load_wudi_step_size(tmp_path).empty
    cols = dict(n_tasks=8, seed=0, variant="v", method="wudi", val_normalized=1.0, test_normalized=1.0)
    pd.DataFrame([{"suite": "tasks20", **cols, "n_tasks": 20, "lr": 1e-3},
                  {"suite": "tasks20", **cols, "n_tasks": 20, "lr": 1e-5}]
                 ).to_csv(tmp_path / "wudi_step_size_tasks20_small_seed0.csv", index=False)
    pd.DataFrame([{"suite": "tasks8", **cols, "lr": 1e-4}]).to_csv(
        tmp_path / "wudi_step_size_tasks8_small_seed0.csv", index=False)
    pd.DataFrame([{"suite": "tasks8", **cols, "lr": 1e-4}]).to_csv(
        tmp_path / "wudi_step_size_tasks8_tiny_seed0.csv", index=False)
    d = results.load_wudi_step_size(tmp_path, size="small")
    assert list(zip(d["suite"], d["lr"])) == [("tasks8", 1e-4), ("tasks20", 1e-5), ("tasks20", 1e-3)]
    assert len(results.load_wudi_step_size(tmp_path)) == 4
    pd.DataFrame([{"suite": "tasks8", "lr": 1e-4}]).to_csv(
        tmp_path / "wudi_step_size_tasks8_small_seed1.csv", index=False)
    with pytest.raises(ValueError, match="seed1.csv lacks columns"):
        results.load_wudi_step_size(tmp_path)


# ----------------------------------------------------------------------------- helpers
def test_bench_command():
    cmd = results.bench_command(["tasks8", "tasks14"], "small", (0, 1))
    assert cmd.count("acetools bench") == 2 and "--seeds 0 1" in cmd and "--out figures/benchmark" in cmd


def test_prefix_world_keeps_first_tasks_only():
    class FakeZoo:
        tasks, mtl, suite = ["a", "b", "c"], True, "tiny"

    z = FakeZoo()
    sub = results.prefix_world(z, 2)
    assert sub.tasks == ["a", "b"] and sub.mtl is False and sub.suite is None
    assert z.tasks == ["a", "b", "c"] and z.mtl is True
    with pytest.raises(ValueError):
        results.prefix_world(z, 4)


def test_to_markdown_escapes():
    md = results.to_markdown(pd.DataFrame({"a": ["x|y", "z"], "b": [1.234, math.nan]}))
    lines = md.strip().splitlines()
    assert lines[0] == "| a | b |" and lines[1] == "|---|---|"
    assert lines[2] == "| x\\|y | 1.23 |" and lines[3] == "| z |  |"


def test_load_merge_speed_filters_blocks_and_errors(tmp_path):
    (tmp_path / "a_blocks1").mkdir()
    (tmp_path / "b_blocks2").mkdir()
    (tmp_path / "c_blocks1").mkdir()
    pd.DataFrame({"method": ["ace", "tsv_m", "ace", "wudi"], "n_tasks": [8, 8, 20, 8], "blocks": [1, 1, 1, 1],
                  "width": [768] * 4, "seconds": [2.0, 4.0, 5.0, np.nan], "error": [None, None, None, "oom"]}
                 ).to_csv(tmp_path / "a_blocks1" / "merge_speed.csv", index=False)
    pd.DataFrame({"method": ["ace"], "n_tasks": [8], "blocks": [2], "seconds": [99.0]}
                 ).to_csv(tmp_path / "b_blocks2" / "merge_speed.csv", index=False)
    pd.DataFrame({"method": ["tsv_m"], "n_tasks": [20], "blocks": [1], "width": [768], "seconds": [10.0]}
                 ).to_csv(tmp_path / "c_blocks1" / "merge_speed.csv", index=False)
    sp = results.load_merge_speed(tmp_path)
    got = {(r.method, r.n_tasks): r.merge_seconds for r in sp.itertuples()}
    assert got == {("ace", 8): 2.0, ("tsv_m", 8): 4.0, ("ace", 20): 5.0, ("tsv_m", 20): 10.0}
    assert set(sp["suite"]) == {"T8", "T20"}
    assert results.load_merge_speed(tmp_path, blocks=2)["merge_seconds"].tolist() == [99.0]
    assert results.load_merge_speed(tmp_path / "none").empty


def test_load_merge_speed_keeps_todays_default_rows(tmp_path):
    """A --before tree, a precision variant and ACE's equal-norm world are not today's default
    merge: a file that lists them after the default rows must not let them win."""
    (tmp_path / "r_blocks1").mkdir()
    pd.DataFrame({"method": ["ace", "ace", "ace", "ace", "tsv_m", "tsv_m"], "n_tasks": [8] * 6, "blocks": [1] * 6,
                  "width": [768] * 6, "seconds": [5.0, 3.0, 4.0, 6.0, 4.5, 6.0],
                  "world": ["lognormal", "lognormal", "equal", "lognormal", "lognormal", "lognormal"],
                  "code": ["now", "now", "now", "before", "now", "before"],
                  "variant": ["-", "precision=float32", "-", "-", "-", "-"]}
                 ).to_csv(tmp_path / "r_blocks1" / "merge_speed.csv", index=False)
    got = {r.method: r.merge_seconds for r in results.load_merge_speed(tmp_path).itertuples()}
    assert got == {"ace": 5.0, "tsv_m": 4.5}


def test_load_merge_speed_takes_each_t_from_the_last_session_that_times_tsv_m(tmp_path):
    """Ratios to TSV-M need one session: a later file without tsv_m does not replace the methods
    of the last file that has it, but still fills in methods that file lacks."""
    for name, rows in (("a", [("tsv_m", 8, 4.0), ("ace", 8, 2.0)]),
                       ("b", [("tsv_m", 8, 5.0), ("ace", 8, 3.0)]),
                       ("c", [("ace", 8, 9.0), ("wudi", 8, 7.0), ("ace", 20, 6.0)])):
        (tmp_path / name).mkdir()
        pd.DataFrame({"method": [r[0] for r in rows], "n_tasks": [r[1] for r in rows], "blocks": 1,
                      "width": 768, "seconds": [r[2] for r in rows]}).to_csv(tmp_path / name / "merge_speed.csv",
                                                                             index=False)
    sp = results.load_merge_speed(tmp_path)
    got = {(r.method, r.n_tasks): (r.merge_seconds, r.source.split("/")[0]) for r in sp.itertuples()}
    assert got == {("tsv_m", 8): (5.0, "b"), ("ace", 8): (3.0, "b"), ("wudi", 8): (7.0, "c"), ("ace", 20): (6.0, "c")}


def test_replace_rows_keeps_the_tables_order_and_appends_new_methods():
    """benchmarks/merge_rows.py's replace_rows (benchmarks/text_world.py's --add uses it too)."""
    from tests.conftest import load_script

    replace_rows = load_script("merge_rows").replace_rows

    old = [{"method": "a", "v": 1}, {"method": "b", "v": 2}, {"method": "b", "v": 3}, {"method": "c", "v": 4}]
    new = [{"method": "d", "v": 9}, {"method": "b", "v": 20}, {"method": "b", "v": 30}, {"method": "b", "v": 40}]
    rows, appended = replace_rows(old, new)
    assert [(r["method"], r["v"]) for r in rows] == [("a", 1), ("b", 20), ("b", 30), ("b", 40), ("c", 4), ("d", 9)]
    assert appended == ["d"]
    assert old[1] == {"method": "b", "v": 2}  # the inputs are left alone
    assert replace_rows(old, []) == (old, [])
