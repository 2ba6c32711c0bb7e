"""The offline real-image sources, found on disk without downloading or importing their packages:
Fashion-MNIST (Debian ``dataset-fashion-mnist``), Animal-MNIST (PyPI ``animal-mnist``'s data files) and
scikit-learn's 8×8 digits; each deduplicated by image bytes and cut into fixed, disjoint partitions.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import io
import math
import pickle
from pathlib import Path
from typing import Any, cast

import numpy as np
from PIL import Image

from ....errors import InputError
from ._core import DataSourceError, stable_int

ANIMAL_CLASSES: tuple[str, ...] = ("bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep",
                                   "zebra")
FASHION_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
_FASHION_FILES = {
    "train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte",
}
_ANIMAL_FILES = ("animal_data_version_3.gz", "animal_label_version_3.gz")


# ------------------------------------------------------------------ readers
def read_idx(path: Path) -> np.ndarray:
    """An IDX file (optionally gzipped) as a NumPy array."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise InputError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape).copy()


def _find(dirs: list[Path], name: str) -> Path | None:
    for d in dirs:
        for cand in (d / name, d / f"{name}.gz"):
            if cand.is_file():
                return cand
    return None


def fashion_mnist(root: Path, allow_download: bool = False) -> dict[str, np.ndarray]:
    """Fashion-MNIST as ``train_x [60000,28,28]``, ``train_y``, ``test_x``, ``test_y``.

    Looks in ``<root>/fashion-mnist/``, ``<root>/torchvision/FashionMNIST/raw/`` and
    ``/usr/share/datasets/fashion-mnist/``; with ``allow_download=True`` it lets torchvision
    download the files into ``<root>/torchvision/``.
    """
    dirs = [root / "fashion-mnist", root / "torchvision" / "FashionMNIST" / "raw", FASHION_SYSTEM_DIR]
    paths = {k: _find(dirs, v) for k, v in _FASHION_FILES.items()}
    if any(p is None for p in paths.values()) and allow_download:
        from torchvision.datasets import FashionMNIST

        for train in (True, False):
            FashionMNIST(str(root / "torchvision"), train=train, download=True)
        paths = {k: _find(dirs, v) for k, v in _FASHION_FILES.items()}
    if any(p is None for p in paths.values()):
        missing = [v for k, v in _FASHION_FILES.items() if paths[k] is None]
        raise DataSourceError(
            f"Fashion-MNIST not found (missing {', '.join(missing)}; looked in "
            f"{', '.join(str(d) for d in dirs)}). Get it with `apt-get install dataset-fashion-mnist` "
            f"(Debian/Ubuntu), or copy the four IDX files (.gz or not) into {dirs[0]}, or pass "
            f"allow_download=True to let torchvision download them into {root / 'torchvision'}."
        )
    return _read_fashion(tuple(str(paths[k]) for k in _FASHION_FILES))


@functools.lru_cache(maxsize=2)
def _read_fashion(paths: tuple[str, ...]) -> dict[str, np.ndarray]:
    arrays = dict(zip(_FASHION_FILES, (read_idx(Path(p)) for p in paths)))
    for k in ("train_y", "test_y"):
        arrays[k] = arrays[k].astype(np.int64)
    return arrays


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles NumPy arrays and nothing else (the Animal-MNIST files are pickles)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from an Animal-MNIST file")


def animal_mnist_dir() -> Path | None:
    """The installed ``animal_mnist`` package's data folder, found without importing it
    (importing it imports TensorFlow)."""
    spec = importlib.util.find_spec("animal_mnist")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "Animal_MNIST"


def animal_mnist(root: Path) -> dict[str, np.ndarray]:
    """Animal-MNIST: ``x [10000,28,28]`` uint8 silhouettes and ``y`` (10 animals).

    Looks in ``<root>/animal-mnist/`` and in the installed ``animal_mnist`` package.
    """
    dirs = [root / "animal-mnist"]
    pkg = animal_mnist_dir()
    if pkg is not None:
        dirs.append(pkg)
    for d in dirs:
        if all((d / f).is_file() for f in _ANIMAL_FILES):
            return _read_animals(str(d))
    raise DataSourceError(
        "Animal-MNIST not found (looked in " + ", ".join(str(d) for d in dirs) + "). Install its data "
        "files with `pip install --no-deps animal-mnist==0.4` (--no-deps: acetools reads the files and "
        f"never imports the package, which needs TensorFlow), or copy {_ANIMAL_FILES[0]} and "
        f"{_ANIMAL_FILES[1]} into {dirs[0]}."
    )


@functools.lru_cache(maxsize=2)
def _read_animals(d: str) -> dict[str, np.ndarray]:
    out = []
    for f in _ANIMAL_FILES:
        with gzip.open(Path(d) / f, "rb") as fh:
            out.append(np.asarray(_NumpyOnlyUnpickler(io.BytesIO(fh.read())).load()))
    x, y = out
    if x.shape[1:] != (28, 28) or len(x) != len(y):
        raise InputError(f"unexpected Animal-MNIST arrays {x.shape}, {y.shape} in {d}")
    return {"x": x.astype(np.uint8), "y": y.astype(np.int64)}


