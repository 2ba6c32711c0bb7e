"""Where a grid's independent jobs run (docs/performance.md §Executors): ``serial`` (here, one after another;
the default, no new dependency) or ``ray`` (one Ray task per job on a running cluster, ``address``, or on a
local one started with ``workers`` CPUs; ``pip install 'acetools[scale]'``).

A job is ``fn(*args)`` with small arguments: paths to inputs on storage every worker reads, never tensors.
Each job runs with the same torch CPU threads (``threads``, default this process's) wherever it runs, so a
job's result is bit-identical under both executors. A job that raises is named at the end, after the others
finished (:class:`TaskFailed`). Ray is imported only inside the ``ray`` branch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import torch

from .errors import AcetoolsError, InputError
from .utils import cpu_threads, progress

__all__ = ["EXECUTORS", "Executor", "TaskFailed", "as_executor", "require_ray"]

log = logging.getLogger("acetools.executor")

#: The executors: ``serial`` (the default) and ``ray``.
EXECUTORS = ("serial", "ray")


class TaskFailed(AcetoolsError):
    """Jobs that raised, each named with its error, after every other job finished (their results in
    ``results``; the first error is the ``__cause__``)."""

    def __init__(self, failures: Mapping[str, BaseException], results: Mapping[str, Any], total: int):
        self.failures, self.results = dict(failures), dict(results)
        what = "; ".join(f"{name}: {type(e).__name__}: {e}" for name, e in self.failures.items())
        super().__init__(f"{len(self.failures)} of {total} jobs failed (the others finished): {what}")


def require_ray():
    """The ``ray`` module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install 'acetools[scale]' (or pip install ray)") from None
    return ray


def _in_threads(fn: Callable[..., Any], args: tuple, threads: int) -> Any:
    """One job, with torch's CPU threads pinned to ``threads`` (a Ray worker starts with one)."""
    with cpu_threads(threads):
        return fn(*args)


