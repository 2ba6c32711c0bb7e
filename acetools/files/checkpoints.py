"""Checkpoints on disk: read one tensor at a time (:func:`open_checkpoint`), write sharded safetensors atomically
(:class:`ShardedWriter`; docs/your-models.md §What can be read, §What is written), and the hashed cache format
(:func:`save_checkpoint` / :func:`load_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save
from torch import Tensor

from ..errors import AcetoolsError, InputError, InputKeyError, InputTypeError
from ..layouts import Layout, TensorMeta
from ..merging import check_same_keys
from ..utils import atomic_write, jsonable, strip_ansi

__all__ = [
    "Checkpoint",
    "open_checkpoint",
    "as_checkpoint",
    "ShardedWriter",
    "parse_size",
    "file_sha256",
    "copy_side_files",
    "check_output_folder",
    "check_compatible",
    "check_ties",
    "WEIGHT_SUFFIXES",
    "CheckpointError",
    "state_hash",
    "config_hash",
    "save_checkpoint",
    "load_checkpoint",
    "sidecar_path",
]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
# safetensors' dtype names; the float8 and wide unsigned ones where this torch has them
_ST_DTYPES = {name: getattr(torch, attr) for name, attr in (
    ("F64", "float64"), ("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16"), ("I64", "int64"),
    ("I32", "int32"), ("I16", "int16"), ("I8", "int8"), ("U8", "uint8"), ("BOOL", "bool"),
    ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("U16", "uint16"), ("U32", "uint32"),
    ("U64", "uint64")) if hasattr(torch, attr)}
_DTYPE_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def parse_size(size: int | float | str) -> int:
    """Bytes from ``5GB``, ``500MB``, ``2GiB``, ``1e9`` or an int (decimal units, binary with ``i``)."""
    if isinstance(size, bool):
        raise InputTypeError(f"shard size must be a number of bytes or a string like '5GB', got {size!r}")
    if isinstance(size, (int, float)):
        n = int(size)
    else:
        m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]i?)?[bB]?\s*", str(size))
        if not m:
            raise InputError(f"shard size {size!r} is not a size; write e.g. 5GB, 500MB, 2GiB or a number of bytes")
        unit = (m.group(2) or "").lower()
        base = 1024 if unit.endswith("i") else 1000
        power = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit[:1]]
        n = int(float(m.group(1)) * base**power)
    if n <= 0:
        raise InputError(f"shard size must be positive, got {size!r}")
    return n


#: Bytes of a file that :func:`file_sha256` maps at a time.
HASH_WINDOW = 1 << 24


def file_sha256(path: str | os.PathLike, window: int = HASH_WINDOW, stop: Callable[[], bool] | None = None) -> str:
    """Hex SHA-256 of a file, hashed from read-only memory maps of 16 MiB windows, one at a time; ``stop()``
    true before a window gives up (returns ``""``)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        for at in range(0, size, window):
            if stop is not None and stop():
                return ""
            with mmap.mmap(fh.fileno(), min(window, size - at), offset=at, access=mmap.ACCESS_READ) as mapped:
                h.update(mapped)
    return h.hexdigest()


def _unwrap_state_dict(obj: Any, path: Path) -> dict[str, Tensor]:
    """The tensors of a loaded checkpoint: ``state_dict`` nesting and ``module.`` prefixes removed."""
    if isinstance(obj, Mapping):
        for nest in ("state_dict", "model_state_dict", "model"):
            if isinstance(obj.get(nest), Mapping):
                obj = obj[nest]
                break
    if not isinstance(obj, Mapping):
        raise InputError(f"{path}: holds a {type(obj).__name__}, not a state dict (a mapping of key -> tensor)")
    bad = [k for k, v in obj.items() if not isinstance(v, Tensor)]
    if bad:
        raise InputError(f"{path}: entry {bad[0]!r} is a {type(obj[bad[0]]).__name__}, not a tensor; "
                         "pass a file holding a state dict")
    keys = list(obj)
    if keys and all(k.startswith("module.") for k in keys):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return dict(obj)


