"""ESM: Model Merging in the Essential Subspace (Li, Qi, Tian, Geng; CVPR 2026), docs/methods.md §ESM.

ESM is exposed stage by stage so that a notebook can stop after any of them and look:

============================  ===============================================================
stage                         function
============================  ===============================================================
Step A  ESD per task          :func:`essential_subspace` -> ``Subspace(P, lam)``,
                              :func:`task_coordinates` (A_t = P_t^T tau_t)
Step B1 inter-task PS         :func:`polarize_tasks` (uses :func:`polar_scales`)
Step B  rank budget           :func:`rank_budget` (k = int(d_out * (1/T)))
Step B2 eigenvalue weighting  :func:`eigen_weights`, :func:`truncate_factors`
Step B3 concatenation         :func:`concatenate_factors`
Step B4 inter-dimension PS    :func:`polarize_dimensions`
Step B5 whitening             :func:`whiten`
Step B6 the constant 2        ``const`` in :func:`esm_merge_matrix` (B1-B6 for one matrix)
Step C  inter-layer PS        :func:`layer_scales`, :func:`polarize_layers`
Step D  alpha                 ``alpha``/``alpha_scope`` of the registered method ``"esm"``
============================  ===============================================================

The full method, :func:`esm`, is registered as ``"esm"`` and is their composition. It needs
the proxy input activations X_t of every target layer, captured inside task t's *fine-tuned*
model (docs/methods.md §ESM, Eqs. (ESM.1)-(ESM.2); :func:`acetools.files.activations.capture_inputs` does the capture).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..errors import InputError, InputKeyError, InputTypeError
from ..utils import progress
from ._linalg import gram_polar, gram_polar_times, gram_top_svd, polar_rank, thin_svd
from ._registry import ESM_BRACKET, Param, Search, register
from .averaging import mean_update
from .svd import tsv_merge_matrix

__all__ = [
    "task_budget",
    "LAYOUT_NAMES",
    "with_layout_names",
    "DEFAULT_TARGETS",
    "CLIP_LAYER_TYPES",
    "Subspace",
    "essential_subspace",
    "task_coordinates",
    "rank_budget",
    "polar_scales",
    "polarize_tasks",
    "eigen_weights",
    "truncate_factors",
    "concatenate_factors",
    "polarize_dimensions",
    "whiten",
    "esm_merge_matrix",
    "layer_scales",
    "polarize_layers",
    "esm",
]

#: open_clip parameter names of the ESD layers (docs/methods.md §ESM, Eqs. (ESM.1)-(ESM.2), "Target layers").
DEFAULT_TARGETS: tuple[str, ...] = ("attn.in_proj_weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
#: The four CLIP block types compared by the inter-layer polarization (docs/methods.md §ESM, Eq. (ESM.10)).
CLIP_LAYER_TYPES: tuple[str, ...] = (
    "attn.in_proj_weight",
    "attn.out_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
)

_DECOMPOSITIONS = ("esd", "svd")


def _each(*names: str) -> tuple[str, ...]:
    return tuple(n + "$" for n in names)


#: Per layout preset: ESM's ESD targets (the attention input projections and both MLP
#: matrices, as ``attn.in_proj_weight``, ``mlp.c_fc``, ``mlp.c_proj`` in open_clip) and the
#: Step-C layer types (every block matrix kind), as regular expressions searched in the key.
LAYOUT_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "open_clip": {
        "targets": ("attn.in_proj_weight", "mlp.c_fc.weight", "mlp.c_proj.weight"),
        "layer_types": ("attn.in_proj_weight", "attn.out_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"),
    },
    "hf_clip": {
        "targets": _each(r"self_attn\.[qkv]_proj\.weight", r"mlp\.fc1\.weight", r"mlp\.fc2\.weight"),
        "layer_types": _each(r"self_attn\.q_proj\.weight", r"self_attn\.k_proj\.weight", r"self_attn\.v_proj\.weight",
                             r"self_attn\.out_proj\.weight", r"mlp\.fc1\.weight", r"mlp\.fc2\.weight"),
    },
    "gpt2": {
        "targets": _each(r"attn\.c_attn\.weight", r"mlp\.c_fc\.weight", r"mlp\.c_proj\.weight"),
        "layer_types": _each(r"attn\.c_attn\.weight", r"attn\.c_proj\.weight", r"mlp\.c_fc\.weight",
                             r"mlp\.c_proj\.weight"),
    },
    "bert": {
        "targets": _each(r"attention\.self\.(query|key|value)\.weight", r"intermediate\.dense\.weight",
                         r"layer\.\d+\.output\.dense\.weight"),
        "layer_types": _each(r"attention\.self\.query\.weight", r"attention\.self\.key\.weight",
                             r"attention\.self\.value\.weight", r"attention\.output\.dense\.weight",
                             r"intermediate\.dense\.weight", r"layer\.\d+\.output\.dense\.weight"),
    },
    "llama": {
        "targets": _each(r"self_attn\.[qkv]_proj\.weight", r"mlp\.(gate|up)_proj\.weight", r"mlp\.down_proj\.weight"),
        "layer_types": _each(*(rf"self_attn\.{p}_proj\.weight" for p in "qkvo"),
                             *(rf"mlp\.{p}_proj\.weight" for p in ("gate", "up", "down"))),
    },
}


def with_layout_names(hparams: Mapping[str, Any], layout_name: str | None) -> dict[str, Any]:
    """``hparams`` with ``targets`` / ``layer_types`` from :data:`LAYOUT_NAMES` for the layout preset
    ``layout_name`` where the caller gave none (the open_clip names are the registered defaults;
    a layout without names, e.g. ``generic``, keeps them, so ESM says which names are missing)."""
    out = dict(hparams)
    names = LAYOUT_NAMES.get(layout_name or "")
    if names is not None:
        for k in ("targets", "layer_types"):
            out.setdefault(k, names[k])
    return out

_GRAM_WHITEN = True  # float32 whitening through the float64 Gram (see :func:`whiten`; off: the float32 SVD)
#: Largest sigma_1 / sigma_min for which :func:`whiten` takes the float64 Gram route. The Gram's
#: error grows like eps64 kappa², the float32 SVD's like eps32 kappa (or better); measured on ESM's
#: P_cat and A_cat (kappa 4e3 to 4e6) the Gram route was 24-60000x more accurate than the float32
#: SVD against a float64 SVD (docs/performance.md, ESM section), so the limit sits where eps64 kappa² ≈ 1e-4.
WHITEN_GRAM_MAX_RATIO = 1e6
#: A singular value of the activation shift dO = X ΔWᵀ at or below ``SHIFT_RANK_RTOL · sigma_1``
#: counts as zero (Step A's rank): float32 rounding of the shift leaves about 6e-8 · sqrt(d_in)
#: (3e-6 at d_in = 3072) in place of an exact zero, e.g. along the mean direction a LayerNorm output
#: lacks, so a lower limit would make the rank, and with it the merge, depend on the dtype.
SHIFT_RANK_RTOL = 1e-5


class Subspace(NamedTuple):
    """The output of Step A for one task and layer.

    ``P`` is d_out x d_out, its columns the principal directions sorted by ``lam``
    (descending); ``lam`` holds the d_out eigenvalues (zeros for padded columns).
    """

    P: Tensor
    lam: Tensor


# --------------------------------------------------------------------------- Step A
def _as_rows(X: Tensor, d_in: int, where: str = "X") -> Tensor:
    """Flatten all leading dims of ``X`` into rows and check its width is ``d_in``."""
    if not isinstance(X, Tensor):
        raise InputTypeError(f"{where} must be a torch.Tensor of input activations (N x d_in), got {type(X).__name__}")
    if X.ndim < 2:
        raise InputError(
            f"{where} has shape {tuple(X.shape)}; input activations must be N x d_in "
            "(tokens flattened into rows; leading dims are flattened for you)"
        )
    if X.shape[-1] != d_in:
        raise InputError(
            f"{where} has d_in={X.shape[-1]} (shape {tuple(X.shape)}) but the weight expects d_in={d_in}; "
            "capture the *input* of the layer (for attn.in_proj_weight the query input, i.e. the ln_1 output); "
            "weights stored in x out (GPT-2 Conv1D) must be given as d_out x d_in (acetools.layouts)"
        )
    X = X.reshape(-1, d_in)
    if X.shape[0] < 1:
        raise InputError(f"{where} has N=0 rows; ESD needs at least one proxy token (the paper uses 32 images)")
    if not X.is_floating_point():
        raise InputTypeError(f"{where} has dtype {X.dtype}; input activations must be floating point")
    return X


def essential_subspace(X: Tensor | None, delta_W: Tensor, decomposition: str = "esd") -> Subspace:
    """Essential Subspace Decomposition of one task's update, docs/methods.md §ESM, Eqs. (ESM.1)-(ESM.2).

    ``decomposition="esd"`` (default): uncentred PCA of the activation shift
    dO = X delta_W^T (N x d_out) via the thin SVD dO = U S V^T; ``P = V``, ``lam = S^2/(N-1)``
    (with N = 1 the divisor is 1; the scale of ``lam`` never matters to ESM, only ratios).
    If N < d_out, ``P`` is completed with the identity columns e_{m+1}..e_{d_out} and ``lam``
    with zeros, as in the official code (the completion is not orthogonal to the first
    columns; only the top k are used).

    ``decomposition="svd"``: the ablation's SVD basis: ``P`` = left singular vectors of
    delta_W and ``lam`` = its squared singular values (``X`` is ignored and may be None),
    completed the same way when d_in < d_out.

    ``X`` is N x d_in (any leading dims are flattened into rows); ``delta_W`` is d_out x d_in.
    Both are left untouched. Past rank(X delta_W^T) the directions are an arbitrary null-space
    basis (docs/methods.md §ESM, Step A).
    """
    if decomposition not in _DECOMPOSITIONS:
        raise InputError(f"decomposition={decomposition!r} is not one of {list(_DECOMPOSITIONS)}")
    if not isinstance(delta_W, Tensor) or delta_W.ndim != 2:
        raise InputError("delta_W must be a 2-D tensor (d_out x d_in)")
    d_out, d_in = delta_W.shape
    if decomposition == "esd":
        if X is None:
            raise InputTypeError("essential_subspace(decomposition='esd') needs the input activations X (N x d_in)")
        X = _as_rows(X, d_in).to(delta_W.device, delta_W.dtype)
        n = X.shape[0]
        dO = X @ delta_W.T
        _, S, Vh = thin_svd(dO)
        P = Vh.T
        lam = S.square() / max(n - 1, 1)
    else:
        U, S, _ = thin_svd(delta_W)
        P = U
        lam = S.square()
    m = P.shape[1]
    if m < d_out:
        full = torch.eye(d_out, dtype=P.dtype, device=P.device)
        full[:, :m] = P
        P = full
        lam = torch.cat([lam, lam.new_zeros(d_out - m)])
    return Subspace(P, lam)


def task_coordinates(P: Tensor, delta_W: Tensor) -> Tensor:
    """Coordinates A_t = P_t^T delta_W_t (d_out x d_in) of the update in the basis P_t, docs/methods.md §ESM,
    Eqs. (ESM.1)-(ESM.2)."""
    return P.T @ delta_W


def _top_factors(X: Tensor | None, delta_W: Tensor, k: int, decomposition: str) -> tuple[Tensor, Tensor, Tensor] | None:
    """The top ``k`` columns of :func:`essential_subspace`'s ``P``, their ``lam`` and the norm
    n_t = ||P_tᵀ ΔW_t||_F of the *full* coordinates, without forming P or Pᵀ ΔW in full.

    Exact routes (docs/methods.md §ESM):

    * The activation shift dO = X ΔWᵀ has rank <= d_in. With N >= d_in, X = Q R (QR,
      R d_in × d_in) gives dO = Q (R ΔWᵀ): the same singular values and right vectors from the
      d_in × d_out matrix R ΔWᵀ instead of the N × d_out one. With N < d_in (CLIP's c_proj,
      d_in 3072 > 1600 proxy tokens) dO itself is the smaller matrix.
    * The top k right vectors then come from the float64 Gram of the smaller side
      (:func:`acetools.merging._linalg.gram_top_svd`) for float32 inputs, where
      sigma_1 / sigma_k allows it; float64 inputs take the float64 SVD of the reduced matrix.
    * Only rows :k of A_t = P_tᵀ ΔW_t are used after Step B2; its norm follows from the columns
      of P: the m = min(N, d_out) SVD columns span range(ΔW Xᵀ) = range(ΔW) whenever X has full
      column rank, so they carry all of ||ΔW||_F² (past rank(dO) they are orthogonal to ΔW),
      and the identity completion e_{m+1}..e_{d_out} adds the squared norms of rows m+1.. of ΔW:
      n_t² = ||ΔW||_F² + ||ΔW[m:]||_F². For the "svd" decomposition the same holds with
      m = min(d_out, d_in).

    Returns ``(P_k, lam_k, n_t)`` in ``delta_W``'s dtype, or ``None`` where the shortcut does
    not apply (k past the rank bound, X without full column rank while P is completed, or a
    zero shift), so the caller takes :func:`essential_subspace`. Where the shift's rank
    (:func:`shift_rank`) is below k, ``P_k`` has only that many columns.
    """
    d_out, d_in = delta_W.shape
    gram = delta_W.dtype != torch.float64
    W64 = delta_W.double()
    if decomposition == "esd":
        if X is None:
            raise InputError("esm: the 'esd' decomposition needs the layer's activations X")
        X = _as_rows(X, d_in)
        n = X.shape[0]
        m = min(n, d_out)
        if k > min(n, d_in, d_out) or (m < d_out and n < d_in):
            return None
        X64 = X.to(delta_W.device, torch.float64)
        if n >= d_in:
            R = torch.linalg.qr(X64, mode="r").R
            r_diag = R.diagonal().abs()
            if m < d_out and not bool(r_diag.min() > 1e-10 * r_diag.max()):
                return None  # X lacks full column rank: the completion's norm would depend on LAPACK's basis
            C = R @ W64.T
        else:
            C = X64 @ W64.T
        scale = max(n - 1, 1)
    else:
        m = min(d_out, d_in)
        if k > m:
            return None
        C, scale = W64.T, 1  # right singular vectors of ΔWᵀ = left ones of ΔW
    top = gram_top_svd(C, k) if gram else None
    if top is not None:
        _, S, Vh_k = top
    else:
        _, S, Vh = thin_svd(C.to(delta_W.dtype) if gram else C)
        S, Vh_k = S[:k].double(), Vh[:k, :].double()
        if not bool(S[0] > 0):
            return None
    r = shift_rank(S)
    S, Vh_k = S[:r], Vh_k[:r]
    norm2 = W64.square().sum() + (W64[m:].square().sum() if m < d_out else 0.0)
    dt = delta_W.dtype
    return Vh_k.mT.to(dt), (S.square() / scale).to(dt), norm2.sqrt().to(dt)


def shift_rank(S: Tensor) -> int:
    """Rank of the activation shift from its singular values ``S`` (descending): how many exceed
    ``SHIFT_RANK_RTOL · S[0]`` (docs/methods.md §ESM, Step A)."""
    if S.numel() == 0 or not bool(S[0] > 0):
        return 0
    return int((S > SHIFT_RANK_RTOL * S[0]).sum())


def task_budget(sub: Subspace, X: Tensor | None, tau: Tensor, k: int) -> int:
    """The rank task t keeps: the budget ``k``, capped at the rank of its activation shift
    (:func:`shift_rank` of the essential subspace's singular values; a zero task vector keeps
    ``k``). Past that rank the directions are an arbitrary null-space basis (docs/methods.md
    §ESM, Step A)."""
    if not bool(tau.any()):
        return k
    n = min(X.reshape(-1, tau.shape[1]).shape[0], *tau.shape) if X is not None else min(tau.shape)
    return min(k, shift_rank(sub.lam[:n].clamp_min(0).sqrt()))


# --------------------------------------------------------------------------- Step B
def rank_budget(d_out: int, n_tasks: int) -> int:
    """Per-task rank k = ``int(d_out * (1/n_tasks))``, docs/methods.md §ESM, Eq. (ESM.3).

    This is the official ``int(vec.shape[0] * (1/T))``, which equals floor(d_out/T) for every
    CLIP shape but not always (98 with T = 49 gives 1). Where it would be 0 (d_out < T) it is
    raised to 1, as in the RoBERTa code (docs/methods.md §ESM); the ViT code would fail there.
    """
    if n_tasks < 1:
        raise InputError(f"n_tasks={n_tasks} must be >= 1")
    return max(1, int(d_out * (1.0 / n_tasks)))


def polar_scales(norms: Tensor, power: float = 2.0) -> Tensor:
    """Polarized scaling factors (n_i / mean_i n_i)^power, docs/methods.md §ESM, Eqs. (ESM.4), (ESM.7), (ESM.10).

    ``power=2`` is the paper's default at every level; ``power=-1`` is its "reciprocal"
    ablation (the larger norm gets the smaller factor); ``power=0`` switches scaling off.
    An entry with n_i = 0 gets 0 (it has nothing to scale), so negative powers stay finite.
    """
    norms = torch.as_tensor(norms)
    mean = norms.mean()
    if not bool(mean > 0):
        return torch.zeros_like(norms)
    safe = torch.where(norms > 0, norms, mean)
    return torch.where(norms > 0, (safe / mean).pow(power), torch.zeros_like(norms))


def polarize_tasks(
    A: Sequence[Tensor], power: float = 2.0, norms: Sequence[float] | Tensor | None = None
) -> list[Tensor]:
    """Inter-task polarization, docs/methods.md §ESM, Eq. (ESM.4).

    A_t <- s_t A_t, s_t = (n_t / mean_i n_i)^power.

    n_t = ||A_t||_F of the *full* (untruncated) coordinates, as in the code; pass ``norms``
    when ``A`` holds already-truncated factors (that is what :func:`esm_merge_matrix` does, so
    it never keeps T full d_out x d_out bases). Returns new tensors; the inputs are untouched.
    """
    if norms is None:
        norms = torch.stack([torch.linalg.norm(a) for a in A])
    norms = torch.as_tensor(norms, dtype=A[0].dtype, device=A[0].device)
    if norms.shape != (len(A),):
        raise InputError(f"norms must hold one value per task ({len(A)}), got shape {tuple(norms.shape)}")
    s = polar_scales(norms, power)
    return [a * s[t] for t, a in enumerate(A)]


def eigen_weights(lam: Tensor, power: float = 0.15) -> Tensor:
    """Eigenvalue weights e = (lam / mean lam)^power renormalized to mean 1, docs/methods.md §ESM, Eq. (ESM.5).

    ``lam`` is the top-k eigenvalues of one task. ``power=0.15`` is the code's value (the
    paper omits this step; ``power=0`` switches it off). If all k eigenvalues are zero the
    weights are 1 (the official code would give NaN; that task's coordinates are zero anyway).
    """
    mean = lam.mean()
    if not bool(mean > 0):
        return torch.ones_like(lam)
    e = (lam / mean).pow(power)
    return e / e.mean()


def truncate_factors(sub: Subspace, A: Tensor, k: int, eig_power: float = 0.15) -> tuple[Tensor, Tensor]:
    """Keep the top ``k`` components, weighted by e, docs/methods.md §ESM, Eq. (ESM.5).

    Returns P_hat = P[:, :k] diag(e) (d_out x k) and A_hat = diag(e) A[:k, :] (k x d_in); e is
    applied to *both* factors, so their product carries e^2 (as in the code).
    """
    e = eigen_weights(sub.lam[:k], eig_power)
    return sub.P[:, :k] * e, A[:k, :] * e[:, None]


def concatenate_factors(P_hats: Sequence[Tensor], A_hats: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """P_cat = [P_hat_1 | ... | P_hat_T] (d_out x Tk) and A_cat = [A_hat_1; ...; A_hat_T] (Tk x d_in),
    docs/methods.md §ESM, Eq. (ESM.6)."""
    return torch.cat(list(P_hats), dim=1), torch.cat(list(A_hats), dim=0)


def polarize_dimensions(A_cat: Tensor, power: float = 2.0) -> Tensor:
    """Inter-dimension polarization, docs/methods.md §ESM, Eq. (ESM.7): column j times (c_j / mean_j c_j)^power.

    c_j = ||A_cat[:, j]||_2 is the norm of input column j over all tasks' components.
    Returns a new tensor.
    """
    return A_cat * polar_scales(torch.linalg.norm(A_cat, dim=0), power)[None, :]


def whiten(M: Tensor, *, name: str = "") -> Tensor:
    """Whitening, docs/methods.md §ESM, Eq. (ESM.8): polar(M) times the mean singular value of M.

    The result has orthonormal columns (or rows) up to that scale c: for a tall full-rank
    M, whiten(M)^T whiten(M) = c^2 I.

    A rank-deficient M has no unique polar factor: the SVD's singular vectors past its rank
    (singular values at rounding level, :func:`acetools.merging._linalg.polar_rank`) are an
    arbitrary basis that depends on the CPU's LAPACK. There the polar factor of the rank-r part,
    U_r V_rᵀ (the unique partial isometry), is used and a ``RuntimeWarning`` names the layer
    (``name``); c stays the mean of all singular values.

    For float32 inputs the polar factor comes from the float64 Gram of the smaller side
    (:func:`acetools.merging._linalg.gram_polar`) where sigma_1 / sigma_min <=
    ``WHITEN_GRAM_MAX_RATIO``: more accurate than the float32 SVD at every conditioning measured
    (docs/performance.md, ESM section) and about as fast for the square P_cat (one thread: 3.8 s
    against 3.7 s at 2304², 8.8 s against 9.8 s at 3072²; :func:`esm_merge_matrix` does better by
    never forming polar(P_cat)). Else, and for float64 inputs, the SVD.
    """
    if M.dtype != torch.float64 and _GRAM_WHITEN and M.numel() > 0:
        W = _whiten_gram(M)
        if W is not None:
            return W.to(M.dtype)
    return _whiten_svd(M, name)


def _whiten_gram(M: Tensor) -> Tensor | None:
    """:func:`whiten` through the float64 Gram of ``M``'s smaller side, in float64; ``None``
    where sigma_1 / sigma_min > ``WHITEN_GRAM_MAX_RATIO`` (the caller takes the SVD)."""
    out = gram_polar(M, max_ratio=WHITEN_GRAM_MAX_RATIO)
    return None if out is None else out[0] * out[1].mean()


def _whiten_svd(M: Tensor, name: str = "") -> Tensor:
    """:func:`whiten` through the thin SVD of ``M`` in its own dtype (rank-deficient ``M``: the
    partial isometry of its rank-r part, with a warning naming ``name``)."""
    if not bool(torch.isfinite(M).all()):
        raise FloatingPointError(f"esm: layer {name!r}: the matrix to whiten has NaN or Inf entries; the task "
                                 "vectors or activations overflow (check their scale)")
    U, S, Vh = _svd_named(M, name)
    if S.numel() == 0 or not bool(S.mean() > 0):
        return torch.zeros_like(M)
    r = polar_rank(S, (M.shape[0], M.shape[1]), M.dtype)
    if r < S.numel():
        warnings.warn(
            f"esm: layer {name!r}: the {tuple(M.shape)} matrix to whiten has rank {r} < {S.numel()} (singular "
            "values at rounding level); its polar factor is not unique, so the rank-r part's U_r V_r^T is used "
            "(docs/methods.md §ESM, Step B5)", RuntimeWarning, stacklevel=3)
        return (U[:, :r] @ Vh[:r]) * S.mean()
    return (U @ Vh) * S.mean()


def _svd_named(M: Tensor, name: str) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`thin_svd` whose LAPACK failure names the layer and the likely cause."""
    try:
        return thin_svd(M)
    except RuntimeError as e:  # torch.linalg.LinAlgError: the SVD did not converge
        big = float(M.detach().abs().max()) if M.numel() else 0.0
        raise InputError(
            f"esm: the SVD for layer {name!r} failed ({type(e).__name__}); the {tuple(M.shape)} matrix has "
            f"max |entry| {big:.3g}: task vectors or activations this large (or NaN/Inf) overflow "
            f"{M.dtype} arithmetic. Check the scale of the experts and the capture"
        ) from e


def _whitened_product(P_cat: Tensor, A_cat: Tensor, name: str = "") -> Tensor:
    """``whiten(P_cat) @ whiten(A_cat)`` (docs/methods.md §ESM, Eqs. (ESM.8)-(ESM.9)) on the cheapest exact route.

    For float32 inputs: whiten(A_cat) from the float64 Gram of its smaller side, then
    polar(P_cat) @ whiten(A_cat) = P_cat (Q (diag(1/sigma) (Qᵀ whiten(A_cat)))) with
    P_catᵀ P_cat = Q diag(sigma²) Qᵀ (:func:`acetools.merging._linalg.gram_polar_times`): the
    square d_out x d_out polar factor of P_cat is never formed, and the product stays in float64
    until the final cast. Each factor falls back to :func:`whiten`'s SVD where its conditioning
    exceeds ``WHITEN_GRAM_MAX_RATIO``; float64 inputs take the SVDs.
    """
    if P_cat.dtype == torch.float64 or not _GRAM_WHITEN or P_cat.numel() == 0 or A_cat.numel() == 0:
        return whiten(P_cat, name=name) @ whiten(A_cat, name=name)
    WA = _whiten_gram(A_cat)
    if WA is None:
        WA = _whiten_svd(A_cat, name).double()
    out_p = gram_polar_times(P_cat, WA, max_ratio=WHITEN_GRAM_MAX_RATIO)
    if out_p is None:
        return (_whiten_svd(P_cat, name).double() @ WA).to(P_cat.dtype)
    Y, S = out_p
    return (Y * S.mean()).to(P_cat.dtype)


def esm_merge_matrix(
    taus: Sequence[Tensor],
    Xs: Sequence[Tensor] | None = None,
    *,
    decomposition: str = "esd",
    task_scaling: bool = True,
    task_power: float = 2.0,
    dim_scaling: bool = True,
    dim_power: float = 2.0,
    eig_power: float = 0.15,
    const: float = 2.0,
    name: str = "",
) -> Tensor:
    """Merged update of one ESD layer, docs/methods.md §ESM, Eqs. (ESM.1)-(ESM.9) (no beta, no alpha).

    ``taus`` are the T task vectors (d_out x d_in) of the layer, ``Xs`` their proxy input
    activations (N_t x d_in, captured in each fine-tuned model; unused for
    ``decomposition="svd"``). Returns const * whiten(P_cat) @ whiten(A_cat). Defaults follow
    the official code: exponent 2 for both polarizations, e^0.15, const 2.

    Where the rank budget k exceeds the rank r_t of task t's activation shift
    (:func:`shift_rank`; e.g. k = 64 on a LayerNorm output of width 64, whose shift has rank
    63), task t keeps only its top r_t directions and a ``RuntimeWarning`` names the layer
    (``name``): past the rank the directions are an arbitrary null-space basis, and keeping
    them made the merge move by a quarter between float32 and float64 (docs/methods.md §ESM, Step A).
    """
    T = len(taus)
    if T == 0:
        raise InputError("esm_merge_matrix needs at least one task vector")
    if decomposition == "esd" and (Xs is None or len(Xs) != T):
        raise InputError(
            f"esm_merge_matrix(decomposition='esd') needs one activation tensor per task: "
            f"got {None if Xs is None else len(Xs)} for {T} task vectors"
        )
    d_out = taus[0].shape[0]
    k = rank_budget(d_out, T)
    P_hats, A_hats, norms = [], [], []
    short: list[tuple[int, int]] = []  # (task, rank) where the shift's rank is below k
    for t, tau in enumerate(taus):  # one task at a time: only the top-k factors are kept
        X = None if Xs is None else Xs[t]
        fast = _top_factors(X, tau, k, decomposition)
        if fast is not None:  # the same P[:, :k], lam[:k] and n_t on the cheapest exact route
            P_k, lam_k, n_t = fast
            if P_k.shape[1] < k and bool(tau.any()):
                short.append((t, P_k.shape[1]))
            e = eigen_weights(lam_k, eig_power)
            P_hats.append(P_k * e)
            A_hats.append((P_k.T @ tau) * e[:, None])
            norms.append(n_t)
            continue
        sub = essential_subspace(X, tau, decomposition)
        A = task_coordinates(sub.P, tau)
        norms.append(torch.linalg.norm(A))  # n_t on the full A_t (Step B1)
        kt = task_budget(sub, X, tau, k)
        if kt < k:
            short.append((t, kt))
        P_hat, A_hat = truncate_factors(sub, A, kt, eig_power)
        P_hats.append(P_hat)
        A_hats.append(A_hat)
    if short:
        warnings.warn(
            f"esm: layer {name!r}: the rank budget k = {k} exceeds the rank of the activation shift X dW^T for "
            + ", ".join(f"task {t} (rank {r})" for t, r in short)
            + "; those tasks keep only their top-rank directions (past the rank the basis is arbitrary and the "
            "merge would depend on the dtype and the CPU's LAPACK; docs/methods.md §ESM, Step A)",
            RuntimeWarning, stacklevel=2)
    if task_scaling:
        A_hats = polarize_tasks(A_hats, task_power, norms=torch.stack(norms))
    P_cat, A_cat = concatenate_factors(P_hats, A_hats)
    if dim_scaling:
        A_cat = polarize_dimensions(A_cat, dim_power)
    if not bool(A_cat.any()):  # every task vector of the layer is zero: so is the update (whiten(0) = 0)
        return taus[0].new_zeros(taus[0].shape)
    return const * _whitened_product(P_cat, A_cat, name)


def _esd_layer(key: str, taus: Sequence[Tensor], Xs: Sequence[Tensor] | None, **kw: Any) -> Tensor:
    """:func:`esm_merge_matrix` for ``key``; a failing eigensolver or SVD names the key and the likely cause."""
    try:
        return esm_merge_matrix(taus, Xs, name=key, **kw)
    except (RuntimeError, ArithmeticError, ValueError) as e:  # torch's and numpy's LinAlgError among them
        if str(e).startswith("esm: "):
            raise
        big = max(float(t.detach().abs().max()) for t in taus)
        xbig = max((float(X.detach().abs().max()) for X in Xs), default=0.0) if Xs is not None else 0.0
        raise InputError(
            f"esm: the eigensolver/SVD failed on layer {key!r} ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
            f"max |task vector| = {big:.3g}, max |activation| = {xbig:.3g}: values this large overflow the "
            "float32/float64 Gram and shift matrices. Check that the experts and the base are the same model at "
            "the same scale (a task vector is expert - base) and that the activations are finite and unscaled"
        ) from e


# --------------------------------------------------------------------------- Step C
def _matches(pattern: str, key: str) -> bool:
    """``pattern`` is a regular expression searched anywhere in ``key``; a plain name like
    ``mlp.c_fc.weight`` therefore acts as a substring ('.' matches itself)."""
    return re.search(pattern, key) is not None


def _layer_type(key: str, layer_types: Sequence[str]) -> str | None:
    for ty in layer_types:  # first match; the CLIP types never overlap (docs/methods.md §ESM)
        if _matches(ty, key):
            return ty
    return None


def layer_scales(
    updates: Mapping[str, Tensor],
    keys: Sequence[str] | None = None,
    layer_types: Sequence[str] = CLIP_LAYER_TYPES,
    power: float = 2.0,
) -> dict[str, float]:
    """Inter-layer factors beta_l = (||dW_l||_F / m_type)^power, docs/methods.md §ESM, Eq. (ESM.10).

    m_type is the mean Frobenius norm over the keys of ``keys`` (default: all of
    ``updates``) whose name contains that type (first matching type in ``layer_types``; each
    type is a regular expression searched in the key, so plain names act as substrings).
    Returns ``{key: beta}`` for the keys that have a type; other keys get no beta.
    """
    keys = list(updates) if keys is None else list(keys)
    groups: dict[str, list[str]] = {}
    for key in keys:
        ty = _layer_type(key, layer_types)
        if ty is not None:
            groups.setdefault(ty, []).append(key)
    betas: dict[str, float] = {}
    for members in groups.values():
        norms = torch.stack([torch.linalg.norm(updates[k].double()) for k in members])
        s = polar_scales(norms, power)
        betas.update({k: float(s[i]) for i, k in enumerate(members)})
    return betas


def polarize_layers(
    updates: Mapping[str, Tensor],
    keys: Sequence[str] | None = None,
    layer_types: Sequence[str] = CLIP_LAYER_TYPES,
    power: float = 2.0,
) -> dict[str, Tensor]:
    """Inter-layer polarization, docs/methods.md §ESM, Eq. (ESM.10): every typed key times its :func:`layer_scales`
    beta.

    Returns a new dict with every key of ``updates``; keys without a type (or outside
    ``keys``) are passed through unchanged. ``power=-1`` is the "reciprocal" ablation.
    """
    betas = layer_scales(updates, keys, layer_types, power)
    return {k: (v * betas[k] if k in betas else v) for k, v in updates.items()}


# --------------------------------------------------------------------------- the method
def _finite_number(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return "must be a finite number"
    return None


def _str_tuple(allow_empty: bool) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, str) or not isinstance(v, (tuple, list)):
            return "must be a tuple of parameter-name patterns, e.g. ('mlp.c_fc.weight',)"
        if not allow_empty and len(v) == 0:
            return "must name at least one layer pattern"
        if not all(isinstance(s, str) and s for s in v):
            return "every entry must be a non-empty string"
        for s in v:
            try:
                re.compile(s)
            except re.error as e:
                return f"pattern {s!r} is not a valid regular expression ({e})"
        return None

    return check


def _check_activations(v: Any) -> str | None:
    if v is None or isinstance(v, Mapping) or callable(v):
        return None
    return (
        "must be a mapping key -> list of tensors (one N x d_in tensor per task) or a callable "
        "activations(t, key) -> Tensor"
    )


def _activation_source(activations: Any, esd_keys: Sequence[str], n_tasks: int,
                       d_in: Mapping[str, int]) -> Callable[[int, str], Tensor]:
    """Validate ``activations`` (eagerly for a mapping) and return a getter (t, key) -> X (N x d_in)."""
    how = (
        "capture it inside each task's fine-tuned model with acetools.files.activations.capture_inputs, "
        "or drop the layer from `targets`"
    )
    if isinstance(activations, Mapping):
        for key in esd_keys:
            if key not in activations:
                raise InputKeyError(f"esm: activations has no entry for ESD layer {key!r}; {how}")
            xs = activations[key]
            if isinstance(xs, Tensor) or not isinstance(xs, Sequence):
                raise InputTypeError(
                    f"esm: activations[{key!r}] must be a list with one N x d_in tensor per task, "
                    f"got {type(xs).__name__}"
                )
            if len(xs) != n_tasks:
                raise InputError(
                    f"esm: activations[{key!r}] has {len(xs)} tensors but there are {n_tasks} tasks; "
                    "give one per task, in the order of the experts"
                )
            for t, X in enumerate(xs):
                _as_rows(X, d_in[key], where=f"esm: activations[{key!r}][{t}] (expert {t}, task {t})")

        def get(t: int, key: str) -> Tensor:
            return activations[key][t]
    else:
        def get(t: int, key: str) -> Tensor:
            return activations(t, key)

    def checked(t: int, key: str) -> Tensor:
        where = f"esm: activations for key {key!r}, task {t} (expert {t})"
        X = _as_rows(get(t, key), d_in[key], where=where)
        if not torch.isfinite(X).all():
            raise InputError(f"{where} contain NaN or Inf values; check the capture")
        return X

    return checked


def _check_targets(base: Mapping[str, Tensor], matrix_keys: Sequence[str], targets: Sequence[str],
                   activations: Any, layer_types: Sequence[str]) -> list[str]:
    """The ESD keys, or an error: ESM never turns silently into TSV-M.

    Explicit ``targets`` must each select a matrix key; the default (open_clip names) must
    select at least one. A mapping of ``activations`` may only name ESD keys. Step C's
    ``layer_types`` likewise (explicit: each must match; default: a warning if none does).
    """
    where = "esm: "
    esd_keys = [k for k in matrix_keys if any(_matches(p, k) for p in targets)]
    defaults = tuple(targets) == DEFAULT_TARGETS
    example = next(iter(matrix_keys), next(iter(base), "?"))
    if not esd_keys:
        what = f"none of the default targets {list(DEFAULT_TARGETS)} (open_clip names)" if defaults else \
            f"no pattern of targets={list(targets)}"
        raise InputError(
            f"{where}{what} matches a matrix key of the model (e.g. {example!r}); without ESD layers ESM "
            "would be TSV-M. Pass targets= with your model's layer names (regular expressions searched in "
            "the key, e.g. targets=('mlp.fc1.weight', 'self_attn.q_proj.weight'))"
        )
    if defaults:
        unmatched = [p for p in targets if not any(_matches(p, k) for k in matrix_keys)]
        if unmatched:
            warnings.warn(
                f"{where}the default target(s) {unmatched} (open_clip names) match no matrix key, so ESM runs on "
                f"{len(esd_keys)} layer(s) only and other matrices take TSV-M; pass targets= with your model's names "
                "(acetools.files.esm_inputs.esm_names(layout) has them for the layout presets)", RuntimeWarning,
                stacklevel=4)
    else:
        for p in targets:
            if not any(_matches(p, k) for k in matrix_keys):
                hint = " (it names a key that is not a matrix)" if any(_matches(p, k) for k in base) else ""
                raise InputError(f"{where}target pattern {p!r} matches no matrix key of the model{hint}; "
                                 f"e.g. {example!r}")
    if isinstance(activations, Mapping):
        esd_set = set(esd_keys)
        for key in activations:
            if key in esd_set:
                continue
            if key not in base:
                raise InputKeyError(
                    f"{where}activations are given for key {key!r}, which is not a weight of the model; "
                               "key activations by the weight's state-dict key (e.g. '...mlp.c_fc.weight')")
            raise InputKeyError(f"{where}activations are given for key {key!r}, which no ESM target selects, so they "
                           f"would be ignored; add it to targets (now {list(targets)}) or drop it")
    if layer_types:
        typed = [p for p in layer_types if any(_matches(p, k) for k in matrix_keys)]
        if tuple(layer_types) == CLIP_LAYER_TYPES:
            if not typed:
                warnings.warn(
                    f"{where}none of the default layer_types (open_clip names) matches a matrix key, so the "
                    "inter-layer polarization (Step C) does nothing; pass layer_types= with your model's "
                    "names or layer_scaling=False", RuntimeWarning, stacklevel=4)
        else:
            missing = [p for p in layer_types if p not in typed]
            if missing:
                raise InputError(f"{where}layer_types pattern {missing[0]!r} matches no matrix key of the model; "
                                 f"e.g. {example!r}")
    return esd_keys


@register(
    "esm",
    "Essential Subspace Merging: PCA of the activation shift X dW^T per task, polarized "
    "scaling at task, dimension and layer level, whitening (Li et al., CVPR 2026; docs/methods.md §ESM)",
    key_scope=("model", "ESM runs in memory: its inter-layer polarization (Step C) scales each matrix by the norms "
                        "of every layer's merged update, and its proxy activations are held for every ESD layer"),
    per_key=("activations",), data_inputs=("activations", "targets"), needs_layout=True,
    search=Search("alpha", "esm", bracket=ESM_BRACKET),
    activations=Param(
        None,
        "proxy input activations of every ESD layer, captured in each task's fine-tuned model: "
        "mapping key -> [X_1..X_T] (N x d_in) or callable (t, key) -> X; required for "
        "decomposition='esd'",
        check=_check_activations,
    ),
    alpha=Param(1.0, "merge coefficient alpha (docs/methods.md §ESM, Eq. (ESM.11); chosen on validation)", low=0.0,
                check=_finite_number),
    alpha_scope=Param("esd", "'esd': alpha scales the ESD layers only (evaluation code, default); "
                      "'all': every key (the saved fused model)", choices=("esd", "all")),
    decomposition=Param("esd", "'esd': PCA of X dW^T (default); 'svd': left singular vectors of dW "
                        "(the ablation's SVD basis)", choices=_DECOMPOSITIONS),
    task_scaling=Param(True, "inter-task polarization on/off (Step B1)", types=(bool,)),
    task_power=Param(2.0, "exponent of the inter-task polarization; -1 is the reciprocal ablation",
                     check=_finite_number),
    dim_scaling=Param(True, "inter-dimension (input column) polarization on/off (Step B4)", types=(bool,)),
    dim_power=Param(2.0, "exponent of the inter-dimension polarization", check=_finite_number),
    layer_scaling=Param(True, "inter-layer polarization on/off (Step C)", types=(bool,)),
    layer_power=Param(2.0, "exponent of the inter-layer polarization", check=_finite_number),
    eig_power=Param(0.15, "exponent of the eigenvalue weights e (Step B2; 0 switches them off)", low=0.0,
                    check=_finite_number),
    const=Param(2.0, "constant factor of the ESD product (Step B6; the code's x2)", check=_finite_number),
    targets=Param(DEFAULT_TARGETS, "patterns (regular expressions searched in the key; plain names act as "
                  "substrings) selecting the ESD layers among the matrix keys",
                  check=_str_tuple(allow_empty=False)),
    layer_types=Param(CLIP_LAYER_TYPES, "patterns of the layer types compared in Step C (same matching)",
                      check=_str_tuple(allow_empty=True)),
)
def esm(
    base: Mapping[str, Tensor],
    task_vectors: Sequence[Mapping[str, Tensor]],
    *,
    is_matrix: Callable[[str, Tensor], bool],
    activations: Any,
    alpha: float,
    alpha_scope: str,
    decomposition: str,
    task_scaling: bool,
    task_power: float,
    dim_scaling: bool,
    dim_power: float,
    layer_scaling: bool,
    layer_power: float,
    eig_power: float,
    const: float,
    targets: Sequence[str],
    layer_types: Sequence[str],
) -> dict[str, Tensor]:
    r"""ESM merged update for every key, docs/methods.md §ESM (defaults: ``METHODS["esm"]``, written once there;
    call it as ``merge("esm", ...)`` or with :func:`acetools.merging.defaults_from`).

    - ESD layers: matrix keys (``is_matrix``) whose name contains one of ``targets``
      (default ``attn.in_proj_weight``, ``mlp.c_fc.weight``, ``mlp.c_proj.weight``) get
      :func:`esm_merge_matrix` with the proxy activations ``activations`` (``X_t`` for task
      t, the layer's input inside task t's fine-tuned model; ``t`` counts from 0 in the order
      of the experts).
    - Other matrix keys get TSV-M (docs/methods.md §TSV-M, :func:`acetools.merging.svd.tsv_merge_matrix`;
      no polarized scaling at this stage), non-matrix keys the mean (1/T) sum_t tau_t.
    - Step C: if ``layer_scaling``, every matrix key whose name contains one of
      ``layer_types`` (default the four CLIP block types) is multiplied by its beta
      (:func:`polarize_layers`); other keys get no beta.
    - Step D: ``alpha`` multiplies the ESD layers only (``alpha_scope="esd"``, the default:
      the evaluation code that produced the reported numbers; docs/methods.md §ESM) or every
      key (``alpha_scope="all"``, the saved fused model).

    Defaults are the official ViT code's: exponent 2 at every polarization level (each level
    switchable; exponent -1 is the paper's "reciprocal" ablation), e^0.15, const 2, alpha 1.
    With ``layer_types`` spanning several towers (a full CLIP state dict) the types are
    compared across towers, as in the spec. ``targets`` and ``layer_types`` are regular
    expressions searched in the key (plain names act as substrings), so e.g.
    ``targets=(r"^visual\..*mlp\.c_fc\.weight$",)`` restricts ESD to the visual tower.

    ESM never turns silently into TSV-M: an explicit ``targets`` or ``layer_types`` pattern
    that matches no matrix key, an ``activations`` key that is not an ESD layer, and default
    (open_clip) targets of which none matches are errors naming them; default targets or
    layer types that match only partly give a RuntimeWarning. For other architectures use
    :func:`acetools.files.esm_inputs.esm_names` (names per layout) or :func:`acetools.files.esm_inputs.merge_esm`.
    """
    T = len(task_vectors)
    matrix_keys = [k for k in base if is_matrix(k, base[k])]
    if not matrix_keys:  # only 0-d / 1-d tensors (or none on the matrix path): ESM is the mean, as every method
        warnings.warn(
            "esm: the model has no matrix key (every tensor is 0-d or 1-d, or off the layout's matrix path), so "
            "there is no layer for ESM's subspaces: every key takes the mean update (1/T) sum_t tau_t, "
            "as in every other method", RuntimeWarning, stacklevel=3)
        return {key: alpha * mean_update(task_vectors, key) if alpha_scope == "all" else mean_update(task_vectors, key)
                for key in base}
    if decomposition == "esd" and activations is None:
        raise InputTypeError(
            "esm: missing hyperparameter 'activations' (needed for decomposition='esd'): pass a mapping "
            "key -> [X_1..X_T] or a callable (t, key) -> X of input activations captured in each "
            "fine-tuned model (acetools.files.activations.capture_inputs), or use decomposition='svd'"
        )
    matrix_set = set(matrix_keys)
    esd_keys = _check_targets(base, matrix_keys, targets, activations if decomposition == "esd" else None,
                              layer_types if layer_scaling else ())
    esd_set = set(esd_keys)
    get_X = None
    if decomposition == "esd":
        get_X = _activation_source(activations, esd_keys, T, {k: base[k].shape[1] for k in esd_keys})

    out: dict[str, Tensor] = {}
    for key in progress(list(base), desc="esm"):
        taus = [tv[key] for tv in task_vectors]
        if key in esd_set:
            Xs = [get_X(t, key) for t in range(T)] if get_X is not None else None
            out[key] = _esd_layer(key, taus, Xs, decomposition=decomposition,
                                  task_scaling=task_scaling, task_power=task_power,
                                  dim_scaling=dim_scaling, dim_power=dim_power,
                                  eig_power=eig_power, const=const)
        elif key in matrix_set:
            out[key] = tsv_merge_matrix(taus, key=key)
        else:
            out[key] = mean_update(task_vectors, key)

    if layer_scaling:
        out = polarize_layers(out, keys=matrix_keys, layer_types=layer_types, power=layer_power)
    scaled = esd_keys if alpha_scope == "esd" else list(out)
    for key in scaled:
        out[key] = alpha * out[key]
    return out
