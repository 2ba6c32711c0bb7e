"""The hidden staging folder ``.<out name>.acetools-stage-<pid>-<random>`` a new merge output is assembled in
and renamed into place when complete (docs/your-models.md §What is written).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

__all__ = ["STAGE_MARK", "make_stage", "stale_stages", "remove_stale_stages", "umask_mode"]

log = logging.getLogger("acetools.files.staging")

#: The part of a staging folder's name between the output's name and the process id.
STAGE_MARK = ".acetools-stage-"


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
    return True


def stale_stages(out_dir: Path) -> list[Path]:
    """Staging folders of ``out_dir`` whose merge process no longer runs (killed merges)."""
    out_dir = Path(out_dir)
    pattern = re.compile(r"^\." + re.escape(out_dir.name) + re.escape(STAGE_MARK) + r"(\d+)-")
    if not out_dir.parent.is_dir():
        return []
    return sorted(p for p in out_dir.parent.iterdir()
                  if (m := pattern.match(p.name)) and p.is_dir() and not p.is_symlink() and not _alive(int(m.group(1))))


def remove_stale_stages(out_dir: Path) -> list[Path]:
    """Remove the staging folders killed merges of ``out_dir`` left (:func:`stale_stages`); returns them."""
    gone = stale_stages(out_dir)
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
        log.info("removed %s, left by a merge that was killed", old)
    return gone


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
