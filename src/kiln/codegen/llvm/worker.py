"""LLVM optimization and object emission in worker processes, for
:func:`kiln.codegen.llvm.build.build_llvm`.

llvmlite serializes every call into LLVM with one process-wide lock (``llvmlite.binding.ffi``),
so threads do not optimize modules in parallel: ResNet-50's two kernel modules took 6.1 s on
two threads against 6.5 s one after the other, on two cores. Separate processes do run in
parallel. :func:`compile_in_workers` starts ``workers`` Python processes (``sys.executable``
running :func:`main`) and feeds them modules, largest first, until none is left; results come
back in the order of the jobs, so which worker compiled what never shows in the artifacts.

Workers are plain subprocesses rather than a ``multiprocessing`` pool: the spawn and forkserver
methods re-import the user's ``__main__`` (a script without a main guard would run again in
every worker) and fork is unsafe in a threaded process. The parent writes its ``sys.path``
first, so a worker imports the same Kiln and llvmlite. Messages are pickles over the pipes
(both ends are this program). Every worker start is logged at DEBUG (``KILN_LOG=debug``).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence

from kiln.errors import CompileError

log = logging.getLogger("kiln")

_BOOT = ("import pickle, sys; sys.path[:0] = pickle.load(sys.stdin.buffer); "
         "from kiln.codegen.llvm.worker import main; main()")
_STDERR_TAIL = 4000


class _StartError(Exception):
    """A worker could not start (no interpreter, an import failed)."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, index: int):
        self.index = index
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        cmd = [sys.executable, "-c", _BOOT]
        log.debug("run: %s (LLVM worker %d)", shlex.join(cmd), index)
        if not sys.executable:
            raise _StartError("no Python interpreter path (sys.executable is empty)")
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.stderr)
        except OSError as err:
            self.stderr.close()
            raise _StartError(str(err)) from None
        reply = self._send(list(sys.path))
        if reply != ("ready",):
            self.close()
            raise _StartError(f"no ready message (exit {self.proc.returncode}): "
                              f"{self.stderr_tail()}")

    def _send(self, message: object) -> object | None:
        """Send ``message``, return the reply; None when the worker is gone."""
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None, "pipes"
            pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
            return pickle.load(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            return None

    def stderr_tail(self) -> str:
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return text[-_STDERR_TAIL:]

    def compile(self, text: str, target: str, what: str) -> tuple[bytes, str]:
        log.debug("LLVM worker %d: compiling %s", self.index, what)
        reply = self._send((text, target, what))
        if not isinstance(reply, tuple) or not reply:
            self.proc.wait()
            raise CompileError(f"LLVM worker process exited (status {self.proc.returncode}) "
                               f"while compiling {what}: {self.stderr_tail() or 'no message'}")
        if reply[0] == "error":
            raise CompileError(str(reply[1]))
        return reply[1], reply[2]

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


def compile_in_workers(jobs: Sequence[tuple[str, str]], target: str, workers: int
                       ) -> list[tuple[bytes, str]] | None:
    """Compile ``jobs`` — (LLVM IR text, what it holds) — for ``target`` in up to ``workers``
    processes, as :func:`kiln.codegen.llvm.machine.compile_ir` would.

    Returns
    -------
    list of (bytes, str) or None
        (object, optimized IR) per job, in job order; None when no worker could start (the
        caller then compiles in this process).

    Raises
    ------
    CompileError
        LLVM rejected a module, or a worker died while compiling one.
    """
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in sorted(range(len(jobs)), key=lambda k: (-len(jobs[k][0]), k)):
        todo.put(i)
    results: list[tuple[bytes, str] | None] = [None] * len(jobs)
    errors: list[BaseException] = []
    started: list[int] = []
    live: list[_Worker] = []

    def drive(index: int) -> None:
        if errors:
            return
        try:
            worker = _Worker(index)
        except _StartError as err:
            log.debug("LLVM worker %d did not start: %s", index, err)
            return
        started.append(index)
        live.append(worker)
        try:
            while not errors:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                text, what = jobs[i]
                results[i] = worker.compile(text, target, what)
        except CompileError as err:
            errors.append(err)
        finally:
            worker.close()

    threads = [threading.Thread(target=drive, args=(k,), name=f"kiln-llvm-worker-{k}",
                                daemon=True)
               for k in range(max(1, min(workers, len(jobs))))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException as err:  # Ctrl-C: stop the workers now, not after their queue
        errors.append(err)
        for w in live:
            w.proc.kill()
        raise
    if errors:
        raise errors[0]
    if not started:
        return None
    assert all(r is not None for r in results), "a started worker drains the queue"
    return [r for r in results if r is not None]


def main() -> None:
    """The worker: read jobs from stdin, write results to stdout, until EOF."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the replies
    inp = sys.stdin.buffer
    # llvm_machine, not llvm: a worker needs no loop IR and no kiln.runtime (faster start)
    from kiln.codegen.llvm.machine import compile_ir, llvm_binding
    from kiln.target import Target

    llvm_binding()
    pickle.dump(("ready",), out)
    out.flush()
    while True:
        try:
            job = pickle.load(inp)
        except EOFError:
            return
        if job is None:
            return
        text, target, what = job
        try:
            obj, ir = compile_ir(text, Target(target), what)
            reply: tuple = ("ok", obj, ir)
        except CompileError as err:
            reply = ("error", str(err))
        except Exception as err:  # noqa: BLE001 - reported to the parent, which raises it
            message = f"LLVM worker: compiling {what} failed: {type(err).__name__}: {err}"
            reply = ("error", message)
        pickle.dump(reply, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()