def _torch_load(path: Path) -> dict[str, Tensor]:
    """``torch.load(weights_only=True)``, memory-mapped when the file's format allows it."""
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e) and "zip" not in str(e):
                raise
            obj = torch.load(path, map_location="cpu", weights_only=True)  # a legacy (non-zip) file
    except Exception as e:  # pickle.UnpicklingError and friends: a pickled module, other code, a damaged file
        first = strip_ansi((str(e).splitlines() or [""])[0])
        raise InputError(
            f"{path}: torch.load(weights_only=True) cannot read it as a state dict ({type(e).__name__}: {first}); "
            "only plain state dicts are loaded, never pickled modules: save model.state_dict() instead"
        ) from None
    return _unwrap_state_dict(obj, path)


class _SafetensorsFile:
    """One safetensors file read one tensor at a time, each through a copy-on-write mapping of its own bytes
    (pages read through one mapping of the file would count as resident until it is unmapped)."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise InputError(f"{path}: not a safetensors file (too short)")
            n = int.from_bytes(head, "little")
            if n <= 0 or 8 + n > size:
                raise InputError(f"{path}: not a safetensors file (bad header length {n})")
            try:
                header = json.loads(fh.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise InputError(f"{path}: not a safetensors file (unreadable header)") from None
        self.start = 8 + n
        self.metadata = header.pop("__metadata__", None) or {}
        self.meta: dict[str, TensorMeta] = {}
        self.offsets: dict[str, tuple[int, int]] = {}
        for k, v in header.items():
            dt = v.get("dtype")
            if dt not in _ST_DTYPES:
                raise InputError(f"{path}: key {k!r} has dtype {dt}, which acetools cannot read")
            shape = tuple(int(x) for x in v["shape"])
            a, b = (int(x) for x in v["data_offsets"])
            if not 0 <= a <= b or self.start + b > size or b - a != math.prod(shape) * _ST_DTYPES[dt].itemsize:
                raise InputError(f"{path}: key {k!r} has data offsets {[a, b]} that do not fit its shape {shape} "
                                 "or the file; the file is damaged")
            self.meta[k] = TensorMeta(shape, _ST_DTYPES[dt])
            self.offsets[k] = (a, b)

    def get(self, key: str) -> Tensor:
        a, b = self.offsets[key]
        m = self.meta[key]
        start = self.start + a
        if b == a:
            return torch.empty(m.shape, dtype=m.dtype)
        at = start - start % mmap.ALLOCATIONGRANULARITY
        with open(self.path, "rb") as fh:
            mapped = mmap.mmap(fh.fileno(), start + (b - a) - at, offset=at, access=mmap.ACCESS_COPY)
        data = torch.from_numpy(np.frombuffer(mapped, dtype=np.uint8, count=b - a, offset=start - at))
        if start % m.dtype.itemsize:
            data = data.clone()  # bytes not aligned to the item size: copied into a new buffer
        return data.view(m.dtype).reshape(m.shape)

    def get_flat(self, key: str, start: int, stop: int) -> Tensor:
        """Entries ``start:stop`` of ``key`` flattened, read into a new buffer (nothing stays mapped)."""
        a = self.offsets[key][0]
        dt = self.meta[key].dtype
        buf = bytearray((stop - start) * dt.itemsize)
        with open(self.path, "rb", buffering=0) as fh:
            got = os.preadv(fh.fileno(), [buf], self.start + a + start * dt.itemsize) if buf else 0
        if got != len(buf):
            raise InputError(f"{self.path}: key {key!r} ends before its data offsets say; the file is damaged")
        return torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)


class Checkpoint:
    """A read-only checkpoint (:func:`open_checkpoint`): keys, per-key shape and dtype, one tensor at a time;
    ``config`` is the folder's ``config.json`` (or ``open_clip_config.json``), ``files`` the weight files."""

    def __init__(self, path: Path, files: list[Path], config: dict | None, folder: Path | None,
                 tensors: Mapping[str, Tensor] | None = None):  # tensors: a state dict in memory (no files)
        self.path = path
        self.files = files
        self.config = config
        self.folder = folder
        self._where: dict[str, _SafetensorsFile] = {}  # key -> the file holding it
        self._tensors: dict[str, Tensor] | None = None
        self._meta: dict[str, TensorMeta] = {}
        if tensors is None and all(f.suffix == ".safetensors" for f in files):
            for f in files:
                h = _SafetensorsFile(f)
                for k, m in h.meta.items():
                    if k in self._where:
                        raise InputError(f"{path}: key {k!r} is in two shards ({self._where[k].path.name}, {f.name})")
                    self._where[k] = h
                    self._meta[k] = m
        else:
            loaded: dict[str, Tensor] = {}
            for f in files:
                part = _torch_load(f) if f.suffix != ".safetensors" else load_file(str(f))
                for k in part:
                    if k in loaded:
                        raise InputError(f"{path}: key {k!r} is in two files")
                loaded.update(part)
            self._tensors = dict(tensors) if tensors is not None else loaded
            self._meta = {k: TensorMeta(tuple(v.shape), v.dtype) for k, v in self._tensors.items()}
        if not self._meta:
            raise InputError(f"{path}: the checkpoint holds no tensors")

    def keys(self) -> list[str]:
        return list(self._meta)

    def __contains__(self, key: object) -> bool:
        return key in self._meta

    def __len__(self) -> int:
        return len(self._meta)

    def __iter__(self) -> Iterator[str]:
        return iter(self._meta)

    def meta(self, key: str) -> TensorMeta:
        """Shape and dtype of ``key`` without reading its data."""
        try:
            return self._meta[key]
        except KeyError:
            raise InputKeyError(f"{self.path}: no tensor named {key!r}") from None

    def metas(self) -> dict[str, TensorMeta]:
        return dict(self._meta)

    def get(self, key: str) -> Tensor:
        """The tensor ``key`` (read from disk now for safetensors; a CPU tensor)."""
        self.meta(key)  # an unknown key is an error naming it
        return self._tensors[key] if self._tensors is not None else self._where[key].get(key)

    def get_flat(self, key: str, start: int, stop: int) -> Tensor:
        """Entries ``start:stop`` of the tensor ``key`` flattened in its stored order (a part of a large tensor
        read from disk now for safetensors, without reading or mapping the rest)."""
        n = math.prod(self.meta(key).shape)
        if not 0 <= start <= stop <= n:
            raise InputError(f"{self.path}: entries {start}:{stop} are outside {key!r} ({n} entries)")
        if self._tensors is not None:
            return self._tensors[key].reshape(-1)[start:stop]
        return self._where[key].get_flat(key, start, stop)

    def state_dict(self) -> dict[str, Tensor]:
        """Every tensor, loaded (the whole model in memory)."""
        return {k: self.get(k) for k in self._meta}

    def sha256(self) -> dict[str, str]:
        """``{file name: sha256}`` of the weight files."""
        return {str(f): file_sha256(f) for f in self.files}

    def close(self) -> None:
        self._where.clear()
        self._tensors = None

    def __repr__(self) -> str:
        kind = "safetensors" if self._tensors is None else "state dict"
        return f"Checkpoint({str(self.path)!r}, {len(self)} tensors, {kind}, {len(self.files)} file(s))"


