"""WUDI-Merging (docs/methods.md §WUDI): loss transcription, analytic gradient vs autograd, Adam, key rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import acetools
from acetools.merging import is_matrix_param
from acetools.merging.wudi import VIT_TARGETS, wudi, wudi_grad, wudi_loss, wudi_matrix
from tests.conftest import make_world


def _taus(T, d_out, d_in, seed=0, scale=1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [(scale * torch.randn(d_out, d_in, generator=g, dtype=torch.float64)).to(dtype) for _ in range(T)]


def _loss_transcription(tau_m, taus, p):
    """sum_t ||(tau_m - tau_t) tau_t^T||_F^2 / ||tau_t||_F^p with explicit loops (numpy)."""
    m = tau_m.numpy()
    total = 0.0
    for tau in taus:
        t = tau.numpy()
        prod = (m - t) @ t.T
        sq = 0.0
        for i in range(prod.shape[0]):
            for j in range(prod.shape[1]):
                sq += prod[i, j] ** 2
        total += sq / np.linalg.norm(t) ** p
    return total


def _autograd_adam(taus, steps, lr, p, init="sum", b1=0.9, b2=0.999, eps=1e-8):
    """Reference loop: Adam as written in Kingma & Ba (Alg. 1) on the autograd gradient of the
    direct loss. (torch.optim.Adam itself is checked in the fusion_bench oracle test.)"""
    X = torch.stack(taus)
    x = (X.sum(0) if init == "sum" else X.mean(0)).clone()
    m = torch.zeros_like(x)
    v = torch.zeros_like(x)
    for t in range(1, steps + 1):
        xg = x.clone().requires_grad_(True)
        wudi_loss(xg, taus, p).backward()
        g = xg.grad
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        x = x - lr * m_hat / (v_hat.sqrt() + eps)
    return x


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_loss_matches_transcription(p):
    taus = _taus(3, 5, 4, seed=1)
    tau_m = _taus(1, 5, 4, seed=2)[0]
    want = _loss_transcription(tau_m, taus, p)
    assert abs(float(wudi_loss(tau_m, taus, p)) - want) < 1e-10 * want


@pytest.mark.parametrize("p,shape", [(2.0, (7, 4)), (1.0, (4, 7)), (0.5, (6, 6))])
def test_analytic_gradient_matches_autograd(p, shape):
    taus = _taus(3, *shape, seed=3)
    tau_m = _taus(1, *shape, seed=4)[0].requires_grad_(True)
    wudi_loss(tau_m, taus, p).backward()
    g = wudi_grad(tau_m.detach(), taus, p)
    assert torch.allclose(g, tau_m.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(9, 5), (5, 9)])  # both branches of the precomputation
def test_optimiser_matches_autograd_adam_loop(shape):
    taus = _taus(3, *shape, seed=5)
    for init in ("sum", "mean"):
        ref = _autograd_adam(taus, steps=25, lr=1e-2, p=2.0, init=init)
        got = wudi_matrix(taus, steps=25, lr=1e-2, p=2.0, init=init)
        assert torch.allclose(got, ref, rtol=1e-9, atol=1e-10), init


def test_losses_are_the_loss_and_decrease():
    taus = _taus(4, 8, 6, seed=6)
    out, losses = wudi_matrix(taus, steps=200, lr=1e-2, return_losses=True)
    assert losses.shape == (200,)
    assert torch.isclose(losses[0], wudi_loss(torch.stack(taus).sum(0), taus), rtol=1e-10)
    # the loss falls most of the way to its minimum L* (L is quadratic; minimiser solves tau S = C)
    w = [1 / t.norm() ** 2 for t in taus]
    S = sum(wt * t.T @ t for wt, t in zip(w, taus))
    C = sum(wt * t @ t.T @ t for wt, t in zip(w, taus))
    L_star = wudi_loss(torch.linalg.solve(S, C.T).T, taus)
    assert losses[-1] - L_star < 0.05 * (losses[0] - L_star)
    assert (losses[1:] <= losses[:-1] + 1e-12).float().mean() > 0.9  # (nearly) monotone
    assert wudi_loss(out, taus) < losses[-1]
    # the returned matrix is exactly what return_losses=False gives
    assert torch.equal(out, wudi_matrix(taus, steps=200, lr=1e-2))


def test_converges_to_the_least_squares_minimiser():
    # L is quadratic: its minimiser solves tau_m S = C with S = sum w_t tau_t^T tau_t
    taus = _taus(3, 6, 4, seed=7)
    w = [1 / t.norm() ** 2 for t in taus]
    S = sum(wt * t.T @ t for wt, t in zip(w, taus))
    C = sum(wt * t @ t.T @ t for wt, t in zip(w, taus))
    star = torch.linalg.solve(S, C.T).T
    out = wudi_matrix(taus, steps=4000, lr=3e-3)
    assert (out - star).norm() / star.norm() < 1e-2
    assert wudi_grad(out, taus).norm() < 1e-2 * wudi_grad(torch.stack(taus).sum(0), taus).norm()


def test_zero_task_vectors():
    z = [torch.zeros(5, 3) for _ in range(3)]
    out, losses = wudi_matrix(z, steps=10, return_losses=True)
    assert not out.any() and not losses.any() and losses.shape == (10,)
    a, b = _taus(2, 5, 3, seed=8)
    # a zero expert adds nothing to the sum and has weight 0 in the loss
    assert torch.allclose(wudi_matrix([a, b, torch.zeros_like(a)], steps=30, lr=1e-2),
                          wudi_matrix([a, b], steps=30, lr=1e-2), rtol=1e-12, atol=1e-14)


def test_deterministic_and_order_invariant():
    taus = _taus(4, 10, 6, seed=9, dtype=torch.float32)
    a = wudi_matrix(taus, steps=50, lr=1e-3)
    assert torch.equal(a, wudi_matrix(taus, steps=50, lr=1e-3))
    assert torch.allclose(wudi_matrix(taus[::-1], steps=50, lr=1e-3), a, rtol=1e-5, atol=1e-6)
    assert a.dtype == torch.float32
    assert torch.equal(wudi_matrix(taus, steps=0), torch.stack(taus).sum(0))


def test_method_keys_others_and_targets():
    base, experts = make_world(n_tasks=3, seed=10)
    tvs = acetools.task_vectors(base, experts)
    kw = dict(steps=5, lr=1e-3, p=2.0, init="sum")
    fb = wudi(base, tvs, is_matrix=is_matrix_param, others="mean", targets="matrix", **kw)
    off = wudi(base, tvs, is_matrix=is_matrix_param, others="base", targets="vit", **kw)
    for k in base:
        taus = [tv[k] for tv in tvs]
        mean = torch.stack(taus).mean(0)
        if is_matrix_param(k, base[k]):
            assert torch.equal(fb[k], wudi_matrix(taus, key=k, **{**kw, "p": 2.0})), k
        else:
            assert torch.equal(fb[k], mean), k
        if any(k.endswith(s) for s in VIT_TARGETS):
            assert torch.equal(off[k], fb[k]), k
        else:  # the official ViT script leaves every other key at W0
            assert not off[k].any(), k
    mixed = wudi(base, tvs, is_matrix=is_matrix_param, others="mean", targets="vit", **kw)
    assert torch.equal(mixed["visual.proj"], torch.stack([tv["visual.proj"] for tv in tvs]).mean(0))


def test_merge_validation_and_inputs_untouched():
    base, experts = make_world(n_tasks=2, seed=11)
    copies = [{k: v.clone() for k, v in sd.items()} for sd in [base, *experts]]
    out = acetools.merge("wudi", base, experts, steps=3)
    assert set(out) == set(base)
    for orig, sd in zip(copies, [base, *experts]):
        assert all(torch.equal(orig[k], sd[k]) for k in orig)
    with pytest.raises(ValueError, match="init"):
        acetools.merge("wudi", base, experts, init="zero")
    with pytest.raises(ValueError, match="steps"):
        acetools.merge("wudi", base, experts, steps=-1)
    with pytest.raises(TypeError, match="steps"):
        acetools.merge("wudi", base, experts, steps=2.5)
    with pytest.raises(ValueError, match="lr"):
        acetools.merge("wudi", base, experts, lr=0.0)
    with pytest.raises(ValueError, match="others"):
        acetools.merge("wudi", base, experts, others="zero")
    with pytest.raises(ValueError, match="visual.conv1.weight"):
        wudi(base, acetools.task_vectors(base, experts), is_matrix=lambda k, t: True,
             steps=1, lr=1e-5, p=2.0, init="sum", others="mean", targets="matrix")
    with pytest.raises(ValueError, match="init"):
        wudi_matrix(_taus(2, 3, 3), init="median")


def test_vit_targets_stream_key_by_key_as_in_memory(tmp_path):
    """``targets="vit"`` is checked on the whole model: a streamed merge reads one key at a time (most match
    no ViT target) and must equal the in-memory merge; a model with no target at all is refused both ways."""
    from safetensors.torch import load_file, save_file

    from acetools.errors import InputError
    from acetools.files.merge_files import merge_files

    base, experts = make_world(n_tasks=2, seed=12)
    paths = []
    for name, sd in [("base", base)] + [(f"e{i}", e) for i, e in enumerate(experts)]:
        save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / f"{name}.safetensors")
        paths.append(tmp_path / f"{name}.safetensors")
    hp = dict(steps=3, lr=1e-3, targets="vit")
    want = acetools.merge("wudi", base, experts, **hp)
    merge_files("wudi", paths[0], paths[1:], tmp_path / "out", hparams=hp, progress=False)
    got = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(got) == sorted(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    lone = {"visual.proj": base["visual.proj"]}
    lone_experts = [{"visual.proj": e["visual.proj"]} for e in experts]
    with pytest.raises(InputError, match="targets='vit'"):
        acetools.merge("wudi", lone, lone_experts, **hp)
    for name, sd in [("lb", lone), ("l0", lone_experts[0]), ("l1", lone_experts[1])]:
        save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / f"{name}.safetensors")
    with pytest.raises(InputError, match="targets='vit'"):
        merge_files("wudi", tmp_path / "lb.safetensors", [tmp_path / "l0.safetensors", tmp_path / "l1.safetensors"],
                    tmp_path / "out2", hparams=hp, progress=False)
