"""ESM: Model Merging in the Essential Subspace (Li, Qi, Tian, Geng; CVPR 2026), docs/methods.md §ESM.

Stage by stage, each a public function: Step A, the essential subspace of each task
(:func:`essential_subspace`, :func:`task_coordinates`, :func:`task_budget`); Step B, the rank
budget (:func:`rank_budget`), inter-task polarization (:func:`polarize_tasks`,
:func:`polar_scales`), eigenvalue weights (:func:`eigen_weights`, :func:`truncate_factors`),
concatenation (:func:`concatenate_factors`), inter-dimension polarization
(:func:`polarize_dimensions`), whitening (:func:`whiten`) and the constant 2, composed for one
matrix by :func:`esm_merge_matrix`; Step C, inter-layer polarization (:func:`layer_scales`,
:func:`polarize_layers`); Step D, ``alpha``. :func:`esm`, registered as ``"esm"``, is their
composition. Speed lives inside the stages (docs/performance.md, ESM). ESM needs the proxy input
activations X_t of every target layer, captured in task t's *fine-tuned* model
(:func:`acetools.files.activations.capture_inputs`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..errors import InputError, InputTypeError
from ._registry import ESM_BRACKET, Param, Search, register
from .averaging import matrix_or_mean, mean_update
from .inputs import (
    CLIP_LAYER_TYPES,
    DEFAULT_TARGETS,
    LAYOUT_NAMES,
    activation_source,
    as_rows,
    check_activations,
    check_targets,
    esd_failure,
    finite_number,
    matches,
    str_tuple,
)
from .linalg import gram_polar, gram_polar_times, polar_rank, shift_rank, thin_svd, top_shift_factors
from .svd import tsv_merge_matrix

__all__ = [
    "task_budget", "LAYOUT_NAMES", "DEFAULT_TARGETS", "CLIP_LAYER_TYPES", "Subspace",
    "TopSubspace", "essential_subspace", "task_coordinates", "rank_budget", "polar_scales", "polarize_tasks",
    "eigen_weights", "truncate_factors", "concatenate_factors", "polarize_dimensions", "whiten", "esm_merge_matrix",
    "layer_scales", "polarize_layers", "esm", "shift_rank", "ROBERTA", "ROBERTA_ALPHA_GRID",
]

_DECOMPOSITIONS = ("esd", "svd")
_GRAM_WHITEN = True  # float32 whitening through the float64 Gram (see :func:`whiten`; off: the float32 SVD)
#: Largest sigma_1 / sigma_min for which :func:`whiten` takes the float64 Gram route (error ~eps64 kappa²;
#: docs/performance.md, ESM).
WHITEN_GRAM_MAX_RATIO = 1e6
#: ESM-RoBERTa as its official code configures it (docs/methods.md §ESM, "RoBERTa variant"): ESD on all six block
#: matrix types (``attention.output.dense`` included), no inter-task or inter-dimension polarization, no x2, Step C
#: over the six types, alpha on every key; ``merge("esm", ..., **ROBERTA)``, alpha on :data:`ROBERTA_ALPHA_GRID`.
ROBERTA: dict[str, Any] = {"task_scaling": False, "dim_scaling": False, "const": 1.0, "alpha_scope": "all",
                           "targets": LAYOUT_NAMES["bert"]["layer_types"],
                           "layer_types": LAYOUT_NAMES["bert"]["layer_types"]}
#: Its alpha candidates: (0, 5] in steps of 0.1, the official ternary search's bracket and tolerance.
ROBERTA_ALPHA_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 51))


class Subspace(NamedTuple):
    """Step A for one task and layer: the directions ``P`` (columns) sorted by ``lam`` (descending)."""

    P: Tensor  # (d_out, d_out)
    lam: Tensor  # (d_out,)


class TopSubspace(NamedTuple):
    """Step A truncated to the rank budget (``essential_subspace(..., k=k)``), with Step B1's norm."""

    P: Tensor  # (d_out, k_t), k_t = task_budget(..., k)
    lam: Tensor  # (k_t,)
    norm: Tensor  # n_t = ||P_tᵀ ΔW_t||_F of the full coordinates


