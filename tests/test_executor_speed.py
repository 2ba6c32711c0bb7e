"""benchmarks/executor_speed.py (docs/performance.md §Executors): its ``--quick`` run times the search and the
bench case serially and on 2 Ray workers, checks the Ray results against the serial ones and saves the runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_run_times_both_cases_and_matches_serial(tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("psutil")
    pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "executor_speed.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    import pandas as pd

    runs = pd.read_csv(tmp_path / "runs.csv")
    assert sorted(zip(runs["case"], runs["config"])) == [("bench", "ray-2"), ("bench", "serial"),
                                                         ("search", "ray-2"), ("search", "serial")]
    ray_rows = runs[runs["config"] == "ray-2"]
    assert ray_rows["identical"].astype(bool).all()  # the Ray results are the serial ones
    assert (ray_rows["startup_s"] > 0).all() and (runs.loc[runs["config"] == "serial", "startup_s"] == 0).all()
    assert (runs["wall_s"] > 0).all() and (runs["cpu_s"] > 0).all() and (runs["jobs"] >= 2).all()
    assert (runs["wall_with_startup_s"] >= runs["wall_s"]).all()
    serial_wall = dict(zip(runs.loc[runs["config"] == "serial", "case"], runs.loc[runs["config"] == "serial",
                                                                               "wall_s"]))
    for _, r in ray_rows.iterrows():
        assert r["speedup"] == pytest.approx(serial_wall[r["case"]] / r["wall_s"])
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["quick"] and meta["cores"] == os.cpu_count()
    assert len(meta["load_before"]) == 3 and len(meta["load_after"]) == 3
    assert meta["versions"]["ray"] != "not installed" and "torch" in meta["versions"]
    assert "search serial" in done.stdout and "speedup" in done.stdout
