"""Non-persistent buffers that one side of a merge saved and the other did not (docs/your-models.md §What can be
read, "Files as today's transformers writes them").

``transformers`` computes some buffers from the config when it builds a model (``persistent=False``): BERT's
``embeddings.position_ids``, GPT-2's causal mask ``attn.bias``, LLaMA's ``rotary_emb.inv_freq``. Older
versions saved them, transformers 5 does not. :data:`NON_PERSISTENT_BUFFERS` names them, in this one place;
:func:`carry_missing_buffers` gives every model those of them that another model has. Any other missing key
stays an error (:func:`acetools.files.checkpoints.check_compatible`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import torch

from ..layouts import TensorMeta
from .checkpoints import Checkpoint
from .heads import CheckpointView

__all__ = ["NON_PERSISTENT_BUFFERS", "is_non_persistent", "non_persistent", "carry_missing_buffers"]

log = logging.getLogger("acetools.files.buffers")

#: ``(pattern searched in the key, dtype kinds, ranks or None for any, what it is)``: a key is a non-persistent
#: buffer when it matches one rule's pattern, dtype kind ("int", "bool", "float") and rank; nothing else is.
NON_PERSISTENT_BUFFERS: tuple[tuple[str, tuple[str, ...], tuple[int, ...] | None, str], ...] = (
    (r"(^|\.)position_ids$", ("int",), (1, 2), "position ids (arange) of BERT, RoBERTa, ELECTRA, CLIP embeddings"),
    (r"(^|\.)token_type_ids$", ("int",), (1, 2), "BERT's and RoBERTa's all-zero token-type ids"),
    (r"(^|\.)(attn|attention|crossattention)\.bias$", ("bool", "int", "float"), (4,),
     "the causal mask (1 x 1 x n x n) of GPT-2, GPT-Neo, GPT-J"),
    (r"(^|\.)masked_bias$", ("float",), (0,), "GPT-2's and GPT-Neo's masked_bias (-1e4)"),
    (r"(^|\.)rotary_emb\.(inv_freq|cos_cached|sin_cached)$", ("float",), None, "rotary caches (LLaMA, GPT-NeoX)"),
)


def is_non_persistent(key: str, meta: TensorMeta) -> bool:
    """Whether ``key`` (of this shape and dtype) is a non-persistent buffer (:data:`NON_PERSISTENT_BUFFERS`)."""
    dt = meta.dtype
    kind = "bool" if dt == torch.bool else "float" if dt.is_floating_point else "int"
    return any(kind in kinds and (ndims is None or len(meta.shape) in ndims) and re.search(pattern, key)
               for pattern, kinds, ndims, _ in NON_PERSISTENT_BUFFERS)


def non_persistent(ck: Checkpoint) -> list[str]:
    """The keys of ``ck`` that are non-persistent buffers: carried from the base, never merged (a float mask
    would count in TIES' global trim)."""
    return [k for k, m in ck.metas().items() if is_non_persistent(k, m)]


def carry_missing_buffers(base: Checkpoint, experts: Sequence[Checkpoint], *, who: Sequence[str] | None = None
                          ) -> tuple[Checkpoint, list[Checkpoint], dict[str, str]]:
    """``(base, experts, carried)``: each model given the non-persistent buffers it lacks and another model has
    (the base's value when the base has the key, else the first expert's that has it), one log line per set
    of keys lacking; ``carried`` maps each key to its source (``"the base"``, ``"expert <i>"``). ``who``: the
    experts' names in that line."""
    models = [base, *experts]
    names = ["the base", *(who or (f"expert {i} ({ck.path})" for i, ck in enumerate(experts)))]
    everywhere = set.intersection(*(set(ck.keys()) for ck in models))
    first: dict[str, int] = {}  # key -> the first model that has it (0: the base)
    for i, ck in enumerate(models):
        for k in ck.keys():
            if k not in everywhere and k not in first and is_non_persistent(k, ck.meta(k)):
                first[k] = i
    carried = {k: "the base" if i == 0 else f"expert {i - 1}" for k, i in first.items()}
    lacking: dict[tuple[str, ...], list[int]] = {}  # keys lacking -> the models that lack them
    for i, ck in enumerate(models):
        if add := {k: models[j] for k, j in first.items() if k not in ck}:
            lacking.setdefault(tuple(add), []).append(i)
            models[i] = CheckpointView(ck, (), extra=add)
    for keys, where in lacking.items():
        more = f" (and {len(keys) - 2} more)" if len(keys) > 2 else ""
        log.info("buffer%s %s%s missing from %s (non-persistent: transformers 5 saves none, and recomputes them at "
                 "load time): carried from %s", "s" * (len(keys) > 1), ", ".join(map(repr, keys[:2])), more,
                 ", ".join(names[i] for i in where), " and ".join(sorted({carried[k] for k in keys})))
    return models[0], models[1:], carried