def sklearn_digits() -> dict[str, np.ndarray]:
    """scikit-learn's bundled 8×8 digits: ``x [1797,8,8]`` float in 0..16 and ``y``."""
    from sklearn.datasets import load_digits  # scikit-learn is a dependency of acetools
    d = cast(Any, load_digits())  # a Bunch (sklearn types the return_X_y=True tuple beside it)
    return {"x": d.images.astype(np.float64), "y": d.target.astype(np.int64)}


# ------------------------------------------------------------------ dedupe & partitions
def dedupe(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the first copy of each distinct image; images seen with two labels are dropped."""
    first: dict[bytes, int] = {}
    bad: set[bytes] = set()
    flat = np.ascontiguousarray(x).reshape(len(x), -1)
    for i, row in enumerate(flat):
        h = hashlib.blake2b(row.tobytes(), digest_size=16).digest()
        j = first.get(h)
        if j is None:
            first[h] = i
        elif y[j] != y[i]:
            bad.add(h)
    return np.array(sorted(i for h, i in first.items() if h not in bad), dtype=np.int64)


def partition(y: np.ndarray, idx: np.ndarray, sizes: dict[str, int | float], seed_key: str) -> dict[str, list]:
    """Cut ``idx`` (indices into ``y``) into named parts, class by class, after a seeded shuffle.

    ``sizes`` maps a part's name to images per class (int), a fraction of the class (float),
    or ``-1`` for "the rest" (at most one part). Returns, per part, a list indexed by class
    of index arrays (in shuffled order); classes absent from ``idx`` get empty arrays.
    """
    n_classes = int(y[idx].max()) + 1 if len(idx) else 0
    parts: dict[str, list[np.ndarray]] = {k: [] for k in sizes}
    for c in range(n_classes):
        members = idx[y[idx] == c]
        rng = np.random.Generator(np.random.PCG64(stable_int("partition", seed_key, c)))
        members = members[rng.permutation(len(members))]
        start, frac = 0, 0.0
        for k, s in sizes.items():
            if s == -1:
                continue
            if isinstance(s, float):  # cumulative rounding, so fractions summing to 1 use every image
                frac += s
                m = int(round(frac * len(members))) - start
            else:
                m = int(s)
            if start + m > len(members):
                raise InputError(f"class {c} of {seed_key} has {len(members)} images, fewer than the "
                                 f"{start + m} that its parts need")
            parts[k].append(members[start:start + m])
            start += m
        for k, s in sizes.items():
            if s == -1:
                parts[k].append(members[start:])
    return parts


def take_balanced(per_class: list[np.ndarray], labels: np.ndarray, cycle: bool = False) -> np.ndarray:
    """Source indices for a sequence of class ``labels``: the k-th time class c occurs it
    takes the k-th member of ``per_class[c]`` (with ``cycle``, wrapping around; without,
    running out is an error)."""
    counters = np.zeros(len(per_class), dtype=np.int64)
    out = np.empty(len(labels), dtype=np.int64)
    for i, c in enumerate(labels):
        members = per_class[c]
        k = counters[c]
        if k >= len(members) and not cycle:
            raise InputError(f"class {c} has only {len(members)} images in this split; ask for fewer")
        out[i] = members[k % len(members)]
        counters[c] += 1
    return out


# ------------------------------------------------------------------ image conversion
def pad28(x: np.ndarray) -> np.ndarray:
    """28×28 grey images → 32×32 (2-px black border, as in MNIST's LeNet setup)."""
    return np.pad(x, ((0, 0), (2, 2), (2, 2)))


def handwritten_digit(rng: np.random.Generator, src: np.ndarray) -> np.ndarray:
    """An 8×8 scikit-learn digit (0..16) upsampled to 32×32 with a random scale, rotation,
    shear and shift; returns a grey uint8 32×32 image (white on black)."""
    im = Image.fromarray(np.clip(src * (255.0 / 16.0), 0, 255).astype(np.uint8), mode="L")
    s = rng.uniform(2.7, 3.3)  # output px per source px
    a = math.radians(rng.uniform(-12, 12))
    sh = rng.uniform(-0.15, 0.15)
    dx, dy = rng.uniform(-2.0, 2.0, 2)
    c, si = math.cos(a), math.sin(a)
    # out = s * R * Sh * (in - 4) + (16 + d);  in = Sh^-1 R^T (out - 16 - d) / s + 4
    r_inv = np.array([[c, -si], [si, c]]).T
    sh_inv = np.array([[1.0, -sh], [0.0, 1.0]])
    m = sh_inv @ r_inv / s
    ox, oy = 16 + dx, 16 + dy
    coeffs = (m[0, 0], m[0, 1], 4 - m[0, 0] * ox - m[0, 1] * oy, m[1, 0], m[1, 1], 4 - m[1, 0] * ox - m[1, 1] * oy)
    out = im.transform((32, 32), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BICUBIC)
    a = np.asarray(out, dtype=np.float32) / 255.0
    a = np.clip((a - 0.15) / 0.7, 0, 1)  # crisper strokes
    a += rng.uniform(0, 0.03) * rng.standard_normal(a.shape, dtype=np.float32)
    return np.clip(np.rint(a * 255), 0, 255).astype(np.uint8)