def _cause(err: BaseException) -> BaseException:
    """The user's exception inside a Ray task error (``RayTaskError.cause``), else ``err``."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err


@dataclass(frozen=True)
class Executor:
    """``kind``: ``"serial"`` or ``"ray"``; ``address``: a running Ray cluster (``"auto"``, ``"ray://host:10001"``;
    None: the one this process is connected to, else a local one with ``workers`` CPUs, default all);
    ``threads``: torch CPU threads of each job (None: this process's at creation)."""

    kind: str = "serial"
    address: str | None = None
    workers: int | None = None
    threads: int = field(default_factory=torch.get_num_threads)

    def __post_init__(self):
        if self.kind not in EXECUTORS:
            raise InputError(f"executor={self.kind!r}: choose one of {', '.join(EXECUTORS)}")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise InputError(f"workers={self.workers!r} must be None or a positive int")
        if self.kind == "serial" and self.address is not None:
            raise InputError("--address names a Ray cluster: add --executor ray")

    def _ray(self):
        ray = require_ray()
        if not ray.is_initialized():
            log.info("connecting to Ray (%s)", self.address or f"a local cluster, {self.workers or 'all'} CPUs")
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
        return ray

    @property
    def parallel(self) -> int:
        """Jobs that run at once: 1 serially; with Ray ``workers``, else the cluster's CPUs."""
        if self.kind == "serial":
            return 1
        return self.workers or max(1, int(self._ray().cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable[..., Any], jobs: Mapping[str, tuple], *, desc: str | None = None,
            progress_bar: bool | None = None) -> dict[str, Any]:
        """``{name: fn(*args)}`` for every job (a bar over the finished ones); jobs that raised are a
        :class:`TaskFailed` naming each, raised once every other job has finished."""
        results: dict[str, Any] = {}
        failures: dict[str, BaseException] = {}
        for name, ok, value in progress(self._run(fn, jobs), desc=desc, total=len(jobs), enabled=progress_bar):
            if ok:
                results[name] = value
            else:
                log.warning("%s failed: %s: %s", name, type(value).__name__, value)
                failures[name] = value
        if failures:
            raise TaskFailed(failures, results, len(jobs)) from next(iter(failures.values()))
        return {name: results[name] for name in jobs}

    def _run(self, fn: Callable[..., Any], jobs: Mapping[str, tuple]) -> Iterator[tuple[str, bool, Any]]:
        """``(name, ok, result or error)`` as each job finishes."""
        if self.kind == "serial":
            for name, args in jobs.items():
                try:
                    yield name, True, _in_threads(fn, args, self.threads)
                except Exception as e:  # noqa: BLE001 - named in TaskFailed after the others ran
                    yield name, False, e
            return
        ray = self._ray()
        # SPREAD: jobs go to the least-loaded nodes first (the default packs a node before it spills over)
        remote = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(_in_threads)
        waiting = iter(jobs.items())
        refs: dict[Any, str] = {}

        def submit(n: int) -> list:  # at most `parallel` jobs in flight (--workers on a larger cluster)
            new = []
            for name, args in islice(waiting, n):
                new.append(remote.options(name=name).remote(fn, args, self.threads))
                refs[new[-1]] = name
            return new

        pending = submit(self.parallel)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            pending += submit(len(done))
            for ref in done:
                try:
                    yield refs[ref], True, ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a RayTaskError: its cause is the job's own error
                    yield refs[ref], False, _cause(e)

    def one(self, fn: Callable[..., Any], args: tuple) -> Any:
        """``fn(*args)`` as one job (a sequential rule's next step): its error is its own."""
        if self.kind == "serial":
            return _in_threads(fn, args, self.threads)
        ray = self._ray()
        try:
            return ray.get(ray.remote(num_cpus=1, max_retries=0)(_in_threads).remote(fn, args, self.threads))
        except Exception as e:  # noqa: BLE001 - a RayTaskError: raise the job's own error
            raise _cause(e) from None

    def stream(self, fn: Callable[..., Any], jobs: Mapping[str, tuple]) -> Stream:
        """Jobs consumed in order by a sequential rule (a grid search with early stopping): serially each is
        run when asked for; with Ray the next :attr:`parallel` run ahead of the one asked for."""
        return Stream(self, fn, dict(jobs))


class Stream:
    """:meth:`Executor.stream`'s jobs: :meth:`get` one by name, :meth:`close` drops those run ahead and not
    asked for."""

    def __init__(self, executor: Executor, fn: Callable[..., Any], jobs: dict[str, tuple]):
        self.executor, self.fn, self.jobs = executor, fn, jobs
        self.names = list(jobs)
        self._refs: dict[str, Any] = {}
        self._ahead = executor.parallel

    def get(self, name: str) -> Any:
        """The result of job ``name``; an error is a :class:`TaskFailed` naming it once the jobs run ahead
        finished (serially: the job's own error)."""
        ex = self.executor
        if ex.kind == "serial":
            return _in_threads(self.fn, self.jobs[name], ex.threads)
        ray = ex._ray()
        # SPREAD: jobs go to the least-loaded nodes first (the default packs a node before it spills over)
        remote = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(_in_threads)
        i = self.names.index(name)
        for later in self.names[i:i + self._ahead]:
            if later not in self._refs:
                self._refs[later] = remote.options(name=later).remote(self.fn, self.jobs[later], ex.threads)
        try:
            return ray.get(self._refs.pop(name))
        except Exception as e:  # noqa: BLE001 - the others finish, then the failure is named
            others = list(self._refs.values())
            if others:
                ray.wait(others, num_returns=len(others))
            self._refs.clear()
            raise TaskFailed({name: _cause(e)}, {}, 1 + len(others)) from _cause(e)

    def close(self) -> None:
        """Cancel the jobs run ahead and never asked for, and wait until they stopped (none writes after)."""
        if self._refs:
            ray = self.executor._ray()
            refs = list(self._refs.values())
            for ref in refs:
                ray.cancel(ref)
            ray.wait(refs, num_returns=len(refs))
            self._refs.clear()


def as_executor(executor: str | Executor | None = None, **options: Any) -> Executor:
    """``None`` / ``"serial"`` / ``"ray"`` (with ``address``, ``workers``, ``threads``) or an :class:`Executor`."""
    if isinstance(executor, Executor):
        return executor
    if executor is not None and not isinstance(executor, str):
        raise InputError(f"executor={executor!r}: give 'serial', 'ray' or an acetools.executor.Executor")
    given = {k: v for k, v in options.items() if v is not None}
    return Executor(executor or "serial", **given)