def _read_json(path: Path) -> dict:
    try:
        with open(path) as fh:
            return json.load(fh)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None


def _index_files(index: Path) -> list[Path]:
    data = _read_json(index)
    wm = data.get("weight_map")
    if not isinstance(wm, Mapping) or not wm:
        raise InputError(f"{index}: has no weight_map; is it a sharded checkpoint index?")
    names = list(dict.fromkeys(wm.values()))  # each shard once, in order
    missing = [name for name in names if not (index.parent / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{index}: shard {missing[0]!r} is listed in the index but missing")
    files = [index.parent / name for name in names]
    if all(f.suffix == ".safetensors" for f in files):
        _check_weight_map(index, wm, files)
    return files


def _check_weight_map(index: Path, weight_map: Mapping[str, str], files: Sequence[Path]) -> None:
    """Every key of an index's ``weight_map`` is in the shard it names, by the shards' headers (no tensor
    data is read); else an error naming the first wrong entry and the shard that holds the key (a listed one
    or another ``*.safetensors`` file of the folder), or that no shard holds it."""
    held = {f.name: set(_SafetensorsFile(f).meta) for f in files}
    wrong = [(k, name) for k, name in weight_map.items() if k not in held[name]]
    if not wrong:
        return
    others = sorted(p for p in index.parent.glob("*.safetensors") if p.name not in held and not p.name.startswith("."))
    for f in others:
        try:
            held[f.name] = set(_SafetensorsFile(f).meta)
        except InputError:  # not a readable safetensors file: it holds nothing
            held[f.name] = set()
    key, name = wrong[0]
    where = [n for n, keys in held.items() if key in keys]
    found = f"it is in shard {where[0]!r}" if where else f"no shard in {index.parent} holds it"
    more = f" (and {len(wrong) - 1} more entries like it)" if len(wrong) > 1 else ""
    raise InputError(f"index {index} maps key {key!r} to shard {name!r}, which does not hold it ({found}){more}; "
                     "the index does not match its shards: re-save the model (save_pretrained) or fix the weight_map")


def _folder_files(folder: Path) -> list[Path]:
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            return _index_files(folder / index)
    for name in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin",
                 "open_clip_pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt"):
        found = sorted(p for p in folder.glob(pattern) if not p.name.startswith("."))
        if len(found) == 1:
            return found
        if len(found) > 1:
            raise InputError(f"{folder}: holds {len(found)} {pattern} files and no index; pass one file or add an "
                             "index (model.safetensors.index.json)")
    raise FileNotFoundError(f"{folder}: no weights found (model.safetensors, an index, or a .bin/.pt state dict)")


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Open a checkpoint file or folder for reading (formats: docs/your-models.md §What can be read)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"checkpoint not found: {p}")
    folder = p if p.is_dir() else None
    if (p / "adapter_config.json").is_file() or p.name in ("adapter_config.json", "adapter_model.safetensors"):
        raise InputError(f"{p}: is a peft adapter, not a checkpoint; give its folder as an expert beside the base "
                         "it was trained on, which acetools folds it onto "
                         "(docs/your-models.md §LoRA adapters as experts)")
    if p.is_dir():
        files = _folder_files(p)
    elif p.name.endswith(".index.json"):
        files = _index_files(p)
        folder = p.parent
    elif p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".ckpt"):
        files = [p]
    else:
        raise InputError(f"{p}: unknown checkpoint type; expected a folder, .safetensors, .index.json, .pt, .pth, "
                         ".bin or .ckpt")
    cdir = folder or p.parent  # beside a lone file only open_clip's config is taken as the file's
    names = ("config.json", "open_clip_config.json") if folder is not None else ("open_clip_config.json",)
    config = next((_read_json(cdir / name) for name in names if (cdir / name).is_file()), None)
    return Checkpoint(p, files, config, folder)


