"""Small shared helpers: seeding (:func:`seed_everything`, :func:`make_generator`), devices, progress
bars, atomic writes and JSON records."""

from __future__ import annotations

import contextvars
import dataclasses
import json
import math
import os
import random
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path, PurePath
from typing import Any, TypeVar

import numpy as np
import torch

from .errors import InputError, InputTypeError

T = TypeVar("T")

# Set by acetools.merge(progress=...) for the duration of one call; None = decide automatically.
PROGRESS: contextvars.ContextVar[bool | None] = contextvars.ContextVar("acetools_progress", default=None)

__all__ = ["seed_everything", "make_generator", "resolve_device", "progress", "atomic_write", "jsonable", "short_repr",
           "local_mathjax_url", "strip_ansi", "format_bytes"]


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch (CPU and CUDA); returns a CPU ``torch.Generator`` seeded alike."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputTypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    return make_generator(seed)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (no global state touched)."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def resolve_device(device: str | torch.device | None = "cpu") -> torch.device:
    """``"auto"``/``None`` (CUDA when available, else the CPU) or a device name as a ``torch.device``;
    ``InputError`` for a device that is not there or cannot compute."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InputError(f"device={device!r} is not a device torch knows ({e}); use 'cpu', 'cuda' or 'auto'") from None
    if dev.type not in _COMPUTE_DEVICES:
        why = _NOT_COMPUTE.get(dev.type, "not a compute device here")
        raise InputError(f"device={str(device)!r} cannot compute a merge ({why}); use device='cpu', 'cuda' or 'auto'")
    backend = getattr(torch, dev.type, None) if dev.type != "mps" else getattr(torch.backends, "mps", None)
    if dev.type != "cpu" and (backend is None or not backend.is_available()):
        name = "CUDA" if dev.type == "cuda" else dev.type
        raise InputError(f"device={str(device)!r} was requested but no {name} device is available; "
                         "use device='cpu' or device='auto'.")
    return dev


_COMPUTE_DEVICES = ("cpu", "cuda", "mps", "xpu")
_NOT_COMPUTE = {"meta": "a meta tensor holds shapes and no data, so the merged weights would be empty"}


def _interactive() -> bool:
    if os.environ.get("ACETOOLS_PROGRESS") == "1":
        return True
    if os.environ.get("ACETOOLS_PROGRESS") == "0" or os.environ.get("CI"):
        return False
    with suppress(Exception):  # inside Jupyter (IPython may be missing)
        from IPython import get_ipython  # type: ignore

        ip = get_ipython()
        if ip is not None and "IPKernelApp" in getattr(ip, "config", {}):
            return True
    return sys.stderr.isatty()


def progress(iterable: Iterable[T], desc: str | None = None, total: int | None = None, enabled: bool | None = None,
             **kwargs) -> Iterator[T]:
    """``iterable`` in a ``tqdm.auto`` bar; ``enabled=None``: in a terminal or notebook, not in CI,
    papermill or redirected output (``ACETOOLS_PROGRESS=1``/``0`` forces it)."""
    enabled = PROGRESS.get() if enabled is None else enabled
    show = _interactive() if enabled is None else enabled
    if not show:
        return iter(iterable)
    from tqdm.auto import tqdm

    return iter(tqdm(iterable, desc=desc, total=total, leave=False, **kwargs))


@contextmanager
def cpu_threads(n: int | None = None, *, env_default: bool = False) -> Iterator[int]:
    """Run the block with torch's CPU threads set to ``n`` (None or <= 0: unchanged), restored afterwards;
    yields the threads in force. ``env_default``: ``n=None`` takes ``$ACETOOLS_NUM_THREADS`` (the vision
    mini-world does; the text world's profile decides its own)."""
    if n is None and env_default:
        raw = os.environ.get("ACETOOLS_NUM_THREADS", "").strip()
        if raw:
            try:
                n = int(raw)
            except ValueError:
                raise InputError(f"ACETOOLS_NUM_THREADS={raw!r} must be an integer number of CPU threads") from None
    old = torch.get_num_threads()
    if n is not None and n > 0 and n != old:
        torch.set_num_threads(int(n))
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb"):
    """Write through a temporary file next to ``path``, moved into place on success (no partial file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
        # mkstemp creates 0600; give the file the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonable(obj: Any, *, finite: bool = False, summarize: bool = False,
             fallback: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` in JSON's types, recursively (the one converter for records, sidecars and config hashes).

    ``finite``: NaN and ±inf become None; ``summarize``: tensors and callables become short descriptions;
    ``fallback``: ``obj`` as it is if ``json.dumps`` takes it, else ``fallback(obj)`` (no recursion).
    """
    if fallback is not None:
        try:
            json.dumps(obj)
            return obj
        except TypeError:
            return fallback(obj)
    kw: dict[str, Any] = {"finite": finite, "summarize": summarize}
    if summarize and isinstance(obj, torch.Tensor):
        return f"<tensor {tuple(obj.shape)}>"
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v, **kw) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, **kw) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj), **kw)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if summarize and callable(obj):
        return f"<callable {getattr(obj, '__name__', type(obj).__name__)}>"
    if finite and isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units: ``"351.0 MB"``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n}"


def short_repr(v: Any) -> str:
    """A value in a few characters (``"<3 entries>"``, ``"<5 keys>"``, else its repr or str)."""
    if isinstance(v, (list, tuple)) and v and not isinstance(v[0], (str, int, float)):
        return f"<{len(v)} entries>"
    if isinstance(v, Mapping):
        return f"<{len(v)} keys>"
    return repr(v) if isinstance(v, str) else str(v)


def local_mathjax_url() -> str | None:
    """A local MathJax 2 as a ``file://`` URL (``$ACETOOLS_MATHJAX``, else Debian's ``libjs-mathjax``), or
    None; never a CDN."""
    for c in (os.environ.get("ACETOOLS_MATHJAX", ""), "/usr/share/javascript/mathjax/MathJax.js",
              "/usr/share/mathjax/MathJax.js"):
        if c and Path(c).is_file():
            return Path(c).resolve().as_uri() + "?config=TeX-AMS_CHTML"
    return None


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (torch's unpickling errors colour their advice)."""
    return _ANSI.sub("", text)
