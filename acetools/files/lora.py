"""peft LoRA adapters as experts: folded exactly as peft folds them, one key at a time (docs/your-models.md
§LoRA adapters as experts), and the exact linear merge of adapters written back as an adapter of rank
sum_t r_t (:func:`write_merged_adapter`).

An adapter folder (``adapter_config.json`` + ``adapter_model.safetensors`` or ``.bin``) given as an expert
becomes a :class:`LoraCheckpoint`: the base's keys under the adapter's model names, each LoRA target
``W0 + scale * B @ A`` (``scale = lora_alpha / r``, ``lora_alpha / sqrt(r)`` with rsLoRA; transposed with
``fan_in_fan_out``), computed when the key is read, and the adapter's ``modules_to_save`` tensors as they are.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError, InputKeyError, InputTypeError
from ..layouts import TensorMeta
from ..merging.driver import check_finite
from ..utils import atomic_write
from .checkpoints import Checkpoint, _SafetensorsFile, _torch_load, open_checkpoint
from .heads import CheckpointView
from .vocab import VocabView

__all__ = ["ADAPTER_CONFIG", "is_adapter", "LoraCheckpoint", "open_expert", "write_merged_adapter",
           "LINEAR_COEFFICIENTS", "lora_target", "canonical_factors", "output_adapters", "save_adapter"]

log = logging.getLogger("acetools.files.lora")

ADAPTER_CONFIG = "adapter_config.json"
_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_PREFIX = "base_model.model."
# config fields whose non-default value changes what the adapter computes beyond W0 + scale * B A
_UNFOLDABLE = {"use_dora": "DoRA (use_dora=true: a learned magnitude vector rescales every column of the folded "
                           "weight; fold it with peft's merge_and_unload() and pass the full checkpoint)",
               "target_parameters": "LoRA on nn.Parameter targets (target_parameters)",
               "layer_replication": "LoRA with layer_replication (layers that the base does not have)",
               "trainable_token_indices": "trainable tokens (trainable_token_indices)",
               "use_qalora": "QALoRA (use_qalora=true)",
               "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens: applied to some tokens only)"}


def is_adapter(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a peft adapter folder (it holds ``adapter_config.json``), that file or the adapter's
    weight file beside it."""
    p = Path(path).expanduser()
    if p.is_dir():
        return (p / ADAPTER_CONFIG).is_file()
    return p.is_file() and p.name in (ADAPTER_CONFIG, *_WEIGHTS) and (p.parent / ADAPTER_CONFIG).is_file()


