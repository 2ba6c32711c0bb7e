"""ESM's proxy activations for your own model, captured inside each expert (docs/your-models.md §ESM on your
own model, end to end; docs/methods.md §ESM); ``acetools merge`` or ``acetools.merge("esm", ...)`` takes them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..errors import InputError, InputKeyError, InputTypeError
from ..layouts import get_layout
from ..merging.esm import LAYOUT_NAMES
from .activations import capture_inputs
from .checkpoints import open_checkpoint

__all__ = ["ESM_NAMES", "esm_names", "esm_activations"]

log = logging.getLogger("acetools.files.esm_inputs")


#: Per layout preset: ESM's ESD targets and Step-C layer types (:data:`acetools.merging.esm.LAYOUT_NAMES`,
#: which ``merge("esm", ..., layout=...)`` uses by default).
ESM_NAMES = LAYOUT_NAMES


def esm_names(layout: Any) -> dict[str, tuple[str, ...]]:
    """``{"targets": ..., "layer_types": ...}`` for ``layout`` (a preset name or Layout), to pass to
    ``merge("esm", ..., **esm_names(layout))``; the ``generic`` layout has none."""
    name = layout if isinstance(layout, str) else getattr(layout, "name", None)
    if name not in ESM_NAMES:
        raise InputError(
            f"ESM has no default layer names for layout {name!r} (known: {', '.join(ESM_NAMES)}); pass targets= "
            "and layer_types= (regular expressions searched in the weight keys) yourself"
        )
    return {k: tuple(v) for k, v in ESM_NAMES[name].items()}


def _materialise(item: Any, factory: Callable[[], nn.Module] | None, prefix: str, where: str) -> nn.Module:
    """An ``nn.Module`` from a module, a zero-argument factory, or a state dict / file (+ ``factory``)."""
    if isinstance(item, nn.Module):
        return item
    if isinstance(item, (str, os.PathLike)):
        item = open_checkpoint(item).state_dict()
    if isinstance(item, Mapping):
        if factory is None:
            raise InputTypeError(f"{where} is a state dict or file: pass factory= (a callable returning the model's "
                            "nn.Module) to load it into")
        model = factory()
        own = {k[len(prefix):]: v for k, v in item.items() if k.startswith(prefix)}  # the names in the module
        missing, unexpected = model.load_state_dict(own, strict=False)
        # tied aliases (GPT-2's lm_head.weight = transformer.wte.weight) are keys no parameter is named by: HF
        # stores them once, so they are not missing
        tied = set(model.state_dict()) - {n for n, _ in [*model.named_parameters(), *model.named_buffers()]}
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            bad = (missing or unexpected)[0]
            raise InputKeyError(f"{where} does not fit the factory's model: key {bad!r} is "
                           f"{'missing from the checkpoint' if missing else 'not in the model'} "
                           f"({len(missing)} missing, {len(unexpected)} unexpected; prefix={prefix!r})")
        return model
    if callable(item):
        model = item()
        if not isinstance(model, nn.Module):
            raise InputTypeError(f"{where}: the factory returned a {type(model).__name__}, not a torch.nn.Module")
        return model
    raise InputTypeError(
        f"{where} is a {type(item).__name__}; give an nn.Module, a factory, a state dict or a file path")


def esm_activations(
    experts: Sequence[Any],
    inputs: Tensor | Iterable | Mapping | Callable[[int], Any],
    *,
    keys: Sequence[str] | None = None,
    targets: Sequence[str] | None = None,
    layout: Any = "auto",
    factory: Callable[[], nn.Module] | None = None,
    prefix: str = "",
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, list[Tensor]]:
    """ESM's proxy activations ``{key: [X_1, ..., X_T]}`` for the ``experts``, X_t of width d_in of the
    canonical d_out x d_in matrix, on the CPU in ``dtype``.

    ``experts``: one per fine-tuned model, each an ``nn.Module``, a zero-argument factory returning
    one, or a state dict / checkpoint path loaded into ``factory()`` (strict key check); materialised
    one at a time. ``inputs``: the proxy batch(es) every expert sees (as :func:`capture_inputs` takes
    them), or a callable ``inputs(t)`` giving expert t its own. ``keys``: weight keys to capture (with
    ``prefix`` for a sub-tower, e.g. ``"visual."``); default: the layout's matrix keys matching
    ``targets`` (default :func:`esm_names` of the layout).
    """
    if isinstance(experts, (Mapping, nn.Module, str)) or not isinstance(experts, Sequence) or not experts:
        raise InputTypeError("experts must be a non-empty list (one model, factory, state dict or file per expert)")
    lay = None
    acts: dict[str, list[Tensor]] = {}
    for t, item in enumerate(experts):
        where = f"experts[{t}]"
        model = _materialise(item, factory, prefix, where)
        if lay is None:  # from the first expert: the layout and, by default, the keys
            state = {prefix + k: v for k, v in model.state_dict().items()}
            lay = get_layout(layout, keys=list(state))
            if keys is None:
                pats = tuple(targets) if targets is not None else esm_names(lay)["targets"]
                keys = [k for k, v in state.items() if lay.is_matrix(k, v) and any(re.search(p, k) for p in pats)]
                if not keys:
                    raise InputError(f"no matrix key of the model matches the ESM targets {list(pats)} (layout "
                                     f"{lay.name!r}); pass keys= or targets=")
                log.info("esm_activations: layout %r, %d ESD layers", lay.name, len(keys))
        assert keys is not None, "the keys are given or set from the first expert"
        batch = inputs(t) if callable(inputs) and not isinstance(inputs, (Tensor, nn.Module)) else inputs
        # a callable's result is the caller's (capture_inputs checks what it gets)
        got = capture_inputs(model, cast("Tensor | Iterable", batch), list(keys), batch_size, prefix=prefix,
                             device=device, layout=lay)
        for k in keys:
            acts.setdefault(k, []).append(got[k].to("cpu", dtype))
        del model, got
    return acts

