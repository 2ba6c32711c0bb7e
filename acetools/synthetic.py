"""Linear-regression tasks with chosen input covariances (Theorem 1 of ACE-Merging).

Each task t draws inputs x ~ N(0, Sigma_t) and targets y = W_t* x + noise, with
W_t* = W0 + B_t. Fine-tuning the shared base W0 by SGD on task t gives an update
delta_W_t whose row covariance reflects Sigma_t (Theorem 1: Sigma_t ∝ Cov(delta_W_t)),
because the gradient of the squared error is 2 (W - W_t*) E[x x^T] = 2 (W - W_t*) Sigma_t.
The same tasks give the demo its ground truth: the joint least-squares solution
(sum_t W_t* Sigma_t)(sum_t Sigma_t)^-1 is the best single linear map for all tasks.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import InputError
from .utils import make_generator

__all__ = ["RegressionTask", "make_regression_tasks", "descend", "finetune_linear", "task_loss", "joint_least_squares"]


@dataclass
class RegressionTask:
    """One linear-regression task: true covariance, target map and data."""

    Sigma: Tensor  # d_in x d_in true input covariance
    W_star: Tensor  # d_out x d_in target map
    X_train: Tensor
    Y_train: Tensor
    X_val: Tensor
    Y_val: Tensor
    X_test: Tensor
    Y_test: Tensor
    noise: float


def _random_rotation(d: int, g: torch.Generator) -> Tensor:
    Q, R = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return Q * torch.sign(torch.diagonal(R))  # Haar-distributed


def make_regression_tasks(n_tasks: int = 4, d_in: int = 32, d_out: int = 16, *, n_train: int = 2000, n_val: int = 500,
                          n_test: int = 1000, subspace_dim: int = 6, floor: float = 0.02, shift: float = 1.0,
                          noise: float = 0.05, seed: int = 0) -> tuple[Tensor, list[RegressionTask]]:
    """Base weight W0 and ``n_tasks`` regression tasks with task-specific covariances.

    Sigma_t = Q_t diag(s) Q_t^T with a random rotation Q_t and a spectrum that puts most
    energy in ``subspace_dim`` directions (eigenvalues 1, 1/2, ...) above a ``floor``: each
    task "looks at" its own subspace of the input. W_t* = W0 + shift * B_t / sqrt(d_in).
    Returns float64 tensors.
    """
    if n_tasks < 1 or d_in < 1 or d_out < 1:
        raise InputError("n_tasks, d_in and d_out must be positive")
    if not 1 <= subspace_dim <= d_in:
        raise InputError(f"subspace_dim={subspace_dim} must be in [1, d_in={d_in}]")
    g = make_generator(seed)
    W0 = torch.randn(d_out, d_in, generator=g, dtype=torch.float64) / d_in**0.5
    spectrum = torch.full((d_in,), floor, dtype=torch.float64)
    spectrum[:subspace_dim] = 1.0 / torch.arange(1, subspace_dim + 1, dtype=torch.float64)
    tasks = []
    for _ in range(n_tasks):
        Q = _random_rotation(d_in, g)
        Sigma = (Q * spectrum) @ Q.T
        root = Q * spectrum.sqrt()  # Sigma = root @ root.T
        W_star = W0 + shift * torch.randn(d_out, d_in, generator=g, dtype=torch.float64) / d_in**0.5

        def draw(n: int, root: Tensor = root, W_star: Tensor = W_star) -> tuple[Tensor, Tensor]:
            X = torch.randn(n, d_in, generator=g, dtype=torch.float64) @ root.T
            Y = X @ W_star.T + noise * torch.randn(n, d_out, generator=g, dtype=torch.float64)
            return X, Y

        X_tr, Y_tr = draw(n_train)
        X_va, Y_va = draw(n_val)
        X_te, Y_te = draw(n_test)
        tasks.append(RegressionTask(Sigma, W_star, X_tr, Y_tr, X_va, Y_va, X_te, Y_te, noise))
    return W0, tasks


def descend(params: list[Tensor], grad: Callable[[list[Tensor], Tensor, Tensor], list[Tensor]], X: Tensor, Y: Tensor, *,
            steps: int = 200, lr: float = 0.05, batch_size: int = 64, optimizer: str = "sgd", seed: int = 0,
            betas: tuple[float, float] = (0.9, 0.999)) -> list[Tensor]:
    """Mini-batch SGD or Adam on copies of ``params``: ``grad(params, X_b, Y_b)`` gives one gradient per
    parameter on a batch drawn with replacement. Written out by hand (no autograd) so a reader sees every
    step; deterministic given ``seed``. Returns the fitted parameters (new tensors)."""
    if optimizer not in ("sgd", "adam"):
        raise InputError(f"optimizer={optimizer!r} must be 'sgd' or 'adam'")
    if X.shape[0] != Y.shape[0]:
        raise InputError(f"X has {X.shape[0]} rows but Y has {Y.shape[0]}")
    g = make_generator(seed)
    params = [p.detach().clone() for p in params]
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    n = X.shape[0]
    b = min(batch_size, n)
    for step in range(1, steps + 1):
        idx = torch.randint(0, n, (b,), generator=g)
        for p, G, (m, v) in zip(params, grad(params, X[idx], Y[idx]), moments):
            if optimizer == "sgd":
                p -= lr * G
            else:  # Adam (Kingma & Ba), bias-corrected
                m.mul_(betas[0]).add_(G, alpha=1 - betas[0])
                v.mul_(betas[1]).addcmul_(G, G, value=1 - betas[1])
                m_hat = m / (1 - betas[0] ** step)
                v_hat = v / (1 - betas[1] ** step)
                p -= lr * m_hat / (v_hat.sqrt() + 1e-8)
    return params


def finetune_linear(W0: Tensor, X: Tensor, Y: Tensor, *, steps: int = 200, lr: float = 0.05, batch_size: int = 64,
                    optimizer: str = "sgd", seed: int = 0, betas: tuple[float, float] = (0.9, 0.999)) -> Tensor:
    """Fine-tune ``W0`` on (X, Y) with mini-batch SGD or Adam (:func:`descend`) on the squared error.

    The loss is mean_i ||W x_i - y_i||^2, so the gradient is 2 (W X_bᵀ - Y_bᵀ) X_b / B: the
    quantity whose accumulation Theorem 1 reads as a covariance (2 (W - W*) Sigma in
    expectation). Returns the fine-tuned weight (a new tensor).
    """

    def gradient(params: list[Tensor], Xb: Tensor, Yb: Tensor) -> list[Tensor]:
        return [2.0 * (Xb @ params[0].T - Yb).T @ Xb / Xb.shape[0]]

    return descend([W0], gradient, X, Y, steps=steps, lr=lr, batch_size=batch_size, optimizer=optimizer, seed=seed,
                   betas=betas)[0]


def task_loss(W: Tensor, task: RegressionTask, split: str = "test") -> float:
    """Mean squared error (summed over outputs) of the map ``W`` on a task's split
    (``"train"``, ``"val"`` or ``"test"``)."""
    if split not in ("train", "val", "test"):
        raise InputError(f"split={split!r} must be 'train', 'val' or 'test'")
    X, Y = getattr(task, f"X_{split}"), getattr(task, f"Y_{split}")
    return float(((X @ W.to(X.dtype).T - Y) ** 2).sum(1).mean())


def joint_least_squares(tasks: list[RegressionTask]) -> Tensor:
    """argmin_W sum_t E||W x - W_t* x||^2 = (sum_t W_t* Sigma_t)(sum_t Sigma_t)^-1."""
    A = functools.reduce(operator.add, (t.Sigma for t in tasks))  # the same additions as sum()
    B = functools.reduce(operator.add, (t.W_star @ t.Sigma for t in tasks))
    return torch.linalg.solve(A.T, B.T).T