def as_checkpoint(obj: Any, name: str = "state dict") -> Checkpoint:
    """``obj`` as a :class:`Checkpoint`: itself, a path (:func:`open_checkpoint`), or a state dict in memory
    (``path`` is ``name``, no files); errors name ``name``."""
    if isinstance(obj, Checkpoint):
        return obj
    if isinstance(obj, Mapping):
        bad = next((k for k, v in obj.items() if not isinstance(v, Tensor)), None)
        if bad is not None:
            raise InputTypeError(f"{name}[{bad!r}] is a {type(obj[bad]).__name__}, not a torch.Tensor")
        return Checkpoint(Path(name), [], None, None, tensors=obj)
    if isinstance(obj, (str, os.PathLike)):
        return open_checkpoint(obj)
    raise InputTypeError(f"{name} is a {type(obj).__name__}; give a state dict or a checkpoint path")


def check_compatible(base: Checkpoint, experts: Sequence[Checkpoint], who: Sequence[str] | None = None,
                     base_name: str | None = None, layout: Layout | None = None) -> None:
    """Every expert has the base's keys and shapes, float tensors where the base has floats and the same
    dtype elsewhere; errors name the key, both shapes or dtypes and the expert (``who``, default its path).
    With ``layout``, a key that one side stores and the other ties away (:func:`check_ties`) is named so."""
    bname = base_name or f"base {base.path}"
    for i, ck in enumerate(experts):
        name = who[i] if who is not None else f"expert {ck.path}"
        if layout is not None:
            check_ties(base, ck, layout, name, f"the {bname}")
        check_same_keys(base.keys(), ck.keys(), name, f"the {bname}")
        for k in base.keys():
            mb, me = base.meta(k), ck.meta(k)
            if mb.shape != me.shape:
                raise InputError(f"shape mismatch at key {k!r}: {bname} has {tuple(mb.shape)}, {name} has "
                                 f"{tuple(me.shape)}")
            if mb.dtype.is_floating_point != me.dtype.is_floating_point or (
                    not mb.dtype.is_floating_point and mb.dtype != me.dtype):
                raise InputTypeError(f"dtype mismatch at key {k!r}: {bname} has {mb.dtype}, {name} has {me.dtype}")


