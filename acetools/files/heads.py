"""Per-task heads: merge a classifier's backbone, keep each expert's head (docs/your-models.md §Per-task heads).

:func:`plan_heads` resolves ``heads=`` (:data:`HEAD_MODES`); :func:`load_with_head` gives one task's
``transformers`` model, :func:`task_state_dict` the same as a state dict and config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from .. import __version__
from ..errors import InputError, InputKeyError, InputTypeError
from ..layouts import Layout, PrefixAlignment, align_prefix, is_classifier
from .checkpoints import Checkpoint, file_sha256, open_checkpoint
from .staging import umask_mode

__all__ = [
    "HEAD_MODES",
    "HEADS_DIR",
    "HeadPlan",
    "plan_heads",
    "list_heads",
    "load_head",
    "task_state_dict",
    "load_with_head",
]

log = logging.getLogger("acetools.files.heads")

#: The values of ``heads=`` / ``--heads``.
HEAD_MODES = ("auto", "merge", "per-task", "drop")
#: The folder inside a merge's output that holds the per-task heads.
HEADS_DIR = "heads"
_INDEX = "index.json"
_FORMAT = "acetools.heads/1"


class CheckpointView(Checkpoint):
    """A :class:`~acetools.files.checkpoints.Checkpoint` without the ``hidden`` keys (the heads), with
    its keys renamed (``rename``: the merge's name -> the checkpoint's own; docs/your-models.md §Bare
    backbones and task models) and the keys of ``extra`` (key -> the checkpoint read for it) after its own.
    ``path``, ``files``, ``config`` and ``folder`` are the wrapped one's."""

    def __init__(self, inner: Checkpoint, hidden: Sequence[str], rename: Mapping[str, str] | None = None,  # noqa: D107 - no super().__init__: nothing is read
                 extra: Mapping[str, Checkpoint] | None = None):
        self.inner, self.hidden, self.extra = inner, frozenset(hidden), dict(extra or {})
        self.path, self.files, self.config, self.folder = inner.path, inner.files, inner.config, inner.folder
        own = {v: k for k, v in rename.items()} if rename is not None else {k: k for k in inner.keys()}  # own -> ours
        self._names = {new: old for old in inner.keys() if (new := own.get(old)) is not None and new not in self.hidden}
        self._meta = {**{k: inner.meta(old) for k, old in self._names.items()},
                      **{k: ck.meta(k) for k, ck in self.extra.items()}}

    def _own(self, key: str) -> str:
        """The wrapped checkpoint's name of ``key``."""
        if key in self.hidden:
            raise InputKeyError(f"{self.path}: {key!r} is a per-task head key, not part of the merged backbone")
        if key not in self._names:
            raise InputKeyError(f"{self.path}: no tensor named {key!r}")
        return self._names[key]

    def get(self, key: str) -> Tensor:
        return self.extra[key].get(key) if key in self.extra else self.inner.get(self._own(key))

    def get_flat(self, key: str, start: int, stop: int) -> Tensor:
        if key in self.extra:
            return self.extra[key].get_flat(key, start, stop)
        return self.inner.get_flat(self._own(key), start, stop)

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"CheckpointView({self.inner!r}, without {len(self.hidden)} head keys)"


def expert_name(ck: Checkpoint, i: int = 0) -> str:
    """Expert ``i``'s default name (its head folder, its task for ``--search``, its label in diagnose): the
    folder name, or the file name without suffix (the parent folder's name for ``model.safetensors`` and the
    like); ``task<i>`` for a state dict in memory."""
    p = Path(ck.path)
    if ck.folder is not None:
        return Path(ck.folder).name
    if not ck.files:
        return f"task{i}"
    stem = p.name.split(".")[0]
    return p.parent.name if stem in ("model", "pytorch_model", "open_clip_model", "open_clip_pytorch_model") else stem


def expert_names(experts: Sequence[Checkpoint]) -> list[str]:
    """:func:`expert_name` of every expert, with the index appended to a name an earlier expert has."""
    out: list[str] = []
    for i, ck in enumerate(experts):
        n = expert_name(ck, i)
        out.append(n if n not in out else f"{n}_{i}")
    return out


