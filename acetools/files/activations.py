"""Input activations of named linear layers, captured with forward hooks (removed afterwards, also on error).

:func:`capture_inputs` gives the input rows X (N x d_in; ESM's proxy activations, docs/methods.md §ESM),
:func:`gram_matrices` RegMean's (1/N) X^T X (docs/methods.md §RegMean), :func:`input_covariances` the
centred covariances of Theorem 1 (docs/methods.md §ACE). Layers are named by their parameter name
(``...mlp.c_fc.weight`` hooks ``...mlp.c_fc``); an ``nn.MultiheadAttention``'s ``in_proj_weight``
records its query input (``k_proj_weight``/``v_proj_weight`` the key/value). Rows are batch-major.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InputError, InputKeyError, InputTypeError
from ..layouts import Layout, get_layout

__all__ = ["capture_inputs", "gram_matrices", "input_covariances", "layer_input_spec", "TokenStatistics",
           "token_statistics"]

# nn.MultiheadAttention parameters and which forward argument feeds them.
_MHA_INPUTS = {"in_proj_weight": 0, "q_proj_weight": 0, "k_proj_weight": 1, "v_proj_weight": 2}
_MHA_NAMES = ("query", "key", "value")


def layer_input_spec(model: nn.Module, key: str, prefix: str = "") -> tuple[str, nn.Module, int]:
    """Resolve a parameter name to ``(module_name, module, argument_index)``, after stripping ``prefix``
    (e.g. ``"visual."`` for the visual tower); a ``KeyError`` names a missing module or parameter."""
    if not isinstance(key, str):
        raise InputTypeError(f"layer keys must be parameter-name strings, got {type(key).__name__}")
    if prefix and not key.startswith(prefix):
        raise InputKeyError(f"key {key!r} does not start with prefix {prefix!r}")
    name = key[len(prefix):]
    mod_name, _, param = name.rpartition(".")
    try:
        module = model.get_submodule(mod_name) if mod_name else model
    except AttributeError:
        raise InputKeyError(
            f"key {key!r}: the model has no submodule {mod_name!r}; keys are parameter names relative "
            "to the model you pass (use prefix= to strip a leading part such as 'visual.')"
        ) from None
    if getattr(module, param, None) is None or not isinstance(getattr(module, param), Tensor):
        raise InputKeyError(f"key {key!r}: module {mod_name!r} ({type(module).__name__}) has no parameter {param!r}")
    if isinstance(module, nn.MultiheadAttention):
        if param not in _MHA_INPUTS:
            raise InputKeyError(
                f"key {key!r}: only the input projections of nn.MultiheadAttention "
                f"({', '.join(_MHA_INPUTS)}) can be hooked; out_proj is applied inside the functional "
                "attention and never runs as a module"
            )
        return mod_name, module, _MHA_INPUTS[param]
    if param != "weight":
        raise InputKeyError(f"key {key!r}: expected a '.weight' of a linear layer (or an attention input projection)")
    return mod_name, module, 0


def _rows(module: nn.Module, x: Tensor, d_in: int, key: str = "", mask: Tensor | None = None) -> Tensor:
    """Flatten ``x`` to (tokens, d_in) rows, batch-major; its last dim must be ``d_in``. With ``mask`` (B x L)
    a B x L x d_in input keeps only the marked tokens' rows (padding is not a row)."""
    if x.shape[-1] != d_in:
        raise RuntimeError(
            f"layer {key!r} ({type(module).__name__}): its input has width {x.shape[-1]} (shape {tuple(x.shape)}) "
            f"but the weight's d_in is {d_in}; if the weight is stored in x out (GPT-2 Conv1D) or out x in "
            "contrary to its module type, pass layout= (acetools.layouts) so its orientation is known"
        )
    if isinstance(module, nn.MultiheadAttention) and x.ndim == 3 and not module.batch_first:
        x = x.transpose(0, 1)  # (L, B, D) -> (B, L, D)
    if mask is not None and x.ndim == 3 and tuple(x.shape[:2]) == tuple(mask.shape):
        return x.detach()[mask.to(x.device).bool()]
    return x.detach().reshape(-1, d_in)