# --------------------------------------------------------------------------- Step A
def essential_subspace(X: Tensor | None, delta_W: Tensor, decomposition: str = "esd", *, k: int | None = None
                       ) -> Subspace | TopSubspace:
    """Essential Subspace Decomposition of one task's update (docs/methods.md §ESM, Eqs. (ESM.1)-(ESM.2)).

    ``"esd"``: uncentred PCA of the activation shift dO = X delta_W^T via its thin SVD: ``P = V``,
    ``lam = S^2/(N-1)``; ``"svd"`` (the ablation): the left singular vectors of delta_W (``X`` unused). Fewer
    than d_out columns are completed with identity columns and zero ``lam``, as in the official code.
    ``X``: N x d_in (leading dims flattened). ``k``: only the top ``k`` columns (fewer where :func:`shift_rank`
    is below ``k``) and ``norm`` = ||Pᵀ delta_W||_F of the full coordinates, a :class:`TopSubspace`, on the
    cheapest exact route (:func:`acetools.merging.linalg.top_shift_factors`).
    """
    if decomposition not in _DECOMPOSITIONS:
        raise InputError(f"decomposition={decomposition!r} is not one of {list(_DECOMPOSITIONS)}")
    if not isinstance(delta_W, Tensor) or delta_W.ndim != 2:
        raise InputError("delta_W must be a 2-D tensor (d_out x d_in)")
    d_out, d_in = delta_W.shape
    if k is not None:
        top = top_shift_factors(as_rows(X, d_in) if decomposition == "esd" and X is not None else X, delta_W, k,
                                decomposition)
        if top is not None:
            return TopSubspace(*top)  # P (d_out, <=k), lam (<=k), n_t
        sub = essential_subspace(X, delta_W, decomposition)
        kt = task_budget(sub, X, delta_W, k)
        return TopSubspace(sub.P[:, :kt], sub.lam[:kt], torch.linalg.norm(task_coordinates(sub.P, delta_W)))
    if decomposition == "esd":
        if X is None:
            raise InputTypeError("essential_subspace(decomposition='esd') needs the input activations X (N x d_in)")
        X = as_rows(X, d_in).to(delta_W.device, delta_W.dtype)  # (N, d_in)
        n = X.shape[0]
        dO = X @ delta_W.T  # (N, d_out)
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
    """Coordinates A_t = P_t^T delta_W_t of the update in the basis P_t, docs/methods.md §ESM, Eq. (ESM.2)."""
    return P.T @ delta_W


def task_budget(sub: Subspace | TopSubspace, X: Tensor | None, tau: Tensor, k: int) -> int:
    """The rank task t keeps: the budget ``k`` capped at its activation shift's :func:`shift_rank` (a zero
    task vector keeps ``k``); past it the basis is arbitrary (docs/methods.md §ESM, Step A)."""
    if isinstance(sub, TopSubspace):  # cut there already
        return min(k, sub.P.shape[1])
    if not bool(tau.any()):
        return k
    n = min(X.reshape(-1, tau.shape[1]).shape[0], *tau.shape) if X is not None else min(tau.shape)
    return min(k, shift_rank(sub.lam[:n].clamp_min(0).sqrt()))


# --------------------------------------------------------------------------- Step B
def rank_budget(d_out: int, n_tasks: int) -> int:
    """Per-task rank k = ``int(d_out * (1/n_tasks))`` as the official code, at least 1 (docs/methods.md §ESM,
    Eq. (ESM.3))."""
    if n_tasks < 1:
        raise InputError(f"n_tasks={n_tasks} must be >= 1")
    return max(1, int(d_out * (1.0 / n_tasks)))


def polar_scales(norms: Tensor, power: float = 2.0) -> Tensor:
    """Polarized scaling factors (n_i / mean_i n_i)^power (docs/methods.md §ESM, Eqs. (ESM.4), (ESM.7), (ESM.10));
    ``power=-1``: the "reciprocal" ablation. An entry with n_i = 0 gets 0."""
    norms = torch.as_tensor(norms)
    mean = norms.mean()
    if not bool(mean > 0):
        return torch.zeros_like(norms)
    safe = torch.where(norms > 0, norms, mean)
    return torch.where(norms > 0, (safe / mean).pow(power), torch.zeros_like(norms))


