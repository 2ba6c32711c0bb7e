"""Shared types and plumbing of ``acetools.world.vision.data``: records, errors, per-sample seeds
(prefix-stable builders), balanced labels and the ``.npz`` cache (docs/vision-world.md §The tasks)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ....errors import AcetoolsError, InputError
from ....utils import atomic_write

SPLITS: tuple[str, ...] = ("train", "val", "test")
IMAGE_SIZE = 32

__all__ = ["SPLITS", "IMAGE_SIZE", "DataSourceError", "TaskInfo", "TaskData", "PretrainData", "data_root", "stable_int",
           "SampleStream", "balanced_labels", "digest_arrays"]


class DataSourceError(AcetoolsError, RuntimeError):
    """A data source is missing; the message says exactly how to obtain it."""


@dataclass(frozen=True)
class TaskInfo:
    """What a task is (its data: :func:`acetools.world.vision.data.load_split`). Tasks with the same
    ``generator`` share an input distribution; ``conflicts_with`` names those that label it otherwise."""

    name: str
    n_classes: int
    class_names: tuple[str, ...]
    domain: str
    source: str
    description: str
    conflicts_with: tuple[str, ...] = ()
    generator: str = ""
    sizes: Mapping[str, int] = field(default_factory=lambda: {"train": 5000, "val": 500, "test": 1000})
    online: bool = False

    def __post_init__(self):
        if len(self.class_names) != self.n_classes:
            raise InputError(f"task {self.name!r}: {len(self.class_names)} class names for {self.n_classes} classes")


@dataclass
class TaskData:
    """One split of one task: ``x`` uint8 ``[N, 3, 32, 32]``, ``y`` int64 ``[N]``."""

    x: torch.Tensor
    y: torch.Tensor
    class_names: tuple[str, ...]
    name: str
    split: str

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    def digest(self) -> str:
        """SHA-256 of the image and label bytes (to record which data a result used)."""
        return digest_arrays(self.x.numpy(), self.y.numpy())

    def __repr__(self) -> str:
        return (f"TaskData(name={self.name!r}, split={self.split!r}, n={len(self)}, "
                f"n_classes={self.n_classes}, x={tuple(self.x.shape)} {self.x.dtype})")


@dataclass
class PretrainData:
    """The pretraining pool: images, one label vector per head (-1 where it does not apply)."""

    x: torch.Tensor
    labels: dict[str, torch.Tensor]
    head_classes: dict[str, int]
    head_class_names: dict[str, tuple[str, ...]]
    source: torch.Tensor  # int64 [N]: index into ``sources``
    sources: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def digest(self) -> str:
        return digest_arrays(self.x.numpy(), *[self.labels[k].numpy() for k in sorted(self.labels)])

    def __repr__(self) -> str:
        heads = ", ".join(f"{k}:{v}" for k, v in self.head_classes.items())
        return f"PretrainData(n={len(self)}, sources={self.sources}, heads={{{heads}}})"


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The data folder: ``root``, else ``$ACETOOLS_DATA``, else ``~/.cache/acetools/data`` (the task cache
    ``cache/``, optional copies of offline sources, torchvision downloads ``torchvision/``)."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("ACETOOLS_DATA")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "acetools" / "data"


def stable_int(*parts) -> int:
    """A 64-bit integer from the string forms of ``parts`` (stable across runs and machines)."""
    h = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "little")


def _philox_state(stream: int, index: int) -> dict:
    key = np.array([stream & 0xFFFFFFFFFFFFFFFF, (stream >> 64) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    counter = np.array([0, 0, 0, index & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    return {"bit_generator": "Philox", "state": {"counter": counter, "key": key},
            "buffer": np.zeros(4, dtype=np.uint64), "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}


class SampleStream:
    """Per-sample generators of ``stream``: ``rng(i)`` rewinds one shared counter-based generator
    (Philox, key = stream, counter = i) to sample ``i``, so samples are independent of each other and
    of the order they are drawn in."""

    def __init__(self, stream: int):
        self.stream = stream
        self._g = np.random.Generator(np.random.Philox(key=0))

    def rng(self, index: int) -> np.random.Generator:
        self._g.bit_generator.state = _philox_state(self.stream, index)
        return self._g


def balanced_labels(stream: int, n: int, n_classes: int) -> np.ndarray:
    """``n`` labels in blocks of ``n_classes``, each a permutation seeded by its index (prefix-stable)."""
    n_blocks = -(-n // n_classes)
    ss = SampleStream(stable_int("labels", stream))
    blocks = [ss.rng(b).permutation(n_classes) for b in range(n_blocks)]
    out = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
    return out[:n].astype(np.int64)


def digest_arrays(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def row_hashes(x: np.ndarray | torch.Tensor) -> list[bytes]:
    """A 16-byte hash of each image (row) — to test splits for shared images."""
    if isinstance(x, torch.Tensor):
        x = x.numpy()
    x = np.ascontiguousarray(x).reshape(len(x), -1)
    return [hashlib.blake2b(r.tobytes(), digest_size=16).digest() for r in x]


# --------------------------------------------------------------------------- cache
def cache_key(params: Mapping) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_path(root: Path, stem: str, params: Mapping) -> Path:
    return root / "cache" / f"{stem}-{cache_key(params)}.npz"


def save_npz(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
    """Write ``arrays`` and a JSON ``meta`` record to ``path`` atomically (zlib level 1)."""
    buf = io.BytesIO()
    meta_bytes = json.dumps(meta, sort_keys=True, default=str).encode()
    payload: dict[str, Any] = {**arrays, "__meta__": np.frombuffer(meta_bytes, dtype=np.uint8)}
    np.savez(buf, **payload)  # (typed Any: numpy's stub would match the arrays against allow_pickle)
    raw = buf.getvalue()
    with atomic_write(path) as fh:
        fh.write(b"ACEZ1")
        fh.write(zlib.compress(raw, 1))


def load_npz(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    with open(path, "rb") as fh:
        head = fh.read(5)
        if head != b"ACEZ1":
            raise InputError(f"{path} is not an acetools data cache file")
        raw = zlib.decompress(fh.read())
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
        meta = json.loads(bytes(z["__meta__"]).decode())
    return arrays, meta


def to_tensor_images(x: np.ndarray) -> torch.Tensor:
    """``[N, H, W, C]`` or ``[N, H, W]`` uint8 → ``[N, 3, H, W]`` uint8 tensor."""
    if x.ndim == 3:
        x = np.repeat(x[..., None], 3, axis=-1)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def check_split_args(split: str, n: int | None) -> None:
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; use one of {SPLITS}")
    if n is not None and (not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0):
        raise InputError(f"n must be a non-negative int or None, got {n!r}")


def suggest(name: str, known: Sequence[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(known), n=3)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""