def _d_in(module: nn.Module, key: str, layout: Layout | None) -> int:
    """d_in of the canonical d_out x d_in matrix: dim 1 of an out x in weight, dim 0 of an in x out one, as
    ``layout`` orients ``key``, else as the module type does (GPT-2 ``Conv1D``: y = x W; ``nn.Linear``: y = x W^T)."""
    W = getattr(module, key.rpartition(".")[2])
    if W.ndim != 2:
        raise InputKeyError(
            f"key {key!r}: the weight has shape {tuple(W.shape)}; only 2-D (linear) weights can be captured")
    in_out = type(module).__name__ == "Conv1D" if layout is None else layout.orientation(key) == "in_out"
    return W.shape[0] if in_out else W.shape[1]


def _batches(inputs, batch_size: int | None) -> Iterator[Tensor | dict[str, Tensor]]:
    if isinstance(inputs, (Tensor, Mapping)):  # one tensor, or one dict of keyword tensors (a tokenizer's output)
        vals = [inputs] if isinstance(inputs, Tensor) else list(inputs.values())
        if not vals or not all(isinstance(v, Tensor) for v in vals):
            raise InputTypeError("a dict of inputs must map argument names to Tensors (e.g. {'input_ids': ...})")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise InputError(f"batch_size={batch_size!r} must be a positive int")
        n = vals[0].shape[0]
        step = max(n if batch_size is None else batch_size, 1)
        for i in range(0, n, step):
            yield inputs[i:i + step] if isinstance(inputs, Tensor) else {k: v[i:i + step] for k, v in inputs.items()}
        return
    if not isinstance(inputs, Iterable):
        raise InputTypeError(f"inputs must be a Tensor or an iterable of batches, got {type(inputs).__name__}")
    for b in inputs:
        if isinstance(b, (tuple, list)):  # (images, labels, ...) from a DataLoader
            b = b[0]
        if isinstance(b, Mapping) and all(isinstance(v, Tensor) for v in b.values()):
            yield dict(b)  # keyword inputs, e.g. a tokenizer's {"input_ids": ..., "attention_mask": ...}
        elif isinstance(b, Tensor):
            yield b
        else:
            raise InputTypeError("each batch must be a Tensor, a dict of Tensors or a (Tensor, ...) tuple, "
                                 f"got {type(b).__name__}")