def _check_names(names: Sequence[str] | None, experts: Sequence[Checkpoint]) -> list[str]:
    """``names`` (default: each expert's :func:`expert_name`) checked as one distinct folder name per expert."""
    given = names is not None
    names = [str(n) for n in names] if names is not None else [expert_name(ck, i) for i, ck in enumerate(experts)]
    if len(names) != len(experts):
        raise InputError(f"names: {len(names)} name(s) for {len(experts)} experts; give one name per expert")
    for n, ck in zip(names, experts):
        if (not n or n in (".", "..") or n.startswith(".") or "/" in n or "\\" in n or n != n.strip()
                or n == _INDEX):
            raise InputError(f"head name {n!r} (expert {ck.path}) cannot be a folder name under {HEADS_DIR}/; "
                             "pass names=[...] / --names with plain names such as sst2")
    for j, n in enumerate(names):
        if n in names[:j]:
            how = "names" if given else "expert folder names"
            raise InputError(f"two experts have the head name {n!r} ({experts[names.index(n)].path} and "
                             f"{experts[j].path}, from their {how}); pass one distinct name per expert with "
                             "names=[...] / --names")
    return names


def _labels(ck: Checkpoint, keys: Sequence[str]) -> tuple[int, dict[str, str]]:
    """``(num_labels, id2label)`` of one expert: from its config (which some head tensor must fit), else
    the output size of the last head weight in key order (``classifier.out_proj.weight``, ``score.weight``)."""
    cfg = ck.config or {}
    metas = {k: ck.meta(k) for k in keys}
    id2label = {str(k): str(v) for k, v in (cfg.get("id2label") or {}).items()}
    if id2label or cfg.get("num_labels"):
        n = len(id2label) or int(cfg["num_labels"])
        if not any(m.ndim >= 1 and m.shape[0] == n for m in metas.values()):
            shapes = ", ".join(f"{k} {tuple(m.shape)}" for k, m in metas.items())
            raise InputError(f"expert {ck.path}: its config.json has {n} labels, but no head tensor has {n} outputs "
                             f"({shapes}); is the config the one of these weights?")
    else:
        weights = [k for k in sorted(keys) if k.endswith("weight") and metas[k].ndim >= 1]
        if not weights:
            raise InputError(f"expert {ck.path}: cannot tell its label count: no config.json and no head weight "
                             f"among {sorted(keys)}")
        n = int(metas[weights[-1]].shape[0])
    return n, id2label or {str(i): f"LABEL_{i}" for i in range(n)}


@dataclass
class HeadPlan:
    """What happens to the task heads of a file merge (:func:`plan_heads`)."""

    mode: str  # "merge", "per-task" or "drop" (resolved from "auto")
    keys: list[str] = field(default_factory=list)  # the head keys left out of the merge
    names: list[str] = field(default_factory=list)  # one per expert ("per-task")
    experts: list[Checkpoint] = field(default_factory=list)  # the experts with their heads
    labels: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # (num_labels, id2label) per expert
    reason: str = ""
    alignment: PrefixAlignment | None = None  # a bare backbone matched through the base-model prefix

    def summary(self) -> str:
        """The dry run's line(s): the mode, the head keys, each task's label count, the prefix matching."""
        extra = f"\n{self.alignment.describe()}" if self.alignment is not None else ""
        if self.mode == "merge":
            return f"heads: merged like every other key ({self.reason}){extra}"
        keys = ", ".join(self.keys)
        if self.mode == "drop":
            return f"heads: {keys} left out of the merge and not written ({self.reason}){extra}"
        tasks = ", ".join(f"{n} ({lab[0]} labels)" for n, lab in zip(self.names, self.labels))
        return (f"heads: per task ({self.reason}): {keys} not merged; written to {HEADS_DIR}/<name>/ for "
                f"{tasks}{extra}")

    def views(self, base: Checkpoint, experts: Sequence[Checkpoint], layout: Layout
              ) -> tuple[Checkpoint, list[Checkpoint], Layout]:
        """Base, experts and layout without the head keys, the base's keys named as the experts'."""
        if not self.keys and self.alignment is None:
            return base, list(experts), layout
        if self.alignment is not None:
            base, layout = aligned_base(base, self.alignment, layout)
        b = CheckpointView(base, [k for k in self.keys if k in base])
        ex: list[Checkpoint] = [CheckpointView(ck, self.keys) for ck in experts]
        tied = {a: c for a, c in layout.tied.items() if a in b and c in b}
        return b, ex, dataclasses.replace(layout, tied=tied)