def check_ties(base: Checkpoint, expert: Checkpoint, layout: Layout, who: str, base_name: str) -> None:
    """An error when ``expert`` stores a key that ``base`` ties away, or the other way round, by ``layout``'s
    tie rules (e.g. GPT-2's ``lm_head.weight``, the alias of ``transformer.wte.weight``, which ``save_pretrained``
    leaves out of a tied model's file): it names the alias, the key it is tied to, which side stores it untied
    and whether its values equal that key's, and how to re-save (docs/your-models.md §What can be read)."""
    for alias_p, canon_p in layout.tie_rules:
        for untied, tied, u_name, t_name in ((expert, base, who, base_name), (base, expert, base_name, who)):
            aliases = [k for k in untied.keys() if k not in tied and re.search(alias_p, k)]
            canons = [k for k in tied.keys() if re.search(canon_p, k)]
            if len(aliases) != 1 or len(canons) != 1 or canons[0] not in untied:
                continue
            alias, canon = aliases[0], canons[0]
            same = untied.meta(alias).shape == untied.meta(canon).shape and torch.equal(untied.get(alias),
                                                                                          untied.get(canon))
            tie_flag = (tied.config or {}).get("tie_word_embeddings")
            says = f" (config tie_word_embeddings={tie_flag})" if tie_flag is not None else ""
            fix = (f"its values equal its {canon!r}, so it is tied in all but the file: re-save it tied "
                   "(config tie_word_embeddings=true, model.tie_weights(), save_pretrained)" if same else
                   f"its values differ from its {canon!r} (trained untied): re-save the "
                   f"{'base' if untied is expert else 'experts'} untied (config tie_word_embeddings=false, "
                   f"save_pretrained) to merge {alias!r} apart")
            raise InputKeyError(f"{u_name} stores {alias!r} untied, but in {t_name} it is the tied alias of "
                                f"{canon!r}{says}, which its file holds alone; {fix}")


