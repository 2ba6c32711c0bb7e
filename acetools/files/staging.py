"""The lock on a merge output and its hidden staging folder (docs/your-models.md §What is written).

A merge holds :func:`lock_output` on ``--out`` (an advisory ``fcntl.flock`` on the file
``.<out name>.acetools-lock`` beside it, which holds the merge's process id) from its checks to the
rename; a second merge into the same ``--out`` is refused at once, naming that pid. The kernel drops the
lock of a process that dies, so a lock file a killed merge left is no lock. A new output is assembled in
``.<out name>.acetools-stage-<pid>-<random>`` and renamed into place when complete; the staging folders
(and ``--search`` scratch folders, ``.acetools-search-<pid>-``) whose process no longer runs and whose
output's lock nobody holds, of any output in the same parent folder, are removed by the next merge
writing there (:func:`remove_stale_stages`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError
from ..merging.driver import format_bytes

__all__ = ["STAGE_MARK", "SEARCH_MARK", "LOCK_MARK", "OutputLocked", "lock_path", "lock_output", "make_stage",
           "stale_stages", "remove_stale_stages", "umask_mode"]

log = logging.getLogger("acetools.files.staging")

#: The part of a staging folder's name between the output's name and the process id.
STAGE_MARK = ".acetools-stage-"
#: The same for the scratch folder of ``acetools merge --search`` (acetools/files/search_merge.py).
SEARCH_MARK = ".acetools-search-"
#: The end of the lock file's name: ``.<out name>.acetools-lock``.
LOCK_MARK = ".acetools-lock"
#: A folder left by a merge process: ``.<out name><mark><pid>-<random>``.
_LEFT = re.compile(r"^\.(?P<out>.+)(" + re.escape(STAGE_MARK) + "|" + re.escape(SEARCH_MARK)
                   + r")(?P<pid>\d+)-[A-Za-z0-9_]+$")


class OutputLocked(InputError):
    """Another merge (a live process) holds the lock on this output folder."""


def umask_mode(mode: int = 0o777) -> int:
    """``mode`` with the process's umask applied (what ``mkdir``/``open`` would create)."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 only asks whether the process exists (this one does)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    except (OverflowError, OSError):  # not a process id at all
        return False
    return True


def _size(folder: Path) -> int:
    """Bytes of the files under ``folder`` (links not followed)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def stale_stages(out_dir: Path) -> list[Path]:
    """Staging (and ``--search`` scratch) folders in ``out_dir``'s parent, of any output, whose merge process
    no longer runs (killed merges); a live merge's folders and any other hidden folder are not among them."""
    parent = Path(out_dir).parent
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir()
                  if (m := _LEFT.match(p.name)) and p.is_dir() and not p.is_symlink() and not _alive(int(m["pid"]))
                  and not _lock_held(parent / f".{m['out']}{LOCK_MARK}"))


def _lock_held(path: Path) -> bool:
    """Whether some process holds the lock file ``path`` (a merge running, maybe where its pid is not seen:
    another container on this folder); asked by taking a shared lock and dropping it at once. A lock this
    process holds is not another merge's."""
    with _held_guard:
        if any(path == held for held, _ in _held):
            return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def remove_stale_stages(out_dir: Path) -> list[Path]:
    """Remove the folders killed merges left beside ``out_dir`` (:func:`stale_stages`), each with one log line
    naming it and its size; returns them."""
    gone = stale_stages(out_dir)
    for old in gone:
        size = _size(old)
        shutil.rmtree(old, ignore_errors=True)
        pid = _LEFT.match(old.name)["pid"]  # type: ignore[index]  # stale_stages matched it
        log.info("removed %s (%s), left by a merge (pid %s) that was killed", old, format_bytes(size), pid)
    return gone


def lock_path(out_dir: Path) -> Path:
    """The lock file of the output folder ``out_dir``: ``.<name>.acetools-lock`` beside it."""
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}{LOCK_MARK}"


_held: dict[tuple[Path, int], int] = {}  # (lock file, thread) -> how many nested lock_output calls hold it
_held_guard = threading.Lock()


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "an unknown process"
    return f"pid {text}" if text.isdigit() else "an unknown process"


@contextmanager
def lock_output(out_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold the lock on the output folder ``out_dir`` (resolved) while the block runs; yields the lock file.

    Another process holding it is an :class:`OutputLocked` error at once, naming its pid and the lock file.
    Nested calls in one thread (``--search``'s final merge) share the lock; another thread is refused too.
    The lock file is removed when the lock is released; one that a killed merge left is taken over (the
    kernel released its lock when the process died). An existing ``out_dir`` in a folder that may not be
    written to holds its lock file itself (``.acetools-lock``).
    """
    out_dir = Path(out_dir).expanduser().resolve()
    path = lock_path(out_dir)
    mine = (path, threading.get_ident())
    with _held_guard:
        nested = mine in _held
        if nested:
            _held[mine] += 1
    if nested:
        try:
            yield path
        finally:
            with _held_guard:
                _held[mine] -= 1
        return
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:
        raise PermissionError(e.errno, f"cannot write the merge output {out_dir} (no permission to create "
                                       f"{out_dir.parent})", str(out_dir)) from None
    try:
        fd = _acquire(path, out_dir)
    except PermissionError:
        if not out_dir.is_dir():
            raise
        path = out_dir / LOCK_MARK  # a folder you may write in, in one you may not: the lock goes inside
        fd = _acquire(path, out_dir)
    with _held_guard:
        _held[mine] = 1
    try:
        yield path
    finally:
        with _held_guard:
            del _held[mine]
        try:
            path.unlink(missing_ok=True)  # while still held: a waiting process finds its file gone and retries
        finally:
            os.close(fd)  # releases the flock


def _acquire(path: Path, out_dir: Path) -> int:
    """Open ``path`` and take its exclusive flock without waiting; retried when the file was replaced meanwhile
    (its holder removed it on release)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except PermissionError as e:
            raise PermissionError(e.errno, f"cannot write the merge output {out_dir} (no permission to create "
                                           f"files in {out_dir.parent})", str(out_dir)) from None
        for wait in (0.01, 0.05, 0.2, None):  # a moment for a stale_stages probe, which holds it in passing
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if wait is None:
                    os.close(fd)
                    raise OutputLocked(f"another merge ({_holder(path)}) is writing {out_dir}: it holds the lock "
                                       f"{path}; wait for it to finish or choose another --out") from None
                time.sleep(wait)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder released it and removed the file after we opened it: take the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def make_stage(out_dir: Path) -> Path:
    """A new hidden staging folder beside ``out_dir`` (which does not exist yet), with a plain ``mkdir``'s
    permissions, after removing the stale ones; a PermissionError names ``out_dir``'s parent."""
    out_dir = Path(out_dir)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_stages(out_dir)
        stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}{STAGE_MARK}{os.getpid()}-", dir=out_dir.parent))
    except PermissionError as e:
        raise PermissionError(e.errno, f"cannot write the merge output {out_dir} (no permission to create files "
                                       f"in {out_dir.parent})", str(out_dir)) from None
    os.chmod(stage, umask_mode())  # mkdtemp's 0700 would stay on the renamed folder
    return stage