def aligned_base(base: Checkpoint, alignment: PrefixAlignment, layout: Layout) -> tuple[Checkpoint, Layout]:
    """The base under the experts' key names (:func:`acetools.layouts.align_prefix`), ties re-bound."""
    view = CheckpointView(base, (), alignment.rename)
    back = {old: new for new, old in alignment.rename.items()}
    tied = {back[a]: back[c] for a, c in layout.tied.items() if a in back and c in back}
    return view, dataclasses.replace(layout, tied=tied).bind(view.keys(), base.config)


def _check_head_shapes(base: Checkpoint, experts: Sequence[Checkpoint], layout: Layout) -> None:
    """For ``heads="merge"``: a head key whose shape differs between the models is an error naming it,
    every shape and ``--heads per-task``."""
    for key in base.keys():
        if not all(key in ck for ck in experts):
            continue
        shapes = {tuple(base.meta(key).shape), *(tuple(ck.meta(key).shape) for ck in experts)}
        if len(shapes) > 1 and (layout.task_head_keys([key]) or layout.role(key, base.meta(key)) == "head"):
            each = [f"base {base.path}: {tuple(base.meta(key).shape)}"]
            each += [f"expert {ck.path}: {tuple(ck.meta(key).shape)}" for ck in experts]
            raise InputError(f"shape mismatch at key {key!r}: " + "; ".join(each) + ". Classifiers whose heads "
                             "differ in shape (different num_labels) are merged with heads='per-task' (--heads "
                             "per-task): the backbone is merged and each expert's head is written beside it under "
                             f"{HEADS_DIR}/; heads='drop' (--heads drop) keeps the backbone only")


