"""The lock on a merge output and the leftovers of killed merges (acetools/files/staging.py; docs/your-models.md
§What is written): a merge killed with SIGKILL part-way, two merges into one ``--out`` at once, and the next
merge into any output of the same parent folder removing what the killed one left, and nothing else."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from acetools.cli import main
from acetools.files.merge_files import merge_files
from acetools.files.staging import (
    LOCK_MARK,
    SEARCH_MARK,
    STAGE_MARK,
    OutputLocked,
    lock_output,
    lock_path,
    remove_stale_stages,
    stale_stages,
)
from acetools.merging.driver import format_bytes

ROOT = Path(__file__).resolve().parents[1]

#: A merge in a child process that stops (sleeps) after writing its first tensor into the staging folder, and
#: says so by creating the file argv[1]; the parent kills it or lets it wait.
PAUSED_MERGE = """
import sys, time
from pathlib import Path
from acetools.files import checkpoints
from acetools.files.merge_files import merge_files

ready, base, out, experts = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
add = checkpoints.ShardedWriter.add

def paused_add(self, key, tensor):
    add(self, key, tensor)
    self._data.flush()
    ready.touch()
    time.sleep(60)

checkpoints.ShardedWriter.add = paused_add
merge_files("task_arithmetic", base, experts, out, hash_inputs=False)
"""


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.fixture
def models(tmp_path) -> tuple[Path, list[Path]]:
    """A base and two experts as safetensors files (in their own folder, apart from the outputs'), 1 MB each."""
    g = torch.Generator().manual_seed(0)
    folder = tmp_path / "models"
    folder.mkdir()
    base = {f"layers.{i}.weight": torch.randn(256, 256, generator=g) for i in range(4)}
    save_file(base, str(folder / "base.safetensors"))
    experts = []
    for t in range(2):
        save_file({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in base.items()},
                  str(folder / f"expert{t}.safetensors"))
        experts.append(folder / f"expert{t}.safetensors")
    return folder / "base.safetensors", experts


def _paused_merge(tmp_path: Path, models, out: Path) -> tuple[subprocess.Popen, Path]:
    """Start :data:`PAUSED_MERGE` into ``out`` and wait until it has written into its staging folder."""
    base, experts = models
    ready = tmp_path / f"ready-{out.name}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "ACETOOLS_PROGRESS": "0"}
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_MERGE, str(ready), str(base), str(out), *map(str, experts)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the paused merge stopped: {proc.communicate()[1].decode()[-2000:]}")
        assert time.monotonic() < deadline, "the paused merge did not start writing within 60 s"
        time.sleep(0.05)
    return proc, lock_path(out)


@pytest.mark.slow  # a child process that imports torch
def test_a_killed_merge_leaves_only_a_stage_that_the_next_merge_in_the_folder_removes(models, tmp_path, caplog):
    base, experts = models
    out = tmp_path / "merged"
    proc, lock = _paused_merge(tmp_path, models, out)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = sorted(tmp_path.glob(f".merged{STAGE_MARK}{proc.pid}-*"))
    assert len(left) == 1 and not out.exists()  # the killed merge: a partial staging folder, no --out
    size = sum(f.stat().st_size for f in left[0].rglob("*") if f.is_file())
    assert size >= 256 * 256 * 4  # the first tensor was written
    assert lock.read_text().strip() == str(proc.pid)  # its lock file stays, but the kernel released the lock
    live = tmp_path / f".other{STAGE_MARK}{os.getpid()}-abc123"  # a live merge's folder stays
    live.mkdir()
    unrelated = [tmp_path / ".cache", tmp_path / f".merged{STAGE_MARK}notapid-x", tmp_path / ".git"]
    for d in unrelated:
        d.mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    before = {p for p in tmp_path.iterdir()} - set(left)

    caplog.set_level(logging.INFO, logger="acetools.files.staging")
    merge_files("task_arithmetic", base, experts, tmp_path / "second", hash_inputs=False)  # another --out, same folder
    removed = [r.getMessage() for r in caplog.records if r.name == "acetools.files.staging"]
    assert len(removed) == 1 and str(left[0]) in removed[0] and f"pid {proc.pid}" in removed[0], removed
    assert f"({format_bytes(size)})" in removed[0], (format_bytes(size), removed)
    assert not left[0].exists()
    assert {p for p in tmp_path.iterdir()} == before | {tmp_path / "second"}  # nothing else changed
    assert (tmp_path / "notes.txt").read_text() == "mine" and all(d.is_dir() for d in [live, *unrelated])

    merge_files("task_arithmetic", base, experts, out, hash_inputs=False)  # a dead holder's lock is no lock
    assert (out / "model.safetensors").is_file() and not lock.exists()


@pytest.mark.slow  # a child process that imports torch
def test_a_second_merge_into_the_same_out_is_refused_at_once_naming_the_holder(models, tmp_path, capsys):
    base, experts = models
    out = tmp_path / "merged"
    proc, lock = _paused_merge(tmp_path, models, out)
    try:
        t0 = time.perf_counter()
        with pytest.raises(OutputLocked) as e:
            merge_files("task_arithmetic", base, experts, out, hash_inputs=False)
        assert time.perf_counter() - t0 < 5  # at once, not after waiting for the other merge
        msg = str(e.value)
        assert f"pid {proc.pid}" in msg and str(lock) in msg and str(out) in msg and "\n" not in msg, msg
        argv = ["merge", "--method", "task_arithmetic", "--base", str(base), "--experts", *map(str, experts),
                "--out", str(out), "-q"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pid {proc.pid}" in err[0] and str(lock) in err[0], err
        stages = list(tmp_path.glob(f".merged{STAGE_MARK}*"))
        assert len(stages) == 1 and f"{STAGE_MARK}{proc.pid}-" in stages[0].name  # the live merge's, untouched
        merge_files("task_arithmetic", base, experts, tmp_path / "beside", hash_inputs=False)  # another --out
        assert stages[0].is_dir()  # a live merge's staging folder is kept
    finally:
        proc.kill()
        proc.wait()
    assert not out.exists()


def test_the_lock_is_shared_by_nested_calls_of_one_thread_and_refuses_another_thread(tmp_path):
    out = tmp_path / "merged"
    with lock_output(out) as lock:
        assert lock == tmp_path / f".merged{LOCK_MARK}" and lock.read_text().strip() == str(os.getpid())
        with lock_output(tmp_path / "." / "merged"):  # the same folder, nested (the --search final merge)
            assert lock.exists()
        assert lock.exists()
        caught: list[BaseException] = []

        def other() -> None:
            try:
                with lock_output(out):
                    pass
            except BaseException as e:  # noqa: BLE001  (handed to the test's thread)
                caught.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(caught) == 1 and isinstance(caught[0], OutputLocked) and f"pid {os.getpid()}" in str(caught[0])
    assert not lock.exists()


def test_stale_folders_of_any_output_and_search_scratch_are_found_but_nothing_else(tmp_path):
    dead = _dead_pid()
    stale = [tmp_path / f".a{STAGE_MARK}{dead}-k2j_x1", tmp_path / f".b.c{STAGE_MARK}{dead}-zz",
             tmp_path / f".a{SEARCH_MARK}{dead}-q9"]
    kept = [tmp_path / f".a{STAGE_MARK}{os.getpid()}-live", tmp_path / f".a{STAGE_MARK}{dead}",
            tmp_path / f"a{STAGE_MARK}{dead}-nodot", tmp_path / ".hidden", tmp_path / f".x{STAGE_MARK}{dead}-a.b"]
    for d in stale + kept:
        d.mkdir()
    (tmp_path / f".f{STAGE_MARK}{dead}-file").write_text("a file, not a folder")
    assert stale_stages(tmp_path / "anything") == sorted(stale)
    assert remove_stale_stages(tmp_path / "anything") == sorted(stale)
    assert not any(d.exists() for d in stale) and all(d.is_dir() for d in kept)
    assert (tmp_path / f".f{STAGE_MARK}{dead}-file").is_file()


def test_a_stage_whose_output_is_locked_is_kept_even_when_its_pid_is_not_seen(tmp_path):
    """A merge in another container on the same folder: its pid is not ours to see, but it holds the lock."""
    left = tmp_path / f".a{STAGE_MARK}{_dead_pid()}-x1"
    left.mkdir()
    hold = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock_path(tmp_path / "a"))], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert stale_stages(tmp_path / "b") == []
        with pytest.raises(OutputLocked, match=r"another merge \(an unknown process\) is writing"):
            with lock_output(tmp_path / "a"):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert stale_stages(tmp_path / "b") == [left]
    with lock_output(tmp_path / "a"):  # its own output's lock, held by this merge, is no other merge's
        assert stale_stages(tmp_path / "a") == [left]


def test_an_existing_out_in_a_folder_without_write_permission_holds_its_own_lock(tmp_path, monkeypatch):
    out = tmp_path / "merged"
    out.mkdir()
    real_open = os.open

    def refuse(path, *args, **kwargs):  # the parent folder may not be written to
        if Path(path).parent == tmp_path:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with lock_output(out) as lock:
        assert lock == out / LOCK_MARK and lock.read_text().strip() == str(os.getpid())
    assert not lock.exists()
    with pytest.raises(PermissionError, match=rf"cannot write the merge output {tmp_path / 'new'} \(no permission"):
        with lock_output(tmp_path / "new"):
            pass
