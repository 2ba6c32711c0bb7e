"""Layouts: what each weight of a checkpoint is, for every merge method (docs/your-models.md §Layouts).

A :class:`Layout` gives each key a role (``matrix``, ``embedding``, ``head``, ``other``,
``buffer``), an orientation (``out_in`` or GPT-2's ``in_out``: transposed to d_out x d_in before
a method sees it), tied keys (merged once) and the task-head keys of a classifier. Presets:
:data:`PRESETS` (``architectures.json``; docs/your-models.md §Presets); :func:`detect_layout` picks one from a config or
the key names, :func:`default_layout` is what ``acetools.merge()`` and ``acetools merge`` use.
The ``open_clip`` preset is the official TSV/Iso/ESM/ACE rule: every 2-D float tensor except
``text_projection`` takes the matrix path, as stored.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .errors import InputError, InputTypeError

__all__ = ["TensorMeta", "Layout", "PRESETS", "get_layout", "detect_layout", "is_classifier",
           "CLASSIFIER_ARCHITECTURES", "describe", "format_table", "default_layout", "BASE_MODEL_PREFIXES",
           "base_model_prefix", "PrefixAlignment", "align_prefix"]

log = logging.getLogger("acetools.layouts")


class TensorMeta(NamedTuple):
    """Shape and dtype of a tensor that is not loaded (what a checkpoint header says)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _meta(tensor: Tensor | TensorMeta) -> TensorMeta:
    if isinstance(tensor, TensorMeta):
        return tensor
    if isinstance(tensor, Tensor):
        return TensorMeta(tuple(tensor.shape), tensor.dtype)
    raise InputTypeError(f"expected a torch.Tensor or a TensorMeta, got {type(tensor).__name__}")


def _any(patterns: Sequence[str], key: str) -> bool:
    return any(re.search(p, key) for p in patterns)


