"""ACE and ESM are composed once (docs/methods.md §ACE, §ESM): the public stage functions are what
``acetools.merge`` and the streamed file merge (``acetools merge``) run, so patching one changes both,
and the in-memory and streamed results agree."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import acetools
import acetools.merging.ace as A
import acetools.merging.esm as E
from acetools.files.checkpoints import open_checkpoint
from acetools.files.merge_files import merge_files
from tests.conftest import make_world

F64 = torch.float64
MATRIX = "visual.transformer.resblocks.0.mlp.c_fc.weight"


@pytest.fixture
def world():
    return make_world(n_tasks=3, seed=4, dtype=F64)


def _files(tmp_path, base, experts):
    paths = []
    for name, sd in [("base", base), *((f"e{t}", e) for t, e in enumerate(experts))]:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / f"{name}.safetensors"))
        paths.append(tmp_path / f"{name}.safetensors")
    return paths[0], paths[1:]


def _streamed(tmp_path, method, base, experts, **hp):
    b, ex = _files(tmp_path, base, experts)
    out = tmp_path / f"out-{method}-{len(list(tmp_path.iterdir()))}"
    merge_files(method, b, ex, out, hparams=hp, layout="open_clip")
    return open_checkpoint(out).state_dict()


def _assert_same(a, b, atol=1e-12):
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k].double(), b[k].double(), atol=atol, rtol=0, msg=k)


def test_ace_in_memory_and_streamed_agree(tmp_path, world):
    base, experts = world
    mem = acetools.merge("ace", base, experts, layout="open_clip")
    _assert_same(mem, _streamed(tmp_path, "ace", base, experts))


@pytest.mark.parametrize("stage", ["closed_form", "spectral_refine"])
def test_patching_an_ace_stage_changes_merge_and_the_file_merge(tmp_path, world, monkeypatch, stage):
    """closed_form returning zeros (gate off: no refinement) or spectral_refine returning W_bar_pre
    plus nothing (gate on): every matrix key of the merge becomes W0 + that."""
    base, experts = world
    hp = dict(gate="off") if stage == "closed_form" else dict(gate="on")
    before = acetools.merge("ace", base, experts, layout="open_clip", **hp)
    orig = getattr(A, stage)
    calls = []

    def patched(*args, **kwargs):
        calls.append(stage)
        out = orig(*args, **kwargs)
        return torch.zeros_like(out) if stage == "closed_form" else out._replace(W=torch.zeros_like(out.W))

    monkeypatch.setattr(A, stage, patched)
    mem = acetools.merge("ace", base, experts, layout="open_clip", **hp)
    streamed = _streamed(tmp_path, "ace", base, experts, **hp)
    assert calls, f"{stage} was not called by merge()"
    torch.testing.assert_close(mem[MATRIX], base[MATRIX], atol=0, rtol=0)
    assert not torch.equal(before[MATRIX], mem[MATRIX])
    _assert_same(mem, streamed)


def test_patching_the_covariance_estimator_changes_merge_and_the_file_merge(tmp_path, world, monkeypatch):
    """estimate_covariance returning I makes ACE's default the identity estimator with ACE's switches (unformed,
    as ``factored=True`` asks: the one pass of the fast path reads it)."""
    base, experts = world
    want = acetools.merge("ace", base, experts, layout="open_clip", estimator="identity", gate="auto", prior=True,
                          numerator="centered")
    before = acetools.merge("ace", base, experts, layout="open_clip")
    monkeypatch.setattr(A, "estimate_covariance", lambda d, *a, factored=False, **k: (
        A.TaskCovariance(d, "identity") if factored else torch.eye(d.shape[1], dtype=F64, device=d.device)))
    mem = acetools.merge("ace", base, experts, layout="open_clip")
    _assert_same(mem, want, atol=1e-10)
    assert not torch.equal(before[MATRIX], mem[MATRIX])
    _assert_same(mem, _streamed(tmp_path, "ace", base, experts))


@pytest.mark.filterwarnings("ignore:esm. layer:RuntimeWarning")  # zeroed subspaces: rank-deficient P_cat
def test_patching_essential_subspace_changes_esm_in_memory_and_from_files(tmp_path, monkeypatch):
    """Step A scaled by 0 for task 0 (its P columns zeroed): the merge and the file merge change alike."""
    base, experts = make_world(n_tasks=3, seed=5, rank=64, dtype=F64)
    g = torch.Generator().manual_seed(6)
    acts = {k: [torch.randn(80, w.shape[1], generator=g, dtype=F64) for _ in experts]
            for k, w in base.items() if w.ndim == 2 and any(p in k for p in E.DEFAULT_TARGETS)}
    before = acetools.merge("esm", base, experts, activations=acts, layout="open_clip")
    orig, seen = E.essential_subspace, []

    def patched(X, delta_W, *args, **kwargs):
        sub = orig(X, delta_W, *args, **kwargs)
        seen.append(delta_W.shape)
        return sub._replace(P=torch.zeros_like(sub.P)) if len(seen) % 3 == 1 else sub

    monkeypatch.setattr(E, "essential_subspace", patched)
    mem = acetools.merge("esm", base, experts, activations=acts, layout="open_clip")
    assert seen
    key = next(iter(acts))
    assert not torch.allclose(before[key], mem[key])
    seen.clear()
    _assert_same(mem, _streamed(tmp_path, "esm", base, experts, activations=acts))


def test_center_rows_is_the_one_centring_the_pipeline_runs(tmp_path, world, monkeypatch):
    """(ACE.3) is one function, :func:`acetools.merging.ace.center_rows`: its ``out=`` form equals the new tensor,
    and patching it changes the dense covariance, the centred numerators, the one pass's sums, merge() and the
    file merge alike."""
    d = torch.randn(7, 5, generator=torch.Generator().manual_seed(3), dtype=F64)
    want = d - d.mean(dim=0, keepdim=True)
    torch.testing.assert_close(A.center_rows(d), want, rtol=0, atol=0)
    buf = torch.empty_like(d)
    assert A.center_rows(d, out=buf) is buf
    torch.testing.assert_close(buf, want, rtol=0, atol=0)
    base, experts = world
    before = acetools.merge("ace", base, experts, layout="open_clip")
    calls = []

    def uncentred(delta_W, *, out=None):  # no centring at all
        calls.append(tuple(delta_W.shape))
        return delta_W.clone() if out is None else out.copy_(delta_W)

    monkeypatch.setattr(A, "center_rows", uncentred)
    torch.testing.assert_close(A.TaskCovariance(d, "ace").dense(), d.T @ d, rtol=0, atol=0)
    torch.testing.assert_close(A.CenteredRows([d])[0], d, rtol=0, atol=0)
    mem = acetools.merge("ace", base, experts, layout="open_clip")
    assert calls, "merge() did not run center_rows"
    assert not torch.equal(before[MATRIX], mem[MATRIX])
    _assert_same(mem, _streamed(tmp_path, "ace", base, experts))
