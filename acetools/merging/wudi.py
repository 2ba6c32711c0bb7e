"""WUDI-Merging (Cheng et al., ICML 2025), docs/methods.md §WUDI: per linear weight, Adam on
L(tau_m) = sum_t ||(tau_m - tau_t) tau_t^T||_F^2 / ||tau_t||_F^p (:func:`wudi_loss`, its analytic gradient
:func:`wudi_grad`) from the summed task vectors. A zero task vector contributes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from ..errors import InputError
from ..layouts import TensorMeta
from ._registry import Param, register
from .averaging import matrix_or_mean
from .svd import stack_taus

__all__ = ["VIT_TARGETS", "wudi_weights", "wudi_loss", "wudi_grad", "wudi_matrix", "is_wudi_target", "wudi"]

#: The open_clip weights the official ViT script optimises ([WUDI-code] ``vit/coef.py``).
VIT_TARGETS = ("attn.in_proj_weight", "attn.out_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

_INITS = ("sum", "mean")


def wudi_weights(taus: Sequence[Tensor] | Tensor, p: float = 2.0) -> Tensor:
    """Per-task loss weights w_t = 1 / ||tau_t||_F^p (0 for a zero task vector), shape (T,)."""
    X = stack_taus(taus)
    norms = X.flatten(1).norm(dim=1)
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    return torch.where(norms > 0, safe.pow(-float(p)), torch.zeros_like(norms))


def wudi_loss(tau_m: Tensor, taus: Sequence[Tensor] | Tensor, p: float = 2.0) -> Tensor:
    """L(tau_m) = sum_t ||(tau_m - tau_t) tau_t^T||_F^2 / ||tau_t||_F^p (docs/methods.md §WUDI, Eq. (WUDI.1)), as
    written (differentiable)."""
    X = stack_taus(taus)
    w = wudi_weights(X, p)
    prod = (tau_m.unsqueeze(0) - X) @ X.transpose(1, 2)
    return (w * prod.pow(2).sum(dim=(1, 2))).sum()


def wudi_grad(tau_m: Tensor, taus: Sequence[Tensor] | Tensor, p: float = 2.0) -> Tensor:
    """Analytic gradient of :func:`wudi_loss`: 2 sum_t (tau_m - tau_t) tau_t^T tau_t / ||tau_t||^p."""
    X = stack_taus(taus)
    w = wudi_weights(X, p)
    return 2 * torch.einsum("t,tij->ij", w, ((tau_m.unsqueeze(0) - X) @ X.transpose(1, 2)) @ X)


def _quadratic_terms(X: Tensor, p: float) -> tuple[Tensor, Tensor, Tensor]:
    """S = sum_t w_t tau_t^T tau_t, C = sum_t w_t tau_t tau_t^T tau_t, c0 = sum_t w_t ||tau_t tau_t^T||^2 (float64)."""
    X64 = X.double()
    w = wudi_weights(X64, p)
    T, d_out, d_in = X64.shape
    A = (X64 * w.sqrt().view(T, 1, 1)).reshape(T * d_out, d_in)
    S = A.T @ A
    C = torch.zeros(d_out, d_in, dtype=torch.float64, device=X.device)
    c0 = torch.zeros((), dtype=torch.float64, device=X.device)
    for t in range(T):
        if w[t] == 0:
            continue
        if d_out <= d_in:  # (tau tau^T) tau: d_out^2 d_in flops
            outer = X64[t] @ X64[t].T
            C += w[t] * (outer @ X64[t])
        else:  # tau (tau^T tau): d_out d_in^2 flops
            outer = X64[t].T @ X64[t]
            C += w[t] * (X64[t] @ outer)
        c0 += w[t] * outer.pow(2).sum()  # ||tau tau^T||_F = ||tau^T tau||_F
    return S, C, c0


def wudi_matrix(
    taus: Sequence[Tensor] | Tensor,
    *,
    steps: int = 300,
    lr: float = 1e-5,
    p: float = 2.0,
    init: str = "sum",
    key: str = "",
    return_losses: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """WUDI for one matrix: ``steps`` Adam steps (betas 0.9/0.999, eps 1e-8) on L from the sum (``init="sum"``)
    or the mean of the task vectors, with the gradient 2 (tau_m S - C) (S, C built in float64). With
    ``return_losses`` also the float64 loss before each step.
    """
    X = stack_taus(taus, key)
    if init not in _INITS:
        raise InputError(f"wudi: init={init!r} is not one of {list(_INITS)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InputError(f"wudi: steps={steps!r} must be a non-negative int")
    tau_m = X.sum(0) if init == "sum" else X.mean(0)
    losses = []
    if steps == 0 or not X.any():  # zero task vectors: every weight is 0, so are L and its gradient
        out = tau_m.clone()
        return (out, torch.zeros(steps, dtype=torch.float64, device=X.device)) if return_losses else out
    S64, C64, c0 = _quadratic_terms(X, p)
    S, C = S64.to(X.dtype), C64.to(X.dtype)
    x = tau_m.clone()
    m = torch.zeros_like(x)
    v = torch.zeros_like(x)
    with torch.no_grad():
        for step in range(1, steps + 1):
            tS = x @ S
            if return_losses:
                losses.append((x.double() * (tS.double() - 2 * C64)).sum() + c0)
            _adam_step(x, 2 * (tS - C), m, v, step, lr)
    if return_losses:
        return x, torch.stack(losses)
    return x


_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8


def _adam_step(x: Tensor, grad: Tensor, m: Tensor, v: Tensor, step: int, lr: float) -> None:
    """One in-place Adam step in ``torch.optim.Adam``'s operation order, without importing torch.optim (whose
    first step imports torch._dynamo)."""
    m.lerp_(grad, 1 - _BETA1)
    v.mul_(_BETA2).addcmul_(grad, grad, value=1 - _BETA2)
    step_size = lr / (1 - _BETA1**step)
    denom = (v.sqrt() / (1 - _BETA2**step) ** 0.5).add_(_EPS)
    x.addcdiv_(m, denom, value=-step_size)


def is_wudi_target(key: str, tensor: Tensor | TensorMeta, targets: str, is_matrix) -> bool:
    """Whether WUDI optimises ``key``: every ``is_matrix`` key (``targets="matrix"``) or only
    the official ViT block weights :data:`VIT_TARGETS` (``targets="vit"``)."""
    if targets == "vit":
        return tensor.ndim == 2 and any(key.endswith(s) for s in VIT_TARGETS)
    return bool(is_matrix(key, tensor))


def _check_vit_targets(targets: str, tensors: Mapping[str, Tensor | TensorMeta]) -> None:
    if targets == "vit" and not any(is_wudi_target(k, t, targets, None) for k, t in tensors.items()):
        raise InputError(
            f"wudi: targets='vit' selects keys ending in {list(VIT_TARGETS)} (open_clip names) and none matches, so "
            "nothing would be optimised; use targets='matrix' (every matrix of the layout)"
        )


def _prepare(view: Any, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """WUDI's ``prepare`` hook: the targets checked on the whole model before a key-by-key merge."""
    _check_vit_targets(hparams["targets"], {k: TensorMeta(view.source.shape(k), view.dtype(k)) for k in view.keys})
    return {"model_checked": True}


