"""Weight keys of transformer checkpoints: block index, layer type and a short label.

A key inside a block reads ``<prefix>.<container>.<i>.<layer type>`` with the container one of
:data:`BLOCK_CONTAINERS` (open_clip ``resblocks``, HF CLIP / LLaMA ``layers``, BERT ``layer``,
GPT-2 ``h``, timm ``blocks``); the first match counts. Keys outside the blocks have no block and
lose only open_clip's ``visual.`` prefix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from .errors import InputError

__all__ = ["BLOCK_CONTAINERS", "SHORT_NAMES", "KeyParts", "parse_key", "block_index", "layer_type", "short_name",
           "short_label"]

_NAMES = json.loads(Path(__file__).with_name("architectures.json").read_text(encoding="utf-8"))
#: Names of the module lists that hold a model's transformer blocks (see the module docstring).
BLOCK_CONTAINERS: tuple[str, ...] = tuple(_NAMES["block_containers"])

_BLOCK = re.compile(r"(?:^|\.)(?:" + "|".join(map(re.escape, BLOCK_CONTAINERS)) + r")\.(\d+)\.(.+)$")

#: Short names of layer types for labels (a name shared across layouts means the same layer; GPT-2's two
#: ``c_proj`` and BERT's three ``dense`` get names that say which), from ``architectures.json``.
SHORT_NAMES: dict[str, str] = _NAMES["short_names"]


@dataclass(frozen=True)
class KeyParts:
    """A parsed weight key: ``block`` (``None`` outside the blocks) and ``layer_type`` (the
    part after the block index, or the key without ``visual.`` outside the blocks)."""

    key: str
    block: int | None
    layer_type: str


def parse_key(key: str) -> KeyParts:
    """``visual.transformer.resblocks.3.mlp.c_fc.weight`` -> ``KeyParts(key, 3, "mlp.c_fc.weight")``;
    ``visual.positional_embedding`` -> ``KeyParts(key, None, "positional_embedding")``."""
    m = _BLOCK.search(key)
    if m:
        return KeyParts(key, int(m.group(1)), m.group(2))
    return KeyParts(key, None, key[len("visual."):] if key.startswith("visual.") else key)


@overload
def block_index(key: str) -> int | None: ...
@overload
def block_index(key: str, default: int) -> int: ...
@overload
def block_index(key: str, default: int | None) -> int | None: ...
def block_index(key: str, default: int | None = None) -> int | None:
    """The transformer block of a key (``...resblocks.3...`` -> 3; ``model.layers.3...`` -> 3);
    ``default`` outside the blocks."""
    b = parse_key(key).block
    return default if b is None else b


def layer_type(key: str) -> str:
    """A parameter's type with its block index removed: ``visual.transformer.resblocks.3.mlp.c_fc.weight``
    -> ``mlp.c_fc.weight`` (keys outside the blocks lose only a leading ``visual.``)."""
    return parse_key(key).layer_type


def short_name(layer_type: str) -> str:
    """The label of a layer type (:data:`SHORT_NAMES`), else the type itself."""
    return SHORT_NAMES.get(layer_type, layer_type)


def short_label(key: str, style: Literal["dot", "b"] = "dot") -> str:
    """A compact layer name for plots: ``"dot"`` ``3.c_fc`` / ``pos_emb`` (other types keep their name),
    ``"b"`` ``b3 c_fc`` (the full key for anything but a named matrix inside a block)."""
    p = parse_key(key)
    if style == "dot":
        name = short_name(p.layer_type)
        return name if p.block is None else f"{p.block}.{name}"
    if style == "b":
        if p.block is None or p.layer_type not in SHORT_NAMES:
            return key
        return f"b{p.block} {SHORT_NAMES[p.layer_type]}"
    raise InputError(f"unknown label style {style!r}; styles: 'dot', 'b'")