def _run(model: nn.Module, inputs, keys, prefix, batch_size, device, eval_mode, on_input, layout=None,
         mask_padding: bool = True) -> list[str]:
    """Run ``model`` on every batch with forward pre-hooks that call ``on_input(key, rows)`` (removed, and the
    train/eval modes restored, afterwards); returns the keys. A key whose module never ran is an error."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(keys, str):
        raise InputTypeError("keys must be a list of parameter names, not a single string")
    keys = list(dict.fromkeys(keys))  # drop duplicates, keep order
    if not keys:
        raise InputError("keys is empty: name at least one layer, e.g. '...mlp.c_fc.weight'")
    specs = {key: layer_input_spec(model, key, prefix) for key in keys}
    counts = dict.fromkeys(keys, 0)
    batch: dict[str, Tensor | None] = {}  # the attention mask of the batch being run

    def make_hook(key: str, idx: int, d_in: int):
        def hook(module, args, kwargs):
            if idx < len(args):
                x = args[idx]
            elif _MHA_NAMES[idx] in kwargs and isinstance(module, nn.MultiheadAttention):
                x = kwargs[_MHA_NAMES[idx]]
            elif idx == 0 and "input" in kwargs:
                x = kwargs["input"]
            else:
                raise RuntimeError(f"hook for {key!r}: could not find the layer input among the call's arguments")
            counts[key] += 1
            on_input(key, _rows(module, x, d_in, key, batch.get("mask")))

        return hook

    was_training = {m: m.training for m in model.modules()}
    dev = next((p.device for p in model.parameters()), torch.device("cpu")) if device is None else torch.device(device)
    lay = get_layout(layout) if isinstance(layout, str) else layout
    handles = []
    try:
        for key, (_, module, idx) in specs.items():
            d_in = _d_in(module, key, lay)
            handles.append(module.register_forward_pre_hook(make_hook(key, idx, d_in), with_kwargs=True))
        if eval_mode:
            model.eval()
        n_batches = 0
        with torch.no_grad():
            for x in _batches(inputs, batch_size):
                x = {k: v.to(dev) for k, v in x.items()} if isinstance(x, dict) else x.to(dev)
                mask = x.get("attention_mask") if mask_padding and isinstance(x, dict) else None
                batch["mask"] = mask if isinstance(mask, Tensor) and mask.ndim == 2 else None
                model(**x) if isinstance(x, dict) else model(x)
                n_batches += 1
        if n_batches == 0:
            raise InputError("inputs yielded no batch; give at least one input")
    finally:
        for h in handles:
            h.remove()
        if eval_mode:
            for m, flag in was_training.items():
                m.train(flag)
    silent = [k for k, c in counts.items() if c == 0]
    if silent:
        raise RuntimeError(f"the forward pass never ran the module of {silent[0]!r}"
                           + (f" (and {len(silent) - 1} more)" if len(silent) > 1 else "")
                           + "; its input cannot be captured with a module hook")
    return keys


def capture_inputs(
    model: nn.Module,
    inputs: Tensor | Iterable,
    keys: Sequence[str],
    batch_size: int | None = None,
    *,
    prefix: str = "",
    device: str | torch.device | None = None,
    out_device: str | torch.device = "cpu",
    eval_mode: bool = True,
    layout: Any = None,
    mask_padding: bool = True,
) -> dict[str, Tensor]:
    """Input activations of each named layer, ``{key: X}`` with X of shape N x d_in (ESM's proxy activations
    when ``model`` is task t's fine-tuned model, docs/methods.md §ESM).

    ``inputs``: a tensor (split into chunks of ``batch_size``; all at once if None), a dict of keyword
    tensors (``model(**batch)``, e.g. a tokenizer's output) or an iterable of such batches (or of
    ``(tensor, ...)`` tuples). The model runs under ``torch.no_grad()`` on ``device`` (default: where its
    parameters are), in eval mode unless ``eval_mode=False``. Rows (every token of every sample,
    batch-major) are stored on ``out_device`` in the model's dtype. X has the width d_in of the canonical
    d_out x d_in matrix, oriented by ``layout`` (a name or Layout), else by the module type (``Conv1D``
    in x out). A keyword batch's ``attention_mask`` leaves padding tokens out of every B x L x d_in
    input (``mask_padding=False`` keeps them).
    """
    chunks: dict[str, list[Tensor]] = {}

    def on_input(key: str, rows: Tensor) -> None:
        chunks.setdefault(key, []).append(rows.to(out_device))

    keys = _run(model, inputs, keys, prefix, batch_size, device, eval_mode, on_input, layout, mask_padding)
    return {k: torch.cat(chunks[k]) for k in keys}


def gram_matrices(
    model: nn.Module,
    batches: Tensor | Iterable,
    keys: Sequence[str],
    batch_size: int | None = None,
    *,
    prefix: str = "",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float64,
    eval_mode: bool = True,
    layout: Any = None,
    mask_padding: bool = True,
) -> dict[str, Tensor]:
    """RegMean Gram matrices G = (1/N) X^T X (d_in x d_in) per layer, docs/methods.md §RegMean: summed in
    ``dtype`` over batches without storing X, divided once by the row count N. Run it on task t's
    fine-tuned model with task-t data; arguments as in :func:`capture_inputs`."""
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = {}

    def on_input(key: str, rows: Tensor) -> None:
        r = rows.to(dtype)
        g = r.T @ r
        sums[key] = g if key not in sums else sums[key] + g
        counts[key] = counts.get(key, 0) + r.shape[0]

    keys = _run(model, batches, keys, prefix, batch_size, device, eval_mode, on_input, layout, mask_padding)
    return {k: (sums[k] / counts[k]).cpu() for k in keys}


def input_covariances(
    model: nn.Module,
    batches: Tensor | Iterable,
    keys: Sequence[str],
    batch_size: int | None = None,
    *,
    prefix: str = "",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float64,
    unbiased: bool = False,
    eval_mode: bool = True,
    layout: Any = None,
    mask_padding: bool = True,
) -> dict[str, Tensor]:
    """Centred input covariance Sigma = (1/N) sum (x - mu)(x - mu)^T per layer (d_in x d_in), the one of
    Theorem 1 (docs/methods.md §ACE); merged batch by batch with Chan's update in ``dtype``, so no X is
    stored. ``unbiased=True`` divides by N - 1."""
    state: dict[str, tuple[int, Tensor, Tensor]] = {}

    def on_input(key: str, rows: Tensor) -> None:
        r = rows.to(dtype)
        nb = r.shape[0]
        if nb == 0:
            return
        mb = r.mean(0)
        c = r - mb
        Mb = c.T @ c
        if key not in state:
            state[key] = (nb, mb, Mb)
            return
        na, ma, Ma = state[key]
        n = na + nb
        d = mb - ma
        state[key] = (n, ma + d * (nb / n), Ma + Mb + torch.outer(d, d) * (na * nb / n))

    keys = _run(model, batches, keys, prefix, batch_size, device, eval_mode, on_input, layout, mask_padding)
    out = {}
    for k in keys:
        n, _, M = state[k]
        denom = n - 1 if unbiased else n
        if denom < 1:
            raise InputError(f"input_covariances: layer {k!r} saw {n} rows; unbiased=True needs at least 2")
        out[k] = (M / denom).cpu()
    return out


@dataclass(frozen=True)
class TokenStatistics:
    """A layer's input rows split into what every token shares and what a task brings (:func:`token_statistics`;
    docs/regime.md). ``raw``: the uncentred Gram; ``centred``: the patch rows' covariance about each
    position's mean; the shares of E‖x‖² in the global mean, the positional component, the residual, the CLS rows."""

    raw: Tensor
    centred: Tensor
    mean_share: float
    pos_share: float
    resid_share: float
    cls_share: float
    n_tokens: int


