"""ACE's fast path equals its readable path, stage by stage (docs/performance.md, ACE; docs/methods.md §ACE).

``normalize_covariances(..., one_pass=True)`` makes :class:`acetools.merging.ace.TaskSums` in one pass over the
tasks, and :func:`structural_prior`, :func:`closed_form` and :func:`spectral_refine` read them where they are given
``sums=`` (what ``merge("ace")`` runs); without ``sums`` each stage computes its equation as written, which is what
the lesson calls on plain lists of tensors. Each fast path is checked here against the readable one on small
random float64 tensors, on both of the one pass's associations (tall, and wide with 2 d_out < d_in), for every
estimator and numerator; and the readable path against the equations written out in plain torch, as lesson 02
writes them, with the fast path's functions made to fail so that none of it can run there.
"""

from __future__ import annotations

import pytest
import torch

import acetools.merging.ace as A
from acetools.errors import InputError, InputTypeError
from acetools.merging import merge
from acetools.merging.averaging import summed

F64 = torch.float64
T = 4
SHAPES = {"tall": (12, 7), "wide": (3, 20)}  # wide: 2 d_out < d_in, the one pass's rows-first association


def task_vectors(shape: tuple[int, int], seed: int = 0) -> list[torch.Tensor]:
    """T float64 task vectors with different scales (so that the trace normalisation matters)."""
    g = torch.Generator().manual_seed(seed)
    return [(0.5 + t) * torch.randn(shape, generator=g, dtype=F64) for t in range(T)]