def polarize_tasks(A: Sequence[Tensor], power: float = 2.0,
                   norms: Sequence[float] | Tensor | None = None) -> list[Tensor]:
    """Inter-task polarization A_t <- (n_t / mean_i n_i)^power A_t (docs/methods.md §ESM, Eq. (ESM.4)); n_t =
    ||A_t||_F, or ``norms`` (those of the full coordinates) when ``A`` holds truncated factors."""
    if norms is None:
        norms = torch.stack([torch.linalg.norm(a) for a in A])
    norms = torch.as_tensor(norms, dtype=A[0].dtype, device=A[0].device)
    if norms.shape != (len(A),):
        raise InputError(f"norms must hold one value per task ({len(A)}), got shape {tuple(norms.shape)}")
    s = polar_scales(norms, power)
    return [a * s[t] for t, a in enumerate(A)]


def eigen_weights(lam: Tensor, power: float = 0.15) -> Tensor:
    """Eigenvalue weights e = (lam / mean lam)^power renormalized to mean 1 (docs/methods.md §ESM, Eq. (ESM.5));
    all-zero eigenvalues give weights 1."""
    mean = lam.mean()
    if not bool(mean > 0):
        return torch.ones_like(lam)
    e = (lam / mean).pow(power)
    return e / e.mean()


def truncate_factors(sub: Subspace | TopSubspace, A: Tensor, k: int, eig_power: float = 0.15
                     ) -> tuple[Tensor, Tensor]:
    """Keep the top ``k`` components weighted by e, docs/methods.md §ESM, Eq. (ESM.5): P_hat = P[:, :k] diag(e)
    (d_out x k), A_hat = diag(e) A[:k, :] (k x d_in); the product carries e^2, as in the code."""
    e = eigen_weights(sub.lam[:k], eig_power)
    return sub.P[:, :k] * e, A[:k, :] * e[:, None]