def token_statistics(X: Tensor, n_samples: int, *, cls_token: bool = True) -> TokenStatistics:
    """Centred, token-aware statistics of one layer's input rows ``X`` (``n_samples · L`` × d, batch-major as
    :func:`capture_inputs` returns them; with ``cls_token`` token 0 is the class token), in float64.

    With μ the mean over every row and μ_l the mean of position l: E‖x‖² = ‖μ‖² + mean_l ‖μ_l − μ‖² +
    E‖x − μ_l‖² exactly, reported as shares of E‖x‖²; ``centred`` leaves the first two (which every
    task shares) and the CLS rows out."""
    if X.ndim != 2 or n_samples < 1 or X.shape[0] % n_samples:
        raise InputError(f"token_statistics: X of shape {tuple(X.shape)} is not n_samples={n_samples} blocks of tokens")
    L = X.shape[0] // n_samples
    if cls_token and L < 2:
        raise InputError(f"token_statistics: {L} token per sample, no patch token beside the class token")
    x = X.double().reshape(n_samples, L, X.shape[1])
    total = float(x.pow(2).sum(-1).mean())
    mu = x.reshape(-1, x.shape[-1]).mean(0)
    mu_l = x.mean(0)  # L x d
    pos = float((mu_l - mu).pow(2).sum(-1).mean())
    resid = x - mu_l
    patches = resid[:, 1:] if cls_token else resid
    r = patches.reshape(-1, x.shape[-1])
    raw = (x.reshape(-1, x.shape[-1]).T @ x.reshape(-1, x.shape[-1])) / (n_samples * L)
    cls = float(x[:, 0].pow(2).sum(-1).mean()) / L if cls_token else 0.0
    denom = total if total > 0 else math.nan
    return TokenStatistics(raw=raw, centred=(r.T @ r) / r.shape[0], mean_share=float(mu.pow(2).sum()) / denom,
                           pos_share=pos / denom, resid_share=float(resid.pow(2).sum(-1).mean()) / denom,
                           cls_share=cls / denom, n_tokens=L)