def check_output_folder(out: str | os.PathLike, inputs: Sequence[Checkpoint | str | os.PathLike],
                        overwrite: bool = False, *, weights: bool = True, option: str = "--out") -> Path:
    """The output folder of ``merge`` or ``diagnose``, refused when it is an input checkpoint folder or inside one,
    or the folder holding an input file; with ``weights``, a folder holding weights unless ``overwrite``."""
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output {out} exists and is not a folder")
    for ck in inputs:
        if isinstance(ck, Checkpoint):  # its folder (nothing written in or below it), its files' folders
            name, folders = ck.path, {ck.folder.resolve()} if ck.folder else set()
            file_dirs = {f.resolve().parent for f in ck.files}
        else:
            name, p = ck, Path(ck).expanduser().resolve()
            folders, file_dirs = ({p}, set()) if p.is_dir() else (set(), {p.parent})
        for f in folders:
            if f in out.parents:
                raise InputError(f"{option} {out} is inside the input checkpoint folder {f} ({name}); choose a folder "
                                 "outside every input (inputs are never written to)")
        if out in folders or out in file_dirs:
            raise InputError(f"output folder {out} holds the input checkpoint {name}; choose another {option} "
                             "(inputs are never overwritten)")
    if weights and out.is_dir() and not overwrite:
        old = sorted(p.name for p in out.iterdir() if p.suffix in WEIGHT_SUFFIXES or p.name.endswith(".index.json"))
        if old:
            raise FileExistsError(f"output folder {out} already holds weights ({old[0]}); choose an empty folder "
                                  "or pass overwrite=True / --overwrite")
    return out


def copy_side_files(src: Path | None, out: Path, max_bytes: int = 50_000_000) -> list[str]:
    """Copy the base folder's small non-weight files (config, tokenizer, ...) into ``out``."""
    if src is None:
        return []
    copied = []
    for f in sorted(src.iterdir()):
        if (not f.is_file() or f.name.startswith(".") or f.suffix in WEIGHT_SUFFIXES
                or f.name.endswith(".index.json") or f.stat().st_size > max_bytes):
            continue
        with atomic_write(out / f.name) as fh, open(f, "rb") as src_fh:
            shutil.copyfileobj(src_fh, fh)
        copied.append(f.name)
    return copied