def plan_heads(heads: str, base: Checkpoint, experts: Sequence[Checkpoint], layout: Layout,
               names: Sequence[str] | None = None, *, write: bool = True) -> HeadPlan:
    """Resolve ``heads`` (:data:`HEAD_MODES`, docs/your-models.md §Per-task heads) for these checkpoints;
    errors name the key or the expert. ``names``: one folder name per expert (default: the experts'
    folder or file names). ``write=False`` (diagnose): heads left out, not written (no names, labels).
    """
    if heads not in HEAD_MODES:
        raise InputError(f"heads={heads!r} must be one of {', '.join(HEAD_MODES)}")
    if names is not None and (isinstance(names, str) or not isinstance(names, Sequence)):
        raise InputTypeError("names must be a list of strings, one per expert")
    mode, reason = heads, "asked"
    ex = experts[0]  # the base's key names against the first expert's non-head ones (align_prefix)
    own_heads = set(layout.task_head_keys(ex.keys()))
    alignment = align_prefix(base.keys(), [k for k in ex.keys() if k not in own_heads], base_config=base.config,
                             expert_config=ex.config)
    given = base
    if alignment is not None:  # a bare backbone beside task models (or the reverse): the experts' key names
        base = aligned_base(base, alignment, layout)[0]
    if heads == "auto":
        found = [ck for ck in experts if is_classifier(ck.keys(), ck.config, layout)]
        if found and layout.task_head_keys(found[0].keys()):
            archs = (found[0].config or {}).get("architectures") or []
            mode = "per-task"
            reason = (f"auto: the experts are classifiers ({archs[0]})" if archs
                      else f"auto: the experts have classifier head keys ({layout.task_head_keys(found[0].keys())[0]})")
        else:
            mode = "merge"
            reason = ("auto: the experts are not classifiers" if not found
                      else f"auto: layout {layout.name!r} names no task-head key of these classifiers")
    if mode == "merge":
        _check_head_shapes(base, experts, layout)
        if names is not None:
            log.info("names are only used with heads='per-task'; ignored")
        return HeadPlan("merge", reason=reason, alignment=alignment)
    keys = layout.task_head_keys(experts[0].keys())
    bare = next((ck for ck in experts if not layout.task_head_keys(ck.keys())), None)
    if bare is not None and layout.task_head_keys(given.keys()):  # the base a task model, an expert bare
        raise InputError(f"heads={mode!r}: expert {bare.path} has no task head and the base {given.path} has one "
                         f"({layout.task_head_keys(given.keys())[0]}): are --base and --experts swapped? "
                         "(docs/your-models.md §Bases and experts are checked)")
    if not keys:
        raise InputError(f"heads={mode!r}: expert {experts[0].path} has no key that layout {layout.name!r} calls a "
                         f"task head (patterns {layout.task_heads or '(none)'}); pass a Layout with task_heads=(...) "
                         "in Python, or heads='merge'")
    for ck in experts[1:]:
        other = layout.task_head_keys(ck.keys())
        if other != keys:
            extra = sorted(set(other) ^ set(keys))
            raise InputKeyError(f"heads={mode!r}: expert {ck.path} has head keys {other}, expert {experts[0].path} has "
                           f"{keys} (differ at {extra[0]!r})" if extra else
                           f"heads={mode!r}: expert {ck.path} stores its head keys in another order than "
                           f"{experts[0].path}")
    for key in keys:
        for ck in experts:
            if not ck.meta(key).dtype.is_floating_point:
                raise InputTypeError(f"heads={mode!r}: head key {key!r} of expert {ck.path} is {ck.meta(key).dtype}, "
                                "not a float tensor")
    plan = HeadPlan(mode, keys=list(keys), experts=list(experts), reason=reason, alignment=alignment)
    if mode == "per-task" and write:
        plan.names = _check_names(names, experts)
        plan.labels = [_labels(ck, keys) for ck in experts]
    return plan


# --------------------------------------------------------------------------- writing
def _ours(folder: Path) -> bool:
    try:
        return json.loads((folder / _INDEX).read_text()).get("format") == _FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def check_heads_folder(out: Path, inputs: Sequence[Checkpoint], overwrite: bool, writing: bool) -> None:
    """Refuse ``<out>/heads`` when it holds or is inside an input, holds an earlier merge's heads (unless
    ``overwrite``), or something acetools did not write. ``writing``: heads will be written."""
    target = (Path(out).expanduser().resolve()) / HEADS_DIR
    for ck in inputs:
        places = [Path(f).resolve() for f in ck.files] + ([Path(ck.folder).resolve()] if ck.folder else [])
        for p in places:
            if p == target or target in p.parents or (ck.folder and Path(ck.folder).resolve() in target.parents):
                raise InputError(f"the heads folder {target} would hold or be inside the input checkpoint {ck.path}; "
                                 "choose another --out (inputs are never overwritten)")
    if target.exists():
        if not target.is_dir() or not _ours(target):
            if writing:
                raise FileExistsError(f"{target} exists and was not written by acetools (no {_INDEX} of per-task "
                                      "heads); choose another --out")
            return
        if not overwrite:
            raise FileExistsError(f"{target} already holds the heads of an earlier merge; choose an empty folder "
                                  "or pass overwrite=True / --overwrite")


