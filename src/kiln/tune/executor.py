"""Where the tuner's jobs run (the contract; implementations: ``LocalExecutor`` here and
``RayExecutor`` in :mod:`kiln.tune.ray_executor`).

Two kinds of job, both a picklable top-level function applied to picklable arguments:

- **build** jobs (lower + compile a candidate to library bytes) run in parallel: worker
  processes locally, Ray tasks with ``num_cpus=1`` on any node;
- **measure** jobs (load the bytes, check against the reference, time) run one at a time on a
  machine that is otherwise idle: in one long-lived worker process locally (a candidate that
  crashes takes down that process, not the tuner), Ray tasks that reserve a
  whole node carrying the custom resource ``kiln_cpu:<fingerprint>`` (same CPU model, ISA
  features, core count and kernel threads as the records will be applied on).

Results come back in the order of the inputs; a job that raises yields the exception object
in its slot (the search records it as the candidate's error instead of stopping).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from kiln.errors import KilnError


class Executor(Protocol):
    def map_build(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``[fn(*job) for job in jobs]`` in parallel; exceptions returned, not raised."""
        ...

    def map_measure(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``[fn(*job) for job in jobs]`` serially on an idle machine with the target CPU."""
        ...

    def close(self) -> None: ...


class SerialExecutor:
    """The executor contract in this process, one job after another, with no crash isolation:
    for tests (a monkeypatched function stays visible) and debugging."""

    def map_build(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        return [_call_here(fn, job) for job in jobs]

    def map_measure(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        return [_call_here(fn, job) for job in jobs]

    def close(self) -> None:
        pass


def _call_here(fn: Callable[..., Any], job: tuple) -> Any:
    try:
        return fn(*job)
    except Exception as exc:  # noqa: BLE001 - the job's error goes in its slot
        return exc


class LocalExecutor:
    """Builds in worker processes, measures in one other worker process, one candidate at a
    time.

    Parameters
    ----------
    workers : int, optional
        Build processes (default: ``os.cpu_count()``).
    start_method : str
        ``"forkserver"`` (default where available) or ``"spawn"``: never ``fork``, since this
        process may hold threads (the runtime's pool, llvmlite) that a fork would copy broken.

    A job that raises yields the exception in its slot; a worker that dies (a crash in native
    code: a candidate that segfaults or aborts) yields a ``BrokenProcessPool`` for the jobs it
    took down, and the pool is made again. Measure jobs go to a single long-lived process (its
    caches, e.g. reference outputs, stay warm) one at a time, each awaited before the next is
    sent, so timings stay serial and a crash costs only the crashing job. Functions and their
    arguments must be picklable (top-level functions of importable modules).

    Workers ignore SIGINT: Ctrl-C reaches the whole process group, and the parent alone
    handles it; interrupted while it waits for jobs, it terminates that pool's workers (the
    jobs are lost) and re-raises, so ``kiln tune`` stops at once with one line, no worker
    tracebacks. (The forkserver is started with SIGINT ignored, which the processes it forks
    keep from their first instruction; the pools' initializer covers ``spawn`` and a
    forkserver that was already running, from the worker's first job on.)

    Raises
    ------
    KilnError
        For ``workers < 1`` or an unknown start method.
    """

    def __init__(self, workers: int | None = None, start_method: str | None = None):
        import multiprocessing
        import os

        methods = multiprocessing.get_all_start_methods()
        start_method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        if start_method not in ("forkserver", "spawn") or start_method not in methods:
            raise KilnError(f"LocalExecutor: start method must be 'forkserver' or 'spawn' "
                            f"(available here: {methods}), got {start_method!r}")
        self.workers = workers if workers is not None else (os.cpu_count() or 1)
        if self.workers < 1:
            raise KilnError(f"LocalExecutor: workers must be positive, got {self.workers}")
        self._context = multiprocessing.get_context(start_method)
        self._start_method = start_method
        self._pools: dict[str, ProcessPoolExecutor] = {}

    def map_build(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``fn(*job)`` in the build processes, all jobs at once; results in input order."""
        return self._run("build", self.workers, fn, jobs)

    def map_measure(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``fn(*job)`` in the measuring process, one job after the other."""
        results = []
        for job in jobs:
            results += self._run("measure", 1, fn, [job])
        return results

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        self._pools.clear()

    def _run(self, kind: str, workers: int, fn: Callable[..., Any],
             jobs: Sequence[tuple]) -> list[Any]:
        if not jobs:
            return []
        pool = self._pools.get(kind)
        if pool is None:
            if self._start_method == "forkserver":
                _start_forkserver()
            pool = self._pools[kind] = ProcessPoolExecutor(workers, mp_context=self._context,
                                                           initializer=_ignore_sigint)
        futures = []
        try:
            for job in jobs:
                try:
                    futures.append(pool.submit(fn, *job))
                except BrokenProcessPool as exc:
                    futures.append(exc)
            results = [_outcome(f) for f in futures]
        except BaseException:  # KeyboardInterrupt: stop the workers now, not after their jobs
            del self._pools[kind]
            _terminate(pool)
            raise
        if any(isinstance(r, BrokenProcessPool) for r in results):
            pool.shutdown(wait=False, cancel_futures=True)
            del self._pools[kind]
        return results


def _ignore_sigint() -> None:
    """A worker's initializer: Ctrl-C is the parent's to handle (it stops the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_forkserver() -> None:
    """Start multiprocessing's forkserver, unless it runs already, with SIGINT ignored: the
    processes it forks restore the signal dispositions it started with, so its workers ignore
    Ctrl-C before they run any Python (a Ctrl-C during these milliseconds is lost)."""
    import threading
    from multiprocessing import forkserver

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        return  # signal.signal works in the main thread only, and cannot restore a C handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Kill ``pool``'s workers and drop its pending jobs (``terminate_workers`` from Python
    3.14 on; before, its processes, which ProcessPoolExecutor keeps in ``_processes``)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _outcome(future: Future | BaseException) -> Any:
    if isinstance(future, BaseException):
        return future
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - the job's error goes in its slot
        return exc


def measure_with(executor: Executor, build: Callable[..., Any], measure: Callable[..., Any],
                 target: str, repeat: int = 5) -> Callable[[Sequence[tuple]], list[Any]]:
    """The search's ``measure`` callable over an executor: for a batch of ``(task, config)``,
    ``build(task.payload, config, target)`` in parallel (``map_build``), then
    ``measure(lib_bytes, task.payload, config, target, repeat)`` one at a time
    (``map_measure``) for those that built; a failed build's exception stands in its slot.
    With the builder of :mod:`kiln.tune.measure`: ``measure_with(ex, build_candidate,
    measure_candidate, target)``; the task scheduler reads each result's ``best`` seconds and
    ``error``."""

    def run(batch: Sequence[tuple]) -> list[Any]:
        libs = executor.map_build(build, [(task.payload, config, target)
                                          for task, config in batch])
        built = [i for i, lib in enumerate(libs) if not isinstance(lib, BaseException)]
        timed = executor.map_measure(measure, [
            (libs[i], batch[i][0].payload, batch[i][1], target, repeat) for i in built])
        out = list(libs)
        for i, result in zip(built, timed):
            out[i] = result
        return out

    return run
