"""ESM's fast paths equal its readable ones (docs/performance.md, ESM; docs/methods.md §ESM).

Step A with a rank budget, ``essential_subspace(X, ΔW, k=k)``, takes the cheapest exact route,
:func:`acetools.merging.linalg.top_shift_factors` (the QR-reduced shift, only the top k, n_t without P), and falls
back to the full decomposition where that route does not apply; Step B5's :func:`acetools.merging.esm.whiten` takes
the float64 Gram of a float32 matrix (its ``gram`` flag) and, with ``times``, never forms a tall matrix's polar
factor. Each is checked here against the full decomposition of Eqs. (ESM.1)-(ESM.2) and the SVD's polar factor of
Eq. (ESM.8) on small random tensors; the SVD-based methods' Gram routes are checked in tests/test_linalg_routes.py.
"""

from __future__ import annotations

import pytest
import torch

import acetools.merging.esm as E
from acetools.merging import linalg

F64 = torch.float64


def rand(*shape: int, seed: int, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype)


@pytest.mark.parametrize("decomposition,N,d_out,d_in", [("esd", 40, 12, 8), ("esd", 40, 6, 10), ("esd", 7, 6, 10),
                                                       ("svd", 0, 12, 8), ("svd", 0, 6, 10)])
def test_top_shift_factors_equal_the_full_essential_subspace(decomposition, N, d_out, d_in):
    """(ESM.1)-(ESM.2) truncated to k: the same span (P_k P_kᵀ), the same lam, and n_t = ||Pᵀ ΔW||_F of the full
    (completed) basis, to float64 round-off."""
    dW = rand(d_out, d_in, seed=1)
    X = rand(N, d_in, seed=2) if decomposition == "esd" else None
    k = 3
    assert linalg.top_shift_factors(X, dW, k, decomposition) is not None, "the fast route applies here"
    top = E.essential_subspace(X, dW, decomposition, k=k)
    full = E.essential_subspace(X, dW, decomposition)
    assert isinstance(top, E.TopSubspace) and isinstance(full, E.Subspace) and top.P.shape[1] == k
    Pk = full.P[:, :k]
    torch.testing.assert_close(top.P @ top.P.T, Pk @ Pk.T, rtol=0, atol=1e-12)
    torch.testing.assert_close(top.lam, full.lam[:k], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(top.norm, torch.linalg.norm(E.task_coordinates(full.P, dW)), rtol=1e-12, atol=0)


def test_where_the_fast_route_does_not_apply_step_a_is_the_full_decomposition():
    """X with fewer rows than d_in and d_out: ``top_shift_factors`` declines and the top k of the full
    decomposition are returned, exactly."""
    dW, X = rand(12, 8, seed=3), rand(5, 8, seed=4)
    assert linalg.top_shift_factors(X, dW, 3) is None
    top, full = E.essential_subspace(X, dW, k=3), E.essential_subspace(X, dW)
    torch.testing.assert_close(top.P, full.P[:, :3], rtol=0, atol=0)
    torch.testing.assert_close(top.lam, full.lam[:3], rtol=0, atol=0)


def _whiten_by_svd(M: torch.Tensor) -> torch.Tensor:
    """(ESM.8) as written: mean(S) U Vᵀ of the float64 SVD."""
    U, S, Vh = torch.linalg.svd(M.double(), full_matrices=False)
    return S.mean() * U @ Vh


@pytest.mark.parametrize("shape", [(20, 6), (6, 20), (9, 9)])
def test_whiten_gram_route_equals_the_svd_polar(shape):
    """A float32 matrix takes the float64 Gram route; float64 the SVD: both equal the SVD's polar factor (the
    float32 input is exact in float64, so the Gram route's error is float64 round-off times its condition)."""
    M32 = rand(*shape, seed=5, dtype=torch.float32)
    want = _whiten_by_svd(M32)
    torch.testing.assert_close(E.whiten(M32, dtype=F64), want, rtol=0, atol=1e-12 * float(want.abs().max()))
    torch.testing.assert_close(E.whiten(M32.double()), want, rtol=0, atol=1e-12 * float(want.abs().max()))


def test_whiten_times_equals_whiten_then_the_product():
    """``whiten(M, times=B)`` for a tall M never forms its square polar factor: equal to whiten(M) @ B."""
    M32, B = rand(30, 5, seed=6, dtype=torch.float32), rand(5, 4, seed=7)
    want = _whiten_by_svd(M32) @ B
    torch.testing.assert_close(E.whiten(M32, times=B, dtype=F64), want, rtol=0, atol=1e-12 * float(want.abs().max()))