class HeadWriter:
    """Write every expert's head into a hidden temporary folder inside ``out``; :meth:`commit`
    moves it to ``<out>/heads`` (replacing an earlier merge's heads), :meth:`abort` drops it."""

    def __init__(self, out: Path, plan: HeadPlan, sha256: Mapping[str, str] | None = None):
        self.out, self.plan, self.sha256 = Path(out), plan, dict(sha256 or {})
        self.out.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=".acetools-heads-", dir=self.out))
        os.chmod(self._tmp, umask_mode())  # mkdtemp's 0700 would stay on heads/

    def write(self) -> dict[str, str]:
        """Write the heads; returns ``{name: "heads/<name>"}``."""
        p = self.plan
        index: dict[str, Any] = {"format": _FORMAT, "acetools_version": __version__, "keys": p.keys, "tasks": {}}
        for name, ck, (n_labels, id2label) in zip(p.names, p.experts, p.labels):
            folder = self._tmp / name
            folder.mkdir()
            tensors = {k: ck.get(k).contiguous() for k in p.keys}
            save_file(tensors, str(folder / "head.safetensors"),
                      metadata={"format": "pt", "acetools.task": name, "acetools.source": str(ck.path)})
            if ck.config is not None and ck.folder is not None and (Path(ck.folder) / "config.json").is_file():
                shutil.copyfile(Path(ck.folder) / "config.json", folder / "config.json")
            record = {
                "task": name,
                "num_labels": n_labels,
                "id2label": id2label,
                "label2id": {v: int(k) for k, v in id2label.items()},
                "architectures": list((ck.config or {}).get("architectures") or []),
                "source": str(ck.path),
                "source_sha256": {f: self.sha256[f] for f in map(str, ck.files) if f in self.sha256},
                "keys": {k: {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
                         for k, t in tensors.items()},
                "file": "head.safetensors",
                "sha256": file_sha256(folder / "head.safetensors"),
                "config": "config.json" if (folder / "config.json").is_file() else None,
            }
            (folder / "head.json").write_text(json.dumps(record, indent=2))
            index["tasks"][name] = {"folder": f"{HEADS_DIR}/{name}", "num_labels": n_labels}
        (self._tmp / _INDEX).write_text(json.dumps(index, indent=2))
        for p in self._tmp.rglob("*"):  # permissions as a plain mkdir / open under the umask give
            os.chmod(p, umask_mode(0o777 if p.is_dir() else 0o666))
        return {name: f"{HEADS_DIR}/{name}" for name in self.plan.names}

    def commit(self) -> None:
        target = self.out / HEADS_DIR
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=".acetools-old-heads-", dir=self.out))
            os.replace(target, old / HEADS_DIR)
        os.replace(self._tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def remove_stale_heads(out: Path) -> None:
    """After an overwriting merge without per-task heads: remove an earlier merge's ``heads/``."""
    target = Path(out) / HEADS_DIR
    if target.is_dir() and _ours(target):
        shutil.rmtree(target)
        log.info("removed the per-task heads of the earlier merge in %s", target)


# --------------------------------------------------------------------------- reading
def _heads_folder(folder: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    root = Path(folder).expanduser()
    target = root / HEADS_DIR
    if not (target / _INDEX).is_file() or not _ours(target):
        raise FileNotFoundError(f"{root} holds no per-task heads ({HEADS_DIR}/{_INDEX}); merge with "
                                "heads='per-task' (acetools merge --heads per-task)")
    return target, json.loads((target / _INDEX).read_text())


def list_heads(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``{task name: head.json record}`` of a merge written with ``heads="per-task"``."""
    target, index = _heads_folder(folder)
    return {name: json.loads((target / name / "head.json").read_text()) for name in index["tasks"]}


def load_head(folder: str | os.PathLike, task: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Task ``task``'s head tensors and its ``head.json`` record, after checking its sha256."""
    target, index = _heads_folder(folder)
    if task not in index["tasks"]:
        raise InputKeyError(f"{Path(folder)} has no head for task {task!r}; its tasks are: {', '.join(index['tasks'])}")
    record = json.loads((target / task / "head.json").read_text())
    path = target / task / record["file"]
    digest = file_sha256(path)
    if digest != record["sha256"]:
        raise InputError(f"{path}: sha256 {digest[:12]}... differs from the {record['sha256'][:12]}... recorded in "
                         "head.json; the head file was changed after the merge")
    tensors = load_file(str(path))
    if sorted(tensors) != sorted(record["keys"]):
        raise InputError(f"{path}: holds keys {sorted(tensors)}, head.json records {sorted(record['keys'])}")
    return tensors, record


def task_config(folder: Path, task: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """The expert's own ``config.json`` (with the merged folder's ``vocab_size``), else the merged folder's with
    the task's labels."""
    own = folder / HEADS_DIR / task / "config.json"
    base = folder / "config.json"
    merged = json.loads(base.read_text()) if base.is_file() else {}
    if record.get("config") and own.is_file():  # with the merged rows' count (--vocab: docs/your-models.md)
        cfg = json.loads(own.read_text())
        return {**cfg, **({"vocab_size": merged["vocab_size"]} if "vocab_size" in merged else {})}
    cfg = dict(merged)
    cfg.update({"num_labels": record["num_labels"], "id2label": record["id2label"], "label2id": record["label2id"]})
    if record.get("architectures"):
        cfg["architectures"] = record["architectures"]
    return cfg


def task_state_dict(folder: str | os.PathLike, task: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The state dict of task ``task`` (the merged backbone plus its head) and its config as a dict
    (no ``transformers`` needed)."""
    folder = Path(folder).expanduser()
    head, record = load_head(folder, task)
    sd = open_checkpoint(folder).state_dict()
    clash = sorted(set(sd) & set(head))
    if clash:
        raise InputError(f"{folder}: the merged weights already hold head key {clash[0]!r}; not a per-task merge?")
    sd.update(head)
    return sd, task_config(folder, task, record)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def load_with_head(folder: str | os.PathLike, task: str, *, model_class: Any = None, **kwargs: Any):
    """A ``transformers`` model (eval mode) for task ``task``: the merged backbone in ``folder`` plus that
    task's head, with the expert's own config (docs/your-models.md §Per-task heads).

    The class is ``model_class`` or the config's first ``architectures`` entry (default
    ``AutoModelForSequenceClassification``); ``kwargs`` go to ``from_pretrained``; without a dtype the
    model has the merged backbone's. A weight missing from the files, or an extra one, is an error.
    """
    import transformers

    folder = Path(folder).expanduser()
    head, record = load_head(folder, task)
    cfg_dict = task_config(folder, task, record)
    model_type = cfg_dict.get("model_type")
    if not model_type:
        raise InputError(f"{folder}: no model_type in the config of task {task!r}; use task_state_dict() and your "
                         "own model class")
    config = transformers.AutoConfig.for_model(**cfg_dict)
    if model_class is None:  # the config's first architecture, else a sequence classifier
        arch = (cfg_dict.get("architectures") or [""])[0]
        model_class = getattr(transformers, arch, None) or transformers.AutoModelForSequenceClassification
    if "dtype" not in kwargs and "torch_dtype" not in kwargs:  # the merged backbone's, not the expert config's
        metas = open_checkpoint(folder).metas().values()
        version = tuple(int(x) if x.isdigit() else 0 for x in (transformers.__version__.split(".") + ["0"])[:2])
        kwargs["dtype" if version >= (4, 56) else "torch_dtype"] = next(  # renamed in transformers 4.56
            (m.dtype for m in metas if m.dtype.is_floating_point), torch.float32)
    with _quiet_transformers():
        model, info = model_class.from_pretrained(folder, config=config, output_loading_info=True, **kwargs)
    missing = set(info["missing_keys"]) - set(head)
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
        what = (f"missing {sorted(missing)[0]!r}" if missing else f"unexpected {sorted(info['unexpected_keys'])[0]!r}"
                if info["unexpected_keys"] else f"mismatched {sorted(map(str, info['mismatched_keys']))[0]}")
        raise InputError(f"{folder}: the merged backbone does not fit {model_class.__name__} for task {task!r} "
                         f"({what})")
    params = model.state_dict()
    for k, t in head.items():
        if k not in params:
            raise InputKeyError(f"{model_class.__name__} has no parameter {k!r} (head of task {task!r})")
        if tuple(params[k].shape) != tuple(t.shape):
            raise InputError(f"head key {k!r} of task {task!r} has shape {tuple(t.shape)}, {model_class.__name__} "
                             f"with num_labels={config.num_labels} wants {tuple(params[k].shape)}")
    with torch.no_grad():
        model.load_state_dict(head, strict=False)  # every head key is one of the model's (checked above)
    return model.eval()
