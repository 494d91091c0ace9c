"""The servers benchmarks/serve.py measures, each launched as a subprocess on a free loopback
port and terminated afterwards (also on an error or Ctrl-C: no orphan process).

Both engines run in a process of their own, so that neither shares an interpreter (and its GIL)
with the benchmark's clients:

- Kiln: ``kiln serve MODEL`` (:func:`kiln_command`), ``KILN_NUM_THREADS`` = the threads;
- llama.cpp: llama-cpp-python's own OpenAI server, ``python -m llama_cpp.server``
  (:func:`llama_cpp_command`), ``--n_threads`` = ``--n_threads_batch`` = the threads.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

#: how long a process may take to answer ``GET /v1/models`` (Kiln's first start compiles)
READY_TIMEOUT_S = 1200.0
#: how long a process may take to exit after SIGTERM before it is killed
STOP_TIMEOUT_S = 15.0

_KILN_MAIN = "import sys; from kiln.cli.main import main; sys.exit(main())"


class ServerStartError(RuntimeError):
    """A server process exited, or did not answer, before it was ready."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; another process could take it before
    the server binds it, which then fails to start and says so)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kiln_command(model: str, port: int, *, max_batch: int, context: int, target: str,
                 quantize_weights: str | None = None) -> list[str]:
    """``kiln serve`` (this interpreter, so the same kiln) on 127.0.0.1:``port``, no access log;
    a queue of 256 so that no benchmark client is refused."""
    cmd = [sys.executable, "-c", _KILN_MAIN, "serve", model, "--host", "127.0.0.1",
           "--port", str(port), "--max-batch", str(max_batch), "--queue", "256",
           "--context", str(context), "--target", target, "--quiet"]
    return cmd + (["--quantize-weights", quantize_weights] if quantize_weights else [])


def llama_cpp_command(gguf: str | Path, port: int, *, threads: int, context: int,
                      alias: str) -> list[str]:
    """llama-cpp-python's server on ``gguf`` at 127.0.0.1:``port``, configured for concurrent
    clients: it holds one llama.cpp context (one sequence) behind a lock, so requests run one
    after another whatever the options; ``--interrupt_requests False`` lets each finish (its
    default True ends the running stream as soon as another request waits: truncated replies
    under concurrency). The chat template is the GGUF's own (no ``--chat_format``)."""
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
            "--model_alias", alias, "--host", "127.0.0.1", "--port", str(port),
            "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--n_ctx", str(context), "--interrupt_requests", "False", "--verbose", "False"]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(proc: subprocess.Popen, url: str, log: Path,
               timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll ``url``/models until it answers 200; :class:`ServerStartError` (with the end of
    ``log``) when ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"{proc.args[:4]}... exited with {proc.returncode} before "
                                   f"it answered:\n{_tail(log)}")
        try:
            if httpx.get(url + "/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ServerStartError(f"no answer from {url}/models after {timeout_s:.0f} s:\n{_tail(log)}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`; waits for the process to exit."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def launched(cmd: list[str], port: int, env: dict[str, str] | None = None,
             timeout_s: float = READY_TIMEOUT_S) -> Iterator[str]:
    """Run ``cmd`` (a server listening on 127.0.0.1:``port``; ``env`` added to this process's
    environment), yield its base URL ``http://127.0.0.1:PORT/v1`` once ``/v1/models`` answers,
    and stop it on leaving, however the block is left. Its output goes to a temporary log,
    shown when it fails to start."""
    with tempfile.TemporaryDirectory(prefix="kiln-serve-bench-") as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
            try:
                url = f"http://127.0.0.1:{port}/v1"
                wait_ready(proc, url, log, timeout_s)
                yield url
            finally:
                stop(proc)