def _pattern(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """peft's ``get_pattern_key``: the first pattern ``key`` with ``(.*\\.)?(key)$`` matching the module name."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


@dataclass(frozen=True)
class _Target:
    """One LoRA factor pair: the base key it updates (in the view's names), its factors' keys, its scale."""

    key: str  # the updated tensor in the view's names (``<module>.weight`` / ``.bias``)
    module: str  # the module's name in the adapter's model (peft's target name)
    a: str  # the adapter file's keys of A (r x d_in) and B (d_out x r); for lora_bias, B's bias only
    b: str
    scale: float
    rank: int
    transpose: bool  # fan_in_fan_out, or an embedding (peft stores its factors transposed)
    embedding: bool = False


class LoraCheckpoint(Checkpoint):
    """A peft LoRA adapter folded onto ``base``, key by key (:func:`open_expert`; docs/your-models.md §LoRA
    adapters as experts). ``path``/``folder`` are the adapter folder's, ``files`` its weight file, ``config``
    the base's with the adapter's architecture (``auto_mapping``) and without the base's label names."""

    def __init__(self, folder: str | os.PathLike, base: Checkpoint):  # noqa: D107 - no super().__init__: nothing is read
        folder = Path(folder).expanduser()
        if folder.is_file():  # adapter_config.json or the weight file: the folder holding them
            folder = folder.parent
        self.path, self.folder, self.base = folder, folder, base
        self.adapter_config = cfg = _read_config(folder)
        weights = next((folder / n for n in _WEIGHTS if (folder / n).is_file()), None)
        if weights is None:
            raise FileNotFoundError(f"LoRA adapter {folder}: {ADAPTER_CONFIG} but no adapter_model.safetensors or "
                                    "adapter_model.bin beside it; copy the adapter's weights into the folder")
        self.files = [weights]
        self._file = _SafetensorsFile(weights) if weights.suffix == ".safetensors" else None
        self._tensors = None if self._file is not None else _torch_load(weights)
        own = dict(self._file.meta) if self._file is not None else {
            k: TensorMeta(tuple(v.shape), v.dtype) for k, v in (self._tensors or {}).items()}
        self.ameta = own
        self.targets, saved = _parse_keys(folder, cfg, own)
        self.rename = _align(folder, [t.key for t in self.targets.values()], saved, base)  # view key -> base key
        # W0 the adapter stores itself (peft saves an embedding's base_layer with the adapter and loads it over
        # the base's): view key -> the file's key; modules_to_save tensors: view key -> the file's key
        self.stored_w0 = {k.replace(".base_layer.", "."): f for k, f in saved.items() if ".base_layer." in k}
        self.saved = {k: f for k, f in saved.items() if ".base_layer." not in k}
        self._meta = {k: base.meta(b) for k, b in self.rename.items()}
        for k, own_key in self.saved.items():
            self._meta[k] = own[own_key]
        for k, own_key in self.stored_w0.items():
            if k not in self._meta or tuple(own[own_key].shape) != tuple(self._meta[k].shape):
                have = tuple(self._meta[k].shape) if k in self._meta else "no such key"
                raise InputError(f"LoRA adapter {folder}: it stores {own_key!r} with shape {tuple(own[own_key].shape)}"
                                 f", but the base {base.path} has {have} for {k!r} (a resized vocabulary?); "
                                 "fold it with peft's merge_and_unload() and pass the full checkpoint")
        self._check_shapes()
        self.config = _view_config(base.config, cfg)
        self._where = {}

    def factor(self, key: str) -> Tensor:
        """A tensor of the adapter's file (a LoRA factor, a modules_to_save tensor) by its own key."""
        return self._file.get(key) if self._file is not None else (self._tensors or {})[key]

    def _check_shapes(self) -> None:
        for key, t in self.targets.items():
            want = tuple(self._meta[key].shape)
            if "lora_B" in t.b and t.b.endswith(".bias"):
                got = (self.ameta[t.b].shape[0],)
            else:
                rows, cols = self.ameta[t.b].shape[0], self.ameta[t.a].shape[-1]
                if len(self.ameta[t.a].shape) != 2 or len(self.ameta[t.b].shape) != 2:
                    raise InputError(f"LoRA adapter {self.path}: {t.a} has shape {tuple(self.ameta[t.a].shape)}, "
                                     "not a matrix (a LoRA on a convolution); only Linear, Conv1D and Embedding "
                                     "LoRA layers are folded")
                got = (cols, rows) if t.transpose else (rows, cols)
            if got != want:
                raise InputError(f"LoRA adapter {self.path}: module {t.module!r} updates {key!r} with shape {got}, "
                                 f"but the base {self.base.path} has {want}; is --base the model it was trained on?")

    def delta(self, key: str) -> Tensor | None:
        """``scale * B @ A`` of ``key`` (transposed as peft does), in float32 or the factors' wider dtype;
        None for a key the adapter does not update."""
        t = self.targets.get(key)
        if t is None:
            return None
        B = self.factor(t.b)
        if t.b.endswith(".bias"):  # lora_bias: peft adds scale * lora_B.bias to the layer's bias
            return B.to(torch.promote_types(B.dtype, torch.float32)) * t.scale
        A = self.factor(t.a)
        dt = torch.promote_types(torch.promote_types(A.dtype, B.dtype), torch.float32)
        d = B.to(dt) @ A.to(dt)
        return (d.T if t.transpose else d) * t.scale

    def get(self, key: str) -> Tensor:
        """The folded tensor ``key``: ``W0 + scale * B @ A`` for a LoRA target (in the base's dtype, as peft's
        ``merge_and_unload`` adds it), a ``modules_to_save`` tensor, else the base's."""
        if key in self.saved:
            return self.factor(self.saved[key])
        if key not in self.rename:
            raise InputKeyError(f"{self.path}: no tensor named {key!r}")
        W0 = self.factor(self.stored_w0[key]) if key in self.stored_w0 else self.base.get(self.rename[key])
        d = self.delta(key)
        return W0 if d is None else W0 + d.to(W0.dtype)

    def close(self) -> None:
        self._tensors = None

    def __repr__(self) -> str:
        return f"LoraCheckpoint({str(self.path)!r}, {len(self.targets)} LoRA targets on {self.base.path})"


def _read_config(folder: Path) -> dict[str, Any]:
    """The adapter's config, refused in one line when it is no LoRA or a LoRA that does not fold exactly."""
    try:
        cfg = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"LoRA adapter {folder}: {ADAPTER_CONFIG} is not valid JSON ({e})") from None
    if not isinstance(cfg, Mapping):
        raise InputError(f"LoRA adapter {folder}: {ADAPTER_CONFIG} holds a {type(cfg).__name__}, not a mapping")
    kind = cfg.get("peft_type")
    if kind != "LORA":
        raise InputTypeError(f"adapter {folder}: peft_type {kind!r} cannot be folded into an expert: acetools reads "
                             "LoRA adapters (peft_type 'LORA') only; fold it with peft's merge_and_unload() and pass "
                             "the full checkpoint")
    for name, what in _UNFOLDABLE.items():
        if cfg.get(name) not in (None, False, [], {}):
            raise InputTypeError(f"LoRA adapter {folder}: {what} cannot be folded exactly as W0 + scale * B A; "
                                 "fold it with peft's merge_and_unload() and pass the full checkpoint")
    init = cfg.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(("pissa", "olora", "corda", "loftq")):
        raise InputTypeError(f"LoRA adapter {folder}: init_lora_weights={init!r} trains on a changed base (the "
                             "residual of the pretrained weights), so it does not fold onto the pretrained base as "
                             "W0 + scale * B A; save it converted (peft's path_initial_model_for_weight_conversion) or "
                             "fold it with merge_and_unload() and pass the full checkpoint")
    for name in ("r", "lora_alpha"):
        v = cfg.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise InputError(f"LoRA adapter {folder}: {ADAPTER_CONFIG} has {name}={v!r}; a LoRA needs a positive "
                             f"{name}")
    return dict(cfg)


def _parse_keys(folder: Path, cfg: Mapping[str, Any], own: Mapping[str, TensorMeta]
                ) -> tuple[dict[str, _Target], dict[str, str]]:
    """``({view key: target}, {view key: file key of a modules_to_save tensor})`` from the adapter's keys."""
    fan = bool(cfg.get("fan_in_fan_out"))
    rslora = bool(cfg.get("use_rslora"))
    ranks, alphas = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    targets: dict[str, _Target] = {}
    saved: dict[str, str] = {}
    pairs = {"lora_A.weight": ("lora_B.weight", "weight", False), "lora_embedding_A": ("lora_embedding_B", "weight",
                                                                                       True)}
    for k in own:
        name = k[len(_PREFIX):] if k.startswith(_PREFIX) else k
        m = re.fullmatch(r"(.+)\.(lora_A\.weight|lora_embedding_A|lora_B\.weight|lora_embedding_B|lora_B\.bias|"
                         r"lora_[A-Za-z_]+(?:\.[A-Za-z_]+)?)", name)
        if m is None:
            saved[name] = k
            continue
        module, part = m.group(1), m.group(2)
        if part in ("lora_B.weight", "lora_embedding_B"):
            continue
        if part not in pairs and part != "lora_B.bias":
            raise InputKeyError(f"LoRA adapter {folder}: key {k!r} ({part}) is not a LoRA factor acetools can fold "
                                "exactly (lora_A/lora_B, lora_embedding_A/B, lora_B.bias)")
        r = _pattern(ranks, module, cfg["r"])
        alpha = _pattern(alphas, module, cfg["lora_alpha"])
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        if part == "lora_B.bias":
            targets[f"{module}.bias"] = _Target(f"{module}.bias", module, k, k, scale, r, False)
            continue
        b_part, attr, emb = pairs[part]
        b = k[: len(k) - len(part)] + b_part
        if b not in own:
            raise InputKeyError(f"LoRA adapter {folder}: {k!r} has no {b_part} beside it ({b!r}); the adapter file "
                                "is incomplete")
        if own[k].shape[0] != r:
            raise InputError(f"LoRA adapter {folder}: {k!r} has rank {own[k].shape[0]}, but {ADAPTER_CONFIG} gives "
                             f"module {module!r} r={r} (r / rank_pattern); the config is not the one of these weights")
        targets[f"{module}.{attr}"] = _Target(f"{module}.{attr}", module, k, b, scale, r, emb or fan, emb)
    if not targets:
        raise InputError(f"LoRA adapter {folder}: its weight file holds no LoRA factors (lora_A / lora_B keys)")
    # bias="all" also saves a modules_to_save wrapper's inner copies; peft loads the plain name
    for name in [n for n in saved if ".modules_to_save." in n or ".original_module." in n]:
        plain = name.replace(".modules_to_save.", ".").replace(".original_module.", ".")
        if plain not in saved:
            raise InputKeyError(f"LoRA adapter {folder}: key {saved[name]!r} is a peft wrapper's inner name without "
                                f"its plain one ({plain!r}); re-save the adapter with peft's save_pretrained()")
        del saved[name]
    return targets, saved


def _align(folder: Path, updated: Sequence[str], saved: Mapping[str, str], base: Checkpoint) -> dict[str, str]:
    """``{view key: base key}``: the base's keys under the adapter's model names, through a base-model prefix
    when one of them is a bare backbone (docs/your-models.md §Bare backbones and task models)."""
    bkeys = base.keys()
    bset = set(bkeys)
    updated = [*updated, *(k.replace(".base_layer.", ".") for k in saved if ".base_layer." in k)]
    if all(k in bset for k in updated):
        return {k: k for k in bkeys}
    firsts = dict.fromkeys(k.split(".", 1)[0] for k in updated)
    for p in firsts:  # the base is bare: adapter key = prefix + base key
        if all(k.startswith(p + ".") and k[len(p) + 1:] in bset for k in updated):
            return {f"{p}.{k}": k for k in bkeys}
    for p in dict.fromkeys(k.split(".", 1)[0] for k in bkeys):  # the adapter's model is bare: base key = p + key
        if all(f"{p}.{k}" in bset for k in updated):
            return {k[len(p) + 1:]: k for k in bkeys if k.startswith(p + ".")}
    missing = next(k for k in updated if k not in bset)
    raise InputKeyError(f"LoRA adapter {folder}: it updates {missing!r}, which the base {base.path} does not have "
                        "(not even under a base-model prefix); is --base the model it was trained on?")


def _view_config(base_config: Mapping[str, Any] | None, cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The base's config with the adapter's architecture (peft's ``auto_mapping``) and without label names
    (the task's head, a modules_to_save tensor, gives its own label count)."""
    if base_config is None:
        return None
    out = {k: v for k, v in base_config.items() if k not in ("id2label", "label2id", "num_labels")}
    arch = (cfg.get("auto_mapping") or {}).get("base_model_class")
    if arch:
        out["architectures"] = [arch]
    elif cfg.get("task_type") in ("SEQ_CLS", "TOKEN_CLS", "QUESTION_ANS"):
        out.pop("architectures", None)  # a task model on the base's backbone: its head keys say what it is
    return out


def _check_base_name(ck: LoraCheckpoint, base: Checkpoint, force: bool = False) -> None:
    """The adapter's ``base_model_name_or_path`` against ``base``: the same folder (resolved), or the same last
    path component; no field, no check; ``force``: a warning instead of the error."""
    name = ck.adapter_config.get("base_model_name_or_path")
    if not name or not isinstance(name, str):
        return
    bpath = Path(base.folder or base.path).expanduser()
    given = Path(name).expanduser()
    for cand in (given, ck.folder / given if ck.folder is not None else given):
        if cand.exists():
            if cand.resolve() in (bpath.resolve(), Path(base.path).expanduser().resolve()):
                return
            break
    last = given.name or name.rstrip("/").rsplit("/", 1)[-1]
    known = {bpath.name, Path(base.path).name, Path(str((base.config or {}).get("_name_or_path", ""))).name}
    if last in known:
        return
    why = (f"LoRA adapter {ck.path} was trained on base_model_name_or_path {name!r}, but the base is {base.path}; "
           "pass that model as --base, or merge anyway with --force (force=True) if it is the same model")
    if not force:
        raise InputError(why)
    warnings.warn(why, UserWarning, stacklevel=4)


def open_expert(obj: Any, base: Checkpoint, *, force: bool = False) -> Checkpoint:
    """An expert: a :class:`Checkpoint` as it is, a LoRA adapter folder folded onto ``base``
    (:class:`LoraCheckpoint`, its ``base_model_name_or_path`` checked against ``base``; ``force``: a warning),
    else :func:`~acetools.files.checkpoints.open_checkpoint`."""
    if isinstance(obj, Checkpoint):
        return obj
    if isinstance(obj, (str, os.PathLike)) and is_adapter(obj):
        ck = LoraCheckpoint(obj, base)
        _check_base_name(ck, base, force)
        log.info("%s: a LoRA adapter (%d matrices, ranks %s) folded onto %s", ck.path, len(ck.targets),
                 sorted({t.rank for t in ck.targets.values()}), base.path)
        return ck
    return open_checkpoint(obj)


def adapter_of(ck: Checkpoint) -> LoraCheckpoint | None:
    """The :class:`LoraCheckpoint` under a view (heads, vocabularies), if ``ck`` is one."""
    seen = ck
    while not isinstance(seen, LoraCheckpoint):
        seen = getattr(seen, "inner", None)
        if not isinstance(seen, Checkpoint):
            return None
    return seen


# --------------------------------------------------------------------------- factors for the low-rank path
def lora_target(ck: Checkpoint, key: str) -> tuple[LoraCheckpoint, _Target] | None:
    """The adapter and its LoRA factor pair behind ``key`` of ``ck``, through the merge's views (heads renamed or
    hidden, vocabularies); ``None`` where ``key`` of ``ck`` is not ``W0 + scale * B A`` on the base's own W0
    (a full checkpoint, a key the adapter does not update, a lora_bias, a stored W0, rows a vocabulary view picks)."""
    while not isinstance(ck, LoraCheckpoint):
        if isinstance(ck, CheckpointView):
            if key in ck.extra or key not in ck._names:
                return None
            key, ck = ck._names[key], ck.inner
        elif isinstance(ck, VocabView) and key not in ck.vocab_keys:
            ck = ck.inner
        else:
            return None
    t = ck.targets.get(key)
    if t is None or t.b.endswith(".bias") or key in ck.stored_w0:
        return None
    return ck, t


def canonical_factors(experts: Sequence[Checkpoint], key: str, in_out: bool) -> list[tuple[Tensor, Tensor]] | None:
    """Each expert's update of ``key`` as factors ``(B_t, A_t)`` in float64, ``B_t A_t`` d_out x d_in
    (``in_out``: the layout stores ``key`` transposed) with the adapter's scale in ``B_t``
    (docs/methods.md §Low-rank updates, Eq. (LR.1)); ``None`` unless every expert is an adapter updating it
    (:func:`lora_target`). A NaN/Inf factor is an error naming the adapter."""
    found = [lora_target(ck, key) for ck in experts]
    out = []
    for f in found:
        if f is None:
            return None
        a, t = f
        B, A = a.factor(t.b), a.factor(t.a)
        check_finite(str(a.path), t.b, B)
        check_finite(str(a.path), t.a, A)
        B, A = B.to(torch.float64) * t.scale, A.to(torch.float64)
        out.append((A.mT, B.mT) if t.transpose != in_out else (B, A))  # stored (s B A)ᵀ: (Aᵀ)(s Bᵀ)
    return out


# --------------------------------------------------------------------------- the linear merge as an adapter
def _lam(method: str, hp: Mapping[str, Any], n: int) -> list[float]:
    w = hp.get("weights")
    w = [1.0] * n if w is None else [float(x) for x in w]
    if method == "task_arithmetic":
        return [float(hp["lam"]) * x for x in w]
    if sum(w) == 0:
        raise InputError(f"weight_averaging: weights={w!r} sum to 0, so the weighted mean is undefined; give weights "
                         "with a non-zero sum")
    return [x / sum(w) for x in w]


#: The linear rules whose merge is sum_t c_t tau_t, with their coefficients c_t (docs/methods.md §Task
#: arithmetic, §Weight averaging).
LINEAR_COEFFICIENTS = {"task_arithmetic": _lam, "weight_averaging": _lam}


def write_merged_adapter(method: str, hparams: Mapping[str, Any], experts: Sequence[Checkpoint],
                         out: str | os.PathLike, *, dtype: torch.dtype | None = None, skip: Sequence[str] = ()
                         ) -> list[Path]:
    """Write the merge ``W0 + sum_t c_t tau_t`` of LoRA experts (each a :class:`LoraCheckpoint` or a view of
    one) as one peft adapter (docs/your-models.md §LoRA adapters as experts): per module
    ``B = [B_1, ..., B_T]``, ``A = [c_1 s_1 A_1; ...; c_T s_T A_T]`` (rank sum_t r_t over the adapters that
    update it, ``lora_alpha = r``), exact; ``modules_to_save`` tensors merged by the same rule, except the
    keys in ``skip`` (per-task heads, written beside it). ``out`` is a new or empty folder; returns the
    written files."""
    if method not in LINEAR_COEFFICIENTS:
        raise InputError(f"an adapter output (lora_out / --lora-out) is written for the linear rules "
                         f"({', '.join(LINEAR_COEFFICIENTS)}), whose merge is a sum of the adapters; {method} is not "
                         "linear in the task vectors: write the full model (out / --out)")
    ads, fan = output_adapters(experts)
    c = LINEAR_COEFFICIENTS[method](method, hparams, len(ads))
    per_base: dict[str, list[tuple[int, _Target]]] = {}
    module_of: dict[str, tuple[str, str]] = {}  # base key -> (module name, attribute) of the first adapter
    for t, a in enumerate(ads):
        for key, tg in a.targets.items():
            bkey = a.rename[key]
            if tg.b.endswith(".bias"):
                raise InputError(f"LoRA adapter {a.path}: lora_bias ({tg.b}) has no place in a concatenated "
                                 "adapter; write the full model (out / --out)")
            per_base.setdefault(bkey, []).append((t, tg))
            module_of.setdefault(bkey, (tg.module, "lora_embedding" if tg.embedding else "lora"))
    tensors: dict[str, Tensor] = {}
    ranks: dict[str, int] = {}
    for bkey, items in per_base.items():
        module, kind = module_of[bkey]
        As = [ads[t].factor(tg.a).to(torch.float64) * (c[t] * tg.scale) for t, tg in items]
        Bs = [ads[t].factor(tg.b).to(torch.float64) for t, tg in items]
        dt = dtype or ads[items[0][0]].ameta[items[0][1].a].dtype
        A, B = torch.cat(As, 0).to(dt), torch.cat(Bs, 1).to(dt)
        if kind == "lora":
            tensors[f"{_PREFIX}{module}.lora_A.weight"], tensors[f"{_PREFIX}{module}.lora_B.weight"] = A, B
        else:
            tensors[f"{_PREFIX}{module}.lora_embedding_A"], tensors[f"{_PREFIX}{module}.lora_embedding_B"] = A, B
        ranks[module] = A.shape[0]
    saved_names: dict[str, None] = {}
    for name in dict.fromkeys(k for a in ads for k in a.saved if k not in skip):
        holders = [t for t, a in enumerate(ads) if name in a.saved]
        bkey = ads[holders[0]].rename.get(name)
        module = name.rsplit(".", 1)[0]
        listed = ads[holders[0]].adapter_config.get("modules_to_save") or []
        if not any(module == m or module.endswith(f".{m}") for m in listed):  # bias="all" / "lora_only"
            raise InputError(f"LoRA adapter {ads[holders[0]].path} saves {name!r} outside its modules_to_save "
                             "(bias='all' or 'lora_only'); an adapter output cannot carry it: write the full model "
                             "(out / --out)")
        if bkey is None:
            raise InputError(f"{name!r} is a modules_to_save tensor of {ads[holders[0]].path} that the base does not "
                             "have: a task head; merge with heads='per-task' / --heads per-task (its heads are written "
                             "beside the adapter)")
        if len(holders) == len(ads):  # sum_t c_t (M_t - W0) on the base's tensor
            W0 = ads[holders[0]].base.get(bkey).to(torch.float64)
            merged = W0 + sum(c[t] * (ads[t].factor(ads[t].saved[name]).to(torch.float64) - W0) for t in holders)
        else:
            raise InputError(f"{name!r} is saved by {len(holders)} of the {len(ads)} adapters (modules_to_save); "
                             "an adapter output needs the same modules_to_save in every adapter")
        tensors[f"{_PREFIX}{name}"] = merged.to(dtype or ads[holders[0]].ameta[ads[holders[0]].saved[name]].dtype)
        saved_names[name.rsplit(".", 1)[0]] = None
    record = {"method": method, "coefficients": c, "experts": [str(a.path) for a in ads], "ranks": ranks}
    return save_adapter(out, tensors, ranks, list(saved_names), fan, ads[0].adapter_config, record)


def output_adapters(experts: Sequence[Checkpoint]) -> tuple[list[LoraCheckpoint], bool]:
    """The adapters under ``experts`` and their ``fan_in_fan_out``, for an adapter output: every expert an
    adapter, a stored embedding W0 the base's own, one orientation; else a one-line error."""
    loras = [adapter_of(ck) for ck in experts]
    for ck, lo in zip(experts, loras):
        if lo is None:
            raise InputError(f"an adapter output needs every expert to be a LoRA adapter; {ck.path} is a full "
                             "checkpoint: write the full model (out / --out)")
    ads = [lo for lo in loras if lo is not None]
    for a in ads:  # an embedding W0 saved with the adapter (peft's base_layer) must be the base's own
        for key, own_key in a.stored_w0.items():
            if not torch.equal(a.factor(own_key), a.base.get(a.rename[key])):
                raise InputError(f"LoRA adapter {a.path} stores its own {own_key!r}, which differs from the base's "
                                 f"{a.rename[key]!r}; an adapter output cannot carry it: write the full model "
                                 "(out / --out)")
    fans = {bool(a.adapter_config.get("fan_in_fan_out")) for a in ads}
    if len(fans) > 1:
        raise InputError("the adapters disagree on fan_in_fan_out; an adapter output needs one orientation")
    return ads, fans.pop()


def save_adapter(out: str | os.PathLike, tensors: Mapping[str, Tensor], ranks: Mapping[str, int],
                 saved_modules: Sequence[str], fan: bool, first: Mapping[str, Any], record: Mapping[str, Any]
                 ) -> list[Path]:
    """Write one peft adapter into ``out`` (atomically, file by file): ``tensors`` under peft's names, rank
    ``ranks[module]`` per module with ``lora_alpha = r`` (scale 1), task type, base name and architecture from the
    first input adapter's config ``first``, and ``record`` as acetools_merge.json; returns the files."""
    r = max(ranks.values())
    config = {
        "peft_type": "LORA", "r": r, "lora_alpha": r, "use_rslora": False, "use_dora": False,
        "fan_in_fan_out": fan, "bias": "none", "lora_dropout": 0.0, "inference_mode": True,
        "target_modules": sorted(ranks), "modules_to_save": list(saved_modules) or None,
        "rank_pattern": {re.escape(m): n for m, n in ranks.items() if n != r},
        "alpha_pattern": {re.escape(m): n for m, n in ranks.items() if n != r},
        "task_type": first.get("task_type"), "base_model_name_or_path": first.get("base_model_name_or_path"),
        "auto_mapping": first.get("auto_mapping"),
    }
    from safetensors.torch import save

    outp = Path(out).expanduser()
    outp.mkdir(parents=True, exist_ok=True)
    with atomic_write(outp / "adapter_model.safetensors") as fh:
        fh.write(save({k: v.contiguous() for k, v in tensors.items()}, metadata={"format": "pt"}))
    with atomic_write(outp / ADAPTER_CONFIG, "w") as fh:
        json.dump(config, fh, indent=2)
    with atomic_write(outp / "acetools_merge.json", "w") as fh:
        json.dump(record, fh, indent=2)
    return [outp / "adapter_model.safetensors", outp / ADAPTER_CONFIG, outp / "acetools_merge.json"]