def concatenate_factors(P_hats: Sequence[Tensor], A_hats: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """P_cat = [P_hat_1 | ... | P_hat_T] (d_out x Tk) and A_cat = [A_hat_1; ...; A_hat_T] (Tk x d_in),
    docs/methods.md §ESM, Eq. (ESM.6)."""
    return torch.cat(list(P_hats), dim=1), torch.cat(list(A_hats), dim=0)


def polarize_dimensions(A_cat: Tensor, power: float = 2.0) -> Tensor:
    """Inter-dimension polarization, docs/methods.md §ESM, Eq. (ESM.7): column j times (c_j / mean_j c_j)^power,
    c_j = ||A_cat[:, j]||_2 over all tasks' components. A new tensor."""
    return A_cat * polar_scales(torch.linalg.norm(A_cat, dim=0), power)[None, :]


def whiten(M: Tensor, *, name: str = "", times: Tensor | None = None, dtype: torch.dtype | None = None) -> Tensor:
    """Whitening, polar(M) times the mean singular value of M (docs/methods.md §ESM, Eq. (ESM.8)).

    A rank-deficient M (:func:`acetools.merging.linalg.polar_rank`) gets its rank-r part's U_r V_rᵀ with a warning
    naming ``name``. Float32 inputs go through the float64 Gram where
    sigma_1 / sigma_min <= ``WHITEN_GRAM_MAX_RATIO`` (docs/performance.md, ESM). ``times``: whiten(M) @ times
    (Step B5) without forming a tall M's square polar factor. ``dtype``: the result's (default ``M``'s).
    """
    gram = M.dtype != torch.float64 and _GRAM_WHITEN and M.numel() > 0
    if times is not None:
        out = gram_polar_times(M, times, max_ratio=WHITEN_GRAM_MAX_RATIO) if gram and times.numel() > 0 else None
        if out is not None:
            return (out[0] * out[1].mean()).to(dtype or M.dtype)
        W = whiten(M, name=name, dtype=times.dtype)
        return (W @ times).to(dtype or M.dtype)
    out = gram_polar(M, max_ratio=WHITEN_GRAM_MAX_RATIO) if gram else None  # (polar(M), S) in float64
    if out is not None:
        return (out[0] * out[1].mean()).to(dtype or M.dtype)
    if not bool(torch.isfinite(M).all()):
        raise FloatingPointError(f"esm: layer {name!r}: the matrix to whiten has NaN or Inf entries; the task "
                                 "vectors or activations overflow (check their scale)")
    try:
        U, S, Vh = thin_svd(M)
    except RuntimeError as e:  # torch.linalg.LinAlgError: the SVD did not converge
        raise InputError(
            f"esm: the SVD for layer {name!r} failed ({type(e).__name__}); the {tuple(M.shape)} matrix has "
            f"max |entry| {float(M.detach().abs().max()):.3g}: task vectors or activations this large (or NaN/Inf) "
            f"overflow {M.dtype} arithmetic. Check the scale of the experts and the capture") from e
    if S.numel() == 0 or not bool(S.mean() > 0):
        return torch.zeros_like(M).to(dtype or M.dtype)
    r = polar_rank(S, (M.shape[0], M.shape[1]), M.dtype)
    if r < S.numel():
        warnings.warn(
            f"esm: layer {name!r}: the {tuple(M.shape)} matrix to whiten has rank {r} < {S.numel()} (singular "
            "values at rounding level); its polar factor is not unique, so the rank-r part's U_r V_r^T is used "
            "(docs/methods.md §ESM, Step B5)", RuntimeWarning, stacklevel=2)
        U, Vh = U[:, :r], Vh[:r]
    return ((U @ Vh) * S.mean()).to(dtype or M.dtype)


def esm_merge_matrix(taus: Sequence[Tensor], Xs: Sequence[Tensor] | None = None, *, decomposition: str = "esd",
                     task_scaling: bool = True, task_power: float = 2.0, dim_scaling: bool = True,
                     dim_power: float = 2.0, eig_power: float = 0.15, const: float = 2.0, name: str = "",
                     notes: list[tuple[str, str]] | None = None) -> Tensor:
    """Merged update of one ESD layer, const * whiten(P_cat) @ whiten(A_cat) (docs/methods.md §ESM, Eqs.
    (ESM.1)-(ESM.9); no beta, no alpha). ``taus``: the T task vectors, ``Xs`` their proxy input activations
    (N_t x d_in). Where the budget k exceeds task t's :func:`shift_rank`, it keeps its top r_t directions and a
    ``RuntimeWarning`` names the layer; given a list ``notes``, ``(name, text)`` is appended to it instead.
    """
    T = len(taus)
    if T == 0:
        raise InputError("esm_merge_matrix needs at least one task vector")
    if decomposition == "esd" and (Xs is None or len(Xs) != T):
        raise InputError(
            f"esm_merge_matrix(decomposition='esd') needs one activation tensor per task: "
            f"got {None if Xs is None else len(Xs)} for {T} task vectors"
        )
    k = rank_budget(taus[0].shape[0], T)
    P_hats, A_hats, norms = [], [], []  # T x (d_out, k_t), T x (k_t, d_in), T x n_t
    short: list[tuple[int, int]] = []  # (task, rank) where the shift's rank is below k
    for t, tau in enumerate(taus):  # one task at a time: only the top-k factors are kept
        X = None if Xs is None else Xs[t]
        sub = essential_subspace(X, tau, decomposition, k=k)  # P (d_out, <=k), lam (<=k), n_t
        assert isinstance(sub, TopSubspace), "essential_subspace(k=...) truncates"
        kt = task_budget(sub, X, tau, k)
        if kt < k:
            short.append((t, kt))
        A = task_coordinates(sub.P[:, :kt], tau)  # (k_t, d_in)
        P_hat, A_hat = truncate_factors(sub, A, kt, eig_power)
        P_hats.append(P_hat)
        A_hats.append(A_hat)
        norms.append(sub.norm)
    if short:
        note = (f"esm: layer {name!r}: the rank budget k = {k} exceeds the rank of the activation shift X dW^T for "
                + ", ".join(f"task {t} (rank {r})" for t, r in short)
                + "; those tasks keep only their top-rank directions (past the rank the basis is arbitrary and the "
                "merge would depend on the dtype and the CPU's LAPACK; docs/methods.md §ESM, Step A)")
        if notes is None:
            warnings.warn(note, RuntimeWarning, stacklevel=2)
        else:
            notes.append((name, note))
    if task_scaling:
        A_hats = polarize_tasks(A_hats, task_power, norms=torch.stack(norms))
    P_cat, A_cat = concatenate_factors(P_hats, A_hats)
    if dim_scaling:
        A_cat = polarize_dimensions(A_cat, dim_power)
    if not bool(A_cat.any()):  # every task vector of the layer is zero: so is the update (whiten(0) = 0)
        return taus[0].new_zeros(taus[0].shape)
    return const * whiten(P_cat, times=whiten(A_cat, name=name, dtype=torch.float64), name=name)  # (d_out, d_in)


# --------------------------------------------------------------------------- Step C
def layer_scales(updates: Mapping[str, Tensor], keys: Sequence[str] | None = None,
                 layer_types: Sequence[str] = CLIP_LAYER_TYPES, power: float = 2.0) -> dict[str, float]:
    """Inter-layer factors beta_l = (||dW_l||_F / m_type)^power (docs/methods.md §ESM, Eq. (ESM.10)), m_type the
    mean norm over the ``keys`` (default all) of the type (first pattern of ``layer_types`` in the key)."""
    keys = list(updates) if keys is None else list(keys)
    groups: dict[str, list[str]] = {}
    for key in keys:
        ty = next((ty for ty in layer_types if matches(ty, key)), None)  # the first (CLIP's never overlap)
        if ty is not None:
            groups.setdefault(ty, []).append(key)
    betas: dict[str, float] = {}
    for members in groups.values():
        norms = torch.stack([torch.linalg.norm(updates[k].double()) for k in members])
        s = polar_scales(norms, power)
        betas.update({k: float(s[i]) for i, k in enumerate(members)})
    return betas


def polarize_layers(updates: Mapping[str, Tensor], keys: Sequence[str] | None = None,
                    layer_types: Sequence[str] = CLIP_LAYER_TYPES, power: float = 2.0) -> dict[str, Tensor]:
    """Inter-layer polarization, docs/methods.md §ESM, Eq. (ESM.10): every typed key times its beta
    (:func:`layer_scales`); a new dict, untyped keys unchanged. ``power=-1``: the "reciprocal" ablation."""
    betas = layer_scales(updates, keys, layer_types, power)
    return {k: (v * betas[k] if k in betas else v) for k, v in updates.items()}


# --------------------------------------------------------------------------- the method
@register(
    "esm",
    "Essential Subspace Merging: PCA of the activation shift X dW^T per task, polarized "
    "scaling at task, dimension and layer level, whitening (Li et al., CVPR 2026; docs/methods.md §ESM)",
    key_scope=("model", "ESM runs in memory: its inter-layer polarization (Step C) scales each matrix by the norms "
                        "of every layer's merged update, and its proxy activations are held for every ESD layer"),
    per_key=("activations",), data_inputs=("activations", "targets"), needs_layout=True,
    layout_hparams=lambda name: LAYOUT_NAMES.get(name or "", {}),
    search=Search("alpha", "esm", bracket=ESM_BRACKET),
    activations=Param("proxy input activations of every ESD layer, captured in each task's fine-tuned model: "
                      "mapping key -> [X_1..X_T] (N x d_in) or callable (t, key) -> X; required for "
                      "decomposition='esd'", check=check_activations),
    alpha=Param("merge coefficient alpha (docs/methods.md §ESM, Eq. (ESM.11); chosen on validation)", low=0.0,
                check=finite_number),
    alpha_scope=Param("'esd': alpha scales the ESD layers only (evaluation code, default); "
                      "'all': every key (the saved fused model)", choices=("esd", "all")),
    decomposition=Param("'esd': PCA of X dW^T (default); 'svd': left singular vectors of dW "
                        "(the ablation's SVD basis)", choices=_DECOMPOSITIONS),
    task_scaling=Param("inter-task polarization on/off (Step B1)", types=(bool,)),
    task_power=Param("exponent of the inter-task polarization; -1 is the reciprocal ablation",
                     check=finite_number),
    dim_scaling=Param("inter-dimension (input column) polarization on/off (Step B4)", types=(bool,)),
    dim_power=Param("exponent of the inter-dimension polarization", check=finite_number),
    layer_scaling=Param("inter-layer polarization on/off (Step C)", types=(bool,)),
    layer_power=Param("exponent of the inter-layer polarization", check=finite_number),
    eig_power=Param("exponent of the eigenvalue weights e (Step B2; 0 switches them off)", low=0.0,
                    check=finite_number),
    const=Param("constant factor of the ESD product (Step B6; the code's x2)", check=finite_number),
    targets=Param("patterns (regular expressions searched in the key; plain names act as "
                  "substrings) selecting the ESD layers among the matrix keys",
                  check=str_tuple(allow_empty=False)),
    layer_types=Param("patterns of the layer types compared in Step C (same matching)",
                      check=str_tuple(allow_empty=True)),
)
def esm(base: Mapping[str, Tensor], task_vectors: Sequence[Mapping[str, Tensor]], *,
        is_matrix: Callable[[str, Tensor], bool], activations: Any = None, alpha: float = 1.0, alpha_scope: str = "esd",
        decomposition: str = "esd", task_scaling: bool = True, task_power: float = 2.0, dim_scaling: bool = True,
        dim_power: float = 2.0, layer_scaling: bool = True, layer_power: float = 2.0, eig_power: float = 0.15,
        const: float = 2.0, targets: Sequence[str] = DEFAULT_TARGETS, layer_types: Sequence[str] = CLIP_LAYER_TYPES,
        ) -> dict[str, Tensor]:
    r"""ESM merged update for every key (docs/methods.md §ESM; the defaults are the official ViT code's). ESD
    layers (matrix keys matching ``targets``) get :func:`esm_merge_matrix` with ``activations``
    (X_t: the layer's input inside expert t's fine-tuned model), other matrix keys TSV-M, the rest the mean;
    then Step C (:func:`polarize_layers`) and Step D (``alpha``). Targets that match nothing are errors
    (:func:`acetools.merging.inputs.check_targets`; other architectures: :func:`acetools.files.esm_inputs.esm_names`).
    """
    T = len(task_vectors)
    matrix_keys = [k for k in base if is_matrix(k, base[k])]
    if not matrix_keys:  # only 0-d / 1-d tensors (or none on the matrix path): ESM is the mean, as every method
        warnings.warn("esm: the model has no matrix key (every tensor is 0-d or 1-d, or off the layout's matrix "
                      "path), so there is no layer for ESM's subspaces: every key takes the mean update (1/T) sum_t "
                      "tau_t, as in every other method", RuntimeWarning, stacklevel=3)
        return {key: alpha * mean_update(task_vectors, key) if alpha_scope == "all" else mean_update(task_vectors, key)
                for key in base}
    if decomposition == "esd" and activations is None:
        raise InputTypeError("esm: missing hyperparameter 'activations' (needed for decomposition='esd'): pass a "
                             "mapping key -> [X_1..X_T] or a callable (t, key) -> X of input activations captured in "
                             "each fine-tuned model (acetools.files.activations.capture_inputs), or use "
                             "decomposition='svd'")
    esd_keys = check_targets(base, matrix_keys, targets, activations if decomposition == "esd" else None,
                             layer_types if layer_scaling else ())
    get_X = None if decomposition != "esd" else activation_source(activations, esd_keys, T,
                                                                  {k: base[k].shape[1] for k in esd_keys})
    esd_set, matrix_set = set(esd_keys), set(matrix_keys)
    notes: list[tuple[str, str]] = []  # (layer, rank note): one warning per merge, naming the other layers

    def merged(taus: list[Tensor], key: str) -> Tensor:  # an ESD layer (Steps A-B), else TSV-M
        if key not in esd_set:
            return tsv_merge_matrix(taus, key=key)
        Xs = [get_X(t, key) for t in range(T)] if get_X is not None else None  # T x (N_t, d_in)
        try:
            return esm_merge_matrix(taus, Xs, decomposition=decomposition, task_scaling=task_scaling,
                                    task_power=task_power, dim_scaling=dim_scaling, dim_power=dim_power,
                                    eig_power=eig_power, const=const, name=key, notes=notes)
        except (RuntimeError, ArithmeticError, ValueError) as e:  # torch's and numpy's LinAlgError among them
            if str(e).startswith("esm: "):
                raise
            raise esd_failure(key, taus, Xs, e) from e  # the key and the likely cause

    out = matrix_or_mean("esm", base, task_vectors, lambda k, w: k in matrix_set, merged, "esm")
    if notes:
        more = f" [and {len(notes) - 1} more like it: {', '.join(n for n, _ in notes[1:])}]" if notes[1:] else ""
        warnings.warn(notes[0][1] + more, RuntimeWarning, stacklevel=2)
    if layer_scaling:
        out = polarize_layers(out, keys=matrix_keys, layer_types=layer_types, power=layer_power)
    for key in esd_keys if alpha_scope == "esd" else list(out):  # Step D
        out[key] = alpha * out[key]
    return out