def given(shape: tuple[int, ...], seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(T):
        X = torch.randn(2 * shape[1], shape[1], generator=g, dtype=F64)
        out.append(X.T @ X / X.shape[0])
    return out


def covariances(dWs: list[torch.Tensor], estimator: str) -> tuple[list, list[torch.Tensor]]:
    """(unformed TaskCovariance for the fast path, the same covariances formed for the readable one)."""
    if estimator == "given":
        factored = A.given_covariances(given(tuple(dWs[0].shape)), "given", dWs, "layer")
        assert factored is not None
    else:
        factored = [A.estimate_covariance(d, estimator, wudi_p=1.5, factored=True) for d in dWs]
    return factored, [c.dense() for c in factored]


def close(fast: torch.Tensor, slow: torch.Tensor, rtol: float = 1e-10) -> None:
    """Equal to ``rtol`` relative to the largest entry of the readable result (float64 round-off of a solve)."""
    scale = float(slow.abs().max())
    torch.testing.assert_close(fast.double(), slow.double(), rtol=0, atol=rtol * max(scale, 1e-300))


@pytest.mark.parametrize("numerator", ["centered", "raw"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("estimator", ["ace", "wudi", "identity", "given"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_stage_reads_the_one_pass_sums_as_it_computes_its_equation(shape, estimator, normalize, numerator):
    dWs = task_vectors(SHAPES[shape])
    factored, dense = covariances(dWs, estimator)
    fast = A.normalize_covariances(factored, eps=1e-2, normalize=normalize, numerator=numerator, refine=True,
                                   one_pass=True)
    slow = A.normalize_covariances(dense, eps=1e-2, normalize=normalize)
    assert fast.sums is not None and slow.sums is None
    # (ACE.7)-(ACE.8): traces, ridges, and each Σ̃_t the one pass keeps unformed
    close(fast.traces, slow.traces, 1e-13)
    close(fast.ridge, slow.ridge, 1e-13)
    for S_fast, S_slow in zip(fast.Sigma_tilde, slow.Sigma_tilde):
        close(A.dense_covariance(S_fast), A.dense_covariance(S_slow), 1e-13)
    close(fast.sums.S, summed(A.dense_covariance(S) for S in slow.Sigma_tilde), 1e-12)  # sum_t Σ̃_t
    close(fast.mean_reg(), slow.mean_reg(), 1e-12)  # Σ̄_reg of (ACE.11)
    # (ACE.9)
    energy = float(A.task_energies(dWs).mean())
    C_fast = A.structural_prior(fast.Sigma_tilde, energy=energy, sums=fast.sums)
    C_slow = A.structural_prior(slow.Sigma_tilde, energy=energy)
    close(C_fast, C_slow, 1e-12)
    # (ACE.10), with and without the prior
    numerators = [A.center_rows(d) for d in dWs] if numerator == "centered" else dWs
    for C in (C_slow, None):
        close(A.closed_form(numerators, fast, C, sums=fast.sums), A.closed_form(numerators, slow, C), 1e-9)
    # (ACE.11)-(ACE.13): the residual from the sums and the top-k triplets
    W_pre = A.closed_form(numerators, slow, C_slow)
    r_fast = A.spectral_refine(W_pre, dWs, fast.Sigma_tilde, fast.mean_reg(), k_frac=0.5, sums=fast.sums)
    r_slow = A.spectral_refine(W_pre, dWs, slow.Sigma_tilde, slow.mean_reg(), k_frac=0.5)
    assert r_fast.W_fused is not None and r_slow.W_fused is not None
    close(r_fast.W_fused, r_slow.W_fused, 1e-11)
    assert r_fast.k == r_slow.k > 0
    close(r_fast.S_fused[: r_fast.k], r_slow.S_fused[: r_slow.k], 1e-11)
    close(r_fast.W, r_slow.W, 1e-9)


@pytest.mark.parametrize("options", [{}, {"gate": "on"}, {"gate": "off"}, {"gate": "on", "numerator": "raw"},
                                     {"gate": "on", "refine": False}, {"estimator": "wudi", "gate": "on"},
                                     {"estimator": "identity"}, {"gate": "on", "eps_mode": "relative"}])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_ace_matrix_one_pass_equals_the_readable_composition(shape, options):
    dWs = task_vectors(SHAPES[shape], seed=2)
    W_fast, d_fast = A.ace_matrix(dWs, k_frac=0.7, **options)  # k = 2 of 3 on the wide shape
    W_slow, d_slow = A.ace_matrix(dWs, k_frac=0.7, one_pass=False, **options)
    close(W_fast, W_slow, 1e-9)
    assert (d_fast.flag, d_fast.refined, d_fast.k, d_fast.prior) == (d_slow.flag, d_slow.refined, d_slow.k,
                                                                      d_slow.prior)
    close(torch.tensor(d_fast.traces), torch.tensor(d_slow.traces), 1e-13)


def test_given_covariances_one_pass_equals_the_readable_composition():
    dWs = task_vectors(SHAPES["tall"], seed=3)
    Sigma = given(SHAPES["tall"])
    close(A.ace_matrix(dWs, estimator="given", Sigma=Sigma, gate="on", prior=True)[0],
          A.ace_matrix(dWs, estimator="given", Sigma=Sigma, gate="on", prior=True, one_pass=False)[0], 1e-9)


def _by_hand(dW: list[torch.Tensor], tau: float = 0.3, eps: float = 1e-2, k_frac: float = 0.3) -> torch.Tensor:
    """ACE on one layer in plain torch, (ACE.3)-(ACE.13) as lesson 02 writes them (its ``ace_by_hand``)."""
    d_out, d_in = dW[0].shape
    e = torch.stack([(d * d).sum() for d in dW])  # (T,) energies, (ACE.5)
    ell = torch.log(e + 1e-12)
    flag = bool(ell.var() / (ell.mean() ** 2 + 1e-12) > tau)  # (ACE.6)
    W_tilde = [d - d.mean(dim=0, keepdim=True) for d in dW]  # (ACE.3)
    Sigma_hat = [Wt.T @ Wt for Wt in W_tilde]  # (ACE.4)
    tr = torch.stack([S.trace() for S in Sigma_hat]) + 1e-12
    Sigma_tilde = [S / t for S, t in zip(Sigma_hat, tr)] if flag else Sigma_hat  # (ACE.7) or (ACE.8)
    ridge = eps / tr if flag else torch.full_like(tr, eps)
    eye = torch.eye(d_in, dtype=F64)
    Sigma_reg = [S + r * eye for S, r in zip(Sigma_tilde, ridge)]
    c = torch.stack(Sigma_tilde).sum(0).mean(dim=0) / (e.mean() + 1e-12 if flag else 1.0)  # (ACE.9)
    C_agg = torch.ones(d_in, 1, dtype=F64) * c
    num, den = sum(Wt @ R for Wt, R in zip(W_tilde, Sigma_reg)), sum(Sigma_reg) + C_agg
    W_pre = torch.linalg.solve(den, num, left=False)  # (ACE.10)
    k = int(k_frac * min(d_out, d_in))
    if not flag or k == 0:
        return W_pre
    Sigma_bar_reg = sum(Sigma_reg) / len(dW)
    Delta_res = sum(d @ (S - Sigma_bar_reg) for d, S in zip(dW, Sigma_tilde))  # (ACE.11)
    U, S, Vh = torch.linalg.svd(W_pre + Delta_res, full_matrices=False)  # (ACE.12)
    return W_pre + S[:k].mean() * U[:, :k] @ Vh[:k]  # (ACE.13)


@pytest.mark.parametrize("scales", [(1.0, 1.0, 1.0, 1.0), (1.0, 30.0, 0.05, 4.0)])  # unflagged, flagged
def test_the_readable_path_is_what_the_lesson_computes(monkeypatch, scales):
    """The stage functions on plain lists (the calls of lesson 02) and ``ace_matrix(one_pass=False)`` equal the
    equations in plain torch, with the fast path's functions failing: no line of the fast path runs there."""
    def fail(*args, **kwargs):
        raise AssertionError("the readable path ran the fast path")

    monkeypatch.setattr(A, "task_sums", fail)
    monkeypatch.setattr(A, "solve_task_sums", fail)
    dW = [s * d for s, d in zip(scales, task_vectors(SHAPES["tall"], seed=4))]
    want = _by_hand(dW)
    flag = A.gate_flag(A.heterogeneity(dW), 0.3, "auto")
    assert flag == (scales[1] != 1.0)
    covs = A.normalize_covariances([A.estimate_covariance(d) for d in dW], eps=1e-2, normalize=flag)
    energy = float(A.task_energies(dW).mean()) if flag else None
    C_agg = A.structural_prior(covs.Sigma_tilde, energy=energy)
    W = A.closed_form([A.center_rows(d) for d in dW], covs, C_agg)
    if flag:
        W = A.spectral_refine(W, dW, covs.Sigma_tilde, covs.mean_reg(), k_frac=0.3).W
    close(W, want, 1e-10)
    W_matrix, diag = A.ace_matrix(dW, one_pass=False)
    assert diag.flag == flag
    close(W_matrix, want, 1e-10)
    with pytest.raises(AssertionError, match="ran the fast path"):
        A.ace_matrix(dW)  # the default is the fast path


def test_merge_runs_the_fast_path(monkeypatch):
    """``merge("ace")`` is ``ace_matrix`` with ``one_pass=True``: each matrix key makes its sums in one pass."""
    made = []
    one_pass = A.task_sums

    def counted(*args, **kwargs):
        made.append(1)
        return one_pass(*args, **kwargs)

    monkeypatch.setattr(A, "task_sums", counted)
    g = torch.Generator().manual_seed(5)
    base = {"blocks.0.mlp.weight": torch.randn(6, 5, generator=g), "blocks.0.mlp.bias": torch.randn(6, generator=g)}
    experts = [{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(3)]
    merge("ace", base, experts)
    assert len(made) == 1  # one matrix key


def test_the_fast_path_refuses_what_it_cannot_read():
    dWs = task_vectors(SHAPES["tall"])
    with pytest.raises(InputTypeError, match="one_pass=True.*unformed"):
        A.normalize_covariances([A.estimate_covariance(d) for d in dWs], one_pass=True)
    norm = A.normalize_covariances([A.estimate_covariance(d, factored=True) for d in dWs], refine=False,
                                   one_pass=True)
    assert norm.sums is not None
    W_pre = A.closed_form(dWs, norm, sums=norm.sums)
    with pytest.raises(InputError, match="refine=True"):
        A.spectral_refine(W_pre, dWs, norm.Sigma_tilde, norm.mean_reg(), sums=norm.sums)
    with pytest.raises(InputError, match="3 numerators but sums over 4 tasks"):
        A.closed_form(dWs[:3], norm, sums=norm.sums)
