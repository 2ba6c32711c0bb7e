"""Synthetic regression tasks (Theorem 1 ground truth), the demo and the CLI."""

from __future__ import annotations

import pytest
import torch

from acetools.cli import main
from acetools.demo import run_demo
from acetools.synthetic import finetune_linear, joint_least_squares, make_regression_tasks, task_loss


def test_tasks_have_requested_covariance_and_are_deterministic():
    W0, tasks = make_regression_tasks(3, 10, 5, n_train=20000, subspace_dim=3, seed=1)
    W0b, tasks_b = make_regression_tasks(3, 10, 5, n_train=20000, subspace_dim=3, seed=1)
    assert torch.equal(W0, W0b) and torch.equal(tasks[2].X_train, tasks_b[2].X_train)
    for t in tasks:
        emp = t.X_train.T @ t.X_train / t.X_train.shape[0]
        assert torch.allclose(emp, t.Sigma, atol=0.05)
        eig = torch.linalg.eigvalsh(t.Sigma).flip(0)
        assert torch.allclose(eig[:3], torch.tensor([1.0, 0.5, 1 / 3], dtype=eig.dtype), atol=1e-9)


def test_joint_least_squares_is_the_minimiser():
    _, tasks = make_regression_tasks(3, 8, 4, seed=2)
    W = joint_least_squares(tasks)
    grad = sum((W - t.W_star) @ t.Sigma for t in tasks)  # d/dW of sum_t tr((W-W*)Sigma(W-W*)^T) / 2
    assert grad.abs().max() < 1e-10


def test_finetune_reduces_loss_and_is_deterministic():
    W0, tasks = make_regression_tasks(1, 12, 6, seed=3)
    t = tasks[0]
    W = finetune_linear(W0, t.X_train, t.Y_train, steps=200, lr=0.05, seed=0)
    assert task_loss(W, t) < 0.5 * task_loss(W0, t)
    assert torch.equal(W, finetune_linear(W0, t.X_train, t.Y_train, steps=200, lr=0.05, seed=0))
    W_adam = finetune_linear(W0, t.X_train, t.Y_train, steps=200, lr=0.01, optimizer="adam", seed=0)
    assert task_loss(W_adam, t) < task_loss(W0, t)


def test_demo_scores_methods_against_ground_truth():
    df = run_demo(n_tasks=3, d_in=16, d_out=8, methods=["weight_averaging", "task_arithmetic"], steps=150)
    assert list(df.columns[:4]) == ["method", "coefficient", "mean_gain", "worst_task_gain"]
    assert df.set_index("method").coefficient["task_arithmetic"].startswith("lam=")
    assert set(df.method) == {"weight_averaging", "task_arithmetic", "joint least squares (true Sigma_t)"}
    best = df.set_index("method").mean_gain
    # the true-covariance solution is the best linear merge; no data-free method should beat it
    assert best["joint least squares (true Sigma_t)"] >= best.max() - 1e-9
    assert best["weight_averaging"] > 0


def test_cli_demo_prints_a_table(capsys):
    assert main(["demo", "--tasks", "3", "--methods", "task_arithmetic"]) == 0
    out = capsys.readouterr().out
    assert "task_arithmetic" in out and "joint least squares" in out


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_hand_written_optimizers_match_torch_optim(optimizer):
    W0, tasks = make_regression_tasks(1, 6, 3, n_train=50, seed=4)
    t = tasks[0]
    ours = finetune_linear(W0, t.X_train, t.Y_train, steps=25, lr=0.01, batch_size=8, optimizer=optimizer, seed=7)
    g = torch.Generator().manual_seed(7)
    W = W0.clone().requires_grad_(True)
    opt = torch.optim.SGD([W], lr=0.01) if optimizer == "sgd" else torch.optim.Adam([W], lr=0.01)
    for _ in range(25):
        idx = torch.randint(0, 50, (8,), generator=g)
        loss = ((t.X_train[idx] @ W.T - t.Y_train[idx]) ** 2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.allclose(ours, W.detach(), rtol=1e-10, atol=1e-12)