@register(
    "wudi",
    "WUDI: per-matrix Adam on the task-vector interference loss (Cheng et al. 2025; docs/methods.md §WUDI)",
    key_scope="key", needs_layout=True, prepare=_prepare,  # no search: its coefficient is 1
    steps=Param("Adam iterations per matrix (official 300; fusion_bench 400)", low=0, types=(int,)),
    lr=Param("Adam learning rate", low=0.0, low_open=True),
    p=Param("exponent of ||tau_t||_F in the loss weights (2: paper/RoBERTa/fusion_bench; 1: official ViT script)",
            low=0.0),
    init=Param("starting point: 'sum' of the task vectors (paper) or 'mean'", choices=_INITS),
    others=Param("non-optimised keys: 'mean' of the task vectors (fusion_bench) "
                 "or 'base' = stay at W0 (official ViT script)", choices=("mean", "base")),
    targets=Param("optimised keys: 'matrix' = every is_matrix key (fusion_bench) "
                  "or 'vit' = attn.in_proj/out_proj, mlp.c_fc/c_proj only (official ViT script)",
                  choices=("matrix", "vit")),
)
def wudi(base, task_vectors, *, is_matrix, steps=300, lr=1e-5, p=2.0, init="sum", others="mean", targets="matrix",
         model_checked=False):
    """WUDI-Merging (docs/methods.md §WUDI): :func:`wudi_matrix` on every target key, the others averaged or at W0;
    the official ViT script is ``p=1, targets="vit", others="base"``. ``model_checked``: the streamed merge's
    ``prepare`` hook has checked the targets on the whole model (one key alone may match none)."""
    if not model_checked:
        _check_vit_targets(targets, base)
    return matrix_or_mean("wudi", base, task_vectors, lambda k, w: is_wudi_target(k, w, targets, is_matrix),
                          lambda taus, k: cast(Tensor, wudi_matrix(taus, steps=steps, lr=lr, p=p, init=init, key=k)),
                          "WUDI", rest=None if others == "mean" else lambda k: torch.zeros_like(base[k]))
