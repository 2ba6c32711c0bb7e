"""Mutation tests of the lessons: every stage of ACE and ESM, broken on purpose, makes lesson 02 or 03 fail a check.

Each :class:`Mutation` monkeypatches one library function (never a file) in a meaningful way: a step
skipped, a branch dropped, a constant wrong. The test first proves the mutation is live (``acetools.merge`` on
the lesson's quick world changes), then runs the lesson's cells before its appendix in this process
(tests/lesson_cells.py: a papermill kernel would not see the patch) and requires one of its checks to fail with
an ``AssertionError``. A lesson that stops checking a stage, or checks it only where the stage does not run
(ACE's unflagged layers; ESM's rank budget where it does not bind), fails here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from acetools.merging import ace as A
from acetools.merging import esm as E
from acetools.merging import merge
from acetools.merging.ace import NormalizedCovariances
from tests.lesson_cells import Lesson, patch_everywhere

pytestmark = pytest.mark.slow

QUICK = {"quick": True, "interactive": False}


@dataclass(frozen=True)
class Mutation:
    """``name``: what is broken; ``lesson``: the notebook that must catch it; ``apply(monkeypatch)`` breaks it."""

    name: str
    lesson: str
    apply: Callable[[pytest.MonkeyPatch], None]


def _wrap(module: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]
          ) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda mp: patch_everywhere(mp, module, name, make)


def _drop_prior_when_unflagged(f):
    def closed_form(numerators, Sigma_reg, C_agg=None, **kw):
        unflagged = isinstance(Sigma_reg, NormalizedCovariances) and not Sigma_reg.normalized
        return f(numerators, Sigma_reg, None if unflagged else C_agg, **kw)
    return closed_form


def _ridge_100x_when_unflagged(f):
    def normalize_covariances(Sigma_hat, *, eps=1e-2, normalize=False, **kw):
        return f(Sigma_hat, eps=eps if normalize else 100 * eps, normalize=normalize, **kw)
    return normalize_covariances


def _never_normalize(f):
    def normalize_covariances(Sigma_hat, *, eps=1e-2, normalize=False, **kw):
        return f(Sigma_hat, eps=eps, normalize=False, **kw)
    return normalize_covariances


def _no_refinement(f):
    def spectral_refine(W_pre, *args, **kw):
        return f(W_pre, *args, **kw)._replace(W=W_pre.double())
    return spectral_refine


def _centre(dim: int | None):
    def make(f):
        def center_rows(delta_W, *, out=None):
            res = delta_W if dim is None else delta_W - delta_W.mean(dim=dim, keepdim=True)
            return res.clone() if out is None else out.copy_(res)
        return center_rows
    return make


ACE_MUTATIONS = [
    Mutation("unflagged layers: no structural prior C_agg", "02_ace_step_by_step",
             _wrap(A, "closed_form", _drop_prior_when_unflagged)),
    Mutation("unflagged layers: 100x the ridge eps", "02_ace_step_by_step",
             _wrap(A, "normalize_covariances", _ridge_100x_when_unflagged)),
    Mutation("flagged layers: no trace normalisation (ACE.7)", "02_ace_step_by_step",
             _wrap(A, "normalize_covariances", _never_normalize)),
    Mutation("flagged layers: no spectral refinement", "02_ace_step_by_step",
             _wrap(A, "spectral_refine", _no_refinement)),
    Mutation("refinement: twice sigma_iso", "02_ace_step_by_step",
             _wrap(A, "isotropic_update", lambda f: lambda W_pre, UV, s: f(W_pre, UV, 2 * s))),
    Mutation("refinement: rank k + 1", "02_ace_step_by_step",
             _wrap(A, "refined_rank", lambda f: lambda *a, **kw: f(*a, **kw) + 1)),
    Mutation("no row centring (ACE.3)", "02_ace_step_by_step", _wrap(A, "center_rows", _centre(None))),
    Mutation("centring the columns instead of the rows", "02_ace_step_by_step",
             _wrap(A, "center_rows", _centre(1))),
    Mutation("flagged prior not divided by the mean energy", "02_ace_step_by_step",
             _wrap(A, "structural_prior", lambda f: lambda S, *, energy=None, **kw: f(S, **kw))),
    Mutation("gate inverted", "02_ace_step_by_step",
             _wrap(A, "gate_flag", lambda f: lambda g, tau, gate: not f(g, tau, gate))),
    Mutation("gamma of the energies, not of their logs (ACE.5)", "02_ace_step_by_step",
             _wrap(A, "heterogeneity", lambda f: lambda dW, mode="paper": f(dW, "cv"))),
    Mutation("non-matrix keys: the sum instead of the mean", "02_ace_step_by_step",
             _wrap(A, "mean_update", lambda f: lambda tvs, key: f(tvs, key) * len(tvs))),
]


def _no_whitening(f):
    def whiten(M, *, name="", times=None, dtype=None):
        out = M if times is None else M.double() @ times.double()
        return out.to(dtype or M.dtype)
    return whiten


ESM_MUTATIONS = [
    Mutation("no whitening (ESM.8)", "03_esm_step_by_step", _wrap(E, "whiten", _no_whitening)),
    Mutation("rank budget doubled (ESM.3)", "03_esm_step_by_step",
             _wrap(E, "rank_budget", lambda f: lambda d_out, n_tasks: 2 * f(d_out, n_tasks))),
    Mutation("rank budget one less (ESM.3)", "03_esm_step_by_step",
             _wrap(E, "rank_budget", lambda f: lambda d_out, n_tasks: max(1, f(d_out, n_tasks) - 1))),
    Mutation("no task-level polarized scaling (ESM.4)", "03_esm_step_by_step",
             _wrap(E, "polarize_tasks", lambda f: lambda A_, power=2.0, norms=None: list(A_))),
    Mutation("no dimension-level polarized scaling (ESM.7)", "03_esm_step_by_step",
             _wrap(E, "polarize_dimensions", lambda f: lambda A_cat, power=2.0: A_cat.clone())),
    Mutation("no layer-level polarized scaling (ESM.10)", "03_esm_step_by_step",
             _wrap(E, "layer_scales", lambda f: lambda updates, keys=None, *a, **kw: dict.fromkeys(
                 f(updates, keys, *a, **kw), 1.0))),
    Mutation("polarized scaling with power 1 instead of 2", "03_esm_step_by_step",
             _wrap(E, "polar_scales", lambda f: lambda norms, power=2.0: f(norms, power / 2))),
    Mutation("no eigenvalue weights (ESM.5)", "03_esm_step_by_step",
             _wrap(E, "eigen_weights", lambda f: lambda lam, power=0.15: torch.ones_like(lam))),
    Mutation("the SVD basis of dW instead of the activation shift's (ESM.1)", "03_esm_step_by_step",
             _wrap(E, "essential_subspace", lambda f: lambda X, dW, decomposition="esd", **kw: f(X, dW, "svd", **kw))),
]

MUTATIONS = ACE_MUTATIONS + ESM_MUTATIONS


def _ace(ns: dict[str, Any]) -> dict[str, torch.Tensor]:
    return merge("ace", ns["bench"].base, ns["bench"].experts, **ns["ace_hp"], **ns["layout"])


def _esm(ns: dict[str, Any]) -> dict[str, torch.Tensor]:
    return merge("esm", ns["base"], ns["bench"].experts, activations=ns["acts"], **ns["merge_kw"])


#: Per lesson: its setup cells (parameters, imports, the world) and the merge the mutations must change.
LESSONS: dict[str, tuple[int, Callable[[dict[str, Any]], dict[str, torch.Tensor]]]] = {
    "02_ace_step_by_step": (2, _ace),
    "03_esm_step_by_step": (3, _esm),
}


@pytest.fixture(scope="module")
def lessons(tmp_path_factory):
    """Each lesson prepared once on the quick world (built in a fresh cache, as in CI), with its unpatched merge."""
    root = tmp_path_factory.mktemp("mutations")
    old = {k: os.environ.get(k) for k in ("ACETOOLS_CACHE", "ACETOOLS_NUM_THREADS")}
    os.environ["ACETOOLS_CACHE"] = str(root / "cache")
    os.environ.setdefault("ACETOOLS_NUM_THREADS", "1")
    out = {}
    for stem, (setup, merged) in LESSONS.items():
        lesson = Lesson(stem, setup, {**QUICK, "figures_dir": str(root / "figures" / stem)})
        out[stem] = (lesson, merged(lesson.prepare()))
    yield out
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.parametrize("stem", list(LESSONS))
def test_the_unpatched_lesson_passes_its_checks(lessons, stem):
    lesson, _ = lessons[stem]
    assert lesson.first_failed_check() is None


def test_the_mutations_cover_every_stage_of_both_lessons():
    """Each lesson has mutations, ACE's include its unflagged branch, and no two mutations share a name."""
    assert {m.lesson for m in MUTATIONS} == set(LESSONS)
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)
    assert sum("unflagged" in m.name for m in ACE_MUTATIONS) >= 2


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_a_lesson_check_catches_the_mutation(lessons, mutation, monkeypatch):
    lesson, before = lessons[mutation.lesson]
    ns = lesson.prepare()
    mutation.apply(monkeypatch)
    after = LESSONS[mutation.lesson][1](ns)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, f"{mutation.name!r} leaves acetools.merge unchanged on the quick world: not a live mutation"
    failure = lesson.first_failed_check()
    print(f"{mutation.name}: {failure}")
    assert failure is not None, (f"{mutation.name!r} changes {len(changed)} keys of the merge, yet lesson "
                                 f"{mutation.lesson} passes every check")