def _compiled_check(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise InputTypeError(f"Layout.{name} must be a tuple of regular expressions, got {value!r}")
    for p in value:
        try:
            re.compile(p)
        except re.error as e:
            raise InputError(f"Layout.{name}: {p!r} is not a regular expression ({e})") from None
    return tuple(value)


@dataclass(frozen=True)
class Layout:
    """Per-key role, orientation and ties of one architecture; patterns are ``re.search``-ed in the key.

    A float tensor's role: ``embedding``, then ``head`` patterns, then ``matrix`` if 2-D, matching
    ``matrix`` (default every key) and no ``not_matrix``; else ``other``. ``matrix_embeddings`` /
    ``matrix_heads`` send 2-D embeddings / heads down the matrix path. ``tie_rules``: (alias, canonical)
    pattern pairs that :meth:`bind` resolves into :attr:`tied`.
    """

    name: str
    embedding: tuple[str, ...] = ()
    head: tuple[str, ...] = ()
    matrix: tuple[str, ...] = ()
    not_matrix: tuple[str, ...] = ()
    in_out: tuple[str, ...] = ()
    tie_rules: tuple[tuple[str, str], ...] = ()
    matrix_embeddings: bool = False
    matrix_heads: bool = False
    tied: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    task_heads: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("embedding", "head", "matrix", "not_matrix", "in_out", "task_heads"):
            object.__setattr__(self, name, _compiled_check(getattr(self, name), name))
        rules = tuple(tuple(r) for r in self.tie_rules)
        if any(len(r) != 2 for r in rules):
            raise InputError("Layout.tie_rules must be (alias pattern, canonical pattern) pairs")
        object.__setattr__(self, "tie_rules", rules)
        object.__setattr__(self, "tied", dict(self.tied))

    # ------------------------------------------------------------------ per key
    def role(self, key: str, tensor: Tensor | TensorMeta) -> str:
        """``"matrix"``, ``"embedding"``, ``"head"``, ``"other"`` or ``"buffer"`` for ``key``."""
        m = _meta(tensor)
        if not m.dtype.is_floating_point:
            return "buffer"
        if _any(self.embedding, key):
            return "embedding"
        if _any(self.head, key):
            return "head"
        if m.ndim == 2 and (not self.matrix or _any(self.matrix, key)) and not _any(self.not_matrix, key):
            return "matrix"
        return "other"

    def is_matrix(self, key: str, tensor: Tensor | TensorMeta) -> bool:
        """Whether ``key`` takes the method's matrix path (the ``is_matrix`` of every method)."""
        r = self.role(key, tensor)
        if r == "matrix":
            return True
        if _meta(tensor).ndim != 2:
            return False
        return (r == "embedding" and self.matrix_embeddings) or (r == "head" and self.matrix_heads)

    def task_head_keys(self, keys: Iterable[str]) -> list[str]:
        """The keys (of ``keys``, in their order) that match a :attr:`task_heads` pattern."""
        return [k for k in keys if _any(self.task_heads, k)]

    def orientation(self, key: str) -> str:
        """``"in_out"`` for keys stored d_in x d_out (GPT-2 ``Conv1D``), else ``"out_in"``."""
        return "in_out" if _any(self.in_out, key) else "out_in"

    def to_canonical(self, key: str, t: Tensor) -> Tensor:
        """``t`` as d_out x d_in: transposed when ``key`` is stored in x out (a view)."""
        return t.T if t.ndim == 2 and self.orientation(key) == "in_out" else t

    def from_canonical(self, key: str, t: Tensor) -> Tensor:
        """Back to the stored orientation (the inverse of :meth:`to_canonical`)."""
        return self.to_canonical(key, t)

    # ------------------------------------------------------------------ whole checkpoint
    def bind(self, keys: Iterable[str], config: Mapping[str, Any] | None = None) -> Layout:
        """This layout with :attr:`tied` resolved against ``keys``: a rule applies when exactly one key
        matches each side and the config does not say ``tie_word_embeddings: false`` (candidates: the
        merge driver checks the tensors are equal)."""
        keys = list(keys)
        tied = dict(self.tied)
        if config is None or config.get("tie_word_embeddings", True):
            for alias_p, canon_p in self.tie_rules:
                aliases = [k for k in keys if re.search(alias_p, k)]
                canons = [k for k in keys if re.search(canon_p, k)]
                if len(aliases) == 1 and len(canons) == 1 and aliases[0] != canons[0]:
                    tied[aliases[0]] = canons[0]
        for alias, canon in tied.items():
            if canon in tied:
                raise InputError(f"Layout {self.name!r}: tied key {alias!r} -> {canon!r} points at another alias")
        return dataclasses.replace(self, tied=tied)


def _suffix(*names: str) -> str:
    """A pattern matching keys whose dotted name contains one of ``names`` as a component."""
    return r"(^|\.)(" + "|".join(re.escape(n) for n in names) + r")(\.|$)"


def _preset(name: str, spec: Mapping[str, Any]) -> Layout:
    """A preset of ``architectures.json``: a pattern is a regular expression, or a list of names (:func:`_suffix`)."""
    def patterns(field: str) -> tuple[str, ...]:
        return tuple(p if isinstance(p, str) else _suffix(*p) for p in spec.get(field, ()))

    fields = ("embedding", "head", "matrix", "not_matrix", "in_out", "task_heads")
    return Layout(name, **{f: patterns(f) for f in fields}, tie_rules=tuple(map(tuple, spec.get("tie_rules", ()))),
                  **{k: spec[k] for k in ("matrix_embeddings", "matrix_heads", "description") if k in spec})


#: The presets, their config and key names, a data file beside this module (docs/your-models.md §Presets).
_DATA: dict[str, Any] = json.loads(Path(__file__).with_name("architectures.json").read_text(encoding="utf-8"))
PRESETS: dict[str, Layout] = {name: _preset(name, spec) for name, spec in _DATA["presets"].items()}
_MODEL_TYPES: dict[str, str] = _DATA["model_types"]


def detect_layout(keys: Iterable[str], config: Mapping[str, Any] | None = None) -> str | None:
    """The preset name of a checkpoint from its config (``model_type``, ``architectures``) or keys; None if unknown."""
    if config:
        if "model_cfg" in config and "vision_cfg" in config.get("model_cfg", {}):
            return "open_clip"  # open_clip_config.json
        mt = str(config.get("model_type", "")).lower()
        if mt in _MODEL_TYPES:
            return _MODEL_TYPES[mt]
        for arch in config.get("architectures") or ():
            a = str(arch).lower()
            for prefix, name in _DATA["architecture_prefixes"]:
                if a.startswith(prefix):
                    return name
    keys = list(keys)

    def has(pattern: str) -> bool:
        return any(re.search(pattern, k) for k in keys)

    if has(r"(^|\.)(c_attn|q_attn)\.weight$") or (has(r"(^|\.)wte\.weight$") and has(r"(^|\.)h\.\d+\.")):
        return "gpt2"
    if has(r"(^|\.)resblocks\.\d+\.") or has(r"(^|\.)(text_projection|positional_embedding)$"):
        return "open_clip"
    if (has(r"(^|\.)(vision_model|text_model)\.") or has(r"(^|\.)visual_projection\.weight$")
            or has(r"(^|\.)pre_layrnorm\.")):  # a bare CLIPVisionModel/CLIPTextModel state dict
        return "hf_clip"
    if has(r"(^|\.)embeddings\.word_embeddings\.weight$") or has(r"(^|\.)attention\.self\.query\.weight$"):
        return "bert"
    if has(r"(^|\.)mlp\.gate_proj\.weight$") or has(r"(^|\.)embed_tokens\.weight$"):
        return "llama"
    return None


#: Hugging Face class-name endings of models with one output head per task, shaped by ``num_labels``.
CLASSIFIER_ARCHITECTURES = ("ForSequenceClassification", "ForTokenClassification", "ForImageClassification")


def is_classifier(keys: Iterable[str], config: Mapping[str, Any] | None, layout: Layout) -> bool:
    """Whether a checkpoint is a classifier with its own task heads: from the config's ``architectures``
    (:data:`CLASSIFIER_ARCHITECTURES`), else whether a key matches the layout's ``task_heads``."""
    archs = [str(a) for a in (config or {}).get("architectures") or ()]
    if archs:
        return any(a.endswith(CLASSIFIER_ARCHITECTURES) for a in archs)
    return bool(layout.task_head_keys(keys))


def get_layout(layout: str | Layout | None = "auto", *, keys: Iterable[str] | None = None,
               config: Mapping[str, Any] | None = None, fallback: str = "open_clip", force: bool = False) -> Layout:
    """A bound :class:`Layout` from a preset name, a Layout, ``"auto"`` or ``None``.

    ``"auto"``/``None`` detect the preset (:func:`detect_layout`), else ``fallback`` (logged). With
    ``keys`` the tie rules are resolved. A preset that contradicts ``config`` is an error unless ``force``.
    """
    keys = list(keys) if keys is not None else None
    if isinstance(layout, Layout):
        lay = layout
    elif layout is None or layout == "auto":
        name = detect_layout(keys or (), config)
        if name is None:
            log.info("layout: no preset recognised from the config or key names; using %r", fallback)
            name = fallback
        else:
            log.info("layout: detected %r", name)
        lay = PRESETS[name]
    elif isinstance(layout, str):
        if layout not in PRESETS:
            raise InputError(f"unknown layout {layout!r}; valid layouts are: auto, {', '.join(PRESETS)}")
        said = detect_layout((), config) if config else None
        if config and said is not None and said != layout and not force:
            what = config.get("model_type") or (config.get("architectures") or ["?"])[0]
            raise InputError(
                f"layout {layout!r} contradicts the checkpoint's config.json (model_type/architecture {what!r}, "
                f"i.e. layout {said!r}); drop --layout to use {said!r}, or, if the config is wrong, force it "
                "(acetools merge --force-layout; force=True in Python)"
            )
        lay = PRESETS[layout]
    else:
        raise InputTypeError(f"layout must be a preset name, 'auto' or a Layout, got {type(layout).__name__}")
    return lay.bind(keys, config) if keys is not None else lay


def default_layout(keys: Iterable[str], config: Mapping[str, Any] | None = None) -> Layout:
    """The layout ``acetools.merge()`` and ``acetools merge`` use when none is given: :func:`detect_layout`,
    else the official code's ``open_clip`` rule (docs/your-models.md §Layouts)."""
    return get_layout("auto", keys=list(keys), config=config)


#: transformers' ``base_model_prefix`` per ``model_type``: a task model's prefix of its backbone's keys.
BASE_MODEL_PREFIXES: dict[str, str] = _DATA["base_model_prefixes"]


def base_model_prefix(config: Mapping[str, Any] | None) -> str | None:
    """The backbone's key prefix (:data:`BASE_MODEL_PREFIXES`) from a config's ``model_type``, else
    from its ``architectures`` (``BertForSequenceClassification`` -> ``bert``); ``None`` if unknown."""
    if not config:
        return None
    mt = str(config.get("model_type", "")).lower()
    if mt in BASE_MODEL_PREFIXES:
        return BASE_MODEL_PREFIXES[mt]
    for arch in config.get("architectures") or ():
        a = str(arch).lower()
        for name in sorted(BASE_MODEL_PREFIXES, key=len, reverse=True):
            if a.startswith(name.replace("-", "")):
                return BASE_MODEL_PREFIXES[name]
    return None


@dataclass(frozen=True)
class PrefixAlignment:
    """How the base's keys map onto the experts' (:func:`align_prefix`): ``side`` is the bare backbone
    (``"base"`` or ``"experts"``), ``rename`` maps an expert's key to the base's, ``dropped`` the base
    keys outside the prefix."""

    prefix: str
    side: str
    rename: Mapping[str, str]
    dropped: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the dry run."""
        if self.side == "base":
            return (f"keys: the base is a bare backbone; its keys are read as the experts' {self.prefix + '.'!r}"
                    " keys (base_model_prefix)")
        return (f"keys: the experts are bare backbones; the base's {self.prefix + '.'!r} keys are read without the "
                f"prefix (base_model_prefix)" + (f", {len(self.dropped)} base key(s) outside it left out"
                                                 if self.dropped else ""))


def _prefixes(keys: Sequence[str]) -> list[str]:
    """The first dotted components shared by at least half of ``keys`` (candidate prefixes)."""
    counts = Counter(k.split(".", 1)[0] for k in keys if "." in k)
    return [p for p, n in counts.items() if n * 2 >= len(keys)]


def _strip(keys: Sequence[str], prefix: str) -> dict[str, str]:
    """``{key without prefix: key}`` for the keys under ``prefix + "."``."""
    p = prefix + "."
    return {k[len(p):]: k for k in keys if k.startswith(p)}


def align_prefix(base_keys: Iterable[str], expert_keys: Iterable[str], *,
                 base_config: Mapping[str, Any] | None = None,
                 expert_config: Mapping[str, Any] | None = None) -> PrefixAlignment | None:
    """Match a bare backbone with a task model through the base-model prefix (docs/your-models.md §Bare
    backbones and task models); None when the keys already match or no prefix makes them.

    Candidates: the configs' prefix, then a first key component of at least half of one side's keys;
    taken when, under it, one side covers at least half of the other's keys.
    """
    base_keys, expert_keys = list(base_keys), list(expert_keys)
    bset, eset = set(base_keys), set(expert_keys)
    if not bset or not eset or len(bset & eset) * 2 >= min(len(bset), len(eset)):
        return None
    from_config = [p for p in (base_model_prefix(expert_config), base_model_prefix(base_config)) if p]
    candidates = list(dict.fromkeys(from_config + _prefixes(expert_keys) + _prefixes(base_keys)))
    for prefix in candidates:
        under = _strip(expert_keys, prefix)  # the base is bare: expert key = prefix + base key
        if under and len(set(under) & bset) * 2 >= len(bset):
            rename = {f"{prefix}.{k}": k for k in base_keys}
            return PrefixAlignment(prefix, "base", rename)
        under = _strip(base_keys, prefix)  # the experts are bare: base key = prefix + expert key
        if under and len(set(under) & eset) * 2 >= len(eset):
            outside = [k for k in base_keys if not k.startswith(prefix + ".")]
            rename = {**under, **{k: k for k in outside if k in eset and k not in under}}
            return PrefixAlignment(prefix, "experts", rename, tuple(k for k in outside if k not in rename))
    return None


def describe(layout: Layout, tensors: Mapping[str, Tensor | TensorMeta]) -> list[dict[str, Any]]:
    """Rows ``{key, shape, dtype, role, orientation, path}``; ``path``: ``matrix``, ``elementwise``,
    ``carried from base`` or ``tied to <key>``."""
    rows = []
    for key, t in tensors.items():
        m = _meta(t)
        rows.append({
            "key": key,
            "shape": "x".join(map(str, m.shape)) or "scalar",
            "dtype": str(m.dtype).replace("torch.", ""),
            "role": layout.role(key, m),
            "orientation": layout.orientation(key) if m.ndim == 2 else "",
            "path": f"tied to {layout.tied[key]}" if key in layout.tied else "carried from base"
            if not m.dtype.is_floating_point else "matrix" if layout.is_matrix(key, m) else "elementwise",
        })
    return rows


def format_table(rows: Sequence[Mapping[str, Any]],
                 columns: Sequence[str] = ("key", "shape", "dtype", "role", "orientation", "path")) -> str:
    """A plain-text table of :func:`describe` rows (for the CLI's ``--dry-run``)."""
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