class ShardedWriter:
    """Write tensors into safetensors shards of at most ``shard_size`` bytes (header included), atomically
    (docs/your-models.md §What is written).

    ``add`` writes a tensor's bytes at once; :meth:`close` names the shards as Hugging Face does and
    moves them into ``out`` together (until then they live in a hidden folder inside ``out``).
    ``metadata`` may be a function, called when the first shard is finished, with ``metadata_hint`` a
    mapping of its size. ``header_room`` (:meth:`header_room`) leaves room for each header in front of
    the data, so the data is written once, in place.
    """

    def __init__(self, out: str | os.PathLike, *, shard_size: int | str = "5GB",
                 metadata: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None, prefix: str = "model",
                 metadata_hint: Mapping[str, str] | None = None, header_room: int | None = None):
        self.out = Path(out)
        self.shard_size = parse_size(shard_size)
        self._late = metadata if callable(metadata) else None
        known = metadata_hint if callable(metadata) else metadata
        self.metadata = {"format": "pt", **{str(k): str(v) for k, v in (known or {}).items()}}
        self.prefix = prefix
        self.room = None if header_room is None else header_room + (-header_room % 8)
        self.out.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=".acetools-write-", dir=self.out))
        self._data = None
        self._entries: dict[str, dict[str, Any]] = {}
        self._shard_bytes = 0
        self._header_bytes = 0  # JSON bytes of the current shard's entries (each with its separator)
        self._meta_bytes = len(json.dumps({"__metadata__": self.metadata}, separators=(",", ":")))
        self._files: list[tuple[Path, list[str]]] = []
        self._keys: set[str] = set()
        self.total_size = 0
        self.closed = False

    def add(self, key: str, tensor: Tensor) -> None:
        if self.closed:
            raise RuntimeError("ShardedWriter is closed")
        if key in self._keys:
            raise InputError(f"key {key!r} written twice")
        t = tensor.detach().to("cpu").contiguous()
        if t.dtype not in _DTYPE_NAMES:
            raise InputTypeError(f"cannot write {key!r}: dtype {t.dtype} has no safetensors name")
        n = t.numel() * t.element_size()
        entry = {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                 "data_offsets": [self._shard_bytes, self._shard_bytes + n]}
        head = len(json.dumps({key: entry}, separators=(",", ":"))) + 1
        # the shard's file size, at most: 8 length bytes, the header (metadata + entries, padded to 8), the data
        room = self.room if self.room is not None else self._meta_bytes + self._header_bytes + head + 8
        if self._entries and 8 + room + self._shard_bytes + n > self.shard_size:
            self._flush()
            entry["data_offsets"] = [0, n]
            head = len(json.dumps({key: entry}, separators=(",", ":"))) + 1
        if self._data is None:
            self._data = open(self._tmp / f"shard-{len(self._files):05d}.data", "wb")
            if self.room is not None:
                self._data.seek(8 + self.room)  # the header goes in front when the shard is finished
        if n:
            self._data.write(t.reshape(-1).view(torch.uint8).numpy().data)
        self._entries[key] = entry
        self._keys.add(key)
        self._shard_bytes += n
        self._header_bytes += head
        self.total_size += n

    @staticmethod
    def header_room(tensors: Iterable[tuple[str, torch.dtype, Sequence[int]]], metadata: Mapping[str, str]) -> int:
        """Bytes that hold the header of any shard of ``tensors`` (``(key, dtype, shape)``, every tensor to be
        written) with ``metadata``."""
        items = list(tensors)
        total = sum(math.prod(s) * dt.itemsize for _, dt, s in items)
        meta = {"format": "pt", **{str(k): str(v) for k, v in metadata.items()}}
        n = len(json.dumps({"__metadata__": meta}, separators=(",", ":")))
        for key, dt, shape in items:
            n += len(json.dumps({key: {"dtype": _DTYPE_NAMES.get(dt, "F64"), "shape": list(shape),
                                       "data_offsets": [total, total]}}, separators=(",", ":"))) + 1
        return n + 8

    def _flush(self) -> None:
        if not self._entries:
            return
        if self._late is not None:
            self.metadata = {"format": "pt", **{str(k): str(v) for k, v in self._late().items()}}
            self._late = None
        data = self._data
        assert data is not None, "a shard with entries has its data file open"
        data_path = Path(data.name)
        data.close()
        self._data = None
        header = json.dumps({"__metadata__": self.metadata, **self._entries}, separators=(",", ":")).encode()
        path = self._tmp / f"shard-{len(self._files):05d}.safetensors"
        if self.room is not None and len(header) <= self.room:
            with open(data_path, "r+b") as fh:  # the data sits behind the room left for the header
                fh.write(self.room.to_bytes(8, "little"))
                fh.write(header + b" " * (self.room - len(header)))
            os.replace(data_path, path)
        else:
            header += b" " * (-len(header) % 8)
            with open(path, "wb") as out, open(data_path, "rb") as src:
                out.write(len(header).to_bytes(8, "little"))
                out.write(header)
                src.seek(8 + self.room if self.room is not None else 0)
                shutil.copyfileobj(src, out, 1 << 24)
            data_path.unlink()
        self._files.append((path, list(self._entries)))
        self._entries = {}
        self._shard_bytes = 0
        self._header_bytes = 0

    def close(self) -> list[Path]:
        """Save the last shard, move every file into place; returns the written files."""
        self._flush()
        n = len(self._files)
        if n == 0:
            raise InputError("nothing to write: no tensors were added")
        names = ([f"{self.prefix}.safetensors"] if n == 1
                 else [f"{self.prefix}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        written = [self.out / name for name in names]
        for (tmp, _), dest in zip(self._files, written):
            os.replace(tmp, dest)
        if n > 1:
            index = {"metadata": {"total_size": self.total_size, **self.metadata},
                     "weight_map": {k: name for (_, keys), name in zip(self._files, names) for k in keys}}
            with atomic_write(self.out / f"{self.prefix}.safetensors.index.json", "w") as fh:
                json.dump(index, fh, indent=2)
            written.append(self.out / f"{self.prefix}.safetensors.index.json")
        shutil.rmtree(self._tmp, ignore_errors=True)
        for old in self.out.glob(f"{self.prefix}*.safetensors*"):  # stale shards of an overwritten merge
            if old not in written and (old.suffix == ".safetensors" or old.name.endswith(".index.json")):
                old.unlink()
        self.closed = True
        return written

    def abort(self) -> None:
        """Drop everything written so far (nothing reaches ``out``)."""
        if self._data is not None:
            self._data.close()
            self._data = None
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._entries = {}
        self.closed = True

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.closed:
            self.close()


# --------------------------------------------------------------------------- hashed checkpoints with a sidecar
# The zoo's (and the text world's) cache format: safetensors with a content hash, and a JSON
# sidecar next to it holding the recipe and metrics (docs/style.md §7).


class CheckpointError(AcetoolsError, RuntimeError):
    """A checkpoint file is missing, unreadable, or its tensors do not match their hash."""


StateDict = dict[str, Tensor]


def state_hash(state: Mapping[str, Tensor]) -> str:
    """SHA-256 of a state dict's contents: every key (sorted), dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k]
        h.update(f"{k}|{str(t.dtype)}|{tuple(t.shape)}|".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def config_hash(obj: Any) -> str:
    """SHA-256 of a JSON-able object (canonical JSON: sorted keys, no whitespace)."""
    return hashlib.sha256(json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sidecar_path(path: Path) -> Path:
    """The JSON sidecar next to a hashed checkpoint: ``x.safetensors`` -> ``x.json``."""
    return path.with_suffix(".json")


def save_checkpoint(path: str | os.PathLike, state: Mapping[str, Tensor], meta: Mapping[str, Any]) -> dict:
    """Write ``state`` as safetensors, then ``meta`` (+ ``content_sha256``) as a JSON sidecar, both atomically;
    returns the sidecar dict."""
    path = Path(path)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    digest = state_hash(tensors)
    payload = save(tensors, metadata={"content_sha256": digest, "format": "pt"})
    with atomic_write(path, "wb") as fh:
        fh.write(payload)
    side = dict(jsonable(meta))
    side["content_sha256"] = digest
    side["file"] = path.name
    with atomic_write(sidecar_path(path), "w") as fh:
        json.dump(side, fh, indent=1, sort_keys=True)
    return side


def load_checkpoint(path: str | os.PathLike, *, verify: bool = True) -> tuple[StateDict, dict]:
    """Load a checkpoint and its sidecar (:class:`CheckpointError` if anything is off); with ``verify`` the
    tensors' hash must be the one recorded (the sidecar's ``content_sha256``, else the file's)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    side: dict = {}
    if sidecar_path(path).is_file():
        try:
            side = json.loads(sidecar_path(path).read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"unreadable sidecar {sidecar_path(path)}: {err}") from err
    try:
        state = load_file(str(path))
        file_meta = _SafetensorsFile(path).metadata
    except Exception as err:  # safetensors raises its own error types for truncated files
        raise CheckpointError(f"unreadable checkpoint {path}: {err}") from err
    if verify:
        want = side.get("content_sha256") or file_meta.get("content_sha256")
        got = state_hash(state)
        if want is None:
            raise CheckpointError(f"{path} has no recorded content hash to verify against")
        if got != want:
            raise CheckpointError(f"{path}: content hash {got[:12]}... does not match the recorded {want[:12]}...")
    return state, side
