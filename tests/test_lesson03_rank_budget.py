"""Lesson 03 checks ESM's rank budget (ESM.3) on a layer where it binds: below the rank of every task's activation
shift, so that the budget decides what each task keeps. The quick world (CI's) must have such a layer, and the
lesson stops with an error where no layer of its block has one, instead of falling back to a layer where the
budget keeps everything (issue 41)."""

from __future__ import annotations

import os

import pytest
import torch

from acetools.merging import esm as E
from tests.lesson_cells import Lesson

STEM = "03_esm_step_by_step"
#: The code cells up to the choice of the lesson's layer (parameters, imports, the world, the layer).
UNTIL_LAYER = 4


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    old = os.environ.get("ACETOOLS_NUM_THREADS")
    os.environ.setdefault("ACETOOLS_NUM_THREADS", "1")
    lesson = Lesson(STEM, UNTIL_LAYER - 1, {"quick": True, "interactive": False, "figures_dir": str(root / STEM)})
    ns = lesson.prepare()
    yield lesson, ns
    if old is None:
        os.environ.pop("ACETOOLS_NUM_THREADS", None)


def _choose_layer(lesson: Lesson, ns: dict) -> dict:
    ns = dict(ns)
    lesson._run(lesson.rest[:1], ns)
    return ns


@pytest.mark.slow
def test_the_quick_world_binds_the_rank_budget(prepared):
    lesson, ns = prepared
    assert "budget_binds" in lesson.rest[0][1]  # the cell that chooses the layer
    out = _choose_layer(lesson, ns)
    assert out["budget_binds"](out["key"]), out["key"]
    k = E.rank_budget(out["base"][out["key"]].shape[0], out["T"])
    assert k < min(int(E.shift_rank(torch.linalg.svdvals(X @ tv[out["key"]].T)))
                   for X, tv in zip(out["acts"][out["key"]], out["taus"]))


@pytest.mark.slow
def test_the_lesson_stops_where_the_budget_binds_nowhere(prepared, monkeypatch):
    lesson, ns = prepared
    monkeypatch.setattr(E, "rank_budget", lambda d_out, n_tasks: 10**6)  # a budget that keeps every direction
    with pytest.raises(ValueError, match="rank budget binds on no ESD layer"):
        _choose_layer(lesson, ns)
